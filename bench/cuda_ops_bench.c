/*
 * cuda_ops_bench.c - the CUDA backend's matrix-vector rate against the
 * GPU's own copy bandwidth (scripts/gpu-test.sh runs it; docs/cuda.md).
 *
 *   1. device-to-device copy bandwidth: a 2 GiB cudaMemcpy, counting bytes
 *      read plus bytes written (the ceiling a decode step can approach);
 *      then one Llama-3.1-8B layer's attention of a decode step (1 to 256
 *      rows, each over its own bf16 context) through each kernel of the tc
 *      split mode (lean, the split kernel of before, pipelined), with bits;
 *   2. the backend's matmul on Llama-3.1-8B-shaped bf16 weights (4096 x
 *      4096, 14336 x 4096, 4096 x 14336, the 128256 x 4096 output head)
 *      for M = 1, 2, 4, 8 rows, as bytes moved per second and as a share
 *      of (1); one whole layer's products (q, k, v sharing the input; o;
 *      gate and up sharing the input; down) at M = 1; the bf16 rate at
 *      M = 64, 256, 2048 in TFLOP/s; the quantized products (Q4_0, Q4_K,
 *      Q6_K, Q8_0, Q5_0) of one 8B layer at M = 1 .. 8 and 64, and the
 *      products of a whole decode step per type;
 *      3. the bf16 kernels side by side (the
 *      tensor-core default, the CUDA-core kernels of before, every
 *      tensor-core shape: per-warp, cluster and block kernels, each
 *      checked for the default's bits); 4. the bf16 products of Llama-3.2-1B
 *      and Llama-3.1-8B at M = 64, 512, 2048 on the cluster kernel, the
 *      default and each warpgroup kind (cuda_wgmma.cu), with their bits.
 *
 * Method: weights are random (never zeros), several copies of each shape
 * rotate so that the 50 MB L2 cannot hold them; a pass over the copies is
 * captured once into a CUDA graph on the backend's stream and replayed
 * (warm-up first), each replay timed with events; the median is reported.
 * Each measurement also runs without the graph (plain launches) to show
 * the host's launch cost.
 *
 * Ownership: the program owns everything it allocates and frees it; one
 * thread. Prints a Markdown table on stdout; exits non-zero on any error.
 *
 * usage: cuda_ops_bench [--device N] [--reps N] [--quick] [--attn] [--quant] [--sample] [--m1]
 *        (--attn: the copy and the attention table only; --quant: the copy and the
 *        quantized products of an 8B layer only; --sample: the copy and the device
 *        draws (sample_rows' kernel) by setting and rows only; --m1: the copy and
 *        every tensor-core shape of the one-row bf16 products of Llama-3.2-1B and
 *        Llama-3.1-8B)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define EK(call)                                                                   \
    do {                                                                           \
        ember_error err_;                                                          \
        if ((call) != EMBER_OK) {                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err_.msg); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)
/* EK's calls name err_ as their error argument */

static ember_backend *g_be;
static cudaStream_t g_stream;
static int g_reps = 20;
static double g_copy_bw; /* bytes per second, read + write */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* A host block of random bf16 values in [-1, 1), tiled into every weight. */
#define RAND_HALVES (32u << 20)
static uint16_t *g_rand;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_f);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- tensors ------------------------------------------------------------------------ */

typedef struct tens {
    ember_tensor t;
    ember_buffer *b;
} tens;

static tens make(ember_dtype dt, int64_t rows, int64_t cols) {
    tens r;
    int64_t s[2] = {rows, cols};
    EK(ember_tensor_alloc(g_be, &r.t, &r.b, dt, 2, s, &err_));
    /* fill from the random block, starting at a random place */
    size_t n = r.t.nbytes / 2, done = 0;
    while (done < n) {
        size_t start = rnd32() % (RAND_HALVES / 2), len = n - done < RAND_HALVES / 2 ? n - done : RAND_HALVES / 2;
        EK(g_be->ops->write(g_be, &r.t, done * 2, g_rand + start, len * 2, &err_));
        done += len;
    }
    return r;
}

static void drop(tens *t) {
    ember_buffer_free(t->b);
}

/* ---- timing ---------------------------------------------------------------------------- */

typedef void (*pass_fn)(void *ctx);

/* Median seconds of one pass: graph replays when graph, else direct calls. */
static double time_pass(pass_fn fn, void *ctx, int graph) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    cudaGraphExec_t exec = NULL;
    if (graph) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
        fn(ctx);
        CK(cudaStreamEndCapture(g_stream, &g));
        CK(cudaGraphInstantiate(&exec, g, 0));
        CK(cudaGraphDestroy(g));
    }
    float *ms = malloc((size_t)g_reps * sizeof *ms);
    for (int i = -3; i < g_reps; i++) {
        CK(cudaEventRecord(a, g_stream));
        if (graph)
            CK(cudaGraphLaunch(exec, g_stream));
        else
            fn(ctx);
        CK(cudaEventRecord(b, g_stream));
        CK(cudaEventSynchronize(b));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], a, b));
    }
    double med = median(ms, g_reps) * 1e-3;
    free(ms);
    if (exec) CK(cudaGraphExecDestroy(exec));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return med;
}

/* ---- copy bandwidth ---------------------------------------------------------------------- */

typedef struct copy_ctx {
    void *dst, *src;
    size_t n;
} copy_ctx;

static void copy_pass(void *p) {
    copy_ctx *c = p;
    CK(cudaMemcpyAsync(c->dst, c->src, c->n, cudaMemcpyDeviceToDevice, g_stream));
}

static void bench_copy(void) {
    copy_ctx c = {.n = (size_t)2 << 30};
    CK(cudaMalloc(&c.src, c.n));
    CK(cudaMalloc(&c.dst, c.n));
    for (size_t o = 0; o < c.n; o += RAND_HALVES * 2)
        CK(cudaMemcpy((char *)c.src + o, g_rand, RAND_HALVES * 2, cudaMemcpyHostToDevice));
    double t = time_pass(copy_pass, &c, 0);
    g_copy_bw = 2.0 * (double)c.n / t;
    printf("| d2d copy | 2 GiB | - | %.1f | %.0f | 100 | - | - |\n", t * 1e6, g_copy_bw / 1e9);
    CK(cudaFree(c.src));
    CK(cudaFree(c.dst));
}

/* ---- matmul -------------------------------------------------------------------------------- */

#define MAX_COPIES 32
#define MAX_PER 8

/* n_copies sets of n products sharing an input. */
typedef struct mm_ctx {
    tens x[1];
    int n_copies, n;
    tens w[MAX_COPIES][MAX_PER], out[MAX_COPIES][MAX_PER];
    ember_matmul mm[MAX_COPIES][MAX_PER];
} mm_ctx;

static void mm_pass(void *p) {
    mm_ctx *c = p;
    for (int i = 0; i < c->n_copies; i++) EK(g_be->ops->matmul(g_be, &c->x[0].t, c->n, c->mm[i], &err_));
}

/* What one row measured. */
typedef struct mm_res {
    double t, bytes; /* seconds and bytes per pass over one copy (graph replay) */
} mm_res;

/* One row of the table for products of shapes N[i] x K at M rows. */
static mm_res bench_mm(const char *what, ember_dtype dt, int M, int K, int n, const int *N) {
    static mm_ctx c;
    memset(&c, 0, sizeof c);
    size_t wbytes = 0;
    const ember_dtype_info *di = ember_dtype_get(dt);
    for (int i = 0; i < n; i++) wbytes += (size_t)N[i] * (size_t)(K / (int)di->block_elems) * di->block_bytes;
    /* enough copies to pass 400 MB, so that L2 (50 MB) holds a small part */
    int copies = (int)((400u << 20) / wbytes) + 1;
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    if (copies < 2) copies = 2;
    c.n_copies = copies;
    c.n = n;
    int64_t xs[2] = {M, K};
    EK(ember_tensor_alloc(g_be, &c.x[0].t, &c.x[0].b, EMBER_F32, 2, xs, &err_));
    float *h = malloc((size_t)M * (size_t)K * 4);
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++) h[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f + 1e-4f;
    EK(g_be->ops->write(g_be, &c.x[0].t, 0, h, (size_t)M * (size_t)K * 4, &err_));
    free(h);
    for (int r = 0; r < copies; r++)
        for (int i = 0; i < n; i++) {
            c.w[r][i] = make(dt, N[i], K);
            int64_t os[2] = {M, N[i]};
            EK(ember_tensor_alloc(g_be, &c.out[r][i].t, &c.out[r][i].b, EMBER_F32, 2, os, &err_));
            c.mm[r][i] = (ember_matmul){&c.out[r][i].t, &c.w[r][i].t, NULL};
        }
    mm_pass(&c); /* once plainly first: scratch the backend grows (quantized inputs) cannot grow inside a capture */
    CK(cudaStreamSynchronize(g_stream));
    double tg = time_pass(mm_pass, &c, 1) / copies, td = time_pass(mm_pass, &c, 0) / copies;
    size_t outn = 0;
    for (int i = 0; i < n; i++) outn += (size_t)N[i];
    double bytes = (double)wbytes + (double)M * K * 4 + (double)M * (double)outn * 4;
    double flops = 2.0 * M * (double)K * (double)outn;
    printf("| %s | %s | %d | %.1f | %.0f | %.1f | %.2f | %.1f |\n", what, ember_dtype_get(dt)->name, M, tg * 1e6,
           bytes / tg / 1e9, 100.0 * bytes / tg / g_copy_bw, flops / tg / 1e12, td * 1e6);
    fflush(stdout);
    for (int r = 0; r < copies; r++)
        for (int i = 0; i < n; i++) {
            drop(&c.w[r][i]);
            drop(&c.out[r][i]);
        }
    drop(&c.x[0]);
    return (mm_res){tg, bytes};
}

/* Quantized products (cuda_qmm.cu) on the Llama-3.1-8B layer's shapes at M = 1 .. 8 (and 64), per type,
   and what the products of a decode step would take (32 layers, the head in the same type). The weights
   hold random bytes (bf16 halves): the speed does not depend on the values. */
static void bench_quant(int quick) {
    static const ember_dtype qt[] = {EMBER_Q4_0, EMBER_Q4_K, EMBER_Q6_K, EMBER_Q8_0, EMBER_Q5_0};
    const int n4096[1] = {4096}, head[1] = {128256}, qkv[3] = {4096, 1024, 1024}, gu[2] = {14336, 14336};
    const int Ms[] = {1, 2, 4, 8, 64};
    for (int t = 0; t < (int)(sizeof qt / sizeof qt[0]); t++)
        for (int m = 0; m < (quick ? 1 : 5); m++) {
            mm_res a = bench_mm("8B q,k,v (one launch)", qt[t], Ms[m], 4096, 3, qkv);
            mm_res o = bench_mm("8B o", qt[t], Ms[m], 4096, 1, n4096);
            mm_res b = bench_mm("8B gate,up (one launch)", qt[t], Ms[m], 4096, 2, gu);
            mm_res d = bench_mm("8B down", qt[t], Ms[m], 14336, 1, n4096);
            if (Ms[m] > 1) continue;
            mm_res h = bench_mm("head 128256x4096", qt[t], 1, 4096, 1, head);
            double lt = a.t + o.t + b.t + d.t, lb = a.bytes + o.bytes + b.bytes + d.bytes;
            double tok = 32 * lt + h.t;
            printf("8B %s decode, matrix products only (32 layers + head): %.2f ms per token, at most %.0f tokens/s, "
                   "%.1f%% of copy bandwidth\n",
                   ember_dtype_get(qt[t])->name, tok * 1e3, 1.0 / tok, 100.0 * (32 * lb + h.bytes) / tok / g_copy_bw);
        }
}

/* ---- decode-kernel shapes ------------------------------------------------------------------ */

typedef struct var_ctx {
    ember_cu_mm a[MAX_COPIES];
    int n_copies;
} var_ctx;

static void var_pass(void *p) {
    var_ctx *c = p;
    for (int i = 0; i < c->n_copies; i++) CK(ember_cu_matmul(g_stream, &c->a[i]));
}

static void *dptr(const ember_tensor *t) {
    return (char *)t->buf->data + t->offset;
}

/* The data of one kernel comparison on an N x K bf16 weight at M rows:
   rotating weight copies (enough to pass 400 MB, so that L2 holds a small
   part) with an f32 output each, one random f32 input, and host buffers
   for the reference and the compared outputs (M x N floats each). Owned
   by the caller, freed by kcmp_free. */
typedef struct kcmp {
    tens w[MAX_COPIES], out[MAX_COPIES], x;
    int copies;
    size_t on;       /* M x N */
    float *ref, *got;
} kcmp;

static void kcmp_init(kcmp *k, int N, int K, int M) {
    size_t wbytes = (size_t)N * (size_t)K * 2;
    k->copies = (int)((400u << 20) / wbytes) + 1;
    if (k->copies > MAX_COPIES) k->copies = MAX_COPIES;
    int64_t xs[2] = {M, K};
    EK(ember_tensor_alloc(g_be, &k->x.t, &k->x.b, EMBER_F32, 2, xs, &err_));
    float *h = malloc((size_t)M * (size_t)K * 4);
    if (!h) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++) h[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f + 1e-4f;
    EK(g_be->ops->write(g_be, &k->x.t, 0, h, (size_t)M * (size_t)K * 4, &err_));
    free(h);
    for (int r = 0; r < k->copies; r++) {
        k->w[r] = make(EMBER_BF16, N, K);
        int64_t os[2] = {M, N};
        EK(ember_tensor_alloc(g_be, &k->out[r].t, &k->out[r].b, EMBER_F32, 2, os, &err_));
    }
    k->on = (size_t)M * (size_t)N;
    k->ref = malloc(k->on * 4);
    k->got = malloc(k->on * 4);
    if (!k->ref || !k->got) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
}

static void kcmp_free(kcmp *k) {
    free(k->ref);
    free(k->got);
    for (int r = 0; r < k->copies; r++) {
        drop(&k->w[r]);
        drop(&k->out[r]);
    }
    drop(&k->x);
}

/* The bf16 kernels on an N x K weight at M rows: the default (tensor
   cores), the CUDA-core kernels of before (legacy, another order) and every
   tensor-core shape (ember_cu_tc_variant): time, rate, and whether the
   bits equal the default's. */
static void bench_variants(int N, int K, int M) {
    static kcmp k;
    kcmp_init(&k, N, K, M);
    const int copies = k.copies;
    const size_t on = k.on;
    float *ref = k.ref, *got = k.got;
    static var_ctx c;
    for (int v = -1;; v++) { /* -1: legacy, 0: default, > 0: variants */
        int sh[8];
        if (v >= 0 && !ember_cu_tc_variant(v, sh)) break;
        c.n_copies = copies;
        for (int r = 0; r < copies; r++)
            c.a[r] = (ember_cu_mm){.x = dptr(&k.x.t), .M = M, .K = K, .dtype = EMBER_CU_BF16, .n = 1,
                                   .variant = v > 0 ? v : 0, .legacy = v < 0,
                                   .p = {{.w = dptr(&k.w[r].t), .out = dptr(&k.out[r].t), .N = N}}};
        double t = time_pass(var_pass, &c, 1) / copies;
        CK(cudaMemcpy(v ? got : ref, dptr(&k.out[0].t), on * 4, cudaMemcpyDeviceToHost));
        double bytes = (double)N * (double)K * 2 + (double)M * K * 4 + (double)M * N * 4;
        char name[64];
        if (v > 0 && sh[7] == 2)
            snprintf(name, sizeof name, "block 128 x %d, XT %d S %d (2 x 4 warps, parts in turn)", 32 * sh[1], sh[1],
                     sh[6]);
        else if (v > 0 && sh[7])
            snprintf(name, sizeof name, "cluster XT %d XA %d S %d (8 warps x 16 rows, parts over 8 blocks)", sh[1],
                     sh[5], sh[6]);
        else if (v > 0)
            snprintf(name, sizeof name, "tc WT %d XT %d BW %d BX %d PS %d U %d S %d", sh[0], sh[1], sh[2], sh[3],
                     sh[4], sh[5], sh[6]);
        else
            snprintf(name, sizeof name, v ? "legacy (CUDA cores)" : "default (tensor cores)");
        printf("| %dx%d | %d | %s | %.1f | %.1f | %.2f | %s |\n", N, K, M, name, t * 1e6,
               100.0 * bytes / t / g_copy_bw, 2.0 * M * (double)N * K / t / 1e12,
               v > 0 ? (memcmp(ref, got, on * 4) ? "DIFFER" : "yes") : "-");
        fflush(stdout);
    }
    kcmp_free(&k);
}

/* The bf16 products of prefill and batched decode on an N x K weight at M
   rows: the cluster kernel (the default before the warpgroup kernel;
   ember_cu_mm_wg_min = 0), the launcher's pick, and every warpgroup kind
   (cuda_wgmma.cu): time, TFLOP/s (2 M N K, useful work) and whether the
   bits equal the cluster kernel's. */
static void bench_wg(const char *what, int N, int K, int M) {
    static kcmp k;
    kcmp_init(&k, N, K, M);
    const int copies = k.copies;
    const size_t on = k.on;
    float *ref = k.ref, *got = k.got;
    static var_ctx c;
    const int wg_min = ember_cu_mm_wg_min;
    for (int v = -2;; v++) { /* -2: the cluster kernel, -1: the launcher's pick, >= 0: a warpgroup kind */
        int sh[3] = {0, 0, 0};
        if (v >= 0 && (!ember_cu_mm_wg_ready() || !ember_cu_mm_wg_kinds(v, sh))) break;
        ember_cu_mm_wg_min = v == -2 ? 0 : v == -1 ? wg_min : 1;
        ember_cu_mm_wg_kind = v >= 0 ? v : -1;
        c.n_copies = copies;
        for (int r = 0; r < copies; r++)
            c.a[r] = (ember_cu_mm){.x = dptr(&k.x.t), .M = M, .K = K, .dtype = EMBER_CU_BF16, .n = 1,
                                   .p = {{.w = dptr(&k.w[r].t), .out = dptr(&k.out[r].t), .N = N}}};
        double t = time_pass(var_pass, &c, 1) / copies;
        CK(cudaMemcpy(v > -2 ? got : ref, dptr(&k.out[0].t), on * 4, cudaMemcpyDeviceToHost));
        char name[64];
        if (v == -2)
            snprintf(name, sizeof name, "cluster / per-warp (EMBER_CUDA_MM_WG=0)");
        else if (v == -1)
            snprintf(name, sizeof name, "default (launcher's pick%s)", ember_cu_mm_wg_ready() ? "" : ", no warpgroup kernel");
        else
            snprintf(name, sizeof name, "warpgroup %d: %d x %d rows, %d stages", v, 64 * sh[0], sh[1], sh[2]);
        printf("| %s | %dx%d | %d | %s | %.1f | %.1f | %s |\n", what, N, K, M, name, t * 1e6,
               2.0 * M * (double)N * K / t / 1e12, v > -2 ? (memcmp(ref, got, on * 4) ? "DIFFER" : "yes") : "-");
        fflush(stdout);
    }
    ember_cu_mm_wg_min = wg_min;
    ember_cu_mm_wg_kind = -1;
    kcmp_free(&k);
}

/* ---- batched decode attention ------------------------------------------------------------ */

typedef struct attn_ctx {
    ember_tensor *out, *q;
    ember_kv_map map;
    ember_attn a;
} attn_ctx;

static void attn_pass(void *p) {
    attn_ctx *c = p;
    EK(g_be->ops->attention(g_be, c->out, c->q, &c->map, &c->a, &err_));
}

/* One decode step's attention of an 8B layer (rows tokens, each its own row
   over ctx keys before it: 32 query heads, 8 KV heads of 128, bf16 KV in a
   shuffled pool over 4x L2 and more) through each kernel of the tc order's
   split mode: the lean kernel (the default), the split kernel of before
   (ember_cu_attn_lean = 0) and the pipelined one at 2, 4, 8 spans per
   block; time (median of plain launches: the op uploads its block tables),
   KV bytes read per second and whether the output has the default's bits. */
static void bench_attention(int rows, int ctx) {
    enum { H = 8, HQ = 32, D = 128 };
    const int nb = (ctx + 1 + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK; /* blocks per row */
    const size_t hb = (size_t)D * EMBER_KV_BLOCK * 2, bb = (size_t)H * 2 * hb;
    tens pool;
    int64_t ps[1] = {(int64_t)(bb * (size_t)nb * (size_t)rows)};
    EK(ember_tensor_alloc(g_be, &pool.t, &pool.b, EMBER_U8, 1, ps, &err_));
    for (size_t done = 0; done < (size_t)ps[0];) { /* random bf16 values everywhere */
        size_t start = rnd32() % (RAND_HALVES / 2), len = (size_t)ps[0] - done;
        if (len > RAND_HALVES) len = RAND_HALVES;
        EK(g_be->ops->write(g_be, &pool.t, done, g_rand + start, len, &err_));
        done += len;
    }
    ember_kv_codec kc = {.enc = EMBER_KVE_BF16, .head_bytes = hb};
    ember_kv_layer view = {&pool.t, bb, 0, (size_t)H * hb, H, D, kc, kc};
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb * (size_t)rows), *row = malloc(sizeof(int32_t) * (size_t)rows),
            *pos = malloc(sizeof(int32_t) * (size_t)rows);
    ember_kv_rowref *refs = malloc(sizeof(ember_kv_rowref) * (size_t)rows);
    if (!blocks || !row || !pos || !refs) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    const int nall = nb * rows;
    for (int i = 0; i < nall; i++) blocks[i] = i;
    for (int i = nall - 1; i > 0; i--) { /* shuffled, as a pool in use is */
        int j = (int)(rnd32() % (uint32_t)(i + 1)), t = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = t;
    }
    for (int r = 0; r < rows; r++) {
        refs[r] = (ember_kv_rowref){blocks + (size_t)r * (size_t)nb, 0, nb, 0};
        row[r] = r;
        pos[r] = ctx;
    }
    tens q, out;
    int64_t qs[3] = {rows, HQ, D};
    EK(ember_tensor_alloc(g_be, &q.t, &q.b, EMBER_F32, 3, qs, &err_));
    EK(ember_tensor_alloc(g_be, &out.t, &out.b, EMBER_F32, 3, qs, &err_));
    const size_t on = (size_t)rows * HQ * D;
    float *h = malloc(on * 4), *ref = malloc(on * 4), *got = malloc(on * 4);
    if (!h || !ref || !got) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < on; i++) h[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f;
    EK(g_be->ops->write(g_be, &q.t, 0, h, on * 4, &err_));
    attn_ctx c = {&out.t, &q.t, {&view, 1, refs, rows, row, pos}, {0.08838835f, 0, 0}};
    const int lean0 = ember_cu_attn_lean, pipe0 = ember_cu_attn_pipe;
    static const struct {
        const char *name;
        int lean, pipe;
    } v[5] = {{"lean (default)", 1, 0}, {"split of before (EMBER_CUDA_ATTN_LEAN=0)", 0, 0},
              {"pipelined, 2 spans per block", 1, 2}, {"pipelined, 4", 1, 4}, {"pipelined, 8", 1, 8}};
    const double kvb = (double)rows * (double)(ctx + 1) * H * D * 2 * 2;
    for (int i = 0; i < 5; i++) {
        ember_cu_attn_lean = v[i].lean;
        ember_cu_attn_pipe = v[i].pipe;
        double t = time_pass(attn_pass, &c, 0);
        CK(cudaStreamSynchronize(g_stream));
        EK(g_be->ops->read(g_be, &out.t, 0, i ? got : ref, on * 4, &err_));
        printf("| %d | %d | %s | %.1f | %.0f | %.1f | %s |\n", rows, ctx + 1, v[i].name, t * 1e6, kvb / t / 1e9,
               100.0 * kvb / t / g_copy_bw * 2, i ? (memcmp(ref, got, on * 4) ? "DIFFER" : "yes") : "-");
        fflush(stdout);
    }
    ember_cu_attn_lean = lean0;
    ember_cu_attn_pipe = pipe0;
    free(h);
    free(ref);
    free(got);
    free(blocks);
    free(row);
    free(pos);
    free(refs);
    drop(&q);
    drop(&out);
    drop(&pool);
}

/* ---- device draws (cuda_sample.cu) ------------------------------------------------------ */

typedef struct samp_ctx {
    float *dst, *src;
    size_t bytes;
    int32_t *ids;
    const ember_draw *p;
    int rows, draw;
    int64_t V;
} samp_ctx;

/* The rows' logits restored (the draw overwrites them), then drawn. */
static void samp_pass(void *v) {
    samp_ctx *c = v;
    CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, g_stream));
    if (c->draw) CK(ember_cu_sample(g_stream, c->ids, c->dst, c->p, c->rows, c->V));
}

/* sample_rows' kernel on rows of Llama-3's 128,256 logits: flat (noise in
   [-3, 3), as random weights give) or peaked (noise in [-12, 12) and a
   few ids 8 above), per setting, with the launcher's blocks a row ("auto")
   and with one block a row (ember_cu_sample_cluster 1); the draw's time is
   the pass's less the restoring copy's. */
static void bench_sample(void) {
    enum { V = 128256, MAXR = 256 };
    static const struct {
        const char *name;
        ember_draw p;
    } set[] = {{"greedy", {0, 1, 0, 0, 0}},
               {"T 0.8", {0.8f, 1, 0, 0, 0}},
               {"T 0.8, top_p 0.95", {0.8f, 0.95f, 0, 0, 0}},
               {"T 0.7, top_k 40, top_p 0.9", {0.7f, 0.9f, 0, 40, 0}},
               {"T 1, min_p 0.05", {1.0f, 1, 0.05f, 0, 0}}};
    static const int rows[] = {1, 8, 64, 256};
    float *h = malloc(sizeof(float) * (size_t)MAXR * V), *src, *dst;
    ember_draw *hp = malloc(sizeof *hp * MAXR), *dp;
    int32_t *ids;
    CK(cudaMalloc((void **)&src, sizeof(float) * (size_t)MAXR * V));
    CK(cudaMalloc((void **)&dst, sizeof(float) * (size_t)MAXR * V));
    CK(cudaMalloc((void **)&dp, sizeof *dp * MAXR));
    CK(cudaMalloc((void **)&ids, sizeof *ids * MAXR));
    printf("\ndevice draws (sample_rows, cuda_sample.cu), rows of 128,256 logits; us: the draw alone (a pass that\n"
           "restores the logits and draws, less the restoring copy; graph replays, median); blocks: a row's\n"
           "cluster (auto: the launcher's pick by the rows):\n\n");
    printf("| logits | setting | blocks | 1 row | 8 rows | 64 rows | 256 rows |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int peaked = 0; peaked < 2; peaked++) {
        for (size_t i = 0; i < (size_t)MAXR * V; i++)
            h[i] = peaked ? ((float)(rnd32() % 24001) - 12000.0f) * 1e-3f + (i % 4099 == 0 ? 8.0f : 0.0f)
                          : ((float)(rnd32() % 6001) - 3000.0f) * 1e-3f;
        CK(cudaMemcpy(src, h, sizeof(float) * (size_t)MAXR * V, cudaMemcpyHostToDevice));
        for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
            for (int r = 0; r < MAXR; r++) {
                hp[r] = set[k].p;
                hp[r].u = (double)(rnd32() % 1000003) / 1000003.0;
            }
            CK(cudaMemcpy(dp, hp, sizeof *dp * MAXR, cudaMemcpyHostToDevice));
            for (int one = 0; one < 2; one++) {
                ember_cu_sample_cluster = one;
                printf("| %s | %s | %s |", peaked ? "peaked" : "flat", set[k].name, one ? "1" : "auto");
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                    samp_ctx c = {dst, src, sizeof(float) * (size_t)rows[ri] * V, ids, dp, rows[ri], 1, V};
                    const double all = time_pass(samp_pass, &c, 1);
                    c.draw = 0;
                    const double copy = time_pass(samp_pass, &c, 1);
                    printf(" %.1f |", (all - copy) * 1e6);
                }
                printf("\n");
                fflush(stdout);
            }
            ember_cu_sample_cluster = 0;
        }
    }
    CK(cudaFree(src));
    CK(cudaFree(dst));
    CK(cudaFree(dp));
    CK(cudaFree(ids));
    free(h);
    free(hp);
}

int main(int argc, char **argv) {
    int device = 0, quick = 0, attn_only = 0, quant_only = 0, sample_only = 0, m1_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--attn"))
            attn_only = 1;
        else if (!strcmp(argv[i], "--quant"))
            quant_only = 1;
        else if (!strcmp(argv[i], "--sample"))
            sample_only = 1;
        else if (!strcmp(argv[i], "--m1"))
            m1_only = 1;
        else {
            fprintf(stderr,
                    "usage: cuda_ops_bench [--device N] [--reps N] [--quick] [--attn] [--quant] [--sample] [--m1]\n");
            return 2;
        }
    }
    if (g_reps < 1) g_reps = 1;
    ember_cuda_params p = {.device = device};
    EK(ember_backend_cuda_new(&p, &g_be, &err_));
    g_stream = (cudaStream_t)ember_backend_cuda_stream(g_be);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    int drv = 0, rt = 0;
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    printf("device %d: %s, %d SMs, %.1f GiB, L2 %d MiB, driver CUDA %d.%d, runtime %d.%d; median of %d runs\n\n", device,
           prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1u << 30), prop.l2CacheSize >> 20,
           drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, g_reps);
    g_rand = malloc(RAND_HALVES * 2);
    for (size_t i = 0; i < RAND_HALVES; i++)
        g_rand[i] = ember_f32_to_bf16((float)((int)(rnd32() % 2001) - 1000) * 1e-3f + 1e-4f);

    printf("| what | dtype | M | us (graph) | GB/s | %% of copy | TFLOP/s | us (launches) |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    bench_copy();
    if (sample_only) { /* the device draws alone */
        bench_sample();
        free(g_rand);
        ember_backend_free(g_be);
        return 0;
    }
    if (m1_only) { /* one input row: every tensor-core shape on the Llama-3.2-1B and 3.1-8B products */
        printf("\none-row bf16 products by tensor-core shape (as the table of the full run below):\n\n");
        printf("| weight | M | kernel | us (graph) | %% of copy | TFLOP/s | same bits as default |\n"
               "| --- | --- | --- | --- | --- | --- | --- |\n");
        static const int shp[][2] = {{3072, 2048}, {2048, 2048},  {16384, 2048}, {2048, 8192},
                                     {6144, 4096}, {4096, 4096},  {28672, 4096}, {4096, 14336}};
        for (int i = 0; i < (int)(sizeof shp / sizeof shp[0]); i++) bench_variants(shp[i][0], shp[i][1], 1);
        free(g_rand);
        ember_backend_free(g_be);
        return 0;
    }
    if (quant_only) { /* the quantized products alone */
        bench_quant(quick);
        free(g_rand);
        ember_backend_free(g_be);
        return 0;
    }
    printf("\nbatched decode attention, Llama-3.1-8B layer (32 query heads, 8 KV heads of 128, bf16 KV), each row over\n"
           "its own context, the tc order's split mode by kernel (GB/s: KV bytes read; %% of copy: of the copy's\n"
           "read bandwidth, half the read + write figure):\n\n");
    printf("| rows | keys | kernel | us (launches) | GB/s | %% of copy | same bits as default |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    bench_attention(64, 1024);
    bench_attention(256, 1024);
    bench_attention(8, 1024);
    bench_attention(1, 4096);
    if (attn_only) {
        free(g_rand);
        ember_backend_free(g_be);
        return 0;
    }
    printf("\n| what | dtype | M | us (graph) | GB/s | %% of copy | TFLOP/s | us (launches) |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    const int n4096[1] = {4096}, n14336[1] = {14336}, head[1] = {128256};
    const int qkv[3] = {4096, 1024, 1024}, gu[2] = {14336, 14336};
    const int Ms[] = {1, 2, 4, 8};
    mm_res o = {0, 0}, down = {0, 0};
    for (int m = 0; m < (quick ? 1 : 4); m++) {
        mm_res r = bench_mm("4096x4096", EMBER_BF16, Ms[m], 4096, 1, n4096);
        if (m == 0) o = r;
        bench_mm("14336x4096", EMBER_BF16, Ms[m], 4096, 1, n14336);
        r = bench_mm("4096x14336", EMBER_BF16, Ms[m], 14336, 1, n4096);
        if (m == 0) down = r;
    }
    printf("\nquantized weights (cuda_qmm.cu; GB/s of the weight bytes, input and output):\n\n");
    printf("| what | dtype | M | us (graph) | GB/s | %% of copy | TFLOP/s | us (launches) |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    bench_quant(quick);
    printf("\n| what | dtype | M | us (graph) | GB/s | %% of copy | TFLOP/s | us (launches) |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    bench_mm("4096x4096", EMBER_F16, 1, 4096, 1, n4096);
    bench_mm("4096x4096", EMBER_F32, 1, 4096, 1, n4096);
    mm_res hd = bench_mm("head 128256x4096", EMBER_BF16, 1, 4096, 1, head);
    /* the products of one Llama-3.1-8B layer at M = 1: q k v | o | gate up | down */
    mm_res a = bench_mm("8B q,k,v (one launch)", EMBER_BF16, 1, 4096, 3, qkv);
    mm_res b = bench_mm("8B gate,up (one launch)", EMBER_BF16, 1, 4096, 2, gu);
    if (!quick) {
        bench_mm("4096x4096", EMBER_BF16, 64, 4096, 1, n4096);
        bench_mm("4096x4096", EMBER_BF16, 256, 4096, 1, n4096);
        bench_mm("4096x4096", EMBER_BF16, 512, 4096, 1, n4096);
        bench_mm("4096x4096", EMBER_BF16, 2048, 4096, 1, n4096);
    }
    printf("\nbf16 kernels: default (tensor cores), legacy (CUDA cores, before), tensor-core shapes (WT x XT tiles of\n"
           "16 weight rows x 8 input rows per warp, BW x BX warp tiles per block, PS parts split over warps, U k-blocks\n"
           "loaded ahead in registers, or S k-blocks ahead through shared memory):\n\n");
    printf("| weight | M | kernel | us (graph) | %% of copy | TFLOP/s | same bits as default |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    const int vm[] = {1, 8, 16, 32, 64, 128, 256, 512, 2048};
    for (int i = 0; i < 9; i++) bench_variants(4096, 4096, vm[i]);
    bench_variants(28672, 4096, 64); /* the 8B gate and up at 64 rows (one weight of both) */
    bench_variants(4096, 14336, 64); /* the 8B down at 64 rows */
    if (!quick) {
        bench_variants(14336, 4096, 1);
        bench_variants(4096, 14336, 1);
        bench_variants(4096, 14336, 2048);
        bench_variants(28672, 4096, 512); /* the 8B gate and up in a prefill chunk */
        bench_variants(28672, 4096, 2048);
    }
    printf("\nbf16 products of prefill (M = 512, 2048) and batched decode (M = 64) on the model shapes: the cluster\n"
           "kernel, the default and each warpgroup kind (64 x WGS weight rows x NI input rows per block):\n\n");
    printf("| model | weight | M | kernel | us (graph) | TFLOP/s | same bits as cluster |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    static const struct {
        const char *what;
        int N, K;
    } wgs[] = {{"1B q,k,v", 3072, 2048}, {"1B o", 2048, 2048}, {"1B gate,up", 16384, 2048}, {"1B down", 2048, 8192},
               {"8B q,k,v", 6144, 4096}, {"8B o", 4096, 4096}, {"8B gate,up", 28672, 4096}, {"8B down", 4096, 14336}};
    const int wm[] = {64, 512, 2048};
    for (int mi = 0; mi < (quick ? 2 : 3); mi++)
        for (int i = 0; i < 8; i++) bench_wg(wgs[i].what, wgs[i].N, wgs[i].K, wm[mi]);
    double lt = a.t + o.t + b.t + down.t, lb = a.bytes + o.bytes + b.bytes + down.bytes;
    double tok = 32 * lt + hd.t;
    printf("\n8B layer products at M = 1 (q,k,v + o + gate,up + down): %.1f us, %.0f GB/s, %.1f%% of copy bandwidth\n",
           lt * 1e6, lb / lt / 1e9, 100.0 * lb / lt / g_copy_bw);
    printf("8B bf16 decode, matrix products only (32 layers + head, no attention / norms / launch gaps): "
           "%.2f ms per token, at most %.0f tokens/s, %.1f%% of copy bandwidth\n",
           tok * 1e3, 1.0 / tok, 100.0 * (32 * lb + hd.bytes) / tok / g_copy_bw);
    free(g_rand);
    ember_backend_free(g_be);
    return 0;
}
