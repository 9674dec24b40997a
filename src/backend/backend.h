/*
 * backend.h - the interface every compute backend (CPU, CUDA) implements.
 *
 * A backend owns device memory (buffers) and runs ops on tensors that view
 * its buffers. Code above the backend (kv, model, engine) builds tensors,
 * calls ops through this table and copies data in and out with read/write;
 * it never dereferences a buffer's memory. Kernels know tensors, not
 * requests: the only per-token information an op receives is plain arrays
 * of positions and cache slots.
 *
 * Threading: a backend is driven by one thread at a time (the engine
 * thread); the backend may fan an op out to its own workers.
 *
 * Determinism: every op reduces in an order fixed by the shapes of the
 * tensors it reads per output element, never by how many rows are in the
 * batch or how many threads run. This is what makes batch invariance hold.
 */
#ifndef EMBER_BACKEND_H
#define EMBER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/draw_def.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"

typedef struct ember_backend ember_backend;

struct ember_buffer {
    ember_backend *be;
    void *data;  /* backend memory: only the backend dereferences it */
    size_t size;
    bool owned;  /* false: wraps memory the backend does not free */
    size_t map_len; /* backend-private: length of an owned mapping, 0 if none */
    ember_prepared *preps; /* backend-private: the weights prepared in it (prepare_weight), freed with it */
};

/* One matrix product of a multi-matmul: out[m, n] = sum_k x[m, k] w[n, k] + bias[n]. */
typedef struct ember_matmul {
    ember_tensor *out;        /* [M, N] f32 */
    const ember_tensor *w;    /* [N, K] f32 / f16 / bf16 */
    const ember_tensor *bias; /* [N] f32, or NULL */
} ember_matmul;

typedef enum ember_rope_mode {
    EMBER_ROPE_NEOX = 0,       /* pairs (i, i + n_rot/2): HF rotate_half */
    EMBER_ROPE_INTERLEAVED = 1 /* pairs (2i, 2i + 1): GGUF / llama2.c */
} ember_rope_mode;

typedef struct ember_rope {
    const float *inv_freq; /* [n_rot / 2] host array, owned by the caller */
    int n_rot;             /* rotated dims per head (even, <= head_dim) */
    ember_rope_mode mode;
    float attn_factor;     /* multiplies cos and sin (YaRN); 1 otherwise */
} ember_rope;

typedef struct ember_attn {
    float scale;   /* multiplies q.k */
    int window;    /* > 0: key j is seen by query i iff i - window < j <= i */
    float softcap; /* > 0: scores = softcap * tanh(scores / softcap) */
} ember_attn;

/* ---- paged KV storage ------------------------------------------------------
 *
 * A KV pool is one u8 buffer of equal blocks; a block holds EMBER_KV_BLOCK
 * consecutive positions of one row for every layer that uses the pool. A
 * row finds its positions through a block table: position j lives in block
 * blocks[j / EMBER_KV_BLOCK - first], slot j % EMBER_KV_BLOCK. The kv part
 * (src/kv) owns pools and tables; the backend only encodes, decodes and
 * attends through them.
 *
 * Inside a block, each layer owns a K region then a V region, one
 * head_bytes piece per KV head. The codec of a piece (the bytes of 16
 * positions of one head, D = head_dim, G = group, b = bits):
 *   F32/F16/BF16  K: transposed, [D][16] values; V: [16][D] values
 *   Q8  (affine)  K: codes [D][16] u8; V: codes [16][D] u8; then scales
 *                 [D/G][16] f16 and biases [D/G][16] f16 (K and V alike):
 *                 x = scale * code + bias, code in 0..255.
 *                 K only: then mu [D] f16 and sigma [D] f16, a running mean
 *                 and spread of each dimension over the row's earlier
 *                 blocks (kv_codec.c), set when slot 0 is written (sigma 0:
 *                 none, read as 1); the codes hold (k - mu) / sigma: k =
 *                 sigma (scale code + bias) + mu. Outlier channels then cost
 *                 no precision elsewhere.
 *   Q4  (affine)  as Q8 with 4-bit codes: K byte [d/2][i] holds dims d
 *                 (low nibble) and d + 1 (high) of position i; V byte
 *                 [i][d/2] holds dims d (low) and d + 1 (high)
 *   TQ  (rotation)the vector is rotated, y = H S x / sqrt(n) per power-of-two
 *                 segment of D (H Walsh-Hadamard, S the signs), then each y_d
 *                 is code c_d of a b-bit codebook: y ~ scale * codebook[c].
 *                 K: codes [D][16] packed in 2b bytes per d (LSB first),
 *                 scales [16] f16, then mu and sigma as for Q8 (the rotated
 *                 vector is that of (k - mu) / sigma); V: codes [16] rows of
 *                 ceil(D b / 8) bytes, scales [16] f16.
 * K is transposed so that one vector load holds a dimension of 16 keys.
 */
#define EMBER_KV_BLOCK 16

typedef enum ember_kv_enc {
    EMBER_KVE_F32 = 0,
    EMBER_KVE_F16,
    EMBER_KVE_BF16,
    EMBER_KVE_Q8,
    EMBER_KVE_Q4,
    EMBER_KVE_TQ
} ember_kv_enc;

/* How one of K or V is stored. */
typedef struct ember_kv_codec {
    ember_kv_enc enc;
    int group;              /* Q8 / Q4: values per scale and bias (divides head_dim) */
    int bits;               /* TQ: 2..8 */
    const float *codebook;  /* TQ: [1 << bits] increasing centroids (static) */
    const float *bounds;    /* TQ: [(1 << bits) - 1] decision thresholds (static) */
    const float *signs;     /* TQ: [head_dim] +-1, owned by the cache */
    size_t head_bytes;      /* bytes of one head's EMBER_KV_BLOCK positions */
} ember_kv_codec;

/* One layer's view of one pool. */
typedef struct ember_kv_layer {
    ember_tensor *pool;    /* u8 [n_blocks * block_bytes] */
    size_t block_bytes;    /* bytes of one block (every layer of the pool) */
    size_t k_off, v_off;   /* this layer's K and V regions inside a block */
    int n_heads, head_dim;
    ember_kv_codec k, v;
} ember_kv_layer;

/* How a row of a batch reaches its positions. */
typedef struct ember_kv_rowref {
    const int32_t *blocks; /* block of logical block first + i, for i < n_blocks */
    int32_t first, n_blocks;
    int32_t layer_set;     /* which of the op's layer views (pools) the row uses */
} ember_kv_rowref;

/* The arguments every paged op shares: views[layer_set] for each pool,
   refs[r] for cache row r, and per token t its row row[t] and position
   pos[t]. */
typedef struct ember_kv_map {
    const ember_kv_layer *views;
    int n_views;
    const ember_kv_rowref *refs;
    int n_refs;
    const int32_t *row, *pos; /* [T] */
} ember_kv_map;

/* ---- recurrent state (hybrid models' linear-attention layers) -------------
 *
 * A gated DeltaNet layer keeps, per row, a fixed-size state instead of keys
 * and values: the causal convolution's last K - 1 inputs and one matrix per
 * value head. The kv part (src/kv) holds it in slots of one f32 pool; a
 * slot holds every recurrent layer of one row, layer after layer:
 *   conv   [K - 1][C]       the inputs of the K - 1 latest positions, oldest
 *                           first (C = 2 Hk Dk + Hv Dv channels: q, k, v)
 *   state  [Hv][Dk][Dv]     S of each value head
 * A forward never writes the slot it reads: it reads the row's state from
 * slot src (-1: all zeros, an empty row) and writes the state after its
 * last token to slot dst, so a failed forward or a shared slot needs no
 * copy. A row in a speculative round also logs, per position p of the
 * round, what a replay needs (log entry p - log_base, per layer):
 *   x [C]   the convolution's input
 *   k [Hk Dk] (l2-normalised), v [Hv Dv], g [Hv] (log decay), beta [Hv]
 * so that the state after any k <= d of its d positions can be rebuilt
 * from the round's starting slot (delta_replay) without the weights.
 */
typedef struct ember_rec_shape {
    int conv_dim;  /* C = 2 Hk Dk + Hv Dv */
    int conv_k;    /* K, the kernel width (>= 1) */
    int n_k_heads, n_v_heads; /* Hk, Hv (a multiple of Hk) */
    int k_dim, v_dim;         /* Dk, Dv */
    int v_tiled;              /* 0: value head h reads key head h / (Hv / Hk) (HF's grouped order); 1: key head
                                 h % Hk (the tiled order llama.cpp's converter writes for qwen35 / qwen35moe) */
} ember_rec_shape;

/* Floats of one layer's part of a slot, and of one log entry of a layer. */
size_t ember_rec_layer_floats(const ember_rec_shape *s);
size_t ember_rec_log_floats(const ember_rec_shape *s);

/* One recurrent layer's view of the state pool and the logs. */
typedef struct ember_rec_layer {
    ember_tensor *pool;   /* u8 [n_slots * slot_floats * 4]: f32 slots */
    size_t slot_floats;   /* floats of a slot (every recurrent layer) */
    size_t off;           /* this layer's part inside a slot, in floats */
    size_t log_off;       /* this layer's part of a log position, in floats */
    size_t log_stride;    /* floats of one log position (every recurrent layer) */
    ember_rec_shape s;
} ember_rec_layer;

/* How a row of a batch reaches its state. */
typedef struct ember_rec_rowref {
    int32_t src, dst;  /* slots (src -1: zeros) */
    ember_tensor *log; /* f32 [cap * log_stride] of a row in a speculative round, else NULL */
    int32_t log_base;  /* the round's first position */
    int32_t log_cap;   /* positions the log holds */
} ember_rec_rowref;

typedef struct ember_rec_map {
    const ember_rec_layer *layer;
    const ember_rec_rowref *refs; /* [n_refs], by cache row */
    int n_refs;
    const int32_t *row, *pos;     /* [T] */
} ember_rec_map;

/* delta_net's chunked form runs on aligned spans of this many positions. */
#define EMBER_DELTA_SPAN 64

/* The checks both backends make of a recurrent layer's view (shape and
   layout consistent, the pool there) and of a slot index (inside the pool). */
bool ember_rec_layer_ok(const ember_rec_layer *L);
bool ember_rec_slot_ok(const ember_rec_layer *L, int32_t slot);

/* The per-layer weights of delta_net (f32 tensors). */
typedef struct ember_delta_w {
    const ember_tensor *conv;    /* [C, K] the depthwise kernel */
    const ember_tensor *a_log;   /* [Hv] */
    const ember_tensor *dt_bias; /* [Hv] */
    const ember_tensor *a_neg;   /* [Hv] or NULL: -exp(A_log) as GGUF stores it (ssm_a); used instead of a_log */
} ember_delta_w;

/* The checks every backend makes of these ops' arguments before its own
   (dtype, device, alignment): shapes against the state's, each token's row,
   slots and log position (delta_net); the replay's layers laid out as
   kv_rec.c makes them (delta_replay); the MoE combine's rows
   (add_rows_scaled). EMBER_OK, or EMBER_ERR_INVALID_ARG with the reason. */
int ember_delta_net_check(const ember_tensor *out, const ember_tensor *x, const ember_tensor *b, const ember_tensor *a,
                          const ember_delta_w *w, const ember_rec_map *map, ember_error *err);
int ember_delta_replay_check(const ember_rec_layer *layers, int n_layers, int32_t src, int32_t dst,
                             const ember_tensor *log, int n, ember_error *err);
int ember_rows_scaled_check(const ember_tensor *dst, const ember_tensor *src, const int32_t *ids, int n,
                            ember_error *err);

/* What fixes a forward pass's launches for step graphs (step_begin):
   tokens, logit rows, and whether ids are asked instead of logits (1:
   greedy ids, 2: device draws). */
typedef struct ember_step_key {
    int n_tokens, n_out, argmax;
} ember_step_key;

typedef struct ember_backend_ops {
    const char *name;
    void (*free)(ember_backend *be);

    /* Buffers. alloc: zeroed memory. from_host: a buffer holding the bytes of
       host memory that outlives the buffer (a backend may wrap it without a
       copy). Buffers are freed with buffer_free. */
    int (*buffer_alloc)(ember_backend *be, size_t size, ember_buffer **out, ember_error *err);
    int (*buffer_from_host)(ember_backend *be, const void *host, size_t size, ember_buffer **out,
                            ember_error *err);
    void (*buffer_free)(ember_buffer *buf);

    /* Copies between host memory and a tensor's bytes [off, off + n). */
    int (*write)(ember_backend *be, ember_tensor *dst, size_t off, const void *src, size_t n,
                 ember_error *err);
    int (*read)(ember_backend *be, const ember_tensor *src, size_t off, void *dst, size_t n,
                ember_error *err);

    /* ---- ops; every output is f32 ---- */

    /* dst[i, :] = src[ids[i], :] converted to f32. dst [n, D], src [R, D]. */
    int (*get_rows)(ember_backend *be, ember_tensor *dst, const ember_tensor *src,
                    const int32_t *ids, int n, ember_error *err);
    /* dst = x * rsqrt(mean(x^2) + eps) * (w or 1 + w) per row; dst may be x. */
    int (*rms_norm)(ember_backend *be, ember_tensor *dst, const ember_tensor *x,
                    const ember_tensor *w, float eps, bool plus_one, ember_error *err);
    /* n products sharing one input x [M, K]. */
    int (*matmul)(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm,
                  ember_error *err);
    /* n products each with its own input row: x [n, K], mm[i].out [1, N_i] =
       x[i] w_i^T (+ bias), bit for bit what matmul gives on row i alone, in
       one dispatch (a MoE token's expert down projections). Optional: NULL
       where the backend has none (callers then loop over matmul). */
    int (*matmul_each)(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm,
                       ember_error *err);
    /* In place on x [T, H, head_dim]; pos[T] host array. */
    int (*rope)(ember_backend *be, ember_tensor *x, const int32_t *pos, const ember_rope *r,
                ember_error *err);
    /* Encodes k[t] and v[t] (f32 [T, H, D]) into position pos[t] of row
       row[t] (map); the blocks must exist. */
    int (*kv_write)(ember_backend *be, const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v,
                    ember_error *err);
    /* The reverse: decodes position pos[t] of row[t] into k[t], v[t] (f32). */
    int (*kv_read)(ember_backend *be, const ember_kv_map *map, ember_tensor *k, ember_tensor *v,
                   ember_error *err);
    /* out[t, h, :] = softmax(q[t,h,:] . K_j * scale) V_j over the keys j of
       row[t] with j <= pos[t] (and pos[t] - j < window), K/V head h / (Hq /
       Hkv). q, out [T, Hq, D] f32. Each token's result depends only on its
       own query and keys: keys are reduced in spans of fixed absolute
       position, so neither the batch nor the thread count changes a bit. */
    int (*attention)(ember_backend *be, ember_tensor *out, const ember_tensor *q, const ember_kv_map *map,
                     const ember_attn *a, ember_error *err);
    /* dst bytes [doff, doff + n) = src bytes [soff, soff + n); tensors of the
       same backend, ranges must not overlap. */
    int (*copy)(ember_backend *be, ember_tensor *dst, size_t doff, const ember_tensor *src, size_t soff, size_t n,
                ember_error *err);
    /* dst = silu(gate) * up, elementwise. */
    int (*swiglu)(ember_backend *be, ember_tensor *dst, const ember_tensor *gate,
                  const ember_tensor *up, ember_error *err);
    /* dst = gelu_tanh(gate) * up, elementwise (GeGLU), with gelu_tanh(g) =
       0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). */
    int (*geglu)(ember_backend *be, ember_tensor *dst, const ember_tensor *gate,
                 const ember_tensor *up, ember_error *err);
    /* dst = a * s, elementwise; dst may be a. */
    int (*scale)(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float s, ember_error *err);
    /* dst = cap * tanh(a / cap), elementwise (Gemma's final logit soft-capping;
       cap > 0); dst may be a. */
    int (*softcap)(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float cap, ember_error *err);
    /* dst = a + b, elementwise; dst may alias a or b. */
    int (*add)(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
               ember_error *err);
    /* The mixture-of-experts combine: for i = 0 .. n - 1 in this order,
       dst[ids[i], :] += w[i] * src[i, :]. dst [R, D], src [>= n, D], both f32;
       ids [n] (each in [0, R)) and w [n] are host arrays. A row of dst receives
       its terms in i order, so its result depends only on the terms it
       receives, never on the other rows. */
    int (*add_rows_scaled)(ember_backend *be, ember_tensor *dst, const ember_tensor *src, const int32_t *ids,
                           const float *w, int n, ember_error *err);
    /* One token's routed experts (MoE decode), n in 1 .. 8: for j < n,
       g[j] = x gate_j^T, u[j] = x up_j^T, g[j] = act(g[j]) * u[j] (act: silu,
       or gelu_tanh when geglu), y[j] = g[j] down_j^T; then dst[0, :] +=
       w[j] * y[j] for j = 0, 1, ... in that order. x, dst [1, H] f32 (not
       aliased); ex: 3n weights, gate_j, up_j [I, H] and down_j [H, I] at
       ex[3j .. 3j + 2]; g, u [>= n, I] and y [>= n, H] f32 scratch the call
       overwrites; w [n] a host array. Bit for bit what matmul (gate and up),
       swiglu / geglu, matmul_each (down) and add_rows_scaled give, in fewer
       dispatches. Optional: NULL where the backend has none. */
    int (*moe_token)(ember_backend *be, ember_tensor *dst, const ember_tensor *x, int n, const ember_tensor *ex,
                     const float *w, bool geglu, ember_tensor *g, ember_tensor *u, ember_tensor *y,
                     ember_error *err);

    /*
     * The gated DeltaNet core of a linear-attention layer (hybrid models).
     * x [T, C] the input projection's q, k, v part before the convolution;
     * b [T, Hv] the beta logits, a [T, Hv] the decay inputs; out [T, Hv Dv]. Per token t of row r = row[t], in batch order:
     *   y = silu(causal depthwise conv over the row's inputs, width K)
     *   q, k = l2norm(y's q, k heads) (eps 1e-6), q *= Dk^-1/2; v = y's v
     *   g = -exp(a_log) softplus(a + dt_bias) (w->a_neg, when set, is the
     *   -exp(a_log) of each head, and a_log is not read); beta = sigmoid(b)
     *   per value head h (key head h / (Hv / Hk), or h % Hk when the
     *   state's shape is v_tiled):
     *     S = exp(g) S; S += k (beta (v - S^T k))^T; out = S^T q
     * The state comes from the map's src slot and goes to its dst slot. A
     * row's tokens of one forward that fill whole aligned spans of 64
     * positions run the chunked (parallel) form of the same rule, the rest
     * the recurrent form above; a row in a speculative round (log set)
     * always runs the recurrent form and logs (backend.h above). A row's
     * result depends only on its own tokens: batch invariant.
     */
    int (*delta_net)(ember_backend *be, ember_tensor *out, const ember_tensor *x, const ember_tensor *b,
                     const ember_tensor *a, const ember_delta_w *w, const ember_rec_map *map, ember_error *err);
    /* Rebuilds the state after the first n logged positions of a round:
       slot dst = slot src advanced by log entries [0, n) of log, for every
       layer of layers[n_layers], with the recurrent form's arithmetic (so
       bit-identical to the forward that logged them). */
    int (*delta_replay)(ember_backend *be, const ember_rec_layer *layers, int n_layers, int32_t src, int32_t dst,
                        const ember_tensor *log, int n, ember_error *err);
    /* dst = x * sigmoid(gate), elementwise (an attention output gate); dst
       may be x. */
    int (*sigmoid_mul)(ember_backend *be, ember_tensor *dst, const ember_tensor *x, const ember_tensor *gate,
                       ember_error *err);

    /* ---- optional fused ops (NULL: the caller runs the ops they stand for;
       a backend that has one gives the bits of that sequence) ---- */
    /* x = x + h, then dst = rms_norm(x, w, eps, plus_one): add, then
       rms_norm. x [T, D] is updated in place; dst [T, D] may be h, not x. */
    int (*add_rms_norm)(ember_backend *be, ember_tensor *dst, ember_tensor *x, const ember_tensor *h,
                        const ember_tensor *w, float eps, bool plus_one, ember_error *err);
    /* rope(q), rope(k), then kv_write(map, k, v): q [T, Hq, D] and k
       [T, Hkv, D] rotated in place, then k and v stored (map as kv_write). */
    int (*rope_kv_write)(ember_backend *be, ember_tensor *q, ember_tensor *k, const ember_tensor *v,
                         const int32_t *pos, const ember_rope *r, const ember_kv_map *map, ember_error *err);

    /* out[r] (host, [n]) = the first index of the largest value of row r of
       x [>= n, V] (f32), NaNs skipped, 0 when every value is NaN: greedy
       sampling without copying the rows to the host. */
    int (*argmax_rows)(ember_backend *be, const ember_tensor *x, int32_t *out, int n, ember_error *err);
    /* out[r] (host, [n]) = the device draw (ember_draw, core/draw_def.h) of row r of x
       [>= n, V] (f32) with p[r]: sampling without copying the rows to the
       host. x's rows may be overwritten (they hold the weights after). */
    int (*sample_rows)(ember_backend *be, ember_tensor *x, const ember_draw *p, int32_t *out, int n,
                       ember_error *err);

    /* ---- optional step graphs (NULL: none; docs/cuda.md) ----
       step_begin opens a step (a forward pass) whose ops the backend may
       record once and replay later as one launch, keyed by key (what fixes
       the step's launches besides the backend's own checks): *graphed says
       whether it does. Until step_end returns, the host results of read,
       argmax_rows and sample_rows may not be written yet (they are
       delivered by step_end) and write, buffer_alloc and buffer_free must
       not be called. step_end closes it: failed (the forward returned an
       error) drops what was recorded; otherwise it runs the step, waits for
       it and delivers the host results, or sets *again when nothing ran (a
       replay whose ops did not match the recording, or a recording that
       could not be finished): the caller then runs the same ops again
       inside another step_begin / step_end (the backend runs them plainly
       at the latest on the third pass). Either gives the bits of plain
       launches. */
    int (*step_begin)(ember_backend *be, const ember_step_key *key, bool *graphed, ember_error *err);
    int (*step_end)(ember_backend *be, bool failed, bool *again, ember_error *err);

    /* Prepares the weight t for matmul and get_rows, once, after it is
       loaded and before it is used (the model loader calls it for each
       matrix). The backend may rewrite the bytes into a layout of its own
       and sets t->prep, a handle the kernels then read directly: the CPU
       backend permutes a quantized matrix in place into 16-row packed
       groups where its ISA has a packed kernel for the dtype and it owns
       the memory (docs/backend.md). Copies of t made afterwards share the
       handle; a tensor viewing the same bytes (a tied embedding) is
       prepared by calling this again with it, which shares the existing
       handle. Preparing is invisible to every other op: read gives the
       original bytes, write and any view of the bytes without the handle
       first restore them (the weight then runs row-major, with the same
       results, until prepared again). A weight the backend has nothing to
       do for is left as it is: EMBER_OK. Errors (out of memory,
       EMBER_ERR_NOMEM) leave t and its bytes as they were. Optional (NULL:
       nothing to prepare). */
    int (*prepare_weight)(ember_backend *be, ember_tensor *t, ember_error *err);

    /* What the backend supports, asked before loading (NULL: everything).
       weight_ok: matmul and get_rows take weights of this dtype; kv_ok: the
       paged KV ops take this codec. */
    bool (*weight_ok)(ember_dtype d);
    bool (*kv_ok)(ember_kv_enc e);

    /* Host work between forwards on the backend's host threads: runs
       fn(ctx, t, thread) for every t in [0, n) and returns when all have
       run (thread: which host thread, in [0, the backend's thread count)).
       The engine samples a step's rows this way. fn must not call the
       backend; the caller may not call it from inside another op. The CPU
       backend runs them on its pool. Optional (NULL: the caller runs the
       tasks itself, in order, as thread 0). */
    void (*host_run)(ember_backend *be, int n, void (*fn)(void *ctx, int task, int thread), void *ctx);
} ember_backend_ops;

struct ember_backend {
    const ember_backend_ops *ops;
    void *impl;
    ember_logger log;
};

/* ---- helpers built on the ops table ---------------------------------- */

/* Allocates a zeroed buffer for a new contiguous tensor of the given shape.
   The caller owns *buf (free with ember_buffer_free). */
int ember_tensor_alloc(ember_backend *be, ember_tensor *t, ember_buffer **buf, ember_dtype dtype,
                       int ndim, const int64_t *shape, ember_error *err);

/* Sets t to view [offset, offset + bytes of shape) of buf; checks bounds. */
int ember_tensor_view(ember_tensor *t, ember_buffer *buf, size_t offset, ember_dtype dtype, int ndim,
                      const int64_t *shape, ember_error *err);

static inline void ember_buffer_free(ember_buffer *b) {
    if (b) b->be->ops->buffer_free(b);
}
static inline void ember_backend_free(ember_backend *be) {
    if (be) be->ops->free(be);
}

/* The CPU backend. n_threads <= 0: all cores. isa AUTO: best available; an
   ISA the CPU lacks is an error. */
typedef struct ember_cpu_params {
    int n_threads;
    ember_isa isa;
    bool zero_copy; /* weights stay in the caller's (mapped) memory */
    ember_logger log;
} ember_cpu_params;

int ember_backend_cpu_new(const ember_cpu_params *p, ember_backend **out, ember_error *err);
/* The ISA and thread count a CPU backend runs with (AUTO and 0 for another
   backend). */
ember_isa ember_backend_cpu_isa(const ember_backend *be);
int ember_backend_cpu_threads(const ember_backend *be);
/* Products a CPU backend ran on a weight it could have packed but that was
   not prepared (prepare_weight): row-major, the same bits, slower. The
   loader prepares every matrix, so 0 after any forward pass of a loaded
   model; tests read it. */
long ember_backend_cpu_unprepared(const ember_backend *be);

/* The CUDA backend (src/backend/cuda, docs/cuda.md). Built with
   -DEMBER_CUDA=ON; without it every function below fails with
   EMBER_ERR_UNSUPPORTED "ember was built without CUDA (-DEMBER_CUDA=ON)". */
typedef struct ember_cuda_params {
    int device; /* CUDA device index: cuda:N */
    ember_logger log;
} ember_cuda_params;

/* A backend on device p->device (0 when p is NULL). No device, no driver, a
   driver older than the runtime, or a GPU older than compute capability 9.0:
   a one-line EMBER_ERR_UNSUPPORTED; a device index out of range:
   EMBER_ERR_INVALID_ARG. */
int ember_backend_cuda_new(const ember_cuda_params *p, ember_backend **out, ember_error *err);
/* *count = the CUDA devices present (0 where there is no driver or device);
   an error only for a broken installation (driver too old, ...). */
int ember_cuda_device_count(int *count, ember_error *err);
/* *free_b and *total_b: the device memory of a CUDA backend's GPU. */
int ember_cuda_mem_info(const ember_backend *be, size_t *free_b, size_t *total_b, ember_error *err);
/* "cuda:N (NAME)" of a CUDA backend into buf (n bytes); "cpu" otherwise. */
void ember_backend_describe(const ember_backend *be, char *buf, size_t n);
/* The cudaStream_t a CUDA backend runs every op on (for graph capture and
   event timing by the caller); NULL for any other backend. */
void *ember_backend_cuda_stream(const ember_backend *be);
/* Counts of a CUDA backend's step graphs (step_begin): steps captured,
   steps replayed, passes that had to run again (a replay that did not
   match, a capture that could not finish); all 0 for another backend. */
void ember_cuda_graph_stats(const ember_backend *be, long *captured, long *replayed, long *again);
/* How many times a CUDA backend's quantized matmul found its input already
   quantized (by the op that produced it, or an earlier matmul of it) and
   launched no quantizer; 0 for another backend. */
long ember_cuda_qfuse_count(const ember_backend *be);

#endif
