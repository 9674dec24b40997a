/*
 * args.h - command-line option tables for the ember verbs.
 *
 * Each verb declares its options once (name, kind, destination, range,
 * help); parsing, range checks, error messages and --help all come from
 * that table, so help never drifts from what is accepted.
 */
#ifndef EMBER_CLI_ARGS_H
#define EMBER_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum opt_kind { OPT_FLAG, OPT_STR, OPT_INT, OPT_FLOAT, OPT_U64 } opt_kind;

typedef struct cli_opt {
    const char *name;  /* long name without dashes */
    char short_name;   /* 0 if none */
    opt_kind kind;
    void *dst;         /* bool*, const char**, int*, float*, uint64_t* */
    const char *metavar;
    const char *help;
    double lo, hi;     /* inclusive range for numbers */
    bool seen;
} cli_opt;

typedef struct cli_cmd {
    const char *name;    /* "generate" */
    const char *summary; /* one line */
    const char *usage;   /* "--model DIR --ids LIST [options]" */
    const char *notes;   /* extra help text, may be NULL */
    cli_opt *opts;
    int n_opts;
} cli_cmd;

/* Parses argv[1..] of a verb. Returns 0 to go on, 1 after printing an error
   (to stderr), 2 after printing help (to stdout). */
int cli_parse(cli_cmd *cmd, int argc, char **argv);
/* The same, accepting one optional positional argument into *positional. */
int cli_parse_arg(cli_cmd *cmd, int argc, char **argv, const char **positional);

/* Prints "ember VERB: message" to stderr (one line). Returns 1. */
int cli_fail(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses "1,2,3" (commas and/or spaces) into a malloc'd array (caller frees).
   Returns 0, or 1 after printing an error naming the verb and option. */
int cli_parse_ids(const char *verb, const char *opt, const char *s, int32_t **ids, int *n);

/* Parses a comma-separated list of ints in [lo, hi] (e.g. "-t 1,2"), at
   most max of them, into out; *n receives the count. */
int cli_parse_int_list(const char *verb, const char *opt, const char *s, int *out, int max, int lo, int hi, int *n);

/* "scalar" / "avx2" / "avx512" / "auto" -> ember_isa value, -1 if unknown. */
int cli_isa_from_name(const char *s);

#endif
