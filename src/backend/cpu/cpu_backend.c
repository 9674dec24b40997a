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
 * weights instead wrap the caller's 16-byte aligned memory (the mapped
 * file), which is never freed here.
 *
 * Threading: ops are called from one thread; each op splits its outputs into
 * tasks, so every output element is computed entirely by one task and the
 * thread count never changes a result.
 *
 * Packed weights: the first matmul with a quantized weight whose dtype has
 * a packed kernel for this ISA (qkern.h) permutes the weight's bytes in
 * place into 16-row groups, when the backend owns the memory (not with
 * zero_copy). A small registry (c->packed) remembers which tensor ranges
 * are packed; get_rows reads packed rows directly, and read, write and
 * buffer_free first restore (or forget) any packed range they touch, so
 * packing is invisible outside the matmul kernels.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/util.h"
#include "kern_mlx.h"
#include "kernels.h"
#include "qkern.h"

typedef struct cpu_backend {
    ember_backend base;
    const cpu_kernels *k;
    cpu_mlx_gemm_fn mlx_gemm; /* MLX weights (kern_mlx.h) for this ISA */
    ember_pool *pool;
    int n_threads;
    bool zero_copy; /* wrap host memory in buffer_from_host instead of copying */
    float *scratch; /* n_threads x scratch_floats */
    size_t scratch_floats;
    void *act[3];     /* quantized activations per cpu_act_kind, grown on demand */
    size_t act_cap[3];
    unsigned char *qscratch; /* n_threads x qscratch_bytes: cpu_qmatmul and packing */
    size_t qscratch_bytes;
    struct cpu_packed *packed; /* the weight ranges kept packed */
    int n_packed, cap_packed;
} cpu_backend;

/* A weight tensor whose bytes are packed in place (qkern.h). */
typedef struct cpu_packed {
    const ember_buffer *buf;
    size_t off, nbytes;
    ember_dtype dt;
    int64_t N, K;
} cpu_packed;

static cpu_backend *cpu(ember_backend *be) {
    return (cpu_backend *)be->impl;
}

static void packed_release(cpu_backend *c, const ember_buffer *buf, size_t off, size_t n, bool restore);

static void *host(const ember_tensor *t) {
    return (char *)t->buf->data + t->offset;
}

const cpu_kernels *ember_cpu_kernels_for(ember_isa isa) {
    ember_cpu_features f;
    switch (isa) {
    case EMBER_ISA_AVX512:
        ember_cpu_detect(&f);
        return f.avx512vnni ? &ember_cpu_kernels_avx512vnni : &ember_cpu_kernels_avx512;
    case EMBER_ISA_AVX2: return &ember_cpu_kernels_avx2;
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
    void *d = aligned_alloc(64, rounded ? rounded : 64);
    if (d) memset(d, 0, rounded ? rounded : 64);
    return d;
}

static int cpu_buffer_alloc(ember_backend *be, size_t size, ember_buffer **out, ember_error *err) {
    *out = NULL;
    if (size > SIZE_MAX / 2) return ember_err(err, EMBER_ERR_NOMEM, "cannot allocate %zu bytes", size);
    ember_buffer *b = calloc(1, sizeof *b);
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
    if (cpu(be)->zero_copy && h && ((uintptr_t)h & 15u) == 0) {
        ember_buffer *b = calloc(1, sizeof *b);
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
    packed_release(cpu(b->be), b, 0, SIZE_MAX, false);
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
    packed_release(cpu(be), dst->buf, dst->offset + off, n, true);
    if (n) memcpy((char *)host(dst) + off, src, n);
    return EMBER_OK;
}

static int cpu_read(ember_backend *be, const ember_tensor *src, size_t off, void *dst, size_t n,
                    ember_error *err) {
    int rc = check_range(src, off, n, err);
    if (rc) return rc;
    packed_release(cpu(be), src->buf, src->offset + off, n, true);
    if (n) memcpy(dst, (const char *)host(src) + off, n);
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

/* A dtype matmul accepts as weights: float, or a block type with kernels. */
static bool is_weight_type(ember_dtype d) {
    return is_float_type(d) || act_kind(d) != CPU_ACT_NONE;
}

static int ensure_scratch(cpu_backend *c, size_t floats, ember_error *err) {
    if (floats <= c->scratch_floats) return EMBER_OK;
    size_t total, bytes;
    if (!ember_mul_ok(floats, (size_t)c->n_threads, &total) || !ember_mul_ok(total, 4, &bytes))
        return ember_err(err, EMBER_ERR_NOMEM, "scratch size overflows");
    float *s = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
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
    unsigned char *s = aligned_alloc(64, total);
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

/* Packs or unpacks the whole groups of entry e in place. The scratch must
   hold a group (ensured when the entry was made). */
static void pack_run(cpu_backend *c, const cpu_packed *e, bool pack) {
    pack_job j = {c, e->dt, (unsigned char *)e->buf->data + e->off, cpu_row_bytes(e->dt, e->K), (int)e->K, pack};
    ember_pool_run(c->pool, (int)(e->N / CPU_QP_ROWS), pack_task, &j);
}

/* Every packed range of buf overlapping [off, off + n): restored to the
   original bytes (restore) or just forgotten (the buffer is going away). */
static void packed_release(cpu_backend *c, const ember_buffer *buf, size_t off, size_t n, bool restore) {
    if (!c || !buf) return;
    size_t end = n > SIZE_MAX - off ? SIZE_MAX : off + n;
    for (int i = 0; i < c->n_packed;) {
        cpu_packed *e = &c->packed[i];
        if (e->buf == buf && e->off < end && off < e->off + e->nbytes) {
            if (restore) pack_run(c, e, false);
            *e = c->packed[--c->n_packed];
        } else {
            i++;
        }
    }
}

/* The registry entry of w when w is packed, else -1. */
static int packed_find(const cpu_backend *c, const ember_tensor *w) {
    for (int i = 0; i < c->n_packed; i++) {
        const cpu_packed *e = &c->packed[i];
        if (e->buf == w->buf && e->off == w->offset && e->dt == w->dtype && e->N == w->shape[0] &&
            e->K == w->shape[1])
            return i;
    }
    return -1;
}

/* Whether matmul may read w as packed; packs it on first use when the ISA
   has a packed kernel for its dtype and the backend owns its memory. Out of
   memory for the registry only means w stays row-major. */
static int packed_ensure(cpu_backend *c, const ember_tensor *w, bool *packed, ember_error *err) {
    *packed = false;
    if (!c->k->qgemm_packed[w->dtype] || !w->buf->owned || w->ndim != 2 || w->shape[1] > INT32_MAX) return EMBER_OK;
    if (packed_find(c, w) >= 0) {
        *packed = true;
        return EMBER_OK;
    }
    packed_release(c, w->buf, w->offset, w->nbytes, true);
    size_t row = cpu_row_bytes(w->dtype, w->shape[1]);
    if (w->shape[0] < CPU_QP_ROWS || row == 0 || w->shape[0] / CPU_QP_ROWS > INT32_MAX) return EMBER_OK;
    int rc = ensure_qscratch(c, CPU_QP_ROWS * row, err);
    if (rc) return rc;
    if (c->n_packed == c->cap_packed) {
        int cap = c->cap_packed ? 2 * c->cap_packed : 64;
        cpu_packed *p = realloc(c->packed, (size_t)cap * sizeof *p);
        if (!p) return EMBER_OK;
        c->packed = p;
        c->cap_packed = cap;
    }
    cpu_packed *e = &c->packed[c->n_packed++];
    *e = (cpu_packed){w->buf, w->offset, w->nbytes, w->dtype, w->shape[0], w->shape[1]};
    pack_run(c, e, true);
    *packed = true;
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
    int pk = packed_find(c, src);
    if (pk < 0) packed_release(c, src->buf, src->offset, src->nbytes, true);
    const int64_t packed_rows = pk >= 0 ? R / CPU_QP_ROWS * CPU_QP_ROWS : 0;
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
    for (int64_t i = 0; i < j->D; i++) {
        float w = j->plus_one ? 1.0f + j->w[i] : j->w[i];
        y[i] = w * (x[i] * r);
    }
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
    int rows = (int)ember_tensor_rows(x);
    if (rows * D < 4096) {
        for (int r = 0; r < rows; r++) norm_task(&j, r, 0);
    } else {
        ember_pool_run(cpu(be)->pool, rows, norm_task, &j);
    }
    return EMBER_OK;
}

/* ---- matmul ---------------------------------------------------------------------- */

#define MAX_MM 8

typedef struct mm_job {
    const cpu_kernels *k;
    cpu_mlx_gemm_fn mlx_gemm;
    const float *x;
    const void *act[3]; /* quantized x per cpu_act_kind (NULL when unused) */
    int M, K;
    int n;
    const ember_matmul *mm;
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
    cpu_act_kind ak = act_kind(dt);
    int mlx_bits, mlx_group;
    if (ember_dtype_mlx_params(dt, &mlx_bits, &mlx_group)) {
        j->mlx_gemm(mlx_bits, mlx_group, w, row, nn, j->act[ak], cpu_act_row_bytes(ak, j->K), j->M, j->K, out,
                    (size_t)N);
    } else if (ak != CPU_ACT_NONE) {
        cpu_qmatmul(j->k, dt, w, j->packed[i], nn, j->act[ak], cpu_act_row_bytes(ak, j->K), j->M, j->K, out, (size_t)N,
                    j->qscratch + (size_t)thread * j->qscratch_bytes);
    } else {
        cpu_gemm_fn fn = dt == EMBER_F32 ? j->k->gemm_f32 : dt == EMBER_F16 ? j->k->gemm_f16 : j->k->gemm_bf16;
        fn(w, (size_t)j->K, nn, j->x, (size_t)j->K, j->M, j->K, out, (size_t)N);
    }
    if (m->bias) {
        const float *b = (const float *)host(m->bias) + n0;
        for (int r = 0; r < j->M; r++) {
            float *o = out + (size_t)r * (size_t)N;
            for (int c = 0; c < nn; c++) o[c] = o[c] + b[c];
        }
    }
}

typedef struct act_job {
    const cpu_kernels *k;
    const float *x;
    void *dst;
    int K;
    cpu_act_kind kind;
} act_job;

static void act_task(void *ctx, int row, int thread) {
    (void)thread;
    const act_job *j = ctx;
    size_t rb = cpu_act_row_bytes(j->kind, j->K);
    const float *x = j->x + (size_t)row * (size_t)j->K;
    void *d = (char *)j->dst + (size_t)row * rb;
    if (j->kind == CPU_ACT_32)
        j->k->quantize_act32(x, j->K, d);
    else
        j->k->quantize_act256(x, j->K, d);
}

/* Quantizes the M rows of x into the backend's buffer for kind. */
static int quantize_acts(cpu_backend *c, const float *x, int M, int K, cpu_act_kind kind, const void **out,
                         ember_error *err) {
    size_t bytes;
    if (!ember_mul_ok(cpu_act_row_bytes(kind, K), (size_t)M, &bytes))
        return ember_err(err, EMBER_ERR_NOMEM, "matmul: activation buffer size overflows");
    if (bytes > c->act_cap[kind]) {
        void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu bytes of activations", bytes);
        free(c->act[kind]);
        c->act[kind] = p;
        c->act_cap[kind] = bytes;
    }
    act_job j = {c->k, x, c->act[kind], K, kind};
    if ((size_t)M * (size_t)K < 65536) {
        for (int r = 0; r < M; r++) act_task(&j, r, 0);
    } else {
        ember_pool_run(c->pool, M, act_task, &j);
    }
    *out = c->act[kind];
    return EMBER_OK;
}

static int cpu_matmul(ember_backend *be, const ember_tensor *x, int n, const ember_matmul *mm,
                      ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc = need_f32(x, "matmul", "x", err);
    if (rc) return rc;
    if (n < 1 || n > MAX_MM)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: %d products (1..%d allowed)", n, MAX_MM);
    int64_t K = ember_tensor_row_len(x), M = ember_tensor_rows(x);
    if (K > INT32_MAX || M > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: input too large");
    int64_t total = 0;
    bool need[3] = {false, false, false};
    for (int i = 0; i < n; i++) {
        const ember_matmul *m = &mm[i];
        if ((rc = need_f32(m->out, "matmul", "out", err))) return rc;
        if (!m->w->buf || !is_weight_type(m->w->dtype) || m->w->ndim != 2 || m->w->shape[1] != K)
            return ember_err(err, EMBER_ERR_INVALID_ARG,
                             "matmul: weight must be a 2-D float or quantized [N, %lld] tensor", (long long)K);
        if (cpu_row_bytes(m->w->dtype, K) == 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: rows of %lld are not whole %s blocks",
                             (long long)K, ember_dtype_get(m->w->dtype)->name);
        need[act_kind(m->w->dtype)] = true;
        int64_t N = m->w->shape[0];
        if (ember_tensor_row_len(m->out) != N || ember_tensor_rows(m->out) != M)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output shape is not [%lld, %lld]",
                             (long long)M, (long long)N);
        if (m->bias && (m->bias->dtype != EMBER_F32 || ember_tensor_nelem(m->bias) != N))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: bias must be f32 [%lld]", (long long)N);
        total += N;
    }
    if (total > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "matmul: output too large");
    mm_job j = {.k = c->k, .mlx_gemm = c->mlx_gemm, .x = host(x), .M = (int)M, .K = (int)K, .n = n, .mm = mm};
    for (int kind = CPU_ACT_32; kind <= CPU_ACT_256; kind++)
        if (need[kind] && (rc = quantize_acts(c, j.x, (int)M, (int)K, (cpu_act_kind)kind, &j.act[kind], err)))
            return rc;
    size_t qs = 0;
    for (int i = 0; i < n; i++) {
        ember_dtype dt = mm[i].w->dtype;
        if (!c->k->qgemm_packed[dt]) continue;
        size_t b = cpu_qmatmul_scratch_bytes(dt, (int)K, (int)M);
        if (b > qs) qs = b;
        if ((rc = packed_ensure(c, mm[i].w, &j.packed[i], err))) return rc;
    }
    if ((rc = ensure_qscratch(c, qs, err))) return rc;
    j.qscratch = c->qscratch;
    j.qscratch_bytes = c->qscratch_bytes;
    /* about 8 tasks per thread (taken dynamically, so a thread slowed by
       other load takes fewer), in whole packed groups */
    int64_t want = total / ((int64_t)c->n_threads * 8);
    int block = (int)((want + CPU_QP_ROWS - 1) & ~(int64_t)(CPU_QP_ROWS - 1));
    if (block < CPU_QP_ROWS) block = CPU_QP_ROWS;
    j.block = block;
    j.first_task[0] = 0;
    for (int i = 0; i < n; i++) {
        int N = (int)mm[i].w->shape[0];
        j.first_task[i + 1] = j.first_task[i] + (N + block - 1) / block;
    }
    ember_pool_run(c->pool, j.first_task[n], mm_task, &j);
    return EMBER_OK;
}

/* ---- rope ------------------------------------------------------------------------ */

typedef struct rope_job {
    float *x;
    const int32_t *pos;
    const ember_rope *r;
    int H, D;
} rope_job;

static void rope_task(void *ctx, int t, int thread) {
    (void)thread;
    const rope_job *j = ctx;
    int half = j->r->n_rot / 2;
    float cs[512], sn[512];
    float p = (float)j->pos[t];
    for (int i = 0; i < half; i++) {
        float angle = p * j->r->inv_freq[i];
        cs[i] = (float)cos((double)angle) * j->r->attn_factor;
        sn[i] = (float)sin((double)angle) * j->r->attn_factor;
    }
    for (int h = 0; h < j->H; h++) {
        float *v = j->x + ((size_t)t * (size_t)j->H + (size_t)h) * (size_t)j->D;
        for (int i = 0; i < half; i++) {
            int a = j->r->mode == EMBER_ROPE_NEOX ? i : 2 * i;
            int b = j->r->mode == EMBER_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x1 * cs[i] + x0 * sn[i];
        }
    }
}

static int cpu_rope(ember_backend *be, ember_tensor *x, const int32_t *pos, const ember_rope *r,
                    ember_error *err) {
    int rc = need_f32(x, "rope", "x", err);
    if (rc) return rc;
    if (x->ndim != 3) return ember_err(err, EMBER_ERR_INVALID_ARG, "rope: x must be [T, H, D]");
    int T = (int)x->shape[0], H = (int)x->shape[1], D = (int)x->shape[2];
    if (r->n_rot < 2 || r->n_rot % 2 || r->n_rot > D || r->n_rot > 1024)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "rope: %d rotated dims for head size %d", r->n_rot, D);
    rope_job j = {host(x), pos, r, H, D};
    if (T == 1)
        rope_task(&j, 0, 0);
    else
        ember_pool_run(cpu(be)->pool, T, rope_task, &j);
    return EMBER_OK;
}

/* ---- kv_store ---------------------------------------------------------------------- */

static int cpu_kv_store(ember_backend *be, ember_tensor *kc, ember_tensor *vc, const ember_tensor *k,
                        const ember_tensor *v, const int32_t *slot, const int32_t *pos,
                        ember_error *err) {
    (void)be;
    int rc;
    if ((rc = need_f32(kc, "kv_store", "k cache", err)) || (rc = need_f32(vc, "kv_store", "v cache", err)) ||
        (rc = need_f32(k, "kv_store", "k", err)) || (rc = need_f32(v, "kv_store", "v", err)))
        return rc;
    if (kc->ndim != 4 || vc->ndim != 4 || k->ndim != 3 || v->ndim != 3)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "kv_store: bad ranks");
    int64_t S = kc->shape[0], H = kc->shape[1], C = kc->shape[2], D = kc->shape[3];
    for (int i = 0; i < 4; i++)
        if (vc->shape[i] != kc->shape[i])
            return ember_err(err, EMBER_ERR_INVALID_ARG, "kv_store: k and v caches differ in shape");
    if (k->shape[1] != H || k->shape[2] != D || v->shape[0] != k->shape[0] || v->shape[1] != H ||
        v->shape[2] != D)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "kv_store: k/v do not match the cache");
    int64_t T = k->shape[0];
    for (int64_t t = 0; t < T; t++) {
        if (slot[t] < 0 || slot[t] >= S || pos[t] < 0 || pos[t] >= C)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "kv_store: slot %d / position %d outside the cache",
                             slot[t], pos[t]);
        for (int64_t h = 0; h < H; h++) {
            size_t dst = ((((size_t)slot[t] * (size_t)H + (size_t)h) * (size_t)C) + (size_t)pos[t]) * (size_t)D;
            size_t src = ((size_t)t * (size_t)H + (size_t)h) * (size_t)D;
            memcpy((float *)host(kc) + dst, (const float *)host(k) + src, (size_t)D * 4);
            memcpy((float *)host(vc) + dst, (const float *)host(v) + src, (size_t)D * 4);
        }
    }
    return EMBER_OK;
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct attn_job {
    cpu_backend *c;
    float *out;
    const float *q, *kc, *vc;
    const int32_t *slot, *pos;
    const ember_attn *a;
    int Hq, Hkv, C, D, rep;
} attn_job;

static void attn_task(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    const cpu_kernels *k = j->c->k;
    int t = task / j->Hkv, hk = task % j->Hkv;
    int p = j->pos[t];
    int lo = j->a->window > 0 && p - j->a->window + 1 > 0 ? p - j->a->window + 1 : 0;
    int n = p - lo + 1;
    size_t head = ((size_t)j->slot[t] * (size_t)j->Hkv + (size_t)hk) * (size_t)j->C;
    const float *K = j->kc + (head + (size_t)lo) * (size_t)j->D;
    const float *V = j->vc + (head + (size_t)lo) * (size_t)j->D;
    float *s = j->c->scratch + (size_t)thread * j->c->scratch_floats;
    for (int r = 0; r < j->rep; r++) {
        int hq = hk * j->rep + r;
        const float *q = j->q + ((size_t)t * (size_t)j->Hq + (size_t)hq) * (size_t)j->D;
        float *o = j->out + ((size_t)t * (size_t)j->Hq + (size_t)hq) * (size_t)j->D;
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            float sc = k->dot(q, K + (size_t)i * (size_t)j->D, j->D) * j->a->scale;
            if (j->a->softcap > 0) sc = tanhf(sc / j->a->softcap) * j->a->softcap;
            s[i] = sc;
            if (sc > mx) mx = sc;
        }
        float sum = 0;
        for (int i = 0; i < n; i++) {
            s[i] = expf(s[i] - mx);
            sum += s[i];
        }
        memset(o, 0, (size_t)j->D * 4);
        for (int i = 0; i < n; i++) k->axpy(o, s[i] / sum, V + (size_t)i * (size_t)j->D, j->D);
    }
}

static int cpu_attention(ember_backend *be, ember_tensor *out, const ember_tensor *q,
                         const ember_tensor *kc, const ember_tensor *vc, const int32_t *slot,
                         const int32_t *pos, const ember_attn *a, ember_error *err) {
    cpu_backend *c = cpu(be);
    int rc;
    if ((rc = need_f32(out, "attention", "out", err)) || (rc = need_f32(q, "attention", "q", err)) ||
        (rc = need_f32(kc, "attention", "k cache", err)) || (rc = need_f32(vc, "attention", "v cache", err)))
        return rc;
    if (q->ndim != 3 || out->ndim != 3 || kc->ndim != 4 || vc->ndim != 4)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: bad ranks");
    int T = (int)q->shape[0], Hq = (int)q->shape[1], D = (int)q->shape[2];
    int S = (int)kc->shape[0], Hkv = (int)kc->shape[1], C = (int)kc->shape[2];
    if (kc->shape[3] != D || Hkv < 1 || Hq % Hkv || out->shape[0] != T || out->shape[1] != Hq ||
        out->shape[2] != D)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: shapes do not match");
    for (int t = 0; t < T; t++)
        if (slot[t] < 0 || slot[t] >= S || pos[t] < 0 || pos[t] >= C)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "attention: slot %d / position %d outside the cache",
                             slot[t], pos[t]);
    if ((rc = ensure_scratch(c, (size_t)C, err))) return rc;
    attn_job j = {c, host(out), host(q), host(kc), host(vc), slot, pos, a, Hq, Hkv, C, D, Hq / Hkv};
    ember_pool_run(c->pool, T * Hkv, attn_task, &j);
    return EMBER_OK;
}

/* ---- elementwise --------------------------------------------------------------------- */

#define EW_CHUNK 16384

typedef struct ew_job {
    float *dst;
    const float *a, *b;
    int64_t n;
    int kind; /* 0 swiglu, 1 add */
} ew_job;

static void ew_task(void *ctx, int task, int thread) {
    (void)thread;
    const ew_job *j = ctx;
    int64_t i0 = (int64_t)task * EW_CHUNK, i1 = i0 + EW_CHUNK < j->n ? i0 + EW_CHUNK : j->n;
    if (j->kind == 0) {
        for (int64_t i = i0; i < i1; i++) {
            float g = j->a[i];
            j->dst[i] = (g / (1.0f + expf(-g))) * j->b[i];
        }
    } else {
        for (int64_t i = i0; i < i1; i++) j->dst[i] = j->a[i] + j->b[i];
    }
}

static int run_ew(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
                  int kind, const char *op, ember_error *err) {
    int rc;
    if ((rc = need_f32(dst, op, "dst", err)) || (rc = need_f32(a, op, "a", err)) ||
        (rc = need_f32(b, op, "b", err)))
        return rc;
    int64_t n = ember_tensor_nelem(dst);
    if (ember_tensor_nelem(a) != n || ember_tensor_nelem(b) != n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: sizes differ", op);
    ew_job j = {host(dst), host(a), host(b), n, kind};
    int64_t tasks = (n + EW_CHUNK - 1) / EW_CHUNK;
    if (tasks > INT32_MAX) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: too large", op);
    ember_pool_run(cpu(be)->pool, (int)tasks, ew_task, &j);
    return EMBER_OK;
}

static int cpu_swiglu(ember_backend *be, ember_tensor *dst, const ember_tensor *gate,
                      const ember_tensor *up, ember_error *err) {
    return run_ew(be, dst, gate, up, 0, "swiglu", err);
}

static int cpu_add(ember_backend *be, ember_tensor *dst, const ember_tensor *a, const ember_tensor *b,
                   ember_error *err) {
    return run_ew(be, dst, a, b, 1, "add", err);
}

/* ---- life cycle ------------------------------------------------------------------------ */

static void cpu_free(ember_backend *be) {
    if (!be) return;
    cpu_backend *c = cpu(be);
    ember_pool_free(c->pool);
    free(c->scratch);
    free(c->qscratch);
    free(c->packed);
    for (int i = 0; i < 3; i++) free(c->act[i]);
    free(c);
}

static const ember_backend_ops k_cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_from_host = cpu_buffer_from_host,
    .buffer_free = cpu_buffer_free,
    .write = cpu_write,
    .read = cpu_read,
    .get_rows = cpu_get_rows,
    .rms_norm = cpu_rms_norm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
};

int ember_backend_cpu_new(const ember_cpu_params *p, ember_backend **out, ember_error *err) {
    *out = NULL;
    ember_isa isa = p ? p->isa : EMBER_ISA_AUTO;
    if (isa == EMBER_ISA_AUTO) isa = ember_isa_detect();
    if (isa < EMBER_ISA_SCALAR || isa > EMBER_ISA_AVX512)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "unknown instruction set %d", (int)isa);
    if (!ember_isa_supported(isa))
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "this CPU does not support the %s instruction set",
                         ember_isa_name(isa));
    int n = p && p->n_threads > 0 ? p->n_threads : ember_cpu_count();
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the CPU backend");
    c->pool = ember_pool_new(n, err);
    if (!c->pool) {
        free(c);
        return err ? err->code : EMBER_ERR_NOMEM;
    }
    c->n_threads = n;
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
    return ((const cpu_backend *)be->impl)->k->isa;
}

int ember_backend_cpu_threads(const ember_backend *be) {
    return ((const cpu_backend *)be->impl)->n_threads;
}
