/* args.c - see args.h. */
#define _POSIX_C_SOURCE 200809L
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember.h"

int cli_fail(const char *verb, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(stderr, "ember %s: %s\n", verb, msg);
    return 1;
}

static void print_help(const cli_cmd *cmd) {
    printf("usage: ember %s %s\n\n%s\n\noptions:\n", cmd->name, cmd->usage, cmd->summary);
    for (int i = 0; i < cmd->n_opts; i++) {
        const cli_opt *o = &cmd->opts[i];
        char left[64];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        printf("  %-28s %s\n", left, o->help);
    }
    printf("  %-28s %s\n", "-h, --help", "show this help");
    if (cmd->notes) printf("\n%s\n", cmd->notes);
}

/* "--name", or "-n" for one-letter names. */
static const char *dash(const cli_opt *o) {
    static _Thread_local char buf[64];
    snprintf(buf, sizeof buf, "%s%s", o->name[1] ? "--" : "-", o->name);
    return buf;
}

static cli_opt *find(cli_cmd *cmd, const char *name, size_t len, char short_name) {
    for (int i = 0; i < cmd->n_opts; i++) {
        cli_opt *o = &cmd->opts[i];
        if (short_name ? o->short_name == short_name : (strlen(o->name) == len && strncmp(o->name, name, len) == 0))
            return o;
    }
    return NULL;
}

static int set_value(cli_cmd *cmd, cli_opt *o, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case OPT_FLAG: *(bool *)o->dst = true; return 0;
    case OPT_STR:
        if (!*v) return cli_fail(cmd->name, "%s expects a non-empty value", dash(o));
        *(const char **)o->dst = v;
        return 0;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno)
            return cli_fail(cmd->name, "%s expects an integer, got '%s'", dash(o), v);
        if (x < o->lo || x > o->hi)
            return cli_fail(cmd->name, "%s must be between %.0f and %.0f, got %ld", dash(o), o->lo, o->hi, x);
        *(int *)o->dst = (int)x;
        return 0;
    }
    case OPT_U64: {
        if (*v == '-') return cli_fail(cmd->name, "%s expects a non-negative integer, got '%s'", dash(o), v);
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno)
            return cli_fail(cmd->name, "%s expects a non-negative integer, got '%s'", dash(o), v);
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case OPT_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return cli_fail(cmd->name, "%s expects a finite number, got '%s'", dash(o), v);
        if (x < o->lo || x > o->hi)
            return cli_fail(cmd->name, "%s must be between %g and %g, got %g", dash(o), o->lo, o->hi, x);
        *(float *)o->dst = (float)x;
        return 0;
    }
    }
    return 1;
}

int cli_parse(cli_cmd *cmd, int argc, char **argv) {
    return cli_parse_arg(cmd, argc, argv, NULL);
}

int cli_parse_arg(cli_cmd *cmd, int argc, char **argv, const char **positional) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            print_help(cmd);
            return 2;
        }
        cli_opt *o = NULL;
        const char *inline_val = NULL;
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            o = find(cmd, a + 2, len, 0);
            if (eq) inline_val = eq + 1;
        } else if (a[0] == '-' && a[1] && !a[2]) {
            o = find(cmd, NULL, 0, a[1]);
        } else if (positional && !*positional && a[0] != '-') {
            *positional = a;
            continue;
        } else {
            return cli_fail(cmd->name, "unexpected argument '%s' (see 'ember %s --help')", a, cmd->name);
        }
        if (!o) return cli_fail(cmd->name, "unknown option '%s' (see 'ember %s --help')", a, cmd->name);
        if (o->seen) return cli_fail(cmd->name, "option %s given twice", dash(o));
        o->seen = true;
        if (o->kind == OPT_FLAG) {
            if (inline_val) return cli_fail(cmd->name, "%s takes no value", dash(o));
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = inline_val;
        if (!v) {
            if (i + 1 >= argc) return cli_fail(cmd->name, "%s needs a value (%s)", dash(o), o->metavar);
            v = argv[++i];
        }
        if (set_value(cmd, o, v)) return 1;
    }
    return 0;
}

int cli_parse_ids(const char *verb, const char *opt, const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16, cnt = 0;
    int32_t *a = malloc(cap * sizeof *a);
    if (!a) return cli_fail(verb, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\t' &&
                                                            *end != '\n')) {
            free(a);
            return cli_fail(verb, "--%s: '%.32s' is not a token id (a non-negative integer)", opt, p);
        }
        if (cnt == cap) {
            int32_t *na = realloc(a, (cap *= 2) * sizeof *a);
            if (!na) {
                free(a);
                return cli_fail(verb, "out of memory");
            }
            a = na;
        }
        a[cnt++] = (int32_t)x;
        p = end;
    }
    if (cnt == 0) {
        free(a);
        return cli_fail(verb, "--%s: no token ids given", opt);
    }
    if (cnt > INT32_MAX / 2) {
        free(a);
        return cli_fail(verb, "--%s: too many ids", opt);
    }
    *ids = a;
    *n = (int)cnt;
    return 0;
}

int cli_parse_int_list(const char *verb, const char *opt, const char *s, int *out, int max, int lo, int hi, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < lo || x > hi || (*end && *end != ','))
            return cli_fail(verb, "--%s expects integers from %d to %d separated by commas, got '%s'", opt, lo, hi, s);
        if (*n >= max) return cli_fail(verb, "--%s: at most %d values", opt, max);
        out[(*n)++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return cli_fail(verb, "--%s: no values given", opt);
    return 0;
}

int cli_isa_from_name(const char *s) {
    if (strcmp(s, "auto") == 0) return EMBER_ISA_AUTO;
    if (strcmp(s, "scalar") == 0) return EMBER_ISA_SCALAR;
    if (strcmp(s, "avx2") == 0) return EMBER_ISA_AVX2;
    if (strcmp(s, "avx512") == 0) return EMBER_ISA_AVX512;
    if (strcmp(s, "amx") == 0) return EMBER_ISA_AMX;
    return -1;
}
