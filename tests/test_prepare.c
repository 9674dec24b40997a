/*
 * test_prepare.c - weights prepared once at load (backend.h prepare_weight,
 * docs/backend.md), on every ISA this CPU has:
 *   1. a quantized weight (Q8_0, Q4_K: two whole 16-row groups and a tail)
 *      prepared where the ISA has a packed kernel for it: it gets a handle
 *      and its bytes move (packed in place); elsewhere (the scalar table)
 *      nothing happens. matmul gives the same bits prepared or not;
 *   2. packing is invisible: read gives the original bytes and leaves the
 *      weight packed; get_rows through a copy of the tensor and through a
 *      second view of the same bytes prepared again (which shares the
 *      handle, as a tied embedding does) gives the original rows; a view
 *      without the handle restores the bytes, after which the prepared
 *      tensor still gives the same bits (row-major) until prepared again;
 *      write of new bytes through the prepared tensor gives the new
 *      weight's product;
 *   3. a weight the backend does not own (zero_copy) is left as it is;
 *   4. out of memory while preparing (core/fault.h: each of the call's two
 *      allocations on a fresh backend, the group scratch and the handle)
 *      returns EMBER_ERR_NOMEM and leaves the tensor and its bytes as they
 *      were; the next call succeeds and gives the same bits;
 *   5. models: GGUF Q8_0 files of the fixtures llama, phi3 (fused
 *      projections), gemma2, gemma3_text, qwen3_moe, glm4_moe (MoE),
 *      qwen3_next, qwen3_5_moe_text (hybrid), gemma4_text, gemma4_text_moe
 *      and gemma4_text_ple (per-layer inputs) loaded on each ISA with packed
 *      kernels run a prompt with
 *      every product on a prepared weight (ember_backend_cpu_unprepared
 *      stays 0), the tied embedding sharing the output head's handle, and
 *      give the logits of the same file computed from the mapped file
 *      (--mmap: nothing prepared), bit for bit.
 * Without ../shared, parts 1-4 run and the test then exits 77 (skipped).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/fault.h"
#include "core/util.h"
#include "ember.h"
#include "engine/engine.h"
#define TEST_RNG_SEED 0x9e9a11ull
#include "test.h"
/* CHECK as an expression */
#define CHK(c) CHECKV((c), "%s", "")
#include "fixture.h"
#include "model/model.h"
#include "model/quantize.h"

enum { N = 40, K = 256, M = 3 };

static ember_backend *backend(ember_isa isa, bool zero_copy) {
    ember_cpu_params p = {.n_threads = 2, .isa = isa, .zero_copy = zero_copy};
    ember_backend *be = NULL;
    ember_error err = {0};
    if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) return NULL;
    return be;
}

/* Random blocks of dtype dt with small finite f16 scales (Q8_0 and Q4_K). */
static void fill_blocks(ember_dtype dt, unsigned char *w, size_t nbytes) {
    for (size_t i = 0; i < nbytes; i++) w[i] = (unsigned char)rnd();
    const size_t bb = ember_dtype_get(dt)->block_bytes;
    for (size_t b = 0; b + bb <= nbytes; b += bb) {
        uint16_t d = ember_f32_to_f16(0.01f + 0.02f * frnd() * frnd()), dm = ember_f32_to_f16(0.005f * frnd());
        memcpy(w + b, &d, 2);
        if (dt == EMBER_Q4_K) memcpy(w + b + 2, &dm, 2);
    }
}

typedef struct mm_io {
    ember_tensor x, o, r;
    ember_buffer *xb, *ob, *rb;
    float xh[M * K];
} mm_io;

static bool io_new(ember_backend *be, mm_io *io) {
    ember_error err = {0};
    memset(io, 0, sizeof *io);
    for (int i = 0; i < M * K; i++) io->xh[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f; /* the same in every io */
    return CHECKV(ember_tensor_alloc(be, &io->x, &io->xb, EMBER_F32, 2, (const int64_t[]){M, K}, &err) == EMBER_OK,
                  "%s", err.msg) &&
           CHECKV(ember_tensor_alloc(be, &io->o, &io->ob, EMBER_F32, 2, (const int64_t[]){M, N}, &err) == EMBER_OK,
                  "%s", err.msg) &&
           CHECKV(ember_tensor_alloc(be, &io->r, &io->rb, EMBER_F32, 2, (const int64_t[]){3, K}, &err) == EMBER_OK,
                  "%s", err.msg) &&
           CHECKV(be->ops->write(be, &io->x, 0, io->xh, sizeof io->xh, &err) == EMBER_OK, "%s", err.msg);
}

static void io_free(mm_io *io) {
    ember_buffer_free(io->xb);
    ember_buffer_free(io->ob);
    ember_buffer_free(io->rb);
}

/* out = x w^T on be. */
static bool mm(ember_backend *be, mm_io *io, const ember_tensor *w, float *out) {
    ember_error err = {0};
    ember_matmul p = {&io->o, w, NULL};
    return CHECKV(be->ops->matmul(be, &io->x, 1, &p, &err) == EMBER_OK, "matmul: %s", err.msg) &&
           CHECKV(be->ops->read(be, &io->o, 0, out, (size_t)M * N * 4, &err) == EMBER_OK, "read: %s", err.msg);
}

/* rows 0, 17 and 39 of w, as f32. */
static bool rows_of(ember_backend *be, mm_io *io, const ember_tensor *w, float *out) {
    ember_error err = {0};
    const int32_t ids[3] = {0, 17, 39};
    return CHECKV(be->ops->get_rows(be, &io->r, w, ids, 3, &err) == EMBER_OK, "get_rows: %s", err.msg) &&
           CHECKV(be->ops->read(be, &io->r, 0, out, (size_t)3 * K * 4, &err) == EMBER_OK, "read: %s", err.msg);
}

/* A weight [N, K] of dt holding bytes wh, in a buffer of its own. */
static bool weight_new(ember_backend *be, ember_dtype dt, const unsigned char *wh, size_t nb, ember_tensor *w,
                       ember_buffer **b) {
    ember_error err = {0};
    return CHECKV(be->ops->buffer_from_host(be, wh, nb, b, &err) == EMBER_OK, "%s", err.msg) &&
           CHECKV(ember_tensor_view(w, *b, 0, dt, 2, (const int64_t[]){N, K}, &err) == EMBER_OK, "%s", err.msg);
}

/* 1 and 2 (and 4 when fault) for one ISA and dtype. */
static void test_weight(ember_isa isa, ember_dtype dt) {
    const char *tag = ember_isa_name(isa), *dn = ember_dtype_get(dt)->name;
    const bool packs = ember_cpu_kernels_for(isa)->qgemm_packed[dt] != NULL;
    const size_t nb = (size_t)N * (K / ember_dtype_get(dt)->block_elems) * ember_dtype_get(dt)->block_bytes;
    unsigned char *wh = malloc(nb), *wh2 = malloc(nb), *back = malloc(nb);
    float ref[M * N], got[M * N], ref2[M * N], rref[3 * K], rgot[3 * K];
    ember_backend *be = backend(isa, false);
    ember_error err = {0};
    mm_io io;
    ember_tensor w, w2, alias, copy;
    ember_buffer *b = NULL, *b2 = NULL;
    if (!CHK(wh && wh2 && back) || !be || !io_new(be, &io)) goto done;
    fill_blocks(dt, wh, nb);
    fill_blocks(dt, wh2, nb);
    /* the reference: the same weights never prepared */
    if (!weight_new(be, dt, wh2, nb, &w2, &b2) || !mm(be, &io, &w2, ref2)) goto done;
    ember_buffer_free(b2);
    b2 = NULL;
    if (!weight_new(be, dt, wh, nb, &w, &b) || !mm(be, &io, &w, ref) || !rows_of(be, &io, &w, rref)) goto done;
    /* 1: prepare */
    if (!CHECKV(be->ops->prepare_weight(be, &w, &err) == EMBER_OK, "%s %s: %s", tag, dn, err.msg)) goto done;
    CHECKF((w.prep != NULL) == packs, "%s %s: handle %p, packed kernel %d", tag, dn, (void *)w.prep, packs);
    CHECKF((memcmp(b->data, wh, nb) != 0) == packs, "%s %s: the bytes %s", tag, dn, packs ? "did not move" : "moved");
    CHECKF(mm(be, &io, &w, got) && !memcmp(got, ref, sizeof got), "%s %s: prepared matmul differs", tag, dn);
    CHECK(be->ops->prepare_weight(be, &w, &err) == EMBER_OK); /* again: nothing changes */
    CHECKF(mm(be, &io, &w, got) && !memcmp(got, ref, sizeof got), "%s %s: prepared twice differs", tag, dn);
    /* 2: read, copies and views */
    CHECK(be->ops->read(be, &w, 0, back, nb, &err) == EMBER_OK && !memcmp(back, wh, nb));
    CHECK(be->ops->read(be, &w, 1000, back, 3000, &err) == EMBER_OK && !memcmp(back, wh + 1000, 3000));
    CHECKF((memcmp(b->data, wh, nb) != 0) == packs, "%s %s: read unpacked the weight", tag, dn);
    copy = w;
    CHECKF(rows_of(be, &io, &copy, rgot) && !memcmp(rgot, rref, sizeof rgot), "%s %s: get_rows of a copy", tag, dn);
    CHECK(ember_tensor_view(&alias, b, 0, dt, 2, (const int64_t[]){N, K}, &err) == EMBER_OK && !alias.prep);
    CHECK(be->ops->prepare_weight(be, &alias, &err) == EMBER_OK && alias.prep == w.prep);
    CHECKF(rows_of(be, &io, &alias, rgot) && !memcmp(rgot, rref, sizeof rgot), "%s %s: get_rows of a tied view", tag,
           dn);
    CHECKF((memcmp(b->data, wh, nb) != 0) == packs, "%s %s: a prepared view unpacked the weight", tag, dn);
    alias.prep = NULL; /* a view the loader did not prepare */
    CHECKF(rows_of(be, &io, &alias, rgot) && !memcmp(rgot, rref, sizeof rgot), "%s %s: get_rows of a plain view", tag,
           dn);
    CHECKF(!memcmp(b->data, wh, nb), "%s %s: a view without the handle read packed bytes", tag, dn);
    CHECKF(mm(be, &io, &w, got) && !memcmp(got, ref, sizeof got), "%s %s: matmul after a restore", tag, dn);
    CHECK(be->ops->prepare_weight(be, &w, &err) == EMBER_OK);
    CHECKF((memcmp(b->data, wh, nb) != 0) == packs, "%s %s: prepared again, the bytes did not move", tag, dn);
    CHECKF(mm(be, &io, &copy, got) && !memcmp(got, ref, sizeof got), "%s %s: the copy after repacking", tag, dn);
    /* write through the prepared tensor: the new weight, row-major */
    CHECK(be->ops->write(be, &w, 0, wh2, nb, &err) == EMBER_OK && !memcmp(b->data, wh2, nb));
    CHECKF(mm(be, &io, &w, got) && !memcmp(got, ref2, sizeof got), "%s %s: matmul after a write", tag, dn);
    CHECK(be->ops->read(be, &w, 0, back, nb, &err) == EMBER_OK && !memcmp(back, wh2, nb));
    if (packs) {
        /* 4: out of memory on each allocation of a preparation on a fresh backend (the
           group scratch, the handle) */
        ember_backend *fb = backend(isa, false);
        ember_tensor fw;
        ember_buffer *fbuf = NULL;
        mm_io fio;
        int failed = 0;
        if (fb && io_new(fb, &fio) && weight_new(fb, dt, wh, nb, &fw, &fbuf)) {
            for (long nth = 1; nth < 10; nth++) {
                ember_error ferr = {0};
                ember_fault_arm(EMBER_FAULT_ALLOC, nth, false);
                int rc = fb->ops->prepare_weight(fb, &fw, &ferr);
                const long hit = ember_fault_injected(EMBER_FAULT_ALLOC);
                ember_fault_reset();
                if (!hit) {
                    CHECKF(rc == EMBER_OK && fw.prep, "%s %s: prepare failed with nothing injected", tag, dn);
                    break;
                }
                failed++;
                CHECKF(rc == EMBER_ERR_NOMEM && ferr.msg[0], "%s %s: allocation %ld failed: rc %d", tag, dn, nth, rc);
                CHECKF(!fw.prep && !memcmp(fbuf->data, wh, nb), "%s %s: a failed prepare changed the weight", tag, dn);
            }
            CHECKF(failed == 2, "%s %s: %d allocations failed (the scratch and the handle expected)", tag, dn, failed);
            CHECKF(mm(fb, &fio, &fw, got) && !memcmp(got, ref, sizeof got), "%s %s: matmul once prepared", tag, dn);
        }
        ember_buffer_free(fbuf);
        io_free(&fio);
        ember_backend_free(fb);
    }
done:
    if (be) io_free(&io);
    ember_buffer_free(b);
    ember_buffer_free(b2);
    ember_backend_free(be);
    free(wh);
    free(wh2);
    free(back);
}

/* 3: the caller's memory is never packed. */
static void test_zero_copy(ember_isa isa) {
    const size_t nb = (size_t)N * (K / 32) * 34;
    unsigned char *wh = ember_aligned_alloc(64, nb);
    ember_backend *be = backend(isa, true);
    ember_error err = {0};
    ember_tensor w;
    ember_buffer *b = NULL;
    if (!CHK(wh) || !be) goto done;
    fill_blocks(EMBER_Q8_0, wh, nb);
    unsigned char *orig = malloc(nb);
    if (!CHK(orig)) goto done;
    memcpy(orig, wh, nb);
    if (weight_new(be, EMBER_Q8_0, wh, nb, &w, &b)) {
        CHECK(b->data == wh); /* wrapped, not copied */
        CHECK(be->ops->prepare_weight(be, &w, &err) == EMBER_OK && !w.prep && !memcmp(wh, orig, nb));
    }
    free(orig);
done:
    ember_buffer_free(b);
    ember_backend_free(be);
    free(wh);
}

/* ---- 5: models ---- */

static char g_dir[64];

/* The logits of prompt 0 of f by the model at path on isa (use_mmap: the
   mapped file); *unprepared: the backend's count after the prompt. */
static bool model_logits(const char *path, const fixture *f, ember_isa isa, bool use_mmap, float *out,
                         long *unprepared, bool *tied_shared, bool *any_prepared) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = 2;
    mp.n_rows = 1;
    mp.use_mmap = use_mmap;
    ember_model *m = fx_load_params(path, &mp);
    if (!CHECKV(m != NULL, "%s does not load", path)) return false;
    ember_error err = {0};
    bool ok = CHECKV(ember_logits(m, f->p[0].ids, f->p[0].n, out, &err) == EMBER_OK, "%s: %s", path, err.msg);
    *unprepared = ember_backend_cpu_unprepared(m->be);
    const ember_llm *l = m->llm;
    *any_prepared = l->lm_head.prep || l->layers[0].wq.prep || l->layers[0].lin_qkv.prep;
    *tied_shared = l->embed.buf != l->lm_head.buf || l->embed.offset != l->lm_head.offset ||
                   l->embed.prep == l->lm_head.prep;
    ember_model_free(m);
    return ok;
}

static void test_models(void) {
    static const char *const fams[] = {"llama", "phi3", "gemma2", "gemma3_text", "qwen3_moe", "glm4_moe", "qwen3_next", "qwen3_5_moe_text", "gemma4_text", "gemma4_text_moe", "gemma4_text_ple"};
    static const ember_isa isas[] = {EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(fams); i++) {
        fixture f;
        fixture_open(&f, fams[i]);
        char path[128];
        snprintf(path, sizeof path, "%s/%s-q8_0.gguf", g_dir, fams[i]);
        ember_qscheme qs;
        ember_error err = {0};
        float *ref = malloc((size_t)f.p[0].n * f.vocab * 4), *got = malloc((size_t)f.p[0].n * f.vocab * 4);
        if (CHK(ref && got && ember_qscheme_parse("q8_0", &qs)) &&
            CHECKV(ember_quantize_to_gguf(f.dir, path, qs, &err) == EMBER_OK, "%s: %s", fams[i], err.msg)) {
            long un = 0;
            bool shared = true, any = false;
            if (model_logits(path, &f, EMBER_ISA_AVX2, true, ref, &un, &shared, &any)) {
                CHECKF(!any, "%s: a mapped file's weights were prepared", fams[i]);
                for (size_t a = 0; a < EMBER_ARRAY_LEN(isas); a++) {
                    if (!ember_isa_supported(isas[a])) continue;
                    if (!model_logits(path, &f, isas[a], false, got, &un, &shared, &any)) continue;
                    CHECKF(any, "%s %s: nothing prepared", fams[i], ember_isa_name(isas[a]));
                    CHECKF(un == 0, "%s %s: %ld products on weights the loader did not prepare", fams[i],
                           ember_isa_name(isas[a]), un);
                    CHECKF(shared, "%s %s: the tied embedding does not share the head's handle", fams[i],
                           ember_isa_name(isas[a]));
                    CHECKF(!memcmp(got, ref, (size_t)f.p[0].n * f.vocab * 4),
                           "%s %s: prepared weights give other logits than the mapped file", fams[i],
                           ember_isa_name(isas[a]));
                }
            }
        }
        unlink(path);
        free(ref);
        free(got);
        fixture_close(&f);
    }
}

int main(void) {
    static const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (size_t a = 0; a < EMBER_ARRAY_LEN(isas); a++) {
        if (!ember_isa_supported(isas[a])) continue;
        test_weight(isas[a], EMBER_Q8_0);
        test_weight(isas[a], EMBER_Q4_K);
        test_zero_copy(isas[a]);
    }
    shared_dir(); /* part 5 reads the fixtures (else: 77 after the checks above, or 1 if one failed) */
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-prep-XXXXXX");
    if (CHK(mkdtemp(g_dir) != NULL)) {
        test_models();
        rmdir(g_dir);
    }
    return test_done();
}
