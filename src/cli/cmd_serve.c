/*
 * cmd_serve.c - `ember serve [MODEL]`: the OpenAI / Anthropic compatible
 * server (src/serve) over one model.
 *
 * MODEL is a model directory, a GGUF file, or a name in the local
 * HuggingFace cache (org/name). With none given, the first supported model
 * found in that cache is served; with none there either, a small demo model
 * with random weights is written to ~/.cache/ember/demo and served, labelled
 * as such, so the server runs on a fresh offline machine.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread and taken by the
 * main thread with sigwait; the server then drains (new requests get 503)
 * for up to --drain seconds, cancels what is left and exits 0.
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/hfcache.h"
#include "args.h"
#include "cli.h"
#include "formats/config.h"
#include "core/mapfile.h"
#include "core/util.h"
#include "serve/serve.h"
#include "template/load.h"

/* out = a + b; false (and an empty out) when it does not fit. */
static bool pcat(char *out, size_t n, const char *a, const char *b) {
    int k = snprintf(out, n, "%s%s", a, b);
    if (k < 0 || (size_t)k >= n) {
        out[0] = 0;
        return false;
    }
    return true;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}
static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Whether dir holds a tokenizer and a config.json ember reads (a model type
   it runs, or the text model of a multimodal checkpoint). */
static bool servable(const char *dir) {
    char p[4096], *text = NULL;
    size_t len = 0;
    if (!pcat(p, sizeof p, dir, "/tokenizer.json") || !is_file(p)) return false;
    if (!pcat(p, sizeof p, dir, "/config.json") || ember_read_file(p, 1 << 20, &text, &len, NULL)) return false;
    ember_model_config *cfg = malloc(sizeof *cfg);
    bool ok = cfg && ember_config_parse(p, text, len, cfg, NULL) == EMBER_OK;
    free(cfg);
    free(text);
    return ok;
}

/* Resolves MODEL (see the file comment) into out; *demo when none was found. */
static int resolve_model(const char *arg, char *out, size_t n, char *id, size_t idn, bool *demo) {
    *demo = false;
    char hub[2048];
    ember_hf_hub_dir(hub, sizeof hub);
    if (arg) {
        if (is_dir(arg) || is_file(arg)) {
            snprintf(out, n, "%s", arg);
            const char *b = ember_basename(arg);
            snprintf(id, idn, "%s", *b ? b : arg);
            return 0;
        }
        if (ember_hf_resolve(arg, out, n)) {
            snprintf(id, idn, "%s", arg);
            return 0;
        }
        return cli_fail("serve", "model '%s' is not a directory, a file, or a model in the HuggingFace cache (%s)", arg,
                        hub);
    }
    DIR *d = opendir(hub);
    if (d) {
        struct dirent *de;
        char best[256] = "";
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, "models--", 8) != 0) continue;
            char repo[4096], snap[4096], sub[300];
            snprintf(sub, sizeof sub, "/%.255s", de->d_name);
            if (!pcat(repo, sizeof repo, hub, sub)) continue;
            if (ember_hf_snapshot(repo, snap, sizeof snap) && servable(snap) && (!best[0] || strcmp(de->d_name, best) < 0)) {
                snprintf(best, sizeof best, "%s", de->d_name);
                snprintf(out, n, "%s", snap);
            }
        }
        closedir(d);
        if (best[0]) { /* models--org--name -> org/name */
            char *nm = best + 8, *sep = strstr(nm, "--");
            if (sep) {
                *sep = '/';
                memmove(sep + 1, sep + 2, strlen(sep + 2) + 1);
            }
            snprintf(id, idn, "%s", nm);
            return 0;
        }
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(out, n, "%s/ember/demo", xdg);
    else
        snprintf(out, n, "%s/.cache/ember/demo", home ? home : ".");
    snprintf(id, idn, "ember-demo-random");
    *demo = true;
    return 0;
}

static size_t parse_size(const char *s, bool *ok) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    *ok = end != s && !*end && !errno && v > 0 && v * mul < 1e18;
    return *ok ? (size_t)(v * mul) : 0;
}

static void log_stderr(void *user, ember_log_level level, const char *msg) {
    int min = *(int *)user;
    if ((int)level < min) return;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "ember: %s: %s\n", names[level & 3], msg);
}

/* The size options (--kv-budget, --max-body, --prompt-cache-max, each kept
   at its default when NULL) into the out values; --prompt-cache-max needs
   pc_dir. Returns 0, or 1 after printing which value is refused. */
static int parse_sizes(const char *kv_budget_s, const char *max_body_s, const char *pc_max_s, const char *pc_dir,
                       size_t *kv_budget, size_t *max_body, size_t *pc_max) {
    bool ok = true;
    if (kv_budget_s && !(*kv_budget = parse_size(kv_budget_s, &ok)))
        return cli_fail("serve", "--kv-budget expects a size such as 512M or 4G, got '%s'", kv_budget_s);
    if (max_body_s && !(*max_body = parse_size(max_body_s, &ok)))
        return cli_fail("serve", "--max-body expects a size such as 64K or 4M, got '%s'", max_body_s);
    if (pc_max_s && !(*pc_max = parse_size(pc_max_s, &ok)))
        return cli_fail("serve", "--prompt-cache-max expects a size such as 512M or 4G, got '%s'", pc_max_s);
    if (pc_max_s && !pc_dir) return cli_fail("serve", "--prompt-cache-max needs --prompt-cache-dir");
    return 0;
}

/* --prefill-pace: "off" (-1: no cap) or a number from 1 to 1000 into *pace.
   Returns 0, or 1 after printing why the value is refused. */
static int parse_pace(const char *s, float *pace) {
    if (!strcmp(s, "off")) {
        *pace = -1.0f;
        return 0;
    }
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 1.0 && v <= 1000.0))
        return cli_fail("serve", "--prefill-pace wants a number from 1 to 1000 or off; got '%s'", s);
    *pace = (float)v;
    return 0;
}

/* The default KV budget: half the physical memory (4 GiB when unknown). */
static size_t half_the_ram(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 2 : (size_t)4 << 30;
}

/* Blocks SIGINT and SIGTERM (into *sigs, for stop_on_signal's sigwait) in
   the calling thread and those it starts later, and ignores SIGPIPE. */
static void block_stop_signals(sigset_t *sigs) {
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Writes the demo model (random weights) to path unless one is there.
   Returns 0, or 1 when mkmodel failed (it printed why). */
static int write_demo_model(char *path) {
    char cfgp[4200];
    if (pcat(cfgp, sizeof cfgp, path, "/tokenizer_config.json") && is_file(cfgp)) return 0;
    fprintf(stderr, "ember: no model given and none found in the HuggingFace cache: writing a demo model with "
                    "random weights to %s\n", path);
    char *args[] = {"mkmodel", "--preset", "demo", "--out", path, NULL};
    return cmd_mkmodel(5, args) ? 1 : 0;
}

/* Waits for SIGINT or SIGTERM (blocked in sigs), then stops the server,
   giving running requests up to drain seconds. */
static void stop_on_signal(ember_server *srv, const sigset_t *sigs, float drain) {
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "ember: %s: finishing running requests (up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            (double)drain);
    ember_server_stop(srv, drain);
}

/* What loads beside the model: the tokenizer and the chat template of the
   model at path. Errors are kept for the main thread to print. */
typedef struct side_load {
    const char *path;
    ember_tokenizer *tok;
    ember_chat_template *tmpl;
    int detected; /* the tool-call format the template suggests */
    int tok_rc, tmpl_rc;
    ember_error tok_err, tmpl_err;
    double tok_s, tmpl_s; /* how long each took */
} side_load;

/* Loads the tokenizer, then (when that worked) the chat template; a
   pthread start routine, also called directly. */
static void *side_load_run(void *arg) {
    side_load *s = arg;
    double t0 = ember_now();
    s->detected = EMBER_TOOLS_NONE;
    s->tok_rc = ember_tok_load(s->path, &s->tok, &s->tok_err);
    double t1 = ember_now();
    s->tok_s = t1 - t0;
    if (s->tok_rc) return NULL;
    s->tmpl_rc = ember_chat_template_load(s->path, &s->tmpl, &s->detected, &s->tmpl_err);
    s->tmpl_s = ember_now() - t1;
    return NULL;
}

/* serve's command line. */
typedef struct serve_args {
    const char *model_arg, *host, *isa, *kv_budget_s, *max_body_s, *pc_dir, *pc_max_s, *tool_parser, *pace_s, *grammar_file;
    int prefill_chunk, port, parallel, ctx, threads, max_queue, default_max;
    float drain;
    bool verbose, use_mmap, test_output;
    cli_model_opts mo;
    cli_spec_opts spo;
} serve_args;

/* Parses argv into *a: 0, 1 on an error (said), 2 after --help. */
static int serve_parse(int argc, char **argv, serve_args *a) {
    *a = (serve_args){.host = "127.0.0.1", .tool_parser = "auto", .port = 8080, .parallel = 8, .max_queue = 256,
                      .drain = 10.0f};
    a->mo.kv_type = "f16"; /* serve's default: see the README */
    cli_opt opts[] = {
        {"host", 0, OPT_STR, &a->host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)", 0, 0, false},
        {"port", 'p', OPT_INT, &a->port, "N", "port (default 8080)", 1, 65535, false},
        {"parallel", 'P', OPT_INT, &a->parallel, "N", "requests generated at once: rows of the batch (default 8)", 1, 1024,
         false},
        {"ctx", 'c', OPT_INT, &a->ctx, "N", "context per request (default: min(model max, 4096))", 16, 1 << 22, false},
        {"kv-budget", 0, OPT_STR, &a->kv_budget_s, "SIZE", "KV cache memory limit, e.g. 2G (default: half the RAM)", 0, 0,
         false},
        {"max-queue", 0, OPT_INT, &a->max_queue, "N", "requests waiting for a row before 429 (default 256)", 1, 1 << 20,
         false},
        {"max-body", 0, OPT_STR, &a->max_body_s, "SIZE", "request body limit (default 4M); larger bodies get 413", 0, 0,
         false},
        {"default-max-tokens", 0, OPT_INT, &a->default_max, "N", "max_tokens when a request names none (default: the rest of the context)", 1,
         1 << 22, false},
        {"prompt-cache-dir", 0, OPT_STR, &a->pc_dir, "DIR",
         "also keep prompt prefixes as files in DIR (created if missing): a restarted server resumes them", 0, 0,
         false},
        {"prompt-cache-max", 0, OPT_STR, &a->pc_max_s, "SIZE", "byte cap of --prompt-cache-dir (default 4G)", 0, 0, false},
        {"prefill-chunk", 0, OPT_INT, &a->prefill_chunk, "N", "prompt tokens per step at most (default 512)", 1,
         1 << 20, false},
        {"prefill-pace", 0, OPT_STR, &a->pace_s, "X|off",
         "while requests decode, cap a step's prompt tokens so it takes about X times a decoding step "
         "(X >= 1, default 1.5; off: no cap)", 0, 0, false},
        {"drain", 0, OPT_FLOAT, &a->drain, "SECONDS", "on SIGINT/SIGTERM, time running requests get to finish (default 10)", 0,
         3600, false},
        {"threads", 't', OPT_INT, &a->threads, "N", "compute threads (default: all cores)", 1, 1024, false},
        {"isa", 0, OPT_STR, &a->isa, "NAME", "kernels: auto, scalar, avx2, avx512, amx", 0, 0, false},
        {"mmap", 0, OPT_FLAG, &a->use_mmap, NULL, "compute from the mapped model files (less memory, slower)", 0, 0, false},
        {"verbose", 'v', OPT_FLAG, &a->verbose, NULL, "log more (HTTP details) to stderr", 0, 0, false},
        {"tool-parser", 0, OPT_STR, &a->tool_parser, "NAME",
         "how the model writes tool calls: auto (from the chat template), none, hermes, qwen3_coder, llama3_json, "
         "mistral, gemma4 (default auto)",
         0, 0, false},
        {"grammar-file", 0, OPT_STR, &a->grammar_file, "FILE",
         "a GBNF grammar (llama.cpp's notation, start rule root) every request without a constraint of its own "
         "follows (a request's grammar, guided_regex, response_format json or enforced tool_choice replaces it)",
         0, 0, false},
        {"test-output", 0, OPT_FLAG, &a->test_output, NULL,
         "TESTS ONLY: accept \"ember_test_output\" in requests, a scripted completion replacing the sampled tokens",
         0, 0, false},
        CLI_KV_OPTS(a->mo),
        CLI_SPEC_OPTS(a->spo),
    };
    cli_cmd cmd = {"serve", "Serve a model over an OpenAI- and Anthropic-compatible HTTP API.", "[MODEL] [options]",
                   "MODEL: a model directory, a GGUF file, or org/name from the HuggingFace cache\n"
                   "($HF_HOME/hub or ~/.cache/huggingface/hub). Without MODEL the first supported model\n"
                   "in that cache is served, else a demo model with random weights (~/.cache/ember/demo).\n"
                   "Endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /tokenize,\n"
                   "/detokenize; GET /v1/models, /health, /metrics.\n"
                   "KV cache: f16 unless --kv-type says otherwise; rows take blocks of 16 positions\n"
                   "as they grow, from a pool of --kv-budget bytes shared by all requests.\n"
                   "--spec ngram: each request drafts tokens from its own prompt and output and verifies\n"
                   "them in one forward (same greedy output; a request opts out with \"speculative\": false);\n"
                   "--spec draft --draft-model PATH: a smaller model with the same vocabulary drafts them;\n"
                   "--spec eagle3|dflash --draft-model PATH: an EAGLE-3 / DFlash draft model drafts from this\n"
                   "model's hidden states; --spec mtp: the model's own MTP head (Qwen3-Next / Qwen3.5 mtp.*) does.\n"
                   "Tool calls (OpenAI tools / Anthropic tools): rendered through the chat template, parsed\n"
                   "out of the output in the format --tool-parser names; tool_choice required / named is\n"
                   "enforced with constrained decoding where the format allows it: see docs/tool-calls.md.\n"
                   "Constraints: response_format (JSON), grammar (GBNF) and guided_regex per request,\n"
                   "--grammar-file for requests without one (docs/tool-calls.md, 'Grammars and regular expressions').",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    return cli_parse_arg(&cmd, argc, argv, &a->model_arg);
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = serve_parse(argc, argv, &a);
    if (rc) return rc == 2 ? 0 : 1;
    size_t kv_budget = 0, max_body = 4u << 20, pc_max = 0;
    if (parse_sizes(a.kv_budget_s, a.max_body_s, a.pc_max_s, a.pc_dir, &kv_budget, &max_body, &pc_max)) return 1;
    char *grammar = NULL; /* --grammar-file's text, checked before the model loads */
    if (a.grammar_file && cli_grammar_file("serve", a.grammar_file, &grammar)) return 1;
    ember_tool_format tool_format = EMBER_TOOLS_NONE;
    float pace = 0.0f; /* the engine's default */
    if (a.pace_s && parse_pace(a.pace_s, &pace)) return 1;
    bool tools_auto = !strcmp(a.tool_parser, "auto");
    if (!tools_auto && !ember_tool_format_from_name(a.tool_parser, &tool_format))
        return cli_fail("serve", "--tool-parser: unknown format '%s' (auto, %s)", a.tool_parser, ember_tool_format_names());
    ember_engine_params sp = {0};
    if (cli_spec_resolve("serve", &a.spo, &sp)) return 1;
    if (!kv_budget) kv_budget = half_the_ram();
    /* signals go to sigwait below: block them before any thread exists */
    sigset_t sigs;
    block_stop_signals(&sigs);

    char path[4096], id[256];
    bool demo;
    if (resolve_model(a.model_arg, path, sizeof path, id, sizeof id, &demo)) return 1;
    if (demo && write_demo_model(path)) return 1;
    int min_level = a.verbose ? EMBER_LOG_DEBUG : EMBER_LOG_INFO;
    double t_start = ember_now(), t_model, t_side;
    ember_model *m;
    /* the tokenizer and the chat template load on a second thread while the
       model loads (they need nothing from it) */
    side_load side = {.path = path};
    pthread_t side_thread;
    bool side_async = pthread_create(&side_thread, NULL, side_load_run, &side) == 0;
    /* warnings reach stderr without -v too: the prompt cache tells about files it skips */
    a.mo = (cli_model_opts){a.threads,    a.ctx,         a.parallel,         a.isa, a.verbose, a.use_mmap, kv_budget,
                            a.mo.kv_type, a.mo.kv_group, a.mo.kv_quant_start, true,  a.mo.device};
    int model_rc = cli_load_model("serve", path, &a.mo, &m);
    t_model = ember_now();
    if (side_async)
        pthread_join(side_thread, NULL);
    else
        side_load_run(&side);
    t_side = ember_now();
    ember_tokenizer *tok = side.tok;
    ember_chat_template *tmpl = side.tmpl;
    int detected = side.detected;
    ember_error err = {0};
    if (model_rc || side.tok_rc || side.tmpl_rc) {
        ember_chat_template_free(tmpl);
        ember_tok_free(tok);
        if (model_rc) return 1; /* cli_load_model said why */
        ember_model_free(m);
        return cli_fail("serve", "%s", side.tok_rc ? side.tok_err.msg : side.tmpl_err.msg);
    }
    ember_model_info info;
    ember_model_get_info(m, &info);
    ember_server_opts so = {0};
    so.host = a.host;
    so.port = a.port;
    so.model_id = id;
    so.model_note = demo ? "demo model with random weights: its output is meaningless" : NULL;
    so.max_queue = a.max_queue;
    so.max_body = max_body;
    so.default_max_tokens = a.default_max;
    so.prompt_cache_dir = a.pc_dir;
    so.prompt_cache_max = pc_max;
    so.spec = sp.spec;
    so.draft_max = sp.draft_max;
    so.draft_min = sp.draft_min;
    so.prefill_chunk = a.prefill_chunk;
    so.prefill_pace = pace;
    so.log = (ember_logger){log_stderr, &min_level};
    so.tool_format = tools_auto ? (ember_tool_format)detected : tool_format;
    so.test_output = a.test_output;
    so.default_grammar = grammar;
    ember_model *draft = NULL;
    if (sp.spec == EMBER_SPEC_DRAFT || sp.spec == EMBER_SPEC_EAGLE3 || sp.spec == EMBER_SPEC_DFLASH) { /* the draft's KV: full rows of its own (small)
                                                                         size, not the target's budget */
        cli_model_opts dmo = a.mo;
        dmo.kv_budget = 0;
        if (cli_load_draft("serve", a.spo.draft_model, path, &dmo, &sp.spec, &draft)) {
            ember_chat_template_free(tmpl);
            ember_tok_free(tok);
            ember_model_free(m);
            return 1;
        }
    }
    so.draft_model = draft;
    so.spec = sp.spec; /* an EAGLE-3 directory given to --spec draft */
    ember_server *srv;
    if (ember_server_start(m, tok, tmpl, &so, &srv, &err)) {
        ember_chat_template_free(tmpl);
        ember_tok_free(tok);
        ember_model_free(m);
        ember_model_free(draft);
        free(grammar);
        return cli_fail("serve", "%s", err.msg);
    }
    fprintf(stderr, "ember: serving %s%s on http://%s:%d (%d parallel x %d tokens, %s, %d threads%s%s, tool calls: %s)\n",
            id, demo ? " (demo, random weights)" : "", a.host, a.port, info.n_rows, info.n_ctx, ember_isa_name(info.isa),
            info.n_threads, tmpl ? "" : ", no chat template", sp.spec == EMBER_SPEC_NGRAM  ? ", n-gram speculation"
            : sp.spec == EMBER_SPEC_DRAFT ? ", draft-model speculation"
            : sp.spec == EMBER_SPEC_EAGLE3 ? ", EAGLE-3 speculation"
            : sp.spec == EMBER_SPEC_DFLASH ? ", DFlash speculation"
            : sp.spec == EMBER_SPEC_MTP ? ", MTP speculation"
                                          : "",
            ember_tool_format_name(so.tool_format));
    if (a.verbose) {
        double t_ready = ember_now();
        fprintf(stderr,
                "ember: ready in %.0f ms: model %.0f ms; beside it tokenizer %.0f ms, chat template %.0f ms (%.0f ms "
                "waited for them); engine and HTTP %.0f ms\n",
                (t_ready - t_start) * 1e3, (t_model - t_start) * 1e3, side.tok_s * 1e3, side.tmpl_s * 1e3,
                (t_side - t_model) * 1e3, (t_ready - t_side) * 1e3);
    }
    if (a.test_output) fprintf(stderr, "ember: --test-output is on: requests may script their output (tests only)\n");
    stop_on_signal(srv, &sigs, a.drain);
    ember_chat_template_free(tmpl);
    ember_tok_free(tok);
    ember_model_free(m);
    ember_model_free(draft);
    free(grammar);
    fprintf(stderr, "ember: stopped\n");
    return 0;
}
