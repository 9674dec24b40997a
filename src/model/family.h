/*
 * family.h - what the model families share, inside src/model.
 *
 * A family is one file (llama.c, gemma.c) holding two functions: a loader
 * that binds the family's tensors, and a forward pass that reads like the
 * model's own definition. Both are written with the pieces declared here:
 *   - the weight loader (blocks.c): a tensor by its HuggingFace name from
 *     safetensors, MLX-quantized safetensors or GGUF, shape and dtype
 *     checked; fused matrices split into row views (phi3's qkv_proj);
 *   - the blocks of a forward pass (blocks.c): embedding, RMSNorm (plain or
 *     Gemma's x * (1 + w)), attention with its variants (biases, q/k norms,
 *     RoPE per layer, sliding windows, soft-capping, any scale), the gated
 *     MLP (SwiGLU, GeGLU) and the logits head (final soft-capping).
 * model.c holds the life cycle every family shares (config -> family,
 * RoPE tables, run state, batch checks).
 *
 * Blocks run one op sequence fixed by the layer's shape, never by the batch:
 * what model.h promises about batch invariance holds for every family.
 */
#ifndef EMBER_MODEL_FAMILY_H
#define EMBER_MODEL_FAMILY_H

#include "model.h"

/* ---- loading ---------------------------------------------------------------------- */

typedef struct ember_loader {
    ember_llm *m;
    const ember_weights *w; /* safetensors, or */
    const ember_gguf *gg;   /* a GGUF file */
    const char *primary;    /* the file named in messages */
    ember_error *err;
    uint64_t dtype_seen;    /* bit mask of the large weights' dtypes */
    unsigned char *claimed; /* per tensor of the file(s), in order: 1 once the model used it */
    size_t n_tensors;
    const char *layers;     /* the prefix of layer i's names, "<layers>.i.": "model.layers" when NULL
                               (an MTP head's are "mtp.layers"; ember_load_moe and the hybrid layers
                               read it) */
    /* the weight store's own encoding of matrices, tried by ember_load_tensor
       before it reads a matrix as stored (safetensors: mlx-community's
       quantized layout, mlx_load.h); NULL: none (GGUF) */
    int (*matrix_source)(struct ember_loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape,
                         bool *bound);
} ember_loader;

/* "<prefix>.i.suffix" into n (size cap), prefix L->layers or "model.layers"; returns n. */
const char *ember_layer_name(const ember_loader *L, char *n, size_t cap, int i, const char *suffix);

/* Whether the source holds a weight called name (a HuggingFace name). */
bool ember_load_has(const ember_loader *L, const char *name);

/* Marks the file tensor with HuggingFace name `name` as used (no-op when
   absent). ember_load_tensor and ember_load_split mark what they bind. */
void ember_load_claim(ember_loader *L, const char *name);

/* Binds t (ndim, shape) to a backend copy of the host bytes blocks (nbytes
   of dtype dt, the weight `name` in a store's own encoding: a
   matrix_source's), which it frees in every case; counts it as a large
   weight. Errors: a dtype the backend cannot compute with, out of memory. */
int ember_load_blocks(ember_loader *L, ember_tensor *t, const char *name, void *blocks, size_t nbytes, ember_dtype dt,
                      int ndim, const int64_t *shape);

/*
 * Binds t to the weight called name (a HuggingFace name) with the expected
 * shape. as_f32: the tensor is small (norm, bias) and is converted to an f32
 * copy. Missing tensors are errors naming the tensor (from GGUF by its
 * llama.cpp name, then the HuggingFace one) unless optional (then t stays
 * unbound, buf NULL). A matrix (ndim 2, or 3: a stack) not as_f32 is first
 * offered to L->matrix_source, which may bind it from the store's own
 * encoding (MLX's quantized layout); otherwise it is read as stored.
 */
int ember_load_tensor(ember_loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape, bool as_f32,
                      bool optional);

/*
 * Binds parts[i] to consecutive row ranges of the matrix called name: rows[i]
 * rows each, cols columns, in order (a fused projection such as phi3's
 * qkv_proj [Q + K + V, H]). The parts view one buffer; no copy is made.
 */
int ember_load_split(ember_loader *L, const char *name, int n, ember_tensor *const *parts, const int64_t *rows,
                     int64_t cols);

/* Binds layer i's MoE block (cfg.n_experts experts, family.h's MoE block):
   the router model.layers.i.mlp.gate.weight [E, H] and every expert's
   mlp.experts.e.{gate,up,down}_proj.weight ([Im, H], [Im, H], [H, Im]);
   with cfg.n_shared_experts, mlp.shared_experts.{gate,up,down}_proj.weight
   ([Is, H], [Is, H], [H, Is], Is = n_shared * Im); with a sigmoid router,
   mlp.gate.e_score_correction_bias [E] (copied to ly->router_bias).
   ly->experts and ly->router_bias are allocated here (freed by
   ember_llm_free). From GGUF the experts are llama.cpp's stacked
   blk.i.ffn_{gate,up,down}_exps [E, rows, cols], each expert a view of its
   slice; likewise from safetensors in mlx-lm's layout,
   mlp.switch_mlp.{gate,up,down}_proj.weight [E, rows, cols] (float, or
   MLX-quantized with .scales / .biases, repacked once). A missing or
   misshapen tensor is an error naming it. */
int ember_load_moe(ember_loader *L, int i);

/*
 * Binds parts[i] to consecutive row ranges of a copy of the matrix called
 * name ([rows, cols] in all) whose rows are regrouped: new row j is old
 * row perm[j]; parts[i] takes part_rows[i] rows. For fused projections
 * whose pieces interleave per head (qwen3_next's in_proj_qkvz, a gated
 * q_proj). The copy is made once at load; the file's view is released.
 */
int ember_load_regrouped(ember_loader *L, const char *name, int64_t rows, int64_t cols, const int32_t *perm, int n,
                         ember_tensor *const *parts, const int64_t *part_rows);

/* Binds layer i of a llama-family model (llama.c: model.layers.i.*, the
   projections, norms, biases and q/k norms its config has). */
int ember_llama_load_layer(ember_loader *L, int i);

/* Binds the input norm, the gated full attention (q_proj 2x wide: per head q then its
   output gate, regrouped; q/k norms) and the MLP (the MoE block with its sigmoid-gated
   shared expert where cfg.layer_moe[i], else dense) of a hybrid model's layer i, with the
   names under L->layers (qwen3_next.c). The MTP head's layer is one (model/mtp.c). */
int ember_hybrid_load_attn_layer(ember_loader *L, int i);

/* Binds the embedding, the final norm and the output projection (the
   embedding when tied_embeddings), and counts the bytes a decode token reads. */
int ember_load_io(ember_loader *L);

/* ---- families ----------------------------------------------------------------------- */

struct ember_family {
    const char *name;
    /* Binds every tensor of the model (the RoPE tables and m->layers are
       already allocated, the layers' windows set). */
    int (*load)(ember_loader *L);
    /* The forward pass proper, between ember_kv_begin and ember_kv_end; the
       batch is checked. */
    int (*forward)(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                   ember_error *err);
};

extern const ember_family ember_family_llama; /* llama.c: llama, mistral, qwen2, qwen3, phi3 */
extern const ember_family ember_family_gemma; /* gemma.c: gemma2, gemma3_text */
extern const ember_family ember_family_qwen3_moe; /* qwen3_moe.c: qwen3_moe, glm4_moe */
extern const ember_family ember_family_qwen3_next; /* qwen3_next.c: qwen3_next, qwen3_5_text, qwen3_5_moe_text */
extern const ember_family ember_family_gemma4;    /* gemma4.c: gemma4_text */
extern const ember_family ember_family_eagle3;    /* eagle3.c: EAGLE-3 draft models (cfg.eagle3) */
extern const ember_family ember_family_dflash;    /* dflash.c: DFlash draft models (cfg.dflash) */
extern const ember_family ember_family_mtp;       /* mtp.c: a hybrid model's MTP head (cfg.mtp) */

/* ---- blocks of a forward pass -------------------------------------------------------- */

/* One forward pass's working tensors: views of the run state's first T rows. */
typedef struct ember_fwd {
    ember_llm *m;
    ember_llm_state *st;
    ember_kv *kv;
    const ember_batch *b;
    ember_error *err;
    int T;
    ember_tensor x, h;                /* [T, H]: residual stream, block input / output */
    ember_tensor q, k, v, att;        /* [T, Hq * D], [T, Hkv * D], ..., [T, Hq * D] */
    ember_tensor q3, k3, v3, att3;    /* the same as [T, heads, D] */
    ember_tensor qh, kh;              /* the same as [T * heads, D] (per-head norms) */
    ember_tensor gate, up;            /* [T, I] */
} ember_fwd;

/* Sets up f for batch b (checked by the caller). */
void ember_fwd_init(ember_fwd *f, ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b,
                    ember_error *err);

/* x = embed[tok], times scale unless scale is 1 (gemma: sqrt(hidden)). */
int ember_blk_embed(ember_fwd *f, float scale);

/* dst = rmsnorm(x) * w, or * (1 + w) when plus_one; dst may be x. */
int ember_blk_norm(ember_fwd *f, ember_tensor *dst, const ember_tensor *x, const ember_tensor *w, bool plus_one);

/*
 * Self-attention of layer l on the normed input f->h, the result (after the
 * output projection) in f->h: q, k, v projections (+ biases), per-head q/k
 * RMSNorm when the layer has them (Gemma-style when qk_plus_one), RoPE,
 * the KV cache write, attention with a's scale, window and soft-cap.
 */
int ember_blk_attention(ember_fwd *f, int l, const ember_llm_layer *ly, const ember_rope *rope, const ember_attn *a,
                        bool qk_plus_one);

/* Gated MLP on f->h, the result in f->h: down(act(gate(h)) * up(h)). */
int ember_blk_mlp(ember_fwd *f, const ember_llm_layer *ly, ember_act act);

/*
 * The mixture-of-experts block on f->h, the result in f->h (the layer's
 * router and experts, ember_load_moe). Per token, from z = h Wr:
 *   softmax router (qwen3_moe): p = softmax(z), the k = cfg.n_experts_used
 *     largest (ties: the lower index), over their sum when norm_topk_prob;
 *   sigmoid router (glm4_moe): s = sigmoid(z), chosen by s + bias within
 *     the best topk_group of n_group groups, weighted by s (over their sum
 *     + 1e-20 when norm_topk_prob) times routed_scale;
 *     out = sum over chosen e, in increasing e, of p_e * down_e(silu(gate_e(h)) * up_e(h))
 *           [+ the shared expert's down(silu(gate(h)) * up(h))].
 * The batch's tokens are grouped by expert: each chosen expert runs once on
 * the rows routed to it (get_rows, one matmul pair, swiglu, one matmul),
 * so its weights are read once per forward, and add_rows_scaled adds the
 * weighted rows into place. A token's terms arrive in expert order whatever
 * else the batch holds, and every op is row-independent: batch invariant.
 * The router logits go through the host (T x E floats) for the top-k.
 */
int ember_blk_moe(ember_fwd *f, const ember_llm_layer *ly);

/* One token's routing as ember_blk_moe does it (exposed for tests): z [E]
   its router logits, bias [E] (the sigmoid router's selection bias) or
   NULL, choice [E] scratch; the cfg.n_experts_used chosen experts into sel
   and their weights into w (in rank order). No side effects beyond those. */
void ember_moe_route(const ember_model_config *c, const float *z, const float *bias, float *choice, int32_t *sel,
                     float *w);

/* The hidden taps of layer l the batch asks for (model.h's ember_batch):
   the rows b->tap of f->x (the residual stream entering layer l; l =
   n_layers after the last) into b->taps, where tap_layers holds l. A no-op
   when the batch asks none. Call at the top of each layer; ember_blk_logits
   takes the n_layers and EMBER_TAP_NORMED taps. */
int ember_blk_tap(ember_fwd *f, int l);

/* f->x += f->h. */
int ember_blk_residual(ember_fwd *f);

/* A 2-D f32 view of rows [r0, r0 + rows) of t, each `cols` floats: t's
   buffer, no copy (the drafters' scratch tensors reshaped per call). */
static inline ember_tensor ember_f32_rows(const ember_tensor *t, int64_t r0, int64_t rows, int64_t cols) {
    ember_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.shape[2] = v.shape[3] = 0;
    v.offset += (size_t)(r0 * cols) * 4;
    v.nbytes = (size_t)(rows * cols) * 4;
    return v;
}

/* The hidden-tap drafters' shared steps (eagle3.c; MTP heads use them too):
   argument checks of a draft forward, and its outputs (hidden rows into
   st->e3_hid, logits over V ids into host memory, normed first when norm). */
int ember_draft_check(const ember_llm *m, const ember_llm_state *st, const ember_batch *b, const float *taps,
                      const int32_t *hid_src, const int32_t *hid_dst, const char *what, ember_error *err);
int ember_draft_outputs(ember_fwd *f, const int32_t *hid_dst, float *logits, int V, bool norm);

/* f->x += f->h, then f->h = rms_norm(f->x) with weight w (plus_one as
   ember_blk_norm): the backend's fused add_rms_norm where it has one (the
   same bits), else the two ops. */
int ember_blk_residual_norm(ember_fwd *f, const ember_tensor *w, bool plus_one);

/*
 * Logits of the batch's wanted rows into host memory: final norm (plus_one
 * as ember_blk_norm), lm_head, then softcap * tanh(logit / softcap) when
 * softcap > 0.
 */
int ember_blk_logits(ember_fwd *f, const ember_tensor *norm, bool plus_one, float softcap, float *logits);

/* ---- Gemma 4's blocks (gemma4.c) ------------------------------------------------------- */

/* Binds layer i's fused experts: model.layers.i.experts.gate_up_proj
   [E, 2 Im, H] (gate rows, then up, per expert) and experts.down_proj
   [E, H, Im] (no .weight suffix), or mlx-lm's split and stacked
   experts.switch_glu.{gate,up,down}_proj.weight (float or MLX-quantized),
   as per-expert row views in ly->experts (allocated here, freed by
   ember_llm_free). From GGUF: llama.cpp's blk.i.ffn_gate_up_exps and
   ffn_down_exps (the same layouts), or its ffn_{gate,up,down}_exps apart. */
int ember_load_fused_experts(ember_loader *L, int i);

/* Binds t to a new f32 vector of n ones (the weight of a norm without a
   scale), kept with the model's buffers. */
int ember_load_ones(ember_loader *L, ember_tensor *t, int n);

/* Re-points f's q, k, v, att (and their 3-D / per-head views) and gate, up
   at a layer of head size D, Hkv KV heads and MLP width I (gemma4's layers
   differ; the run state is sized for the widest). */
void ember_fwd_layer_shape(ember_fwd *f, int D, int Hkv, int I);

/*
 * Gemma 4's self-attention on f->h, the result in f->h (f's shape set for
 * the layer): q = norm(h Wq, q_norm); unless ly->kv_shared:
 * k = h Wk, v = h Wv (v = k when ly->k_eq_v), k = norm(k, k_norm), v =
 * norm(v) without a scale, rope(k) and the KV write to cache layer
 * ly->kv_layer; rope(q); attention over cache layer ly->kv_layer with a;
 * then Wo. Norms are plain RMSNorm (x * w).
 */
int ember_blk_attention_g4(ember_fwd *f, const ember_llm_layer *ly, const ember_rope *rope, const ember_attn *a);

/* The per-layer inputs of the batch into st->ple_all [T, L * P], from the
   token ids and the scaled embeddings in f->x (call right after the
   embedding): (norm(x Wpm * H^-0.5, per layer) + embed_per_layer[tok] *
   sqrt(P)) * 2^-0.5. */
int ember_blk_ple_inputs(ember_fwd *f);

/* Layer l's per-layer input added to the residual stream:
   x += norm((gelu_tanh(x Wgate) * ple_l) Wproj, post_per_layer_input_norm). */
int ember_blk_ple(ember_fwd *f, int l, const ember_llm_layer *ly);

/*
 * Gemma 4's MoE block beside the dense MLP, whose output is in f->h: routes
 * each token on the residual stream f->x (z = (norm(x) * router.scale *
 * H^-0.5) Wr; softmax, the top k renormalised, times per_expert_scale),
 * runs the chosen experts (GeGLU, grouped by expert as ember_blk_moe) on
 * norm(x, pre_feedforward_layernorm_2), and leaves in f->h
 * norm(mlp, post_feedforward_layernorm_1) + norm(experts, post_feedforward_layernorm_2).
 */
int ember_blk_moe_g4(ember_fwd *f, const ember_llm_layer *ly);

/* f->x *= s (a no-op when s is 1). */
int ember_blk_scale_x(ember_fwd *f, float s);

#endif
