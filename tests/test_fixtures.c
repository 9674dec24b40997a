/*
 * test_fixtures.c - parity with HuggingFace transformers on the fixture
 * models: for every fixture of a supported family (llama, qwen2, qwen3, qwen3_moe,
 * glm4_moe, mistral, phi3, gemma2, gemma3_text, and the hybrids qwen3_next,
 * qwen3_5_text, qwen3_5_moe_text) and every instruction set this CPU
 * has, the logits of every prompt position within 1e-4 x max|logit| (the
 * fixtures' recommended mark), the decode-step logits of p0, and the 24
 * greedy ids exactly; and the sliding-window families (mistral, gemma2,
 * gemma3_text) far past their window, rotating cache against one that keeps
 * every position; corrupt qwen3_moe models (expert count, a missing
 * expert tensor) refused naming the tensor; glm4_moe's MTP layers skipped.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, symlink */
#include <unistd.h>

#include "ember.h"
#include "engine/engine.h"
#include "fixture.h"
#include "kv/kv.h"

static const char *const k_families[] = {"llama",   "llama_bf16", "qwen2",      "qwen3",       "qwen3_moe",
                                         "glm4_moe", "mistral",   "phi3",       "gemma2",      "gemma3_text",
                                         "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};

/* Relative logit tolerance per KV kind (f32: the fixtures' 1e-4 mark). */
typedef struct kv_tol {
    const char *type;
    float tol;
} kv_tol;

/* What a device's fit check (ember_model_load) counts before the weights
   load, against what loading m made: the run state's buffers
   (ember_llm_state_bytes of the config) and the KV cache's pools (a plan
   from the config's layout, ember_cfg_kv_layout, with m's parameters). */
static void check_sizes(const ember_model *m, const char *family) {
    const ember_llm_state *st = m->st;
    const ember_tensor *ts[] = {&st->x,        &st->h,       &st->q,        &st->k,       &st->v,        &st->att,
                                &st->gate,     &st->up,      &st->sel,      &st->logits,  &st->moe_in,   &st->moe_x,
                                &st->moe_y,    &st->moe_gate, &st->moe_up,  &st->moe_logits, &st->qgate, &st->lin_x,
                                &st->lin_z,    &st->lin_b,   &st->lin_a,    &st->lin_o,   &st->ple_all,  &st->ple_one,
                                &st->ple_g,    &st->mlp_out, &st->ple_tok,  &st->e3_tin,  &st->e3_s,     &st->e3_c,
                                &st->e3_hid};
    size_t held = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->buf) held += ts[i]->nbytes;
    const size_t counted = ember_llm_state_bytes(&m->cfg, false, m->params.max_batch_tokens);
    CHECKF(counted == held, "%s: the run state holds %zu bytes, ember_llm_state_bytes says %zu", family, held, counted);
    int heads[EMBER_MAX_LAYERS], dims[EMBER_MAX_LAYERS], win[EMBER_MAX_LAYERS];
    const int n = ember_cfg_kv_layout(&m->cfg, heads, dims, win);
    for (int l = 0; l < n; l++)
        CHECKF(win[l] == m->llm->layers[l].window, "%s: layer %d's window %d in the config's layout, %d in the model",
               family, l, win[l], m->llm->layers[l].window);
    ember_kv_params kp = {*ember_kv_get_type(m->kv), n, heads, dims, win, m->params.n_rows, m->params.n_ctx,
                          m->params.kv_budget, -1, m->params.max_batch_tokens,
                          m->cfg.n_linear ? m->cfg.layer_linear : NULL, ember_llm_rec_shape(&m->cfg)};
    ember_kv *plan = NULL;
    ember_error err = {0};
    CHECKF(ember_kv_new(NULL, &kp, &plan, &err) == EMBER_OK, "%s: plan: %s", family, err.msg);
    if (plan) {
        CHECKF(ember_kv_pool_bytes(plan) == ember_kv_pool_bytes(m->kv) && ember_kv_pool_bytes(plan) > 0,
               "%s: the plan's KV pools %zu bytes, the cache's %zu", family, ember_kv_pool_bytes(plan),
               ember_kv_pool_bytes(m->kv));
        ember_kv_free(plan);
    }
}

static void run_family(const char *family, ember_isa isa, const kv_tol *kv) {
    fixture f;
    fixture_open(&f, family);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = 2;
    mp.kv_type = kv->type;
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(f.dir, &mp, &m, &err);
    CHECKF(rc == EMBER_OK, "%s: %s", family, err.msg);
    if (rc) {
        fixture_close(&f);
        return;
    }
    check_sizes(m, family);
    float *lg[3];
    int32_t ids[3][24];
    for (int i = 0; i < 3; i++) lg[i] = malloc((size_t)(f.p[i].n + 23) * (size_t)f.vocab * sizeof(float));
    float worst = 0;
    if (CHECKV(lg[0] && lg[1] && lg[2] && fx_generate3(m, &f, family, ids, lg), "%s/%s: the prompts do not run",
               family, kv->type))
        for (int i = 0; i < 3; i++) {
            const fixture_prompt *p = &f.p[i];
            /* f32 KV: identical greedy ids. A 16-bit KV may pick the other
               token only where the reference's top-2 margin is within its
               error; the logits are compared up to there. */
            const int agree = fx_agree(&f, i, ids[i]);
            const float ref_max = max_abs(p->logits, (size_t)p->n * (size_t)f.vocab);
            CHECKF(agree == 24 || (kv->tol > 1e-4f && p->margin[agree] <= 2 * kv->tol * ref_max),
                   "%s/%s/%s p%d: greedy ids differ from step %d (margin there %g)", family, ember_isa_name(isa),
                   kv->type, i, agree, agree < 24 ? p->margin[agree] : 0.0);
            if (agree < 24)
                fprintf(stderr, "note: %s/%s p%d: greedy ids part at step %d, where the reference margin is %g\n",
                        family, kv->type, i, agree, p->margin[agree]);
            const float e = fx_logit_err(&f, i, lg[i], agree);
            CHECKF(e <= kv->tol, "%s/%s/%s p%d: max|dlogit| relative %g", family, ember_isa_name(isa), kv->type, i, e);
            worst = fmaxf(worst, e);
        }
    for (int i = 0; i < 3; i++) free(lg[i]);
    fprintf(stderr, "%-10s %-6s %-5s worst relative logit error %.3g\n", family, ember_isa_name(isa), kv->type, worst);
    ember_model_free(m);
    fixture_close(&f);
}

/* A sliding-window family far past its window (16): the rotating cache
   gives the same tokens and logits as a cache that keeps every position
   (retain = the whole context). Mistral (the window on every layer): a row
   holds about window + retain positions however long it gets. Gemma
   (sliding and global layers interleaved): the sliding layers' group
   rotates while the global layers keep everything. */
static void long_run(const char *family) {
    const bool all_sliding = strcmp(family, "mistral") == 0;
    fixture f;
    fixture_open(&f, family);
    enum { NEW = 380 };
    int32_t out[2][NEW];
    float *lg[2];
    size_t held[2];
    for (int k = 0; k < 2; k++) {
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_threads = 2;
        mp.n_ctx = 512;
        mp.max_batch_tokens = 32;
        ember_model *m = fx_load_params(f.dir, &mp);
        if (!m) exit(1);
        if (k == 1) { /* the same cache, never giving a block back */
            ember_kv_free(m->kv);
            int heads[64], dims[64], win[64];
            for (int l = 0; l < m->cfg.n_layers; l++) {
                heads[l] = m->cfg.n_kv_heads;
                dims[l] = m->cfg.head_dim;
                win[l] = m->llm->layers[l].window;
            }
            ember_kv_type t;
            ember_error err = {0};
            ember_kv_type_parse("f32", 0, 0, &t, &err);
            ember_kv_params kp = {t, m->cfg.n_layers, heads, dims, win, 1, 512, 0, 1 << 20, 32,
                                  m->cfg.n_linear ? m->cfg.layer_linear : NULL, ember_llm_rec_shape(&m->cfg)};
            CHECK(ember_kv_new(m->be, &kp, &m->kv, &err) == EMBER_OK);
        }
        lg[k] = malloc(sizeof(float) * (size_t)(f.p[2].n + NEW) * (size_t)f.vocab);
        ember_request r = {0};
        r.prompt = f.p[2].ids;
        r.n_prompt = f.p[2].n;
        r.max_new_tokens = NEW;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = out[k];
        r.out_logits = lg[k];
        ember_error err = {0};
        CHECKF(ember_generate(m, &r, 1, &err) == EMBER_OK, "%s", err.msg);
        held[k] = ember_kv_row_bytes(m->kv, 0);
        if (k == 0 && !all_sliding) CHECK(!memcmp(out[0], f.p[2].greedy, sizeof(int32_t) * 24));
        if (k == 0 && all_sliding) { /* window 16 + retain 64 + one block of slack, out of 480 positions */
            size_t bound = (size_t)((16 + 64) / EMBER_KV_BLOCK + 2) * EMBER_KV_BLOCK * ember_kv_bytes_per_token(m->kv, false);
            CHECKF(held[0] <= bound, "mistral: a 480-position row holds %zu bytes of KV, over %zu", held[0], bound);
            CHECK(!memcmp(out[0], f.p[2].greedy, sizeof(int32_t) * 24)); /* the reference's first 24 */
        }
        ember_model_free(m);
    }
    CHECKF(!memcmp(out[0], out[1], sizeof out[0]), "%s: rotating and unrotated caches give other tokens", family);
    CHECKF(!memcmp(lg[0], lg[1], sizeof(float) * (size_t)(f.p[2].n + NEW - 1) * (size_t)f.vocab),
           "%s: rotating and unrotated caches give other logits", family);
    CHECK(held[1] > (all_sliding ? 4 : 1) * held[0]);
    fprintf(stderr, "%s 480 positions: rotating row %zu bytes, unrotated %zu\n", family, held[0], held[1]);
    free(lg[0]);
    free(lg[1]);
    fixture_close(&f);
}



/* Writes cfg and wts as a model directory in a temporary folder and checks
   that loading it is refused as EMBER_ERR_FORMAT with a one-line message
   holding want; the folder is removed afterwards. */
static void expect_refused(const char *cfg, size_t nc, const char *wts, size_t nw, const char *want) {
    char dir[] = "/tmp/ember_bad_XXXXXX", path[600];
    const bool made = mkdtemp(dir) != NULL;
    CHECK(made);
    if (!made) return;
    fx_put(dir, "config.json", cfg, nc);
    fx_put(dir, "model.safetensors", wts, nw);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    ember_model *m = NULL;
    ember_error err = {0};
    CHECK(ember_model_load(dir, &mp, &m, &err) == EMBER_ERR_FORMAT && !m);
    CHECKF(strstr(err.msg, want) && !strchr(err.msg, '\n'), "want \"%s\", got: %s", want, err.msg);
    ember_model_free(m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* Corrupt MoE models built from the qwen3_moe fixture in a temporary
   directory, each refused naming the tensor, never loaded: a config whose
   expert count disagrees with the router, and weights with one expert's
   up_proj renamed (the header edited in place, offsets unchanged). */
static void moe_refusals(void) {
    fixture f;
    fixture_open(&f, "qwen3_moe");
    char path[700];
    size_t nc = 0, nw = 0;
    snprintf(path, sizeof path, "%s/config.json", f.dir);
    char *cfg = fx_slurp(path, &nc);
    snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
    char *wts = fx_slurp(path, &nw);
    char *key = cfg ? strstr(cfg, "\"num_local_experts\": 4") : NULL;
    static const char up[] = "model.layers.1.mlp.experts.2.up_proj.weight";
    char *name = NULL;
    for (size_t i = 0; wts && !name && i + sizeof up < nw && i < 65536; i++)
        if (!memcmp(wts + i, up, sizeof up - 1)) name = wts + i;
    CHECKF(key && name, "qwen3_moe fixture: no \"num_local_experts\": 4 or no %s", up);
    static const char *const want[] = {
        "tensor 'model.layers.0.mlp.gate.weight' has shape [4, 64], expected [5, 64]",
        "missing tensor 'model.layers.1.mlp.experts.2.up_proj.weight'"};
    for (int c = 0; key && name && c < 2; c++) {
        key[sizeof "\"num_local_experts\": " - 1] = c == 0 ? '5' : '4';
        name[sizeof up - 3] = c == 1 ? 'X' : 'h'; /* ...weigXt */
        expect_refused(cfg, nc, wts, nw, want[c]);
    }
    free(cfg);
    free(wts);
    fixture_close(&f);
}

/* A hybrid model missing a DeltaNet tensor (qwen3_5_text's A_log renamed,
   qwen3_next's fused in_proj_ba renamed) or with a misshapen convolution
   (linear_conv_kernel_dim changed) is refused naming the tensor. */
static void hybrid_refusals(void) {
    static const struct {
        const char *family, *tensor, *cfg_key, *cfg_new, *want;
    } cases[] = {
        {"qwen3_5_text", "model.layers.1.linear_attn.A_log", NULL, NULL,
         "missing tensor 'model.layers.1.linear_attn.A_log'"},
        {"qwen3_next", "model.layers.2.linear_attn.in_proj_ba.weight", NULL, NULL,
         "missing tensor 'model.layers.2.linear_attn.in_proj_ba.weight'"},
        {"qwen3_5_moe_text", NULL, "\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 3",
         "tensor 'model.layers.0.linear_attn.conv1d.weight' has shape [128, 1, 4], expected [128, 1, 3]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_open(&f, cases[c].family);
        char path[700];
        size_t nc = 0, nw = 0;
        snprintf(path, sizeof path, "%s/config.json", f.dir);
        char *cfg = fx_slurp(path, &nc);
        snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
        char *wts = fx_slurp(path, &nw);
        bool ok = cfg && wts;
        if (ok && cases[c].tensor) { /* rename the tensor in the header: its last letter */
            char *name = NULL;
            size_t n = strlen(cases[c].tensor);
            for (size_t i = 0; !name && i + n < nw && i < 65536; i++)
                if (!memcmp(wts + i, cases[c].tensor, n) && wts[i + n] == '"') name = wts + i;
            ok = name != NULL;
            if (ok) name[n - 1] = name[n - 1] == 'X' ? 'Y' : 'X';
        }
        if (ok && cases[c].cfg_key) {
            char *k = strstr(cfg, cases[c].cfg_key);
            ok = k && strlen(cases[c].cfg_key) == strlen(cases[c].cfg_new);
            if (ok) memcpy(k, cases[c].cfg_new, strlen(cases[c].cfg_new));
        }
        CHECKF(ok, "%s fixture: cannot make the corrupt copy", cases[c].family);
        if (ok) expect_refused(cfg, nc, wts, nw, cases[c].want);
        free(cfg);
        free(wts);
        fixture_close(&f);
    }
}

/* A multimodal checkpoint built from a fixture: the fixture's config as
   text_config under the wrapper's model_type (with eos at the top level
   only), its tensors renamed into the wrapper's layout, and vision tensors
   beside them. Loads as the text model and gives the fixture's logits bit
   for bit; without its text tensors it is refused naming them. */
typedef struct st_copy {
    const ember_st_tensor **t; /* [n] the source of each output (NULL: a vision tensor, zeros) */
} st_copy;

static int st_copy_fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const st_copy *c = user;
    const ember_st_tensor *t = c->t[index]; /* the fixtures are f32: 4 bytes an element */
    if (t)
        memcpy(dst, t->data + first * 4, n * 4);
    else
        memset(dst, 0, n * 4);
    return 0;
}

static void multimodal_one(const char *family, const char *wrapper, const char *text_prefix, const char *head_prefix,
                           bool drop_text) {
    fixture f;
    fixture_open(&f, family);
    char path[700];
    size_t nc = 0;
    snprintf(path, sizeof path, "%s/config.json", f.dir);
    char *cfg = fx_slurp(path, &nc);
    snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
    ember_st_file *sf = NULL;
    ember_error err = {0};
    CHECKF(cfg && ember_st_open(path, &sf, &err) == EMBER_OK, "%s: %s", family, err.msg);
    if (!cfg || !sf) {
        free(cfg);
        fixture_close(&f);
        return;
    }
    /* config: {"model_type": wrapper, "eos_token_id": 2, "text_config": <fixture config>, "vision_config": {...}} */
    size_t cap = nc + 512;
    char *wcfg = malloc(cap);
    int wn = snprintf(wcfg, cap,
                      "{\"model_type\": \"%s\", \"architectures\": [\"X\"], \"vision_config\": {\"hidden_size\": 8},"
                      " \"text_config\": %s}",
                      wrapper, cfg);
    /* tensors: renamed, plus two vision ones */
    int n = sf->n_tensors + 2;
    ember_st_out *outs = calloc((size_t)n, sizeof *outs);
    const ember_st_tensor **src = calloc((size_t)n, sizeof *src);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    int k = 0;
    for (int i = 0; i < sf->n_tensors; i++) {
        const ember_st_tensor *t = &sf->tensors[i];
        if (strncmp(t->name, "model.", 6) == 0) {
            if (drop_text) continue;
            snprintf(names[k], sizeof names[k], "%s%s", text_prefix, t->name + 6);
        } else if (strncmp(t->name, "lm_head.", 8) == 0) {
            snprintf(names[k], sizeof names[k], "%s%s", head_prefix, t->name + 8);
        } else {
            snprintf(names[k], sizeof names[k], "%s", t->name);
        }
        outs[k] = (ember_st_out){names[k], t->dtype, t->ndim, {0}};
        memcpy(outs[k].shape, t->shape, sizeof outs[k].shape);
        src[k++] = t;
    }
    snprintf(names[k], sizeof names[k], "model.visual.patch_embed.proj.weight");
    outs[k] = (ember_st_out){names[k], EMBER_F32, 2, {8, 12}};
    src[k++] = NULL;
    snprintf(names[k], sizeof names[k], "model.multi_modal_projector.linear.weight");
    outs[k] = (ember_st_out){names[k], EMBER_F32, 2, {64, 8}};
    src[k++] = NULL;
    char dir[] = "/tmp/ember_mm_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    fx_put(dir, "config.json", wcfg, (size_t)wn);
    st_copy cp = {src};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECKF(ember_st_write(path, outs, k, st_copy_fill, &cp, &err) == EMBER_OK, "%s", err.msg);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 2;
    ember_model *m = NULL;
    int rc = ember_model_load(dir, &mp, &m, &err);
    if (drop_text) {
        CHECKF(rc == EMBER_ERR_FORMAT && strstr(err.msg, "language_model") && !strchr(err.msg, '\n'),
               "%s in %s without text tensors: %s", family, wrapper, err.msg);
    } else {
        CHECKF(rc == EMBER_OK, "%s in %s: %s", family, wrapper, err.msg);
        fixture_prompt *p = &f.p[1];
        const int V = f.vocab;
        float *lg = malloc((size_t)(p->n + 3) * (size_t)V * sizeof *lg);
        int32_t out[4];
        ember_request r = {0};
        r.prompt = p->ids;
        r.n_prompt = p->n;
        r.max_new_tokens = 4;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = out;
        r.out_logits = lg;
        if (m) CHECKF(ember_generate(m, &r, 1, &err) == EMBER_OK, "%s", err.msg);
        float mx = max_abs(p->logits, (size_t)p->n * (size_t)V), d = 0;
        for (size_t i = 0; m && i < (size_t)p->n * (size_t)V; i++) d = fmaxf(d, fabsf(lg[i] - p->logits[i]));
        CHECKF(m && d <= 1e-4f * mx && !memcmp(out, p->greedy, sizeof out), "%s in %s: logits off by %g", family,
               wrapper, d);
        free(lg);
    }
    ember_model_free(m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    free(names);
    free(src);
    free(outs);
    free(wcfg);
    ember_st_free(sf);
    free(cfg);
    fixture_close(&f);
}

static void multimodal(void) {
    multimodal_one("qwen3_5_text", "qwen3_5", "model.language_model.", "lm_head.", false);
    multimodal_one("qwen3_5_moe_text", "qwen3_5_moe", "model.language_model.", "lm_head.", false);
    multimodal_one("gemma3_text", "gemma3", "language_model.model.", "language_model.lm_head.", false); /* the older layout */
    multimodal_one("gemma3_text", "gemma3", "model.language_model.", "lm_head.", false);
    multimodal_one("qwen3_5_text", "qwen3_5", "model.language_model.", "lm_head.", true); /* no text tensors */
}

/* glm4_moe's MTP layers (num_nextn_predict_layers, numbered after the
   decoder layers) are skipped at load, as transformers does: the fixture
   read as a 1-layer model whose layer 1 is the MTP layer loads, and
   refuses that layer's tensors once num_nextn_predict_layers is 0. */
static void glm_mtp_layers(void) {
    fixture f;
    fixture_open(&f, "glm4_moe");
    char path[700];
    size_t nc = 0;
    snprintf(path, sizeof path, "%s/config.json", f.dir);
    char *cfg = fx_slurp(path, &nc);
    char *layers = cfg ? strstr(cfg, "\"num_hidden_layers\": 2") : NULL;
    char *mtp = cfg ? strstr(cfg, "\"num_nextn_predict_layers\": 1") : NULL;
    CHECKF(layers && mtp, "%s: unexpected config", path);
    for (int c = 0; layers && mtp && c < 2; c++) {
        char dir[] = "/tmp/ember_mtp_XXXXXX";
        CHECK(mkdtemp(dir) != NULL);
        layers[sizeof "\"num_hidden_layers\": " - 1] = '1';
        mtp[sizeof "\"num_nextn_predict_layers\": " - 1] = c == 0 ? '1' : '0';
        fx_put(dir, "config.json", cfg, nc);
        char w[700];
        snprintf(w, sizeof w, "%s/model.safetensors", f.dir);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(symlink(w, path) == 0);
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_threads = 1;
        ember_model *m = NULL;
        ember_error err = {0};
        int rc = ember_model_load(dir, &mp, &m, &err);
        if (c == 0) CHECKF(rc == EMBER_OK && m && m->cfg.n_layers == 1, "%s", err.msg);
        if (c == 1)
            CHECKF(rc == EMBER_ERR_FORMAT && strstr(err.msg, "'model.layers.1.") && strstr(err.msg, "not part of"),
                   "%s", err.msg);
        ember_model_free(m);
        unlink(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
    }
    free(cfg);
    fixture_close(&f);
}

int main(int argc, char **argv) {
    shared_dir();
    if (argc > 1) { /* one family, f32 KV, every ISA (for working on it) */
        static const kv_tol f32 = {"f32", 1e-4f};
        for (ember_isa i = EMBER_ISA_SCALAR; i <= ember_isa_detect(); i++) run_family(argv[1], i, &f32);
        return test_done();
    }
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        ember_model_params mp;
        ember_model_params_init(&mp);
        if (isas[i] > ember_isa_detect()) {
            fprintf(stderr, "note: %s not supported by this CPU, not tested here\n", ember_isa_name(isas[i]));
            continue;
        }
        static const kv_tol f32 = {"f32", 1e-4f};
        for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) run_family(k_families[k], isas[i], &f32);
    }
    moe_refusals();
    hybrid_refusals();
    multimodal();
    glm_mtp_layers();
    long_run("mistral");
    long_run("gemma2");
    long_run("gemma3_text");
    /* the 16-bit dense KV kinds, on the best ISA */
    static const kv_tol half[] = {{"f16", 1e-3f}, {"bf16", 1e-2f}};
    for (size_t h = 0; h < 2; h++)
        for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++)
            run_family(k_families[k], ember_isa_detect(), &half[h]);
    return test_done();
}
