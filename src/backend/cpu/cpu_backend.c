/*
 * cpu_backend.c - the CPU backend: host memory buffers, and the ops of
 * backend.h run on a worker pool with per-ISA inner loops (kernels.h).
 *
 * Ownership: the backend owns its pool, its kernel choice and a per-thread
 * scratch area (grown on demand, never per token once warm). Buffers are
 * 64-byte aligned host memory; buffers of 1 MiB and more are anonymous maps
 * aligned to 2 MiB and advised as huge pages, because a decode step streams
 * every weight once and TLB misses on 4 KiB pages (worse under
 * virtualisation) cost more than the copy: on the 2-core EPYC VM we develop
 * on, bf16 decode of a 0.5B model read weights about 2x faster from such a
 * copy than from the page-cache mapping of the file. With zero_copy set,
 * weights instead wrap the caller's 8-byte aligned memory (the mapped
 * file), which is never freed here.
 *
 * Threading: ops are called from one thread; each op splits its outputs into
 * tasks, so every output element is computed entirely by one task and the
 * thread count never changes a result.
 *
 * Prepared weights (backend.h prepare_weight): the model loader hands
 * each matrix to cpu_prepare_weight once after loading. A quantized
 * weight whose dtype has a packed kernel for this ISA (qkern.h) and whose
 * memory the backend owns (not with zero_copy: the caller's mapped file is
 * never written) has its whole 16-row groups permuted in place; the
 * handle of that, an ember_prepared, is owned by the buffer (a list
 * through buf->preps, freed with it) and the tensor points at it
 * (t->prep). matmul and get_rows read t->prep directly: no lookup per
 * product (a MoE model has thousands of expert matrices). Every weight
 * without a handle runs row-major with the same bits (cpu_qmatmul packs
 * group by group into scratch). Packing stays invisible: read un-permutes
 * into the caller's memory without touching the weight; write, and a view
 * without the handle that overlaps a packed range (an op reading the bytes
 * as row-major), first restore the range and mark the handle unpacked, so
 * the copies of the tensor that share it run row-major until
 * prepare_weight packs it again. The layout depends on the dtype only, not
 * on the ISA: a backend of another ISA has its own buffers anyway.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "backend/kv_codec.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/alloc.h"
#include "core/util.h"
#include "cpu_delta.h"
#include "kern_mlx.h"
#include "kernels.h"
#include "qkern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_PAUSE() _mm_pause()
#else
#define CPU_PAUSE() ((void)0)
#endif

typedef struct cpu_backend {
    ember_backend base;
    const cpu_kernels *k;
    cpu_mlx_gemm_fn mlx_gemm; /* MLX weights (kern_mlx.h) for this ISA */
    ember_pool *pool;
    int n_threads;
    char *prof_path; /* EMBER_CPU_PROFILE: the file the pool's profile is appended to at free (owned) */
    bool zero_copy; /* wrap host memory in buffer_from_host instead of copying */
    float *scratch; /* n_threads x scratch_floats */
    size_t scratch_floats;
    void *act[CPU_ACT_COUNT]; /* quantized activations per cpu_act_kind, grown on demand */
    size_t act_cap[CPU_ACT_COUNT];
    void *act_moe[CPU_ACT_COUNT]; /* moe_token's down-projection activation rows, per kind, grown on demand */
    size_t act_moe_cap[CPU_ACT_COUNT];
    void *act_tiled;  /* the A32 tiles for the table's qgemm_tiled kernels (qkern.h) */
    size_t act_tiled_cap;
    unsigned char *qscratch; /* n_threads x qscratch_bytes: cpu_qmatmul and packing */
    size_t qscratch_bytes;
    float *attn_parts;         /* attention span states (split mode), grown on demand */
    void *delta_scratch;       /* delta_net's scratch (cpu_delta.c), grown on demand */
    size_t delta_cap;          /* its bytes */
    size_t attn_parts_cap;
    long n_unprepared; /* products that ran a packable weight row-major: it had no handle */
} cpu_backend;

/* A prepared weight (see the top of the file): the whole 16-row groups of
   the N x K matrix of dtype dt at bytes [off, off + nbytes) of buf are
   packed in place while packed is set. Owned by buf (its preps list). */
struct ember_prepared {
    ember_buffer *buf;
    size_t off, nbytes;
    ember_dtype dt;
    int64_t N, K;
    bool packed; /* false: restored to row-major (prepare_weight packs it again) */
    ember_prepared *next;
};

static cpu_backend *cpu(ember_backend *be) {
    return (cpu_backend *)be->impl;
}

static void preps_restore(cpu_backend *c, ember_buffer *buf, size_t off, size_t n);
static void preps_read(cpu_backend *c, const ember_buffer *buf, size_t off, size_t n, unsigned char *dst);

static void *host(const ember_tensor *t) {
    return (char *)t->buf->data + t->offset;
}

const cpu_kernels *ember_cpu_kernels_for(ember_isa isa) {
    ember_cpu_features f;
    switch (isa) {
    case EMBER_ISA_AMX: return &ember_cpu_kernels_amx;
    case EMBER_ISA_AVX512:
        ember_cpu_detect(&f);
        return f.avx512vnni ? &ember_cpu_kernels_avx512vnni : &ember_cpu_kernels_avx512;
    case EMBER_ISA_AVX2:
        ember_cpu_detect(&f);
        return f.avxvnni ? &ember_cpu_kernels_avx2vnni : &ember_cpu_kernels_avx2;
    default: return &ember_cpu_kernels_scalar;
    }
}

/* ---- buffers ------------------------------------------------------------ */

#define HUGE_MIN (1u << 20)
#define HUGE_ALIGN (2u << 20)

/* Zeroed memory of at least size bytes; *map_len != 0 when it was mapped. */
static void *host_alloc(size_t size, size_t *map_len) {
    *map_len = 0;
    if (size >= HUGE_MIN) {
        size_t len;
        if (!ember_add_ok(size, HUGE_ALIGN, &len)) return NULL;
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        /* trim to a 2 MiB aligned region so whole huge pages back it */
        uintptr_t a = ((uintptr_t)p + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
        size_t head = a - (uintptr_t)p, body = (size + 4095) & ~(size_t)4095;
        if (head) munmap(p, head);
        if (len - head > body) munmap((char *)a + body, len - head - body);
        madvise((void *)a, body, MADV_HUGEPAGE); /* advice only: failure is harmless */
        *map_len = body;
        return (void *)a;
    }
    size_t rounded = (size + 63) & ~(size_t)63;
    void *d = ember_aligned_alloc(64, rounded ? rounded : 64);
    if (d) memset(d, 0, rounded ? rounded : 64);
    return d;
}

static int cpu_buffer_alloc(ember_backend *be, size_t size, ember_buffer **out, ember_error *err) {
    *out = NULL;
    if (size > SIZE_MAX / 2) return ember_err(err, EMBER_ERR_NOMEM, "cannot allocate %zu bytes", size);
    ember_buffer *b = ember_calloc(1, sizeof *b);
    size_t map_len = 0;
    void *d = b ? host_alloc(size, &map_len) : NULL;
    if (!d) {
        free(b);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory allocating %zu bytes", size);
    }
    *b = (ember_buffer){.be = be, .data = d, .size = size, .owned = true, .map_len = map_len};
    *out = b;
    return EMBER_OK;
}

static int cpu_buffer_from_host(ember_backend *be, const void *h, size_t size, ember_buffer **out,
                                ember_error *err) {
    *out = NULL;
    /* 8 bytes is what safetensors promises (its header is padded to 8) and
       more than any element the kernels read from a weight needs (they load
       vectors unaligned): asking for 16 made every tensor of half the files
       on the hub a copy, --mmap or not */
    if (cpu(be)->zero_copy && h && ((uintptr_t)h & 7u) == 0) {
        ember_buffer *b = ember_calloc(1, sizeof *b);
        if (!b) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        *b = (ember_buffer){.be = be, .data = (void *)h, .size = size, .owned = false};
        *out = b;
        return EMBER_OK;
    }
    int rc = cpu_buffer_alloc(be, size, out, err);
    if (rc) return rc;
    if (size) memcpy((*out)->data, h, size);
    return EMBER_OK;
}

static void cpu_buffer_free(ember_buffer *b) {
    if (!b) return;
    for (ember_prepared *p = b->preps, *next; p; p = next) {
        next = p->next;
        free(p);
    }
    if (b->owned && b->map_len)
        munmap(b->data, b->map_len);
    else if (b->owned)
        free(b->data);
    free(b);
}

static int check_range(const ember_tensor *t, size_t off, size_t n, ember_error *err) {
    size_t end;
    if (!t->buf || !ember_add_ok(off, n, &end) || end > t->nbytes)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "copy of %zu bytes at %zu outside a %zu-byte tensor",
                         n, off, t->nbytes);
    return EMBER_OK;
}

static int cpu_write(ember_backend *be, ember_tensor *dst, size_t off, const void *src, size_t n,
                     ember_error *err) {
    int rc = check_range(dst, off, n, err);
    if (rc) return rc;
    preps_restore(cpu(be), dst->buf, dst->offset + off, n);
    if (n) memcpy((char *)host(dst) + off, src, n);
    return EMBER_OK;
}

/* A large copy in pieces on the pool (read's logits rows: 600 KB a row of
   a 152k vocabulary). */
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n, piece;
} copy_job;

enum { COPY_PIECE_MIN = 256 << 10 }; /* bytes: below two of these, one memcpy */

static void copy_task(void *ctx, int t, int thread) {
    (void)thread;
    const copy_job *j = ctx;
    const size_t a = (size_t)t * j->piece, b = a + j->piece < j->n ? a + j->piece : j->n;
    memcpy(j->dst + a, j->src + a, b - a);
}

static void pool_copy(cpu_backend *c, void *dst, const void *src, size_t n) {
    const int threads = ember_pool_size(c->pool);
    if (threads < 2 || n < 2 * (size_t)COPY_PIECE_MIN) {
        memcpy(dst, src, n);
        return;
    }
    size_t piece = n / (size_t)threads;
    piece = piece < COPY_PIECE_MIN ? COPY_PIECE_MIN : (piece + 63) & ~(size_t)63;
    copy_job j = {dst, src, n, piece};
    ember_pool_run(c->pool, (int)((n + piece - 1) / piece), copy_task, &j);
}

static int cpu_read(ember_backend *be, const ember_tensor *src, size_t off, void *dst, size_t n,
                    ember_error *err) {
    int rc = check_range(src, off, n, err);
    if (rc) return rc;
    if (n) pool_copy(cpu(be), dst, (const char *)host(src) + off, n);
    preps_read(cpu(be), src->buf, src->offset + off, n, dst);
    return EMBER_OK;
}

/* ---- shape checks --------------------------------------------------------- */

static int need_f32(const ember_tensor *t, const char *op, const char *what, ember_error *err) {
    if (!t || !t->buf || t->dtype != EMBER_F32)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s must be a bound f32 tensor", op, what);
    return EMBER_OK;
}

static bool is_float_type(ember_dtype d) {
    return d == EMBER_F32 || d == EMBER_F16 || d == EMBER_BF16;
}

/* The activation format a weight dtype multiplies with: qkern.h's, and
   A32 for the MLX types (kern_mlx.h). */
static cpu_act_kind act_kind(ember_dtype d) {
    return cpu_mlx_is(d) ? CPU_ACT_32 : cpu_act_kind_for(d);
}

/* The activation format of a matmul with weights of dtype d and rows of K:
   act_kind, and for bf16 weights on a table with AMX-BF16 kernels
   (kern_bamx.h) the split bf16 rows when K is a multiple of 32 (a weight's
   K never changes, so each weight takes one path whatever the rows). */
static cpu_act_kind mm_act_kind(const cpu_kernels *k, ember_dtype d, int64_t K) {
    if (d == EMBER_BF16) return k->qgemm_packed[EMBER_BF16] && K % 32 == 0 ? CPU_ACT_BF16X2 : CPU_ACT_NONE;
    return act_kind(d);
}

/* A dtype matmul accepts as weights: float, or a block type with kernels. */
static bool is_weight_type(ember_dtype d) {
    return is_float_type(d) || act_kind(d) != CPU_ACT_NONE;
}

static int ensure_scratch(cpu_backend *c, size_t floats, ember_error *err) {
    if (floats <= c->scratch_floats) return EMBER_OK;
    size_t total, bytes;
    if (!ember_mul_ok(floats, (size_t)c->n_threads, &total) || !ember_mul_ok(total, 4, &bytes))
        return ember_err(err, EMBER_ERR_NOMEM, "scratch size overflows");
    float *s = ember_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    free(c->scratch);
    c->scratch = s;
    c->scratch_floats = floats;
    return EMBER_OK;
}

/* Per-thread scratch for cpu_qmatmul and for packing, at least bytes each. */
static int ensure_qscratch(cpu_backend *c, size_t bytes, ember_error *err) {
    if (bytes <= c->qscratch_bytes) return EMBER_OK;
    bytes = (bytes + 63) & ~(size_t)63;
    size_t total;
    if (!ember_mul_ok(bytes, (size_t)c->n_threads, &total))
        return ember_err(err, EMBER_ERR_NOMEM, "scratch size overflows");
    unsigned char *s = ember_aligned_alloc(64, total);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of scratch", total);
    free(c->qscratch);
    c->qscratch = s;
    c->qscratch_bytes = bytes;
    return EMBER_OK;
}

/* ---- packed weights -------------------------------------------------------------- */

typedef struct pack_job {
    cpu_backend *c;
    ember_dtype dt;
    unsigned char *base; /* the first group */
    size_t row;          /* bytes per row */
    int K;
    bool pack; /* else unpack */
} pack_job;

/* Group `task` in place, through this thread's scratch. */
static void pack_task(void *ctx, int task, int thread) {
    const pack_job *j = ctx;
    const size_t gbytes = CPU_QP_ROWS * j->row;
    unsigned char *g = j->base + (size_t)task * gbytes;
    unsigned char *tmp = j->c->qscratch + (size_t)thread * j->c->qscratch_bytes;
    memcpy(tmp, g, gbytes);
    if (j->pack)
        cpu_qpack_group(j->dt, tmp, j->row, CPU_QP_ROWS, j->K, g);
    else
        cpu_qunpack_group(j->dt, tmp, j->K, g, j->row, CPU_QP_ROWS);
}

/* Packs or unpacks the whole groups of p in place. The scratch holds a
   group (ensured when p was prepared). */
static void pack_run(cpu_backend *c, ember_prepared *p, bool pack) {
    pack_job j = {c, p->dt, (unsigned char *)p->buf->data + p->off, cpu_row_bytes(p->dt, p->K), (int)p->K, pack};
    ember_pool_run(c->pool, (int)(p->N / CPU_QP_ROWS), pack_task, &j);
    p->packed = pack;
}

/* Bytes of p's whole groups (the packed part). */
static size_t prep_packed_bytes(const ember_prepared *p) {
    return (size_t)(p->N / CPU_QP_ROWS) * CPU_QP_ROWS * cpu_row_bytes(p->dt, p->K);
}

static bool prep_overlaps(const ember_prepared *p, size_t off, size_t n) {
    size_t end = n > SIZE_MAX - off ? SIZE_MAX : off + n;
    return p->packed && p->off < end && off < p->off + prep_packed_bytes(p);
}

/* Restores every packed weight of buf overlapping [off, off + n) to its
   row-major bytes (their handles stay, marked unpacked). */
static void preps_restore(cpu_backend *c, ember_buffer *buf, size_t off, size_t n) {
    if (!buf) return;
    for (ember_prepared *p = buf->preps; p; p = p->next)
        if (prep_overlaps(p, off, n)) pack_run(c, p, false);
}

/* dst holds a copy of bytes [off, off + n) of buf: rewrites the parts of
   it that are packed into their row-major bytes, group by group through
   thread 0's scratch; the weight itself is untouched. */
static void preps_read(cpu_backend *c, const ember_buffer *buf, size_t off, size_t n, unsigned char *dst) {
    if (!buf) return;
    const size_t end = off + n; /* check_range bounded it */
    for (const ember_prepared *p = buf->preps; p; p = p->next) {
        if (!prep_overlaps(p, off, n)) continue;
        const size_t row = cpu_row_bytes(p->dt, p->K), gbytes = CPU_QP_ROWS * row;
        const size_t lo = off > p->off ? off : p->off, pend = p->off + prep_packed_bytes(p);
        const size_t hi = end < pend ? end : pend;
        for (size_t g = (lo - p->off) / gbytes; p->off + g * gbytes < hi; g++) {
            const size_t g0 = p->off + g * gbytes, a = lo > g0 ? lo : g0, b = hi < g0 + gbytes ? hi : g0 + gbytes;
            cpu_qunpack_group(p->dt, (const unsigned char *)buf->data + g0, (int)p->K, c->qscratch, row, CPU_QP_ROWS);
            memcpy(dst + (a - off), c->qscratch + (a - g0), b - a);
        }
    }
}

/* Whether the handle p describes the weight w (a copy of the prepared
   tensor, not another view of its buffer). */
static bool prep_is(const ember_prepared *p, const ember_tensor *w) {
    return p->buf == w->buf && p->off == w->offset && p->dt == w->dtype && w->ndim == 2 && p->N == w->shape[0] &&
           p->K == w->shape[1];
}

/* Whether matmul and get_rows read w as packed: its handle says so. A
   view without one that overlaps packed bytes restores them first (so it
   reads row-major bytes): the cost of a view the loader did not prepare,
   never of a prepared weight. */
static bool w_packed(cpu_backend *c, const ember_tensor *w) {
    const ember_prepared *p = w->prep;
    if (p && p->packed && prep_is(p, w)) return true;
    if (w->buf->preps) preps_restore(c, w->buf, w->offset, w->nbytes);
    return false;
}

/* Whether w can be packed on this backend: a 2-D matrix of a dtype with a
   packed kernel in this ISA's table, at least one whole group of rows, in
   memory the backend owns. */
static bool packable(const cpu_backend *c, const ember_tensor *w) {
    if (w->dtype <= EMBER_DTYPE_INVALID || w->dtype >= EMBER_DTYPE_COUNT || w->ndim != 2) return false;
    if (!c->k->qgemm_packed[w->dtype] || !w->buf->owned || w->shape[1] > INT32_MAX ||
        mm_act_kind(c->k, w->dtype, w->shape[1]) == CPU_ACT_NONE)
        return false;
    size_t row = cpu_row_bytes(w->dtype, w->shape[1]);
    return w->shape[0] >= CPU_QP_ROWS && row != 0 && w->shape[0] / CPU_QP_ROWS <= INT32_MAX;
}

/* backend.h's prepare_weight: packs t in place when packable, sharing the
   handle of an earlier preparation of the same bytes. Everything that can
   fail (the scratch, the handle) comes before a byte moves. */
static int cpu_prepare_weight(ember_backend *be, ember_tensor *t, ember_error *err) {
    cpu_backend *c = cpu(be);
    if (!t || !t->buf || t->buf->be != be)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "prepare_weight: not a bound tensor of this backend");
    if (!packable(c, t)) return EMBER_OK;
    ember_prepared *p = t->buf->preps;
    while (p && !prep_is(p, t)) p = p->next;
    if (p && p->packed) {
        t->prep = p;
        return EMBER_OK;
    }
    int rc = ensure_qscratch(c, CPU_QP_ROWS * cpu_row_bytes(t->dtype, t->shape[1]), err);
    if (rc) return rc;
    if (!p) {
        p = ember_calloc(1, sizeof *p);
        if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory preparing a weight");
        *p = (ember_prepared){t->buf, t->offset, t->nbytes, t->dtype, t->shape[0], t->shape[1], false, t->buf->preps};
        t->buf->preps = p;
    }
    preps_restore(c, t->buf, t->offset, t->nbytes); /* an overlapping view packed in its own groups */
    pack_run(c, p, true);
    t->prep = p;
    return EMBER_OK;
}

/* ---- get_rows ---------------------------------------------------------------- */

static int cpu_get_rows(ember_backend *be, ember_tensor *dst, const ember_tensor *src,
                        const int32_t *ids, int n, ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc = need_f32(dst, "get_rows", "dst", err);
    if (rc) return rc;
    if (!src->buf || !is_weight_type(src->dtype) || src->ndim != 2)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: src must be a 2-D float or quantized tensor");
    int64_t D = src->shape[1], R = src->shape[0];
    size_t row = cpu_row_bytes(src->dtype, D);
    if (ember_tensor_row_len(dst) != D || ember_tensor_rows(dst) < n || row == 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "get_rows: dst shape does not fit %d rows of %lld", n,
                         (long long)D);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= R)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "token id %d is outside the vocabulary [0, %lld)",
                             ids[i], (long long)R);
    /* a packed weight (an embedding tied to the output head): its whole
       groups are read in place, the rows after them are row-major */
    const int64_t packed_rows = w_packed(c, src) ? R / CPU_QP_ROWS * CPU_QP_ROWS : 0;
    for (int i = 0; i < n; i++) {
        const char *s = (const char *)host(src) + (size_t)ids[i] * row;
        float *d = (float *)host(dst) + (size_t)i * (size_t)D;
        if (ids[i] < packed_rows)
            cpu_qpack_dequant_row(src->dtype, (const char *)host(src) + (size_t)(ids[i] / CPU_QP_ROWS) * CPU_QP_ROWS * row,
                                  ids[i] % CPU_QP_ROWS, (int)D, d);
        else if (!cpu_mlx_dequant_row(src->dtype, s, d, D))
            cpu_dequant_row(src->dtype, s, d, D);
    }
    return EMBER_OK;
}

/* ---- rms_norm -------------------------------------------------------------------- */

typedef struct norm_job {
    const cpu_kernels *k;
    float *dst;
    const float *x;
    const float *w;
    int64_t D;
    float eps;
    bool plus_one;
} norm_job;

static void norm_task(void *ctx, int row, int thread) {
    (void)thread;
    const norm_job *j = ctx;
    const float *x = j->x + (size_t)row * (size_t)j->D;
    float *y = j->dst + (size_t)row * (size_t)j->D;
    float ss = j->k->dot(x, x, (int)j->D);
    float r = 1.0f / sqrtf(ss / (float)j->D + j->eps);
    j->k->norm_apply(y, x, j->w, r, j->plus_one, j->D);
}

/* fn(ctx, t, 0) for t in [0, n) on the calling thread when here (work
   smaller than a dispatch costs), else the pool's run of n tasks, profiled
   as name. */
static void tasks_run(cpu_backend *c, int n, bool here, ember_task_fn fn, void *ctx, const char *name) {
    if (here) {
        for (int t = 0; t < n; t++) fn(ctx, t, 0);
    } else {
        ember_pool_run_named(c->pool, n, fn, ctx, name);
    }
}

/* The values a task of a row-wise op (norms, RoPE and KV stores,
   activations) aims at: about a microsecond of work (rows_run raises the
   task count to a multiple of the threads, so a task may hold fewer). A
   task a row made runs of up to 64 tasks of a few hundred ns each, where
   on 16 threads the claims and the wait for the last one cost more than
   the work; but fewer tasks than threads left 16 rows on 16 threads
   waiting for 2 or 3 tasks (rope_kv_write's tokens cost several
   microseconds each: their angles). */
#define ROWS_GRAIN 8192

typedef struct rows_job {
    ember_task_fn fn; /* fn(ctx, row, thread) */
    void *ctx;
    int rows, per; /* rows in all; rows a task */
} rows_job;

static void rows_task(void *ctx, int t, int thread) {
    const rows_job *j = ctx;
    const int r1 = j->rows - t * j->per < j->per ? j->rows : (t + 1) * j->per;
    for (int r = t * j->per; r < r1; r++) j->fn(j->ctx, r, thread);
}

/* fn(ctx, r, thread) for the rows r in [0, rows) of row_values values each:
   on the calling thread when they are fewer than here values in all, else
   in tasks of consecutive rows: as many as ROWS_GRAIN values each make, but
   at least the threads (a multiple of them), at most the rows. Profiled as
   name. */
static void rows_run(cpu_backend *c, int rows, int64_t row_values, int64_t here, ember_task_fn fn, void *ctx,
                     const char *name) {
    if (rows < 1) return;
    const int64_t total = (int64_t)rows * (row_values > 0 ? row_values : 1);
    rows_job j = {fn, ctx, rows, rows};
    if (total >= here && c->n_threads > 1) {
        int64_t n = (total + ROWS_GRAIN - 1) / ROWS_GRAIN;
        n = (n + c->n_threads - 1) / c->n_threads * c->n_threads; /* whole rounds of the threads */
        if (n > rows) n = rows;
        j.per = (int)((rows + n - 1) / n);
    }
    const int n = (rows + j.per - 1) / j.per;
    tasks_run(c, n, n == 1, rows_task, &j, name);
}

static int cpu_rms_norm(ember_backend *be, ember_tensor *dst, const ember_tensor *x,
                        const ember_tensor *w, float eps, bool plus_one, ember_error *err) {
    int rc;
    if ((rc = need_f32(dst, "rms_norm", "dst", err)) || (rc = need_f32(x, "rms_norm", "x", err)) ||
        (rc = need_f32(w, "rms_norm", "weight", err)))
        return rc;
    int64_t D = ember_tensor_row_len(x);
    if (ember_tensor_nelem(w) != D || ember_tensor_nelem(dst) != ember_tensor_nelem(x) || D > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "rms_norm: shapes do not match");
    norm_job j = {cpu(be)->k, host(dst), host(x), host(w), D, eps, plus_one};
    const int rows = (int)ember_tensor_rows(x);
    rows_run(cpu(be), rows, D, ROWS_GRAIN, norm_task, &j, "norm_task");
    return EMBER_OK;
}

/* ---- fused: add + rms_norm (backend.h add_rms_norm) ------------------------------------ */

typedef struct addnorm_job {
    norm_job n; /* n.x is x */
    float *x;
    const float *h;
} addnorm_job;

/* Row r: x += h (add's bits), then the norm of x into dst (rms_norm's);
   dst may be h: its row is read before the norm writes it. */
static void addnorm_task(void *ctx, int row, int thread) {
    addnorm_job *j = ctx;
    float *x = j->x + (size_t)row * (size_t)j->n.D;
    const float *h = j->h + (size_t)row * (size_t)j->n.D;
    j->n.k->add(x, x, h, j->n.D);
    norm_task(&j->n, row, thread);
}

/* add(x, x, h) then rms_norm(dst, x, w) in one pool run (rows_run's tasks). */
static int cpu_add_rms_norm(ember_backend *be, ember_tensor *dst, ember_tensor *x, const ember_tensor *h,
                            const ember_tensor *w, float eps, bool plus_one, ember_error *err) {
    const char *op = "add_rms_norm";
    int rc;
    if ((rc = need_f32(dst, op, "dst", err)) || (rc = need_f32(x, op, "x", err)) ||
        (rc = need_f32(h, op, "h", err)) || (rc = need_f32(w, op, "weight", err)))
        return rc;
    int64_t D = ember_tensor_row_len(x), n = ember_tensor_nelem(x);
    if (ember_tensor_nelem(w) != D || ember_tensor_nelem(dst) != n || ember_tensor_nelem(h) != n || D > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: shapes do not match", op);
    addnorm_job j = {{cpu(be)->k, host(dst), host(x), host(w), D, eps, plus_one}, host(x), host(h)};
    const int rows = (int)ember_tensor_rows(x);
    rows_run(cpu(be), rows, D, ROWS_GRAIN, addnorm_task, &j, "addnorm_task");
    return EMBER_OK;
}

/* ---- matmul ---------------------------------------------------------------------- */

#define MAX_MM 16    /* products in one mm_job (a MoE token's 8 gate and 8 up projections) */
#define MAX_MM_API 8 /* products per matmul call (backend.h) */

typedef struct mm_job {
    const cpu_kernels *k;
    cpu_mlx_gemm_fn mlx_gemm;
    const float *x;
    const void *act[CPU_ACT_COUNT]; /* quantized x per cpu_act_kind (NULL when unused) */
    const void *act_tiled; /* act[CPU_ACT_32] as A32 tiles (qkern.h), or NULL */
    int M, K;
    int n;
    const ember_matmul *mm;
    bool each;             /* product i reads row i of x alone (M is then 1); matmul_each */
    int block;             /* weight rows per task (a multiple of CPU_QP_ROWS) */
    int first_task[MAX_MM + 1];
    bool packed[MAX_MM]; /* mm[i].w is packed (qkern.h) */
    unsigned char *qscratch; /* per thread, qscratch_bytes each */
    size_t qscratch_bytes;
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    const mm_job *j = ctx;
    int i = 0;
    while (task >= j->first_task[i + 1]) i++;
    const ember_matmul *m = &j->mm[i];
    int N = (int)m->w->shape[0];
    int n0 = (task - j->first_task[i]) * j->block;
    int nn = N - n0 < j->block ? N - n0 : j->block;
    ember_dtype dt = m->w->dtype;
    size_t row = cpu_row_bytes(dt, j->K);
    const char *w = (const char *)host(m->w) + (size_t)n0 * row;
    float *out = (float *)host(m->out) + n0;
    cpu_act_kind ak = mm_act_kind(j->k, dt, j->K);
    size_t arow = cpu_act_row_bytes(ak, j->K);
    /* the input rows: all M of x, or (matmul_each) its row i alone */
    const float *x = j->each ? j->x + (size_t)i * (size_t)j->K : j->x;
    const void *act = j->each && j->act[ak] ? (const char *)j->act[ak] + (size_t)i * arow : j->act[ak];
    int mlx_bits, mlx_group;
    if (ember_dtype_mlx_params(dt, &mlx_bits, &mlx_group)) {
        j->mlx_gemm(mlx_bits, mlx_group, w, row, nn, act, arow, j->M, j->K, out, (size_t)N);
    } else if (ak == CPU_ACT_32 && j->act_tiled && j->k->qgemm_tiled[dt]) {
        cpu_qmatmul_tiled(j->k, dt, w, j->packed[i], nn, j->act_tiled, j->M, j->K, out, (size_t)N,
                          j->qscratch + (size_t)thread * j->qscratch_bytes);
    } else if (ak != CPU_ACT_NONE) {
        cpu_qmatmul(j->k, dt, w, j->packed[i], nn, act, arow, j->M, j->K, out, (size_t)N,
                    j->qscratch + (size_t)thread * j->qscratch_bytes);
    } else {
        cpu_gemm_fn fn = dt == EMBER_F32 ? j->k->gemm_f32 : dt == EMBER_F16 ? j->k->gemm_f16 : j->k->gemm_bf16;
        fn(w, (size_t)j->K, nn, x, (size_t)j->K, j->M, j->K, out, (size_t)N);
    }
    if (m->bias) {
        const float *b = (const float *)host(m->bias) + n0;
        for (int r = 0; r < j->M; r++) {
            float *o = out + (size_t)r * (size_t)N;
            j->k->add(o, o, b, nn);
        }
    }
}

typedef struct act_job {
    const cpu_kernels *k;
    const float *x;
    void *dst;
    void *tiled; /* CPU_ACT_32 only: also write these A32 tiles, or NULL */
    int K, M;
    int chunks; /* tiled: block ranges per 16-row tile (tasks = tiles x chunks) */
    cpu_act_kind kind;
} act_job;

/* Row row of an act_job without tiles, the whole row of its kind; the
   pool's task fn. */
static void act_task(void *ctx, int row, int thread) {
    (void)thread;
    const act_job *j = ctx;
    size_t rb = cpu_act_row_bytes(j->kind, j->K);
    const float *x = j->x + (size_t)row * (size_t)j->K;
    void *d = (char *)j->dst + (size_t)row * rb;
    if (j->kind == CPU_ACT_32)
        j->k->quantize_act32(x, j->K, d);
    else if (j->kind == CPU_ACT_BF16X2)
        j->k->quantize_actbf16(x, j->K, d);
    else
        j->k->quantize_act256(x, j->K, d);
}

/* Task task of an act_job with tiles: tile task / chunks, its block range
   task % chunks; quantizes those blocks of the tile's rows, then writes
   those (tile, block)s whole. A (tile, block) holds all 16 rows' scales
   and levels, so one task writes each: a task a row had up to 16 threads
   writing each block's scale line (false sharing). The pool's task fn. */
static void act_tile_task(void *ctx, int task, int thread) {
    (void)thread;
    const act_job *j = ctx;
    const int tile = task / j->chunks, c = task % j->chunks, nb = j->K / 32;
    const int b0 = (int)((int64_t)nb * c / j->chunks), b1 = (int)((int64_t)nb * (c + 1) / j->chunks);
    const int r1 = j->M < 16 * tile + 16 ? j->M : 16 * tile + 16;
    const size_t rb = cpu_act_row_bytes(CPU_ACT_32, j->K);
    for (int r = 16 * tile; r < r1; r++) /* A32 blocks are independent: quantize blocks [b0, b1) alone */
        j->k->quantize_act32(j->x + (size_t)r * (size_t)j->K + 32 * b0, 32 * (b1 - b0),
                             (char *)j->dst + (size_t)r * rb + (size_t)b0 * sizeof(cpu_act32));
    cpu_act32_tile_blocks(j->dst, rb, j->K, j->M, tile, b0, b1, j->tiled);
}

/* Activations of fewer values are quantized on the calling thread. */
#define ACT_HERE 65536

/* Grows buf (capacity *cap bytes) to at least bytes, 64-aligned. */
static int act_reserve(void **buf, size_t *cap, size_t bytes, ember_error *err) {
    if (bytes <= *cap) return EMBER_OK;
    void *p = ember_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of activations", bytes);
    free(*buf);
    *buf = p;
    *cap = bytes;
    return EMBER_OK;
}

/* Quantizes the M rows of x into the backend's buffer for kind; with
   tiled (CPU_ACT_32 only) also into the A32 tiles (*tiled receives them).
   CPU_ACT_BF16X2 rows are followed by zero rows up to a whole 16-row tile
   past row M (the AMX-BF16 kernels load whole tiles, from any row under
   matmul_each). */
static int quantize_acts(cpu_backend *c, const float *x, int M, int K, cpu_act_kind kind, const void **out,
                         const void **tiled, ember_error *err) {
    size_t bytes;
    const size_t pad_rows = kind == CPU_ACT_BF16X2 ? (size_t)(16 - M % 16) + 15 : 0;
    if (!ember_mul_ok(cpu_act_row_bytes(kind, K), (size_t)M + pad_rows, &bytes))
        return ember_err(err, EMBER_ERR_NOMEM, "matmul: activation buffer size overflows");
    int rc = act_reserve(&c->act[kind], &c->act_cap[kind], bytes, err);
    if (!rc && tiled) rc = act_reserve(&c->act_tiled, &c->act_tiled_cap, cpu_act32_tiled_bytes(M, K), err);
    if (rc) return rc;
    act_job j = {.k = c->k, .x = x, .dst = c->act[kind], .tiled = tiled ? c->act_tiled : NULL,
                 .K = K, .M = M, .chunks = 1, .kind = kind};
    if (pad_rows)
        memset((char *)c->act[kind] + (size_t)M * cpu_act_row_bytes(kind, K), 0, pad_rows * cpu_act_row_bytes(kind, K));
    const bool here = (size_t)M * (size_t)K < ACT_HERE;
    if (tiled) {
        const int tiles = (M + 15) / 16, nb = K / 32;
        j.chunks = here ? 1 : (2 * c->n_threads + tiles - 1) / tiles;
        if (j.chunks > nb) j.chunks = nb;
        tasks_run(c, tiles * j.chunks, here, act_tile_task, &j, "act_tile_task");
        *tiled = c->act_tiled;
    } else {
        rows_run(c, M, K, ACT_HERE, act_task, &j, "act_task");
    }
    *out = c->act[kind];
    return EMBER_OK;
}

/* Checks n products (1 .. MAX_MM) on x for matmul (each false) or
   matmul_each (each: product i reads row i of x, which has n rows, and
   writes one row), reads which weights are packed (w_packed), and fills j (all but
   the activations and qscratch) with its task split: about 8 tasks per
   thread (taken dynamically, so a thread slowed by other load takes
   fewer), in whole packed groups. need[kind]: the activation kinds the
   products read; *tiles: CPU_ACT_32 wants A32 tiles too; *qs: the
   per-thread qscratch bytes the products need. */
static int mm_prepare(cpu_backend *c, const ember_tensor *x, int n, const ember_matmul *mm, bool each, mm_job *j,
                      bool need[CPU_ACT_COUNT], bool *tiles, size_t *qs, ember_error *err) {
    int rc = need_f32(x, "matmul", "x", err);
    if (rc) return rc;
    if (n < 1 || n > MAX_MM)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %d products (1..%d allowed)", n, MAX_MM);
    int64_t K = ember_tensor_row_len(x), M = ember_tensor_rows(x);
    if (K > INT32_MAX || M > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: input too large");
    if (each && M != n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul_each: %d products need %d input rows, not %lld", n, n,
                         (long long)M);
    if (each) M = 1; /* rows per product */
    int64_t total = 0;
    *tiles = false;
    for (int i = 0; i < n; i++) {
        const ember_matmul *m = &mm[i];
        if ((rc = need_f32(m->out, "matmul", "out", err))) return rc;
        if (!m->w->buf || !is_weight_type(m->w->dtype) || m->w->ndim != 2 || m->w->shape[1] != K)
            return ember_err(err, EMBER_ERR_INVALID_ARG,
                             "matmul: weight must be a 2-D float or quantized [N, %lld] tensor", (long long)K);
        if (cpu_row_bytes(m->w->dtype, K) == 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: rows of %lld are not whole %s blocks",
                             (long long)K, ember_dtype_get(m->w->dtype)->name);
        need[mm_act_kind(c->k, m->w->dtype, K)] = true;
        *tiles = *tiles || (c->k->qgemm_tiled[m->w->dtype] && M >= c->k->tiled_min_m);
        int64_t N = m->w->shape[0];
        if (ember_tensor_row_len(m->out) != N || ember_tensor_rows(m->out) != M)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output shape is not [%lld, %lld]",
                             (long long)M, (long long)N);
        if (m->bias && (m->bias->dtype != EMBER_F32 || ember_tensor_nelem(m->bias) != N))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: bias must be f32 [%lld]", (long long)N);
        total += N;
    }
    if (total > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output too large");
    *j = (mm_job){.k = c->k, .mlx_gemm = c->mlx_gemm, .x = host(x), .M = (int)M, .K = (int)K, .n = n, .mm = mm,
                  .each = each};
    for (int i = 0; i < n; i++) {
        ember_dtype dt = mm[i].w->dtype;
        if (!c->k->qgemm_packed[dt]) continue;
        size_t b = cpu_qmatmul_scratch_bytes(dt, (int)K, (int)M);
        if (b > *qs) *qs = b;
        j->packed[i] = w_packed(c, mm[i].w);
        if (!j->packed[i] && packable(c, mm[i].w)) c->n_unprepared++;
    }
    int64_t want = total / ((int64_t)c->n_threads * 8);
    int block = (int)((want + CPU_QP_ROWS - 1) & ~(int64_t)(CPU_QP_ROWS - 1));
    if (block < CPU_QP_ROWS) block = CPU_QP_ROWS;
    j->block = block;
    j->first_task[0] = 0;
    for (int i = 0; i < n; i++) {
        int N = (int)mm[i].w->shape[0];
        j->first_task[i + 1] = j->first_task[i] + (N + block - 1) / block;
    }
    return EMBER_OK;
}

/* matmul and matmul_each (mm_prepare); one pool run for all the products. */
static int matmul_run(cpu_backend *c, const ember_tensor *x, int n, const ember_matmul *mm, bool each,
                      ember_error *err) {
    if (n > MAX_MM_API)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %d products (1..%d allowed)", n, MAX_MM_API);
    mm_job j;
    bool need[CPU_ACT_COUNT] = {false}, tiles;
    size_t qs = 0;
    int rc = mm_prepare(c, x, n, mm, each, &j, need, &tiles, &qs, err);
    if (rc) return rc;
    const int Mx = (int)ember_tensor_rows(x); /* rows to quantize */
    for (int kind = CPU_ACT_32; kind < CPU_ACT_COUNT; kind++)
        if (need[kind] && (rc = quantize_acts(c, j.x, Mx, j.K, (cpu_act_kind)kind, &j.act[kind],
                                              kind == CPU_ACT_32 && tiles ? &j.act_tiled : NULL, err)))
            return rc;
    if ((rc = ensure_qscratch(c, qs, err))) return rc;
    j.qscratch = c->qscratch;
    j.qscratch_bytes = c->qscratch_bytes;
    ember_pool_run(c->pool, j.first_task[n], mm_task, &j);
    return EMBER_OK;
}

static int cpu_matmul(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm,
                      ember_error *err) {
    return matmul_run(cpu(be), x, n, mm, false, err);
}

static int cpu_matmul_each(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm,
                           ember_error *err) {
    return matmul_run(cpu(be), x, n, mm, true, err);
}

/* ---- rope ------------------------------------------------------------------------ */

typedef struct rope_job {
    const cpu_kernels *k;
    float *x;
    const int32_t *pos;
    const ember_rope *r;
    int H, D;
} rope_job;

/* cs[i], sn[i] (i < n_rot / 2): the rotation of position p, scaled by
   attn_factor. */
static void rope_angles(const ember_rope *r, int32_t p, float *cs, float *sn) {
    const int half = r->n_rot / 2;
    for (int i = 0; i < half; i++) {
        float angle = (float)p * r->inv_freq[i];
        cs[i] = (float)cos((double)angle) * r->attn_factor;
        sn[i] = (float)sin((double)angle) * r->attn_factor;
    }
}

static void rope_task(void *ctx, int t, int thread) {
    (void)thread;
    const rope_job *j = ctx;
    float cs[512], sn[512];
    rope_angles(j->r, j->pos[t], cs, sn);
    j->k->rope_rotate(j->x + (size_t)t * (size_t)j->H * (size_t)j->D, j->H, j->D, j->r->n_rot / 2,
                      j->r->mode == EMBER_ROPE_NEOX, cs, sn);
}

/* The checks of rope on x [T, H, D] with r: EMBER_OK or INVALID_ARG. */
static int rope_check(const ember_tensor *x, const ember_rope *r, const char *op, const char *what,
                      ember_error *err) {
    int rc = need_f32(x, op, what, err);
    if (rc) return rc;
    if (x->ndim != 3) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s must be [T, H, D]", op, what);
    const int D = (int)x->shape[2];
    if (r->n_rot < 2 || r->n_rot % 2 || r->n_rot > D || r->n_rot > 1024)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %d rotated dims for head size %d", op, r->n_rot, D);
    return EMBER_OK;
}

static int cpu_rope(ember_backend *be, ember_tensor *x, const int32_t *pos, const ember_rope *r,
                    ember_error *err) {
    int rc = rope_check(x, r, "rope", "x", err);
    if (rc) return rc;
    int T = (int)x->shape[0], H = (int)x->shape[1], D = (int)x->shape[2];
    rope_job j = {cpu(be)->k, host(x), pos, r, H, D};
    rows_run(cpu(be), T, (int64_t)H * D, ROWS_GRAIN, rope_task, &j, "rope_task");
    return EMBER_OK;
}

/* ---- paged KV: write, read, attention ----------------------------------------------- */

/* The piece of head h, K (is_k) or V, holding position p of ref. */
static unsigned char *kv_piece(const ember_kv_map *map, const ember_kv_rowref *ref, int p, int h, bool is_k) {
    const ember_kv_layer *L = &map->views[ref->layer_set];
    int32_t blk = ref->blocks[p / EMBER_KV_BLOCK - ref->first];
    unsigned char *b = (unsigned char *)host(L->pool) + (size_t)blk * L->block_bytes;
    return is_k ? b + L->k_off + (size_t)h * L->k.head_bytes : b + L->v_off + (size_t)h * L->v.head_bytes;
}

#define KV_GROUP_MAX 1024 /* tokens and row ids a batch may have to be grouped by row */

typedef struct kvrw_job {
    const ember_kv_map *map;
    float *k, *v;
    int T, H, D;
    bool write;
    bool split;  /* a task per head and token (every token of another row), else per head */
    int n_grp;   /* > 0: a task per head and row, the row's tokens ord[grp[g] .. grp[g + 1]) */
    const int16_t *ord, *grp;
} kvrw_job;

/* Stores (write) or loads token t's head h of k and v at its row's position. */
static void kvrw_one(const kvrw_job *j, int t, int h) {
    const ember_kv_rowref *ref = &j->map->refs[j->map->row[t]];
    const ember_kv_layer *L = &j->map->views[ref->layer_set];
    int p = j->map->pos[t], slot = p % EMBER_KV_BLOCK;
    size_t off = ((size_t)t * (size_t)j->H + (size_t)h) * (size_t)j->D;
    unsigned char *kp = kv_piece(j->map, ref, p, h, true), *vp = kv_piece(j->map, ref, p, h, false);
    if (j->write) {
        /* the row's previous block, which a block's first slot may read */
        int pb = p / EMBER_KV_BLOCK - 1;
        const unsigned char *prev = NULL;
        if (slot == 0 && pb >= ref->first && ref->blocks[pb - ref->first] >= 0)
            prev = kv_piece(j->map, ref, pb * EMBER_KV_BLOCK, h, true);
        ember_kv_encode(&L->k, j->D, true, j->k + off, kp, slot, prev, NULL);
        ember_kv_encode(&L->v, j->D, false, j->v + off, vp, slot, NULL, NULL);
    } else {
        ember_kv_decode(&L->k, j->D, true, kp, slot, j->k + off);
        ember_kv_decode(&L->v, j->D, false, vp, slot, j->v + off);
    }
}

/* One head of every token, or of one token where each token has its own row:
   pieces of different heads never share bytes, nor blocks of different rows;
   a row's tokens stay in one task, in order (a block's first slot may read
   the piece its previous block's tokens wrote). */
static void kvrw_task(void *ctx, int task, int thread) {
    (void)thread;
    const kvrw_job *j = ctx;
    if (j->n_grp > 0) { /* one row's tokens, in the batch's order */
        const int g = task / j->H, h = task % j->H;
        for (int i = j->grp[g]; i < j->grp[g + 1]; i++) kvrw_one(j, j->ord[i], h);
        return;
    }
    const int h = j->split ? task % j->H : task;
    const int t0 = j->split ? task / j->H : 0, t1 = j->split ? t0 + 1 : j->T;
    for (int t = t0; t < t1; t++) kvrw_one(j, t, h);
}

/* true when each of the T tokens of map is another row (a decode step),
   T <= 1,024 and every row id below 1,024 (the common case; false
   otherwise, which only costs the split). */
static bool rows_distinct(const ember_kv_map *map, int T) {
    if (T > 1024) return false;
    uint64_t seen[16] = {0};
    for (int t = 0; t < T; t++) {
        const int r = map->row[t];
        if (r < 0 || r >= 1024 || (seen[r / 64] >> (r % 64) & 1)) return false;
        seen[r / 64] |= 1ull << (r % 64);
    }
    return true;
}

/* Runs j (its map, tensors, T, H, D and direction set) as a task per head, or
   where there are more threads than heads, per head and token (each token
   another row: a decode step) or per head and row (several rows' tokens: a
   decode step beside prompt chunks, each row's tokens in order). Rows never
   share a block they write (kv.c copies a shared last block first). A
   16-row step of a model with 2 KV heads is 32 tasks, not 2 (on 2 threads
   the split measured no faster). */
static void kvrw_run(cpu_backend *c, kvrw_job *j) {
    int16_t ord[KV_GROUP_MAX], grp[KV_GROUP_MAX + 1];
    const int T = j->T;
    j->split = false;
    j->n_grp = 0;
    if (T > 1 && j->H < c->n_threads) {
        j->split = rows_distinct(j->map, T);
        if (!j->split && T <= KV_GROUP_MAX && j->map->n_refs <= KV_GROUP_MAX) {
            /* counting sort of the tokens by row, stable */
            int16_t cnt[KV_GROUP_MAX + 1] = {0};
            int n_rows = 0;
            for (int t = 0; t < T; t++) n_rows += cnt[j->map->row[t] + 1]++ == 0;
            if (n_rows > 1) {
                for (int r = 0; r < j->map->n_refs; r++) cnt[r + 1] = (int16_t)(cnt[r + 1] + cnt[r]);
                int16_t at[KV_GROUP_MAX];
                memcpy(at, cnt, sizeof(int16_t) * (size_t)j->map->n_refs);
                for (int t = 0; t < T; t++) ord[at[j->map->row[t]]++] = (int16_t)t;
                for (int r = 0; r < j->map->n_refs; r++)
                    if (cnt[r + 1] > cnt[r]) grp[j->n_grp++] = cnt[r];
                grp[j->n_grp] = (int16_t)T;
                j->ord = ord;
                j->grp = grp;
            }
        }
    }
    ember_pool_run(c->pool, j->split ? T * j->H : j->n_grp > 0 ? j->n_grp * j->H : j->H, kvrw_task, j);
}

static int cpu_kv_rw(ember_backend *be, const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v,
                     bool write, ember_error *err) {
    const char *op = write ? "kv_write" : "kv_read";
    int rc;
    if ((rc = need_f32(k, op, "k", err)) || (rc = need_f32(v, op, "v", err))) return rc;
    int T, H, D;
    if ((rc = ember_kv_rw_check(map, k, v, op, &T, &H, &D, err))) return rc;
    kvrw_job j = {map, host(k), host(v), T, H, D, write, false, 0, NULL, NULL};
    kvrw_run(cpu(be), &j);
    return EMBER_OK;
}

static int cpu_kv_write(ember_backend *be, const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v,
                        ember_error *err) {
    return cpu_kv_rw(be, map, k, v, true, err);
}

static int cpu_kv_read(ember_backend *be, const ember_kv_map *map, ember_tensor *k, ember_tensor *v,
                       ember_error *err) {
    return cpu_kv_rw(be, map, k, v, false, err);
}

/* ---- fused: rope of q and k, then kv_write (backend.h rope_kv_write) ---------------- */

typedef struct ropekv_job {
    rope_job q, k;
    kvrw_job kv; /* kv.split: each token another row, so its heads are stored in its own task */
} ropekv_job;

/* Token t: its q and k heads rotated (the angles computed once for both),
   then, where kv.split, its K and V heads stored. */
static void ropekv_task(void *ctx, int t, int thread) {
    (void)thread;
    const ropekv_job *j = ctx;
    float cs[512], sn[512];
    rope_angles(j->q.r, j->q.pos[t], cs, sn);
    const int half = j->q.r->n_rot / 2;
    const bool neox = j->q.r->mode == EMBER_ROPE_NEOX;
    j->q.k->rope_rotate(j->q.x + (size_t)t * (size_t)j->q.H * (size_t)j->q.D, j->q.H, j->q.D, half, neox, cs, sn);
    j->q.k->rope_rotate(j->k.x + (size_t)t * (size_t)j->k.H * (size_t)j->k.D, j->k.H, j->k.D, half, neox, cs, sn);
    if (j->kv.split)
        for (int h = 0; h < j->kv.H; h++) kvrw_one(&j->kv, t, h);
}

/* rope(q), rope(k), kv_write(map, k, v) with their bits, in one pool run
   where each token is another row (a decode step: a task a token), else in
   two (the rotations a task a token, then the stores as kv_write splits
   them, a row's tokens in order). */
static int cpu_rope_kv_write(ember_backend *be, ember_tensor *q, ember_tensor *k, const ember_tensor *v,
                             const int32_t *pos, const ember_rope *r, const ember_kv_map *map, ember_error *err) {
    const char *op = "rope_kv_write";
    int rc, T, H, D;
    if ((rc = rope_check(q, r, op, "q", err)) || (rc = rope_check(k, r, op, "k", err)) ||
        (rc = need_f32(v, op, "v", err)) || (rc = ember_kv_rw_check(map, k, v, op, &T, &H, &D, err)))
        return rc;
    if (q->shape[0] != T)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: q has %lld tokens, k %d", op, (long long)q->shape[0], T);
    ropekv_job j = {{cpu(be)->k, host(q), pos, r, (int)q->shape[1], (int)q->shape[2]},
                    {cpu(be)->k, host(k), pos, r, H, D},
                    {map, host(k), host(v), T, H, D, true, false, 0, NULL, NULL}};
    j.kv.split = T == 1 || rows_distinct(map, T);
    /* a token's values: its q and k heads rotated, its K and V heads stored */
    rows_run(cpu(be), T, (int64_t)j.q.H * j.q.D + (j.kv.split ? 3 : 1) * (int64_t)H * D, ROWS_GRAIN, ropekv_task,
             &j, "ropekv_task");
    if (!j.kv.split) kvrw_run(cpu(be), &j.kv); /* kv_write's own split */
    return EMBER_OK;
}

/* Keys per attention span: a token's keys are reduced span by span, each
   span's softmax state computed alone and the states combined in order. */
#define ATTN_SPAN 512

typedef struct attn_job {
    cpu_backend *c;
    float *out;
    const float *q;  /* [T, Hq, D] */
    const ember_kv_map *map;
    const ember_attn *a;
    int T, Hq, Hkv, D, Dp, rep;
    int n_span;      /* spans per unit in the split mode (0: whole units) */
    float *parts;    /* split mode: [unit][span][rep][Dp + 2] */
} attn_job;

/* Keys [lo, hi] of token t. */
static void attn_keys(const attn_job *j, int t, int *lo, int *hi) {
    int p = j->map->pos[t], w = j->a->window;
    *hi = p;
    *lo = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

static void attn_setup(const attn_job *j, int t, int hk, cpu_attn_part *ap) {
    const ember_kv_rowref *ref = &j->map->refs[j->map->row[t]];
    const ember_kv_layer *L = &j->map->views[ref->layer_set];
    *ap = (cpu_attn_part){
        .q = j->q + ((size_t)t * (size_t)j->Hq + (size_t)hk * (size_t)j->rep) * (size_t)j->D,
        .rep = j->rep,
        .D = j->D,
        .pool = (const unsigned char *)host(L->pool),
        .block_bytes = L->block_bytes,
        .k_off = L->k_off + (size_t)hk * L->k.head_bytes,
        .v_off = L->v_off + (size_t)hk * L->v.head_bytes,
        .kc = &L->k,
        .vc = &L->v,
        .blocks = ref->blocks,
        .first = ref->first,
        .scale = j->a->scale,
        .softcap = j->a->softcap,
    };
}

/* (M, L, A) = combine((M, L, A), (m, l, a)) per head: plain C, the same on every ISA. */
static void attn_combine(int rep, int Dp, float *M, float *L, float *A, const float *m, const float *l,
                         const float *a) {
    for (int h = 0; h < rep; h++) {
        float mn = M[h] > m[h] ? M[h] : m[h];
        float ca = M[h] == -INFINITY ? 0.0f : expf(M[h] - mn), cb = m[h] == -INFINITY ? 0.0f : expf(m[h] - mn);
        L[h] = L[h] * ca + l[h] * cb;
        float *Ah = A + (size_t)h * (size_t)Dp;
        const float *ah = a + (size_t)h * (size_t)Dp;
        for (int d = 0; d < Dp; d++) Ah[d] = Ah[d] * ca + ah[d] * cb;
        M[h] = mn;
    }
}

/* out = A / L per head, rotated back where V is TQ. */
static void attn_finish(const attn_job *j, int t, int hk, const float *L, const float *A) {
    const ember_kv_rowref *ref = &j->map->refs[j->map->row[t]];
    const ember_kv_layer *Ly = &j->map->views[ref->layer_set];
    for (int h = 0; h < j->rep; h++) {
        float *o = j->out + ((size_t)t * (size_t)j->Hq + (size_t)hk * (size_t)j->rep + (size_t)h) * (size_t)j->D;
        float inv = L[h] > 0 ? 1.0f / L[h] : 0.0f;
        for (int d = 0; d < j->D; d++) o[d] = A[(size_t)h * (size_t)j->Dp + (size_t)d] * inv;
        if (Ly->v.enc == EMBER_KVE_TQ) ember_tq_unrotate(Ly->v.signs, j->D, o, o);
    }
}

/* Per-thread scratch of an attention task, in floats. */
/* kern_attn.h's scratch: vd, tmp, the scores, and TQ's rotated queries. */
static size_t attn_part_floats(int rep, int Dp) {
    return (size_t)16 * (size_t)Dp + 32 + (size_t)rep * (ATTN_SPAN + 16) + ((size_t)rep + 2) * (size_t)Dp +
           (size_t)rep + 2 * (size_t)rep * (size_t)Dp;
}
static size_t attn_scratch_floats(int rep, int Dp) {
    return attn_part_floats(rep, Dp) + 2 * ((size_t)rep * ((size_t)Dp + 2));
}

/* A whole unit (token, KV head): every span in order, combined as it goes. */
static void attn_unit_task(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    int t = task / j->Hkv, hk = task % j->Hkv, lo, hi;
    attn_keys(j, t, &lo, &hi);
    cpu_attn_part ap;
    attn_setup(j, t, hk, &ap);
    const size_t R = (size_t)j->rep, Dp = (size_t)j->Dp;
    float *s = j->c->scratch + (size_t)thread * j->c->scratch_floats;
    float *m = s + attn_part_floats(j->rep, j->Dp), *l = m + R, *acc = l + R, *M = acc + R * Dp, *Lt = M + R,
          *A = Lt + R;
    for (size_t h = 0; h < R; h++) {
        M[h] = -INFINITY;
        Lt[h] = 0;
    }
    memset(A, 0, R * Dp * sizeof *A);
    for (int s0 = lo / ATTN_SPAN; s0 <= hi / ATTN_SPAN; s0++) {
        int j0 = s0 * ATTN_SPAN > lo ? s0 * ATTN_SPAN : lo, j1 = (s0 + 1) * ATTN_SPAN < hi + 1 ? (s0 + 1) * ATTN_SPAN : hi + 1;
        j->c->k->attn_part(&ap, j0, j1, m, l, acc, s);
        attn_combine(j->rep, j->Dp, M, Lt, A, m, l, acc);
    }
    attn_finish(j, t, hk, Lt, A);
}

/* Split mode, pass 1: one span of one unit into its slot of j->parts. */
static void attn_span_task(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    int unit = task / j->n_span, sp = task % j->n_span;
    int t = unit / j->Hkv, hk = unit % j->Hkv, lo, hi;
    attn_keys(j, t, &lo, &hi);
    int s0 = lo / ATTN_SPAN + sp;
    if (s0 > hi / ATTN_SPAN) return;
    int j0 = s0 * ATTN_SPAN > lo ? s0 * ATTN_SPAN : lo, j1 = (s0 + 1) * ATTN_SPAN < hi + 1 ? (s0 + 1) * ATTN_SPAN : hi + 1;
    cpu_attn_part ap;
    attn_setup(j, t, hk, &ap);
    const size_t R = (size_t)j->rep, Dp = (size_t)j->Dp;
    float *part = j->parts + ((size_t)unit * (size_t)j->n_span + (size_t)sp) * R * (Dp + 2);
    float *s = j->c->scratch + (size_t)thread * j->c->scratch_floats;
    j->c->k->attn_part(&ap, j0, j1, part, part + R, part + 2 * R, s);
}

/* Split mode, pass 2: combine a unit's spans in order. */
static void attn_merge_task(void *ctx, int unit, int thread) {
    const attn_job *j = ctx;
    int t = unit / j->Hkv, hk = unit % j->Hkv, lo, hi;
    attn_keys(j, t, &lo, &hi);
    const size_t R = (size_t)j->rep, Dp = (size_t)j->Dp;
    float *s = j->c->scratch + (size_t)thread * j->c->scratch_floats;
    float *M = s, *Lt = M + R, *A = Lt + R;
    for (size_t h = 0; h < R; h++) {
        M[h] = -INFINITY;
        Lt[h] = 0;
    }
    memset(A, 0, R * Dp * sizeof *A);
    int ns = hi / ATTN_SPAN - lo / ATTN_SPAN + 1;
    for (int sp = 0; sp < ns; sp++) {
        const float *part = j->parts + ((size_t)unit * (size_t)j->n_span + (size_t)sp) * R * (Dp + 2);
        attn_combine(j->rep, j->Dp, M, Lt, A, part, part + R, part + 2 * R);
    }
    attn_finish(j, t, hk, Lt, A);
}

static int cpu_attention(ember_backend *be, ember_tensor *out, const ember_tensor *q, const ember_kv_map *map,
                         const ember_attn *a, ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc;
    if ((rc = need_f32(out, "attention", "out", err)) || (rc = need_f32(q, "attention", "q", err))) return rc;
    if (q->ndim != 3 || out->ndim != 3 || out->shape[0] != q->shape[0] || out->shape[1] != q->shape[1] ||
        out->shape[2] != q->shape[2] || q->shape[0] > INT32_MAX / 64)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: q and out must both be [T, Hq, D]");
    int T = (int)q->shape[0], Hq = (int)q->shape[1], D = (int)q->shape[2];
    if (!map || !map->views || map->n_views < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: incomplete KV map");
    int Hkv = map->views[0].n_heads;
    if (Hkv < 1 || Hq % Hkv) return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: %d query heads over %d KV heads", Hq, Hkv);
    if ((rc = ember_kv_map_check(map, T, Hkv, D, "attention", err))) return rc;
    for (int t = 0; t < T; t++) { /* every key of the window must be there */
        int p = map->pos[t], lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        if ((rc = ember_kv_map_check_blocks(map, map->row[t], lo, p, "attention", err))) return rc;
    }
    const int rep = Hq / Hkv, Dp = (D + 15) & ~15, units = T * Hkv;
    const float *qd = host(q);
    if ((rc = ensure_scratch(c, attn_scratch_floats(rep, Dp), err))) return rc;
    attn_job j = {c, host(out), qd, map, a, T, Hq, Hkv, D, Dp, rep, 0, NULL};
    int max_span = 1;
    for (int t = 0; t < T; t++) {
        int lo, hi;
        attn_keys(&j, t, &lo, &hi);
        int ns = hi / ATTN_SPAN - lo / ATTN_SPAN + 1;
        if (ns > max_span) max_span = ns;
    }
    if (units >= 2 * c->n_threads || max_span == 1 || c->n_threads == 1) {
        ember_pool_run(c->pool, units, attn_unit_task, &j);
        return EMBER_OK;
    }
    /* few units and long contexts: spans run in parallel, then merge */
    size_t need = (size_t)units * (size_t)max_span * (size_t)rep * ((size_t)Dp + 2);
    if (need > c->attn_parts_cap) {
        float *np = ember_realloc(c->attn_parts, need * sizeof *np);
        if (!np) return ember_err(err, EMBER_ERR_NOMEM, "attention: out of memory");
        c->attn_parts = np;
        c->attn_parts_cap = need;
    }
    j.n_span = max_span;
    j.parts = c->attn_parts;
    ember_pool_run(c->pool, units * max_span, attn_span_task, &j);
    ember_pool_run(c->pool, units, attn_merge_task, &j);
    return EMBER_OK;
}

static int cpu_copy(ember_backend *be, ember_tensor *dst, size_t doff, const ember_tensor *src, size_t soff, size_t n,
                    ember_error *err) {
    (void)be;
    size_t de, se;
    if (!dst || !src || !dst->buf || !src->buf || !ember_add_ok(doff, n, &de) || !ember_add_ok(soff, n, &se) ||
        de > dst->nbytes || se > src->nbytes)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "copy: range outside its tensor");
    unsigned char *d = (unsigned char *)host(dst) + doff;
    const unsigned char *s = (const unsigned char *)host(src) + soff;
    if (n && ((d < s && d + n > s) || (s < d && s + n > d)))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "copy: ranges overlap");
    if (n) memcpy(d, s, n);
    return EMBER_OK;
}

/* ---- elementwise --------------------------------------------------------------------- */

/* Elements a task of an elementwise op takes: about EW_TASKS_PER_THREAD
   tasks a thread, but never fewer than EW_MIN_FN elements for the kinds that
   call expf or tanhf (a few ns an element: a decode row's swiglu of 4,864
   is worth splitting) or EW_MIN for plain arithmetic (bound by memory). */
#define EW_MIN 16384
#define EW_MIN_FN 1024
#define EW_TASKS_PER_THREAD 4

typedef struct ew_job {
    const cpu_kernels *k;
    float *dst;
    const float *a, *b;
    int64_t n, chunk; /* elements in all; a task's */
    int kind; /* 0 swiglu, 1 add, 2 geglu, 3 scale, 4 softcap, 5 sigmoid_mul */
    float s;  /* scale, cap */
} ew_job;

/* gelu with the tanh approximation, as torch computes it in f32. */
static inline float gelu_tanh(float x) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2 / pi) */
    float inner = beta * (x + kappa * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}

/* dst[i] = silu(a[i]) * b[i] (k's silu_mul) or gelu_tanh(a[i]) * b[i] (when
   geglu) for i in [i0, i1): swiglu and geglu, and the MoE token's experts
   (moe_token). */
static void glu_range(const cpu_kernels *k, float *dst, const float *a, const float *b, int64_t i0, int64_t i1,
                      bool geglu) {
    if (geglu) {
        for (int64_t i = i0; i < i1; i++) dst[i] = gelu_tanh(a[i]) * b[i];
        return;
    }
    k->silu_mul(dst + i0, a + i0, b + i0, i1 - i0);
}

static void ew_task(void *ctx, int task, int thread) {
    (void)thread;
    const ew_job *j = ctx;
    int64_t i0 = (int64_t)task * j->chunk, i1 = i0 + j->chunk < j->n ? i0 + j->chunk : j->n;
    if (j->kind == 0 || j->kind == 2) {
        glu_range(j->k, j->dst, j->a, j->b, i0, i1, j->kind == 2);
    } else if (j->kind == 1) {
        j->k->add(j->dst + i0, j->a + i0, j->b + i0, i1 - i0);
    } else if (j->kind == 3) {
        for (int64_t i = i0; i < i1; i++) j->dst[i] = j->a[i] * j->s;
    } else if (j->kind == 4) {
        for (int64_t i = i0; i < i1; i++) j->dst[i] = tanhf(j->a[i] / j->s) * j->s;
    } else {
        for (int64_t i = i0; i < i1; i++) j->dst[i] = j->a[i] * (1.0f / (1.0f + expf(-j->b[i])));
    }
}

static int run_ew(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
                  int kind, float s, const char *op, ember_error *err) {
    int rc;
    if ((rc = need_f32(dst, op, "dst", err)) || (rc = need_f32(a, op, "a", err)) ||
        (rc = need_f32(b, op, "b", err)))
        return rc;
    int64_t n = ember_tensor_nelem(dst);
    if (ember_tensor_nelem(a) != n || ember_tensor_nelem(b) != n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: sizes differ", op);
    const int64_t per = (n + EW_TASKS_PER_THREAD * cpu(be)->n_threads - 1) / (EW_TASKS_PER_THREAD * cpu(be)->n_threads);
    const int64_t least = kind == 1 || kind == 3 ? EW_MIN : EW_MIN_FN;
    ew_job j = {cpu(be)->k, host(dst), host(a), host(b), n, per > least ? per : least, kind, s};
    int64_t tasks = (n + j.chunk - 1) / j.chunk;
    if (tasks > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: too large", op);
    ember_pool_run(cpu(be)->pool, (int)tasks, ew_task, &j);
    return EMBER_OK;
}

static int cpu_swiglu(ember_backend *be, ember_tensor *dst, const ember_tensor *gate,
                      const ember_tensor *up, ember_error *err) {
    return run_ew(be, dst, gate, up, 0, 0.0f, "swiglu", err);
}

static int cpu_geglu(ember_backend *be, ember_tensor *dst, const ember_tensor *gate,
                     const ember_tensor *up, ember_error *err) {
    return run_ew(be, dst, gate, up, 2, 0.0f, "geglu", err);
}

static int cpu_scale(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float s, ember_error *err) {
    return run_ew(be, dst, a, a, 3, s, "scale", err);
}

static int cpu_softcap(ember_backend *be, ember_tensor *dst, const ember_tensor *a, float cap, ember_error *err) {
    if (!(cap > 0)) return ember_err(err, EMBER_ERR_INVALID_ARG, "softcap: cap %g is not positive", (double)cap);
    return run_ew(be, dst, a, a, 4, cap, "softcap", err);
}

static int cpu_add(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
                   ember_error *err) {
    return run_ew(be, dst, a, b, 1, 0.0f, "add", err);
}

static int cpu_sigmoid_mul(ember_backend *be, ember_tensor *dst, const ember_tensor *x, const ember_tensor *gate,
                           ember_error *err) {
    return run_ew(be, dst, x, gate, 5, 0.0f, "sigmoid_mul", err);
}

/* ---- recurrent state (cpu_delta.c) ----------------------------------------------------- */

static int cpu_delta_net(ember_backend *be, ember_tensor *out, const ember_tensor *x, const ember_tensor *b,
                         const ember_tensor *a_in, const ember_delta_w *w, const ember_rec_map *map, ember_error *err) {
    int rc;
    if ((rc = need_f32(out, "delta_net", "out", err)) || (rc = need_f32(x, "delta_net", "x", err)) ||
        (rc = need_f32(b, "delta_net", "b", err)) || (rc = need_f32(a_in, "delta_net", "a", err)) || (rc = need_f32(w->conv, "delta_net", "conv", err)) ||
        (rc = w->a_neg ? need_f32(w->a_neg, "delta_net", "a_neg", err) : need_f32(w->a_log, "delta_net", "a_log", err)) ||
        (rc = need_f32(w->dt_bias, "delta_net", "dt_bias", err)))
        return rc;
    if ((rc = ember_delta_net_check(out, x, b, a_in, w, map, err))) return rc;
    const ember_rec_layer *L = map->layer;
    const int64_t T = ember_tensor_rows(x);
    float **logs = ember_calloc((size_t)map->n_refs + 1, sizeof *logs); /* each row's log, host side */
    if (!logs) return ember_err(err, EMBER_ERR_NOMEM, "out of memory in delta_net");
    for (int64_t t = 0; t < T; t++) {
        const ember_rec_rowref *ref = &map->refs[map->row[t]];
        if (ref->log) logs[map->row[t]] = host(ref->log);
    }
    if (!rc) {
        cpu_delta_args a = {host(out), host(x), host(b), host(a_in), host(w->conv), w->a_neg ? NULL : host(w->a_log),
                            host(w->dt_bias), host(L->pool), logs, map, (int)T, w->a_neg ? host(w->a_neg) : NULL};
        rc = cpu_delta_run(cpu(be)->pool, &a, &cpu(be)->delta_scratch, &cpu(be)->delta_cap, err);
    }
    free(logs);
    return rc;
}

static int cpu_delta_replay(ember_backend *be, const ember_rec_layer *layers, int n_layers, int32_t src, int32_t dst,
                            const ember_tensor *log, int n, ember_error *err) {
    (void)be;
    int rc = ember_delta_replay_check(layers, n_layers, src, dst, log, n, err);
    if (rc) return rc;
    return cpu_delta_rebuild(layers, n_layers, host(layers[0].pool), src, dst, host(log), n, err);
}

/* The MoE combine (backend.h). One thread: n * D multiply-adds, small
   beside the experts' matmuls; a row's terms land in i order. */
/* d[0 .. D) += w * s[0 .. D): one term of add_rows_scaled (and moe_token). */
static void add_scaled(float *d, const float *s, float w, int64_t D) {
    for (int64_t j = 0; j < D; j++) d[j] += w * s[j];
}

static int cpu_add_rows_scaled(ember_backend *be, ember_tensor *dst, const ember_tensor *src, const int32_t *ids,
                               const float *w, int n, ember_error *err) {
    (void)be;
    int rc;
    if ((rc = need_f32(dst, "add_rows_scaled", "dst", err)) || (rc = need_f32(src, "add_rows_scaled", "src", err)) ||
        (rc = ember_rows_scaled_check(dst, src, ids, n, err)))
        return rc;
    const int64_t D = ember_tensor_row_len(dst);
    float *d0 = host(dst);
    const float *s0 = host(src);
    for (int i = 0; i < n; i++) add_scaled(d0 + (size_t)ids[i] * (size_t)D, s0 + (size_t)i * (size_t)D, w[i], D);
    return EMBER_OK;
}

/* ---- moe_token: one token's routed experts in one pool run --------------------------- */

#define MOE_TOKEN_MAX (MAX_MM / 2)

/* Tasks [0, n_gu) are gu's (expert j's gate and up products are products
   2j and 2j + 1), tasks [n_gu, n_gu + n_dn) dn's (expert j's down product
   is product j, on row j of g). The pool hands tasks out in increasing
   order, so when a down task of expert j is taken every gate / up task of
   j has been taken already: it waits (spinning) only for those to finish,
   never for a task not yet started. The task that finishes an expert's
   last gate / up part runs its activation (glu_range on row j) and
   quantizes row j for the down products (act_task), then marks it ready;
   the task that finishes the last down part adds the n results into dst
   in expert order. */
typedef struct moe_job {
    mm_job gu, dn;
    int n_gu, n_dn, n;
    act_job act[CPU_ACT_COUNT]; /* the down products' activation rows, per kind they read (dst NULL: unused) */
    float *g;                   /* [n, I] gate rows, activated in place */
    const float *u;             /* [n, I] */
    int64_t I, H;
    bool geglu;
    float *dst;           /* [H] */
    const float *y;       /* [n, H] */
    const float *w;       /* [n] */
    atomic_int gu_left[MOE_TOKEN_MAX]; /* gate / up tasks of expert j not finished */
    atomic_int ready[MOE_TOKEN_MAX];   /* expert j's activation row is written */
    atomic_int dn_left;                /* down tasks not finished */
} moe_job;

/* Task task of a moe_job (see above): a gate / up row block, or a down row
   block of an expert whose activation row is ready; the pool's task fn. */
static void moe_task(void *ctx, int task, int thread) {
    moe_job *j = ctx;
    if (task < j->n_gu) {
        mm_task(&j->gu, task, thread);
        int i = 0;
        while (task >= j->gu.first_task[i + 1]) i++;
        const int e = i / 2;
        if (atomic_fetch_sub_explicit(&j->gu_left[e], 1, memory_order_acq_rel) != 1) return;
        glu_range(j->gu.k, j->g + (size_t)e * (size_t)j->I, j->g + (size_t)e * (size_t)j->I,
                  j->u + (size_t)e * (size_t)j->I, 0, j->I, j->geglu);
        for (int k = CPU_ACT_32; k < CPU_ACT_COUNT; k++)
            if (j->act[k].dst) act_task(&j->act[k], e, thread);
        atomic_store_explicit(&j->ready[e], 1, memory_order_release);
        return;
    }
    const int t = task - j->n_gu;
    int e = 0;
    while (t >= j->dn.first_task[e + 1]) e++;
    while (!atomic_load_explicit(&j->ready[e], memory_order_acquire)) CPU_PAUSE();
    mm_task(&j->dn, t, thread);
    if (atomic_fetch_sub_explicit(&j->dn_left, 1, memory_order_acq_rel) != 1) return;
    for (int k = 0; k < j->n; k++) add_scaled(j->dst, j->y + (size_t)k * (size_t)j->H, j->w[k], j->H);
}

/* The steps moe_token stands for, one op after another, where the fused
   run does not apply: a table whose tiled kernels take one row, or down
   projections on split-bf16 rows (their kernels load whole 16-row tiles,
   which would read rows other tasks are still writing). */
static int moe_token_steps(ember_backend *be, ember_tensor *dst, const ember_tensor *x, int n,
                           const ember_matmul *gu, const ember_matmul *dn, const float *w, bool geglu,
                           ember_tensor *g, ember_tensor *u, ember_tensor *y, ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc;
    for (int k = 0; k < 2 * n; k += MAX_MM_API) /* in calls of MAX_MM_API products */
        if ((rc = matmul_run(c, x, 2 * n - k < MAX_MM_API ? 2 * n - k : MAX_MM_API, gu + k, false, err))) return rc;
    if ((rc = run_ew(be, g, g, u, geglu ? 2 : 0, 0.0f, geglu ? "geglu" : "swiglu", err)) ||
        (rc = matmul_run(c, g, n, dn, true, err)))
        return rc;
    for (int k = 0; k < n; k++)
        add_scaled(host(dst), (const float *)host(y) + (size_t)k * (size_t)ember_tensor_row_len(y), w[k],
                   ember_tensor_row_len(dst));
    return EMBER_OK;
}

/* backend.h's moe_token: one pool run of moe_task where it applies, else
   moe_token_steps. */
static int cpu_moe_token(ember_backend *be, ember_tensor *dst, const ember_tensor *x, int n, const ember_tensor *ex,
                         const float *w, bool geglu, ember_tensor *g, ember_tensor *u, ember_tensor *y,
                         ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc;
    if (n < 1 || n > MOE_TOKEN_MAX || !ex || !w)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "moe_token: %d experts (1..%d allowed)", n, MOE_TOKEN_MAX);
    if ((rc = need_f32(dst, "moe_token", "dst", err)) || (rc = need_f32(x, "moe_token", "x", err)) ||
        (rc = need_f32(g, "moe_token", "g", err)) || (rc = need_f32(u, "moe_token", "u", err)) ||
        (rc = need_f32(y, "moe_token", "y", err)))
        return rc;
    const int64_t H = ember_tensor_row_len(x), I = ex[0].ndim == 2 ? ex[0].shape[0] : 0;
    if (ember_tensor_rows(x) != 1 || ember_tensor_nelem(dst) != H || I < 1 || ember_tensor_row_len(g) != I ||
        ember_tensor_row_len(u) != I || ember_tensor_row_len(y) != H || ember_tensor_rows(g) < n ||
        ember_tensor_rows(u) < n || ember_tensor_rows(y) < n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "moe_token: shapes do not match");
    ember_tensor gv[MOE_TOKEN_MAX], uv[MOE_TOKEN_MAX], yv[MOE_TOKEN_MAX], ga = *g, ua = *u;
    ember_matmul gum[MAX_MM], dnm[MOE_TOKEN_MAX];
    ga.ndim = ua.ndim = 2, ga.shape[0] = ua.shape[0] = n, ga.shape[1] = ua.shape[1] = I;
    ga.nbytes = ua.nbytes = (size_t)n * (size_t)I * 4;
    for (int k = 0; k < n; k++) { /* row k of g, u, y: product outputs [1, I] / [1, H] */
        gv[k] = ga, uv[k] = ua, yv[k] = *y;
        gv[k].shape[0] = uv[k].shape[0] = yv[k].shape[0] = 1;
        yv[k].ndim = 2, yv[k].shape[1] = H;
        gv[k].nbytes = uv[k].nbytes = (size_t)I * 4, yv[k].nbytes = (size_t)H * 4;
        gv[k].offset += (size_t)k * (size_t)I * 4, uv[k].offset += (size_t)k * (size_t)I * 4;
        yv[k].offset += (size_t)k * (size_t)H * 4;
        gum[2 * k] = (ember_matmul){&gv[k], &ex[3 * k], NULL};
        gum[2 * k + 1] = (ember_matmul){&uv[k], &ex[3 * k + 1], NULL};
        dnm[k] = (ember_matmul){&yv[k], &ex[3 * k + 2], NULL};
    }
    moe_job j = {.n = n, .g = host(&ga), .u = host(&ua), .I = I, .H = H, .geglu = geglu, .dst = host(dst),
                 .y = host(y), .w = w};
    bool need_gu[CPU_ACT_COUNT] = {false}, need_dn[CPU_ACT_COUNT] = {false}, tiles_gu, tiles_dn;
    size_t qs = 0;
    if ((rc = mm_prepare(c, x, 2 * n, gum, false, &j.gu, need_gu, &tiles_gu, &qs, err)) ||
        (rc = mm_prepare(c, &ga, n, dnm, true, &j.dn, need_dn, &tiles_dn, &qs, err)))
        return rc;
    if (tiles_gu || tiles_dn || need_dn[CPU_ACT_BF16X2]) return moe_token_steps(be, dst, x, n, gum, dnm, w, geglu, &ga, &ua, y, err);
    for (int k = CPU_ACT_32; k < CPU_ACT_COUNT; k++) { /* the down rows' buffers (A32 or A256 rows) */
        if (!need_dn[k]) continue;
        const size_t rb = cpu_act_row_bytes((cpu_act_kind)k, I);
        if ((rc = act_reserve(&c->act_moe[k], &c->act_moe_cap[k], rb * (size_t)n, err))) return rc;
        j.act[k] = (act_job){.k = c->k, .x = j.g, .dst = c->act_moe[k], .K = (int)I, .M = n, .kind = (cpu_act_kind)k};
        j.dn.act[k] = c->act_moe[k];
    }
    for (int k = CPU_ACT_32; k < CPU_ACT_COUNT; k++)
        if (need_gu[k] && (rc = quantize_acts(c, j.gu.x, 1, j.gu.K, (cpu_act_kind)k, &j.gu.act[k], NULL, err)))
            return rc;
    if ((rc = ensure_qscratch(c, qs, err))) return rc;
    j.gu.qscratch = j.dn.qscratch = c->qscratch;
    j.gu.qscratch_bytes = j.dn.qscratch_bytes = c->qscratch_bytes;
    j.n_gu = j.gu.first_task[2 * n];
    j.n_dn = j.dn.first_task[n];
    for (int k = 0; k < n; k++) {
        atomic_init(&j.gu_left[k], j.gu.first_task[2 * k + 2] - j.gu.first_task[2 * k]);
        atomic_init(&j.ready[k], 0);
    }
    atomic_init(&j.dn_left, j.n_dn);
    ember_pool_run(c->pool, j.n_gu + j.n_dn, moe_task, &j);
    return EMBER_OK;
}

/* ---- argmax_rows ------------------------------------------------------------------------ */

/* Greedy ids on the pool: a task per row, or per part of a row where there
   are fewer rows than threads (parts of at least AM_PART_MIN values, at most
   AM_PARTS_MAX part results in all), instead of the forward's serial loop. */
#define AM_PART_MIN 8192
#define AM_PARTS_MAX 256

typedef struct am_job {
    const cpu_kernels *k;
    const float *x; /* [n, V] */
    int64_t V, part_len;
    int parts;    /* per row */
    int32_t *out; /* parts == 1: [n] the ids */
    int64_t *idx; /* parts > 1: [n * parts] each part's first largest index, -1 when all NaN */
} am_job;

static void am_task(void *ctx, int task, int thread) {
    (void)thread;
    const am_job *j = ctx;
    const int r = task / j->parts, p = task % j->parts;
    const float *x = j->x + (size_t)r * (size_t)j->V;
    const int64_t i0 = (int64_t)p * j->part_len, i1 = i0 + j->part_len < j->V ? i0 + j->part_len : j->V;
    const int64_t r0 = j->k->argmax_range(x + i0, i1 - i0), best = r0 < 0 ? -1 : i0 + r0;
    if (j->parts == 1)
        j->out[r] = best < 0 ? 0 : (int32_t)best;
    else
        j->idx[task] = best;
}

static int cpu_argmax_rows(ember_backend *be, const ember_tensor *x, int32_t *out, int n, ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc = need_f32(x, "argmax_rows", "x", err);
    if (rc) return rc;
    const int64_t V = ember_tensor_row_len(x);
    if (n < 0 || ember_tensor_rows(x) < n || V < 1 || V > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "argmax_rows: %d rows of a [%lld, %lld] tensor", n,
                         (long long)ember_tensor_rows(x), (long long)V);
    if (n == 0) return EMBER_OK;
    int parts = 1;
    if (n < c->n_threads) {
        parts = (c->n_threads + n - 1) / n;
        while (parts > 1 && (V / parts < AM_PART_MIN || (int64_t)parts * n > AM_PARTS_MAX)) parts--;
    }
    int64_t idx[AM_PARTS_MAX];
    am_job j = {c->k, host(x), V, (V + parts - 1) / parts, parts, out, idx};
    ember_pool_run(c->pool, n * parts, am_task, &j);
    for (int r = 0; parts > 1 && r < n; r++) { /* parts in order: a later part wins only when larger */
        const float *row = j.x + (size_t)r * (size_t)V;
        int64_t best = -1;
        for (int p = 0; p < parts; p++) {
            const int64_t b = idx[r * parts + p];
            if (b >= 0 && (best < 0 || row[b] > row[best])) best = b;
        }
        out[r] = best < 0 ? 0 : (int32_t)best;
    }
    return EMBER_OK;
}

/* ---- life cycle ------------------------------------------------------------------------ */

static void cpu_free(ember_backend *be) {
    if (!be) return;
    cpu_backend *c = cpu(be);
    if (c->prof_path) {
        FILE *f = fopen(c->prof_path, "a");
        char what[96];
        snprintf(what, sizeof what, "EMBER_CPU_PROFILE, the CPU backend's pool (%s kernels)", ember_isa_name(c->k->isa));
        ember_pool_profile_write(c->pool, f, what);
        if (f) fclose(f);
        free(c->prof_path);
    }
    ember_pool_free(c->pool);
    free(c->scratch);
    free(c->qscratch);
    free(c->attn_parts);
    free(c->delta_scratch);
    for (int i = 0; i < CPU_ACT_COUNT; i++) free(c->act[i]), free(c->act_moe[i]);
    free(c->act_tiled);
    free(c);
}

/* The backend's host_run: the tasks on the pool, named for its profile. */
static void cpu_host_run(ember_backend *be, int n, ember_task_fn fn, void *ctx) {
    ember_pool_run_named(cpu(be)->pool, n, fn, ctx, "host_run");
}

static const ember_backend_ops k_cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_from_host = cpu_buffer_from_host,
    .buffer_free = cpu_buffer_free,
    .prepare_weight = cpu_prepare_weight,
    .write = cpu_write,
    .read = cpu_read,
    .get_rows = cpu_get_rows,
    .rms_norm = cpu_rms_norm,
    .matmul = cpu_matmul,
    .matmul_each = cpu_matmul_each,
    .moe_token = cpu_moe_token,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .kv_read = cpu_kv_read,
    .attention = cpu_attention,
    .copy = cpu_copy,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .add = cpu_add,
    .add_rows_scaled = cpu_add_rows_scaled,
    .delta_net = cpu_delta_net,
    .delta_replay = cpu_delta_replay,
    .sigmoid_mul = cpu_sigmoid_mul,
    .add_rms_norm = cpu_add_rms_norm,
    .rope_kv_write = cpu_rope_kv_write,
    .argmax_rows = cpu_argmax_rows,
    .host_run = cpu_host_run,
};

int ember_backend_cpu_new(const ember_cpu_params *p, ember_backend **out, ember_error *err) {
    *out = NULL;
    ember_isa isa = p ? p->isa : EMBER_ISA_AUTO;
    if (isa == EMBER_ISA_AUTO) isa = ember_isa_detect();
    if (isa < EMBER_ISA_SCALAR || isa > EMBER_ISA_AMX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "unknown instruction set %d", (int)isa);
    if (!ember_isa_supported(isa))
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "this CPU does not support the %s instruction set",
                         ember_isa_name(isa));
    int n = p && p->n_threads > 0 ? p->n_threads : ember_cpu_count();
    cpu_backend *c = ember_calloc(1, sizeof *c);
    if (!c) return ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the CPU backend");
    c->pool = ember_pool_new(n, err);
    if (!c->pool) {
        free(c);
        return err ? err->code : EMBER_ERR_NOMEM;
    }
    c->n_threads = n;
    /* EMBER_CPU_PROFILE=FILE: time the pool's runs, append the table at free (docs/backend.md) */
    const char *prof = getenv("EMBER_CPU_PROFILE");
    if (prof && *prof && (c->prof_path = ember_strdup(prof)) && ember_pool_profile_start(c->pool)) {
        free(c->prof_path);
        c->prof_path = NULL;
    }
    c->zero_copy = p && p->zero_copy;
    c->k = ember_cpu_kernels_for(isa);
    c->mlx_gemm = cpu_mlx_gemm_for(c->k);
    c->base.ops = &k_cpu_ops;
    c->base.impl = c;
    if (p) c->base.log = p->log;
    *out = &c->base;
    return EMBER_OK;
}

ember_isa ember_backend_cpu_isa(const ember_backend *be) {
    return be->ops == &k_cpu_ops ? ((const cpu_backend *)be->impl)->k->isa : EMBER_ISA_AUTO;
}

long ember_backend_cpu_unprepared(const ember_backend *be) {
    return be->ops == &k_cpu_ops ? ((const cpu_backend *)be->impl)->n_unprepared : 0;
}

int ember_backend_cpu_threads(const ember_backend *be) {
    return be->ops == &k_cpu_ops ? ((const cpu_backend *)be->impl)->n_threads : 0;
}
