/*
 * model.h - a decoder-only model (every family: llama, mistral, qwen2,
 * qwen3, phi3 in llama.c; gemma2, gemma3_text in gemma.c; qwen3_moe,
 * glm4_moe in qwen3_moe.c; gemma4_text in gemma4.c) as a forward pass
 * over a batch of rows.
 *
 * qwen3_next, qwen3_5_text and qwen3_5_moe_text (hybrid: gated DeltaNet
 * layers whose per-row state the KV cache keeps, kv.h) are in qwen3_next.c.
 *
 * A batch is a flat list of tokens; each token carries its row (a KV cache
 * row) and its position. Any mix works: one prompt's prefill, many rows'
 * decode steps, or both. Each token's result depends only on its own row's
 * tokens: kernels never reduce across tokens.
 *
 * Ownership: ember_llm holds tensors that view weight memory owned by the
 * weight store (which must outlive the model) and buffers it uploaded itself
 * (norms, biases), which ember_llm_free releases. ember_llm_state is the
 * scratch of one forward pass, sized once for max_tokens.
 */
#ifndef EMBER_MODEL_H
#define EMBER_MODEL_H

#include "backend/backend.h"
#include "formats/config.h"
#include "formats/gguf.h"
#include "formats/weights.h"
#include "kv/kv.h"

typedef struct ember_family ember_family; /* family.h */

typedef struct ember_llm_layer {
    ember_tensor attn_norm;      /* [H] f32 */
    ember_tensor wq;             /* [Hq * D, H] (phi3: views of the fused qkv_proj) */
    ember_tensor wk, wv;         /* [Hkv * D, H] */
    ember_tensor wo;             /* [H, Hq * D] */
    ember_tensor bq, bk, bv, bo; /* f32 biases; buf NULL when absent */
    ember_tensor q_norm, k_norm; /* [D] f32 (qwen3); buf NULL when absent */
    ember_tensor ffn_norm;       /* [H] f32 (gemma: pre_feedforward_layernorm) */
    ember_tensor post_attn_norm, post_ffn_norm; /* [H] f32, gemma's sandwich norms; buf NULL when absent */
    ember_tensor w_gate, w_up;   /* [I, H] (phi3: views of the fused gate_up_proj) */
    ember_tensor w_down;         /* [H, I] */
    ember_tensor b_gate, b_up, b_down;
    /* the MoE block (qwen3_moe layers with cfg.layer_moe; buf NULL / NULL on dense layers):
       E = cfg.n_experts, Im = cfg.moe_intermediate_size */
    ember_tensor router;         /* [E, H]: mlp.gate */
    ember_tensor *experts;       /* [3 E], owned: expert e's gate [Im, H], up [Im, H], down [H, Im] at 3e, 3e+1, 3e+2 */
    float *router_bias;         /* [E] host, owned: glm4_moe's e_score_correction_bias; NULL when absent */
    ember_tensor sh_gate, sh_up; /* [Is, H], Is = n_shared_experts * Im: the shared expert; buf NULL when none */
    ember_tensor sh_down;        /* [H, Is] */
    ember_tensor sh_expert_gate; /* [1, H]: a sigmoid gate on the shared expert (qwen3_next); buf NULL when none */
    ember_tensor wq_gate;        /* [Hq * D, H]: the attention's output gate (hybrid models; the
                                    gate rows of their 2x-wide q_proj); buf NULL when none */
    /* a linear-attention (gated DeltaNet) layer of a hybrid model; buf NULL on
       other layers. C = 2 Hk Dk + Hv Dv, Z = Hv Dv (config.h's lin_*) */
    ember_tensor lin_qkv;        /* [C, H] in_proj_qkv (qwen3_next: regrouped rows of in_proj_qkvz) */
    ember_tensor lin_z;          /* [Z, H] in_proj_z */
    ember_tensor lin_b, lin_a;   /* [Hv, H] in_proj_b, in_proj_a (qwen3_next: of in_proj_ba) */
    ember_tensor lin_conv;       /* [C, K] f32: conv1d.weight */
    ember_tensor lin_a_log, lin_dt_bias; /* [Hv] f32 */
    ember_tensor lin_a_neg;      /* [Hv] f32: -exp(A_log) as GGUF stores it (ssm_a; then lin_a_log is unbound) */
    ember_tensor lin_norm;       /* [Dv] f32: the gated RMSNorm's weight */
    ember_tensor lin_out;        /* [H, Z] out_proj */
    int window;                  /* sliding window, 0 = full attention */
    bool local_rope;             /* RoPE with inv_freq_local (gemma3's sliding layers) */
    /* gemma4 (gemma4.c); buf NULL where absent */
    int head_dim, n_kv_heads;    /* this layer's attention shape */
    int kv_layer;                /* the KV cache layer it attends over (its own, or the shared one's) */
    bool kv_shared;              /* no k/v of its own: attends over kv_layer's K/V, writes nothing */
    bool k_eq_v;                 /* v = k before the norms (attention_k_eq_v, full-attention layers) */
    float layer_scalar;          /* the layer's output (the whole residual stream) is multiplied by it */
    ember_tensor ple_gate;       /* [P, H] per_layer_input_gate */
    ember_tensor ple_proj;       /* [H, P] per_layer_projection */
    ember_tensor ple_norm;       /* [H] post_per_layer_input_norm */
    ember_tensor router_scale;   /* [H] router.scale (router = router.proj [E, H]) */
    float *expert_scale;         /* [E] host, owned: router.per_expert_scale */
    ember_tensor pre_ffn_norm2, post_ffn_norm1, post_ffn_norm2; /* the MoE block beside the dense MLP */
} ember_llm_layer;

typedef struct ember_llm {
    ember_model_config cfg;
    const ember_family *family; /* the architecture's loader and forward pass */
    ember_backend *be;       /* not owned */
    ember_llm_layer *layers; /* [n_layers] */
    ember_tensor embed;      /* [V, H] */
    ember_tensor out_norm;   /* [H] f32 */
    ember_tensor lm_head;    /* [V, H]; the embedding when tied */
    ember_buffer **bufs;     /* every buffer the model made */
    int n_bufs, cap_bufs;
    float *inv_freq;         /* [n_rot / 2] */
    int n_rot;
    float attn_factor;
    float *inv_freq_local;   /* [n_rot_local / 2]: layers with local_rope */
    int n_rot_local;
    float attn_factor_local;
    bool norm_plus_one;      /* gemma RMSNorm x * (1 + w) (false: GGUF, where the 1 is stored) */
    size_t weight_bytes;     /* bytes the forward pass reads per decode token (a MoE's active experts) */
    const char *weight_dtype; /* a dtype name ("f32", "q4_k", ...) or "mixed" */
    ember_rope_mode rope_mode; /* NEOX for HF weights and qwen GGUFs, INTERLEAVED for llama GGUFs */
    ember_gguf *gguf;        /* the GGUF file the weights view, owned (NULL for safetensors) */
    /* gemma4 (gemma4.c): per-layer inputs; buf NULL where absent */
    ember_tensor ple_embed;      /* [Vp, L * P] embed_tokens_per_layer */
    ember_tensor ple_model_proj; /* [L * P, H] per_layer_model_projection */
    ember_tensor ple_proj_norm;  /* [P] per_layer_projection_norm */
    ember_tensor ones;           /* [max head_dim] f32 ones: the norms without a scale */
    /* an EAGLE-3 or DFlash draft model (eagle3.c, dflash.c; buf NULL otherwise): fc [H, n_aux * Ht]
       fuses the target's taps, hidden_norm [H] norms the fused (or fed back) hidden state */
    ember_tensor e3_fc, e3_hidden_norm;
    int32_t *e3_d2t;             /* [draft vocab] host, owned: draft id i is target id i + e3_d2t[i] */
    bool e3_own_embed;           /* embed_tokens came with the drafter (else ember_eagle3_bind lends the target's) */
    ember_tensor mtp_embed_norm; /* an MTP head (mtp.c): pre_fc_norm_embedding [H] (its pre_fc_norm_hidden is
                                    e3_hidden_norm, its fc e3_fc [H, 2H]); buf NULL otherwise */
} ember_llm;

/* The KV cache layers of model m: fills heads[i], dims[i] and win[i] (room
   for cfg.n_layers each) and returns their count. KV-shared layers
   (gemma4) have none of their own: layer l attends over cache layer
   ember_cfg_kv_layer(&m->cfg, l). */
int ember_llm_kv_layout(const ember_llm *m, int *heads, int *dims, int *win);
/* The same from a config alone (before the weights are loaded). */
int ember_cfg_kv_layout(const ember_model_config *c, int *heads, int *dims, int *win);

/* One line describing the layout of model m beyond its config's sizes
   (sliding / global layers, per-layer shapes, KV sharing, per-layer inputs,
   experts) into buf (n bytes); "" when there is nothing to add. */
void ember_llm_describe(const ember_llm *m, char *buf, size_t n);

/* Builds the model from a parsed config and an open weight store, checking
   every tensor's presence, dtype and shape. */
int ember_llm_load(const ember_model_config *cfg, const ember_weights *w, ember_backend *be, ember_llm **out,
                   ember_error *err);
void ember_llm_free(ember_llm *m);

/* Loads a GGUF file (gguf_model.c describes the mapping). On
   success *out owns the opened file (freed by ember_llm_free) and *cfg is
   the model's config. */
int ember_llm_load_gguf(const char *path, ember_backend *be, ember_model_config *cfg, ember_llm **out,
                        ember_error *err);

/* As ember_llm_load_gguf for an already parsed file, whose ownership passes
   to the model (also on failure, when it is freed). */
int ember_llm_from_gguf(ember_gguf *f, ember_backend *be, ember_model_config *cfg, ember_llm **out,
                        ember_error *err);

/* The config and RoPE layout of a GGUF file's metadata (gguf_model.c). */
int ember_gguf_model_config(const ember_gguf *f, ember_model_config *cfg, ember_rope_mode *mode, ember_error *err);
/* The GGUF name (llama.cpp's) of the HuggingFace tensor name hf of a model
   of the given model_type (the names of some tensors depend on the family:
   gemma's post_attention_layernorm is post_attention_norm, llama's is
   ffn_norm); false if none. */
bool ember_gguf_tensor_name(const char *model_type, const char *hf, char *out, size_t n);

/* The GGUF architecture of a model_type ("gemma3_text" -> "gemma3",
   "mistral" -> "llama"; the family table, formats/arch.h); an unknown
   model_type is returned as it is. */
const char *ember_gguf_arch_of(const char *model_type);

/* The recurrent state's shape of a hybrid model's linear-attention layers
   (cfg.layer_linear), for ember_kv_params.rec. */
ember_rec_shape ember_llm_rec_shape(const ember_model_config *c);

typedef struct ember_llm_state {
    int max_tokens, max_logit_rows;
    ember_tensor x, h, q, k, v, att, gate, up; /* [max_tokens, ...] */
    ember_tensor sel, logits;                  /* [max_logit_rows, H], [max_logit_rows, V] */
    /* the MoE block's scratch (buf NULL for a dense model): its input, the
       tokens gathered for one expert and their results [max_tokens, H], the
       expert's gate and up [max_tokens, max(Im, Is)], the router logits [max_tokens, E] */
    ember_tensor moe_in, moe_x, moe_y, moe_gate, moe_up, moe_logits;
    /* hybrid models (buf NULL otherwise): the attention's output gate [max_tokens, Hq * D];
       a DeltaNet layer's projections [max_tokens, C], [.., Z], [.., Hv], [.., Hv] and output [.., Z] */
    ember_tensor qgate, lin_x, lin_z, lin_b, lin_a, lin_o;
    ember_buffer *bufs[24];
    int32_t *tmp_idx; /* [max_tokens] */
    float *tap_host;  /* [max_logit_rows * H] hidden taps on their way to the batch's taps */
    float *moe_host;  /* [max_tokens * E] router logits on the host */
    int32_t *moe_sel; /* [max_tokens * k] each token's chosen experts */
    float *moe_w;     /* [max_tokens * k] their routing weights */
    int32_t *moe_ids; /* [max_tokens] one expert's tokens, in batch order */
    float *moe_ew;    /* [max_tokens] their weights for that expert */
    float *moe_choice; /* [E] one token's selection scores (sigmoid router) */
    int n_rows;
    /* gemma4: the per-layer inputs [max_tokens, L * P], one layer's [max_tokens, P] and its gate
       [max_tokens, P]; the dense MLP's output beside the MoE block [max_tokens, H]; buf NULL when unused */
    ember_tensor ple_all, ple_one, ple_g, mlp_out;
    ember_tensor ple_tok; /* [max_tokens, L * P] the token part of the per-layer inputs */
    ember_buffer *g4_bufs[5];
    int32_t *ple_ids; /* [max_tokens] */
    /* an EAGLE-3 / DFlash draft model (buf NULL otherwise): the taps fed [max_tokens, n_aux * Ht], the
       normed embeddings over the normed hidden [2 max_tokens, H], their concatenation per token
       [max_tokens, 2H] (as [2 max_tokens, H] rows), the hidden states kept between forwards
       [max_tokens, H]; e3_idx [2 max_tokens] host */
    ember_tensor e3_tin, e3_s, e3_c, e3_hid;
    ember_buffer *e3_bufs[4];
    int32_t *e3_idx;
} ember_llm_state;

int ember_llm_state_new(const ember_llm *m, int max_tokens, int n_kv_rows, ember_llm_state **out, ember_error *err);
/* Bytes of the backend buffers a run state of config c takes for max_tokens
   tokens a forward (device: on a non-CPU backend, which computes more logits
   rows at once); the host arrays beside them are not counted. */
size_t ember_llm_state_bytes(const ember_model_config *c, bool device, int max_tokens);
void ember_llm_state_free(ember_llm_state *st);

typedef struct ember_batch {
    int n;              /* tokens */
    const int32_t *tok; /* [n] token ids */
    const int32_t *pos; /* [n] positions */
    const int32_t *row; /* [n] KV cache rows */
    int n_out;          /* tokens whose logits are wanted */
    const int32_t *out; /* [n_out] strictly increasing indices into the batch */
    int32_t *argmax;    /* NULL, or [n_out]: the forward writes each wanted row's greedy token
                           there (the first index of its largest logit, NaNs skipped, as
                           ember_argmax) and may leave logits unwritten (the backend's
                           argmax_rows: no logits row leaves the device) */
    const ember_draw *draw; /* NULL, or [n_out] with argmax set: each wanted row's token is its
                               device draw (core/draw_def.h) instead of the greedy one, through the
                               backend's sample_rows (which it must have); logits may be left
                               unwritten */
    /* Hidden taps (optional; n_tap 0: none, and the forward does nothing more
       than without them). For each of the n_tap tokens tap[i] (strictly
       increasing indices into the batch) the hidden states of the layers
       tap_layers[0, n_tap_layers) go to taps[i * n_tap_layers * H + k * H ..]
       (host, H = hidden_size): tap layer l in 0..n_layers is the residual
       stream entering layer l (0: the embeddings; n_layers: after the last
       layer, before the final norm), EMBER_TAP_NORMED the final norm's
       output (what the logits head reads). Copies only: the tokens' logits
       and every other result are the same with and without taps. */
    int n_tap;
    const int32_t *tap;
    int n_tap_layers;
    const int32_t *tap_layers;
    float *taps;
} ember_batch;

#define EMBER_TAP_NORMED (-1) /* a tap layer: the state after the final norm */

/*
 * Runs one forward pass. The tokens of a row must continue that row:
 * positions len, len + 1, ... in batch order. On success the cache rows
 * grow, logits (host, n_out x vocab) holds the wanted rows and b->taps the
 * hidden taps asked for. On failure (bad ids, positions, sizes, tap layers)
 * nothing in the cache changes.
 */
int ember_llm_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                      ember_error *err);

/*
 * EAGLE-3 draft models (eagle3.c). ember_llm_load builds one from a config
 * with cfg.eagle3; its forward is this function, not ember_llm_forward.
 * ember_eagle3_bind checks it against its target and lends it the target's
 * embedding when it carries none (the target must outlive it): a hidden
 * size, vocabulary or tap layer that does not fit is refused with one line
 * naming the config field. The tap layers (ember_batch.tap_layers of the
 * target's forward) go to taps[0, *n_taps).
 */
int ember_eagle3_bind(ember_llm *draft, const ember_llm *target, int32_t *taps, int *n_taps, ember_error *err);

/*
 * One forward of the draft model over batch b (tokens: target ids; the
 * rows and positions of its own cache, as ember_llm_forward). The hidden
 * input of token i is fc(taps[i]) when taps is non-NULL (host [n, n_taps *
 * Ht]: the target's taps for the position before), else the draft's own
 * hidden state kept in row hid_src[i] of the run state. For each wanted
 * token j (b->out) its output hidden state is kept in row hid_dst[j] and
 * its logits over the draft vocabulary go to logits [n_out, draft vocab]
 * (host). On failure nothing in the cache changes.
 */
int ember_eagle3_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const float *taps,
                         const int32_t *hid_src, const int32_t *hid_dst, float *logits, ember_error *err);

/*
 * DFlash draft models (dflash.c): Qwen3 layers whose attention also reads
 * the target's context, one block of tokens per round. ember_dflash_bind
 * checks one against its target (vocabulary, hidden size, tap layers,
 * num_target_layers; one line naming the field) and lends it the target's
 * embedding and lm_head (the target must outlive it); its tap layers go to
 * taps[0, *n_taps).
 */
int ember_dflash_bind(ember_llm *draft, const ember_llm *target, int32_t *taps, int *n_taps, ember_error *err);

/* The context: for the n target positions pos[i] of rows row[i] (the draft
   cache's positions, continuing each row), ctx = hidden_norm(fc(taps[i]))
   (host [n, n_taps * H]) and every layer's keys and values of ctx into the
   cache. On failure nothing in the cache changes. */
int ember_dflash_context(ember_llm *m, ember_llm_state *st, ember_kv *kv, int n, const int32_t *row, const int32_t *pos,
                         const float *taps, ember_error *err);

/* One round's blocks: batch b (each row's block of tokens at consecutive
   positions continuing its cache; att_pos[i]: the last position of token
   i's block, so a block attends to itself whole and to its context), the
   logits of the wanted tokens over the target's vocabulary into logits.
   The block's keys and values stay in the cache: the caller trims them. */
int ember_dflash_block(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const int32_t *att_pos,
                       float *logits, ember_error *err);

/*
 * The MTP head of a hybrid model (mtp.c). ember_mtp_config makes the head's
 * config from its model's (one full-attention layer, cfg.mtp set; refused
 * with one line when the model has none: not a hybrid, or
 * mtp_num_hidden_layers 0; more than one layer is unsupported);
 * ember_llm_load with it and the model's weight store reads the mtp.*
 * tensors (every one, each checked and named when wrong). ember_mtp_bind
 * lends it the model's embedding and lm_head (the model must outlive it).
 */
int ember_mtp_config(const ember_model_config *target, ember_model_config *out, ember_error *err);
int ember_mtp_bind(ember_llm *head, const ember_llm *target, ember_error *err);

/* One forward of an MTP head, the contract of ember_eagle3_forward: taps
   (host [n, H]) the model's hidden states after its final norm at the
   position before each token, or hid_src the head's own outputs kept in
   the run state; logits over the model's vocabulary. */
int ember_mtp_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const float *taps,
                      const int32_t *hid_src, const int32_t *hid_dst, float *logits, ember_error *err);

#endif
