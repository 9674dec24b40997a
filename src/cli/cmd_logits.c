/* cmd_logits.c - `ember logits`: the logits of every prompt position as .npy. */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cli.h"
#include "formats/npy.h"

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *out_path = NULL, *isa = NULL;
    int threads = 0, ctx = 0;
    bool verbose = false, use_mmap = false;
    cli_model_opts mo = {0};
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "model directory", 0, 0, false},
        {"ids", 0, OPT_STR, &ids_s, "LIST", "token ids, e.g. 1,2,3", 0, 0, false},
        {"out", 'o', OPT_STR, &out_path, "FILE.npy", "where to write the float32 [n_tokens, vocab] array", 0, 0, false},
        {"threads", 't', OPT_INT, &threads, "N", "worker threads (default: all cores)", 1, 1024, false},
        {"isa", 0, OPT_STR, &isa, "NAME", "kernels: auto, scalar, avx2, avx512, amx", 0, 0, false},
        {"ctx", 'c', OPT_INT, &ctx, "N", "context length (default: min(model max, 4096))", 1, 1 << 24, false},
        {"mmap", 0, OPT_FLAG, &use_mmap, NULL, "compute from the mapped model files (less memory, slower)", 0, 0, false},
        {"verbose", 'v', OPT_FLAG, &verbose, NULL, "log loading details to stderr", 0, 0, false},
        CLI_KV_OPTS(mo),
    };
    cli_cmd cmd = {"logits", "Write the logits at every position of a prompt as a NumPy .npy file.",
                   "--model DIR --ids LIST --out FILE.npy [options]", NULL, opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model || !ids_s || !out_path)
        return cli_fail("logits", "--model, --ids and --out are required (see 'ember logits --help')");
    int32_t *ids;
    int n_ids;
    if (cli_parse_ids("logits", "ids", ids_s, &ids, &n_ids)) return 1;
    ember_model *m;
    mo = (cli_model_opts){threads, ctx, 1, isa, verbose, use_mmap, 0, mo.kv_type, mo.kv_group, mo.kv_quant_start, false, mo.device};
    if (cli_load_model("logits", model, &mo, &m)) {
        free(ids);
        return 1;
    }
    ember_model_info info;
    ember_model_get_info(m, &info);
    ember_error err = {0};
    float *lg = malloc((size_t)n_ids * (size_t)info.vocab_size * sizeof *lg);
    if (!lg) {
        rc = cli_fail("logits", "out of memory for %d x %d logits", n_ids, info.vocab_size);
    } else if (ember_logits(m, ids, n_ids, lg, &err) != EMBER_OK) {
        rc = cli_fail("logits", "%s", err.msg);
    } else {
        ember_npy_writer w;
        if (ember_npy_begin(&w, out_path, n_ids, info.vocab_size, &err) ||
            ember_npy_rows(&w, lg, n_ids, &err) || ember_npy_end(&w, &err)) {
            if (w.fp) ember_npy_abort(&w);
            rc = cli_fail("logits", "%s", err.msg);
        }
    }
    free(lg);
    free(ids);
    ember_model_free(m);
    return rc;
}
