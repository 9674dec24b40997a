/*
 * cmd_quantize.c - `ember quantize`: writes a quantized copy of an F32 /
 * F16 / BF16 safetensors model as a GGUF file (q8_0, q4_0, q4_k_m) that
 * Ember and llama.cpp both load. The tensor type rules are in
 * src/model/quantize.h. Runs on the calling thread plus a worker pool.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "model/quantize.h"

int cmd_quantize(int argc, char **argv) {
    const char *model = NULL, *type = NULL, *out = NULL;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "input model directory (config.json + F32/F16/BF16 safetensors)", 0, 0,
         false},
        {"type", 0, OPT_STR, &type, "TYPE", "q8_0, q4_0 or q4_k_m", 0, 0, false},
        {"out", 'o', OPT_STR, &out, "FILE", "the GGUF file to write", 0, 0, false},
    };
    cli_cmd cmd = {"quantize", "Write a quantized GGUF copy of a model.", "--model DIR --type q8_0|q4_0|q4_k_m --out FILE",
                   "q4_k_m follows llama.cpp's mix: Q4_K, with Q6_K for the output matrix and for attn_v /\n"
                   "ffn_down of some layers (rows not a multiple of 256 fall back to Q5_0 / Q8_0).\n"
                   "Models without a tokenizer get llama.cpp's 'none' vocabulary of vocab_size dummy tokens.",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model || !type || !out) return cli_fail("quantize", "--model, --type and --out are required");
    ember_qscheme s;
    if (!ember_qscheme_parse(type, &s))
        return cli_fail("quantize", "unknown --type '%s' (expected q8_0, q4_0 or q4_k_m)", type);
    ember_error err = {0};
    if (ember_quantize_to_gguf(model, out, s, &err)) return cli_fail("quantize", "%s", err.msg);
    return 0;
}
