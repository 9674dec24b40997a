/*
 * test_config.c - config.json in both serialisations, every field checked,
 * and RoPE frequencies of each scaling kind against the formulas evaluated
 * independently in double precision.
 */
#include "formats/arch.h"
#include "formats/config.h"
#include "model/family.h"
#include "model/rope.h"
#include "test.h"

static int parse(const char *json, ember_model_config *c, ember_error *err) {
    return ember_config_parse("config.json", json, strlen(json), c, err);
}

#define BASE "\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
             "\"num_hidden_layers\":2,\"num_attention_heads\":4"

#define GEMMA2 "\"model_type\":\"gemma2\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
               "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16"
#define GEMMA3 "\"model_type\":\"gemma3_text\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
               "\"num_hidden_layers\":12,\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":16"
#define PHI3 "\"model_type\":\"phi3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
             "\"num_hidden_layers\":2,\"num_attention_heads\":4"

static void expect_err(const char *json, int code, const char *needle) {
    ember_model_config c;
    ember_error err = {0};
    int rc = parse(json, &c, &err);
    CHECKF(rc == code, "%s -> %d (%s)", json, rc, err.msg);
    CHECKF(strstr(err.msg, "config.json") && (!needle || strstr(err.msg, needle)), "message: %s (want %s)", err.msg,
           needle);
}

/* The family table (formats/arch.h): lookups both ways and the lists the
   messages name. */
static void family_table(void) {
    char b[256];
    CHECK(strcmp(ember_arch_list(false, b, sizeof b), "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, qwen3_moe, glm4_moe, "
                                                 "qwen3_next, qwen3_5_text, qwen3_5_moe_text, gemma4_text") == 0);
    CHECK(strcmp(ember_arch_list(true, b, sizeof b), "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe, glm4moe, "
                                                "qwen3next, qwen35, qwen35moe, gemma4") == 0);
    CHECK(strcmp(ember_arch_list(true, b, 8), "llama, ") == 0); /* cut, NUL-terminated */
    const ember_arch *a = ember_arch_find_gguf("mistral");
    CHECK(a && strcmp(a->model_type, "llama") == 0 && a->rope_interleaved);
    a = ember_arch_find_gguf("llama");
    CHECK(a && strcmp(a->model_type, "llama") == 0);
    a = ember_arch_find_gguf("gemma3");
    CHECK(a && strcmp(a->model_type, "gemma3_text") == 0 && a->family == EMBER_FAMILY_GEMMA);
    a = ember_arch_find("mistral");
    CHECK(a && strcmp(a->gguf, "llama") == 0 && a->rope_interleaved);
    CHECK(ember_arch_find("qwen2") && !ember_arch_find("qwen2")->rope_interleaved);
    CHECK(!ember_arch_find("gemma") && !ember_arch_find_gguf("gemma3_text") && !ember_arch_find(NULL));
    CHECK(ember_arch_is_gemma("gemma2") && !ember_arch_is_gemma("gemma7") && !ember_arch_is_gemma("phi3"));
    CHECK(ember_config_model_type_supported("phi3") && !ember_config_model_type_supported("falcon"));
    a = ember_arch_find_gguf("qwen3moe");
    CHECK(a && strcmp(a->model_type, "qwen3_moe") == 0 && a->family == EMBER_FAMILY_QWEN3_MOE);
}

#define QMOE "\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
             "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"moe_intermediate_size\":32"

#define GLMOE "\"model_type\":\"glm4_moe\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
              "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"moe_intermediate_size\":32"

/* qwen3_moe's and glm4_moe's fields: both spellings of the expert count, which layers are
   MoE, and corrupt counts refused naming the field. */
static void moe_config(void) {
    ember_model_config c;
    ember_error err = {0};
    CHECKF(parse("{" QMOE ",\"num_experts\":8,\"num_experts_per_tok\":2,\"norm_topk_prob\":true,"
                 "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.n_experts == 8 && c.n_experts_used == 2 && c.moe_intermediate_size == 32 && c.norm_topk_prob && c.qk_norm);
    CHECK(!c.layer_moe[0] && c.layer_moe[1] && !c.layer_moe[2] && !c.layer_moe[3]); /* step 2; layer 3 dense */
    CHECKF(parse("{" QMOE ",\"num_local_experts\":4,\"num_experts_per_tok\":4}", &c, &err) == EMBER_OK, "%s",
           err.msg);
    CHECK(c.n_experts == 4 && c.n_experts_used == 4 && !c.norm_topk_prob && c.layer_moe[0] && c.layer_moe[3]);
    expect_err("{" QMOE ",\"num_experts\":0,\"num_experts_per_tok\":1}", EMBER_ERR_FORMAT, "num_experts");
    expect_err("{" QMOE ",\"num_experts\":4,\"num_experts_per_tok\":5}", EMBER_ERR_FORMAT, "above the expert count");
    expect_err("{" QMOE ",\"num_experts_per_tok\":1}", EMBER_ERR_FORMAT, "num_local_experts");
    expect_err("{" QMOE ",\"num_experts\":4,\"num_experts_per_tok\":1,\"mlp_only_layers\":[4]}", EMBER_ERR_FORMAT,
               "mlp_only_layers[0]");
    expect_err("{" QMOE ",\"num_experts\":4,\"num_experts_per_tok\":1,\"mlp_only_layers\":3}", EMBER_ERR_FORMAT,
               "mlp_only_layers");
    CHECKF(parse("{" BASE "}", &c, &err) == EMBER_OK && c.n_experts == 0 && !c.layer_moe[0], "%s", err.msg);
    /* glm4_moe: dense first layers, sigmoid router with groups, shared experts, q/k/v biases without o */
    CHECKF(parse("{" GLMOE ",\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"first_k_dense_replace\":2,"
                 "\"n_group\":4,\"topk_group\":2,\"routed_scaling_factor\":2.5,\"n_shared_experts\":1,"
                 "\"attention_bias\":true,\"use_qk_norm\":true}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.n_experts == 8 && c.router_sigmoid && c.norm_topk_prob && c.n_group == 4 && c.topk_group == 2 &&
          c.routed_scale == 2.5f && c.n_shared_experts == 1 && c.qk_norm && c.attn_bias && !c.attn_out_bias);
    CHECK(!c.layer_moe[0] && !c.layer_moe[1] && c.layer_moe[2] && c.layer_moe[3]);
    expect_err("{" GLMOE ",\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"n_group\":3}", EMBER_ERR_FORMAT,
               "n_group 3");
    expect_err("{" GLMOE ",\"n_routed_experts\":8,\"num_experts_per_tok\":4,\"n_group\":4,\"topk_group\":1}",
               EMBER_ERR_FORMAT, "topk_group 1");
}

#define HYB "\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":4," \
            "\"num_attention_heads\":4,\"head_dim\":32,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4," \
            "\"linear_key_head_dim\":16,\"linear_value_head_dim\":16,\"partial_rotary_factor\":0.25"
#define LT "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"]"

/* The hybrid families' fields: layer_types or the hub's full_attention_interval,
   the DeltaNet shapes, M-RoPE sections, the gated shared expert; impossible
   hybrid metadata refused naming the field. */
static void hybrid_config(void) {
    ember_model_config c;
    ember_error err = {0};
    CHECKF(parse("{\"model_type\":\"qwen3_5_text\"," HYB "," LT ",\"linear_conv_kernel_dim\":4,"
                 "\"rope_parameters\":{\"rope_theta\":1e4,\"partial_rotary_factor\":0.25,\"mrope_section\":[2,1,1],"
                 "\"mrope_interleaved\":true}}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.n_linear == 3 && c.layer_linear[0] && c.layer_linear[2] && !c.layer_linear[3] && c.lin_conv_k == 4 &&
          c.lin_k_heads == 2 && c.lin_v_heads == 4 && c.lin_k_dim == 16 && c.lin_v_dim == 16 && c.attn_output_gate &&
          c.qk_norm && c.n_experts == 0 && c.layer_window[0] == 0);
    /* hub format: every 4th layer full by default */
    CHECKF(parse("{\"model_type\":\"qwen3_next\"," HYB ",\"num_experts\":4,\"num_experts_per_tok\":2,"
                 "\"moe_intermediate_size\":32,\"shared_expert_intermediate_size\":48}", &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.n_linear == 3 && !c.layer_linear[3] && c.shared_expert_size == 48 && c.norm_topk_prob && c.layer_moe[0]);
    CHECKF(parse("{\"model_type\":\"qwen3_next\"," HYB ",\"full_attention_interval\":2,\"num_experts\":4,"
                 "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.n_linear == 2 && c.layer_linear[0] && !c.layer_linear[1] && c.layer_linear[2] && !c.layer_linear[3]);
    expect_err("{\"model_type\":\"qwen3_5_text\"," HYB ",\"layer_types\":[\"linear_attention\",\"full_attention\"]}",
               EMBER_ERR_FORMAT, "layer_types");
    expect_err("{\"model_type\":\"qwen3_5_text\"," HYB ",\"layer_types\":[\"linear_attention\",\"linear_attention\","
               "\"mamba\",\"full_attention\"]}",
               EMBER_ERR_UNSUPPORTED, "layer_types[2]");
    expect_err("{\"model_type\":\"qwen3_5_text\"," HYB "," LT ",\"linear_conv_kernel_dim\":0}", EMBER_ERR_FORMAT,
               "linear_conv_kernel_dim");
    expect_err("{\"model_type\":\"qwen3_5_text\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
               "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"linear_num_key_heads\":3,"
               "\"linear_num_value_heads\":4}",
               EMBER_ERR_FORMAT, "linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3");
    expect_err("{\"model_type\":\"qwen3_5_text\"," HYB "," LT ",\"rope_parameters\":{\"rope_theta\":1e4,"
               "\"partial_rotary_factor\":0.25,\"mrope_section\":[2,2,1]}}",
               EMBER_ERR_FORMAT, "mrope_section");
    /* linear_attention is a layer type of the hybrids only */
    expect_err("{\"model_type\":\"qwen3\"," HYB "," LT "}", EMBER_ERR_UNSUPPORTED, "layer_types[0]");
}

/* ember_moe_route against weights worked out by hand: softmax top-2 with
   and without renormalising; the sigmoid router where the bias changes the
   choice but not the weights, and where group top-k excludes the single
   best expert because its group's pair sum is lower. */
static void moe_routing(void) {
    ember_model_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 4;
    c.n_experts_used = 2;
    int32_t sel[4];
    float w[4], choice[8];
    const float z[4] = {0.0f, logf(3.0f), logf(2.0f), 0.0f}; /* softmax: 1/7, 3/7, 2/7, 1/7 */
    ember_moe_route(&c, z, NULL, choice, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2 && fabsf(w[0] - 3.0f / 7) < 1e-6f && fabsf(w[1] - 2.0f / 7) < 1e-6f);
    c.norm_topk_prob = true;
    ember_moe_route(&c, z, NULL, choice, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2 && fabsf(w[0] - 0.6f) < 1e-6f && fabsf(w[1] - 0.4f) < 1e-6f);
    const float tie[4] = {1, 2, 2, 1}; /* ties go to the lower index */
    ember_moe_route(&c, tie, NULL, choice, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2);
    /* sigmoid: z = 0 gives 0.5, ln 3 gives 0.75 */
    c.router_sigmoid = true;
    c.n_group = c.topk_group = 1;
    c.routed_scale = 2.0f;
    const float zs[4] = {0.0f, logf(3.0f), 0.0f, 0.0f}, bias[4] = {0.0f, 0.0f, 0.5f, 0.0f};
    ember_moe_route(&c, zs, bias, choice, sel, w); /* chosen by s + b: 2 (1.0), 1 (0.75); weighed by s */
    CHECK(sel[0] == 2 && sel[1] == 1 && fabsf(w[0] - 2.0f * 0.5f / 1.25f) < 1e-6f &&
          fabsf(w[1] - 2.0f * 0.75f / 1.25f) < 1e-6f);
    /* 8 experts in 4 groups of 2, the best 2 groups kept: expert 0 is the
       single best but its group {0, 1} sums lowest */
    c.n_experts = 8;
    c.n_group = 4;
    c.topk_group = 2;
    c.routed_scale = 1.0f;
    c.norm_topk_prob = false;
    const float z8[8] = {4, -4, 1, 1, 2, 2, 0.5f, 0.5f}; /* s: .982 .018 | .731 .731 | .881 .881 | .622 .622 */
    ember_moe_route(&c, z8, NULL, choice, sel, w);
    CHECKF(sel[0] == 4 && sel[1] == 5, "group top-k chose %d, %d", sel[0], sel[1]);
    CHECK(fabsf(w[0] - 1.0f / (1.0f + expf(-2.0f))) < 1e-6f);
}

int main(void) {
    family_table();
    moe_config();
    hybrid_config();
    moe_routing();
    ember_model_config c;
    ember_error err = {0};
    /* hub format with defaults */
    CHECKF(parse("{" BASE "}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.n_kv_heads == 4 && c.head_dim == 16 && c.rope.theta == 10000.0 && c.rope.type == EMBER_ROPE_DEFAULT);
    CHECK(c.rms_norm_eps == 1e-6f && !c.tie_embeddings && c.bos_id == -1 && c.n_eos == 0);
    /* transformers 5 format */
    CHECKF(parse("{" BASE ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0},"
                 "\"dtype\":\"bfloat16\",\"eos_token_id\":[5,6],\"bos_token_id\":1}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.rope.theta == 500000.0 && c.n_eos == 2 && c.eos_ids[1] == 6 && c.bos_id == 1);
    /* qwen2: biases, sliding window rules */
    CHECK(parse("{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
                "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                "\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":2}",
                &c, &err) == EMBER_OK);
    CHECK(c.attn_bias && !c.attn_out_bias && c.layer_window[0] == 0 && c.layer_window[1] == 0 &&
          c.layer_window[2] == 8 && c.layer_window[3] == 8);
    CHECK(parse("{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"use_sliding_window\":false,"
                "\"sliding_window\":8}",
                &c, &err) == EMBER_OK);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 0);
    CHECK(parse("{\"model_type\":\"mistral\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"sliding_window\":16}",
                &c, &err) == EMBER_OK);
    CHECK(c.layer_window[0] == 16 && c.layer_window[1] == 16 && !c.attn_bias);
    CHECK(parse("{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"layer_types\":[\"full_attention\","
                "\"sliding_attention\"],\"sliding_window\":4}",
                &c, &err) == EMBER_OK);
    CHECK(c.qk_norm && c.layer_window[0] == 0 && c.layer_window[1] == 4);
    CHECK(parse("{" BASE ",\"attention_bias\":true,\"mlp_bias\":true}", &c, &err) == EMBER_OK);
    CHECK(c.attn_bias && c.attn_out_bias && c.mlp_bias);

    /* gemma2, transformers 5 format (as the fixture) */
    CHECKF(parse("{" GEMMA2 ",\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                 "\"full_attention\"],\"sliding_window\":16,\"attn_logit_softcapping\":2.0,"
                 "\"final_logit_softcapping\":4.0,\"query_pre_attn_scalar\":32,\"hidden_activation\":"
                 "\"gelu_pytorch_tanh\",\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},"
                 "\"tie_word_embeddings\":true,\"use_bidirectional_attention\":null}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.act == EMBER_ACT_GELU_TANH && c.attn_softcap == 2.0f && c.final_softcap == 4.0f &&
          c.query_pre_attn_scalar == 32.0f && c.tie_embeddings && !c.qk_norm && !c.attn_bias);
    CHECK(c.layer_window[0] == 16 && c.layer_window[1] == 0 && c.layer_window[2] == 16 && c.layer_window[3] == 0);
    CHECK(c.layer_sliding[0] && !c.layer_sliding[1] && c.rope.theta == 10000.0 && c.rope_local.theta == 10000.0);
    /* gemma2, hub format: transformers' defaults (softcaps 50 / 30, window 4096 on even layers, tied) */
    CHECKF(parse("{" GEMMA2 ",\"rope_theta\":10000.0,\"hidden_act\":\"gelu_pytorch_tanh\"}", &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f && c.query_pre_attn_scalar == 256.0f && c.tie_embeddings);
    CHECK(c.layer_window[0] == 4096 && c.layer_window[1] == 0 && c.layer_window[2] == 4096 && c.layer_window[3] == 0);
    /* null soft-capping: none */
    CHECK(parse("{" GEMMA2 ",\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null}", &c, &err) ==
          EMBER_OK);
    CHECK(c.attn_softcap == 0 && c.final_softcap == 0);
    /* gemma3_text, transformers 5: rope_parameters keyed by layer type */
    CHECKF(parse("{" GEMMA3 ",\"sliding_window\":512,\"query_pre_attn_scalar\":16,\"rope_parameters\":"
                 "{\"full_attention\":{\"rope_theta\":1000000.0,\"rope_type\":\"linear\",\"factor\":8.0},"
                 "\"sliding_attention\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"}},"
                 "\"_sliding_window_pattern\":6}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.qk_norm && c.attn_softcap == 0 && c.final_softcap == 0 && c.act == EMBER_ACT_GELU_TANH);
    CHECK(c.rope.theta == 1e6 && c.rope.type == EMBER_ROPE_LINEAR && c.rope.factor == 8.0);
    CHECK(c.rope_local.theta == 1e4 && c.rope_local.type == EMBER_ROPE_DEFAULT);
    for (int i = 0; i < 12; i++)
        CHECKF(c.layer_window[i] == (i % 6 == 5 ? 0 : 512) && c.layer_sliding[i] == (i % 6 != 5), "gemma3 layer %d", i);
    /* gemma3_text, hub format: rope_local_base_freq, rope_scaling for the global layers */
    CHECKF(parse("{" GEMMA3 ",\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,\"rope_scaling\":"
                 "{\"rope_type\":\"linear\",\"factor\":8.0},\"sliding_window_pattern\":4,\"sliding_window\":64}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.rope.theta == 1e6 && c.rope.type == EMBER_ROPE_LINEAR && c.rope.factor == 8.0);
    CHECK(c.rope_local.theta == 1e4 && c.rope_local.type == EMBER_ROPE_DEFAULT && c.rope_local.factor == 1.0);
    for (int i = 0; i < 12; i++) CHECKF(c.layer_window[i] == (i % 4 == 3 ? 0 : 64), "gemma3 hub layer %d", i);
    /* phi3: silu, no biases, a window on every layer when set */
    CHECKF(parse("{" PHI3 ",\"sliding_window\":2047,\"hidden_act\":\"silu\",\"rope_theta\":10000.0,"
                 "\"rope_scaling\":null,\"original_max_position_embeddings\":4096}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.act == EMBER_ACT_SILU && !c.attn_bias && !c.qk_norm && !c.tie_embeddings && c.layer_window[0] == 2047 &&
          c.layer_window[1] == 2047);
    /* MLX per-module entries for phi3's fused projections are kept (mlx-lm's mixed recipe bumps qkv_proj) */
    CHECKF(parse("{" PHI3 ",\"quantization\":{\"group_size\":64,\"bits\":4,\"model.layers.1.self_attn.qkv_proj\":"
                 "{\"group_size\":64,\"bits\":6},\"model.layers.0.mlp.gate_up_proj\":false}}",
                 &c, &err) == EMBER_OK,
           "%s", err.msg);
    {
        int bits, g;
        CHECK(ember_config_quant_module(&c, "model.layers.1.self_attn.qkv_proj", &bits, &g) == EMBER_QMOD_QUANT &&
              bits == 6 && g == 64);
        CHECK(ember_config_quant_module(&c, "model.layers.0.self_attn.qkv_proj", &bits, &g) == EMBER_QMOD_DEFAULT &&
              bits == 4);
        CHECK(ember_config_quant_module(&c, "model.layers.0.mlp.gate_up_proj", &bits, &g) == EMBER_QMOD_FLOAT);
    }
    CHECK(parse("{" PHI3 ",\"sliding_window\":null}", &c, &err) == EMBER_OK);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 0);

    /* errors: missing, mistyped, out of range, unsupported */
    expect_err("{\"model_type\":\"llama\",\"vocab_size\":100}", EMBER_ERR_FORMAT, "'hidden_size'");
    expect_err("{" BASE ",\"num_key_value_heads\":\"2\"}", EMBER_ERR_FORMAT, "must be an integer, got string");
    expect_err("{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64.5,\"intermediate_size\":128,"
               "\"num_hidden_layers\":2,\"num_attention_heads\":4}",
               EMBER_ERR_FORMAT, "hidden_size");
    expect_err("{" BASE ",\"num_key_value_heads\":3}", EMBER_ERR_FORMAT, "multiple");
    expect_err("{" BASE ",\"num_key_value_heads\":-1}", EMBER_ERR_FORMAT, "outside");
    expect_err("{" BASE ",\"rms_norm_eps\":\"x\"}", EMBER_ERR_FORMAT, "rms_norm_eps");
    expect_err("{" BASE ",\"tie_word_embeddings\":1}", EMBER_ERR_FORMAT, "true or false");
    expect_err("{" BASE ",\"eos_token_id\":100}", EMBER_ERR_FORMAT, "eos_token_id");
    expect_err("{" BASE ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}}", EMBER_ERR_UNSUPPORTED, "dynamic");
    expect_err("{" BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", EMBER_ERR_FORMAT,
               "low_freq_factor");
    expect_err("{" BASE ",\"hidden_act\":\"gelu\"}", EMBER_ERR_UNSUPPORTED, "gelu");
    /* an unknown model_type: one line naming it and every supported one */
    expect_err("{\"model_type\":\"gemma4\"}", EMBER_ERR_FORMAT, "text_config"); /* a multimodal wrapper without its text model */
    {
        ember_error e = {0};
        CHECK(parse("{\"model_type\":\"mixtral\"}", &c, &e) == EMBER_ERR_UNSUPPORTED);
        CHECKF(strstr(e.msg, "'mixtral'") && !strchr(e.msg, '\n'), "%s", e.msg);
        static const char *const supported[] = {"llama",  "mistral",     "qwen2",    "qwen3",
                                                "phi3",   "gemma2",      "gemma3_text", "qwen3_moe", "glm4_moe"};
        for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
            CHECKF(strstr(e.msg, supported[i]), "'%s' missing from: %s", supported[i], e.msg);
    }
    expect_err("{" GEMMA2 ",\"hidden_activation\":\"gelu\"}", EMBER_ERR_UNSUPPORTED, "hidden_activation");
    expect_err("{" GEMMA3 ",\"use_bidirectional_attention\":true}", EMBER_ERR_UNSUPPORTED, "bidirectional");
    expect_err("{" PHI3 ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],\"long_factor\":[1]}}",
               EMBER_ERR_UNSUPPORTED, "longrope");
    expect_err("{" GEMMA3 ",\"rope_parameters\":{\"full_attention\":1}}", EMBER_ERR_FORMAT, "rope_parameters");
    expect_err("{\"vocab_size\":1}", EMBER_ERR_FORMAT, "model_type");
    expect_err("[]", EMBER_ERR_FORMAT, "not a JSON object");
    expect_err("{\"model_type\":", EMBER_ERR_FORMAT, "not valid JSON");
    expect_err("{" BASE ",\"head_dim\":7}", EMBER_ERR_FORMAT, "head_dim");
    /* MLX's affine quantization is read (tests/test_mlx.c); other schemes are refused */
    expect_err("{" BASE ",\"quantization\":{\"bits\":4}}", EMBER_ERR_FORMAT, "quantization.group_size");
    expect_err("{" BASE ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}", EMBER_ERR_UNSUPPORTED,
               "gptq");

    /* RoPE: default, linear, llama3, yarn against double-precision formulas */
    float f[64];
    int n_rot;
    float af;
    CHECK(parse("{" BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":4.0}}", &c, &err) == EMBER_OK);
    CHECK(ember_rope_freqs(&c.rope, 16, f, &n_rot, &af, &err) == EMBER_OK && n_rot == 16 && af == 1.0f);
    for (int i = 0; i < 8; i++) CHECK(fabs(f[i] - pow(10000.0, -2.0 * i / 16) / 4) <= 1e-6 * f[i]);
    CHECK(parse("{" BASE ",\"head_dim\":64,\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\","
                "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                "\"original_max_position_embeddings\":8192}}",
                &c, &err) == EMBER_OK);
    CHECK(ember_rope_freqs(&c.rope, 64, f, &n_rot, &af, &err) == EMBER_OK && n_rot == 64);
    for (int i = 0; i < 32; i++) {
        double base = pow(500000.0, -2.0 * i / 64), wl = 2 * 3.141592653589793 / base, want;
        if (wl < 8192.0 / 4)
            want = base;
        else if (wl > 8192.0)
            want = base / 8;
        else {
            double s = (8192.0 / wl - 1.0) / 3.0;
            want = (1 - s) * base / 8 + s * base;
        }
        CHECKF(fabs(f[i] - want) <= 2e-6 * want, "llama3 inv_freq[%d] %g vs %g", i, f[i], want);
    }
    CHECK(parse("{" BASE ",\"max_position_embeddings\":131072,\"rope_theta\":1000000.0,\"rope_scaling\":"
                "{\"type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}}",
                &c, &err) == EMBER_OK);
    CHECK(ember_rope_freqs(&c.rope, 16, f, &n_rot, &af, &err) == EMBER_OK);
    CHECK(fabs(af - (0.1 * log(4.0) + 1.0)) < 1e-6);
    {
        double lo = floor(16 * log(32768 / (32 * 2 * 3.141592653589793)) / (2 * log(1e6)));
        double hi = ceil(16 * log(32768 / (1 * 2 * 3.141592653589793)) / (2 * log(1e6)));
        if (lo < 0) lo = 0;
        if (hi > 15) hi = 15;
        for (int i = 0; i < 8; i++) {
            double pf = pow(1e6, 2.0 * i / 16), ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double want = (1 / (4 * pf)) * ramp + (1 / pf) * (1 - ramp);
            CHECKF(fabs(f[i] - want) <= 2e-6 * want, "yarn inv_freq[%d] %g vs %g", i, f[i], want);
        }
    }
    CHECK(parse("{" BASE ",\"partial_rotary_factor\":0.5}", &c, &err) == EMBER_OK);
    CHECK(ember_rope_freqs(&c.rope, 16, f, &n_rot, &af, &err) == EMBER_OK && n_rot == 8);
    return test_done();
}
