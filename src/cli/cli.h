/*
 * cli.h - the ember command's verbs. Each returns the process exit code:
 * 0 on success, 1 on any error (one line on stderr), 0 after --help.
 */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

#include <stdbool.h>

#include "ember.h"

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* Loads a model with the common options; prints the error and returns 1 on
   failure. */
typedef struct cli_model_opts {
    int threads, ctx, rows;
    const char *isa; /* NULL: auto */
    bool verbose, use_mmap;
    size_t kv_budget; /* 0: none */
    const char *kv_type; /* NULL: the library's default (f32) */
    int kv_group, kv_quant_start;
    bool warnings; /* without verbose: the model's warnings and errors still reach stderr */
    const char *device; /* "cpu", "cuda", "cuda:N"; NULL: cpu */
} cli_model_opts;

/* The device and KV cache options every model verb takes, as cli_opt
   entries writing into a cli_model_opts `mo`. */
#define CLI_KV_OPTS(mo)                                                                                              \
    {"device", 0, OPT_STR, &(mo).device, "DEV", "where the model runs: cpu (default), cuda or cuda:N (CUDA builds; "  \
     "f32/f16/bf16 KV; f32/f16/bf16, q8_0, q4_0, q5_0, q4_k, q5_k, q6_k, mlx weights)", 0, 0, false},                 \
    {"kv-type", 0, OPT_STR, &(mo).kv_type, "KIND", "KV cache kind: f32, f16, bf16, q8, q4, tq-kKvV (K/V bits 2..8)", \
     0, 0, false},                                                                                                     \
    {"kv-group-size", 0, OPT_INT, &(mo).kv_group, "N", "q8 / q4 KV: values per scale, 32, 64 or 128 (default 64)", \
     1, 1 << 20, false},                                                                                               \
    {"kv-quant-start", 0, OPT_INT, &(mo).kv_quant_start, "N",                                                        \
     "with a quantized KV kind: keep rows f32 until N positions, then convert", 1, 1 << 28, false}

/* Reads the GBNF grammar at path into *text (malloc'd, NUL-terminated) and
   compiles it once to check it; prints one line and returns 1 on failure. */
int cli_grammar_file(const char *verb, const char *path, char **text);

int cli_load_model(const char *verb, const char *path, const cli_model_opts *o, ember_model **out);

/* Speculative decoding options (serve and generate). */
typedef struct cli_spec_opts {
    const char *mode; /* "ngram", "draft", "eagle3" or "none"; NULL: none */
    int draft_max, draft_min; /* 0: not given */
    const char *draft_model;  /* --spec draft / eagle3: its path */
} cli_spec_opts;

#define CLI_SPEC_OPTS(so)                                                                                          \
    {"spec", 0, OPT_STR, &(so).mode, "MODE",                                                                       \
     "speculative decoding: ngram (drafts from the prompt and output so far), draft (a draft model, "             \
     "--draft-model), eagle3 / dflash (an EAGLE-3 / DFlash draft model, --draft-model), mtp (the model's own "     \
     "MTP head: Qwen3-Next / Qwen3.5 mtp.* weights) or none (default)", 0, 0,                                      \
     false},                                                                                                       \
    {"draft-model", 0, OPT_STR, &(so).draft_model, "PATH", "with --spec draft: a smaller model sharing this "      \
     "model's vocabulary (directory or GGUF), loaded with the same options; an EAGLE-3 draft model directory "     \
     "or DFlash one (--spec eagle3 / dflash, or detected with --spec draft)", 0, 0, false},                        \
    {"draft-max", 0, OPT_INT, &(so).draft_max, "N", "with --spec: most draft tokens a request verifies per step "  \
     "(1..64, default 8)", 1, EMBER_MAX_DRAFT, false},                                                             \
    {"draft-min", 0, OPT_INT, &(so).draft_min, "N", "with --spec: speculate only when at least N drafts are "     \
     "proposed (1..64, default 1)", 1, EMBER_MAX_DRAFT, false}

/* Checks the speculative options and fills ep's spec, draft_max and
   draft_min; prints the error and returns 1 on a bad combination. */
int cli_spec_resolve(const char *verb, const cli_spec_opts *so, ember_engine_params *ep);
/* Loads the draft model of --spec draft / eagle3 with the target's options
   o. An EAGLE-3 draft model directory (its config.json) sets *spec to
   EMBER_SPEC_EAGLE3 (its fit to the target is checked by the engine);
   --spec eagle3 with any other model is refused. Otherwise checks that its
   tokenizer gives every token id the target's text (the first differing
   token is named). Prints the error and returns 1. The caller frees *out
   after the engine that uses it, before the target. */
int cli_load_draft(const char *verb, const char *draft_path, const char *target_path, const cli_model_opts *o,
                   ember_spec_mode *spec, ember_model **out);

/* Reads a model directory's chat template (chat_template.jinja, else
   tokenizer_config.json "chat_template"); *out stays NULL when there is
   none. Prints the error and returns 1 when the template does not compile. */
struct ember_chat_template;
int cli_load_template(const char *verb, const char *model, struct ember_chat_template **out);
/* As cli_load_template, and *tools (may be NULL) is the tool-call format the
   template's text shows (template/toolcall.h; EMBER_TOOLS_NONE without one). */
int cli_load_template_tools(const char *verb, const char *model, struct ember_chat_template **out, int *tools);

#endif
