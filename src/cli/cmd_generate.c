/* cmd_generate.c - `ember generate`: prompt ids in, generated ids out. */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cli.h"

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *isa = NULL;
    int n = 32, threads = 0, ctx = 0, top_k = 0;
    float temp = 0.8f, top_p = 1.0f, min_p = 0.0f;
    uint64_t seed = 0;
    bool ignore_eos = false, verbose = false, use_mmap = false;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "model directory (config.json + *.safetensors)", 0, 0, false},
        {"ids", 0, OPT_STR, &ids_s, "LIST", "prompt token ids, e.g. 1,2,3", 0, 0, false},
        {"n", 'n', OPT_INT, &n, "N", "tokens to generate (default 32)", 0, 1 << 24, false},
        {"temp", 0, OPT_FLOAT, &temp, "T", "temperature; 0 = greedy (default 0.8)", 0, 100, false},
        {"top-k", 0, OPT_INT, &top_k, "K", "keep the K most likely tokens; 0 = off (default)", 0, 1 << 24, false},
        {"top-p", 0, OPT_FLOAT, &top_p, "P", "nucleus sampling mass in (0, 1]; 1 = off (default)", 1e-9, 1, false},
        {"min-p", 0, OPT_FLOAT, &min_p, "P", "drop tokens below P x the top probability; 0 = off", 0, 1, false},
        {"seed", 's', OPT_U64, &seed, "S", "random seed (default 0); same seed, same output", 0, 0, false},
        {"ignore-eos", 0, OPT_FLAG, &ignore_eos, NULL, "keep going past end-of-sequence tokens", 0, 0, false},
        {"threads", 't', OPT_INT, &threads, "N", "worker threads (default: all cores)", 1, 1024, false},
        {"isa", 0, OPT_STR, &isa, "NAME", "kernels: auto, scalar, avx2, avx512 (default auto)", 0, 0, false},
        {"ctx", 'c', OPT_INT, &ctx, "N", "context length (default: min(model max, 4096))", 1, 1 << 24, false},
        {"mmap", 0, OPT_FLAG, &use_mmap, NULL, "compute from the mapped model files (less memory, slower)", 0, 0, false},
        {"verbose", 'v', OPT_FLAG, &verbose, NULL, "log loading details to stderr", 0, 0, false},
    };
    cli_cmd cmd = {"generate", "Generate tokens after a prompt and print their ids on one line, space-separated.",
                   "--model DIR --ids LIST [options]",
                   "Generation stops after -n tokens or at an end-of-sequence id (printed) unless --ignore-eos.",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("generate", "--model is required (see 'ember generate --help')");
    if (!ids_s) return cli_fail("generate", "--ids is required (text prompts arrive with the tokenizer)");
    int32_t *ids;
    int n_ids;
    if (cli_parse_ids("generate", "ids", ids_s, &ids, &n_ids)) return 1;
    ember_model *m;
    cli_model_opts mo = {threads, ctx, 1, isa, verbose, use_mmap};
    if (cli_load_model("generate", model, &mo, &m)) {
        free(ids);
        return 1;
    }
    int32_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    ember_request r = {0};
    r.prompt = ids;
    r.n_prompt = n_ids;
    r.max_new_tokens = n;
    r.ignore_eos = ignore_eos;
    ember_sampling_init(&r.sampling);
    r.sampling.temperature = temp;
    r.sampling.top_k = top_k;
    r.sampling.top_p = top_p;
    r.sampling.min_p = min_p;
    r.sampling.seed = seed;
    r.out_ids = out;
    ember_error err = {0};
    rc = out ? ember_generate(m, &r, 1, &err) : EMBER_ERR_NOMEM;
    if (rc == EMBER_OK) {
        for (int i = 0; i < r.n_out; i++) printf("%s%d", i ? " " : "", out[i]);
        printf("\n");
    } else {
        cli_fail("generate", "%s", out ? err.msg : "out of memory");
    }
    free(out);
    free(ids);
    ember_model_free(m);
    return rc == EMBER_OK ? 0 : 1;
}
