/*
 * cpu_delta.c - the gated DeltaNet core on the CPU (backend.h: delta_net,
 * delta_replay).
 *
 * One call runs in three parallel phases over the batch:
 *   1. per token: the causal convolution over the row's inputs (the state's
 *      K - 1 previous ones, then this batch's), silu, the l2 norms of the q
 *      and k heads, the decay g and the write strength beta; a row in a
 *      speculative round logs x, k, v, g and beta here;
 *   2. per (row, value head): the state S from the src slot through the
 *      row's tokens into the dst slot, and the outputs;
 *   3. per row: the convolution state (the last K - 1 inputs) into dst.
 * Every value is computed by one task in a fixed order: neither the batch
 * nor the thread count changes a bit.
 *
 * The two forms of the delta rule (phase 2). Recurrent, per token:
 *   S = exp(g) S ; u = beta (v - S^T k) ; S += k u^T ; o = S^T q
 * Chunked, over an aligned span of CH positions with cumulative decays
 * c_i = g_1 + ... + g_i (the WY form transformers' torch fallback uses):
 *   A_ij = -beta_i (k_i . k_j) exp(c_i - c_j) for j < i, made into
 *   W = (I - A)^-1 by forward substitution;
 *   U = W (beta v) ; Kc = W (beta k exp(c)) ; V' = U - Kc S
 *   o_i = exp(c_i) q_i^T S + sum_{j <= i} (q_i . k_j) exp(c_i - c_j) V'_j
 *   S = exp(c_CH) S + sum_j k_j exp(c_CH - c_j) V'_j^T
 * They agree to rounding; decode always takes the recurrent form.
 *
 * Memory: the scratch of a call (post-convolution activations of the batch,
 * the per-thread chunk work areas, the row tables) is one area the backend
 * keeps and grows (nothing allocated per step once warm); the state lives
 * in the caller's slots. delta_replay needs Dv floats per call.
 */
#include "cpu_delta.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#define CH EMBER_DELTA_SPAN /* the chunked form's span, in positions (aligned to multiples) */

/* ---- the arithmetic both forms and the replay share ---- */

static inline float silu(float x) {
    return x / (1.0f + expf(-x));
}

static inline float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* x *= rsqrt(sum x^2 + 1e-6) over n values. */
static void l2norm(float *x, int n) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* One recurrent step of one head: S [Dk][Dv]; out [Dv] (NULL: not wanted);
   mem [Dv] scratch. */
static void rec_step(float *S, int Dk, int Dv, const float *q, const float *k, const float *v, float g, float beta,
                     float *out, float *mem) {
    const float decay = expf(g);
    for (int j = 0; j < Dv; j++) mem[j] = 0;
    for (int i = 0; i < Dk; i++) {
        float *s = S + (size_t)i * Dv;
        const float ki = k[i];
        for (int j = 0; j < Dv; j++) {
            s[j] *= decay;
            mem[j] += s[j] * ki;
        }
    }
    for (int j = 0; j < Dv; j++) mem[j] = (v[j] - mem[j]) * beta; /* the update u */
    if (out)
        for (int j = 0; j < Dv; j++) out[j] = 0;
    for (int i = 0; i < Dk; i++) {
        float *s = S + (size_t)i * Dv;
        const float ki = k[i], qi = q ? q[i] : 0.0f;
        for (int j = 0; j < Dv; j++) {
            s[j] += ki * mem[j];
            if (out) out[j] += s[j] * qi;
        }
    }
}

/* ---- delta_net ---- */

typedef struct row_info {
    int start, n;  /* the row's tokens: tok[start .. start + n) */
    int r;         /* cache row */
} row_info;

typedef struct dn_job {
    const cpu_delta_args *a;
    const ember_rec_shape *s;
    const ember_rec_layer *L;
    const row_info *rows;
    const int *tok;    /* batch indices grouped by row, in order */
    const int *tok_row, *tok_j; /* per batch index: its rows[] index and its index in the row */
    float *y;          /* [T, C] post-convolution q, k, v (q scaled, q and k normed) */
    float *gb;         /* [T, 2 Hv] g then beta */
    float *work;       /* [n_threads * work_floats] */
    size_t work_floats;
    float qscale;
} dn_job;

/* Input m of a row (m < 0: the state's conv inputs, oldest first). */
static inline const float *conv_input(const dn_job *j, const row_info *ri, int m, const float *cstate,
                                      const float *zeros) {
    const int K = j->s->conv_k;
    if (m >= 0) return j->a->x + (size_t)j->tok[ri->start + m] * (size_t)j->s->conv_dim;
    return cstate ? cstate + (size_t)(K - 1 + m) * (size_t)j->s->conv_dim : zeros;
}

static const float *src_part(const dn_job *j, int32_t slot) {
    return slot < 0 ? NULL : j->a->slots + (size_t)slot * j->L->slot_floats + j->L->off;
}

static float *dst_part(const dn_job *j, int32_t slot) {
    return j->a->slots + (size_t)slot * j->L->slot_floats + j->L->off;
}

/* Phase 1: token t. */
static void dn_token(void *ctx, int t, int thread) {
    const dn_job *j = ctx;
    const ember_rec_shape *s = j->s;
    const int C = s->conv_dim, K = s->conv_k, Hk = s->n_k_heads, Hv = s->n_v_heads, Dk = s->k_dim, Dv = s->v_dim;
    const row_info *ri = &j->rows[j->tok_row[t]];
    const ember_rec_rowref *ref = &j->a->map->refs[ri->r];
    const float *cstate = src_part(j, ref->src); /* conv [K - 1][C] first in the layer's part */
    float *zeros = j->work + (size_t)thread * j->work_floats; /* C zeros */
    memset(zeros, 0, (size_t)C * sizeof *zeros);
    float *y = j->y + (size_t)t * C;
    const float *w = j->a->conv_w;
    const int m0 = j->tok_j[t] - (K - 1);
    for (int c = 0; c < C; c++) {
        float acc = 0;
        for (int i = 0; i < K; i++) acc += w[(size_t)c * K + i] * conv_input(j, ri, m0 + i, cstate, zeros)[c];
        y[c] = silu(acc);
    }
    for (int h = 0; h < Hk; h++) {
        l2norm(y + (size_t)h * Dk, Dk);
        l2norm(y + (size_t)Hk * Dk + (size_t)h * Dk, Dk);
        for (int i = 0; i < Dk; i++) y[(size_t)h * Dk + i] *= j->qscale;
    }
    const float *bt = j->a->b + (size_t)t * Hv, *at = j->a->a + (size_t)t * Hv;
    float *gb = j->gb + (size_t)t * 2 * Hv;
    for (int h = 0; h < Hv; h++) {
        gb[h] = (j->a->a_neg ? j->a->a_neg[h] : -expf(j->a->a_log[h])) * softplus(at[h] + j->a->dt_bias[h]);
        gb[Hv + h] = 1.0f / (1.0f + expf(-bt[h]));
    }
    float *log = j->a->logs[ri->r];
    if (log) { /* x, k, v, g, beta of this position */
        const int p = j->a->map->pos[t] - ref->log_base;
        float *e = log + (size_t)p * j->L->log_stride + j->L->log_off;
        memcpy(e, j->a->x + (size_t)t * C, (size_t)C * sizeof *e);
        e += C;
        memcpy(e, y + (size_t)Hk * Dk, ((size_t)Hk * Dk + (size_t)Hv * Dv) * sizeof *e);
        e += (size_t)Hk * Dk + (size_t)Hv * Dv;
        memcpy(e, gb, 2 * (size_t)Hv * sizeof *e);
    }
}

/* The chunked form over one aligned span of CH tokens of one head (see the
   file's note). q, k [CH] pointers to Dk floats, v [CH] to Dv floats. */
static void chunk_span(float *S, int Dk, int Dv, const float *const *q, const float *const *k, const float *const *v,
                       const float *g, const float *beta, float *const *out, float *w) {
    float *c = w, *A = c + CH, *U = A + CH * CH, *Kc = U + (size_t)CH * Dv, *Vn = Kc + (size_t)CH * Dk,
          *row = Vn + (size_t)CH * Dv;
    float acc = 0;
    for (int i = 0; i < CH; i++) c[i] = acc += g[i];
    for (int i = 0; i < CH; i++)
        for (int jj = 0; jj < CH; jj++) {
            float a = 0;
            if (jj < i) {
                float d = 0;
                for (int e = 0; e < Dk; e++) d += k[i][e] * beta[i] * k[jj][e];
                a = -(d * expf(c[i] - c[jj]));
            }
            A[i * CH + jj] = a;
        }
    for (int i = 1; i < CH; i++) { /* forward substitution, row i from the rows above */
        for (int jj = 0; jj < i; jj++) row[jj] = A[i * CH + jj];
        for (int jj = 0; jj < i; jj++) {
            float sum = 0;
            for (int m = 0; m < i; m++) sum += row[m] * A[m * CH + jj];
            A[i * CH + jj] = row[jj] + sum;
        }
    }
    for (int i = 0; i < CH; i++) A[i * CH + i] = 1.0f; /* W = A + I */
    for (int i = 0; i < CH; i++) {
        float *u = U + (size_t)i * Dv, *kc = Kc + (size_t)i * Dk;
        for (int e = 0; e < Dv; e++) u[e] = 0;
        for (int e = 0; e < Dk; e++) kc[e] = 0;
        for (int m = 0; m <= i; m++) {
            const float wm = A[i * CH + m], bm = beta[m], em = expf(c[m]);
            for (int e = 0; e < Dv; e++) u[e] += wm * (v[m][e] * bm);
            for (int e = 0; e < Dk; e++) kc[e] += wm * (k[m][e] * bm * em);
        }
    }
    for (int i = 0; i < CH; i++) { /* V' = U - Kc S */
        float *vn = Vn + (size_t)i * Dv;
        const float *kc = Kc + (size_t)i * Dk;
        for (int e = 0; e < Dv; e++) vn[e] = 0;
        for (int d = 0; d < Dk; d++) {
            const float *s = S + (size_t)d * Dv;
            for (int e = 0; e < Dv; e++) vn[e] += kc[d] * s[e];
        }
        const float *u = U + (size_t)i * Dv;
        for (int e = 0; e < Dv; e++) vn[e] = u[e] - vn[e];
    }
    for (int i = 0; i < CH; i++) { /* outputs */
        float *o = out[i];
        const float ei = expf(c[i]);
        for (int e = 0; e < Dv; e++) o[e] = 0;
        for (int d = 0; d < Dk; d++) {
            const float qd = q[i][d] * ei;
            const float *s = S + (size_t)d * Dv;
            for (int e = 0; e < Dv; e++) o[e] += qd * s[e];
        }
        for (int m = 0; m <= i; m++) {
            float d = 0;
            for (int e = 0; e < Dk; e++) d += q[i][e] * k[m][e];
            d *= expf(c[i] - c[m]);
            const float *vn = Vn + (size_t)m * Dv;
            for (int e = 0; e < Dv; e++) o[e] += d * vn[e];
        }
    }
    const float last = c[CH - 1], el = expf(last);
    for (int d = 0; d < Dk; d++) { /* the state after the span */
        float *s = S + (size_t)d * Dv;
        for (int e = 0; e < Dv; e++) s[e] *= el;
        for (int m = 0; m < CH; m++) {
            const float km = k[m][d] * expf(last - c[m]);
            const float *vn = Vn + (size_t)m * Dv;
            for (int e = 0; e < Dv; e++) s[e] += km * vn[e];
        }
    }
}

/* Phase 2: unit = row index * Hv + value head. */
static void dn_head(void *ctx, int unit, int thread) {
    const dn_job *j = ctx;
    const ember_rec_shape *s = j->s;
    const int C = s->conv_dim, K = s->conv_k, Hk = s->n_k_heads, Hv = s->n_v_heads, Dk = s->k_dim, Dv = s->v_dim;
    const int h = unit % Hv, kh = s->v_tiled ? h % Hk : h / (Hv / Hk);
    const row_info *ri = &j->rows[unit / Hv];
    const ember_rec_rowref *ref = &j->a->map->refs[ri->r];
    const size_t conv_f = (size_t)(K - 1) * C, head_f = (size_t)Dk * Dv;
    float *S = dst_part(j, ref->dst) + conv_f + (size_t)h * head_f;
    const float *S0 = src_part(j, ref->src);
    if (S0)
        memcpy(S, S0 + conv_f + (size_t)h * head_f, head_f * sizeof *S);
    else
        memset(S, 0, head_f * sizeof *S);
    float *w = j->work + (size_t)thread * j->work_floats;
    const bool spec = j->a->logs[ri->r] != NULL;
    const float *q[CH], *k[CH], *v[CH];
    float *o[CH], g[CH], beta[CH];
    for (int m = 0; m < ri->n;) {
        const int t = j->tok[ri->start + m];
        const int p = j->a->map->pos[t];
        if (!spec && p % CH == 0 && m + CH <= ri->n) { /* a whole aligned span */
            for (int i = 0; i < CH; i++) {
                const int ti = j->tok[ri->start + m + i];
                const float *y = j->y + (size_t)ti * C;
                q[i] = y + (size_t)kh * Dk;
                k[i] = y + (size_t)Hk * Dk + (size_t)kh * Dk;
                v[i] = y + 2 * (size_t)Hk * Dk + (size_t)h * Dv;
                o[i] = j->a->out + (size_t)ti * Hv * Dv + (size_t)h * Dv;
                g[i] = j->gb[(size_t)ti * 2 * Hv + h];
                beta[i] = j->gb[(size_t)ti * 2 * Hv + Hv + h];
            }
            chunk_span(S, Dk, Dv, q, k, v, g, beta, o, w);
            m += CH;
            continue;
        }
        const float *y = j->y + (size_t)t * C;
        rec_step(S, Dk, Dv, y + (size_t)kh * Dk, y + (size_t)Hk * Dk + (size_t)kh * Dk, y + 2 * (size_t)Hk * Dk + (size_t)h * Dv,
                 j->gb[(size_t)t * 2 * Hv + h], j->gb[(size_t)t * 2 * Hv + Hv + h],
                 j->a->out + (size_t)t * Hv * Dv + (size_t)h * Dv, w);
        m++;
    }
}

/* Phase 3: row i's convolution state. */
static void dn_conv_state(void *ctx, int i, int thread) {
    const dn_job *j = ctx;
    const int C = j->s->conv_dim, K = j->s->conv_k;
    const row_info *ri = &j->rows[i];
    const ember_rec_rowref *ref = &j->a->map->refs[ri->r];
    const float *cstate = src_part(j, ref->src);
    float *zeros = j->work + (size_t)thread * j->work_floats;
    memset(zeros, 0, (size_t)C * sizeof *zeros);
    float *d = dst_part(j, ref->dst);
    for (int e = 0; e < K - 1; e++)
        memcpy(d + (size_t)e * C, conv_input(j, ri, ri->n - (K - 1) + e, cstate, zeros), (size_t)C * sizeof *d);
}

int cpu_delta_run(ember_pool *pool, const cpu_delta_args *a, void **scratch, size_t *cap, ember_error *err) {
    const ember_rec_map *map = a->map;
    const ember_rec_shape *s = &map->layer->s;
    const int T = a->T, C = s->conv_dim, Hv = s->n_v_heads, Dk = s->k_dim, Dv = s->v_dim;
    const int nt = ember_pool_size(pool);
    size_t work = (size_t)C; /* phase 1 and 3: zeros; phase 2: the recurrent scratch and the chunk areas */
    size_t chunk = CH + (size_t)CH * CH + (size_t)CH * (2 * (size_t)Dv + Dk) + CH;
    if (chunk > work) work = chunk;
    if ((size_t)Dv > work) work = (size_t)Dv;
    /* one scratch area, kept by the backend between calls: the floats (post-convolution
       activations, g and beta, per-thread work), the row table, then the int tables */
    const size_t n_f = (size_t)T * C + (size_t)T * 2 * Hv + (size_t)nt * work;
    const size_t need = n_f * sizeof(float) + (size_t)T * sizeof(row_info) +
                        ((size_t)map->n_refs + (size_t)T * 3) * sizeof(int);
    if (need > *cap) {
        void *p = ember_realloc(*scratch, need);
        if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory in delta_net");
        *scratch = p;
        *cap = need;
    }
    float *y = *scratch;
    row_info *rows = (row_info *)(y + n_f);
    int *first = (int *)(rows + T), *tok = first + map->n_refs, *tok_row = tok + T, *tok_j = tok_row + T;
    /* rows in order of first appearance, their tokens grouped */
    for (int r = 0; r < map->n_refs; r++) first[r] = -1;
    int nr = 0;
    for (int t = 0; t < T; t++) {
        int r = map->row[t];
        if (first[r] < 0) {
            first[r] = nr;
            rows[nr++] = (row_info){0, 0, r};
        }
        tok_row[t] = first[r];
        tok_j[t] = rows[first[r]].n++;
    }
    for (int i = 0, o = 0; i < nr; i++) {
        rows[i].start = o;
        o += rows[i].n;
    }
    for (int t = 0; t < T; t++) tok[rows[tok_row[t]].start + tok_j[t]] = t;
    dn_job j = {a,        s, map->layer, rows, tok, tok_row, tok_j, y, y + (size_t)T * C,
                y + (size_t)T * C + (size_t)T * 2 * Hv, work, (float)(1.0 / sqrt((double)Dk))};
    ember_pool_run(pool, T, dn_token, &j);
    ember_pool_run(pool, nr * Hv, dn_head, &j);
    ember_pool_run(pool, nr, dn_conv_state, &j);
    return EMBER_OK;
}

/* ---- delta_replay ---- */

int cpu_delta_rebuild(const ember_rec_layer *layers, int n_layers, float *slots, int32_t src, int32_t dst,
                     const float *log, int n, ember_error *err) {
    for (int l = 0; l < n_layers; l++) {
        const ember_rec_layer *L = &layers[l];
        const ember_rec_shape *s = &L->s;
        const int C = s->conv_dim, K = s->conv_k, Hk = s->n_k_heads, Hv = s->n_v_heads, Dk = s->k_dim,
                  Dv = s->v_dim;
        const size_t conv_f = (size_t)(K - 1) * C, head_f = (size_t)Dk * Dv;
        const float *p0 = src < 0 ? NULL : slots + (size_t)src * L->slot_floats + L->off;
        float *p1 = slots + (size_t)dst * L->slot_floats + L->off;
        float *mem = ember_malloc((size_t)Dv * sizeof *mem);
        if (!mem) return ember_err(err, EMBER_ERR_NOMEM, "out of memory in delta_replay");
        /* the convolution state: the last K - 1 of (old state, logged inputs) */
        for (int e = 0; e < K - 1; e++) {
            int m = n - (K - 1) + e;
            float *d = p1 + (size_t)e * C;
            if (m >= 0)
                memcpy(d, log + (size_t)m * L->log_stride + L->log_off, (size_t)C * sizeof *d);
            else if (p0)
                memcpy(d, p0 + (size_t)(K - 1 + m) * C, (size_t)C * sizeof *d);
            else
                memset(d, 0, (size_t)C * sizeof *d);
        }
        for (int h = 0; h < Hv; h++) {
            float *S = p1 + conv_f + (size_t)h * head_f;
            if (p0)
                memcpy(S, p0 + conv_f + (size_t)h * head_f, head_f * sizeof *S);
            else
                memset(S, 0, head_f * sizeof *S);
            const int kh = s->v_tiled ? h % Hk : h / (Hv / Hk);
            for (int m = 0; m < n; m++) {
                const float *e = log + (size_t)m * L->log_stride + L->log_off + C;
                const float *k = e + (size_t)kh * Dk, *v = e + (size_t)Hk * Dk + (size_t)h * Dv,
                            *gb = e + (size_t)Hk * Dk + (size_t)Hv * Dv;
                rec_step(S, Dk, Dv, NULL, k, v, gb[h], gb[Hv + h], NULL, mem);
            }
        }
        free(mem);
    }
    return EMBER_OK;
}
