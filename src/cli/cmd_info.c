/* cmd_info.c - `ember info`: what a model is, without running it. */
#include <stdio.h>

#include "args.h"
#include "cli.h"
#include "engine/engine.h"

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    int ctx = 0;
    cli_model_opts mo = {0};
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "model directory", 0, 0, false},
        {"ctx", 'c', OPT_INT, &ctx, "N", "context for the KV figures (default: min(model max, 4096))", 1, 1 << 24,
         false},
        CLI_KV_OPTS(mo),
    };
    cli_cmd cmd = {"info", "Print a model's architecture, sizes, weight type and KV cache kind.",
                   "--model DIR [--kv-type KIND]", NULL, opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("info", "--model is required");
    ember_model *m;
    mo = (cli_model_opts){1, ctx, 1, NULL, false, true, 0, mo.kv_type, mo.kv_group, mo.kv_quant_start, false, mo.device};
    if (cli_load_model("info", model, &mo, &m)) return 1;
    ember_model_info i;
    ember_model_get_info(m, &i);
    printf("arch          %s\n", i.arch);
    if (i.n_linear_layers)
        printf("layers        %d (%d linear attention, %d full attention)\n", i.n_layers, i.n_linear_layers,
               i.n_layers - i.n_linear_layers);
    else
        printf("layers        %d\n", i.n_layers);
    printf("hidden        %d\n", i.hidden_size);
    printf("heads         %d (kv %d, head_dim %d)\n", i.n_heads, i.n_kv_heads, i.head_dim);
    char layout[256]; /* what differs per layer (windows, gemma4's shapes, KV sharing, experts) */
    ember_llm_describe(m->llm, layout, sizeof layout);
    if (layout[0]) printf("layout        %s\n", layout);
    printf("vocab         %d\n", i.vocab_size);
    printf("max positions %d\n", i.max_position_embeddings);
    printf("device        %s\n", i.device);
    printf("weights       %s, %.1f MiB read per token\n", i.weight_dtype, (double)i.weight_bytes / (1 << 20));
    printf("kv cache      %s, %zu bytes per token (%.1f KiB), budget %.1f MiB (context %d)\n", i.kv_type,
           i.kv_bytes_per_token, (double)i.kv_bytes_per_token / 1024, (double)i.kv_capacity / (1 << 20), i.n_ctx);
    if (i.n_linear_layers)
        printf("state         %.1f KiB of recurrent state per sequence (f32, any length)\n",
               (double)i.state_bytes_per_row / 1024);
    printf("eos ids      ");
    for (int k = 0; k < i.n_eos; k++) printf(" %d", i.eos_ids[k]);
    printf("\nbos id        %d\n", i.bos_id);
    ember_model_free(m);
    return 0;
}
