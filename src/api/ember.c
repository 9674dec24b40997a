/*
 * ember.c - the public model handle: loading (config, weights, backend,
 * model, KV cache, run state, in that order) and freeing in reverse.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cpu.h"
#include "core/util.h"
#include "engine/engine.h"

void ember_model_params_init(ember_model_params *p) {
    memset(p, 0, sizeof *p);
    p->isa = EMBER_ISA_AUTO;
}

void ember_sampling_init(ember_sampling *s) {
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
}

void ember_model_free(ember_model *m) {
    if (!m) return;
    free(m->b_tok);
    free(m->b_pos);
    free(m->b_row);
    free(m->b_out);
    free(m->logits);
    ember_llm_state_free(m->st);
    ember_kv_free(m->kv);
    ember_llm_free(m->llm);
    if (!m->borrowed) {
        ember_backend_free(m->be);
        ember_weights_free(m->weights);
    }
    free(m);
}

/* Parses a device name: *cuda = -1 for "cpu" (or NULL / ""), N for "cuda"
   (N = 0) or "cuda:N". */
static int parse_device(const char *s, int *cuda, ember_error *err) {
    *cuda = -1;
    if (!s || !*s || !strcmp(s, "cpu")) return EMBER_OK;
    if (!strcmp(s, "cuda")) {
        *cuda = 0;
        return EMBER_OK;
    }
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long n = strtol(s + 5, &end, 10);
        if (!*end && n >= 0 && n < 1024) {
            *cuda = (int)n;
            return EMBER_OK;
        }
    }
    return ember_err(err, EMBER_ERR_INVALID_ARG, "unknown device '%s' (expected cpu, cuda or cuda:N)", s);
}

/* Creates m->be for p on the CPU or on GPU `cuda`. */
static int make_backend(ember_model *m, const ember_model_params *p, int cuda, ember_error *err) {
    if (cuda < 0) {
        ember_cpu_params cp = {p->n_threads, p->isa, p->use_mmap != 0, m->log};
        return ember_backend_cpu_new(&cp, &m->be, err);
    }
    ember_cuda_params cp = {cuda, m->log};
    return ember_backend_cuda_new(&cp, &m->be, err);
}

/* Bytes of the weights in path (the GGUF file, or the directory's
   *.safetensors files): what a GPU must hold. */
static size_t weight_file_bytes(const char *path, bool gguf) {
    struct stat st;
    if (gguf) return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
    size_t total = 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        char *f = ember_path_join(path, de->d_name);
        if (f && stat(f, &st) == 0) total += (size_t)st.st_size;
        free(f);
    }
    closedir(d);
    return total;
}

/* On a GPU: refuses a model whose weights (their files' size), KV cache
   (kv_bytes, ember_kv_pool_bytes of its plan) and run state (the config's
   ember_llm_state_bytes) do not fit the device's free memory, before any
   weight is uploaded; the error names each part and what is free. */
static int check_device_fit(ember_model *m, const char *path, bool gguf, size_t kv_bytes, size_t state_bytes,
                            ember_error *err) {
    size_t fr, total;
    if (strcmp(m->be->ops->name, "cuda")) return EMBER_OK;
    int rc = ember_cuda_mem_info(m->be, &fr, &total, err);
    if (rc) return rc;
    const size_t wb = weight_file_bytes(path, gguf);
    const double G = 1 << 30;
    if (wb > fr || kv_bytes > fr - wb || state_bytes > fr - wb - kv_bytes)
        return ember_err(err, EMBER_ERR_NOMEM,
                         "%s needs %.2f GiB on %s (weights %.2f GiB, KV cache %.2f GiB, run state %.2f GiB), which "
                         "has %.2f GiB free of %.2f GiB (a smaller --kv-budget, context or -P would shrink the KV cache)",
                         path, ((double)wb + (double)kv_bytes + (double)state_bytes) / G, m->device, (double)wb / G,
                         (double)kv_bytes / G, (double)state_bytes / G, (double)fr / G, (double)total / G);
    return EMBER_OK;
}

/* Refuses, before any weight is loaded, a KV kind the backend has no
   kernels for (kv_ok). */
static int check_kv_kind(const ember_model *m, const ember_model_params *p, ember_error *err) {
    ember_kv_type kt;
    int rc = ember_kv_type_parse(p->kv_type, p->kv_group_size, p->kv_quant_start, &kt, err);
    if (rc) return rc;
    bool (*kv_ok)(ember_kv_enc) = m->be->ops->kv_ok;
    if (kv_ok && (!kv_ok(kt.k_enc) || !kv_ok(kt.v_enc) || (kt.quant_start > 0 && !kv_ok(EMBER_KVE_F32))))
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "the %s KV cache is not supported on %s yet (f32, f16 and bf16 are)",
                         kt.name, m->device);
    return EMBER_OK;
}

/* Creates m->kv for params p (n_ctx lowered when it is the default and one
   row of it would not fit the budget). plan_bytes non-NULL: makes only the
   plan (ember_kv_new without a backend), sets *plan_bytes to the bytes its
   pools would take and p->n_ctx as the cache would lower it, and leaves
   m->kv NULL. */
static int make_kv(ember_model *m, ember_model_params *p, bool ctx_default, size_t *plan_bytes, ember_error *err) {
    ember_kv_type kt;
    int rc = ember_kv_type_parse(p->kv_type, p->kv_group_size, p->kv_quant_start, &kt, err);
    if (rc) return rc;
    const int L = m->cfg.n_layers;
    int *heads = ember_malloc((size_t)L * sizeof *heads), *dims = ember_malloc((size_t)L * sizeof *dims),
        *win = ember_malloc((size_t)L * sizeof *win);
    if (!heads || !dims || !win) {
        free(heads);
        free(dims);
        free(win);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    const int n_kv = ember_cfg_kv_layout(&m->cfg, heads, dims, win); /* per layer; KV-shared layers have none */
    ember_kv_params kp = {kt, n_kv, heads, dims, win, p->n_rows, p->n_ctx, p->kv_budget, -1, p->max_batch_tokens,
                          m->cfg.n_linear ? m->cfg.layer_linear : NULL, ember_llm_rec_shape(&m->cfg)};
    for (;;) {
        rc = ember_kv_new(plan_bytes ? NULL : m->be, &kp, &m->kv, err);
        if (rc) break;
        size_t need = ember_kv_request_bytes(m->kv, kp.n_ctx), cap = ember_kv_capacity_bytes(m->kv);
        if (need <= cap) {
            if (plan_bytes) {
                *plan_bytes = ember_kv_pool_bytes(m->kv);
                ember_kv_free(m->kv);
                m->kv = NULL;
            }
            break;
        }
        /* one row of the context does not fit the budget */
        size_t per = ember_kv_bytes_per_token(m->kv, false);
        ember_kv_free(m->kv);
        m->kv = NULL;
        int fit = per ? (int)((cap / per) & ~(size_t)15) - 32 : 0;
        if (!ctx_default || fit < 16) {
            rc = ember_err(err, EMBER_ERR_NOMEM,
                           "one row of %d positions needs %.2f GiB of KV cache, over the budget of %.2f GiB (a "
                           "shorter context or a smaller KV kind would fit)",
                           kp.n_ctx, (double)need / (1 << 30), (double)cap / (1 << 30));
            break;
        }
        /* said once: by the plan where there is one (the cache made after it needs no lowering) */
        ember_log(&m->log, EMBER_LOG_WARN, "context lowered from %d to %d positions to fit the KV budget", kp.n_ctx,
                  fit);
        kp.n_ctx = fit;
        p->n_ctx = fit;
    }
    free(heads);
    free(dims);
    free(win);
    return rc;
}

/* true when path is a regular file that starts with the GGUF magic. */
static bool is_gguf_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    char magic[4] = {0};
    bool ok = fread(magic, 1, 4, fp) == 4 && memcmp(magic, "GGUF", 4) == 0;
    fclose(fp);
    return ok;
}

/* ---- the model's fingerprint ------------------------------------------------------- */

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = 0;
        for (size_t k = 0; k < 8 && i + k < n; k++) v |= (uint64_t)p[i + k] << (8 * k);
        h = ember_mix64(h ^ v) + n;
    }
    return h;
}

/* Mixes file `name` in dir (dir NULL: name is the path) into h: its name,
   size, first 64 KiB and 1024 samples of 64 bytes spread over the rest. */
static uint64_t fingerprint_file(uint64_t h, const char *dir, const char *name) {
    char *path = dir ? ember_path_join(dir, name) : NULL;
    const char *p = dir ? path : name;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    h = hash_bytes(h, (const unsigned char *)base, strlen(base));
    int fd = p ? open(p, O_RDONLY) : -1;
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        size_t size = (size_t)st.st_size;
        h = ember_mix64(h ^ (uint64_t)size);
        static const size_t head = 65536;
        unsigned char *buf = ember_malloc(head);
        if (buf) {
            ssize_t k = pread(fd, buf, size < head ? size : head, 0);
            if (k > 0) h = hash_bytes(h, buf, (size_t)k);
            for (size_t i = 0; size > head && i < 1024; i++) {
                off_t at = (off_t)(head + (size - head) / 1024 * i);
                k = pread(fd, buf, 64, at);
                if (k > 0) h = hash_bytes(h, buf, (size_t)k);
            }
            free(buf);
        }
    }
    if (fd >= 0) close(fd);
    free(path);
    return h;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The fingerprint of a GGUF file or of a model directory's config,
   weights and tokenizer files (what a cached KV row depends on). */
static uint64_t model_fingerprint(const char *path, bool gguf) {
    uint64_t h = 0x656d6265726b7631ull;
    if (gguf) return fingerprint_file(h, NULL, path);
    DIR *d = opendir(path);
    if (!d) return h;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        bool want = !strcmp(nm, "config.json") || !strncmp(nm, "tokenizer", 9) ||
                    (l > 12 && !strcmp(nm + l - 12, ".safetensors"));
        if (!want) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char **g = ember_realloc(names, nc * sizeof *g);
            if (!g) break;
            names = g;
            cap = nc;
        }
        if (!(names[n] = ember_strdup(nm))) break;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = fingerprint_file(h, path, names[i]);
        free(names[i]);
    }
    free(names);
    return h;
}

int ember_model_load(const char *path, const ember_model_params *params, ember_model **out, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_model_load: out is NULL");
    *out = NULL;
    if (!path || !*path) return ember_err(err, EMBER_ERR_INVALID_ARG, "no model path given");
    struct stat st;
    if (stat(path, &st) != 0) return ember_err(err, EMBER_ERR_IO, "%s: no such file or directory", path);
    bool gguf = false;
    if (!S_ISDIR(st.st_mode)) {
        gguf = is_gguf_file(path);
        if (!gguf)
            return ember_err(err, EMBER_ERR_UNSUPPORTED,
                             "%s: not a model directory (config.json and *.safetensors) nor a GGUF file", path);
    } else {
        char *cfg_path = ember_path_join(path, "config.json");
        if (!cfg_path) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        bool has_cfg = stat(cfg_path, &st) == 0;
        free(cfg_path);
        if (!has_cfg)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: not a model directory: config.json not found", path);
    }
    ember_model_params p;
    if (params)
        p = *params;
    else
        ember_model_params_init(&p);
    if (p.n_rows < 0 || p.n_ctx < 0 || p.max_batch_tokens < 0 || p.n_threads < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "model parameters must not be negative");
    int cuda;
    int rc = parse_device(p.device, &cuda, err);
    if (rc) return rc;
    ember_model *m = ember_calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->log = (ember_logger){p.log, p.log_user};
    if (cuda < 0)
        snprintf(m->device, sizeof m->device, "cpu");
    else
        snprintf(m->device, sizeof m->device, "cuda:%d", cuda);
    /* the config first, then the parameters it settles, then the device's
       room for weights, KV cache and run state, and only then the weights */
    ember_gguf *gf = NULL;
    if (gguf) {
        ember_rope_mode mode;
        if ((rc = ember_gguf_open(path, &gf, err)) || (rc = ember_gguf_model_config(gf, &m->cfg, &mode, err))) goto fail;
    } else {
        if ((rc = ember_config_load(path, &m->cfg, err))) goto fail;
        if ((rc = ember_weights_open(path, &m->weights, err))) goto fail;
        if (m->cfg.text_of_multimodal && (rc = ember_weights_use_text_model(m->weights, err))) goto fail;
        if (m->cfg.dflash) m->weights->text_prefix = ""; /* a DFlash draft model's layers.* read as model.layers.* */
    }
    if ((rc = make_backend(m, &p, cuda, err)) || (rc = check_kv_kind(m, &p, err))) goto fail;
    if (p.n_rows <= 0) p.n_rows = 1;
    bool ctx_default = p.n_ctx <= 0;
    if (ctx_default) p.n_ctx = m->cfg.max_pos < 4096 ? m->cfg.max_pos : 4096;
    if (p.n_ctx > m->cfg.max_pos)
        ember_log(&m->log, EMBER_LOG_WARN, "context %d exceeds the model's max_position_embeddings %d", p.n_ctx,
                  m->cfg.max_pos);
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = 512;
    if (p.max_batch_tokens < p.n_rows) p.max_batch_tokens = p.n_rows;
    if (cuda < 0) {
        p.n_threads = ember_backend_cpu_threads(m->be);
        p.isa = ember_backend_cpu_isa(m->be);
    } else {
        size_t kv_bytes = 0;
        if ((rc = make_kv(m, &p, ctx_default, &kv_bytes, err)) ||
            (rc = check_device_fit(m, path, gguf, kv_bytes, ember_llm_state_bytes(&m->cfg, true, p.max_batch_tokens),
                                   err)))
            goto fail;
    }
    p.device = m->device;
    if (gguf) {
        rc = ember_llm_from_gguf(gf, m->be, &m->cfg, &m->llm, err); /* owns gf, also on failure */
        gf = NULL;
        if (rc) goto fail;
    } else if ((rc = ember_llm_load(&m->cfg, m->weights, m->be, &m->llm, err))) {
        goto fail;
    }
    if ((rc = make_kv(m, &p, ctx_default, NULL, err)) ||
        (rc = ember_llm_state_new(m->llm, p.max_batch_tokens, p.n_rows, &m->st, err)))
        goto fail;
    p.kv_type = ember_kv_get_type(m->kv)->name; /* owned by the cache */
    m->fingerprint = model_fingerprint(path, gguf);
    m->params = p;
    size_t B = (size_t)p.max_batch_tokens;
    m->b_tok = ember_malloc(B * sizeof(int32_t));
    m->b_pos = ember_malloc(B * sizeof(int32_t));
    m->b_row = ember_malloc(B * sizeof(int32_t));
    m->b_out = ember_malloc(B * sizeof(int32_t));
    if (!m->b_tok || !m->b_pos || !m->b_row || !m->b_out) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto fail;
    }
    char where[96];
    if (cuda < 0)
        snprintf(where, sizeof where, "%s x %d threads", ember_isa_name(p.isa), p.n_threads);
    else
        ember_backend_describe(m->be, where, sizeof where);
    ember_log(&m->log, EMBER_LOG_INFO, "loaded %s: %s, %d layers, hidden %d, vocab %d, %s weights, %s", path,
              m->cfg.model_type, m->cfg.n_layers, m->cfg.hidden_size, m->cfg.vocab_size, m->llm->weight_dtype, where);
    if (m->weights && m->cfg.n_linear && m->cfg.mtp_layers != 0 && ember_weights_find(m->weights, "mtp.fc.weight", NULL))
        ember_log(&m->log, EMBER_LOG_INFO, "the model carries an MTP head (mtp.*): --spec mtp drafts with it");
    *out = m;
    return EMBER_OK;
fail:
    ember_gguf_free(gf);
    ember_model_free(m);
    return rc;
}

void ember_model_get_info(const ember_model *m, ember_model_info *info) {
    memset(info, 0, sizeof *info);
    if (!m) return;
    const ember_model_config *c = &m->cfg;
    info->arch = c->model_type;
    info->vocab_size = c->vocab_size;
    info->n_layers = c->n_layers;
    info->hidden_size = c->hidden_size;
    info->n_heads = c->n_heads;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->max_position_embeddings = c->max_pos;
    info->n_ctx = m->params.n_ctx;
    info->n_rows = m->params.n_rows;
    info->n_eos = c->n_eos;
    for (int i = 0; i < c->n_eos && i < 8; i++) info->eos_ids[i] = c->eos_ids[i];
    info->bos_id = c->bos_id;
    info->weight_dtype = m->llm->weight_dtype;
    info->weight_bytes = m->llm->weight_bytes;
    info->isa = m->params.isa;
    info->n_threads = m->params.n_threads;
    ember_kv_describe(m->kv, info->kv_type, sizeof info->kv_type);
    info->kv_bytes_per_token = ember_kv_bytes_per_token(m->kv, false);
    info->kv_capacity = ember_kv_capacity_bytes(m->kv);
    ember_backend_describe(m->be, info->device, sizeof info->device);
    info->n_linear_layers = m->cfg.n_linear;
    info->state_bytes_per_row = ember_kv_state_bytes(m->kv);
}

int ember_model_mtp_new(ember_model *target, ember_model **out, ember_error *err) {
    *out = NULL;
    if (!target->weights)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "MTP heads load from a model directory's safetensors (a GGUF file's nextn blocks are not read)");
    ember_model_config hc;
    int rc = ember_mtp_config(&target->cfg, &hc, err);
    if (rc) return rc;
    if (!ember_weights_find(target->weights, "mtp.fc.weight", NULL))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the model has no MTP head (no mtp.* tensors in its safetensors)");
    ember_model *m = ember_calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->borrowed = true;
    m->log = target->log;
    m->cfg = hc;
    m->weights = target->weights;
    m->be = target->be;
    memcpy(m->device, target->device, sizeof m->device);
    ember_model_params p = target->params;
    p.kv_budget = 0; /* full rows of its own (one layer): the target's budget is the target's */
    p.device = m->device;
    if ((rc = ember_llm_load(&m->cfg, m->weights, m->be, &m->llm, err)) || (rc = ember_mtp_bind(m->llm, target->llm, err)) ||
        (rc = make_kv(m, &p, false, NULL, err)) || (rc = ember_llm_state_new(m->llm, p.max_batch_tokens, p.n_rows, &m->st, err))) {
        ember_model_free(m);
        return rc;
    }
    m->params = p;
    m->params.kv_type = ember_kv_get_type(m->kv)->name;
    m->fingerprint = target->fingerprint;
    *out = m;
    return EMBER_OK;
}
