/* common.c - helpers shared by the verbs. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "cli.h"
#include "core/mapfile.h"
#include "formats/gguf.h"
#include "template/chat.h"
#include "template/toolcall.h"
#include "tok/tokenizer.h"

static void log_stderr(void *user, ember_log_level level, const char *msg) {
    (void)user;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "ember: %s: %s\n", names[level & 3], msg);
}

static void log_stderr_warn(void *user, ember_log_level level, const char *msg) {
    if (level >= EMBER_LOG_WARN) log_stderr(user, level, msg);
}

int cli_load_model(const char *verb, const char *path, const cli_model_opts *o, ember_model **out) {
    ember_model_params p;
    ember_model_params_init(&p);
    p.n_threads = o->threads;
    p.n_ctx = o->ctx;
    p.n_rows = o->rows;
    p.use_mmap = o->use_mmap;
    p.kv_budget = o->kv_budget;
    p.kv_type = o->kv_type;
    p.kv_group_size = o->kv_group;
    p.kv_quant_start = o->kv_quant_start;
    p.device = o->device;
    if (o->isa) {
        int v = cli_isa_from_name(o->isa);
        if (v < 0) return cli_fail(verb, "--isa must be one of auto, scalar, avx2, avx512; got '%s'", o->isa);
        p.isa = (ember_isa)v;
    }
    if (o->verbose)
        p.log = log_stderr;
    else if (o->warnings)
        p.log = log_stderr_warn;
    ember_error err = {0};
    if (ember_model_load(path, &p, out, &err) != EMBER_OK) return cli_fail(verb, "%s", err.msg);
    return 0;
}

/* Reads the chat template: tokenizer_config.json, chat_template.jinja, or
   NULL when the model has none (chat requests are then refused). */
int cli_load_template(const char *verb, const char *model, ember_chat_template **out) {
    return cli_load_template_tools(verb, model, out, NULL);
}

int cli_load_template_tools(const char *verb, const char *model, ember_chat_template **out, int *tools) {
    *out = NULL;
    if (tools) *tools = EMBER_TOOLS_NONE;
    struct stat st;
    if (stat(model, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) { /* a GGUF file: tokenizer.chat_template */
        ember_gguf *g = NULL;
        ember_error gerr = {0};
        if (ember_gguf_open(model, &g, &gerr)) return 0; /* not ours to report: loading the model will */
        const char *src = NULL;
        size_t n = 0;
        int rc = 0;
        if (ember_gguf_find_kv(g, "tokenizer.chat_template") &&
            ember_gguf_get_str(g, "tokenizer.chat_template", &src, &n, &gerr) == EMBER_OK) {
            if (tools) *tools = (int)ember_tool_format_detect(src, n);
            if (ember_chat_template_compile(src, n, out, &gerr))
                rc = cli_fail(verb, "%s: chat template does not compile: %s", model, gerr.msg);
        }
        ember_gguf_free(g);
        return rc;
    }
    char p[4096], *text = NULL;
    size_t len = 0;
    ember_error err = {0};
    const char *src = NULL;
    json_t *cfg = NULL;
    snprintf(p, sizeof p, "%.4000s/chat_template.jinja", model);
    if (stat(p, &st) == 0 && !ember_read_file(p, 4 << 20, &text, &len, &err)) {
        src = text;
    } else {
        snprintf(p, sizeof p, "%.4000s/tokenizer_config.json", model);
        if (stat(p, &st) == 0 && !ember_read_file(p, 64 << 20, &text, &len, &err)) {
            cfg = json_loadb(text, len, 0, NULL);
            src = ember_chat_template_from_config(cfg, NULL);
            if (src) len = strlen(src);
        }
    }
    int rc = 0;
    if (src && tools) *tools = (int)ember_tool_format_detect(src, len);
    if (src && ember_chat_template_compile(src, len, out, &err))
        rc = cli_fail(verb, "%s: chat template does not compile: %s", p, err.msg);
    json_decref(cfg);
    free(text);
    return rc;
}


int cli_spec_resolve(const char *verb, const cli_spec_opts *so, ember_engine_params *ep) {
    ep->spec = EMBER_SPEC_NONE;
    if (so->mode && !strcmp(so->mode, "ngram"))
        ep->spec = EMBER_SPEC_NGRAM;
    else if (so->mode && !strcmp(so->mode, "draft"))
        ep->spec = EMBER_SPEC_DRAFT;
    else if (so->mode && strcmp(so->mode, "none") != 0)
        return cli_fail(verb, "--spec expects ngram, draft or none, got '%s'", so->mode);
    if (ep->spec == EMBER_SPEC_NONE && (so->draft_max || so->draft_min))
        return cli_fail(verb, "--draft-max and --draft-min go with --spec ngram or draft");
    if (ep->spec == EMBER_SPEC_DRAFT && !so->draft_model) return cli_fail(verb, "--spec draft needs --draft-model PATH");
    if (ep->spec != EMBER_SPEC_DRAFT && so->draft_model) return cli_fail(verb, "--draft-model goes with --spec draft");
    int dmax = so->draft_max ? so->draft_max : 8, dmin = so->draft_min ? so->draft_min : 1;
    if (dmin > dmax) return cli_fail(verb, "--draft-min %d is above --draft-max %d", dmin, dmax);
    ep->draft_max = dmax;
    ep->draft_min = dmin;
    return 0;
}

/* The first token id whose text differs between a and b (their common
   range), or -1; *diff_size: the vocabularies differ in size only. */
static int32_t first_vocab_diff(const ember_tokenizer *a, const ember_tokenizer *b, bool *diff_size) {
    int32_t na = ember_tok_n_vocab(a), nb = ember_tok_n_vocab(b), n = na < nb ? na : nb;
    for (int32_t id = 0; id < n; id++) {
        size_t la = 0, lb = 0;
        const char *ta = ember_tok_id_text(a, id, &la), *tb = ember_tok_id_text(b, id, &lb);
        if (!ta != !tb || la != lb || (ta && memcmp(ta, tb, la))) return id;
    }
    *diff_size = na != nb;
    return -1;
}

int cli_load_draft(const char *verb, const char *draft_path, const char *target_path, const cli_model_opts *o,
                   ember_model **out) {
    *out = NULL;
    ember_tokenizer *tt = NULL, *td = NULL;
    ember_error err = {0};
    int rc = 0;
    if (ember_tok_load(draft_path, &td, &err))
        rc = cli_fail(verb, "--draft-model %s: %s", draft_path, err.msg);
    else if (ember_tok_load(target_path, &tt, &err))
        rc = cli_fail(verb, "%s: %s (needed to check the draft model's vocabulary)", target_path, err.msg);
    if (!rc) {
        bool diff_size = false;
        int32_t id = first_vocab_diff(tt, td, &diff_size);
        size_t la = 0, lb = 0;
        const char *ta = id >= 0 ? ember_tok_id_text(tt, id, &la) : NULL, *tb = id >= 0 ? ember_tok_id_text(td, id, &lb) : NULL;
        if (id >= 0)
            rc = cli_fail(verb, "--draft-model %s: its vocabulary differs from the model's at token %d: '%.*s' against '%.*s'",
                          draft_path, (int)id, (int)(tb ? lb : 0), tb ? tb : "", (int)(ta ? la : 0), ta ? ta : "");
        else if (diff_size)
            rc = cli_fail(verb, "--draft-model %s: its vocabulary has %d tokens, the model's %d", draft_path,
                          (int)ember_tok_n_vocab(td), (int)ember_tok_n_vocab(tt));
    }
    ember_tok_free(tt);
    ember_tok_free(td);
    if (rc) return rc;
    return cli_load_model(verb, draft_path, o, out);
}
