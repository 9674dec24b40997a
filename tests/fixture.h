/*
 * fixture.h - reading the reference tensors of ../shared/fixtures/<family>
 * (refs.safetensors) for tests: prompts, logits, greedy ids, margins.
 */
#ifndef EMBER_TEST_FIXTURE_H
#define EMBER_TEST_FIXTURE_H

#include "ember.h"
#include "formats/safetensors.h"
#include "test.h"

typedef struct fixture_prompt {
    int32_t ids[128];
    int n;
    float *logits; /* [n, vocab] (points into the mapped refs) */
    int32_t greedy[24];
    float margin[24];
} fixture_prompt;

typedef struct fixture {
    char dir[512];
    ember_st_file *refs;
    fixture_prompt p[3];
    const float *p0_gen_logits; /* [24, vocab] */
    int vocab;
} fixture;

static inline const ember_st_tensor *fx_get(fixture *f, const char *name) {
    const ember_st_tensor *t = ember_st_find(f->refs, name);
    if (!t) {
        fprintf(stderr, "fixture %s: missing %s\n", f->dir, name);
        exit(1);
    }
    return t;
}

/* Opens family's refs. Exits 77 if ../shared is absent. */
static inline void fixture_open(fixture *f, const char *family) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/fixtures/%s", shared_dir(), family);
    char path[600];
    snprintf(path, sizeof path, "%s/refs.safetensors", f->dir);
    ember_error err = {0};
    if (ember_st_open(path, &f->refs, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "p%d.input_ids", i);
        const ember_st_tensor *t = fx_get(f, name);
        f->p[i].n = (int)t->shape[0];
        for (int k = 0; k < f->p[i].n; k++) {
            int64_t v;
            memcpy(&v, t->data + 8 * k, 8);
            f->p[i].ids[k] = (int32_t)v;
        }
        snprintf(name, sizeof name, "p%d.logits", i);
        t = fx_get(f, name);
        f->vocab = (int)t->shape[1];
        f->p[i].logits = (float *)t->data;
        snprintf(name, sizeof name, "p%d.greedy_ids", i);
        t = fx_get(f, name);
        for (int k = 0; k < 24; k++) {
            int64_t v;
            memcpy(&v, t->data + 8 * k, 8);
            f->p[i].greedy[k] = (int32_t)v;
        }
        snprintf(name, sizeof name, "p%d.gen_margin", i);
        t = fx_get(f, name);
        memcpy(f->p[i].margin, t->data, sizeof f->p[i].margin);
    }
    f->p0_gen_logits = (const float *)fx_get(f, "p0.gen_logits")->data;
}

static inline void fixture_close(fixture *f) {
    ember_st_free(f->refs);
}

/* Loads a model with the given parameters; prints the error and returns
   NULL on failure. The caller frees the model. */
static inline ember_model *fx_load_params(const char *path, const ember_model_params *mp) {
    ember_model *m = NULL;
    ember_error err = {0};
    if (ember_model_load(path, mp, &m, &err)) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return NULL;
    }
    return m;
}

/* fx_load_params with the given kernels, threads and batch rows. */
static inline ember_model *fx_load_model(const char *path, ember_isa isa, int threads, int rows) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = threads;
    mp.n_rows = rows;
    return fx_load_params(path, &mp);
}

/* Logits of f's first nprompts prompts for the model at path (AUTO ISA, 2
   threads), rows concatenated into out. Returns 0, or non-zero after a
   line on stderr. */
static inline int fx_prompt_logits(const char *path, const fixture *f, int nprompts, float *out) {
    ember_model *m = fx_load_model(path, EMBER_ISA_AUTO, 2, 1);
    if (!m) return 1;
    ember_error err = {0};
    int rows = 0, rc = 0;
    for (int i = 0; i < nprompts && !rc; i++) {
        rc = ember_logits(m, f->p[i].ids, f->p[i].n, out + (size_t)rows * f->vocab, &err);
        rows += f->p[i].n;
    }
    if (rc) fprintf(stderr, "%s: %s\n", path, err.msg);
    ember_model_free(m);
    return rc;
}

/* Mean over rows of KL(softmax(a) || softmax(b)), rows of V logits each. */
static inline double mean_kl(const float *a, const float *b, int rows, int V) {
    double total = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
        double mx = -INFINITY, my = -INFINITY, sx = 0, sy = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, x[v]);
            my = fmax(my, y[v]);
        }
        for (int v = 0; v < V; v++) {
            sx += exp(x[v] - mx);
            sy += exp(y[v] - my);
        }
        double kl = 0;
        for (int v = 0; v < V; v++) {
            double lp = x[v] - mx - log(sx), lq = y[v] - my - log(sy);
            kl += exp(lp) * (lp - lq);
        }
        total += kl;
    }
    return total / rows;
}

static inline float max_abs(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* Runs f's three prompts one at a time through m, 24 greedy steps each
   (EOS ignored): ids[i] gets prompt i's greedy ids; when lg is not NULL,
   lg[i] (the caller's, (n_i + 23) x vocab floats) gets the logits of the
   prompt's positions and then of its 23 decode steps. Returns false, with
   a line naming `what` on stderr, when a generate fails or stops short. */
static inline bool fx_generate3(ember_model *m, const fixture *f, const char *what, int32_t ids[3][24],
                                float *const *lg) {
    for (int i = 0; i < 3; i++) {
        ember_request r;
        memset(&r, 0, sizeof r);
        r.prompt = f->p[i].ids;
        r.n_prompt = f->p[i].n;
        r.max_new_tokens = 24;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = ids[i];
        r.out_logits = lg ? lg[i] : NULL;
        ember_error err = {0};
        if (ember_generate(m, &r, 1, &err) != EMBER_OK || r.n_out != 24) {
            fprintf(stderr, "%s p%d: %s (%d of 24 ids)\n", what, i, err.msg, r.n_out);
            return false;
        }
    }
    return true;
}

/* The first of the 24 steps at which ids part from prompt i's reference
   greedy ids; 24 when they never do. */
static inline int fx_agree(const fixture *f, int i, const int32_t ids[24]) {
    int k = 0;
    while (k < 24 && ids[k] == f->p[i].greedy[k]) k++;
    return k;
}

/* The largest |dlogit| of lg (prompt i's rows from fx_generate3) against
   the reference, relative to the largest |logit| of the prompt's reference:
   over the prompt's positions and, for prompt 0 (the only one with
   reference decode logits), its decode steps 0..agree (row n - 1 + s
   predicts greedy[s]; up to and including the step where the ids part,
   the inputs are still the reference's). */
static inline float fx_logit_err(const fixture *f, int i, const float *lg, int agree) {
    const fixture_prompt *p = &f->p[i];
    const size_t V = (size_t)f->vocab, n = (size_t)p->n * V;
    const float mx = max_abs(p->logits, n);
    float d = 0;
    for (size_t k = 0; k < n; k++) d = fmaxf(d, fabsf(lg[k] - p->logits[k]));
    for (int s = 0; i == 0 && s <= agree && s < 24; s++)
        for (size_t v = 0; v < V; v++)
            d = fmaxf(d, fabsf(lg[(size_t)(p->n - 1 + s) * V + v] - f->p0_gen_logits[(size_t)s * V + v]));
    return d / mx;
}

/* Reads file path whole into a malloc'd buffer (NUL-terminated, *n bytes);
   NULL on failure. The caller frees it. */
static inline char *fx_slurp(const char *path, size_t *n) {
    FILE *in = fopen(path, "rb");
    char *buf = NULL;
    long len = -1;
    if (in && fseek(in, 0, SEEK_END) == 0 && (len = ftell(in)) >= 0 && fseek(in, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, in) == (size_t)len) {
        buf[len] = '\0';
        *n = (size_t)len;
    } else {
        free(buf);
        buf = NULL;
    }
    if (in) fclose(in);
    return buf;
}

/* Writes n bytes to dir/name (a failed write is a failed check). */
static inline void fx_put(const char *dir, const char *name, const char *data, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *o = fopen(p, "wb");
    CHECKF(o && fwrite(data, 1, n, o) == n, "cannot write %s", p);
    if (o) fclose(o);
}

/* A copy of the file src at dst with the first occurrence of the bytes
   `from` replaced by `to` (same length), or, when u32 is non-negative, with
   the u32 value of the GGUF key `from` set to it. Returns false when the
   bytes are not found (or the key is no u32) or a file cannot be used. */
static inline bool fx_patched_copy(const char *src, const char *dst, const char *from, const char *to, long long u32) {
    size_t n = 0;
    unsigned char *buf = (unsigned char *)fx_slurp(src, &n);
    const size_t len = strlen(from);
    unsigned char *hit = NULL;
    for (size_t i = 0; buf && !hit && i + len <= n; i++)
        if (!memcmp(buf + i, from, len)) hit = buf + i;
    bool ok = hit != NULL;
    if (ok && u32 >= 0) { /* key bytes, then u32 type 4, then the value */
        uint32_t type, v = (uint32_t)u32;
        ok = hit + len + 8 <= buf + n;
        if (ok) memcpy(&type, hit + len, 4);
        ok = ok && type == 4;
        if (ok) memcpy(hit + len + 4, &v, 4);
    } else if (ok) {
        memcpy(hit, to, len);
    }
    FILE *fp = ok ? fopen(dst, "wb") : NULL;
    ok = fp && fwrite(buf, 1, n, fp) == n;
    if (fp) fclose(fp);
    free(buf);
    return ok;
}

#endif
