/*
 * cmd_mkmodel.c - `ember mkmodel`: writes a model directory with random
 * weights for a given config (a preset or a config.json), so the engine can
 * run and be benchmarked on realistic shapes with no download.
 *
 * Weights are uniform with the chosen standard deviation; norm weights are
 * 1 + noise; every tensor's values come from its own generator seeded by
 * (seed, tensor name), so output does not depend on write order.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "args.h"
#include "cli.h"
#include "core/dtype.h"
#include "core/mapfile.h"
#include "core/utf8.h"
#include "core/util.h"
#include "formats/arch.h"
#include "formats/config.h"
#include "formats/safetensors.h"
#include "sample/sampler.h"

typedef struct preset {
    const char *name, *about, *config;
} preset;

static const preset k_presets[] = {
    {"demo", "the server's demo: a small llama over a byte-level tokenizer with a ChatML template",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 259,"
     " \"hidden_size\": 256, \"intermediate_size\": 688, \"num_hidden_layers\": 4, \"num_attention_heads\": 8,"
     " \"num_key_value_heads\": 4, \"head_dim\": 32, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
     " \"eos_token_id\": 258}"},
    {"tiny", "a small llama (hidden 256, 4 layers, vocab 4096), no tokenizer",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 4096,"
     " \"hidden_size\": 256, \"intermediate_size\": 688, \"num_hidden_layers\": 4, \"num_attention_heads\": 8,"
     " \"num_key_value_heads\": 4, \"head_dim\": 32, \"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 1,"
     " \"eos_token_id\": 2}"},
    {"qwen2.5-0.5b", "Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936, tied)",
     "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 151936,"
     " \"hidden_size\": 896, \"intermediate_size\": 4864, \"num_hidden_layers\": 24, \"num_attention_heads\": 14,"
     " \"num_key_value_heads\": 2, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
     " \"use_sliding_window\": false, \"sliding_window\": 32768, \"max_window_layers\": 21,"
     " \"bos_token_id\": 151643, \"eos_token_id\": 151645}"},
    {"llama3.2-1b", "Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, vocab 128256, tied)",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256,"
     " \"hidden_size\": 2048, \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,"
     " \"num_key_value_heads\": 8, \"head_dim\": 64, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
     " \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0,"
     " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
     " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 128000,"
     " \"eos_token_id\": [128001, 128008, 128009]}"},
    {"llama3.1-8b", "Llama-3.1-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, vocab 128256, untied)",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256,"
     " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
     " \"num_key_value_heads\": 8, \"head_dim\": 128, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
     " \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
     " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
     " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"bos_token_id\": 128000,"
     " \"eos_token_id\": [128001, 128008, 128009]}"},
    /* Qwen3.5-2B's text model as we recall the hub's text_config (not checked against the file;
       llama.cpp types it as qwen35 2B; bench/RESULTS.md) */
    {"qwen3.5-2b", "Qwen3.5-2B's text shape (hybrid: 18 gated DeltaNet + 6 gated attention layers, hidden 2048, "
                   "vocab 248320, tied)",
     "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"vocab_size\": 248320,"
     " \"hidden_size\": 2048, \"intermediate_size\": 6144, \"num_hidden_layers\": 24, \"num_attention_heads\": 8,"
     " \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-06,"
     " \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128,"
     " \"linear_value_head_dim\": 128, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 16,"
     " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25,"
     " \"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10]}, \"tie_word_embeddings\": true,"
     " \"hidden_act\": \"silu\", \"eos_token_id\": 248044}"},
    /* Qwen3-0.6B's shape (as we recall the hub's config.json), the dense twin of qwen3-moe-2.4b */
    {"qwen3-0.6b", "Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 heads of 128, 8 KV heads, MLP 3072, vocab 151936, "
                   "tied)",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 151936,"
     " \"hidden_size\": 1024, \"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
     " \"num_key_value_heads\": 8, \"head_dim\": 128, \"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000.0, \"attention_bias\": false, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
     " \"bos_token_id\": 151643, \"eos_token_id\": 151645}"},
    /* Qwen3-0.6B with each MLP (3072 wide) replaced by 64 experts of 384 (= 3072 / 8), top-8, as
       Qwen3-30B-A3B does (softmax router, renormalised top-k, no shared expert): 2.4 B parameters,
       0.6 B active per token, the same as qwen3-0.6b, so the two compare MoE and dense at equal
       active size */
    {"qwen3-moe-2.4b", "Qwen3-MoE, Qwen3-0.6B's attention with 64 experts of 384, top-8, in every layer "
                       "(2.4 B total, 0.6 B active: qwen3-0.6b's)",
     "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 151936,"
     " \"hidden_size\": 1024, \"intermediate_size\": 3072, \"moe_intermediate_size\": 384, \"num_experts\": 64,"
     " \"num_experts_per_tok\": 8, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
     " \"num_hidden_layers\": 28, \"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 128,"
     " \"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
     " \"attention_bias\": false, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
     " \"bos_token_id\": 151643, \"eos_token_id\": 151645}"},
    {"gemma3-1b", "Gemma-3-1B's shape (hidden 1152, 26 layers, 4 heads of 256, 1 KV head, 5 of 6 layers sliding 512, "
                  "vocab 262144, tied)",
     "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", \"vocab_size\": 262144,"
     " \"hidden_size\": 1152, \"intermediate_size\": 6912, \"num_hidden_layers\": 26, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 1, \"head_dim\": 256, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, \"sliding_window\": 512,"
     " \"sliding_window_pattern\": 6, \"query_pre_attn_scalar\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
     " \"attn_logit_softcapping\": null, \"final_logit_softcapping\": null, \"tie_word_embeddings\": true,"
     " \"bos_token_id\": 2, \"eos_token_id\": [1, 106]}"},
};

typedef struct tensor_spec {
    char name[128];
    int ndim;
    int64_t shape[3];
    bool is_norm;
} tensor_spec;

typedef struct gen_ctx {
    const tensor_spec *specs;
    ember_dtype dtype;
    float std;
    uint64_t seed;
    ember_rng rng;
    int cur;
} gen_ctx;

static int fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    gen_ctx *g = user;
    if (first == 0 || index != g->cur) { /* a new tensor: its own stream */
        g->cur = index;
        ember_rng_seed(&g->rng, g->seed ^ ember_hash_str(g->specs[index].name));
    }
    const tensor_spec *t = &g->specs[index];
    float a = g->std * 1.7320508f; /* uniform on [-a, a] has this std */
    for (size_t i = 0; i < n; i++) {
        float u = (float)(ember_rng_uniform(&g->rng) * 2.0 - 1.0) * a;
        float v = t->is_norm ? 1.0f + u : u;
        if (g->dtype == EMBER_F32)
            ((float *)dst)[i] = v;
        else if (g->dtype == EMBER_BF16)
            ((uint16_t *)dst)[i] = ember_f32_to_bf16(v);
        else
            ((uint16_t *)dst)[i] = ember_f32_to_f16(v);
    }
    return EMBER_OK;
}

static int add_spec(tensor_spec *s, int *n, const char *name, int64_t d0, int64_t d1, bool norm) {
    tensor_spec *t = &s[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->is_norm = norm;
    return 0;
}

/* A hybrid's (model/qwen3_next.c) layer tensors in Qwen3.5's separate
   layout, dense MLP, names "<prefix>.l.*"; its norms scale by 1 + w (noise
   around 0) except the DeltaNet's gated norm; A_log and dt_bias noise
   around 0. */
static void hybrid_layer(const ember_model_config *c, const char *prefix, int l, bool linear, tensor_spec *s, int *n) {
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D,
                  I = c->intermediate_size, Hv = c->lin_v_heads, Z = Hv * c->lin_v_dim,
                  C = 2 * (int64_t)c->lin_k_heads * c->lin_k_dim + Z;
    char nm[128];
#define L(suffix) (snprintf(nm, sizeof nm, "%s.%d.%s", prefix, l, suffix), nm)
    add_spec(s, n, L("input_layernorm.weight"), H, 0, false);
    add_spec(s, n, L("post_attention_layernorm.weight"), H, 0, false);
    if (linear) {
        add_spec(s, n, L("linear_attn.in_proj_qkv.weight"), C, H, false);
        add_spec(s, n, L("linear_attn.in_proj_z.weight"), Z, H, false);
        add_spec(s, n, L("linear_attn.in_proj_b.weight"), Hv, H, false);
        add_spec(s, n, L("linear_attn.in_proj_a.weight"), Hv, H, false);
        add_spec(s, n, L("linear_attn.conv1d.weight"), C, 1, false);
        s[*n - 1].ndim = 3; /* [C, 1, K] */
        s[*n - 1].shape[2] = c->lin_conv_k;
        add_spec(s, n, L("linear_attn.A_log"), Hv, 0, false);
        add_spec(s, n, L("linear_attn.dt_bias"), Hv, 0, false);
        add_spec(s, n, L("linear_attn.norm.weight"), c->lin_v_dim, 0, true);
        add_spec(s, n, L("linear_attn.out_proj.weight"), H, Z, false);
    } else {
        add_spec(s, n, L("self_attn.q_proj.weight"), 2 * Q, H, false); /* q and its output gate per head */
        add_spec(s, n, L("self_attn.k_proj.weight"), KV, H, false);
        add_spec(s, n, L("self_attn.v_proj.weight"), KV, H, false);
        add_spec(s, n, L("self_attn.o_proj.weight"), H, Q, false);
        add_spec(s, n, L("self_attn.q_norm.weight"), D, 0, false);
        add_spec(s, n, L("self_attn.k_norm.weight"), D, 0, false);
    }
    add_spec(s, n, L("mlp.gate_proj.weight"), I, H, false);
    add_spec(s, n, L("mlp.up_proj.weight"), I, H, false);
    add_spec(s, n, L("mlp.down_proj.weight"), H, I, false);
#undef L
}

/* The tensors the model loader reads for cfg (model/llama.c, model/gemma.c,
   model/qwen3_next.c for dense hybrids, with the MTP head of model/mtp.c
   when the config has mtp_num_hidden_layers 1). Gemma's norms scale by
   1 + w, so their weights are noise around 0. */
static int list_tensors(const ember_model_config *c, tensor_spec *s) {
    if (c->n_linear) {
        int n = 0;
        add_spec(s, &n, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, false);
        for (int l = 0; l < c->n_layers; l++) hybrid_layer(c, "model.layers", l, c->layer_linear[l], s, &n);
        add_spec(s, &n, "model.norm.weight", c->hidden_size, 0, false);
        if (!c->tie_embeddings) add_spec(s, &n, "lm_head.weight", c->vocab_size, c->hidden_size, false);
        if (c->mtp_layers == 1) { /* the MTP head: one full-attention layer after fc */
            add_spec(s, &n, "mtp.fc.weight", c->hidden_size, 2 * (int64_t)c->hidden_size, false);
            add_spec(s, &n, "mtp.pre_fc_norm_embedding.weight", c->hidden_size, 0, false);
            add_spec(s, &n, "mtp.pre_fc_norm_hidden.weight", c->hidden_size, 0, false);
            hybrid_layer(c, "mtp.layers", 0, false, s, &n);
            add_spec(s, &n, "mtp.norm.weight", c->hidden_size, 0, false);
        }
        return n;
    }
    int n = 0;
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D,
                  I = c->intermediate_size;
    const bool gemma = ember_arch_is_gemma(c->model_type), phi3 = strcmp(c->model_type, "phi3") == 0;
    const bool norm = !gemma;
    char nm[128];
    add_spec(s, &n, "model.embed_tokens.weight", c->vocab_size, H, false);
    for (int l = 0; l < c->n_layers; l++) {
#define L(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), nm)
        add_spec(s, &n, L("input_layernorm.weight"), H, 0, norm);
        if (phi3) {
            add_spec(s, &n, L("self_attn.qkv_proj.weight"), Q + 2 * KV, H, false);
        } else {
            add_spec(s, &n, L("self_attn.q_proj.weight"), Q, H, false);
            add_spec(s, &n, L("self_attn.k_proj.weight"), KV, H, false);
            add_spec(s, &n, L("self_attn.v_proj.weight"), KV, H, false);
        }
        add_spec(s, &n, L("self_attn.o_proj.weight"), H, Q, false);
        if (c->attn_bias) {
            add_spec(s, &n, L("self_attn.q_proj.bias"), Q, 0, false);
            add_spec(s, &n, L("self_attn.k_proj.bias"), KV, 0, false);
            add_spec(s, &n, L("self_attn.v_proj.bias"), KV, 0, false);
        }
        if (c->attn_out_bias) add_spec(s, &n, L("self_attn.o_proj.bias"), H, 0, false);
        if (c->qk_norm) {
            add_spec(s, &n, L("self_attn.q_norm.weight"), D, 0, norm);
            add_spec(s, &n, L("self_attn.k_norm.weight"), D, 0, norm);
        }
        add_spec(s, &n, L("post_attention_layernorm.weight"), H, 0, norm);
        if (gemma) {
            add_spec(s, &n, L("pre_feedforward_layernorm.weight"), H, 0, norm);
            add_spec(s, &n, L("post_feedforward_layernorm.weight"), H, 0, norm);
        }
        if (c->n_experts && c->layer_moe[l]) { /* model/blocks.c ember_load_moe */
            const int64_t Im = c->moe_intermediate_size, Is = (int64_t)c->n_shared_experts * Im;
            char en[64];
            add_spec(s, &n, L("mlp.gate.weight"), c->n_experts, H, false);
            for (int e = 0; e < c->n_experts; e++) {
                static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
                for (int p = 0; p < 3; p++) {
                    snprintf(en, sizeof en, "mlp.experts.%d.%s.weight", e, proj[p]);
                    add_spec(s, &n, L(en), p < 2 ? Im : H, p < 2 ? H : Im, false);
                }
            }
            if (Is) {
                add_spec(s, &n, L("mlp.shared_experts.gate_proj.weight"), Is, H, false);
                add_spec(s, &n, L("mlp.shared_experts.up_proj.weight"), Is, H, false);
                add_spec(s, &n, L("mlp.shared_experts.down_proj.weight"), H, Is, false);
            }
            if (c->router_sigmoid) add_spec(s, &n, L("mlp.gate.e_score_correction_bias"), c->n_experts, 0, false);
        } else if (phi3) {
            add_spec(s, &n, L("mlp.gate_up_proj.weight"), 2 * I, H, false);
        } else {
            add_spec(s, &n, L("mlp.gate_proj.weight"), I, H, false);
            add_spec(s, &n, L("mlp.up_proj.weight"), I, H, false);
        }
        if (!(c->n_experts && c->layer_moe[l])) add_spec(s, &n, L("mlp.down_proj.weight"), H, I, false);
        if (c->mlp_bias && !(c->n_experts && c->layer_moe[l])) {
            add_spec(s, &n, L("mlp.gate_proj.bias"), I, 0, false);
            add_spec(s, &n, L("mlp.up_proj.bias"), I, 0, false);
            add_spec(s, &n, L("mlp.down_proj.bias"), H, 0, false);
        }
#undef L
    }
    add_spec(s, &n, "model.norm.weight", H, 0, norm);
    if (!c->tie_embeddings) add_spec(s, &n, "lm_head.weight", c->vocab_size, H, false);
    return n;
}

/* mkdir -p: creates dir and any missing parents. */
static int make_dirs(const char *dir) {
    char buf[4096];
    if (strlen(dir) >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(buf, dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* GPT-2's byte-to-character map: printable bytes stand for themselves, the
   rest take code points from 256 up, in byte order. */
static unsigned byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static const char *const k_demo_specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

/* tokenizer.json of the demo model: byte-level BPE over the 256 bytes (no
   merges) plus three special tokens, ids 256..258. Caller frees. */
static char *demo_tokenizer_json(void) {
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_char(b);
        char u[5] = {0};
        ember_utf8_put(cp, u);
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_t *added = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + i, "content",
                                               k_demo_specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    json_t *bl = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                           "use_regex", 1);
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:O, s:O, s:O, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}}",
                             "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
                             "pre_tokenizer", bl, "post_processor", bl, "decoder", bl, "model", "type", "BPE",
                             "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                             "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges");
    json_decref(bl);
    char *s = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
    json_decref(root);
    return s;
}

static const char k_demo_tokenizer_config[] =
    "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\",\n"
    " \"add_bos_token\": false, \"model_max_length\": 4096,\n"
    " \"chat_template\": \"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\\\n' + "
    "message['content'] + '<|im_end|>' + '\\\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\\\n' }}{% endif %}\"}\n";

static int write_text(const char *dir, const char *file, const char *text) {
    char *p = ember_path_join(dir, file);
    FILE *fp = p ? fopen(p, "w") : NULL;
    int rc = 0;
    if (!fp || fputs(text, fp) < 0) rc = cli_fail("mkmodel", "%s: cannot write: %s", p ? p : file, strerror(errno));
    if (fp && fclose(fp) != 0 && !rc) rc = cli_fail("mkmodel", "%s: cannot write: %s", p, strerror(errno));
    free(p);
    return rc;
}

int cmd_mkmodel(int argc, char **argv) {
    const char *preset_name = NULL, *config_path = NULL, *out = NULL, *dtype_s = "bf16";
    uint64_t seed = 1;
    float std = 0.02f;
    bool list = false;
    cli_opt opts[] = {
        {"preset", 0, OPT_STR, &preset_name, "NAME", "a built-in shape (see --list)", 0, 0, false},
        {"config", 0, OPT_STR, &config_path, "FILE", "a config.json to use instead of a preset", 0, 0, false},
        {"out", 'o', OPT_STR, &out, "DIR", "the model directory to write (created if needed)", 0, 0, false},
        {"dtype", 0, OPT_STR, &dtype_s, "TYPE", "f32, f16 or bf16 (default bf16)", 0, 0, false},
        {"seed", 's', OPT_U64, &seed, "S", "random seed (default 1)", 0, 0, false},
        {"std", 0, OPT_FLOAT, &std, "X", "weight standard deviation (default 0.02)", 0, 10, false},
        {"list", 0, OPT_FLAG, &list, NULL, "list the presets", 0, 0, false},
    };
    cli_cmd cmd = {"mkmodel", "Write a model directory with random weights (for demos, tests and benchmarks).",
                   "(--preset NAME | --config FILE) --out DIR [--dtype bf16] [--seed S]",
                   "The output has no tokenizer: drive it with --ids. A hybrid config with mtp_num_hidden_layers 1\n"
                   "gets a random MTP head (mtp.*, for --spec mtp).", opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (list) {
        for (size_t i = 0; i < EMBER_ARRAY_LEN(k_presets); i++) printf("%-14s %s\n", k_presets[i].name, k_presets[i].about);
        return 0;
    }
    if (!out) return cli_fail("mkmodel", "--out is required");
    if (!!preset_name == !!config_path) return cli_fail("mkmodel", "give exactly one of --preset and --config");
    ember_dtype dt = strcmp(dtype_s, "f32") == 0    ? EMBER_F32
                     : strcmp(dtype_s, "f16") == 0  ? EMBER_F16
                     : strcmp(dtype_s, "bf16") == 0 ? EMBER_BF16
                                                    : EMBER_DTYPE_INVALID;
    if (dt == EMBER_DTYPE_INVALID) return cli_fail("mkmodel", "--dtype must be f32, f16 or bf16, got '%s'", dtype_s);
    char *text = NULL;
    const char *cfg_text = NULL, *cfg_name = "config";
    ember_error err = {0};
    if (preset_name) {
        for (size_t i = 0; i < EMBER_ARRAY_LEN(k_presets); i++)
            if (strcmp(k_presets[i].name, preset_name) == 0) cfg_text = k_presets[i].config;
        if (!cfg_text) return cli_fail("mkmodel", "unknown preset '%s' (see --list)", preset_name);
    } else {
        if (ember_read_file(config_path, 16u << 20, &text, NULL, &err)) return cli_fail("mkmodel", "%s", err.msg);
        cfg_text = text;
        cfg_name = config_path;
    }
    ember_model_config cfg;
    if (ember_config_parse(cfg_name, cfg_text, strlen(cfg_text), &cfg, &err)) {
        free(text);
        return cli_fail("mkmodel", "%s", err.msg);
    }
    if (cfg.n_linear && cfg.mtp_layers > 1) {
        free(text);
        return cli_fail("mkmodel", "%s: mtp_num_hidden_layers %d (an MTP head of 1 layer is written)", cfg_name,
                        cfg.mtp_layers);
    }
    if (cfg.n_experts && (cfg.n_linear || ember_arch_is_gemma(cfg.model_type))) { /* list_tensors writes
                                                                                     qwen3_moe / glm4_moe experts */
        free(text);
        return cli_fail("mkmodel", "%s: mixture-of-experts models (%s) are not supported yet", cfg_name, cfg.model_type);
    }
    if (make_dirs(out) != 0) {
        free(text);
        return cli_fail("mkmodel", "%s: cannot create directory: %s", out, strerror(errno));
    }
    const size_t n_specs = (size_t)(cfg.n_layers + 1) * (24 + 3 * (size_t)cfg.n_experts) + 8; /* + an MTP head */
    tensor_spec *specs = calloc(n_specs, sizeof *specs);
    ember_st_out *outs = calloc(n_specs, sizeof *outs);
    char *st_path = ember_path_join(out, "model.safetensors");
    rc = 0;
    if (!specs || !outs || !st_path) rc = cli_fail("mkmodel", "out of memory");
    if (!rc) rc = write_text(out, "config.json", cfg_text);
    if (!rc) {
        char gen[256];
        int k = snprintf(gen, sizeof gen, "{\"bos_token_id\": %d, \"eos_token_id\": [", cfg.bos_id);
        for (int i = 0; i < cfg.n_eos; i++) k += snprintf(gen + k, sizeof gen - (size_t)k, "%s%d", i ? ", " : "", cfg.eos_ids[i]);
        snprintf(gen + k, sizeof gen - (size_t)k, "]}\n");
        rc = write_text(out, "generation_config.json", gen);
    }
    if (!rc && preset_name && strcmp(preset_name, "demo") == 0) {
        char *tj = demo_tokenizer_json();
        rc = tj ? write_text(out, "tokenizer.json", tj) : cli_fail("mkmodel", "out of memory");
        if (!rc) rc = write_text(out, "tokenizer_config.json", k_demo_tokenizer_config);
        free(tj);
    }
    if (!rc) {
        int n = list_tensors(&cfg, specs);
        for (int i = 0; i < n; i++)
            outs[i] = (ember_st_out){specs[i].name, dt, specs[i].ndim,
                                     {specs[i].shape[0], specs[i].shape[1], specs[i].shape[2]}};
        gen_ctx g = {specs, dt, std, seed, {{0}}, -1};
        if (ember_st_write(st_path, outs, n, fill, &g, &err)) rc = cli_fail("mkmodel", "%s", err.msg);
    }
    free(st_path);
    free(specs);
    free(outs);
    free(text);
    return rc;
}
