/*
 * cuda_backend.c - the CUDA backend: the ops table of backend.h over device
 * memory of one NVIDIA GPU. Built with -DEMBER_CUDA=ON (cuda_stub.c
 * otherwise).
 *
 * Ownership: the backend owns one CUDA stream on its device, an argument
 * area in device memory (the small host arrays an op receives: token ids,
 * positions, RoPE frequencies) and a pageable host bounce buffer for those.
 * Buffers are plain cudaMalloc allocations (never managed memory), owned by
 * whoever asked for them and freed with buffer_free; a tensor's data
 * pointer is device memory that only the kernels dereference.
 *
 * Threads: the backend is driven by one host thread at a time (backend.h).
 * Every entry point makes the backend's device current first, so the
 * driving thread may change between calls. Ops only enqueue work on the
 * stream and return; read, write, buffer_from_host and buffer_free wait for
 * the stream, so errors raised by an earlier kernel surface there at the
 * latest. Nothing here prints: every failure is an ember_error carrying
 * cudaGetErrorString.
 *
 * Small arguments: an op packs its host arrays (ids, positions, RoPE
 * frequencies, block tables) into one set and copies it, on the stream
 * ahead of the kernel that reads it, into a slot of the argument area
 * (upload_args); a set equal to one already there is not sent again.
 *
 * Paged KV: kv_write, kv_read and attention over the f32 / f16 / bf16
 * block codecs (cuda_attn.cu); a map's block tables travel through the
 * argument area like any small array. Split attention's scratch is device
 * memory the backend owns, grown on demand.
 *
 * Decode: the optional fused ops add_rms_norm and rope_kv_write (one launch
 * each for what were two and three) and argmax_rows (greedy ids, 4 bytes a
 * row back instead of the logits); every kernel is launched with
 * programmatic dependent launch (cuda_pdl.cuh; EMBER_CUDA_PDL=0 turns it
 * off).
 *
 * Step graphs: step_begin / step_end (backend.h) capture a decode step's
 * launches into a CUDA graph and replay it while the step's launches stay
 * the same (the section "step graphs"; EMBER_CUDA_GRAPHS=0 turns them off).
 *
 * Quantized weights (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K; cuda_qmm.cu): a
 * matmul quantizes its input once per activation kind into device scratch
 * the backend owns (grown on demand, like the attention scratch), then runs
 * one launch per weight type; the results are the CPU backend's bits. In
 * decode, the op that produced the input (a norm, swiglu) has usually
 * written the quantized form already, and the matmul skips its quantizer
 * launch (the section "quantized inputs").
 *
 * MLX affine weights (cuda_mlx.cu): their products read the 32-element
 * types' quantized input (the same scratch, the same fused quantization by
 * the producers), one launch per MLX dtype; only the measuring aid
 * EMBER_CUDA_MLXTC=0 from 9 rows quantizes row-major into a scratch of
 * their own (c->mlx_act). get_rows dequantizes. The CPU backend's bits.
 *
 * Not here yet: the quantized KV codecs (Q8, Q4, TQ) and the other weight
 * types (Q4_1, Q5_1, the other K types; EMBER_ERR_UNSUPPORTED, refused at
 * load through weight_ok / kv_ok).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/kv_codec.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/util.h"
#include "cuda_kernels.h"

/* One argument set in device memory, with the host bytes it holds. */
typedef struct arg_slot {
    void *dev;
    unsigned char *host;
    size_t cap, len;
    unsigned long long used; /* arg_clock at the last use: the oldest is reused */
} arg_slot;

#define ARG_SLOTS 8

/* ---- step graphs: the records of one captured step (section "step graphs") ---- */

/* Where one argument set of a captured step lives in the step's arena. */
typedef struct g_arg {
    size_t off, cap;
} g_arg;

/* A device-to-host result of a step, delivered by step_end. */
typedef struct g_out {
    void *dst;
    size_t off, n;
} g_out;

/* A step is captured as consecutive segments: the first SEG_FIRST
   launches, then SEG_OPS at a time (at most SEG_MAX segments), so that a
   replay launches each segment as soon as the host has packed its
   arguments and the GPU runs while the host goes on. */
#define SEG_MAX 64
#define SEG_FIRST 8
#define SEG_OPS 32

/* One captured step: its key, the executable graphs of its segments, and
   what each op of the step recorded while it was captured (a hash of its
   launch's parameters; where its arguments went), which a replay must
   match. */
typedef struct step_graph {
    ember_step_key key;
    bool valid;              /* the slot holds this key (n_seg may still be 0) */
    cudaGraphExec_t seg[SEG_MAX];
    int seg_start[SEG_MAX];  /* the launch (index into sig) each segment starts with */
    int n_seg;               /* 0: not captured */
    int fails;               /* captures that broke, replays that diverged early */
    long replays;            /* since the capture */
    uint64_t *sig;
    int n_sig, sig_cap;
    g_arg *arg;
    int n_arg, arg_cap;
    unsigned long long used; /* g_clock at the last use: the oldest slot is reused */
} step_graph;

#define GRAPH_SLOTS 8
enum { G_OFF = 0, G_CAPTURE, G_REPLAY };

/* EMBER_CUDA_PROFILE=FILE: GPU time per op, from events recorded after
   each op (a development aid; off unless the variable is set). */
#define PROF_EVENTS 4096
#define PROF_KEYS 64
typedef struct cuda_prof {
    FILE *out;
    cudaEvent_t ev[PROF_EVENTS];
    int key[PROF_EVENTS]; /* which key event i closes */
    int n;                /* events recorded since the last flush (ev[0]: the base) */
    char names[PROF_KEYS][64];
    double ms[PROF_KEYS];
    long count[PROF_KEYS];
    int n_keys;
} cuda_prof;

typedef struct cuda_backend {
    ember_backend base;
    int device;
    cudaStream_t stream;
    unsigned char *bounce; /* host staging for the argument area */
    size_t bounce_cap;
    arg_slot slots[ARG_SLOTS]; /* the argument area: recently uploaded argument sets */
    unsigned long long arg_clock;
    float *parts; /* device scratch of split attention */
    size_t parts_cap;  /* floats */
    int *count;        /* split attention's finished spans per (token, head), zero between launches */
    size_t count_cap;
    int attn_tc;       /* attention in the tc order where a layer allows it (EMBER_CUDA_ATTN_TC; fixed for life) */
    int32_t *ids_dev; /* argmax_rows' and sample_rows' ids [am_rows], counters [am_rows], candidates */
    size_t am_rows;   /* rows and row length the candidates have room for */
    int64_t am_V;
    void *qact;          /* device scratch of quantized matmuls: the input quantized (cuda_qmm.cu) */
    size_t qact_cap;     /* bytes */
    void *mlx_act;       /* device scratch of MLX products under EMBER_CUDA_MLXTC=0 from 9 rows: row-major A32 */
    size_t mlx_act_cap;  /* bytes */
    /* fused input quantization (section "quantized inputs"): what qact holds, the launches so far */
    struct {
        const void *src;  /* the f32 input whose quantized form qact holds, NULL: nothing */
        int M, K;
        unsigned kinds;   /* QK_32 (the 32-element types' layout for M), QK_256 */
        uint64_t seq;     /* valid while c->seq still equals it */
    } qf;
    uint64_t seq;         /* launches and writes so far (g_skip, write, the ops without graphs) */
    int qfuse;            /* the producing ops write the quantized form for inputs of at most this many rows
                             (EMBER_CUDA_QFUSE, default 1, at most EMBER_CU_QFUSE_MAX_M; 0: never) */
    int mm_early;         /* products of prepared weights set ember_cu_mm.early (EMBER_CUDA_MM_EARLY, default 1) */
    struct {
        int K;
        unsigned kinds;
    } qseen[8];           /* the activation kinds the quantized products of each row length K took (newest first) */
    float *delta_scratch; /* device scratch of delta_net, grown on demand */
    size_t delta_cap;     /* bytes */
    ember_cu_kv_ref *refs_h; /* host staging of a KV map's tables */
    int32_t *blocks_h;
    size_t refs_cap, blocks_cap;
    cuda_prof *prof; /* NULL unless EMBER_CUDA_PROFILE is set */
    /* step graphs (EMBER_CUDA_GRAPHS, default on) */
    bool graphs_on;
    int gmode;                    /* G_OFF, or the step being captured / replayed */
    step_graph graphs[GRAPH_SLOTS];
    step_graph *gcur;             /* the step's graph while gmode != G_OFF */
    int g_sig, g_arg;             /* replay: the next record to match */
    size_t g_arena, g_outpos;     /* bytes of the arena and of the result staging used by the step so far */
    bool g_broken;                /* capture: an op could not be captured (the pass runs again plainly) */
    bool g_diverged;              /* replay: an op did not match the recording (the pass runs again, captured) */
    bool g_next_plain;            /* the next step_begin runs plainly (after a broken capture) */
    ember_step_key g_last;        /* the previous step's key: a key is captured when it repeats */
    bool g_have_last;
    cudaGraph_t g_parts[SEG_MAX]; /* capture: the segments so far */
    int g_nparts;
    int g_seg;                    /* replay: segments launched so far */
    size_t g_sent;                /* replay: arena bytes sent so far */
    cudaError_t g_err;            /* a failure inside an op's g_skip, reported by step_end */
    unsigned char *ga_host;       /* the arena: the step's argument sets, pinned host memory */
    void *ga_dev;                 /* and its device copy, sent once before each launch of a graph */
    size_t ga_cap, ga_need;
    unsigned char *go_host;       /* pinned staging of the step's device-to-host results */
    size_t go_cap, go_need;
    g_out *gouts;                 /* where step_end delivers them */
    int n_gouts, gouts_cap;
    unsigned long long g_clock;
    long n_captured, n_replayed, n_again;
    long n_qfused; /* quantizer launches a quantized matmul did not need (ember_cuda_qfuse_count) */
    ember_pool *host; /* host_run's threads, made on first use; NULL until then or when that failed */
    bool host_failed;
} cuda_backend;

static const ember_backend_ops k_cuda_ops;
static int graph_out(cuda_backend *c, void *dst, const void *src, size_t n, ember_error *err);

static cuda_backend *cu(ember_backend *be) {
    return (cuda_backend *)be->impl;
}

static void *dev(const ember_tensor *t) {
    return (char *)t->buf->data + t->offset;
}

/* The ember status for a CUDA error. */
static int cuda_code(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation: return EMBER_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidDevice: return EMBER_ERR_UNSUPPORTED;
    default: return EMBER_ERR_INTERNAL;
    }
}

/* Fills err with "cuda: WHAT: <CUDA's message> (<its name>)"; returns the code. */
static int cuda_fail(ember_error *err, cudaError_t e, const char *what) {
    return ember_err(err, cuda_code(e), "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CU_TRY(call, what)                                \
    do {                                                  \
        cudaError_t e_ = (call);                          \
        if (e_ != cudaSuccess) return cuda_fail(err, e_, what); \
    } while (0)

/* Makes the backend's device current for this host thread. */
static int bind(cuda_backend *c, ember_error *err) {
    CU_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    return EMBER_OK;
}

/* ---- the profile (EMBER_CUDA_PROFILE) ----------------------------------------------------- */

/* Accumulates the time between consecutive events into their keys; the
   last event becomes the base of the next batch. Waits for the events. */
static void prof_flush(cuda_backend *c) {
    cuda_prof *p = c->prof;
    if (!p || p->n < 2) return;
    if (cudaEventSynchronize(p->ev[p->n - 1]) != cudaSuccess) {
        cudaGetLastError();
        p->n = 0;
        return;
    }
    for (int i = 1; i < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) == cudaSuccess) {
            p->ms[p->key[i]] += ms;
            p->count[p->key[i]]++;
        }
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0];
    p->ev[0] = last;
    p->n = 1;
}

/* Records an event closing op `name` (the GPU time since the previous
   event, gaps included, goes to it). */
static void prof_mark(cuda_backend *c, const char *name) {
    cuda_prof *p = c->prof;
    if (!p) return;
    int k = 0;
    while (k < p->n_keys && strcmp(p->names[k], name)) k++;
    if (k == p->n_keys) {
        if (k == PROF_KEYS) k = PROF_KEYS - 1; /* the last key takes the overflow */
        else snprintf(p->names[p->n_keys++], sizeof p->names[0], "%s", name);
    }
    if (p->n == PROF_EVENTS) prof_flush(c);
    if (cudaEventRecord(p->ev[p->n], c->stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    p->key[p->n++] = k;
}

/* Starts the profile when EMBER_CUDA_PROFILE names a file to append to. */
static void prof_start(cuda_backend *c) {
    const char *path = getenv("EMBER_CUDA_PROFILE");
    if (!path || !*path) return;
    cuda_prof *p = ember_calloc(1, sizeof *p);
    if (!p) return;
    int i = 0;
    while (i < PROF_EVENTS && cudaEventCreate(&p->ev[i]) == cudaSuccess) i++;
    if (i < PROF_EVENTS || !(p->out = fopen(path, "a"))) {
        while (i > 0) cudaEventDestroy(p->ev[--i]);
        free(p);
        return;
    }
    c->prof = p;
    prof_mark(c, "(start)");
}

/* Writes the table (ops by total time) and frees the profile. */
static void prof_end(cuda_backend *c) {
    cuda_prof *p = c->prof;
    if (!p) return;
    prof_flush(c);
    double total = 0;
    for (int k = 0; k < p->n_keys; k++) total += p->ms[k];
    fprintf(p->out, "| op (EMBER_CUDA_PROFILE, GPU time incl. gaps) | calls | ms | us / call | share |\n|---|---|---|---|---|\n");
    for (int done = 0; done < p->n_keys; done++) {
        int b = -1;
        for (int k = 0; k < p->n_keys; k++)
            if (p->count[k] >= 0 && (b < 0 || p->ms[k] > p->ms[b])) b = k;
        fprintf(p->out, "| %s | %ld | %.3f | %.2f | %.1f%% |\n", p->names[b], p->count[b], p->ms[b],
                p->count[b] ? 1e3 * p->ms[b] / (double)p->count[b] : 0.0, total > 0 ? 100.0 * p->ms[b] / total : 0.0);
        p->count[b] = -1;
    }
    fprintf(p->out, "| total | | %.3f | | |\n\n", total);
    fclose(p->out);
    for (int i = 0; i < PROF_EVENTS; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    c->prof = NULL;
}

/* ---- buffers ------------------------------------------------------------------------- */

static int cuda_buffer_alloc(ember_backend *be, size_t size, ember_buffer **out, ember_error *err) {
    cuda_backend *c = cu(be);
    *out = NULL;
    if (c->gmode != G_OFF)
        return ember_err(err, EMBER_ERR_INTERNAL, "cuda: buffer_alloc inside a step (backend.h: step_begin)");
    int rc = bind(c, err);
    if (rc) return rc;
    c->seq++; /* new memory, maybe where a freed input was (quantized inputs) */
    ember_buffer *b = ember_calloc(1, sizeof *b);
    if (!b) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (size > SIZE_MAX - 16) {
        free(b);
        return ember_err(err, EMBER_ERR_NOMEM, "cuda: cannot allocate %zu bytes", size);
    }
    void *d = NULL;
    /* 16 bytes past the end: the quantized kernels read whole aligned words,
       up to 4 bytes past a block that ends a buffer (cuda_qmm.cu) */
    cudaError_t e = cudaMalloc(&d, size + 16);
    if (e == cudaSuccess) e = cudaMemsetAsync(d, 0, size, c->stream);
    if (e != cudaSuccess) {
        if (d) cudaFree(d);
        free(b);
        if (e == cudaErrorMemoryAllocation) {
            size_t fr = 0, total = 0;
            cudaGetLastError(); /* an allocation failure is not sticky: clear it */
            cudaMemGetInfo(&fr, &total);
            return ember_err(err, EMBER_ERR_NOMEM, "cuda: out of device memory allocating %zu bytes (%zu of %zu free)",
                             size, fr, total);
        }
        return cuda_fail(err, e, "allocating a buffer");
    }
    *b = (ember_buffer){.be = be, .data = d, .size = size, .owned = true};
    *out = b;
    return EMBER_OK;
}

static int cuda_buffer_from_host(ember_backend *be, const void *h, size_t size, ember_buffer **out,
                                 ember_error *err) {
    cuda_backend *c = cu(be);
    int rc = cuda_buffer_alloc(be, size, out, err);
    if (rc || !size) return rc;
    cudaError_t e = cudaMemcpyAsync((*out)->data, h, size, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        ember_buffer_free(*out);
        *out = NULL;
        return cuda_fail(err, e, "copying to the device");
    }
    return EMBER_OK;
}

/* A prepared weight's handle (tensor.h: each backend defines its own). The
   bytes stay as uploaded; the handle only says that nothing the backend
   queues writes them, so a product may start reading them before the
   kernel before it has finished (ember_cu_mm.early). One static object,
   shared by every prepared weight: nothing to free. */
struct ember_prepared {
    int weight;
};
static ember_prepared k_weight_mark = {1};

/* backend.h's prepare_weight: the kernels read every weight in the layout
   it was uploaded in (cuda_matmul.cu), so there is nothing to rewrite;
   checks the tensor is this backend's and sets t->prep to k_weight_mark.
   Copies of t share it; a view of the same bytes without it, or a weight
   of another kind, runs as before (its products wait for the kernel
   before them). A host write into the bytes (cuda_write) is a copy on the
   stream, which no kernel after it overlaps. */
static int cuda_prepare_weight(ember_backend *be, ember_tensor *t, ember_error *err) {
    if (!t || !t->buf || t->buf->be != be)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "prepare_weight: not a bound tensor of this backend");
    t->prep = &k_weight_mark;
    return EMBER_OK;
}

/* Waits for work that may still use the memory, then frees it. A failure
   cannot be returned (the interface frees without a status): it goes to
   the backend's logger, and the next call that synchronises reports it. */
static void cuda_buffer_free(ember_buffer *b) {
    if (!b) return;
    cuda_backend *c = cu(b->be);
    if (b->owned && b->data) {
        cudaError_t e = cudaSetDevice(c->device);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        if (e == cudaSuccess) e = cudaFree(b->data);
        if (e != cudaSuccess)
            ember_log(&c->base.log, EMBER_LOG_ERROR, "cuda: freeing a buffer: %s", cudaGetErrorString(e));
    }
    free(b);
}

static int check_tensor(const ember_backend *be, const ember_tensor *t, const char *op, const char *what,
                        ember_error *err) {
    if (!t || !t->buf)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s is not bound to a buffer", op, what);
    if (t->buf->be != be)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s lives in another backend's memory", op, what);
    return EMBER_OK;
}

static int check_range(const ember_backend *be, const ember_tensor *t, size_t off, size_t n, const char *op,
                       ember_error *err) {
    int rc = check_tensor(be, t, op, "tensor", err);
    if (rc) return rc;
    size_t end;
    if (!ember_add_ok(off, n, &end) || end > t->nbytes)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "copy of %zu bytes at %zu outside a %zu-byte tensor", n, off,
                         t->nbytes);
    return EMBER_OK;
}

static int cuda_write(ember_backend *be, ember_tensor *dst, size_t off, const void *src, size_t n,
                      ember_error *err) {
    cuda_backend *c = cu(be);
    int rc = check_range(be, dst, off, n, "write", err);
    if (rc || !n) return rc;
    if ((rc = bind(c, err))) return rc;
    if (c->gmode != G_OFF) return ember_err(err, EMBER_ERR_INTERNAL, "cuda: write inside a step (backend.h: step_begin)");
    c->seq++; /* memory changes (quantized inputs) */
    CU_TRY(cudaMemcpyAsync((char *)dev(dst) + off, src, n, cudaMemcpyHostToDevice, c->stream), "write");
    CU_TRY(cudaStreamSynchronize(c->stream), "write");
    return EMBER_OK;
}

static int cuda_read(ember_backend *be, const ember_tensor *src, size_t off, void *dst, size_t n,
                     ember_error *err) {
    cuda_backend *c = cu(be);
    int rc = check_range(be, src, off, n, "read", err);
    if (rc || !n) return rc;
    if ((rc = bind(c, err))) return rc;
    if (c->gmode != G_OFF) return graph_out(c, dst, (const char *)dev(src) + off, n, err); /* delivered by step_end */
    CU_TRY(cudaMemcpyAsync(dst, (const char *)dev(src) + off, n, cudaMemcpyDeviceToHost, c->stream), "read");
    prof_mark(c, "read (device to host)");
    CU_TRY(cudaStreamSynchronize(c->stream), "read");
    return EMBER_OK;
}

/* ---- the argument area ------------------------------------------------------------------ */

#define ARG_ALIGN 256

/* ---- step graphs ------------------------------------------------------------------------
 *
 * A forward pass between step_begin and step_end (backend.h) is a step. A
 * step whose key (tokens, logit rows, greedy ids or not) was also the
 * previous step's is captured (cudaStreamBeginCapture: the ops enqueue as
 * usual but nothing runs) as consecutive segments of launches (SEG_FIRST,
 * then SEG_OPS each), instantiated and launched; the next step with that
 * key is replayed: the ops run their checks and pack their arguments but
 * launch nothing, and each segment is launched as soon as the op after it
 * has packed its arguments (so the GPU runs while the host packs the rest),
 * the last ones by step_end. What changes from
 * step to step travels in device memory the kernels read, never in the
 * graph: every argument set (token ids, positions, block tables, rows) goes
 * to its own place in one arena (pinned host memory, copied to the device
 * before the segment that reads it), reserved at the capture as the next
 * power of two of its bytes, so a block table may grow by half before the
 * step must be captured again. Results for the host (read, argmax_rows) are
 * copied by the graph into pinned staging and handed over by step_end,
 * after the one wait of the step.
 *
 * A replay must launch exactly what the capture did: every op hashes the
 * parameters of each of its launches (tensors, shapes, scalars, where its
 * arguments are, the kernel it picks, e.g. the attention's span count) and
 * the replay compares the hashes in order. A difference, or an argument set
 * larger than its place, stops the replay: step_end waits for the segments
 * already launched (a prefix of this very step, which the next pass
 * recomputes from the step's inputs, writing the same values), says again,
 * the caller repeats the pass, and it is captured anew. An op
 * that cannot be captured (scratch or arena to grow, which needs a wait)
 * breaks the capture: the pass runs again plainly, growing what it needs,
 * and the key is captured at its next repeat. Replays therefore launch the
 * kernels, parameters and argument bytes of plain launches: the same bits.
 * Any reallocation of memory a graph points to (scratch, arena, staging)
 * drops every graph.
 */

static void graph_drop(step_graph *g) {
    for (int i = 0; i < g->n_seg; i++) cudaGraphExecDestroy(g->seg[i]);
    free(g->sig);
    free(g->arg);
    memset(g, 0, sizeof *g);
}

static void graphs_clear(cuda_backend *c) {
    for (int i = 0; i < GRAPH_SLOTS; i++) graph_drop(&c->graphs[i]);
}

/* A 64-bit hash of n words (multiply and fold per word). */
static uint64_t sig_hash(const uint64_t *v, int n) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h = (h ^ v[i]) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 32;
    }
    return h;
}

/* Replay: sends the arena bytes packed since the last send, then launches
   segment k. */
static cudaError_t seg_launch(cuda_backend *c, step_graph *g, int k) {
    cudaError_t e = cudaSuccess;
    if (c->g_arena > c->g_sent)
        e = cudaMemcpyAsync((char *)c->ga_dev + c->g_sent, c->ga_host + c->g_sent, c->g_arena - c->g_sent,
                            cudaMemcpyHostToDevice, c->stream);
    c->g_sent = c->g_arena;
    if (e == cudaSuccess) e = cudaGraphLaunch(g->seg[k], c->stream);
    return e;
}

static uint64_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#define P(x) ((uint64_t)(uintptr_t)(x))

/* Appends a KV map's launch parameters (its device pointers and sizes) to v at *n. */
static void sig_kv(uint64_t *v, int *n, const ember_cu_kv *d) {
    for (int i = 0; i < 2; i++) {
        const ember_cu_kv_view *w = &d->view[i];
        uint64_t f[] = {P(w->pool), w->block_bytes, w->k_off, w->v_off, w->k_head, w->v_head, (uint64_t)w->k_enc,
                        (uint64_t)w->v_enc};
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) v[(*n)++] = f[k];
    }
    uint64_t f[] = {P(d->refs), P(d->blocks), P(d->row), P(d->pos), (uint64_t)d->T, (uint64_t)d->H, (uint64_t)d->D};
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) v[(*n)++] = f[k];
}

/* Called by every op before each launch with the launch's parameters:
   false when the op launches (no step graph, or the step is being
   captured); true when it must not (a replay, where it checks them
   against the capture's record, or a step that already broke or
   diverged). */
static bool g_skip(cuda_backend *c, const uint64_t *v, int n) {
    c->seq++; /* a launch: memory may change (quantized inputs) */
    if (c->gmode == G_OFF) return false;
    if (c->g_broken || c->g_diverged) return true;
    step_graph *g = c->gcur;
    uint64_t h = sig_hash(v, n);
    if (c->gmode == G_CAPTURE) {
        if (g->n_sig == g->sig_cap) {
            int cap = g->sig_cap ? 2 * g->sig_cap : 256;
            uint64_t *s = ember_realloc(g->sig, (size_t)cap * sizeof *s);
            if (!s) {
                c->g_broken = true;
                return true;
            }
            g->sig = s;
            g->sig_cap = cap;
        }
        const int i = g->n_sig, k = c->g_nparts;
        if (k + 1 < SEG_MAX && i - g->seg_start[k] >= (k == 0 ? SEG_FIRST : SEG_OPS)) {
            /* this launch starts the next segment */
            cudaGraph_t part = NULL;
            cudaError_t e = cudaStreamEndCapture(c->stream, &part);
            if (e == cudaSuccess) {
                c->g_parts[c->g_nparts++] = part;
                e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
            }
            if (e != cudaSuccess) {
                cudaGetLastError();
                c->g_err = e;
                c->g_broken = true;
                return true;
            }
            g->seg_start[k + 1] = i;
        }
        g->sig[g->n_sig++] = h;
        return false;
    }
    if (c->g_sig >= g->n_sig || g->sig[c->g_sig] != h) {
        c->g_diverged = true;
        return true;
    }
    /* the first launch of segment k + 1 is packed: segment k's arguments are all there */
    if (c->g_seg + 1 < g->n_seg && c->g_sig == g->seg_start[c->g_seg + 1]) {
        cudaError_t e = seg_launch(c, g, c->g_seg);
        c->g_seg++;
        if (e != cudaSuccess) {
            c->g_err = e;
            c->g_diverged = true;
            return true;
        }
    }
    c->g_sig++;
    return true;
}

/* upload_args inside a step (backend.h's step_begin): the sets go to the
   arena, each to its own place, recorded at the capture and matched by a
   replay. A broken or diverged step returns NULL places (its ops launch
   nothing); a capture whose arena is too small breaks, noting the size it
   needs for the next capture. */
static int upload_graph(cuda_backend *c, int n, const void *const *part, const size_t *bytes, void **out,
                        ember_error *err) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        size_t padded = (bytes[i] + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1);
        if (padded < bytes[i] || !ember_add_ok(total, padded, &total))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda: op arguments too large");
    }
    step_graph *g = c->gcur;
    size_t off, cap;
    if (c->g_diverged) return EMBER_OK;
    if (c->gmode == G_CAPTURE) {
        cap = ARG_ALIGN;
        while (cap < total) {
            if (cap > SIZE_MAX / 2) return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda: op arguments too large");
            cap *= 2;
        }
        off = c->g_arena;
        if (!ember_add_ok(off, cap, &c->g_arena))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda: op arguments too large");
        if (c->g_arena > c->ga_need) c->ga_need = c->g_arena; /* counted on after a break: the whole step's need */
        if (c->g_broken) return EMBER_OK;
        if (c->g_arena > c->ga_cap) {
            c->g_broken = true;
            return EMBER_OK;
        }
        if (g->n_arg == g->arg_cap) {
            int ac = g->arg_cap ? 2 * g->arg_cap : 256;
            g_arg *a = ember_realloc(g->arg, (size_t)ac * sizeof *a);
            if (!a) {
                c->g_broken = true;
                return EMBER_OK;
            }
            g->arg = a;
            g->arg_cap = ac;
        }
        g->arg[g->n_arg++] = (g_arg){off, cap};
    } else {
        if (c->g_arg >= g->n_arg || total > g->arg[c->g_arg].cap) {
            c->g_diverged = true;
            return EMBER_OK;
        }
        off = g->arg[c->g_arg].off;
        cap = g->arg[c->g_arg++].cap;
        if (off + cap > c->g_arena) c->g_arena = off + cap; /* what step_end sends */
    }
    size_t o = off;
    for (int i = 0; i < n; i++) {
        size_t padded = (bytes[i] + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1);
        if (bytes[i]) memcpy(c->ga_host + o, part[i], bytes[i]);
        memset(c->ga_host + o + bytes[i], 0, padded - bytes[i]);
        out[i] = (char *)c->ga_dev + o;
        o += padded;
    }
    return EMBER_OK;
}

/* A device-to-host copy of n bytes inside a step: captured into the pinned
   staging (a copy node of the graph), handed to dst by step_end. */
static int graph_out(cuda_backend *c, void *dst, const void *src, size_t n, ember_error *err) {
    size_t off = c->g_outpos, end;
    if (!ember_add_ok(off, (n + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1), &end) || end < n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda: read too large");
    c->g_outpos = end;
    if (c->gmode == G_CAPTURE && end > c->go_need) c->go_need = end;
    if (c->gmode == G_CAPTURE && !c->g_broken && end > c->go_cap) c->g_broken = true;
    const uint64_t v[] = {100, P(src), n, off};
    if (!g_skip(c, v, 4)) /* capturing */
        CU_TRY(cudaMemcpyAsync(c->go_host + off, src, n, cudaMemcpyDeviceToHost, c->stream), "read");
    if (c->g_broken || c->g_diverged) return EMBER_OK;
    if (c->n_gouts == c->gouts_cap) {
        int cap = c->gouts_cap ? 2 * c->gouts_cap : 16;
        g_out *o = ember_realloc(c->gouts, (size_t)cap * sizeof *o);
        if (!o) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        c->gouts = o;
        c->gouts_cap = cap;
    }
    c->gouts[c->n_gouts++] = (g_out){dst, off, n};
    return EMBER_OK;
}

/* An op that needs a wait (scratch to grow) inside a step: a capture
   breaks (the pass runs again plainly and grows it), a replay diverges
   (the recording had it grown already, so this is another step). True
   when the op must return at once. */
static bool g_cannot(cuda_backend *c) {
    if (c->gmode == G_OFF) return false;
    if (c->gmode == G_CAPTURE) c->g_broken = true;
    else c->g_diverged = true;
    return true;
}

/* Frees and reallocates the pinned arena (host and device) or staging to
   at least the sizes last needed; drops every graph (they point there).
   Only between steps. */
static int graph_grow(cuda_backend *c, ember_error *err) {
    if (c->ga_need <= c->ga_cap && c->go_need <= c->go_cap && c->ga_host && c->go_host) return EMBER_OK;
    CU_TRY(cudaStreamSynchronize(c->stream), "step graphs");
    graphs_clear(c);
    if (c->ga_need > c->ga_cap || !c->ga_host) {
        size_t cap = c->ga_need + c->ga_need / 4;
        if (cap < ((size_t)1 << 20)) cap = (size_t)1 << 20;
        if (c->ga_host) cudaFreeHost(c->ga_host);
        if (c->ga_dev) cudaFree(c->ga_dev);
        c->ga_host = NULL;
        c->ga_dev = NULL;
        c->ga_cap = 0;
        CU_TRY(cudaMallocHost((void **)&c->ga_host, cap), "allocating the step arena");
        CU_TRY(cudaMalloc(&c->ga_dev, cap), "allocating the step arena");
        c->ga_cap = cap;
    }
    if (c->go_need > c->go_cap || !c->go_host) {
        size_t cap = c->go_need > 4096 ? c->go_need : 4096;
        if (c->go_host) cudaFreeHost(c->go_host);
        c->go_host = NULL;
        c->go_cap = 0;
        CU_TRY(cudaMallocHost((void **)&c->go_host, cap), "allocating the step staging");
        c->go_cap = cap;
    }
    return EMBER_OK;
}

static bool key_eq(const ember_step_key *a, const ember_step_key *b) {
    return a->n_tokens == b->n_tokens && a->n_out == b->n_out && a->argmax == b->argmax;
}

/* step_begin (backend.h): replays key's graph, captures the key when it
   repeats the previous step's, else runs plainly. */
static int cuda_step_begin(ember_backend *be, const ember_step_key *key, bool *graphed, ember_error *err) {
    cuda_backend *c = cu(be);
    *graphed = false;
    if (c->gmode != G_OFF) return ember_err(err, EMBER_ERR_INTERNAL, "cuda: step_begin inside a step");
    if (!c->graphs_on || c->prof) return EMBER_OK;
    int rc = bind(c, err);
    if (rc) return rc;
    bool repeat = c->g_have_last && key_eq(&c->g_last, key);
    c->g_last = *key;
    c->g_have_last = true;
    if (c->g_next_plain) {
        c->g_next_plain = false;
        return EMBER_OK;
    }
    step_graph *g = NULL, *old;
    for (int i = 0; i < GRAPH_SLOTS && !g; i++)
        if (c->graphs[i].valid && key_eq(&c->graphs[i].key, key)) g = &c->graphs[i];
    c->g_sig = c->g_arg = 0;
    c->g_arena = c->g_outpos = 0;
    c->n_gouts = 0;
    c->g_broken = c->g_diverged = false;
    c->g_nparts = c->g_seg = 0;
    c->g_sent = 0;
    c->g_err = cudaSuccess;
    if (g && g->n_seg) {
        g->used = ++c->g_clock;
        c->gcur = g;
        c->gmode = G_REPLAY;
        *graphed = true;
        return EMBER_OK;
    }
    if ((g && g->fails >= 3) || !repeat) return EMBER_OK;
    if ((rc = graph_grow(c, err))) return rc;
    g = NULL; /* graph_grow may have cleared the slots: look again */
    for (int i = 0; i < GRAPH_SLOTS && !g; i++)
        if (c->graphs[i].valid && key_eq(&c->graphs[i].key, key)) g = &c->graphs[i];
    if (!g) { /* a free slot, else the least recently used */
        old = &c->graphs[0];
        for (int i = 1; i < GRAPH_SLOTS && old->valid; i++)
            if (!c->graphs[i].valid || c->graphs[i].used < old->used) old = &c->graphs[i];
        graph_drop(old);
        g = old;
        g->key = *key;
        g->valid = true;
    }
    g->n_sig = g->n_arg = 0;
    g->seg_start[0] = 0;
    g->replays = 0;
    g->used = ++c->g_clock;
    CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "beginning a step capture");
    c->gcur = g;
    c->gmode = G_CAPTURE;
    *graphed = true;
    return EMBER_OK;
}

/* step_end (backend.h): instantiates a capture, launches the step's graph
   after its arguments, waits, hands the results over. */
static int cuda_step_end(ember_backend *be, bool failed, bool *again, ember_error *err) {
    cuda_backend *c = cu(be);
    *again = false;
    if (c->gmode == G_OFF) return EMBER_OK;
    const int mode = c->gmode;
    step_graph *g = c->gcur;
    c->gmode = G_OFF;
    c->gcur = NULL;
    int rc = bind(c, err);
    if (rc) return rc;
    if (mode == G_CAPTURE) {
        cudaGraph_t last = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &last);
        if (e == cudaSuccess && last) c->g_parts[c->g_nparts++] = last;
        bool ok = !failed && e == cudaSuccess && !c->g_broken;
        cudaError_t ie = cudaSuccess;
        for (int i = 0; i < c->g_nparts; i++) { /* instantiate the segments */
            if (ok && ie == cudaSuccess) {
                ie = cudaGraphInstantiate(&g->seg[i], c->g_parts[i], 0);
                if (ie == cudaSuccess) g->n_seg = i + 1;
            }
            cudaGraphDestroy(c->g_parts[i]);
        }
        c->g_nparts = 0;
        cudaGetLastError();
        if (!ok || ie != cudaSuccess) {
            const int n_seg = g->n_seg;
            for (int i = 0; i < n_seg; i++) cudaGraphExecDestroy(g->seg[i]);
            g->n_seg = 0;
            g->n_sig = g->n_arg = 0;
            if (failed) return EMBER_OK;
            g->fails = ie != cudaSuccess ? 3 : g->fails + 1; /* an instantiation failure: never again for this key */
            c->n_again++;
            c->g_next_plain = true;
            *again = true;
            if (ie != cudaSuccess)
                ember_log(&c->base.log, EMBER_LOG_WARN, "cuda: a step graph could not be instantiated: %s",
                          cudaGetErrorString(ie));
            return EMBER_OK;
        }
        c->n_captured++;
        c->g_seg = 0; /* nothing ran yet: every segment below */
        c->g_sent = 0;
    } else {
        if (c->g_seg > 0) /* segments already launched: let them finish before anything else is enqueued */
            CU_TRY(cudaStreamSynchronize(c->stream), "running a step graph");
        if (c->g_err != cudaSuccess) return cuda_fail(err, c->g_err, "launching a step graph");
        if (failed) return EMBER_OK;
        if (c->g_diverged || c->g_sig != g->n_sig || c->g_arg != g->n_arg) {
            /* another step's launches: capture this one anew (a graph that diverges right
               after its capture counts as a failure of the key). Segments that ran
               computed a prefix of this same step, which the next pass computes again
               from its inputs, writing the same values. */
            int fails = g->replays < 2 ? g->fails + 1 : 0;
            ember_step_key k = g->key;
            graph_drop(g);
            g->key = k;
            g->valid = true;
            g->fails = fails;
            g->used = ++c->g_clock;
            c->n_again++;
            *again = true;
            return EMBER_OK;
        }
        g->replays++;
        c->n_replayed++;
    }
    for (int k = c->g_seg; k < g->n_seg; k++) CU_TRY(seg_launch(c, g, k), "launching a step graph");
    CU_TRY(cudaStreamSynchronize(c->stream), "running a step graph");
    for (int i = 0; i < c->n_gouts; i++) memcpy(c->gouts[i].dst, c->go_host + c->gouts[i].off, c->gouts[i].n);
    c->n_gouts = 0;
    return EMBER_OK;
}

void ember_cuda_graph_stats(const ember_backend *be, long *captured, long *replayed, long *again) {
    *captured = *replayed = *again = 0;
    if (!be || be->ops != &k_cuda_ops) return;
    const cuda_backend *c = be->impl;
    *captured = c->n_captured;
    *replayed = c->n_replayed;
    *again = c->n_again;
}

long ember_cuda_qfuse_count(const ember_backend *be) {
    if (!be || be->ops != &k_cuda_ops) return 0;
    return ((const cuda_backend *)be->impl)->n_qfused;
}


/* Copies n host arrays (part[i], bytes[i]) to device memory on the stream;
   *out[i] receives where array i will be when the ops after this run.

   The area is ARG_SLOTS slots, each holding one argument set and a host copy
   of its bytes. A set equal to one a slot holds is not copied again (the
   layers of a forward pass send the same positions and block tables); else
   the least recently used slot takes it. Overwriting a slot that queued
   kernels still read is safe: the copy is ordered after them on the stream.
   The host bytes are copied from the slot's own host copy, which stays
   unchanged until that slot is taken again. */
static int upload_args(cuda_backend *c, int n, const void *const *part, const size_t *bytes, void **out,
                       ember_error *err) {
    if (c->gmode != G_OFF) return upload_graph(c, n, part, bytes, out, err);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t padded = (bytes[i] + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1);
        if (padded < bytes[i] || !ember_add_ok(total, padded, &total))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda: op arguments too large");
    }
    if (total > c->bounce_cap) {
        unsigned char *h = ember_malloc(total);
        if (!h) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of op arguments", total);
        free(c->bounce);
        c->bounce = h;
        c->bounce_cap = total;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t padded = (bytes[i] + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1);
        if (bytes[i]) memcpy(c->bounce + o, part[i], bytes[i]);
        memset(c->bounce + o + bytes[i], 0, padded - bytes[i]);
        o += padded;
    }
    arg_slot *hit = NULL, *old = &c->slots[0];
    for (int i = 0; i < ARG_SLOTS && !hit; i++) {
        arg_slot *sl = &c->slots[i];
        if (sl->len == total && sl->dev && (total == 0 || !memcmp(sl->host, c->bounce, total))) hit = sl;
        if (sl->used < old->used) old = sl;
    }
    if (!hit) {
        hit = old;
        if (total > hit->cap) {
            size_t cap = hit->cap ? hit->cap : 4096;
            while (cap < total) cap *= 2;
            unsigned char *h = ember_malloc(cap);
            if (!h) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of op arguments", cap);
            /* kernels queued earlier may still read the old memory */
            cudaError_t e = cudaStreamSynchronize(c->stream);
            if (e == cudaSuccess && hit->dev) e = cudaFree(hit->dev);
            if (e == cudaSuccess) hit->dev = NULL;
            if (e == cudaSuccess) e = cudaMalloc(&hit->dev, cap);
            if (e != cudaSuccess) {
                free(h);
                hit->dev = NULL;
                hit->cap = hit->len = 0;
                return cuda_fail(err, e, "growing the argument area");
            }
            free(hit->host);
            hit->host = h;
            hit->cap = cap;
        }
        hit->len = total;
        memcpy(hit->host, c->bounce, total);
        if (total) {
            cudaError_t e = cudaMemcpyAsync(hit->dev, hit->host, total, cudaMemcpyHostToDevice, c->stream);
            if (e != cudaSuccess) {
                hit->len = 0;
                return cuda_fail(err, e, "copying op arguments");
            }
        }
    }
    hit->used = ++c->arg_clock;
    o = 0;
    for (int i = 0; i < n; i++) {
        out[i] = (char *)hit->dev + o;
        o += (bytes[i] + ARG_ALIGN - 1) & ~(size_t)(ARG_ALIGN - 1);
    }
    return EMBER_OK;
}

/* ---- shape checks ------------------------------------------------------------------------ */

static int need_f32(const ember_backend *be, const ember_tensor *t, const char *op, const char *what,
                    ember_error *err) {
    int rc = check_tensor(be, t, op, what, err);
    if (rc) return rc;
    if (t->dtype != EMBER_F32)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s must be an f32 tensor", op, what);
    if ((uintptr_t)dev(t) & 3u)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s is not 4-byte aligned", op, what);
    return EMBER_OK;
}

/* EMBER_CU_* for a float dtype, -1 otherwise. */
static int cu_dtype(ember_dtype d) {
    return d == EMBER_F32 ? EMBER_CU_F32 : d == EMBER_F16 ? EMBER_CU_F16 : d == EMBER_BF16 ? EMBER_CU_BF16 : -1;
}

/* EMBER_CU_Q* for a quantized dtype the kernels take, -1 otherwise. */
static int cu_qtype(ember_dtype d) {
    switch (d) {
    case EMBER_Q8_0: return EMBER_CU_Q8_0;
    case EMBER_Q4_0: return EMBER_CU_Q4_0;
    case EMBER_Q5_0: return EMBER_CU_Q5_0;
    case EMBER_Q4_K: return EMBER_CU_Q4_K;
    case EMBER_Q5_K: return EMBER_CU_Q5_K;
    case EMBER_Q6_K: return EMBER_CU_Q6_K;
    default: return -1;
    }
}

/* true for an MLX affine dtype (cuda_mlx.cu); then *bits and *G. */
static bool cu_mlx(ember_dtype d, int *bits, int *G) {
    return ember_dtype_mlx_params(d, bits, G);
}

/* The error for a weight dtype this backend has no kernels for yet. */
static int unsupported_weight(ember_dtype d, const char *op, ember_error *err) {
    return ember_err(err, EMBER_ERR_UNSUPPORTED,
                     "%s on CUDA: %s weights are not supported yet (f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q5_k, "
                     "q6_k and the mlx types are)",
                     op, ember_dtype_get(d)->name);
}

/* ---- ops --------------------------------------------------------------------------------- */

static int launched(cuda_backend *c, cudaError_t e, const char *op, ember_error *err) {
    if (e != cudaSuccess) return cuda_fail(err, e, op);
    prof_mark(c, op);
    return EMBER_OK;
}

static int cuda_get_rows(ember_backend *be, ember_tensor *dst, const ember_tensor *src, const int32_t *ids, int n,
                         ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, dst, "get_rows", "dst", err)) || (rc = check_tensor(be, src, "get_rows", "src", err)))
        return rc;
    if (src->ndim != 2) return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: src must be a 2-D tensor");
    int dt = cu_dtype(src->dtype), qt = cu_qtype(src->dtype), mb = 0, mg = 0;
    const bool mlx = cu_mlx(src->dtype, &mb, &mg);
    if (dt < 0 && qt < 0 && !mlx) return unsupported_weight(src->dtype, "get_rows", err);
    int64_t D = src->shape[1], R = src->shape[0];
    if (n < 0 || ember_tensor_row_len(dst) != D || ember_tensor_rows(dst) < n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: dst shape does not fit %d rows of %lld", n,
                         (long long)D);
    if ((qt >= 0 || mlx) && D % (int64_t)ember_dtype_get(src->dtype)->block_elems)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: rows of %lld are not whole %s blocks", (long long)D,
                         ember_dtype_get(src->dtype)->name);
    if ((uintptr_t)dev(src) % (dt == EMBER_CU_F32 || mlx ? 4u : 2u))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: src is not aligned to its element size");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= R)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "token id %d is outside the vocabulary [0, %lld)", ids[i],
                             (long long)R);
    if (n == 0 || D == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    const void *part[1] = {ids};
    size_t bytes[1] = {(size_t)n * sizeof *ids};
    void *d_ids;
    if ((rc = upload_args(c, 1, part, bytes, &d_ids, err))) return rc;
    const uint64_t sg[] = {1, P(dev(dst)), P(dev(src)), (uint64_t)(mlx ? 100 + (int)src->dtype : qt >= 0 ? qt : dt),
                           P(d_ids), (uint64_t)n, (uint64_t)D};
    if (g_skip(c, sg, 7)) return EMBER_OK;
    if (mlx) {
        size_t row = (size_t)(D / mg) * ember_dtype_get(src->dtype)->block_bytes;
        return launched(c, ember_cu_mlx_get_rows(c->stream, dev(dst), dev(src), mb, mg, row, d_ids, n, D), "get_rows",
                        err);
    }
    if (qt >= 0) {
        size_t row = (size_t)(D / (int64_t)ember_dtype_get(src->dtype)->block_elems) *
                     ember_dtype_get(src->dtype)->block_bytes;
        return launched(c, ember_cu_qget_rows(c->stream, dev(dst), dev(src), qt, row, d_ids, n, D), "get_rows", err);
    }
    return launched(c, ember_cu_get_rows(c->stream, dev(dst), dev(src), dt, d_ids, n, D), "get_rows", err);
}

/* ---- quantized inputs ----------------------------------------------------------------------
 *
 * A quantized product reads its input quantized (cuda_qact.cuh) from the
 * scratch c->qact: the 32-element types' layout at 0, the 256-element
 * types' at the offset qact_need gives. The matmul quantizes the input there
 * with launches of its own, unless c->qf says the scratch already holds it:
 * written beside the input by the op that produced it (rms_norm,
 * add_rms_norm, swiglu, geglu; inputs of at most c->qfuse rows, 1 unless
 * EMBER_CUDA_QFUSE=N says N <= EMBER_CU_QFUSE_MAX_M: on an H200 it measured
 * 1-3% faster at one row, and at 8 rows 2.5-5% faster for Llama-3.2-1B but
 * 5% slower for Llama-3.1-8B q4_0, not understood yet;
 * in the kinds the quantized products of that row length took before,
 * c->qseen), or by an earlier matmul of the same input. c->qf holds only
 * while nothing else has launched or written since (c->seq counts every
 * launch, write and allocation). The host decides this the same way when a
 * step is captured and when it is replayed (g_skip counts in both), so a
 * replay launches what its capture did. The bytes are the same either way:
 * the same device functions on the same f32 values. EMBER_CUDA_QFUSE=0 (a
 * measuring aid) keeps the matmul's own launches, one per matmul.
 */
enum { QK_32 = 1, QK_256 = 2 };

/* Bytes of the scratch for M rows of K (both layouts where K allows them);
   *off256: where the 256-element layout starts. */
static size_t qact_need(int M, int K, size_t *off256) {
    const size_t b32 = K % 32 == 0 ? ember_cu_qact_bytes(EMBER_CU_Q8_0, M, K) : 0;
    *off256 = (b32 + 255) & ~(size_t)255;
    return *off256 + (K % 256 == 0 ? ember_cu_qact_bytes(EMBER_CU_Q4_K, M, K) : 0);
}

/* The kinds the quantized products of row length K took (0: none yet). */
static unsigned qseen_get(const cuda_backend *c, int K) {
    for (int i = 0; i < 8; i++)
        if (c->qseen[i].kinds && c->qseen[i].K == K) return c->qseen[i].kinds;
    return 0;
}

/* Adds kinds to row length K's, which becomes the newest (the oldest of 8 drops). */
static void qseen_add(cuda_backend *c, int K, unsigned kinds) {
    int i = 0;
    while (i < 7 && !(c->qseen[i].kinds && c->qseen[i].K == K)) i++;
    const unsigned old = c->qseen[i].kinds && c->qseen[i].K == K ? c->qseen[i].kinds : 0;
    memmove(&c->qseen[1], &c->qseen[0], (size_t)i * sizeof c->qseen[0]);
    c->qseen[0].K = K;
    c->qseen[0].kinds = old | kinds;
}

/* The kinds of quantized form an op writing M rows of D adds, and where (q),
   or 0: none (not wanted, too many rows, or the scratch too small: the
   matmul grows it and quantizes itself). */
static unsigned qfuse_plan(cuda_backend *c, int64_t M, int64_t D, ember_cu_qout *q) {
    q->act32 = q->act256 = NULL;
    if (M < 1 || M > c->qfuse || M > EMBER_CU_QFUSE_MAX_M || D < 1 || D > INT32_MAX) return 0;
    unsigned k = qseen_get(c, (int)D);
    if (D % 32) k &= ~(unsigned)QK_32;
    if (D % 256) k &= ~(unsigned)QK_256;
    size_t off256;
    if (!k || !c->qact || qact_need((int)M, (int)D, &off256) > c->qact_cap) return 0;
    if (k & QK_32) q->act32 = c->qact;
    if (k & QK_256) q->act256 = (char *)c->qact + off256;
    return k;
}

/* After an op launched (or, in a replay, skipped) the launch that left x
   [M, K] quantized in the scratch in these kinds: the next matmul of x may
   use them. */
static void qf_set(cuda_backend *c, const void *x, int64_t M, int64_t K, unsigned kinds) {
    c->qf.src = kinds && c->qfuse ? x : NULL;
    c->qf.M = (int)M;
    c->qf.K = (int)K;
    c->qf.kinds = kinds;
    c->qf.seq = c->seq;
}

/* The kinds the scratch holds x in, now (0: none). */
static unsigned qf_have(const cuda_backend *c, const ember_tensor *x) {
    return c->qf.src && c->qf.src == dev(x) && c->qf.seq == c->seq && c->qf.M == ember_tensor_rows(x) &&
                   c->qf.K == ember_tensor_row_len(x)
               ? c->qf.kinds
               : 0;
}

/* Whether an output of the n products overlaps x's bytes. */
static bool outs_touch(const ember_tensor *x, int n, const ember_matmul *mm) {
    const char *x0 = dev(x), *x1 = x0 + (size_t)ember_tensor_nelem(x) * sizeof(float);
    for (int i = 0; i < n; i++) {
        const char *o0 = dev(mm[i].out), *o1 = o0 + (size_t)ember_tensor_nelem(mm[i].out) * sizeof(float);
        if (o0 < x1 && x0 < o1) return true;
    }
    return false;
}

static int cuda_rms_norm(ember_backend *be, ember_tensor *dst, const ember_tensor *x, const ember_tensor *w,
                         float eps, bool plus_one, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, dst, "rms_norm", "dst", err)) || (rc = need_f32(be, x, "rms_norm", "x", err)) ||
        (rc = need_f32(be, w, "rms_norm", "weight", err)))
        return rc;
    int64_t D = ember_tensor_row_len(x);
    if (ember_tensor_nelem(w) != D || ember_tensor_nelem(dst) != ember_tensor_nelem(x) || D > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "rms_norm: shapes do not match");
    if ((rc = bind(c, err))) return rc;
    const int64_t M = ember_tensor_rows(x);
    ember_cu_qout q;
    const unsigned qk = qfuse_plan(c, M, D, &q);
    const uint64_t sg[] = {2, P(dev(dst)), P(dev(x)), P(dev(w)), (uint64_t)M, (uint64_t)D, fbits(eps), plus_one,
                           P(q.act32), P(q.act256)};
    if (!g_skip(c, sg, 10) &&
        (rc = launched(c, ember_cu_rms_norm(c->stream, dev(dst), dev(x), dev(w), M, D, eps, plus_one, qk ? &q : NULL),
                       "rms_norm", err)))
        return rc;
    qf_set(c, dev(dst), M, D, qk);
    return EMBER_OK;
}

/* The launch form of a checked product. */
static ember_cu_mm_prod cu_prod(const ember_matmul *m) {
    return (ember_cu_mm_prod){.w = dev(m->w), .out = dev(m->out), .bias = m->bias ? dev(m->bias) : NULL,
                              .N = (int)m->w->shape[0]};
}

/* Appends the n products' launch parameters to a step-graph signature at sg + *ns. */
static void sig_prods(uint64_t *sg, int *ns, const ember_cu_mm_prod *p, int n) {
    for (int i = 0; i < n; i++) {
        sg[(*ns)++] = P(p[i].w);
        sg[(*ns)++] = P(p[i].out);
        sg[(*ns)++] = P(p[i].bias);
        sg[(*ns)++] = (uint64_t)p[i].N;
    }
}

/* Replaces the device scratch *p (*cap bytes) by one of at least need
   bytes (a quarter more), after the queued kernels that may use it; the
   step graphs, which point at the old one, are dropped. Inside a captured
   or replayed step it cannot (g_cannot): *skip is set, nothing changes,
   and the caller returns at once. On failure *p is NULL, *cap 0 and the
   error returned. */
static int scratch_grow(cuda_backend *c, void **p, size_t *cap, size_t need, const char *what, bool *skip,
                        ember_error *err) {
    *skip = g_cannot(c);
    if (*skip) return EMBER_OK;
    graphs_clear(c);
    CU_TRY(cudaStreamSynchronize(c->stream), what);
    if (*p) CU_TRY(cudaFree(*p), what);
    *p = NULL;
    *cap = 0;
    const size_t want = need + need / 4;
    cudaError_t e = cudaMalloc(p, want);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        *p = NULL;
        return cuda_fail(err, e, what);
    }
    *cap = want;
    return EMBER_OK;
}

/* true where an MLX product of M rows reads the 32-element types' quantized
   input (c->qact): its layout is the MLX kernel's (row-major below 9 rows,
   A32T tiles from 9 with the tensor-core kernel); else (EMBER_CUDA_MLXTC=0
   from 9 rows) mlx_matmul quantizes row-major into its own scratch. */
static bool mlx_in_q(int M, ember_dtype d) {
    return cu_mlx(d, NULL, NULL) && (M < 9 || ember_cu_mlx_tc(M));
}

/* The MLX products among mm (those `pick` selects for M rows) against act
   (the input as ember_cu_mlx_matmul wants it): one launch per MLX dtype,
   its products in order. */
static int mlx_launches(cuda_backend *c, const void *act, int M, int K, int n, const ember_matmul *mm,
                        bool (*pick)(int, ember_dtype), ember_error *err) {
    bool done[EMBER_CU_MAX_MM] = {false};
    for (int i = 0; i < n; i++) {
        int bits, G;
        if (done[i] || !pick(M, mm[i].w->dtype) || !cu_mlx(mm[i].w->dtype, &bits, &G)) continue;
        const ember_dtype d = mm[i].w->dtype;
        ember_cu_qmm a = {.act = act, .M = M, .K = K, .qtype = 0, .n = 0, .early = 0};
        int64_t Nt = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && mm[j].w->dtype == d) {
                done[j] = true;
                a.p[a.n++] = cu_prod(&mm[j]);
                Nt += mm[j].w->shape[0];
            }
        char name[64] = "matmul";
        if (c->prof)
            snprintf(name, sizeof name, "matmul %s M=%d N=%lld K=%d", ember_dtype_get(d)->name, M, (long long)Nt, K);
        uint64_t sg[6 + 4 * EMBER_CU_MAX_MM] = {23, P(act), (uint64_t)M, (uint64_t)K, (uint64_t)ember_cu_mlx_tc(M),
                                                (uint64_t)d};
        int ns = 6;
        sig_prods(sg, &ns, a.p, a.n);
        if (g_skip(c, sg, ns)) continue;
        int rc = launched(c, ember_cu_mlx_matmul(c->stream, &a, bits, G), name, err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

/* The quantized products of a checked matmul (cuda_matmul): one launch per
   weight type, products in order inside it, after the input is quantized
   once per activation kind (the 32-element types share one, the K types
   another) into c->qact. MLX products (mlx_in_q) share the 32-element
   types' input: one launch per MLX dtype after theirs. */
static int qmatmul(cuda_backend *c, const ember_tensor *x, int n, const ember_matmul *mm, ember_error *err) {
    const int M = (int)ember_tensor_rows(x), K = (int)ember_tensor_row_len(x);
    size_t need = 0, off256 = 0;
    bool any32 = false, any256 = false;
    int64_t rows[EMBER_CU_Q6_K + 1] = {0}, prods[EMBER_CU_Q6_K + 1] = {0};
    bool anymlx = false;
    for (int i = 0; i < n; i++) {
        int qt = cu_qtype(mm[i].w->dtype);
        if (qt < 0) {
            anymlx |= mlx_in_q(M, mm[i].w->dtype);
            continue;
        }
        bool k256 = ember_cu_q256(qt);
        any256 |= k256;
        any32 |= !k256;
        rows[qt] += mm[i].w->shape[0];
        prods[qt]++;
    }
    any32 |= anymlx;
    if (!any32 && !any256) return EMBER_OK;
    const unsigned want = (any32 ? QK_32 : 0) | (any256 ? QK_256 : 0);
    unsigned have = qf_have(c, x);
    qseen_add(c, K, want);
    for (int qt = EMBER_CU_Q8_0; qt <= EMBER_CU_Q6_K; qt++) /* a launch's blocks of 8 rows (or 16) fit its grid */
        if ((rows[qt] + 7) / 8 + prods[qt] > 65535)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %lld quantized output rows of one type (at most %lld)",
                             (long long)rows[qt], (long long)(8 * (65535 - prods[qt])));
    need = qact_need(M, K, &off256);
    int rc;
    if (need > c->qact_cap) {
        have = 0;
        c->qf.src = NULL; /* the scratch is replaced */
        bool skip;
        if ((rc = scratch_grow(c, &c->qact, &c->qact_cap, need, "quantized matmul scratch", &skip, err)) || skip)
            return rc;
    }
    for (int kind = 0; kind < 2; kind++) {
        if (!(kind ? any256 : any32)) continue;
        const int qa = kind ? EMBER_CU_Q4_K : EMBER_CU_Q8_0;
        void *act = (char *)c->qact + (kind ? off256 : 0);
        const uint64_t sa[] = {20, P(dev(x)), P(act), (uint64_t)M, (uint64_t)K, (uint64_t)kind,
                               (uint64_t)ember_cu_qktc};
        if (have & (kind ? QK_256 : QK_32)) c->n_qfused++;
        else if (!g_skip(c, sa, 7) &&
            (rc = launched(c, ember_cu_qact(c->stream, qa, dev(x), act, M, K), "matmul: quantize input", err))) {
            c->qf.src = NULL;
            return rc;
        }
        for (int qt = EMBER_CU_Q8_0; qt <= EMBER_CU_Q6_K; qt++) {
            bool k256 = ember_cu_q256(qt);
            if (k256 != (kind == 1)) continue;
            ember_cu_qmm a = {.act = act, .M = M, .K = K, .qtype = qt, .n = 0, .early = c->mm_early};
            int64_t Nt = 0;
            ember_dtype qd = EMBER_F32;
            for (int i = 0; i < n; i++) {
                if (cu_qtype(mm[i].w->dtype) != qt) continue;
                qd = mm[i].w->dtype;
                a.p[a.n++] = cu_prod(&mm[i]);
                Nt += mm[i].w->shape[0];
                if (mm[i].w->prep != &k_weight_mark) a.early = 0;
            }
            if (!a.n) continue;
            char name[64] = "matmul";
            if (c->prof)
                snprintf(name, sizeof name, "matmul %s M=%d N=%lld K=%d", ember_dtype_get(qd)->name, M,
                         (long long)Nt, K);
            uint64_t sg[8 + 4 * EMBER_CU_MAX_MM] = {21, P(act), (uint64_t)M, (uint64_t)K, (uint64_t)qt,
                                                    (uint64_t)ember_cu_qmv, (uint64_t)ember_cu_qld16,
                                                    (uint64_t)ember_cu_qktc};
            int ns = 8;
            sig_prods(sg, &ns, a.p, a.n);
            if (g_skip(c, sg, ns)) continue;
            if ((rc = launched(c, ember_cu_qmatmul(c->stream, &a), name, err))) {
                c->qf.src = NULL;
                return rc;
            }
        }
        if (kind == 0 && anymlx && (rc = mlx_launches(c, act, M, K, n, mm, mlx_in_q, err))) {
            c->qf.src = NULL;
            return rc;
        }
    }
    /* the scratch holds x quantized in these kinds, for a next matmul of x */
    if (outs_touch(x, n, mm)) c->qf.src = NULL;
    else qf_set(c, dev(x), M, K, have | want);
    return EMBER_OK;
}

/* true for an MLX product that does not take qmatmul's input (mlx_in_q). */
static bool mlx_own(int M, ember_dtype d) {
    return cu_mlx(d, NULL, NULL) && !mlx_in_q(M, d);
}

/* The MLX products of a checked matmul that qmatmul does not take (from 9
   rows with EMBER_CUDA_MLXTC=0, the measuring aid's dp4a kernel there): the
   input quantized once, row-major, into c->mlx_act (grown on demand), then
   one launch per MLX dtype. */
static int mlx_matmul(cuda_backend *c, const ember_tensor *x, int n, const ember_matmul *mm, ember_error *err) {
    const int M = (int)ember_tensor_rows(x), K = (int)ember_tensor_row_len(x);
    bool any = false;
    for (int i = 0; i < n; i++) any |= mlx_own(M, mm[i].w->dtype);
    if (!any) return EMBER_OK;
    if (M > 65535 * 8)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %d rows against MLX weights (at most %d)", M, 65535 * 8);
    size_t need;
    if (!ember_mul_ok((size_t)M * (size_t)(K / 32), 48, &need))
        return ember_err(err, EMBER_ERR_NOMEM, "matmul: MLX input scratch size overflows");
    int rc;
    bool skip = false;
    if (need > c->mlx_act_cap &&
        ((rc = scratch_grow(c, &c->mlx_act, &c->mlx_act_cap, need, "MLX matmul scratch", &skip, err)) || skip))
        return rc;
    const uint64_t sa[] = {22, P(dev(x)), P(c->mlx_act), (uint64_t)M, (uint64_t)K};
    if (!g_skip(c, sa, 5) &&
        (rc = launched(c, ember_cu_qact32_rows(c->stream, dev(x), c->mlx_act, M, K), "matmul: quantize input", err)))
        return rc;
    return mlx_launches(c, c->mlx_act, M, K, n, mm, mlx_own, err);
}

static int cuda_matmul(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc = need_f32(be, x, "matmul", "x", err);
    if (rc) return rc;
    if (n < 1 || n > EMBER_CU_MAX_MM)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %d products (1..%d allowed)", n, EMBER_CU_MAX_MM);
    int64_t K = ember_tensor_row_len(x), M = ember_tensor_rows(x);
    if (K > INT32_MAX || M > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: input too large");
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const ember_matmul *m = &mm[i];
        if ((rc = need_f32(be, m->out, "matmul", "out", err)) ||
            (rc = check_tensor(be, m->w, "matmul", "weight", err)))
            return rc;
        if (m->w->ndim != 2 || m->w->shape[1] != K)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: weight must be a 2-D [N, %lld] tensor",
                             (long long)K);
        int dt = cu_dtype(m->w->dtype), qt = cu_qtype(m->w->dtype);
        const bool mlx = cu_mlx(m->w->dtype, NULL, NULL);
        if (dt < 0 && qt < 0 && !mlx) return unsupported_weight(m->w->dtype, "matmul", err);
        if ((qt >= 0 || mlx) && K % (int64_t)ember_dtype_get(m->w->dtype)->block_elems)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: K = %lld is not a whole number of %s blocks",
                             (long long)K, ember_dtype_get(m->w->dtype)->name);
        if ((uintptr_t)dev(m->w) % (dt == EMBER_CU_F32 || mlx ? 4u : 2u))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: weight is not aligned to its element size");
        int64_t N = m->w->shape[0];
        if (ember_tensor_row_len(m->out) != N || ember_tensor_rows(m->out) != M)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output shape is not [%lld, %lld]", (long long)M,
                             (long long)N);
        if (m->bias && ((rc = need_f32(be, m->bias, "matmul", "bias", err)) || ember_tensor_nelem(m->bias) != N))
            return rc ? rc : ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: bias must be f32 [%lld]", (long long)N);
        total += N;
    }
    if (total > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output too large");
    if (M == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    /* the float launches below leave a quantized x in the scratch as it is (section "quantized inputs") */
    const bool keep = qf_have(c, x) && !outs_touch(x, n, mm);
    /* one launch per weight dtype; products keep their order inside it */
    for (int dt = EMBER_CU_F32; dt <= EMBER_CU_BF16; dt++) {
        ember_cu_mm a = {.x = dev(x), .M = (int)M, .K = (int)K, .dtype = dt, .n = 0, .early = c->mm_early};
        for (int i = 0; i < n; i++) {
            if (cu_dtype(mm[i].w->dtype) != dt) continue;
            a.p[a.n++] = cu_prod(&mm[i]);
            if (mm[i].w->prep != &k_weight_mark) a.early = 0;
        }
        char name[64] = "matmul";
        if (c->prof) {
            int64_t Nt = 0;
            for (int i = 0; i < a.n; i++) Nt += a.p[i].N;
            snprintf(name, sizeof name, "matmul %s M=%lld N=%lld K=%lld",
                     dt == EMBER_CU_F32 ? "f32" : dt == EMBER_CU_F16 ? "f16" : "bf16", (long long)M, (long long)Nt,
                     (long long)K);
        }
        if (!a.n) continue;
        uint64_t sg[8 + 4 * EMBER_CU_MAX_MM] = {3, P(a.x), (uint64_t)M, (uint64_t)K, (uint64_t)dt,
                                                 (uint64_t)ember_cu_mm_cluster, (uint64_t)ember_cu_mm_blk_min,
                                                 (uint64_t)ember_cu_mm_wg_min};
        int ns = 8;
        sig_prods(sg, &ns, a.p, a.n);
        if (g_skip(c, sg, ns)) continue;
        if ((rc = launched(c, ember_cu_matmul(c->stream, &a), name, err))) return rc;
    }
    /* the MLX launches write only their outputs and their own scratch: a quantized x stays as well */
    if ((rc = mlx_matmul(c, x, n, mm, err))) return rc;
    if (keep) c->qf.seq = c->seq;
    return qmatmul(c, x, n, mm, err);
}

/* The checks of rope's x (f32 [T, H, D]) and r; *T, *H, *D on success. */
static int rope_check(ember_backend *be, const ember_tensor *x, const ember_rope *r, const char *op, int *T, int *H,
                      int *D, ember_error *err) {
    int rc = need_f32(be, x, op, "x", err);
    if (rc) return rc;
    if (x->ndim != 3) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: x must be [T, H, D]", op);
    if (x->shape[0] > INT32_MAX || x->shape[1] > INT32_MAX || x->shape[2] > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: x too large", op);
    *T = (int)x->shape[0], *H = (int)x->shape[1], *D = (int)x->shape[2];
    if (r->n_rot < 2 || r->n_rot % 2 || r->n_rot > *D || r->n_rot > 1024)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %d rotated dims for head size %d", op, r->n_rot, *D);
    if (r->mode != EMBER_ROPE_NEOX && r->mode != EMBER_ROPE_INTERLEAVED)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: unknown mode %d", op, (int)r->mode);
    return EMBER_OK;
}

static int cuda_rope(ember_backend *be, ember_tensor *x, const int32_t *pos, const ember_rope *r, ember_error *err) {
    cuda_backend *c = cu(be);
    int T, H, D;
    int rc = rope_check(be, x, r, "rope", &T, &H, &D, err);
    if (rc) return rc;
    if (T == 0 || H == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    const void *part[2] = {pos, r->inv_freq};
    size_t bytes[2] = {(size_t)T * sizeof *pos, (size_t)(r->n_rot / 2) * sizeof *r->inv_freq};
    void *d[2];
    if ((rc = upload_args(c, 2, part, bytes, d, err))) return rc;
    const uint64_t sg[] = {4, P(dev(x)), P(d[0]), P(d[1]), (uint64_t)T, (uint64_t)H, (uint64_t)D, (uint64_t)r->n_rot,
                           (uint64_t)r->mode, fbits(r->attn_factor)};
    if (g_skip(c, sg, 10)) return EMBER_OK;
    return launched(c, ember_cu_rope(c->stream, dev(x), d[0], d[1], T, H, D, r->n_rot,
                                  r->mode == EMBER_ROPE_INTERLEAVED, r->attn_factor),
                    "rope", err);
}

/* x = x + h, then dst = rms_norm(x) (backend.h): one launch. */
static int cuda_add_rms_norm(ember_backend *be, ember_tensor *dst, ember_tensor *x, const ember_tensor *h,
                             const ember_tensor *w, float eps, bool plus_one, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, dst, "add_rms_norm", "dst", err)) || (rc = need_f32(be, x, "add_rms_norm", "x", err)) ||
        (rc = need_f32(be, h, "add_rms_norm", "h", err)) || (rc = need_f32(be, w, "add_rms_norm", "weight", err)))
        return rc;
    int64_t D = ember_tensor_row_len(x), n = ember_tensor_nelem(x);
    if (ember_tensor_nelem(w) != D || ember_tensor_nelem(dst) != n || ember_tensor_nelem(h) != n || D > INT32_MAX ||
        (dst->buf == x->buf && dst->offset == x->offset))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "add_rms_norm: shapes do not match (or dst is x)");
    if ((rc = bind(c, err))) return rc;
    const int64_t M = ember_tensor_rows(x);
    ember_cu_qout q;
    const unsigned qk = qfuse_plan(c, M, D, &q);
    const uint64_t sg[] = {5, P(dev(dst)), P(dev(x)), P(dev(h)), P(dev(w)), (uint64_t)M, (uint64_t)D, fbits(eps), plus_one,
                           P(q.act32), P(q.act256)};
    if (!g_skip(c, sg, 11) &&
        (rc = launched(c, ember_cu_add_rms_norm(c->stream, dev(dst), dev(x), dev(h), dev(w), M, D, eps, plus_one,
                                                qk ? &q : NULL),
                       "add_rms_norm", err)))
        return rc;
    qf_set(c, dev(dst), M, D, qk);
    return EMBER_OK;
}

/* ---- paged KV ---------------------------------------------------------------------------- */

/* EMBER_CU_* for a KV codec the kernels implement, -1 otherwise. */
static int cu_kv_enc(ember_kv_enc e) {
    return e == EMBER_KVE_F32 ? EMBER_CU_F32 : e == EMBER_KVE_F16 ? EMBER_CU_F16 : e == EMBER_KVE_BF16 ? EMBER_CU_BF16 : -1;
}

static const char *kv_enc_name(ember_kv_enc e) {
    switch (e) {
    case EMBER_KVE_F32: return "f32";
    case EMBER_KVE_F16: return "f16";
    case EMBER_KVE_BF16: return "bf16";
    case EMBER_KVE_Q8: return "q8";
    case EMBER_KVE_Q4: return "q4";
    case EMBER_KVE_TQ: return "tq";
    }
    return "unknown";
}

/* Checks map (already through ember_kv_map_check) for this backend, copies
   its tables to the argument area and fills *d. Only the block tables of
   rows that tokens use are sent (other rows get none). */
static int upload_map(cuda_backend *c, const ember_kv_map *map, int T, int H, int D, const char *op, ember_cu_kv *d,
                      ember_error *err) {
    int rc;
    if (map->n_views > 2) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %d pools per layer", op, map->n_views);
    memset(d, 0, sizeof *d);
    for (int i = 0; i < map->n_views; i++) {
        const ember_kv_layer *L = &map->views[i];
        if ((rc = check_tensor(&c->base, L->pool, op, "KV pool", err))) return rc;
        int ke = cu_kv_enc(L->k.enc), ve = cu_kv_enc(L->v.enc);
        if (ke < 0 || ve < 0)
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s on CUDA: the %s KV kind is not supported yet (f32, f16 and bf16 are)",
                             op, kv_enc_name(ke < 0 ? L->k.enc : L->v.enc));
        d->view[i] = (ember_cu_kv_view){dev(L->pool), L->block_bytes, L->k_off, L->v_off, L->k.head_bytes,
                                        L->v.head_bytes, ke, ve};
        if (((uintptr_t)dev(L->pool) | L->block_bytes | L->k_off | L->v_off | L->k.head_bytes | L->v.head_bytes) & 3u)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: KV layer view %d is not 4-byte aligned", op, i);
    }
    /* the tables of the rows in use */
    size_t nref = (size_t)map->n_refs, nblk = 0;
    if (nref > c->refs_cap) {
        ember_cu_kv_ref *r = ember_realloc(c->refs_h, nref * sizeof *r);
        if (!r) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", op);
        c->refs_h = r;
        c->refs_cap = nref;
    }
    for (size_t r = 0; r < nref; r++) c->refs_h[r] = (ember_cu_kv_ref){-1, 0, 0, 0};
    for (int t = 0; t < T; t++) {
        int r = map->row[t];
        if (c->refs_h[r].off >= 0) continue;
        const ember_kv_rowref *ref = &map->refs[r];
        if ((size_t)ref->n_blocks > (size_t)INT32_MAX - nblk)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: block tables too large", op);
        c->refs_h[r] = (ember_cu_kv_ref){(int32_t)nblk, ref->first, ref->n_blocks, ref->layer_set};
        nblk += (size_t)ref->n_blocks;
    }
    if (nblk > c->blocks_cap) {
        int32_t *b = ember_realloc(c->blocks_h, nblk * sizeof *b);
        if (!b) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", op);
        c->blocks_h = b;
        c->blocks_cap = nblk;
    }
    for (size_t r = 0; r < nref; r++) {
        if (c->refs_h[r].off < 0) {
            c->refs_h[r].off = 0;
            continue;
        }
        if (map->refs[r].n_blocks)
            memcpy(c->blocks_h + c->refs_h[r].off, map->refs[r].blocks, (size_t)map->refs[r].n_blocks * sizeof(int32_t));
    }
    const void *part[4] = {c->refs_h, c->blocks_h, map->row, map->pos};
    size_t bytes[4] = {nref * sizeof *c->refs_h, nblk * sizeof *c->blocks_h, (size_t)T * sizeof(int32_t),
                       (size_t)T * sizeof(int32_t)};
    void *dp[4];
    if ((rc = upload_args(c, 4, part, bytes, dp, err))) return rc;
    d->refs = dp[0];
    d->blocks = dp[1];
    d->row = dp[2];
    d->pos = dp[3];
    d->T = T;
    d->H = H;
    d->D = D;
    return EMBER_OK;
}

static int cuda_kv_rw(ember_backend *be, const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v,
                      bool write, ember_error *err) {
    cuda_backend *c = cu(be);
    const char *op = write ? "kv_write" : "kv_read";
    int rc;
    if ((rc = need_f32(be, k, op, "k", err)) || (rc = need_f32(be, v, op, "v", err))) return rc;
    int T, H, D;
    if ((rc = ember_kv_rw_check(map, k, v, op, &T, &H, &D, err))) return rc;
    if (T == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    ember_cu_kv d;
    if ((rc = upload_map(c, map, T, H, D, op, &d, err))) return rc;
    uint64_t sg[4 + 23] = {6, write, P(dev(k)), P(dev(v))};
    int ns = 4;
    sig_kv(sg, &ns, &d);
    if (g_skip(c, sg, ns)) return EMBER_OK;
    return launched(c, ember_cu_kv_rw(c->stream, &d, dev(k), dev(v), write), op, err);
}

static int cuda_kv_write(ember_backend *be, const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v,
                         ember_error *err) {
    return cuda_kv_rw(be, map, k, v, true, err);
}

static int cuda_kv_read(ember_backend *be, const ember_kv_map *map, ember_tensor *k, ember_tensor *v,
                        ember_error *err) {
    return cuda_kv_rw(be, map, k, v, false, err);
}

/* Checks x [>= n, V] for op and makes c->ids_dev hold n rows' ids,
   counters and argmax candidates of rows of V. *skip: inside a step
   capture that cannot grow them (the pass runs plainly next time). */
static int ids_room(cuda_backend *c, const ember_tensor *x, int n, const char *op, int64_t *V_out, bool *skip,
                    ember_error *err) {
    int rc = need_f32(&c->base, x, op, "x", err);
    *skip = false;
    if (rc) return rc;
    int64_t V = ember_tensor_row_len(x);
    *V_out = V;
    if (n < 0 || n > 65535 || ember_tensor_rows(x) < n || V > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %d rows of a [%lld, %lld] tensor", op, n,
                         (long long)ember_tensor_rows(x), (long long)V);
    if (n == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    /* ids [am_rows], counters [am_rows] (zero between launches), then the candidates */
    if (((size_t)n > c->am_rows || V > c->am_V) && g_cannot(c)) {
        *skip = true;
        return EMBER_OK;
    }
    if ((size_t)n > c->am_rows || V > c->am_V) {
        graphs_clear(c); /* they point at the old ids */
        size_t rows = (size_t)n > c->am_rows ? (size_t)n : c->am_rows;
        int64_t vv = V > c->am_V ? V : c->am_V;
        if (rows < 16) rows = 16;
        size_t bytes = rows * 2 * sizeof(int32_t) + ember_cu_argmax_cands((int)rows, vv) * 8;
        CU_TRY(cudaStreamSynchronize(c->stream), op); /* queued kernels may use the old one */
        if (c->ids_dev) CU_TRY(cudaFree(c->ids_dev), op);
        c->ids_dev = NULL;
        c->am_rows = 0;
        c->am_V = 0;
        CU_TRY(cudaMalloc((void **)&c->ids_dev, bytes), op);
        CU_TRY(cudaMemsetAsync(c->ids_dev, 0, bytes, c->stream), op);
        c->am_rows = rows;
        c->am_V = vv;
    }
    return EMBER_OK;
}

/* The n ids in c->ids_dev to out (host): inside a step through its staging. */
static int ids_out(cuda_backend *c, int32_t *out, int n, const char *what, ember_error *err) {
    if (c->gmode != G_OFF) return graph_out(c, out, c->ids_dev, (size_t)n * sizeof(int32_t), err);
    CU_TRY(cudaMemcpyAsync(out, c->ids_dev, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream), what);
    prof_mark(c, what);
    CU_TRY(cudaStreamSynchronize(c->stream), what);
    return EMBER_OK;
}

/* Greedy ids of n rows (backend.h): a block per row, then n ids read back. */
static int cuda_argmax_rows(ember_backend *be, const ember_tensor *x, int32_t *out, int n, ember_error *err) {
    cuda_backend *c = cu(be);
    int64_t V;
    bool skip;
    int rc = ids_room(c, x, n, "argmax_rows", &V, &skip, err);
    if (rc || n == 0 || skip) return rc;
    const uint64_t sg[] = {7, P(c->ids_dev), c->am_rows, P(dev(x)), (uint64_t)n, (uint64_t)V};
    if (!g_skip(c, sg, 6) &&
        (rc = launched(c, ember_cu_argmax(c->stream, c->ids_dev, (int *)(c->ids_dev + c->am_rows),
                                          c->ids_dev + 2 * c->am_rows, dev(x), n, V),
                       "argmax_rows", err)))
        return rc;
    return ids_out(c, out, n, "read (argmax ids)", err);
}

/* Device draws of n rows (backend.h): the rows' parameters go up with the
   step's arguments, a cluster of blocks per row draws (cuda_sample.cu), n
   ids come back. */
static int cuda_sample_rows(ember_backend *be, ember_tensor *x, const ember_draw *p, int32_t *out, int n,
                            ember_error *err) {
    cuda_backend *c = cu(be);
    if (ember_tensor_row_len(x) > EMBER_DRAW_MAX_IDS)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "sample_rows: rows of %lld values (%d at most)",
                         (long long)ember_tensor_row_len(x), EMBER_DRAW_MAX_IDS);
    int64_t V;
    bool skip;
    int rc = ids_room(c, x, n, "sample_rows", &V, &skip, err);
    if (rc || n == 0 || skip) return rc;
    const void *part[1] = {p};
    size_t bytes[1] = {(size_t)n * sizeof *p};
    void *d_p;
    if ((rc = upload_args(c, 1, part, bytes, &d_p, err))) return rc;
    const uint64_t sg[] = {8, P(c->ids_dev), P(dev(x)), P(d_p), (uint64_t)n, (uint64_t)V,
                           (uint64_t)ember_cu_sample_cluster};
    if (!g_skip(c, sg, 7) &&
        (rc = launched(c, ember_cu_sample(c->stream, c->ids_dev, dev(x), (const ember_draw *)d_p, n, V),
                       "sample_rows", err)))
        return rc;
    return ids_out(c, out, n, "read (drawn ids)", err);
}

/* rope(q), rope(k), kv_write(map, k, v) (backend.h): one launch, a block
   per token. */
static int cuda_rope_kv_write(ember_backend *be, ember_tensor *q, ember_tensor *k, const ember_tensor *v,
                              const int32_t *pos, const ember_rope *r, const ember_kv_map *map, ember_error *err) {
    cuda_backend *c = cu(be);
    int Tq, Hq, Dq, Tk, Hk, Dk, T, H, D, rc;
    if ((rc = rope_check(be, q, r, "rope_kv_write", &Tq, &Hq, &Dq, err)) ||
        (rc = rope_check(be, k, r, "rope_kv_write", &Tk, &Hk, &Dk, err)) ||
        (rc = need_f32(be, v, "rope_kv_write", "v", err)) ||
        (rc = ember_kv_rw_check(map, k, v, "rope_kv_write", &T, &H, &D, err)))
        return rc;
    if (Tq != T || Dq != D || Tk != T || Hk != H || Dk != D)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "rope_kv_write: q [%d, %d, %d] does not match k [%d, %d, %d]", Tq,
                         Hq, Dq, T, H, D);
    if (T == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    const void *part[2] = {pos, r->inv_freq};
    size_t bytes[2] = {(size_t)T * sizeof *pos, (size_t)(r->n_rot / 2) * sizeof *r->inv_freq};
    void *dp[2];
    ember_cu_kv d;
    if ((rc = upload_args(c, 2, part, bytes, dp, err)) || (rc = upload_map(c, map, T, H, D, "rope_kv_write", &d, err)))
        return rc;
    uint64_t sg[10 + 23] = {8, P(dev(q)), (uint64_t)Hq, P(dev(k)), P(dev(v)), P(dp[0]), P(dp[1]), (uint64_t)r->n_rot,
                            (uint64_t)r->mode, fbits(r->attn_factor)};
    int ns = 10;
    sig_kv(sg, &ns, &d);
    if (g_skip(c, sg, ns)) return EMBER_OK;
    return launched(c, ember_cu_rope_kv_write(c->stream, &d, dev(q), Hq, dev(k), dev(v), dp[0], dp[1], r->n_rot,
                                              r->mode == EMBER_ROPE_INTERLEAVED, r->attn_factor),
                    "rope_kv_write", err);
}

/* Tokens up to which attention runs split over spans when a token has
   more than one (decode over long contexts, up to SPLIT_TOKENS rows), and
   staged (shared memory) up to STAGED_TOKENS otherwise; more tokens run
   the fused kernel (prefill). Every kernel gives the same bits
   (cuda_attn.cu); this only chooses the faster. The split scratch is
   capped at SPLIT_MAX_FLOATS. */
#define STAGED_TOKENS 64
#define SPLIT_TOKENS 256
#define SPLIT_MAX_FLOATS ((size_t)64 << 20)

static int cuda_attention(ember_backend *be, ember_tensor *out, const ember_tensor *q, const ember_kv_map *map,
                          const ember_attn *a, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, out, "attention", "out", err)) || (rc = need_f32(be, q, "attention", "q", err))) return rc;
    if (q->ndim != 3 || out->ndim != 3 || out->shape[0] != q->shape[0] || out->shape[1] != q->shape[1] ||
        out->shape[2] != q->shape[2] || q->shape[0] > INT32_MAX / 1024 || q->shape[1] > 1024)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: q and out must both be [T, Hq, D]");
    int T = (int)q->shape[0], Hq = (int)q->shape[1], D = (int)q->shape[2];
    if (!map || !map->views || map->n_views < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: incomplete KV map");
    int Hkv = map->views[0].n_heads;
    if (Hkv < 1 || Hq % Hkv)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: %d query heads over %d KV heads", Hq, Hkv);
    if (D > EMBER_CU_ATTN_MAX_D)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "attention on CUDA: head size %d (at most %d)", D,
                         EMBER_CU_ATTN_MAX_D);
    if ((rc = ember_kv_map_check(map, T, Hkv, D, "attention", err))) return rc;
    for (int i = 0; i < map->n_views; i++) /* the kernels are built per codec: one for K and V of every view */
        if (map->views[i].k.enc != map->views[0].k.enc || map->views[i].v.enc != map->views[0].k.enc)
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "attention on CUDA: K and V in different codecs");
    int max_span = 1;
    for (int t = 0; t < T; t++) { /* every key of the window must be there */
        int p = map->pos[t], lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        if ((rc = ember_kv_map_check_blocks(map, map->row[t], lo, p, "attention", err))) return rc;
        int ns = p / EMBER_CU_ATTN_SPAN - lo / EMBER_CU_ATTN_SPAN + 1;
        if (ns > max_span) max_span = ns;
    }
    if (T == 0) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    const int units = T * Hq;
    int n_span = 0, mode = T <= STAGED_TOKENS ? EMBER_CU_ATTN_STAGED : EMBER_CU_ATTN_FUSED;
    size_t need = (size_t)units * (size_t)max_span * (size_t)(2 + D);
    if (T <= SPLIT_TOKENS && max_span > 1 && units <= 65535 && need <= SPLIT_MAX_FLOATS) {
        if ((need > c->parts_cap || (size_t)units > c->count_cap) && g_cannot(c)) return EMBER_OK;
        if (need > c->parts_cap || (size_t)units > c->count_cap) {
            graphs_clear(c); /* they point at the old scratch */
            size_t np = need > c->parts_cap ? need : c->parts_cap;
            size_t nc = (size_t)units > c->count_cap ? (size_t)units : c->count_cap;
            if (nc < 1024) nc = 1024;
            CU_TRY(cudaStreamSynchronize(c->stream), "attention scratch"); /* queued kernels may use it */
            if (c->parts) CU_TRY(cudaFree(c->parts), "attention scratch");
            if (c->count) CU_TRY(cudaFree(c->count), "attention scratch");
            c->parts = NULL;
            c->count = NULL;
            c->parts_cap = c->count_cap = 0;
            CU_TRY(cudaMalloc((void **)&c->parts, np * sizeof(float)), "attention scratch");
            CU_TRY(cudaMalloc((void **)&c->count, nc * sizeof(int)), "attention scratch");
            CU_TRY(cudaMemsetAsync(c->count, 0, nc * sizeof(int), c->stream), "attention scratch");
            c->parts_cap = np;
            c->count_cap = nc;
        }
        n_span = max_span;
        mode = EMBER_CU_ATTN_SPLIT;
    }
    /* tc: tokens per tile of the walk kernel (speed only, the bits do not depend on it): whole tiles
       where the tokens come in runs of one row (prefill), one token per block where they do not */
    int tc = 0;
    if (c->attn_tc) {
        int runs = 0;
        for (int t = 0; t < T; t++) runs += t == 0 || map->row[t] != map->row[t - 1];
        tc = runs * 4 > T ? 1 : 64;
    }
    ember_cu_kv d;
    if ((rc = upload_map(c, map, T, Hkv, D, "attention", &d, err))) return rc;
    uint64_t sg[15 + 23] = {9, P(dev(out)), P(dev(q)), (uint64_t)Hq, fbits(a->scale), (uint64_t)a->window,
                            fbits(a->softcap), (uint64_t)mode, (uint64_t)n_span, P(c->parts), P(c->count),
                            (uint64_t)ember_cu_attn_group, (uint64_t)tc, (uint64_t)ember_cu_attn_pipe,
                            (uint64_t)ember_cu_attn_lean};
    int ns = 15;
    sig_kv(sg, &ns, &d);
    if (g_skip(c, sg, ns)) return EMBER_OK;
    return launched(c, ember_cu_attention(c->stream, &d, dev(out), dev(q), Hq, a->scale, a->window, a->softcap, mode,
                                          n_span, c->parts, c->count, tc),
                    mode == EMBER_CU_ATTN_SPLIT ? "attention (split)"
                    : mode == EMBER_CU_ATTN_STAGED ? "attention (staged)"
                                                   : "attention",
                    err);
}

/* dst bytes [doff, +n) = src bytes [soff, +n), device to device on the stream. */
static int cuda_copy(ember_backend *be, ember_tensor *dst, size_t doff, const ember_tensor *src, size_t soff, size_t n,
                     ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = check_range(be, dst, doff, n, "copy", err)) || (rc = check_range(be, src, soff, n, "copy", err)) || !n)
        return rc;
    const char *d = (const char *)dev(dst) + doff, *s = (const char *)dev(src) + soff;
    if ((d < s && d + n > s) || (s < d && s + n > d))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "copy: ranges overlap");
    if ((rc = bind(c, err))) return rc;
    const uint64_t sg[] = {10, P(d), P(s), n};
    if (g_skip(c, sg, 4)) return EMBER_OK;
    CU_TRY(cudaMemcpyAsync((void *)d, s, n, cudaMemcpyDeviceToDevice, c->stream), "copy");
    prof_mark(c, "copy");
    return EMBER_OK;
}

static int run_ew(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b, int kind,
                  float s, const char *op, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, dst, op, "dst", err)) || (rc = need_f32(be, a, op, "a", err)) ||
        (rc = need_f32(be, b, op, "b", err)))
        return rc;
    int64_t n = ember_tensor_nelem(dst);
    if (ember_tensor_nelem(a) != n || ember_tensor_nelem(b) != n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: sizes differ", op);
    if ((rc = bind(c, err))) return rc;
    /* swiglu and geglu may add the quantized form of dst (section "quantized inputs") */
    const int64_t M = ember_tensor_rows(dst), D = ember_tensor_row_len(dst);
    ember_cu_qout q = {NULL, NULL};
    const unsigned qk = kind == 0 || kind == 2 ? qfuse_plan(c, M, D, &q) : 0;
    const uint64_t sg[] = {11, (uint64_t)kind, P(dev(dst)), P(dev(a)), P(dev(b)), fbits(s), (uint64_t)n, P(q.act32),
                           P(q.act256)};
    if (!g_skip(c, sg, 9) &&
        (rc = launched(c, qk ? ember_cu_glu_q(c->stream, kind, dev(dst), dev(a), dev(b), n, &q)
                             : ember_cu_elementwise(c->stream, kind, dev(dst), dev(a), dev(b), s, n),
                       op, err)))
        return rc;
    qf_set(c, dev(dst), M, D, qk);
    return EMBER_OK;
}

static int cuda_swiglu(ember_backend *be, ember_tensor *dst, const ember_tensor *gate, const ember_tensor *up,
                       ember_error *err) {
    return run_ew(be, dst, gate, up, 0, 0.0f, "swiglu", err);
}

static int cuda_geglu(ember_backend *be, ember_tensor *dst, const ember_tensor *gate, const ember_tensor *up,
                      ember_error *err) {
    return run_ew(be, dst, gate, up, 2, 0.0f, "geglu", err);
}

static int cuda_scale(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float s, ember_error *err) {
    return run_ew(be, dst, a, a, 3, s, "scale", err);
}

static int cuda_softcap(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float cap, ember_error *err) {
    if (!(cap > 0)) return ember_err(err, EMBER_ERR_INVALID_ARG, "softcap: cap %g is not positive", (double)cap);
    return run_ew(be, dst, a, a, 4, cap, "softcap", err);
}

static int cuda_add(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
                    ember_error *err) {
    return run_ew(be, dst, a, b, 1, 0.0f, "add", err);
}

static int cuda_sigmoid_mul(ember_backend *be, ember_tensor *dst, const ember_tensor *x, const ember_tensor *gate,
                            ember_error *err) {
    return run_ew(be, dst, x, gate, 5, 0.0f, "sigmoid_mul", err);
}

/* The MoE combine (backend.h): ids and w go through the argument area. */
static int cuda_add_rows_scaled(ember_backend *be, ember_tensor *dst, const ember_tensor *src, const int32_t *ids,
                                const float *w, int n, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, dst, "add_rows_scaled", "dst", err)) || (rc = need_f32(be, src, "add_rows_scaled", "src", err)) ||
        (rc = ember_rows_scaled_check(dst, src, ids, n, err)))
        return rc;
    const int64_t D = ember_tensor_row_len(dst);
    if (!n || !D) return EMBER_OK;
    if ((rc = bind(c, err))) return rc;
    const void *part[2] = {ids, w};
    size_t bytes[2] = {(size_t)n * sizeof *ids, (size_t)n * sizeof *w};
    void *d[2];
    if ((rc = upload_args(c, 2, part, bytes, d, err))) return rc;
    const uint64_t sg[] = {12, P(dev(dst)), P(dev(src)), P(d[0]), P(d[1]), (uint64_t)n, (uint64_t)D};
    if (g_skip(c, sg, 7)) return EMBER_OK;
    return launched(c, ember_cu_add_rows_scaled(c->stream, dev(dst), dev(src), d[0], d[1], n, D), "add_rows_scaled",
                    err);
}

/* ---- recurrent state (cuda_delta.cu) ---------------------------------------------------- */

/* The gated DeltaNet core (backend.h; cuda_delta.cu: the recurrent form for
   every token). The per-token and per-row tables are built here and go
   through the argument area; the scratch (post-convolution activations)
   is a backend buffer grown on demand. */
static int cuda_delta_net(ember_backend *be, ember_tensor *out, const ember_tensor *x, const ember_tensor *b,
                          const ember_tensor *a_in, const ember_delta_w *w, const ember_rec_map *map, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc;
    if ((rc = need_f32(be, out, "delta_net", "out", err)) || (rc = need_f32(be, x, "delta_net", "x", err)) ||
        (rc = need_f32(be, b, "delta_net", "b", err)) || (rc = need_f32(be, a_in, "delta_net", "a", err)) ||
        (rc = need_f32(be, w->conv, "delta_net", "conv", err)) ||
        (rc = w->a_neg ? need_f32(be, w->a_neg, "delta_net", "a_neg", err)
                       : need_f32(be, w->a_log, "delta_net", "a_log", err)) ||
        (rc = need_f32(be, w->dt_bias, "delta_net", "dt_bias", err)))
        return rc;
    if ((rc = ember_delta_net_check(out, x, b, a_in, w, map, err))) return rc;
    c->seq++; /* launches without g_skip: memory changes (quantized inputs) */
    if (g_cannot(c)) return EMBER_OK; /* its host tables and scratch are not kept for step graphs */
    const ember_rec_layer *L = map->layer;
    const ember_rec_shape *s = &L->s;
    const int64_t T = ember_tensor_rows(x);
    if (s->v_dim > 1024 || T > (1 << 24)) /* head_k: a thread per value column; grid sizes */
        return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: heads of %d values or %lld tokens are beyond the GPU "
                         "kernels", s->v_dim, (long long)T);
    const int nT = (int)T;
    int32_t *ints = ember_malloc((size_t)nT * 3 * sizeof *ints);
    int32_t *first = ember_malloc((size_t)(map->n_refs > 0 ? map->n_refs : 1) * sizeof *first);
    ember_cu_delta_row *rows = ember_calloc((size_t)nT, sizeof *rows);
    if (!ints || !first || !rows) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory in delta_net");
        goto done;
    }
    int32_t *tok = ints, *tok_row = ints + nT, *tok_j = ints + 2 * nT;
    for (int r = 0; r < map->n_refs; r++) first[r] = -1;
    int nr = 0;
    for (int t = 0; t < nT; t++) {
        int r = map->row[t];
        const ember_rec_rowref *ref = &map->refs[r];
        if (first[r] < 0) {
            first[r] = nr;
            rows[nr] = (ember_cu_delta_row){0, 0, ref->src, ref->dst, ref->log ? dev(ref->log) : NULL,
                                            ref->log_base, 0};
            nr++;
        }
        tok_row[t] = first[r];
        tok_j[t] = rows[first[r]].n++;
    }
    for (int i = 0, o = 0; i < nr; i++) {
        rows[i].start = o;
        o += rows[i].n;
    }
    for (int t = 0; t < nT; t++) tok[rows[tok_row[t]].start + tok_j[t]] = t;
    /* scratch: y [T, C] and gb [T, 2 Hv] */
    size_t need = ((size_t)nT * (size_t)s->conv_dim + (size_t)nT * 2 * (size_t)s->n_v_heads) * sizeof(float);
    if ((rc = bind(c, err))) goto done;
    if (need > c->delta_cap) {
        graphs_clear(c);
        if (c->delta_scratch) cudaFree(c->delta_scratch);
        c->delta_scratch = NULL;
        c->delta_cap = 0;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, need);
        c->delta_scratch = p;
        if (e != cudaSuccess) {
            rc = cuda_fail(err, e, "allocating delta_net scratch");
            goto done;
        }
        c->delta_cap = need;
    }
    const void *part[5] = {rows, tok, tok_row, tok_j, map->pos};
    size_t bytes[5] = {(size_t)nr * sizeof *rows, (size_t)nT * 4, (size_t)nT * 4, (size_t)nT * 4, (size_t)nT * 4};
    void *d[5];
    if ((rc = upload_args(c, 5, part, bytes, d, err))) goto done;
    float *y = c->delta_scratch;
    ember_cu_delta a = {dev(out), y, y + (size_t)nT * (size_t)s->conv_dim, dev(x), dev(b), dev(a_in), dev(w->conv),
                        w->a_neg ? NULL : dev(w->a_log), dev(w->dt_bias), w->a_neg ? dev(w->a_neg) : NULL, (float *)dev(L->pool), d[0],
                        d[1], d[2], d[3], d[4], L->slot_floats, L->off, L->log_stride, L->log_off, nT, nr, s->conv_dim,
                        s->conv_k, s->n_k_heads, s->n_v_heads, s->k_dim, s->v_dim, s->v_tiled,
                        (float)(1.0 / sqrt((double)s->k_dim))};
    rc = launched(c, ember_cu_delta_net(c->stream, &a), "delta_net", err);
done:
    free(ints);
    free(first);
    free(rows);
    return rc;
}

static int cuda_delta_replay(ember_backend *be, const ember_rec_layer *layers, int n_layers, int32_t src, int32_t dst,
                             const ember_tensor *log, int n, ember_error *err) {
    cuda_backend *c = cu(be);
    int rc = ember_delta_replay_check(layers, n_layers, src, dst, log, n, err);
    if (rc || (rc = bind(c, err))) return rc;
    c->seq++; /* as delta_net */
    if (g_cannot(c)) return EMBER_OK;
    const size_t lf = ember_rec_layer_floats(&layers[0].s), logf = ember_rec_log_floats(&layers[0].s);
    const ember_rec_shape *s = &layers[0].s;
    ember_cu_replay a = {(float *)dev(layers[0].pool), dev(log), layers[0].slot_floats, lf, layers[0].log_stride, logf,
                         src, dst, n, n_layers, s->conv_dim, s->conv_k, s->n_k_heads, s->n_v_heads, s->k_dim, s->v_dim,
                         s->v_tiled};
    return launched(c, ember_cu_delta_replay(c->stream, &a), "delta_replay", err);
}

/* ---- life cycle ------------------------------------------------------------------------- */

static void cuda_free(ember_backend *be) {
    if (!be) return;
    cuda_backend *c = cu(be);
    if (cudaSetDevice(c->device) == cudaSuccess) {
        prof_end(c);
        cudaStreamSynchronize(c->stream);
        for (int i = 0; i < ARG_SLOTS; i++)
            if (c->slots[i].dev) cudaFree(c->slots[i].dev);
        if (c->parts) cudaFree(c->parts);
        if (c->count) cudaFree(c->count);
        if (c->ids_dev) cudaFree(c->ids_dev);
        if (c->delta_scratch) cudaFree(c->delta_scratch);
        if (c->qact) cudaFree(c->qact);
        if (c->mlx_act) cudaFree(c->mlx_act);
        if (c->gmode == G_CAPTURE) {
            cudaGraph_t g = NULL;
            if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        }
        for (int i = 0; i < c->g_nparts; i++) cudaGraphDestroy(c->g_parts[i]);
        graphs_clear(c);
        if (c->ga_host) cudaFreeHost(c->ga_host);
        if (c->ga_dev) cudaFree(c->ga_dev);
        if (c->go_host) cudaFreeHost(c->go_host);
        cudaStreamDestroy(c->stream);
    }
    ember_pool_free(c->host);
    free(c->gouts);
    for (int i = 0; i < ARG_SLOTS; i++) free(c->slots[i].host);
    free(c->refs_h);
    free(c->blocks_h);
    free(c->bounce);
    free(c);
}

/* What the kernels multiply and gather: float weights and the quantized
   types of cuda_qmm.cu. */
static bool cuda_weight_ok(ember_dtype d) {
    return cu_dtype(d) >= 0 || cu_qtype(d) >= 0 || cu_mlx(d, NULL, NULL);
}

static bool cuda_kv_ok(ember_kv_enc e) {
    return cu_kv_enc(e) >= 0;
}

/* The backend's host_run: the tasks on a pool of host threads (the
   machine's cores, at most 16) made on first use; if it cannot be made,
   here in order. */
static void cuda_host_run(ember_backend *be, int n, ember_task_fn fn, void *ctx) {
    cuda_backend *c = cu(be);
    if (!c->host && !c->host_failed) {
        ember_error e = {0};
        int t = ember_cpu_count();
        c->host = ember_pool_new(t < 16 ? t : 16, &e);
        c->host_failed = !c->host;
    }
    if (c->host) {
        ember_pool_run_named(c->host, n, fn, ctx, "host_run");
        return;
    }
    for (int k = 0; k < n; k++) fn(ctx, k, 0);
}

static const ember_backend_ops k_cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_from_host = cuda_buffer_from_host,
    .buffer_free = cuda_buffer_free,
    .prepare_weight = cuda_prepare_weight,
    .write = cuda_write,
    .read = cuda_read,
    .get_rows = cuda_get_rows,
    .rms_norm = cuda_rms_norm,
    .matmul = cuda_matmul,
    .rope = cuda_rope,
    .kv_write = cuda_kv_write,
    .kv_read = cuda_kv_read,
    .attention = cuda_attention,
    .copy = cuda_copy,
    .swiglu = cuda_swiglu,
    .geglu = cuda_geglu,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .add = cuda_add,
    .add_rows_scaled = cuda_add_rows_scaled,
    .delta_net = cuda_delta_net,
    .delta_replay = cuda_delta_replay,
    .sigmoid_mul = cuda_sigmoid_mul,
    .add_rms_norm = cuda_add_rms_norm,
    .rope_kv_write = cuda_rope_kv_write,
    .argmax_rows = cuda_argmax_rows,
    .sample_rows = cuda_sample_rows,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .weight_ok = cuda_weight_ok,
    .kv_ok = cuda_kv_ok,
    .host_run = cuda_host_run,
};

int ember_cuda_device_count(int *count, ember_error *err) {
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        *count = n;
        return EMBER_OK;
    }
    cudaGetLastError();
    if (e == cudaErrorNoDevice) return EMBER_OK;
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (e == cudaErrorInsufficientDriver && drv == 0) return EMBER_OK; /* no NVIDIA driver installed */
    if (e == cudaErrorInsufficientDriver)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "cuda: the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime ember was "
                         "built with: update the driver",
                         drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    return cuda_fail(err, e, "looking for devices");
}

int ember_backend_cuda_new(const ember_cuda_params *p, ember_backend **out, ember_error *err) {
    *out = NULL;
    int device = p ? p->device : 0, count;
    int rc = ember_cuda_device_count(&count, err);
    if (rc) return rc;
    if (count == 0) return ember_err(err, EMBER_ERR_UNSUPPORTED, "cuda:%d: no CUDA device found", device);
    if (device < 0 || device >= count)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "cuda:%d: no such device (%d found: cuda:0..cuda:%d)", device,
                         count, count - 1);
    int major = 0, minor = 0;
    CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "reading the device");
    CU_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "reading the device");
    if (major < 9)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "cuda:%d has compute capability %d.%d; ember's CUDA kernels need 9.0 (Hopper) or newer",
                         device, major, minor);
    cuda_backend *c = ember_calloc(1, sizeof *c);
    if (!c) return ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the CUDA backend");
    c->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return cuda_fail(err, e, "starting the device");
    }
    /* the shared-memory limits of the kernels over 48 KB, once for this device */
    e = ember_cu_attn_prepare();
    if (e == cudaSuccess) e = ember_cu_mm_prepare();
    if (e == cudaSuccess) e = ember_cu_qmm_prepare();
    if (e != cudaSuccess) {
        cudaStreamDestroy(c->stream);
        free(c);
        return cuda_fail(err, e, "preparing the kernels");
    }
    c->base.ops = &k_cuda_ops;
    c->base.impl = c;
    if (p) c->base.log = p->log;
    prof_start(c);
    /* measuring aids (docs/cuda.md), each 0 for the kernels of before: plain launches (cuda_pdl.cuh),
       the per-warp tensor-core kernels for bf16 products at M > 8, attention split per query head */
    const char *pdl = getenv("EMBER_CUDA_PDL"), *mmc = getenv("EMBER_CUDA_MM_CLUSTER"),
               *grp = getenv("EMBER_CUDA_ATTN_GROUP"), *blk = getenv("EMBER_CUDA_MM_BLK");
    if (pdl && *pdl) ember_cu_pdl = atoi(pdl) != 0;
    if (mmc && *mmc) ember_cu_mm_cluster = atoi(mmc) != 0;
    /* the one-row kernels for Q4_0 / Q4_K / Q5_K / Q6_K products (0: qmm_k, the kernel of before) */
    const char *qmv = getenv("EMBER_CUDA_QMV");
    if (qmv && *qmv) ember_cu_qmv = atoi(qmv) != 0;
    /* Q4_K / Q5_K weights read as 16-byte words where aligned (0: 4-byte words, the loads of before) */
    const char *ql16 = getenv("EMBER_CUDA_QLD16");
    if (ql16 && *ql16) ember_cu_qld16 = atoi(ql16) != 0;
    /* the K types' products of 9 rows or more on the tensor cores (0: qmm_k, the dp4a kernel of before) */
    const char *qktc = getenv("EMBER_CUDA_QKTC");
    if (qktc && *qktc) ember_cu_qktc = atoi(qktc) != 0;
    /* MLX products of 9 rows or more on the tensor cores (0: the dp4a kernel at every row count) */
    const char *mlxtc = getenv("EMBER_CUDA_MLXTC");
    if (mlxtc && *mlxtc) ember_cu_mlxtc = atoi(mlxtc) != 0;
    /* the producers' quantized inputs up to this many rows (0: the matmul's own launches; section "quantized inputs") */
    const char *qfz = getenv("EMBER_CUDA_QFUSE");
    c->qfuse = 1;
    if (qfz && *qfz) c->qfuse = atoi(qfz) < 0 ? 0 : atoi(qfz) > EMBER_CU_QFUSE_MAX_M ? EMBER_CU_QFUSE_MAX_M : atoi(qfz);
    /* products read their first (prepared) weights before the kernel before them ends (1, the default) or
       after (0, as before) */
    const char *mme = getenv("EMBER_CUDA_MM_EARLY");
    c->mm_early = !(mme && *mme) || atoi(mme) != 0;
    /* the block kernel for bf16 products from this many rows on (0: never) */
    if (blk && *blk) ember_cu_mm_blk_min = atoi(blk) > 0 ? atoi(blk) : 0;
    /* the warpgroup kernel (Hopper) for bf16 products from this many rows on (0: never; default 128) */
    const char *wg = getenv("EMBER_CUDA_MM_WG");
    if (wg && *wg) ember_cu_mm_wg_min = atoi(wg) > 0 ? atoi(wg) : 0;
    if (grp && *grp) ember_cu_attn_group = atoi(grp) != 0;
    /* the pipelined tc split: spans per block (0: off, the default; 1: picked; N: N) */
    const char *pipe = getenv("EMBER_CUDA_ATTN_PIPE");
    if (pipe && *pipe) ember_cu_attn_pipe = atoi(pipe) > 0 ? atoi(pipe) : 0;
    /* the lean tc split (three blocks per SM at head size 128; 0: the split kernel of before) */
    const char *lean = getenv("EMBER_CUDA_ATTN_LEAN");
    if (lean && *lean) ember_cu_attn_lean = atoi(lean) != 0;
    /* attention in the tc order (tensor cores) for the layers it takes: on unless 0 */
    const char *atc = getenv("EMBER_CUDA_ATTN_TC");
    c->attn_tc = !(atc && *atc && atoi(atc) == 0);
    const char *gr = getenv("EMBER_CUDA_GRAPHS"); /* step graphs: on unless 0 */
    c->graphs_on = !(gr && *gr && atoi(gr) == 0);
    *out = &c->base;
    return EMBER_OK;
}

void *ember_backend_cuda_stream(const ember_backend *be) {
    return be && be->ops == &k_cuda_ops ? (void *)((const cuda_backend *)be->impl)->stream : NULL;
}

int ember_cuda_mem_info(const ember_backend *be, size_t *free_b, size_t *total_b, ember_error *err) {
    *free_b = *total_b = 0;
    if (!be || be->ops != &k_cuda_ops) return ember_err(err, EMBER_ERR_INVALID_ARG, "not a CUDA backend");
    const cuda_backend *c = be->impl;
    CU_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    CU_TRY(cudaMemGetInfo(free_b, total_b), "reading the device memory");
    return EMBER_OK;
}

void ember_backend_describe(const ember_backend *be, char *buf, size_t n) {
    if (!n) return;
    if (!be || be->ops != &k_cuda_ops) {
        snprintf(buf, n, "cpu");
        return;
    }
    const cuda_backend *c = be->impl;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, c->device) == cudaSuccess)
        snprintf(buf, n, "cuda:%d (%s)", c->device, prop.name);
    else
        snprintf(buf, n, "cuda:%d", c->device);
}
