/*
 * test_kv_rec.c - the recurrent state rows of the KV cache (kv.h, hybrid
 * models) under the cache's contract, driven through the backend's
 * delta_net op with synthetic per-token inputs (no model):
 *   - a property test: random sequences of appends (rows interleaved in a
 *     batch), speculative rounds (begin, one or two forwards, commit k of d
 *     or roll back), failed forwards, clone, extract + merge, filter,
 *     save + load (and corrupt blobs refused), trims; after every step each
 *     row's state is compared bit for bit with the state recomputed from
 *     its tokens one at a time in a separate cache;
 *   - the two forms of the delta rule: a long row fed in pieces whose
 *     boundaries fall anywhere (aligned 64-position spans run the chunked
 *     form) against token-by-token decode, outputs and state within 1e-5
 *     relative; and a batch of several rows against each row alone, bit for
 *     bit;
 *   - sizes: the state's bytes in the budget, a full cache refused cleanly.
 * Every ISA's kernels are the same C here (the op is plain C), so one run
 * covers them. With a CUDA device (a CUDA build on a GPU machine) the
 * whole suite runs again on cuda:0.
 */
#define TEST_RNG_SEED 0x7265632d6b76ull
#include "backend/backend.h"
#include "kv/kv.h"
#include "test.h"

#define ROWS 6
#define CTX 300
#define NL 3 /* layers: recurrent, attention, recurrent */
#define MAXT 128

static const ember_rec_shape k_shape = {2 * 1 * 4 + 2 * 4, 3, 1, 2, 4, 4, 0}; /* C 16, K 3, Hk 1, Hv 2, Dk 4, Dv 4 */
#define C 16
#define HV 2
#define Z 8

static ember_backend *g_be;
static ember_tensor g_conv, g_alog, g_dtb;        /* the weights, per recurrent layer the same */
static ember_tensor g_x, g_b, g_a, g_out;         /* [MAXT, ...] inputs and output */
static ember_buffer *g_bufs[8];

/* Deterministic inputs of token `tok` at recurrent layer li: x [C], b, a [HV]. */
static float tok_val(int tok, int li, int i) {
    uint64_t h = (uint64_t)tok * 0x9E3779B97F4A7C15ull ^ (uint64_t)(li + 1) * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)i * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (float)(h & 0xFFFFFF) / (float)0x800000 - 1.0f;
}

static ember_tensor rows_of(const ember_tensor *t, int n) {
    ember_tensor v = *t;
    v.shape[0] = n;
    v.nbytes = (size_t)n * (size_t)t->shape[1] * 4;
    return v;
}

/* One forward of T tokens (row[t], tok[t]) at the rows' next positions.
   fail: end the forward as failed. Outputs of the last recurrent layer go
   to out (T x Z) when non-NULL. Returns the begin's error code. */
static int forward(ember_kv *kv, const int32_t *row, const int32_t *tok, int T, bool fail, float *out) {
    int32_t pos[MAXT];
    int grow[ROWS] = {0};
    for (int t = 0; t < T; t++) pos[t] = ember_kv_len(kv, row[t]) + grow[row[t]]++;
    ember_error err = {0};
    int rc = ember_kv_begin(kv, row, pos, T, &err);
    if (rc) return rc;
    for (int l = 0; l < NL; l++) {
        if (l == 1) continue; /* the attention layer: its blocks are taken, nothing written here */
        int li = l / 2;
        float x[MAXT * C], b[MAXT * HV], a[MAXT * HV];
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < C; i++) x[t * C + i] = tok_val(tok[t], li, i);
            for (int i = 0; i < HV; i++) {
                b[t * HV + i] = tok_val(tok[t], li, 100 + i);
                a[t * HV + i] = tok_val(tok[t], li, 200 + i);
            }
        }
        ember_tensor xt = rows_of(&g_x, T), bt = rows_of(&g_b, T), at = rows_of(&g_a, T), ot = rows_of(&g_out, T);
        CHECK(g_be->ops->write(g_be, &xt, 0, x, (size_t)T * C * 4, &err) == EMBER_OK);
        CHECK(g_be->ops->write(g_be, &bt, 0, b, (size_t)T * HV * 4, &err) == EMBER_OK);
        CHECK(g_be->ops->write(g_be, &at, 0, a, (size_t)T * HV * 4, &err) == EMBER_OK);
        ember_rec_map map;
        ember_kv_rec_map_for(kv, l, row, pos, &map);
        const ember_delta_w w = {&g_conv, &g_alog, &g_dtb, NULL};
        CHECKF(g_be->ops->delta_net(g_be, &ot, &xt, &bt, &at, &w, &map, &err) == EMBER_OK, "%s", err.msg);
        if (out && l == 2) CHECK(g_be->ops->read(g_be, &ot, 0, out, (size_t)T * Z * 4, &err) == EMBER_OK);
    }
    ember_kv_end(kv, !fail);
    return EMBER_OK;
}

/* The model of the cache: each row's tokens. */
static int g_seq[ROWS][CTX], g_len[ROWS];
static ember_kv *g_ref; /* one row: recomputes states */
static size_t g_state_floats;

/* The state of tokens seq[0..n) computed one token at a time, into out. */
static void ref_state(const int *seq, int n, float *out) {
    ember_kv_clear(g_ref, 0);
    for (int i = 0; i < n; i++) {
        int32_t r = 0, t = seq[i];
        CHECK(forward(g_ref, &r, &t, 1, false, NULL) == EMBER_OK);
    }
    ember_error err = {0};
    CHECK(ember_kv_read_state(g_ref, 0, out, &err) == EMBER_OK);
}

static int g_step;

/* Every row against its recomputed state, and its length. */
static void check_rows(ember_kv *kv, const char *what) {
    float *a = malloc(g_state_floats * 4), *b = malloc(g_state_floats * 4);
    ember_error err = {0};
    for (int r = 0; r < ROWS; r++) {
        CHECKF(ember_kv_len(kv, r) == g_len[r], "step %d (%s): row %d has %d positions, want %d", g_step, what, r,
               ember_kv_len(kv, r), g_len[r]);
        CHECK(ember_kv_read_state(kv, r, a, &err) == EMBER_OK);
        ref_state(g_seq[r], g_len[r], b);
        CHECKF(!memcmp(a, b, g_state_floats * 4), "step %d (%s): row %d's state differs from its recomputation", g_step,
               what, r);
    }
    free(a);
    free(b);
}

static void append_tokens(int r, int n, int32_t *row, int32_t *tok, int *T) {
    for (int i = 0; i < n; i++) {
        int t = (int)(rnd() % 500);
        row[*T] = r;
        tok[(*T)++] = t;
        g_seq[r][g_len[r]++] = t;
    }
}

/* Shuffles a batch, keeping each row's tokens in order. */
static void shuffle_batch(int32_t *row, int32_t *tok, int T) {
    for (int k = 0; k < T * 2; k++) {
        int i = (int)(rnd() % (unsigned)T), j = (int)(rnd() % (unsigned)T);
        if (i > j) {
            int s = i;
            i = j;
            j = s;
        }
        if (row[i] == row[j]) continue;
        bool other = false; /* i and j may swap only if no token of their rows lies between them */
        for (int m = i + 1; m < j && !other; m++) other = row[m] == row[i] || row[m] == row[j];
        if (other) continue;
        int32_t a = row[i], b = tok[i];
        row[i] = row[j];
        tok[i] = tok[j];
        row[j] = a;
        tok[j] = b;
    }
}

static void property(ember_kv *kv) {
    ember_error err = {0};
    for (g_step = 0; g_step < 260; g_step++) {
        int op = (int)(rnd() % 10);
        int r = (int)(rnd() % ROWS), s = (int)(rnd() % ROWS);
        int32_t row[MAXT], tok[MAXT];
        int T = 0;
        if (op <= 3) { /* append to up to three rows, interleaved */
            int nr = 1 + (int)(rnd() % 3);
            for (int k = 0; k < nr; k++) {
                int rr = (r + k) % ROWS, n = 1 + (int)(rnd() % 8);
                if (g_len[rr] + n <= CTX - 40) append_tokens(rr, n, row, tok, &T);
            }
            if (!T) continue;
            shuffle_batch(row, tok, T);
            CHECK(forward(kv, row, tok, T, false, NULL) == EMBER_OK);
            check_rows(kv, "append");
        } else if (op == 4) { /* a speculative round: one or two forwards of d, keep k */
            if (g_len[r] > CTX - 40) continue;
            int base = g_len[r], d = 0;
            CHECK(ember_kv_spec_begin(kv, r, &err) == EMBER_OK);
            for (int f = 0; f < 1 + (int)(rnd() % 2); f++) {
                T = 0;
                append_tokens(r, 1 + (int)(rnd() % 6), row, tok, &T);
                d += T;
                CHECK(forward(kv, row, tok, T, false, NULL) == EMBER_OK);
            }
            int k = (int)(rnd() % (unsigned)(d + 1));
            if (rnd() % 4 == 0) k = 0;
            CHECKF((k ? ember_kv_spec_commit(kv, r, k, &err) : ember_kv_spec_rollback(kv, r, &err)) == EMBER_OK, "%s",
                   err.msg);
            g_len[r] = base + k;
            check_rows(kv, "speculative round");
        } else if (op == 5) { /* a failed forward, and a refused begin */
            int len0 = g_len[r];
            append_tokens(r, 1 + (int)(rnd() % 5), row, tok, &T);
            g_len[r] = len0;
            CHECK(forward(kv, row, tok, T, true, NULL) == EMBER_OK);
            int32_t bad_pos = (int32_t)g_len[r] + 3, rr = r;
            CHECK(ember_kv_begin(kv, &rr, &bad_pos, 1, &err) != EMBER_OK);
            check_rows(kv, "failed forward");
        } else if (op == 6) { /* clone */
            CHECK(ember_kv_clone(kv, r, s, &err) == EMBER_OK);
            memcpy(g_seq[s], g_seq[r], sizeof g_seq[r]);
            g_len[s] = g_len[r];
            check_rows(kv, "clone");
        } else if (op == 7) { /* extract, clear, merge into an empty row */
            ember_kv_rowstate *st;
            CHECK(ember_kv_extract(kv, r, &st, &err) == EMBER_OK);
            ember_kv_clear(kv, r);
            ember_kv_clear(kv, s);
            CHECK(ember_kv_merge(kv, &st, &s, 1, &err) == EMBER_OK);
            ember_kv_rowstate_free(kv, st);
            memcpy(g_seq[s], g_seq[r], sizeof g_seq[r]);
            g_len[s] = g_len[r];
            if (s != r) g_len[r] = 0;
            check_rows(kv, "extract + merge");
        } else if (op == 8) { /* save, then load into another row; a corrupt blob changes nothing */
            void *blob;
            size_t n;
            CHECKF(ember_kv_row_save(kv, r, &blob, &n, &err) == EMBER_OK, "%s", err.msg);
            if (n > 40) {
                unsigned char *b = blob;
                b[n - 20] ^= 0x40;
                CHECK(ember_kv_row_load(kv, s, blob, n, &err) != EMBER_OK);
                b[n - 20] ^= 0x40;
                CHECK(ember_kv_row_load(kv, s, blob, n - 3, &err) != EMBER_OK);
            }
            CHECKF(ember_kv_row_load(kv, s, blob, n, &err) == EMBER_OK, "%s", err.msg);
            free(blob);
            memcpy(g_seq[s], g_seq[r], sizeof g_seq[r]);
            g_len[s] = g_len[r];
            check_rows(kv, "save + load");
        } else { /* filter, trims */
            if (rnd() % 3 == 0) {
                int keep[ROWS], nk = 0;
                for (int q = 0; q < ROWS; q++)
                    if (rnd() % 2) keep[nk++] = q;
                ember_kv_filter(kv, keep, nk);
                for (int q = 0; q < ROWS; q++) {
                    bool k = false;
                    for (int i = 0; i < nk; i++) k |= keep[i] == q;
                    if (!k) g_len[q] = 0;
                }
            }
            CHECK(ember_kv_min_reuse(kv, r) == g_len[r]);
            CHECK(ember_kv_trim(kv, r, g_len[r], &err) == EMBER_OK);
            if (g_len[r] > 1) CHECK(ember_kv_trim(kv, r, g_len[r] - 1, &err) != EMBER_OK);
            check_rows(kv, "filter + trim");
        }
    }
}

/* A row of 200 tokens fed in pieces (boundaries anywhere; aligned 64-spans
   take the chunked form) against token by token; and three rows in one
   batch against each alone, bit for bit. */
static void forms(ember_kv *kv) {
    ember_error err = {0};
    enum { N = 200 };
    int seq[N];
    for (int i = 0; i < N; i++) seq[i] = (int)(rnd() % 500);
    static float one[N * Z], piece[N * Z];
    float s1[4096], s2[4096];
    const int splits[][6] = {{N, 0}, {70, 13, 64, 53, 0}, {1, 63, 64, 72, 0}, {127, 73, 0}};
    ember_kv_clear(kv, 0);
    for (int i = 0; i < N; i++) {
        int32_t r = 0, t = seq[i];
        CHECK(forward(kv, &r, &t, 1, false, one + (size_t)i * Z) == EMBER_OK);
    }
    CHECK(ember_kv_read_state(kv, 0, s1, &err) == EMBER_OK);
    float omax = 0, smax = 0;
    for (int i = 0; i < N * Z; i++) omax = fmaxf(omax, fabsf(one[i]));
    for (size_t i = 0; i < g_state_floats; i++) smax = fmaxf(smax, fabsf(s1[i]));
    for (size_t sp = 0; sp < sizeof splits / sizeof splits[0]; sp++) {
        ember_kv_clear(kv, 0);
        int at = 0;
        for (int p = 0; splits[sp][p]; p++) {
            int n = splits[sp][p];
            int32_t row[MAXT], tok[MAXT];
            for (int q = 0; q < n;) { /* forward() takes up to MAXT tokens */
                int m = n - q < MAXT ? n - q : MAXT;
                for (int i = 0; i < m; i++) {
                    row[i] = 0;
                    tok[i] = seq[at + q + i];
                }
                CHECK(forward(kv, row, tok, m, false, piece + (size_t)(at + q) * Z) == EMBER_OK);
                q += m;
            }
            at += n;
        }
        CHECK(ember_kv_read_state(kv, 0, s2, &err) == EMBER_OK);
        float d = 0, ds = 0;
        for (int i = 0; i < N * Z; i++) d = fmaxf(d, fabsf(one[i] - piece[i]));
        for (size_t i = 0; i < g_state_floats; i++) ds = fmaxf(ds, fabsf(s1[i] - s2[i]));
        CHECKF(d <= 1e-5f * omax && ds <= 1e-5f * smax, "split %zu: outputs differ by %g (of %g), state by %g (of %g)",
               sp, d, omax, ds, smax);
        fprintf(stderr, "split %zu: chunked vs token-by-token: output %.3g, state %.3g (relative)\n", sp, d / omax,
                ds / smax);
    }
    /* a batch of three rows (one of them spanning a whole aligned 64) against each alone */
    static float alone[3][MAXT * Z], together[MAXT * Z];
    const int lens[3] = {70, 5, 40};
    int32_t row[MAXT], tok[MAXT];
    int T = 0;
    for (int r = 0; r < 3; r++) {
        ember_kv_clear(kv, r);
        int32_t rr[MAXT], tt[MAXT];
        for (int i = 0; i < lens[r]; i++) {
            rr[i] = r;
            tt[i] = seq[i * (r + 1) % N];
        }
        CHECK(forward(kv, rr, tt, lens[r], false, alone[r]) == EMBER_OK);
        CHECK(ember_kv_read_state(kv, r, r == 0 ? s1 : s2, &err) == EMBER_OK);
        ember_kv_clear(kv, r);
    }
    for (int i = 0; i < 70; i++) /* interleave: row 1 and 2 between row 0's tokens */
        for (int r = 0; r < 3; r++)
            if (i < lens[r]) {
                row[T] = r;
                tok[T++] = seq[i * (r + 1) % N];
            }
    CHECK(forward(kv, row, tok, T, false, together) == EMBER_OK);
    int seen[3] = {0};
    bool same = true;
    for (int t = 0; t < T; t++) {
        int r = row[t];
        same &= !memcmp(together + (size_t)t * Z, alone[r] + (size_t)seen[r]++ * Z, Z * 4);
    }
    CHECK(same);
    CHECK(ember_kv_read_state(kv, 0, s2, &err) == EMBER_OK && !memcmp(s1, s2, g_state_floats * 4));
}

/* The state's bytes in the sizes, and a cache too small for another state. */
static void sizes(void) {
    ember_error err = {0};
    ember_kv_type t;
    CHECK(ember_kv_type_parse("f32", 0, 0, &t, &err) == EMBER_OK);
    int heads[NL] = {1, 2, 1}, dims[NL] = {4, 8, 4};
    const bool rec[NL] = {true, false, true};
    ember_kv_params p = {t, NL, heads, dims, NULL, 4, 64, 0, 0, 64, rec, k_shape};
    ember_kv *kv;
    CHECK(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK);
    const size_t sb = ember_kv_state_bytes(kv), blk = 2 * 2 * 8 * 4 * 16; /* one attention block: K and V of 2 heads of 8 */
    CHECK(sb == g_state_floats * 4);
    CHECK(ember_kv_bytes_per_token(kv, false) == blk / 16);
    CHECK(ember_kv_request_bytes(kv, 20) == 2 * sb + 2 * blk);
    int32_t r = 0, tk = 7;
    CHECK(forward(kv, &r, &tk, 1, false, NULL) == EMBER_OK);
    CHECK(ember_kv_used_bytes(kv) == sb + blk && ember_kv_row_bytes(kv, 0) == sb + blk);
    ember_kv_free(kv);
    /* a budget holding two states and a block: the second row's forward is refused, changing nothing */
    p.budget = 2 * sb + blk + blk / 2;
    CHECK(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK);
    CHECK(forward(kv, &r, &tk, 1, false, NULL) == EMBER_OK);
    r = 1;
    CHECK(forward(kv, &r, &tk, 1, false, NULL) != EMBER_OK);
    CHECK(ember_kv_len(kv, 1) == 0 && ember_kv_used_bytes(kv) == sb + blk);
    ember_kv_free(kv);
}

static void init_tensors(void) {
    ember_error err = {0};
    struct {
        ember_tensor *t;
        int64_t r, c;
    } want[] = {{&g_conv, C, 3}, {&g_alog, 1, HV}, {&g_dtb, 1, HV}, {&g_x, MAXT, C},
                {&g_b, MAXT, HV}, {&g_a, MAXT, HV}, {&g_out, MAXT, Z}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(ember_tensor_alloc(g_be, want[i].t, &g_bufs[i], EMBER_F32, 2, (const int64_t[]){want[i].r, want[i].c},
                                 &err) == EMBER_OK);
    float w[C * 3], al[HV] = {0.3f, -0.5f}, dt[HV] = {0.1f, -0.2f};
    for (int i = 0; i < C * 3; i++) w[i] = frnd() * 0.6f;
    CHECK(g_be->ops->write(g_be, &g_conv, 0, w, sizeof w, &err) == EMBER_OK);
    CHECK(g_be->ops->write(g_be, &g_alog, 0, al, sizeof al, &err) == EMBER_OK);
    CHECK(g_be->ops->write(g_be, &g_dtb, 0, dt, sizeof dt, &err) == EMBER_OK);
}

/* The whole suite on backend be (named in messages). */
static void run_suite(ember_backend *be, const char *name) {
    ember_error err = {0};
    g_be = be;
    memset(g_seq, 0, sizeof g_seq);
    memset(g_len, 0, sizeof g_len);
    init_tensors();
    g_state_floats = 2 * ember_rec_layer_floats(&k_shape);
    ember_kv_type t;
    CHECK(ember_kv_type_parse("f32", 0, 0, &t, &err) == EMBER_OK);
    int heads[NL] = {1, 2, 1}, dims[NL] = {4, 8, 4};
    const bool rec[NL] = {true, false, true};
    ember_kv_params p = {t, NL, heads, dims, NULL, ROWS, CTX, 0, 0, MAXT, rec, k_shape};
    ember_kv *kv;
    CHECKF(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK, "%s: %s", name, err.msg);
    p.n_rows = 1;
    CHECK(ember_kv_new(g_be, &p, &g_ref, &err) == EMBER_OK);
    int before = g_fail;
    property(kv);
    forms(kv);
    sizes();
    ember_kv_free(kv);
    ember_kv_free(g_ref);
    for (size_t i = 0; i < sizeof g_bufs / sizeof g_bufs[0]; i++) {
        ember_buffer_free(g_bufs[i]);
        g_bufs[i] = NULL;
    }
    fprintf(stderr, "%s: %s\n", name, g_fail == before ? "ok" : "FAILED");
}

int main(void) {
    ember_error err = {0};
    ember_cpu_params cp = {2, EMBER_ISA_AUTO, false, {0}};
    ember_backend *be;
    CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
    run_suite(be, "cpu");
    ember_backend_free(be);
    /* the same on the GPU when there is one (a CUDA build on a GPU machine) */
    int count = 0;
    if (ember_cuda_device_count(&count, &err) || count == 0) {
        fprintf(stderr, "note: no CUDA device, the GPU run is skipped\n");
        return test_done();
    }
    ember_cuda_params gp = {.device = 0};
    CHECKF(ember_backend_cuda_new(&gp, &be, &err) == EMBER_OK, "%s", err.msg);
    if (be) {
        run_suite(be, "cuda:0");
        ember_backend_free(be);
    }
    return test_done();
}
