/* regex.c - see regex.h.
 *
 * Two passes: a recursive-descent parser builds a small syntax tree in a
 * fixed array (no allocation), then the Glushkov construction walks it,
 * giving each class a fresh position every time it is visited, so a
 * repetition {m,n} is its body visited m..n times. Every position can reach
 * an end (no class is empty), so a non-empty state set always has a way to
 * finish: the grammar relies on that.
 */
#include "regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#if defined(__GNUC__)
#define EMBER_RX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define EMBER_RX_PRINTF(a, b)
#endif

enum { R_CLS = EMBER_RXT_CLS, R_CAT = EMBER_RXT_CAT, R_ALT = EMBER_RXT_ALT, R_REP = EMBER_RXT_REP, R_EMPTY = EMBER_RXT_EMPTY };

#define MAX_NODES EMBER_RX_NODES
#define REP_INF EMBER_RX_INF

typedef ember_rx_node rnode;

typedef struct parser {
    const char *p;
    rnode nodes[MAX_NODES];
    int n;
    int depth;
    char *why;
    size_t why_len;
    bool failed;
    bool top_alt; /* a '|' outside every group */
    bool wide;    /* ember_rx_parse's alphabet: printable ASCII, tab, line feed */
    const char *what; /* the field in messages ("'pattern'") */
    ember_rx *rx;
} parser;

/* Writes "<what>: <message>" to ps->why (the first failure only). */
static int fail(parser *ps, const char *fmt, ...) EMBER_RX_PRINTF(2, 3);
static int fail(parser *ps, const char *fmt, ...) {
    if (!ps->failed) {
        int k = snprintf(ps->why, ps->why_len, "%s: ", ps->what ? ps->what : "'pattern'");
        if (k < 0 || (size_t)k >= ps->why_len) k = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->why + k, ps->why_len - (size_t)k, fmt, ap);
        va_end(ap);
    }
    ps->failed = true;
    return -1;
}

static int node(parser *ps, int kind) {
    if (ps->n == MAX_NODES) return fail(ps, "the pattern is too long");
    rnode *r = &ps->nodes[ps->n];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    return ps->n++;
}

static void cls_add(uint64_t *c, int lo, int hi) {
    for (int b = lo; b <= hi; b++)
        if (b >= 0 && b < 128) c[b >> 6] |= 1ull << (b & 63);
}

/* The alphabet: printable ASCII without '"' and '\' (wide: with them, tab
   and line feed). */
static void alphabet_of(const parser *ps, uint64_t *c) {
    c[0] = c[1] = 0;
    cls_add(c, 0x20, 0x7e);
    if (ps->wide) {
        cls_add(c, '\t', '\t');
        cls_add(c, '\n', '\n');
        return;
    }
    c['"' >> 6] &= ~(1ull << ('"' & 63));
    c['\\' >> 6] &= ~(1ull << ('\\' & 63));
}
#define alphabet(c) alphabet_of(ps, c)

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* An escape after '\' (ps->p at the letter): a class into c. Returns 0 or -1. */
static int escape(parser *ps, uint64_t *c, bool in_class) {
    char e = *ps->p;
    uint64_t w[2] = {0, 0};
    switch (e) {
    case 'd': case 'D': cls_add(w, '0', '9'); break;
    case 'w': case 'W':
        cls_add(w, '0', '9');
        cls_add(w, 'a', 'z');
        cls_add(w, 'A', 'Z');
        cls_add(w, '_', '_');
        break;
    case 's': case 'S':
        cls_add(w, 9, 13);
        cls_add(w, ' ', ' ');
        break;
    case 'x': case 'u': {
        int n = e == 'x' ? 2 : 4, v = 0;
        for (int i = 1; i <= n; i++) {
            int h = hexval(ps->p[i]);
            if (h < 0) return fail(ps, "a bad \\%c escape", e);
            v = v * 16 + h;
        }
        if (v >= 128) return fail(ps, "characters beyond ASCII are not supported");
        ps->p += n;
        cls_add(c, v, v);
        ps->p++;
        return 0;
    }
    case 't': cls_add(c, 9, 9); ps->p++; return 0;
    case 'n': cls_add(c, 10, 10); ps->p++; return 0;
    case 'r': cls_add(c, 13, 13); ps->p++; return 0;
    case 'b':
        if (in_class) {
            cls_add(c, 8, 8);
            ps->p++;
            return 0;
        }
        return fail(ps, "\\b (word boundaries) is not supported");
    default:
        if (e && strchr("^$\\.*+?()[]{}|/-", e)) {
            cls_add(c, (unsigned char)e, (unsigned char)e);
            ps->p++;
            return 0;
        }
        if (e >= '1' && e <= '9') return fail(ps, "backreferences are not supported");
        return fail(ps, "the escape \\%c is not supported", e ? e : '0');
    }
    if (e >= 'A' && e <= 'Z') { /* a negated shorthand */
        w[0] = ~w[0];
        w[1] = ~w[1];
    }
    c[0] |= w[0];
    c[1] |= w[1];
    ps->p++;
    return 0;
}

/* A bracket class (ps->p after '['). */
static int bracket(parser *ps, uint64_t *c) {
    bool neg = *ps->p == '^';
    if (neg) ps->p++;
    uint64_t acc[2] = {0, 0};
    while (*ps->p && *ps->p != ']') {
        int lo;
        uint64_t one[2] = {0, 0};
        if (*ps->p == '\\') {
            ps->p++;
            if (escape(ps, one, true)) return -1;
            int cnt = __builtin_popcountll(one[0]) + __builtin_popcountll(one[1]);
            if (cnt != 1) { /* a shorthand: no range from it */
                acc[0] |= one[0];
                acc[1] |= one[1];
                continue;
            }
            lo = one[0] ? __builtin_ctzll(one[0]) : 64 + __builtin_ctzll(one[1]);
        } else {
            if ((unsigned char)*ps->p >= 128) return fail(ps, "characters beyond ASCII are not supported");
            if (*ps->p == '[' && ps->p[1] == ':') return fail(ps, "POSIX classes are not supported");
            lo = (unsigned char)*ps->p++;
        }
        if (*ps->p == '-' && ps->p[1] && ps->p[1] != ']') {
            ps->p++;
            int hi;
            if (*ps->p == '\\') {
                ps->p++;
                uint64_t h[2] = {0, 0};
                if (escape(ps, h, true)) return -1;
                if (__builtin_popcountll(h[0]) + __builtin_popcountll(h[1]) != 1)
                    return fail(ps, "a range that ends in a class");
                hi = h[0] ? __builtin_ctzll(h[0]) : 64 + __builtin_ctzll(h[1]);
            } else {
                if ((unsigned char)*ps->p >= 128) return fail(ps, "characters beyond ASCII are not supported");
                hi = (unsigned char)*ps->p++;
            }
            if (hi < lo) return fail(ps, "a range out of order");
            cls_add(acc, lo, hi);
        } else {
            cls_add(acc, lo, lo);
        }
    }
    if (*ps->p != ']') return fail(ps, "an unclosed '['");
    ps->p++;
    if (neg) {
        acc[0] = ~acc[0];
        acc[1] = ~acc[1];
    }
    c[0] |= acc[0];
    c[1] |= acc[1];
    return 0;
}

static int parse_alt(parser *ps);

/* An atom: a class, a group. */
static int parse_atom(parser *ps) {
    char ch = *ps->p;
    if (ch == '(') {
        ps->p++;
        if (*ps->p == '?') {
            if (ps->p[1] != ':') return fail(ps, "lookaround and named groups are not supported");
            ps->p += 2;
        }
        if (++ps->depth > 32) return fail(ps, "groups nest too deep");
        int k = parse_alt(ps);
        ps->depth--;
        if (k < 0) return -1;
        if (*ps->p != ')') return fail(ps, "an unclosed '('");
        ps->p++;
        return k;
    }
    int k = node(ps, R_CLS);
    if (k < 0) return -1;
    uint64_t *c = ps->nodes[k].cls;
    if (ch == '.') {
        alphabet(c);
        if (ps->wide) c[0] &= ~(1ull << '\n'); /* as in ECMAScript: not a line break */
        ps->p++;
    } else if (ch == '[') {
        ps->p++;
        if (bracket(ps, c)) return -1;
    } else if (ch == '\\') {
        ps->p++;
        if (escape(ps, c, false)) return -1;
    } else if (ch == '^' || ch == '$') {
        return fail(ps, "'%c' is supported only at the pattern's %s", ch, ch == '^' ? "start" : "end");
    } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        return fail(ps, "a quantifier '%c' with nothing before it", ch);
    } else if ((unsigned char)ch >= 128) {
        return fail(ps, "characters beyond ASCII are not supported");
    } else {
        cls_add(c, (unsigned char)ch, (unsigned char)ch);
        ps->p++;
    }
    uint64_t a[2];
    alphabet(a);
    c[0] &= a[0];
    c[1] &= a[1];
    if (!c[0] && !c[1])
        return fail(ps, ps->wide ? "a character class with nothing the grammar writes (only printable ASCII, tab and "
                                   "line feed are supported)"
                                 : "a character class with nothing the grammar writes (only printable ASCII "
                                   "without '\"' and '\\' is supported in patterns)");
    return k;
}

static int read_int(parser *ps, int *out) {
    if (*ps->p < '0' || *ps->p > '9') return fail(ps, "a bad {m,n}");
    long v = 0;
    while (*ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > 1000) return fail(ps, "a repetition count over 1000");
    }
    *out = (int)v;
    return 0;
}

/* An atom and its quantifiers. */
static int parse_rep(parser *ps) {
    int k = parse_atom(ps);
    while (k >= 0) {
        int lo, hi;
        char ch = *ps->p;
        if (ch == '*') lo = 0, hi = REP_INF;
        else if (ch == '+') lo = 1, hi = REP_INF;
        else if (ch == '?') lo = 0, hi = 1;
        else if (ch == '{' && ps->p[1] >= '0' && ps->p[1] <= '9') {
            ps->p++;
            if (read_int(ps, &lo)) return -1;
            hi = lo;
            if (*ps->p == ',') {
                ps->p++;
                hi = REP_INF;
                if (*ps->p != '}' && read_int(ps, &hi)) return -1;
            }
            if (*ps->p != '}') return fail(ps, "a bad {m,n}");
            if (hi != REP_INF && hi < lo) return fail(ps, "{m,n} with n < m");
        } else {
            break;
        }
        ps->p++;
        if (*ps->p == '?') ps->p++; /* lazy: the same language */
        int r = node(ps, R_REP);
        if (r < 0) return -1;
        ps->nodes[r].a = k;
        ps->nodes[r].lo = lo;
        ps->nodes[r].hi = hi;
        k = r;
    }
    return k;
}

static int parse_cat(parser *ps) {
    int k = -1;
    while (*ps->p && *ps->p != '|' && *ps->p != ')') {
        if (*ps->p == '$' && ps->depth == 0 && ps->p[1] == '\0') break;
        int r = parse_rep(ps);
        if (r < 0) return -1;
        if (k < 0) {
            k = r;
            continue;
        }
        int c = node(ps, R_CAT);
        if (c < 0) return -1;
        ps->nodes[c].a = k;
        ps->nodes[c].b = r;
        k = c;
    }
    return k >= 0 ? k : node(ps, R_EMPTY);
}

static int parse_alt(parser *ps) {
    int k = parse_cat(ps);
    while (k >= 0 && *ps->p == '|') {
        if (ps->depth == 0) ps->top_alt = true;
        ps->p++;
        int r = parse_cat(ps);
        if (r < 0) return -1;
        int c = node(ps, R_ALT);
        if (c < 0) return -1;
        ps->nodes[c].a = k;
        ps->nodes[c].b = r;
        k = c;
    }
    return k;
}

/* ---- Glushkov ---- */

typedef struct gl {
    bool nullable;
    uint64_t first, last;
} gl;

static void link(ember_rx *rx, uint64_t from, uint64_t to) {
    for (int p = 0; p <= EMBER_RX_MAX; p++)
        if (from >> p & 1) rx->follow[p] |= to;
}

static int build(parser *ps, int k, gl *out) {
    const rnode *r = &ps->nodes[k];
    ember_rx *rx = ps->rx;
    memset(out, 0, sizeof *out);
    switch (r->kind) {
    case R_EMPTY: out->nullable = true; return 0;
    case R_CLS:
        if (rx->n == EMBER_RX_MAX)
            return fail(ps, "too complex: more than %d character positions (repetitions counted)",
                        EMBER_RX_MAX);
        rx->n++;
        rx->cls[rx->n][0] = r->cls[0];
        rx->cls[rx->n][1] = r->cls[1];
        out->first = out->last = 1ull << rx->n;
        return 0;
    case R_CAT:
    case R_ALT: {
        gl a, b;
        if (build(ps, r->a, &a) || build(ps, r->b, &b)) return -1;
        if (r->kind == R_ALT) {
            out->nullable = a.nullable || b.nullable;
            out->first = a.first | b.first;
            out->last = a.last | b.last;
            return 0;
        }
        link(rx, a.last, b.first);
        out->nullable = a.nullable && b.nullable;
        out->first = a.first | (a.nullable ? b.first : 0);
        out->last = b.last | (b.nullable ? a.last : 0);
        return 0;
    }
    case R_REP: {
        /* body{lo} then (hi - lo) optional copies, or body* when unbounded */
        *out = (gl){true, 0, 0};
        int copies = r->hi == REP_INF ? (r->lo > 0 ? r->lo : 1) : r->hi;
        for (int i = 0; i < copies; i++) {
            gl a;
            if (build(ps, r->a, &a)) return -1;
            bool optional = i >= r->lo;
            if (r->hi == REP_INF && i == copies - 1) link(rx, a.last, a.first); /* the last copy loops */
            if (r->hi == REP_INF && r->lo == 0) optional = true;
            if (optional) a.nullable = true;
            link(rx, out->last, a.first);
            out->first |= out->nullable ? a.first : 0;
            out->last = a.last | (a.nullable ? out->last : 0);
            out->nullable = out->nullable && a.nullable;
        }
        return 0;
    }
    }
    return fail(ps, "internal error");
}

static void distances(ember_rx *rx) {
    for (int p = 0; p <= rx->n; p++) rx->dist[p] = (rx->last >> p & 1) ? 0 : 255;
    for (bool changed = true; changed;) {
        changed = false;
        for (int p = 0; p <= rx->n; p++)
            for (int q = 1; q <= rx->n; q++)
                if ((rx->follow[p] >> q & 1) && rx->dist[q] != 255 && rx->dist[q] + 1 < rx->dist[p]) {
                    rx->dist[p] = (uint8_t)(rx->dist[q] + 1);
                    changed = true;
                }
    }
}

int ember_rx_parse(const char *pattern, const char *what, ember_rx_tree *out, char *why, size_t why_len) {
    parser *ps = ember_calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(why, why_len, "%s: out of memory", what);
        return -1;
    }
    ps->why = why;
    ps->why_len = why_len;
    ps->what = what;
    ps->wide = true;
    size_t len = strlen(pattern);
    bool head = pattern[0] == '^', tail = len > 0 && pattern[len - 1] == '$' && (len < 2 || pattern[len - 2] != '\\');
    ps->p = pattern + (head ? 1 : 0);
    int k = parse_alt(ps);
    if (k >= 0 && *ps->p == '$' && tail && ps->p[1] == '\0') ps->p++;
    if (k >= 0 && *ps->p == ')') k = fail(ps, "an unmatched ')'");
    if (k >= 0 && *ps->p) k = fail(ps, "cannot read it at '%.16s'", ps->p);
    if (k >= 0 && (head || tail) && ps->top_alt)
        k = fail(ps, "anchors with a top-level '|' are not supported (group the alternatives)");
    if (k >= 0) {
        out->n = ps->n;
        out->root = k;
        memcpy(out->nodes, ps->nodes, (size_t)ps->n * sizeof *out->nodes);
    }
    free(ps);
    return k >= 0 ? 0 : -1;
}

int ember_rx_compile(const char *pattern, ember_rx *out, char *why, size_t why_len) {
    parser pst;
    parser *ps = &pst;
    memset(ps, 0, sizeof *ps);
    memset(out, 0, sizeof *out);
    ps->why = why;
    ps->why_len = why_len;
    ps->rx = out;
    size_t len = strlen(pattern);
    bool head = pattern[0] == '^', tail = len > 0 && pattern[len - 1] == '$' && (len < 2 || pattern[len - 2] != '\\');
    ps->p = pattern + (head ? 1 : 0);
    int k = parse_alt(ps);
    if (k < 0) return -1;
    if (*ps->p == '$' && tail && ps->p[1] == '\0') ps->p++;
    if (*ps->p == ')') return fail(ps, "an unmatched ')'");
    if (*ps->p) return fail(ps, "cannot read it at '%.16s'", ps->p);
    if ((head || tail) && ps->top_alt)
        return fail(ps, "anchors with a top-level '|' are not supported (group the alternatives)");
    /* an implicit .* on an open side */
    for (int side = 0; side < 2; side++) {
        if (side == 0 ? head : tail) continue;
        int any = node(ps, R_CLS), star = any >= 0 ? node(ps, R_REP) : -1, cat = star >= 0 ? node(ps, R_CAT) : -1;
        if (cat < 0) return -1;
        alphabet(ps->nodes[any].cls);
        ps->nodes[star].a = any;
        ps->nodes[star].lo = 0;
        ps->nodes[star].hi = REP_INF;
        ps->nodes[cat].a = side == 0 ? star : k;
        ps->nodes[cat].b = side == 0 ? k : star;
        k = cat;
    }
    gl top;
    if (build(ps, k, &top)) return -1;
    out->follow[0] = top.first;
    out->last = top.last | (top.nullable ? 1 : 0);
    distances(out);
    for (int p = 0; p <= out->n; p++)
        if (out->dist[p] == 255) return fail(ps, "no string matches it");
    return 0;
}

uint64_t ember_rx_step(const ember_rx *rx, uint64_t set, unsigned char c) {
    if (c >= 128) return 0;
    uint64_t next = 0;
    for (uint64_t s = set; s; s &= s - 1) next |= rx->follow[__builtin_ctzll(s)];
    uint64_t out = 0;
    for (uint64_t s = next; s; s &= s - 1) {
        int q = __builtin_ctzll(s);
        if (rx->cls[q][c >> 6] >> (c & 63) & 1) out |= 1ull << q;
    }
    return out;
}

bool ember_rx_accepts(const ember_rx *rx, uint64_t set) {
    return (set & rx->last) != 0;
}

int ember_rx_dist(const ember_rx *rx, uint64_t set) {
    int d = 255;
    for (uint64_t s = set; s; s &= s - 1)
        if (rx->dist[__builtin_ctzll(s)] < d) d = rx->dist[__builtin_ctzll(s)];
    return d;
}
