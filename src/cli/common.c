/* common.c - helpers shared by the verbs. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "core/error.h"
#include "core/mapfile.h"
#include "formats/config.h"
#include "sample/gbnf.h"
#include "sample/grammar.h"
#include "template/load.h"
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
        if (v < 0) return cli_fail(verb, "--isa must be one of auto, scalar, avx2, avx512, amx; got '%s'", o->isa);
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
    ember_error err = {0};
    if (ember_chat_template_load(model, out, tools, &err)) return cli_fail(verb, "%s", err.msg);
    return 0;
}


int cli_spec_resolve(const char *verb, const cli_spec_opts *so, ember_engine_params *ep) {
    ep->spec = EMBER_SPEC_NONE;
    if (so->mode && !strcmp(so->mode, "ngram"))
        ep->spec = EMBER_SPEC_NGRAM;
    else if (so->mode && !strcmp(so->mode, "draft"))
        ep->spec = EMBER_SPEC_DRAFT;
    else if (so->mode && !strcmp(so->mode, "eagle3"))
        ep->spec = EMBER_SPEC_EAGLE3;
    else if (so->mode && !strcmp(so->mode, "dflash"))
        ep->spec = EMBER_SPEC_DFLASH;
    else if (so->mode && !strcmp(so->mode, "mtp"))
        ep->spec = EMBER_SPEC_MTP;
    else if (so->mode && strcmp(so->mode, "none") != 0)
        return cli_fail(verb, "--spec expects ngram, draft, eagle3, dflash, mtp or none, got '%s'", so->mode);
    if (ep->spec == EMBER_SPEC_NONE && (so->draft_max || so->draft_min))
        return cli_fail(verb, "--draft-max and --draft-min go with --spec ngram, draft, eagle3, dflash or mtp");
    const bool model = ep->spec == EMBER_SPEC_DRAFT || ep->spec == EMBER_SPEC_EAGLE3 || ep->spec == EMBER_SPEC_DFLASH;
    if (model && !so->draft_model) return cli_fail(verb, "--spec %s needs --draft-model PATH", so->mode);
    if (!model && so->draft_model) return cli_fail(verb, "--draft-model goes with --spec draft, eagle3 or dflash");
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
                   ember_spec_mode *spec, ember_model **out) {
    *out = NULL;
    ember_tokenizer *tt = NULL, *td = NULL;
    ember_error err = {0};
    int rc = 0;
    ember_model_config *dc = calloc(1, sizeof *dc); /* an EAGLE-3 directory? (its config says) */
    const bool cfg_ok = dc && ember_config_load(draft_path, dc, &err) == EMBER_OK;
    const bool eagle3 = cfg_ok && dc->eagle3, dflash = cfg_ok && dc->dflash;
    free(dc);
    if (eagle3 || dflash) { /* no tokenizer of its own: the engine checks vocab_size and hidden sizes */
        *spec = eagle3 ? EMBER_SPEC_EAGLE3 : EMBER_SPEC_DFLASH;
        return cli_load_model(verb, draft_path, o, out);
    }
    if (*spec == EMBER_SPEC_EAGLE3)
        return cli_fail(verb, "--spec eagle3: %s is not an EAGLE-3 draft model (its config.json names no Eagle3 "
                        "architecture nor draft_vocab_size)", draft_path);
    if (*spec == EMBER_SPEC_DFLASH)
        return cli_fail(verb, "--spec dflash: %s is not a DFlash draft model (its config.json names no DFlash "
                        "architecture nor dflash_config)", draft_path);
    err.msg[0] = '\0';
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

int cli_grammar_file(const char *verb, const char *path, char **text) {
    ember_error err = {0};
    size_t len = 0;
    *text = NULL;
    if (ember_read_file(path, GB_MAX_TEXT, text, &len, &err))
        return cli_fail(verb, "--grammar-file %s: %s", path, err.msg);
    char *t = *text; /* NUL-terminated */
    ember_grammar *g = ember_grammar_new();
    int rc = g ? ember_grammar_gbnf(g, t, len, &err) : ember_err(&err, EMBER_ERR_NOMEM, "out of memory");
    ember_grammar_free(g);
    if (rc) {
        free(*text);
        *text = NULL;
        return cli_fail(verb, "--grammar-file %s: %s", path, err.msg);
    }
    return 0;
}
