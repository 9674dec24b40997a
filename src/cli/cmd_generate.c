/*
 * cmd_generate.c - `ember generate`: a prompt in, generated tokens out.
 * With --ids the prompt is token ids and the output is token ids; with
 * --prompt the text goes through the model's chat template (unless --raw)
 * and tokenizer, and the output is the generated text.
 *
 * Plain generation runs ember_generate (one row, its own loop). With --spec
 * the request runs through the serving engine instead (one row), which owns
 * speculative decoding: the same tokens for greedy decoding, the same
 * distribution for sampling (docs/speculative.md). With --grammar-file the
 * request runs through the engine too, its tokens masked by the grammar
 * (the vocabulary built as `ember serve` builds it), steered to finish
 * within -n tokens.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "core/util.h"
#include "sample/gbudget.h"
#include "sample/grammar.h"
#include "serve/serve.h"
#include "template/chat.h"
#include "tok/tokenizer.h"

/* Text prompt -> ids: the chat template (user message, optional system)
   unless raw. Prints errors; returns 0 or 1. */
static int text_prompt(const char *model, const ember_tokenizer *tok, const char *prompt, const char *system, bool raw,
                       int32_t **ids, int *n_ids) {
    ember_error err = {0};
    char *text = NULL;
    size_t len = 0;
    unsigned flags = EMBER_TOK_ADD_SPECIAL;
    if (!raw) {
        ember_chat_template *tmpl = NULL;
        if (cli_load_template("generate", model, &tmpl)) return 1;
        if (!tmpl) return cli_fail("generate", "%s has no chat template: use --raw to send the text as it is", model);
        json_t *msgs = json_array();
        if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        ember_chat_input in = {.messages = msgs, .add_generation_prompt = true, .tok = tok};
        int rc = msgs ? ember_chat_render_input(tmpl, &in, &text, &len, &err)
                      : ember_err(&err, EMBER_ERR_NOMEM, "out of memory");
        json_decref(msgs);
        ember_chat_template_free(tmpl);
        if (rc) return cli_fail("generate", "chat template: %s", err.msg);
        prompt = text;
        flags = 0; /* the template wrote the special tokens itself */
    } else {
        len = strlen(prompt);
    }
    size_t n = 0;
    int rc = ember_tok_encode(tok, NULL, prompt, len, flags, ids, &n, &err);
    free(text);
    if (rc) return cli_fail("generate", "%s", err.msg);
    if (n == 0) return cli_fail("generate", "the prompt is empty after tokenization");
    *n_ids = (int)n;
    return 0;
}

/* Runs request r through an engine with parameters ep (one row of m):
   fills r->out_ids / r->n_out like ember_generate; with verbose, prints
   the speculation figures to stderr. gm (may be NULL): the grammar the
   tokens must follow and gv its vocabulary (both borrowed). */
static int generate_engine(ember_model *m, ember_request *r, const ember_engine_params *ep, bool verbose,
                           const ember_grammar *gm, const ember_gvocab *gv, ember_error *err) {
    r->n_out = 0;
    if (r->max_new_tokens == 0) return EMBER_OK;
    ember_model_info info;
    ember_model_get_info(m, &info);
    long need = (long)r->n_prompt + r->max_new_tokens - 1;
    if (need > info.n_ctx)
        return ember_err(err, EMBER_ERR_LIMIT,
                         "%d prompt tokens + %d new tokens need %ld positions, but the context holds %d", r->n_prompt,
                         r->max_new_tokens, need, info.n_ctx);
    ember_gbudget *gc = NULL;
    int rc = gm ? ember_gbudget_new(gm, gv, r->max_new_tokens, &gc, err) : EMBER_OK;
    if (rc) return rc;
    ember_engine *e;
    rc = ember_engine_new(m, ep, &e, err);
    if (rc) {
        ember_gbudget_free(gc);
        return rc;
    }
    ember_gen_params g;
    memset(&g, 0, sizeof g);
    g.prompt = r->prompt;
    g.n_prompt = r->n_prompt;
    g.max_tokens = r->max_new_tokens;
    g.sampling = r->sampling;
    g.ignore_eos = r->ignore_eos;
    g.no_prompt_cache = 1;
    if (gc) {
        g.constrain_mask = ember_gbudget_mask;
        g.constrain_accept = ember_gbudget_accept;
        g.constrain_user = gc; /* constrain_free NULL: freed here, after the engine */
    }
    double t0 = ember_now();
    ember_stream *s;
    rc = ember_engine_submit(e, &g, &s, err);
    bool submitted = rc == EMBER_OK;
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    while (!rc && ember_stream_next(s, &ev, -1) == 1) {
        if (ev.kind == EMBER_EV_DONE) break;
        if (r->n_out < r->max_new_tokens) r->out_ids[r->n_out++] = ev.token;
    }
    double secs = ember_now() - t0;
    if (!rc && ev.kind == EMBER_EV_DONE && ev.finish == EMBER_FINISH_ERROR)
        rc = ember_err(err, ev.error_code ? ev.error_code : EMBER_ERR_INTERNAL, "%s", ev.error);
    if (submitted) ember_stream_free(s);
    ember_engine_stats st;
    ember_engine_get_stats(e, &st);
    ember_engine_free(e);
    ember_gbudget_free(gc);
    if (!rc && verbose && ep->spec != EMBER_SPEC_NONE)
        fprintf(stderr,
                "ember: speculative decoding (%s): %llu drafted, %llu accepted (%.1f%%), %llu of %llu target forwards "
                "with drafts, %.2f tokens per target forward, %d tokens in %.3f s\n",
                ep->spec == EMBER_SPEC_NGRAM    ? "ngram"
                : ep->spec == EMBER_SPEC_DRAFT  ? "draft model"
                : ep->spec == EMBER_SPEC_EAGLE3 ? "EAGLE-3"
                : ep->spec == EMBER_SPEC_DFLASH ? "DFlash"
                : ep->spec == EMBER_SPEC_MTP    ? "MTP head"
                                                : "none", (unsigned long long)st.spec_drafted_total,
                (unsigned long long)st.spec_accepted_total,
                st.spec_drafted_total ? 100.0 * (double)st.spec_accepted_total / (double)st.spec_drafted_total : 0.0,
                (unsigned long long)st.spec_forwards_total, (unsigned long long)st.decode_forwards_total,
                st.decode_forwards_total ? (double)st.decode_tokens_total / (double)st.decode_forwards_total : 0.0,
                r->n_out, secs);
    return rc;
}

/* --grammar-file's grammar and vocabulary. */
typedef struct grammar_run {
    ember_grammar *g;
    ember_gvocab *v;
} grammar_run;

static void grammar_run_free(grammar_run *gr) {
    ember_gvocab_free(gr->v);
    ember_grammar_free(gr->g);
}

/* Compiles text and makes m's vocabulary (tok) for it. */
static int grammar_matcher(ember_model *m, const ember_tokenizer *tok, const char *text, grammar_run *gr,
                           ember_error *err) {
    ember_model_info info;
    ember_model_get_info(m, &info);
    gr->g = ember_grammar_new();
    if (!gr->g) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    int rc = ember_grammar_gbnf(gr->g, text, strlen(text), err);
    if (!rc) rc = ember_serve_gvocab_new(tok, info.vocab_size, info.eos_ids, info.n_eos, NULL, 0, &gr->v, err);
    return rc;
}

/* --grammar-file with --ids: the model's tokenizer, for the grammar's
   vocabulary. Prints the error; returns 0 or 1. */
static int grammar_tokenizer(const char *model, ember_tokenizer **out) {
    ember_error err = {0};
    if (ember_tok_load(model, out, &err))
        return cli_fail("generate", "--grammar-file needs the model's tokenizer: %s", err.msg);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *isa = NULL, *prompt = NULL, *system = NULL, *grammar_file = NULL;
    int n = 32, threads = 0, ctx = 0, top_k = 0;
    float temp = 0.8f, top_p = 1.0f, min_p = 0.0f;
    uint64_t seed = 0;
    bool ignore_eos = false, verbose = false, use_mmap = false, raw = false, print_ids = false;
    cli_model_opts mo = {0};
    cli_spec_opts spo = {0};
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "model directory (config.json + *.safetensors)", 0, 0, false},
        {"ids", 0, OPT_STR, &ids_s, "LIST", "prompt token ids, e.g. 1,2,3 (output: ids)", 0, 0, false},
        {"prompt", 'p', OPT_STR, &prompt, "TEXT", "prompt text, sent through the chat template (output: text)", 0, 0,
         false},
        {"system", 0, OPT_STR, &system, "TEXT", "a system message before the prompt", 0, 0, false},
        {"raw", 0, OPT_FLAG, &raw, NULL, "tokenize --prompt as it is, without the chat template", 0, 0, false},
        {"print-ids", 0, OPT_FLAG, &print_ids, NULL, "print token ids even for a text prompt", 0, 0, false},
        {"n", 'n', OPT_INT, &n, "N", "tokens to generate (default 32)", 0, 1 << 24, false},
        {"temp", 0, OPT_FLOAT, &temp, "T", "temperature; 0 = greedy (default 0.8)", 0, 100, false},
        {"top-k", 0, OPT_INT, &top_k, "K", "keep the K most likely tokens; 0 = off (default)", 0, 1 << 24, false},
        {"top-p", 0, OPT_FLOAT, &top_p, "P", "nucleus sampling mass in (0, 1]; 1 = off (default)", 1e-9, 1, false},
        {"min-p", 0, OPT_FLOAT, &min_p, "P", "drop tokens below P x the top probability; 0 = off", 0, 1, false},
        {"seed", 's', OPT_U64, &seed, "S", "random seed (default 0); same seed, same output", 0, 0, false},
        {"ignore-eos", 0, OPT_FLAG, &ignore_eos, NULL, "keep going past end-of-sequence tokens", 0, 0, false},
        {"grammar-file", 0, OPT_STR, &grammar_file, "FILE",
         "the output follows this GBNF grammar (llama.cpp's notation, start rule root), steered to finish within -n",
         0, 0, false},
        {"threads", 't', OPT_INT, &threads, "N", "worker threads (default: all cores)", 1, 1024, false},
        {"isa", 0, OPT_STR, &isa, "NAME", "kernels: auto, scalar, avx2, avx512, amx (default auto)", 0, 0, false},
        {"ctx", 'c', OPT_INT, &ctx, "N", "context length (default: min(model max, 4096))", 1, 1 << 24, false},
        {"mmap", 0, OPT_FLAG, &use_mmap, NULL, "compute from the mapped model files (less memory, slower)", 0, 0, false},
        {"verbose", 'v', OPT_FLAG, &verbose, NULL, "log loading details (and with --spec the drafted and accepted tokens) to stderr", 0, 0, false},
        CLI_KV_OPTS(mo),
        CLI_SPEC_OPTS(spo),
    };
    cli_cmd cmd = {"generate",
                   "Generate tokens after a prompt: ids in, ids out (one line, space-separated), or text in, text out.",
                   "--model DIR (--ids LIST | --prompt TEXT) [options]",
                   "Generation stops after -n tokens or at an end-of-sequence id (printed) unless --ignore-eos.\n"
                   "--spec ngram (or --spec draft|eagle3|dflash --draft-model PATH, or --spec mtp: the model's own MTP\n"
                   "head, Qwen3-Next / Qwen3.5 mtp.* weights) runs the request through the serving\n"
                   "engine with speculative decoding\n"
                   "(greedy output unchanged, sampling keeps its distribution; --verbose reports drafts).\n"
                   "--grammar-file FILE: the output follows a GBNF grammar (docs/tool-calls.md).",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("generate", "--model is required (see 'ember generate --help')");
    if (!ids_s == !prompt) return cli_fail("generate", "give exactly one of --ids and --prompt");
    if ((raw || system) && !prompt) return cli_fail("generate", "--raw and --system go with --prompt");
    if (raw && system) return cli_fail("generate", "--system needs the chat template (leave out --raw)");
    if (grammar_file && ignore_eos) return cli_fail("generate", "--grammar-file ends the output where the grammar does: leave out --ignore-eos");
    char *grammar = NULL;
    if (grammar_file && cli_grammar_file("generate", grammar_file, &grammar)) return 1;
    ember_engine_params ep = {0};
    if (cli_spec_resolve("generate", &spo, &ep)) return free(grammar), 1;
    int32_t *ids = NULL;
    int n_ids = 0;
    ember_tokenizer *tok = NULL;
    if (prompt) {
        ember_error terr = {0};
        if (ember_tok_load(model, &tok, &terr)) return free(grammar), cli_fail("generate", "%s", terr.msg);
        if (text_prompt(model, tok, prompt, system, raw, &ids, &n_ids)) {
            ember_tok_free(tok);
            free(grammar);
            return 1;
        }
    } else if (cli_parse_ids("generate", "ids", ids_s, &ids, &n_ids)) {
        free(grammar);
        return 1;
    }
    ember_tokenizer *gtok = tok; /* the grammar's vocabulary: the prompt's tokenizer, or loaded for it */
    if (grammar && !gtok && grammar_tokenizer(model, &gtok)) return free(ids), free(grammar), 1;
    ember_model *m;
    mo = (cli_model_opts){threads, ctx, 1, isa, verbose, use_mmap, 0, mo.kv_type, mo.kv_group, mo.kv_quant_start, false, mo.device};
    if (cli_load_model("generate", model, &mo, &m)) {
        free(ids);
        free(grammar);
        if (gtok != tok) ember_tok_free(gtok);
        ember_tok_free(tok);
        return 1;
    }
    ember_model *draft = NULL;
    if ((ep.spec == EMBER_SPEC_DRAFT || ep.spec == EMBER_SPEC_EAGLE3 || ep.spec == EMBER_SPEC_DFLASH) &&
        cli_load_draft("generate", spo.draft_model, model, &mo, &ep.spec, &draft)) {
        free(ids);
        free(grammar);
        if (gtok != tok) ember_tok_free(gtok);
        ember_tok_free(tok);
        ember_model_free(m);
        return 1;
    }
    ep.draft_model = draft;
    int32_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    ember_request r = {0};
    r.prompt = ids;
    r.n_prompt = n_ids;
    r.max_new_tokens = n;
    r.ignore_eos = ignore_eos;
    ember_sampling_init(&r.sampling);
    r.sampling.temperature = temp;
    r.sampling.top_k = top_k;
    r.sampling.top_p = top_p;
    r.sampling.min_p = min_p;
    r.sampling.seed = seed;
    r.out_ids = out;
    ember_error err = {0};
    grammar_run gr = {0};
    if (!out)
        rc = ember_err(&err, EMBER_ERR_NOMEM, "out of memory");
    else if (grammar && (rc = grammar_matcher(m, gtok, grammar, &gr, &err)) != EMBER_OK)
        ;
    else if (ep.spec != EMBER_SPEC_NONE || gr.g)
        rc = generate_engine(m, &r, &ep, verbose, gr.g, gr.v, &err);
    else
        rc = ember_generate(m, &r, 1, &err);
    grammar_run_free(&gr);
    free(grammar);
    if (gtok != tok) ember_tok_free(gtok);
    if (rc == EMBER_OK && tok && !print_ids) {
        char *text = NULL;
        size_t len = 0;
        int32_t nv = ember_tok_n_vocab(tok);
        int k = 0; /* ids the tokenizer lacks (model padding rows) print nothing */
        for (int i = 0; i < r.n_out; i++)
            if (out[i] < nv) out[k++] = out[i];
        if (ember_tok_decode(tok, out, (size_t)k, EMBER_TOK_SKIP_SPECIAL, &text, &len, &err) == EMBER_OK) {
            fwrite(text, 1, len, stdout);
            printf("\n");
        } else {
            rc = cli_fail("generate", "%s", err.msg);
        }
        free(text);
    } else if (rc == EMBER_OK) {
        for (int i = 0; i < r.n_out; i++) printf("%s%d", i ? " " : "", out[i]);
        printf("\n");
    } else {
        cli_fail("generate", "%s", out ? err.msg : "out of memory");
    }
    free(out);
    free(ids);
    ember_tok_free(tok);
    ember_model_free(m);
    ember_model_free(draft);
    return rc == EMBER_OK ? 0 : 1;
}
