/*
 * test_gguf_gemma4.c - the Gemma 4 family through GGUF in llama.cpp's
 * layout (architecture gemma4; src/model/gguf_model.c, quantize.c), on the
 * fixtures gemma4_text (K = V global layers of another head size,
 * proportional RoPE), gemma4_text_ple (per-layer inputs, KV sharing,
 * double-wide MLPs) and gemma4_text_moe (the MoE block beside the MLP):
 *   1. each fixture written by `ember quantize`'s library call as an F32
 *      GGUF gives the safetensors logits bit for bit, and on every ISA this
 *      CPU has the reference logits of every prompt position within the
 *      fixtures' mark (1e-4 x max|logit|), p0's decode-step logits and the
 *      24 greedy ids of each prompt exactly; `ember quantize` on the command
 *      line writes the same bytes;
 *   2. bf16, f16, q8_0, q4_0 and q4_k_m files load and run on every ISA:
 *      mean KL(reference || GGUF) over every prompt position below a bound
 *      per type; the bf16 and f16 files give bit for bit the logits of the
 *      safetensors directory holding the same rounded matrices (so what
 *      they lose is the weights' rounding, nothing of the layout);
 *   3. the F32 file read back with the GGUF reader: the keys and the tensor
 *      names and shapes llama.cpp's gemma4 loader asks for (per-layer head
 *      sizes, KV heads and MLP widths, the sliding flags, rope_freqs with
 *      1e30 on the pairs at rest, no attn_v on K = V layers, no K/V on
 *      KV-shared layers, the fused experts equal to the safetensors');
 *   4. the experts laid out apart (ffn_gate_exps / ffn_up_exps, which
 *      llama.cpp's loader also takes) give the same logits bit for bit;
 *   5. refusals with one line naming the tensor or key: a tensor the
 *      architecture needs missing, an unknown tensor present, corrupt MoE
 *      metadata (expert count 0, top-k above it, a missing expert tensor),
 *      a bad rope_freqs, impossible per-layer values; `ember quantize`
 *      refuses RoPE the layout cannot hold, naming the config entry;
 *   6. batch invariance of the q8_0 files, bit for bit: the three prompts
 *      alone vs batched vs in prefill chunks of 5 vs 1 thread, greedy;
 *   7. randomly mutated headers of the PLE and MoE files load or are
 *      refused with one line, never a crash.
 * Exits 77 when ../shared is absent.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember.h"
#include "core/cpu.h"
#include "fixture.h"
#include "gguf_check.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/safetensors.h"
#include "formats/weights.h"
#include "backend/backend.h"
#include "model/model.h"
#include "model/quantize.h"

static const char *const k_fams[] = {"gemma4_text", "gemma4_text_ple", "gemma4_text_moe"};
#define N_FAM 3
static const ember_isa k_isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};

static void gguf_path(char *out, size_t n, const char *fam, const char *scheme) {
    snprintf(out, n, "%s/g4-%s-%s.gguf", EMBER_TEST_TMP, fam, scheme);
}

/* The logits of every position of f's prompts and the 24 greedy ids of
   each (f32 KV) from the model at path on the given ISA (fx_generate3). */
static bool run_prompts(const char *path, const fixture *f, ember_isa isa, float *lg[3], int32_t ids[3][24]) {
    ember_model *m = fx_load_model(path, isa, 2, 1);
    const bool ok = m && fx_generate3(m, f, path, ids, lg);
    ember_model_free(m);
    return ok;
}

/* Compares a run with f's reference: *worst the largest relative |dlogit|
   of the three prompts (fx_logit_err); the first step where the greedy ids
   part (-1: none) per prompt into first[]. */
static void compare(const fixture *f, float *lg[3], int32_t ids[3][24], float *worst, int first[3]) {
    *worst = 0;
    for (int i = 0; i < 3; i++) {
        const int agree = fx_agree(f, i, ids[i]);
        first[i] = agree < 24 ? agree : -1;
        *worst = fmaxf(*worst, fx_logit_err(f, i, lg[i], agree));
    }
}

static void alloc_rows(const fixture *f, float *lg[3]) {
    for (int i = 0; i < 3; i++) lg[i] = calloc((size_t)(f->p[i].n + 23) * (size_t)f->vocab, sizeof(float));
}

static void free_rows(float *lg[3]) {
    for (int i = 0; i < 3; i++) free(lg[i]);
}

/* ---- 1: F32 ---------------------------------------------------------------------- */

static void test_f32(int fi) {
    const char *fam = k_fams[fi];
    fixture f;
    fixture_open(&f, fam);
    char out[700];
    gguf_path(out, sizeof out, fam, "f32");
    ember_error err = {0};
    if (!CHECKV(ember_quantize_to_gguf(f.dir, out, EMBER_QSCHEME_F32, &err) == EMBER_OK, "%s: %s", fam, err.msg)) {
        fixture_close(&f);
        return;
    }
    /* the safetensors logits, bit for bit */
    const int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    const size_t n = (size_t)rows * (size_t)f.vocab;
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    if (CHECKV(ref && got && fx_prompt_logits(f.dir, &f, 3, ref) == 0 && fx_prompt_logits(out, &f, 3, got) == 0,
               "%s: f32 GGUF does not run", fam)) {
        float d = 0;
        for (size_t k = 0; k < n; k++) d = fmaxf(d, fabsf(ref[k] - got[k]));
        CHECKF(!memcmp(ref, got, n * 4), "%s f32 GGUF: logits differ from safetensors (max %g)", fam, d);
    }
    free(ref);
    free(got);
    /* the reference on every ISA */
    for (int a = 0; a < 4; a++) {
        const ember_isa *isas = k_isas;
        if (!ember_isa_supported(isas[a])) continue;
        float *lg[3];
        int32_t ids[3][24];
        int first[3];
        float worst = 1;
        alloc_rows(&f, lg);
        if (CHECKV(run_prompts(out, &f, isas[a], lg, ids), "%s f32 GGUF %s: does not run", fam,
                   ember_isa_name(isas[a]))) {
            compare(&f, lg, ids, &worst, first);
            CHECKF(worst <= 1e-4f, "%s f32 GGUF %s: relative logit error %g", fam, ember_isa_name(isas[a]), worst);
            for (int i = 0; i < 3; i++)
                CHECKF(first[i] < 0, "%s f32 GGUF %s p%d: greedy ids differ from step %d", fam,
                       ember_isa_name(isas[a]), i, first[i]);
            fprintf(stderr, "%-16s f32 GGUF %-6s worst relative logit error %.3g, greedy ids equal\n", fam,
                    ember_isa_name(isas[a]), worst);
        }
        free_rows(lg);
    }
    /* the command line writes the same file */
    char cli[720], cmd[2048];
    snprintf(cli, sizeof cli, "%s/g4-%s-cli.gguf", EMBER_TEST_TMP, fam);
    snprintf(cmd, sizeof cmd, "%s quantize -m %s --type f32 -o %s > /dev/null", EMBER_BIN, f.dir, cli);
    CHECKF(system(cmd) == 0, "%s", cmd);
    size_t na = 0, nb = 0;
    char *a = fx_slurp(out, &na), *b = fx_slurp(cli, &nb);
    CHECKF(a && b && na == nb && !memcmp(a, b, na), "%s: `ember quantize` wrote another file", fam);
    free(a);
    free(b);
    fixture_close(&f);
}

/* ---- 2: the other types ----------------------------------------------------------- */

/* Per type: the bound on the mean KL(reference || GGUF) over every prompt
   position, about 3x the largest of the three fixtures measured (x86-64,
   AVX-512 / AMX; docs/model-families.md, "Gemma 4 from and to GGUF"), and
   for bf16 / f16 the mark on max|dlogit| / max|logit|. These random Gemma 4
   fixtures are far more sensitive to weight rounding than the other
   families (attention scores unscaled; MoE routing flips): bf16 moves the
   logits by up to 8e-2 of the largest. */
static const struct {
    const char *name;
    ember_dtype dt; /* bf16 / f16: the matrices' type; else invalid */
    float rel;
    double kl;
} k_types[] = {{"bf16", EMBER_BF16, 1.2f, 1e-3},
               {"f16", EMBER_F16, 5e-2f, 2e-5},
               {"q8_0", EMBER_DTYPE_INVALID, 0, 4e-2},
               {"q4_0", EMBER_DTYPE_INVALID, 0, 0.5},
               {"q4_k_m", EMBER_DTYPE_INVALID, 0, 0.25}};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

typedef struct rounded {
    const ember_st_file *src;
    ember_dtype dt;
    const bool *round; /* per tensor: stored as dt (else f32) */
} rounded;

static int fill_rounded(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const rounded *r = user;
    const float *x = (const float *)r->src->tensors[index].data + first;
    for (size_t i = 0; i < n; i++) {
        if (!r->round[index]) {
            memcpy((float *)dst + i, x + i, 4);
        } else {
            float v;
            memcpy(&v, x + i, 4);
            const uint16_t h = r->dt == EMBER_BF16 ? ember_f32_to_bf16(v) : ember_f32_to_f16(v);
            memcpy((uint16_t *)dst + i, &h, 2);
        }
    }
    return EMBER_OK;
}

/* A copy of fixture f's directory at dir whose matrices (every tensor of 2
   or more dimensions but the router, as `ember quantize` stores them) are
   rounded to dt: what a bf16 / f16 GGUF holds, in the safetensors layout. */
static bool rounded_copy(const fixture *f, ember_dtype dt, const char *dir) {
    char path[800], cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/config.json %s/", dir, dir, f->dir, dir);
    if (!CHECKV(system(cmd) == 0, "%s", cmd)) return false;
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    ember_st_file *src = NULL;
    ember_error err = {0};
    if (!CHECKV(ember_st_open(path, &src, &err) == EMBER_OK, "%s", err.msg)) return false;
    ember_st_out *out = calloc((size_t)src->n_tensors + 1, sizeof *out);
    bool *round = calloc((size_t)src->n_tensors + 1, sizeof *round);
    bool ok = out && round;
    for (int i = 0; ok && i < src->n_tensors; i++) {
        const ember_st_tensor *t = &src->tensors[i];
        ok = CHECKV(t->dtype == EMBER_F32, "%s: %s is not f32", f->dir, t->name);
        const size_t len = strlen(t->name);
        round[i] = t->ndim >= 2 && !(len >= 18 && strcmp(t->name + len - 18, "router.proj.weight") == 0);
        out[i].name = t->name;
        out[i].dtype = round[i] ? dt : EMBER_F32;
        out[i].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) out[i].shape[d] = t->shape[d];
    }
    rounded r = {src, dt, round};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ok = ok && CHECKV(ember_st_write(path, out, src->n_tensors, fill_rounded, &r, &err) == EMBER_OK, "%s", err.msg);
    free(out);
    free(round);
    ember_st_free(src);
    return ok;
}

/* The logits of f's three prompts (rows concatenated) from the model at path on isa. */
static bool prompt_logits(const char *path, const fixture *f, ember_isa isa, float *out) {
    ember_model *m = fx_load_model(path, isa, 2, 1);
    if (!m) return false;
    ember_error err = {0};
    int rows = 0, rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        rc = ember_logits(m, f->p[i].ids, f->p[i].n, out + (size_t)rows * f->vocab, &err);
        rows += f->p[i].n;
    }
    if (rc) fprintf(stderr, "%s: %s\n", path, err.msg);
    ember_model_free(m);
    return rc == 0;
}

static void test_types(int fi) {
    const char *fam = k_fams[fi];
    fixture f;
    fixture_open(&f, fam);
    const int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    const size_t nl = (size_t)rows * (size_t)f.vocab;
    float *ref = malloc(nl * 4), *flat = malloc(nl * 4), *copy = malloc(nl * 4);
    for (int i = 0, r = 0; ref && i < 3; r += f.p[i].n, i++)
        memcpy(ref + (size_t)r * f.vocab, f.p[i].logits, (size_t)f.p[i].n * (size_t)f.vocab * 4);
    for (size_t t = 0; ref && flat && copy && t < N_TYPES; t++) {
        ember_qscheme qs;
        CHECK(ember_qscheme_parse(k_types[t].name, &qs));
        char out[700], dir[700];
        gguf_path(out, sizeof out, fam, k_types[t].name);
        ember_error err = {0};
        if (!CHECKV(ember_quantize_to_gguf(f.dir, out, qs, &err) == EMBER_OK, "%s %s: %s", fam, k_types[t].name,
                    err.msg))
            continue;
        /* the same rounded weights in the safetensors layout (bf16, f16) */
        snprintf(dir, sizeof dir, "%s/g4-%s-%s-st", EMBER_TEST_TMP, fam, k_types[t].name);
        const bool have_copy = k_types[t].dt != EMBER_DTYPE_INVALID && rounded_copy(&f, k_types[t].dt, dir);
        /* the greedy ids and the worst logit error, on the best ISA */
        float *lg[3];
        int32_t ids[3][24];
        int first[3] = {-1, -1, -1};
        float worst = 1;
        alloc_rows(&f, lg);
        if (CHECKV(run_prompts(out, &f, EMBER_ISA_AUTO, lg, ids), "%s %s: does not run", fam, k_types[t].name))
            compare(&f, lg, ids, &worst, first);
        free_rows(lg);
        fprintf(stderr, "%-16s %-7s relative logit error %.3g, greedy ids part at %d %d %d (-1: never)\n", fam,
                k_types[t].name, worst, first[0], first[1], first[2]);
        if (k_types[t].dt != EMBER_DTYPE_INVALID)
            CHECKF(worst <= k_types[t].rel, "%s %s: relative logit error %g above %g", fam, k_types[t].name, worst,
                   k_types[t].rel);
        /* the KL on every ISA; bf16 / f16: bit for bit the safetensors copy's logits */
        for (int a = 0; a < 4; a++) {
            if (!ember_isa_supported(k_isas[a])) continue;
            const char *isa = ember_isa_name(k_isas[a]);
            if (!CHECKV(prompt_logits(out, &f, k_isas[a], flat), "%s %s %s: does not run", fam, k_types[t].name, isa))
                continue;
            const double kl = mean_kl(ref, flat, rows, f.vocab);
            fprintf(stderr, "%-16s %-7s %-6s mean KL %.3g (bound %g)\n", fam, k_types[t].name, isa, kl, k_types[t].kl);
            CHECKF(kl < k_types[t].kl, "%s %s %s: mean KL %g above %g", fam, k_types[t].name, isa, kl, k_types[t].kl);
            if (have_copy && CHECKV(prompt_logits(dir, &f, k_isas[a], copy), "%s does not run", dir)) {
                float d = 0;
                for (size_t k = 0; k < nl; k++) d = fmaxf(d, fabsf(copy[k] - flat[k]));
                CHECKF(!memcmp(copy, flat, nl * 4), "%s %s GGUF %s: logits differ from the %s safetensors (max %g)",
                       fam, k_types[t].name, isa, k_types[t].name, d);
            }
        }
    }
    free(ref);
    free(flat);
    free(copy);
    fixture_close(&f);
}

/* ---- 3: the file as llama.cpp reads it --------------------------------------------- */

static void check_layout(int fi) {
    const char *fam = k_fams[fi];
    fixture f;
    fixture_open(&f, fam);
    ember_model_config c;
    ember_weights *w = NULL;
    ember_gguf *g = NULL;
    ember_error err = {0};
    char path[700], name[160];
    gguf_path(path, sizeof path, fam, "f32");
    if (!CHECKV(ember_config_load(f.dir, &c, &err) == EMBER_OK && ember_weights_open(f.dir, &w, &err) == EMBER_OK &&
                    ember_gguf_open(path, &g, &err) == EMBER_OK,
                "%s", err.msg)) {
        ember_weights_free(w);
        fixture_close(&f);
        return;
    }
    const char *arch = NULL;
    CHECK(ember_gguf_get_str(g, "general.architecture", &arch, NULL, &err) == EMBER_OK && arch &&
          strcmp(arch, "gemma4") == 0);
    const int L = c.n_layers;
    const int64_t H = c.hidden_size;
    int Dg = 0, Ds = 0;
    for (int l = 0; l < L; l++) *(c.layer_sliding[l] ? &Ds : &Dg) = ember_cfg_head_dim(&c, l);
    CHECK(gx_key_u32(g, "gemma4", "block_count") == (uint32_t)L &&
          gx_key_u32(g, "gemma4", "attention.key_length") == (uint32_t)Dg &&
          gx_key_u32(g, "gemma4", "attention.key_length_swa") == (uint32_t)Ds &&
          gx_key_u32(g, "gemma4", "attention.value_length") == (uint32_t)Dg &&
          gx_key_u32(g, "gemma4", "attention.sliding_window") == 16 &&
          gx_key_u32(g, "gemma4", "attention.shared_kv_layers") == (uint32_t)c.n_kv_shared &&
          gx_key_u32(g, "gemma4", "embedding_length_per_layer_input") == (uint32_t)c.ple_dim &&
          gx_key_u32(g, "gemma4", "rope.dimension_count") == (uint32_t)Dg &&
          gx_key_u32(g, "gemma4", "rope.dimension_count_swa") == (uint32_t)Ds);
    float fv = 0;
    CHECK(ember_gguf_get_f32(g, "gemma4.rope.freq_base", &fv, &err) == EMBER_OK && fv == 1e6f);
    CHECK(ember_gguf_get_f32(g, "gemma4.rope.freq_base_swa", &fv, &err) == EMBER_OK && fv == 1e4f);
    CHECK(ember_gguf_get_f32(g, "gemma4.final_logit_softcapping", &fv, &err) == EMBER_OK && fv == 4.0f);
    /* the sliding flags, one per layer */
    const ember_gguf_kv *pat = ember_gguf_find_kv(g, "gemma4.attention.sliding_window_pattern");
    if (CHECKV(pat && pat->type == EMBER_GGUF_ARRAY && pat->arr_type == EMBER_GGUF_BOOL && pat->arr_len == (size_t)L,
               "%s: sliding_window_pattern", fam))
        for (int l = 0; l < L; l++) CHECKF((pat->arr_data[l] != 0) == c.layer_sliding[l], "%s: layer %d flag", fam, l);
    /* KV heads and MLP widths: one value, or one per layer where they differ */
    int32_t *kv = NULL, *ff = NULL;
    size_t nkv = 0, nff = 0;
    bool kv_same = true;
    for (int l = 0; l < L; l++) kv_same &= ember_cfg_kv_heads(&c, l) == c.n_kv_heads;
    if (kv_same) {
        CHECK(gx_key_u32(g, "gemma4", "attention.head_count_kv") == (uint32_t)c.n_kv_heads);
    } else {
        CHECK(ember_gguf_get_i32s(g, "gemma4.attention.head_count_kv", &kv, &nkv, &err) == EMBER_OK && nkv == (size_t)L);
        for (int l = 0; kv && l < L; l++)
            CHECKF(kv[l] == ember_cfg_kv_heads(&c, l), "%s: layer %d KV heads %d", fam, l, kv[l]);
    }
    CHECKF(kv_same == (fi == 1), "%s: the fixture's KV heads per layer", fam);
    if (c.double_wide_mlp) {
        CHECK(ember_gguf_get_i32s(g, "gemma4.feed_forward_length", &ff, &nff, &err) == EMBER_OK && nff == (size_t)L);
        for (int l = 0; ff && l < L; l++)
            CHECKF(ff[l] == ember_cfg_intermediate(&c, l) && ff[l] == (l < 2 ? 128 : 256), "%s: layer %d width %d", fam,
                   l, ff[l]);
    } else {
        CHECK(gx_key_u32(g, "gemma4", "feed_forward_length") == (uint32_t)c.intermediate_size);
    }
    free(kv);
    free(ff);
    /* proportional RoPE: factor 1 on the first 0.25 * Dg / 2 pairs, 1e30 on the rest */
    const ember_gguf_tensor *rf = gx_tensor(g, "rope_freqs.weight", 1, (const int64_t[]){Dg / 2});
    for (int i = 0; rf && i < Dg / 2; i++) {
        float v;
        memcpy(&v, rf->data + 4 * (size_t)i, 4);
        CHECKF(rf->dtype == EMBER_F32 && v == (i < Dg / 8 ? 1.0f : 1e30f), "%s: rope_freqs[%d] = %g", fam, i, v);
    }
    CHECK(!ember_gguf_find_tensor(g, "output.weight")); /* tied */
    for (int l = 0; l < L; l++) {
        const int64_t D = ember_cfg_head_dim(&c, l), KV = (int64_t)ember_cfg_kv_heads(&c, l) * D;
        const bool shared = ember_cfg_kv_shared(&c, l), kev = c.attn_k_eq_v && !c.layer_sliding[l];
        static const char *const norms[] = {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"};
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[k]);
            gx_tensor(g, name, 1, (const int64_t[]){H});
        }
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        gx_tensor(g, name, 2, (const int64_t[]){(int64_t)c.n_heads * D, H});
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
        gx_tensor(g, name, 1, (const int64_t[]){D});
        snprintf(name, sizeof name, "blk.%d.layer_output_scale.weight", l);
        gx_tensor(g, name, 1, (const int64_t[]){1});
        snprintf(name, sizeof name, "blk.%d.attn_k.weight", l);
        if (shared)
            CHECKF(!ember_gguf_find_tensor(g, name), "%s: KV-shared layer %d has %s", fam, l, name);
        else
            gx_tensor(g, name, 2, (const int64_t[]){KV, H});
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        if (shared || kev)
            CHECKF(!ember_gguf_find_tensor(g, name), "%s: layer %d has %s", fam, l, name);
        else
            gx_tensor(g, name, 2, (const int64_t[]){KV, H});
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", l);
        gx_tensor(g, name, 2, (const int64_t[]){ember_cfg_intermediate(&c, l), H});
        /* the norms stored as they are (no 1 added): equal to the safetensors' */
        snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", l);
        const ember_gguf_tensor *nt = ember_gguf_find_tensor(g, name);
        snprintf(name, sizeof name, "model.layers.%d.post_feedforward_layernorm.weight", l);
        const ember_st_tensor *ns = ember_weights_find(w, name, NULL);
        CHECKF(nt && ns && nt->nbytes == ns->nbytes && !memcmp(nt->data, ns->data, nt->nbytes), "%s: %s", fam, name);
        if (c.ple_dim) {
            snprintf(name, sizeof name, "blk.%d.inp_gate.weight", l);
            gx_tensor(g, name, 2, (const int64_t[]){c.ple_dim, H});
            snprintf(name, sizeof name, "blk.%d.proj.weight", l);
            gx_tensor(g, name, 2, (const int64_t[]){H, c.ple_dim});
            snprintf(name, sizeof name, "blk.%d.post_norm.weight", l);
            gx_tensor(g, name, 1, (const int64_t[]){H});
        }
        if (!c.moe_beside_mlp) continue;
        const int64_t E = c.n_experts, Im = c.moe_intermediate_size;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        const ember_gguf_tensor *r = gx_tensor(g, name, 2, (const int64_t[]){E, H});
        CHECK(r && r->dtype == EMBER_F32);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.scale", l);
        gx_tensor(g, name, 1, (const int64_t[]){H});
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.scale", l);
        gx_tensor(g, name, 1, (const int64_t[]){E});
        static const char *const n2[] = {"pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"};
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, n2[k]);
            gx_tensor(g, name, 1, (const int64_t[]){H});
        }
        static const char *const ex[2][2] = {{"ffn_gate_up_exps.weight", "experts.gate_up_proj"},
                                              {"ffn_down_exps.weight", "experts.down_proj"}};
        for (int k = 0; k < 2; k++) { /* the fused experts, as the safetensors holds them */
            snprintf(name, sizeof name, "blk.%d.%s", l, ex[k][0]);
            const ember_gguf_tensor *t =
                gx_tensor(g, name, 3, k ? (const int64_t[]){E, H, Im} : (const int64_t[]){E, 2 * Im, H});
            snprintf(name, sizeof name, "model.layers.%d.%s", l, ex[k][1]);
            const ember_st_tensor *st = ember_weights_find(w, name, NULL);
            CHECKF(t && st && t->nbytes == st->nbytes && !memcmp(t->data, st->data, t->nbytes), "%s: %s", fam, name);
        }
        CHECK(gx_key_u32(g, "gemma4", "expert_count") == (uint32_t)E &&
              gx_key_u32(g, "gemma4", "expert_used_count") == (uint32_t)c.n_experts_used &&
              gx_key_u32(g, "gemma4", "expert_feed_forward_length") == (uint32_t)Im);
    }
    if (c.ple_dim) {
        gx_tensor(g, "per_layer_token_embd.weight", 2, (const int64_t[]){c.ple_vocab, (int64_t)L * c.ple_dim});
        gx_tensor(g, "per_layer_model_proj.weight", 2, (const int64_t[]){(int64_t)L * c.ple_dim, H});
        gx_tensor(g, "per_layer_proj_norm.weight", 1, (const int64_t[]){c.ple_dim});
    }
    ember_gguf_free(g);
    /* q8_0: matrices quantized; routers, norms, scales and rope_freqs f32 (as llama.cpp) */
    gguf_path(path, sizeof path, fam, "q8_0");
    if (CHECKV(ember_gguf_open(path, &g, &err) == EMBER_OK, "%s", err.msg)) {
        for (size_t t = 0; t < g->n_tensors; t++) {
            const ember_gguf_tensor *x = &g->tensors[t];
            const bool f32 = x->ndim == 1 || strstr(x->name, "ffn_gate_inp.weight");
            CHECKF(f32 ? x->dtype == EMBER_F32 : (x->dtype == EMBER_Q8_0 || x->dtype == EMBER_F16), "%s q8_0: %s is %s",
                   fam, x->name, ember_dtype_get(x->dtype)->name);
        }
        ember_gguf_free(g);
    }
    ember_weights_free(w);
    fixture_close(&f);
}

/* ---- rewriting a file ---------------------------------------------------------------- */

/* A copy of src's metadata into w: scalars, strings and arrays of bools and
   integers (what `ember quantize` writes for gemma4). */
static bool copy_kvs(const ember_gguf *src, ember_gguf_writer *w) {
    ember_error err = {0};
    for (size_t i = 0; i < src->n_kv; i++) {
        const ember_gguf_kv *kv = &src->kv[i];
        int rc;
        switch (kv->type) {
        case EMBER_GGUF_U32: rc = ember_gguf_set_u32(w, kv->key, (uint32_t)kv->u64, &err); break;
        case EMBER_GGUF_I32: rc = ember_gguf_set_i32(w, kv->key, (int32_t)kv->i64, &err); break;
        case EMBER_GGUF_F32: rc = ember_gguf_set_f32(w, kv->key, (float)kv->f64, &err); break;
        case EMBER_GGUF_BOOL: rc = ember_gguf_set_bool(w, kv->key, kv->u64 != 0, &err); break;
        case EMBER_GGUF_STRING: rc = ember_gguf_set_str(w, kv->key, kv->str, &err); break;
        case EMBER_GGUF_ARRAY:
            if (kv->arr_type == EMBER_GGUF_BOOL) {
                bool b[64];
                for (size_t k = 0; k < kv->arr_len && k < 64; k++) b[k] = kv->arr_data[k] != 0;
                rc = ember_gguf_set_bools(w, kv->key, b, kv->arr_len, &err);
            } else {
                int32_t *v = NULL;
                size_t n = 0;
                rc = ember_gguf_get_i32s(src, kv->key, &v, &n, &err);
                if (!rc) rc = ember_gguf_set_i32s(w, kv->key, v, n, &err);
                free(v);
            }
            break;
        default: return CHECKV(false, "%s: key %s of type %d not copied", src->path, kv->key, (int)kv->type);
        }
        if (!CHECKV(rc == EMBER_OK, "%s", err.msg)) return false;
    }
    return true;
}

/* Adds a copy of data (nbytes) as tensor name. */
static bool add_copy(ember_gguf_writer *w, const char *name, ember_dtype dt, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes) {
    void *p = malloc(nbytes + 1);
    if (!p) return false;
    memcpy(p, data, nbytes);
    ember_error err = {0};
    return CHECKV(ember_gguf_add_tensor(w, name, dt, ndim, shape, p, &err) == EMBER_OK, "%s", err.msg);
}

/* src rewritten to dst: every key, every tensor but those the callback
   takes over (returning true after adding what it wants in their place),
   then `extra` (a 1-D f32 tensor of 4 zeros; NULL: none). */
typedef bool (*tensor_fn)(ember_gguf_writer *w, const ember_gguf_tensor *t, bool *ok);

static bool rewrite(const char *src, const char *dst, tensor_fn fn, const char *extra) {
    ember_gguf *g = NULL;
    ember_error err = {0};
    if (!CHECKV(ember_gguf_open(src, &g, &err) == EMBER_OK, "%s", err.msg)) return false;
    ember_gguf_writer *w = ember_gguf_writer_new();
    bool ok = w && copy_kvs(g, w);
    for (size_t i = 0; ok && i < g->n_tensors; i++) {
        const ember_gguf_tensor *t = &g->tensors[i];
        if (fn && fn(w, t, &ok)) continue;
        ok = add_copy(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    }
    const float z[4] = {0, 0, 0, 0};
    if (ok && extra) ok = add_copy(w, extra, EMBER_F32, 1, (const int64_t[]){4}, z, sizeof z);
    ok = ok && CHECKV(ember_gguf_write_file(w, dst, &err) == EMBER_OK, "%s", err.msg);
    ember_gguf_writer_free(w);
    ember_gguf_free(g);
    return ok;
}

/* ---- 4: the experts apart ---------------------------------------------------------- */

/* ffn_gate_up_exps [E, 2I, H] split into ffn_gate_exps and ffn_up_exps [E, I, H]. */
static bool split_experts(ember_gguf_writer *w, const ember_gguf_tensor *t, bool *ok) {
    int l;
    char rest[64];
    if (sscanf(t->name, "blk.%d.%63s", &l, rest) != 2 || strcmp(rest, "ffn_gate_up_exps.weight") != 0) return false;
    const int64_t E = t->shape[0], I = t->shape[1] / 2, H = t->shape[2];
    const size_t half = (size_t)(I * H) * 4;
    unsigned char *parts[2] = {malloc((size_t)E * half + 1), malloc((size_t)E * half + 1)};
    *ok = CHECKV(parts[0] && parts[1] && t->dtype == EMBER_F32, "split %s", t->name);
    for (int64_t e = 0; *ok && e < E; e++)
        for (int p = 0; p < 2; p++) memcpy(parts[p] + (size_t)e * half, t->data + (size_t)(2 * e + p) * half, half);
    static const char *const nm[2] = {"gate", "up"};
    for (int p = 0; p < 2 && *ok; p++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, nm[p]);
        *ok = add_copy(w, name, EMBER_F32, 3, (const int64_t[]){E, I, H}, parts[p], (size_t)E * half);
    }
    free(parts[0]);
    free(parts[1]);
    return true;
}

static void test_split_experts(void) {
    fixture f;
    fixture_open(&f, "gemma4_text_moe");
    char src[700], dst[700];
    gguf_path(src, sizeof src, "gemma4_text_moe", "f32");
    gguf_path(dst, sizeof dst, "gemma4_text_moe", "split");
    const int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    const size_t n = (size_t)rows * (size_t)f.vocab;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    if (CHECKV(rewrite(src, dst, split_experts, NULL), "%s", dst) &&
        CHECKV(a && b && fx_prompt_logits(src, &f, 3, a) == 0 && fx_prompt_logits(dst, &f, 3, b) == 0, "%s", dst)) {
        ember_gguf *g = NULL;
        ember_error err = {0};
        CHECK(ember_gguf_open(dst, &g, &err) == EMBER_OK && !ember_gguf_find_tensor(g, "blk.0.ffn_gate_up_exps.weight") &&
              ember_gguf_find_tensor(g, "blk.1.ffn_up_exps.weight"));
        ember_gguf_free(g);
        CHECKF(!memcmp(a, b, n * 4), "gemma4 with the experts apart: logits differ");
    }
    free(a);
    free(b);
    fixture_close(&f);
}

/* ---- 5: refusals ------------------------------------------------------------------- */

/* Loading path must fail with one line holding needle. */
static void expect_load_refused(const char *path, const char *what, const char *needle) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(path, &mp, &m, &err);
    CHECKF(rc != EMBER_OK && !m && strstr(err.msg, needle) && !strchr(err.msg, '\n'),
           "%s: expected a refusal naming '%s', got rc %d '%s'", what, needle, rc, err.msg);
    fprintf(stderr, "refused: %s\n", err.msg);
    ember_model_free(m);
}

/* The file of fam (scheme) with the bytes `from` replaced by `to`, or the
   u32 key `from` set to u32 (>= 0), refused naming needle. */
static void expect_refused(const char *fam, const char *scheme, const char *from, const char *to, long long u32,
                           const char *needle) {
    char src[700], dst[700];
    gguf_path(src, sizeof src, fam, scheme);
    snprintf(dst, sizeof dst, "%s/g4-patched.gguf", EMBER_TEST_TMP);
    if (!CHECKV(fx_patched_copy(src, dst, from, to, u32), "cannot patch %s in %s", from, src)) return;
    expect_load_refused(dst, from, needle);
}

/* rope_freqs.weight with a pair at rest before a rotated one. */
static bool bad_rope_freqs(ember_gguf_writer *w, const ember_gguf_tensor *t, bool *ok) {
    if (strcmp(t->name, "rope_freqs.weight") != 0) return false;
    float v[64];
    memcpy(v, t->data, t->nbytes < sizeof v ? t->nbytes : sizeof v);
    v[0] = 1e30f;
    *ok = add_copy(w, t->name, t->dtype, t->ndim, t->shape, v, t->nbytes);
    return true;
}

static void test_refusals(void) {
    /* a tensor the architecture needs, missing: named, llama.cpp's name and the HuggingFace one */
    expect_refused("gemma4_text", "q8_0", "blk.2.attn_q_norm.weight", "blk.2.attn_q_morm.weight", -1,
                   "missing tensor 'blk.2.attn_q_norm.weight' (model.layers.2.self_attn.q_norm.weight)");
    expect_refused("gemma4_text", "q8_0", "blk.0.attn_v.weight", "blk.0.attn_x.weight", -1,
                   "missing tensor 'blk.0.attn_v.weight'");
    expect_refused("gemma4_text", "q8_0", "blk.3.layer_output_scale.weight", "blk.3.layer_output_scalf.weight", -1,
                   "missing tensor 'blk.3.layer_output_scale.weight' (model.layers.3.layer_scalar)");
    expect_refused("gemma4_text", "f32", "rope_freqs.weight", "rope_freqx.weight", -1,
                   "missing tensor 'rope_freqs.weight'");
    expect_refused("gemma4_text_ple", "q8_0", "blk.1.inp_gate.weight", "blk.1.inp_gatf.weight", -1,
                   "missing tensor 'blk.1.inp_gate.weight' (model.layers.1.per_layer_input_gate.weight)");
    expect_refused("gemma4_text_ple", "q8_0", "per_layer_token_embd.weight", "per_layer_token_embx.weight", -1,
                   "'per_layer_token_embd.weight'");
    expect_refused("gemma4_text_ple", "q8_0", "blk.0.attn_k.weight", "blk.0.attn_x.weight", -1,
                   "missing tensor 'blk.0.attn_k.weight'");
    /* a tensor the architecture does not know: named */
    char src[700], dst[700];
    gguf_path(src, sizeof src, "gemma4_text", "f32");
    snprintf(dst, sizeof dst, "%s/g4-foreign.gguf", EMBER_TEST_TMP);
    if (CHECKV(rewrite(src, dst, NULL, "blk.1.attn_sinks.weight"), "%s", dst))
        expect_load_refused(dst, "foreign tensor", "tensor 'blk.1.attn_sinks.weight' is not part of a gemma4_text model");
    expect_refused("gemma4_text", "q8_0", "blk.0.post_ffw_norm.weight", "blk.0.post_ffx_norm.weight", -1,
                   "'blk.0.post_ffw_norm.weight'");
    /* corrupt MoE metadata and expert tensors */
    expect_refused("gemma4_text_moe", "q8_0", "gemma4.expert_count", NULL, 0, "gemma4.expert_count 0 out of range");
    expect_refused("gemma4_text_moe", "q8_0", "gemma4.expert_used_count", NULL, 5,
                   "gemma4.expert_used_count 5 out of range [1, 4]");
    expect_refused("gemma4_text_moe", "q8_0", "gemma4.expert_count", NULL, 8,
                   "'blk.0.ffn_gate_inp.weight' (model.layers.0.router.proj.weight) has shape [4, 64], expected [8, 64]");
    expect_refused("gemma4_text_moe", "q8_0", "gemma4.expert_feed_forward_length", "gemma4.expert_feed_forward_lengtx",
                   -1, "gemma4.expert_feed_forward_length");
    expect_refused("gemma4_text_moe", "q8_0", "blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_gate_up_exqs.weight", -1,
                   "missing tensor 'blk.1.ffn_gate_up_exps.weight'");
    expect_refused("gemma4_text_moe", "q8_0", "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exqs.weight", -1,
                   "missing tensor 'blk.1.ffn_down_exps.weight'");
    expect_refused("gemma4_text_moe", "q8_0", "blk.0.ffn_down_exps.scale", "blk.0.ffn_down_exps.scalf", -1,
                   "missing tensor 'blk.0.ffn_down_exps.scale' (model.layers.0.router.per_expert_scale)");
    expect_refused("gemma4_text_moe", "q8_0", "blk.0.ffn_gate_inp.scale", "blk.0.ffn_gate_inp.scalf", -1,
                   "missing tensor 'blk.0.ffn_gate_inp.scale' (model.layers.0.router.scale)");
    /* impossible per-layer metadata */
    expect_refused("gemma4_text_ple", "q8_0", "gemma4.attention.shared_kv_layers", NULL, 3,
                   "shared_kv_layers 3: layer 1 (full attention) has no earlier layer");
    expect_refused("gemma4_text_ple", "q8_0", "gemma4.embedding_length_per_layer_input", NULL, 8,
                   "'per_layer_token_embd.weight' (model.embed_tokens_per_layer.weight) has shape [512, 64], "
                   "expected [512, 32]");
    expect_refused("gemma4_text", "q8_0", "gemma4.attention.sliding_window_pattern",
                   "gemma4.attention.sliding_window_patterx", -1, "missing key 'gemma4.attention.sliding_window_pattern'");
    expect_refused("gemma4_text", "q8_0", "gemma4.rope.dimension_count", NULL, 16,
                   "gemma4.rope.dimension_count 16 differs from the full layers' head size 32");
    expect_refused("gemma4_text_ple", "q8_0", "gemma4.attention.key_length_swa", NULL, 15,
                   "head sizes 32 / 15 (key)");
    expect_refused("gemma4_text_ple", "q8_0", "gemma4.attention.head_count_kv", NULL, 3,
                   "heads 4/3");
    gguf_path(src, sizeof src, "gemma4_text", "f32");
    snprintf(dst, sizeof dst, "%s/g4-rope.gguf", EMBER_TEST_TMP);
    if (CHECKV(rewrite(src, dst, bad_rope_freqs, NULL), "%s", dst))
        expect_load_refused(dst, "rope_freqs", "rope_freqs.weight[1] is 1: the rotated pairs");
}

/* `ember quantize` of fixture fam with the config text `from` replaced by
   `to` fails naming needle (what llama.cpp's gemma4 layout cannot hold). */
static void quantize_refused(const char *fam, const char *from, const char *to, const char *needle) {
    fixture f;
    fixture_open(&f, fam);
    char path[800], dir[300];
    snprintf(dir, sizeof dir, "%.280s/g4-edited", EMBER_TEST_TMP);
    snprintf(path, sizeof path, "rm -rf %s && mkdir -p %s", dir, dir);
    size_t nc = 0;
    char *cfg = system(path) == 0 ? (snprintf(path, sizeof path, "%s/config.json", f.dir), fx_slurp(path, &nc)) : NULL;
    char *hit = cfg ? strstr(cfg, from) : NULL;
    char *edited = hit ? malloc(nc + strlen(to) + 1) : NULL;
    if (CHECKV(edited, "%s: no '%s'", f.dir, from)) {
        const int len = snprintf(edited, nc + strlen(to) + 1, "%.*s%s%s", (int)(hit - cfg), cfg, to, hit + strlen(from));
        fx_put(dir, "config.json", edited, (size_t)len);
        char cmd[2400], out[800];
        snprintf(cmd, sizeof cmd, "ln -s %s/model.safetensors %s/model.safetensors", f.dir, dir);
        CHECK(system(cmd) == 0);
        snprintf(out, sizeof out, "%s/out.gguf", dir);
        ember_error err = {0};
        const int rc = ember_quantize_to_gguf(dir, out, EMBER_QSCHEME_Q8_0, &err);
        CHECKF(rc == EMBER_ERR_UNSUPPORTED && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "%s: rc %d '%s'", to,
               rc, err.msg);
        fprintf(stderr, "quantize refused: %s\n", err.msg);
    }
    free(edited);
    free(cfg);
    fixture_close(&f);
}

static void test_quantize_refusals(void) {
    quantize_refused("gemma4_text", "\"rope_theta\": 10000.0,\n      \"rope_type\": \"default\"",
                     "\"factor\": 2.0, \"rope_theta\": 10000.0, \"rope_type\": \"linear\"",
                     "rope_parameters.sliding_attention");
    quantize_refused("gemma4_text", "\"rope_type\": \"proportional\"", "\"rope_type\": \"linear\", \"factor\": 2.0",
                     "rope_parameters.full_attention");
}

/* ---- 6: batch invariance ------------------------------------------------------------- */

typedef struct run {
    int32_t ids[3][24];
    int n_out[3];
    float *logits[3];
} run;

static bool batch_run(const char *path, const fixture *f, int threads, int max_batch, bool together, run *out) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 3;
    mp.n_threads = threads;
    mp.max_batch_tokens = max_batch;
    ember_model *m = fx_load_params(path, &mp);
    if (!m) return false;
    ember_request r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) {
        r[i].prompt = f->p[i].ids;
        r[i].n_prompt = f->p[i].n;
        r[i].max_new_tokens = 24 - 4 * i; /* rows leave the batch at different steps */
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].out_ids = out->ids[i];
        out->logits[i] = calloc((size_t)(f->p[i].n + 24) * (size_t)f->vocab, sizeof(float));
        r[i].out_logits = out->logits[i];
    }
    ember_error err = {0};
    bool ok = true;
    if (together)
        ok = CHECKV(ember_generate(m, r, 3, &err) == EMBER_OK, "%s", err.msg);
    else
        for (int i = 0; i < 3 && ok; i++) ok = CHECKV(ember_generate(m, &r[i], 1, &err) == EMBER_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) out->n_out[i] = r[i].n_out;
    ember_model_free(m);
    return ok;
}

static void test_batch_invariance(int fi) {
    const char *fam = k_fams[fi];
    fixture f;
    fixture_open(&f, fam);
    char path[700];
    gguf_path(path, sizeof path, fam, "q8_0");
    run alone = {0}, together = {0}, chunked = {0}, one = {0};
    if (batch_run(path, &f, 2, 512, false, &alone) && batch_run(path, &f, 2, 512, true, &together) &&
        batch_run(path, &f, 2, 5, true, &chunked) && batch_run(path, &f, 1, 512, true, &one)) {
        const run *other[3] = {&together, &chunked, &one};
        static const char *const what[3] = {"batched vs alone", "prefill in chunks of 5 vs whole", "1 thread vs 2"};
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 3; i++) {
                const size_t n = (size_t)(f.p[i].n + alone.n_out[i] - 1) * (size_t)f.vocab;
                CHECKF(alone.n_out[i] == other[k]->n_out[i] &&
                           !memcmp(alone.ids[i], other[k]->ids[i], sizeof(int32_t) * (size_t)alone.n_out[i]) &&
                           !memcmp(alone.logits[i], other[k]->logits[i], n * sizeof(float)),
                       "%s q8_0 GGUF p%d: %s differ", fam, i, what[k]);
            }
    }
    for (int i = 0; i < 3; i++) {
        free(alone.logits[i]);
        free(together.logits[i]);
        free(chunked.logits[i]);
        free(one.logits[i]);
    }
    fixture_close(&f);
}

/* ---- 7: random corruption of the metadata and tensor infos ------------------------------ */

/* Mutated copies of the gemma4_text_ple and gemma4_text_moe q8_0 files
   (bytes flipped before the tensor data, sometimes truncated) load or are
   refused with one line, never a crash (the sanitizer build checks the
   memory accesses). */
static void test_mutations(int fi) {
    char path[700], what[64];
    gguf_path(path, sizeof path, k_fams[fi], "q8_0");
    snprintf(what, sizeof what, "%s q8_0", k_fams[fi]);
    gx_mutations(path, what, 4242 + (uint64_t)fi, 300, 3);
}

int main(void) {
    shared_dir();
    shared_require("fixtures/gemma4_text");
    for (int i = 0; i < N_FAM; i++) test_f32(i);
    for (int i = 0; i < N_FAM; i++) test_types(i);
    for (int i = 0; i < N_FAM; i++) check_layout(i);
    test_split_experts();
    test_refusals();
    test_quantize_refusals();
    for (int i = 0; i < N_FAM; i++) test_batch_invariance(i);
    for (int i = 1; i < N_FAM; i++) test_mutations(i);
    return test_done();
}
