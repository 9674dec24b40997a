/* common.c - helpers shared by the verbs. */
#include <stdio.h>

#include "args.h"
#include "cli.h"

static void log_stderr(void *user, ember_log_level level, const char *msg) {
    (void)user;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "ember: %s: %s\n", names[level & 3], msg);
}

int cli_load_model(const char *verb, const char *path, const cli_model_opts *o, ember_model **out) {
    ember_model_params p;
    ember_model_params_init(&p);
    p.n_threads = o->threads;
    p.n_ctx = o->ctx;
    p.n_rows = o->rows;
    p.use_mmap = o->use_mmap;
    if (o->isa) {
        int v = cli_isa_from_name(o->isa);
        if (v < 0) return cli_fail(verb, "--isa must be one of auto, scalar, avx2, avx512; got '%s'", o->isa);
        p.isa = (ember_isa)v;
    }
    if (o->verbose) p.log = log_stderr;
    ember_error err = {0};
    if (ember_model_load(path, &p, out, &err) != EMBER_OK) return cli_fail(verb, "%s", err.msg);
    return 0;
}
