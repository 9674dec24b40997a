/*
 * test_tok_vocab.c - llama.cpp's tokenizer test vectors
 * (shared/testdata/tokenizers/llama.cpp-vocab: X.gguf.inp / X.gguf.out,
 * tokenized without BOS and without parsing special-token text) on every
 * vocabulary present: the GGUF vocabularies, and for llama-bpe / qwen2 the
 * HuggingFace tokenizer.json of Llama 3 / Qwen3. Also stories260K's GGUF
 * tokenizer against llama2.c's prompt ids, and streaming == full decode on
 * every expected id list.
 */
#include <jansson.h>

#include "test.h"
#include "tok_common.h"

static int g_shown;

typedef struct {
    const char *vocab;  /* X in ggml-vocab-X.gguf */
    const char *source; /* NULL: the GGUF itself; else a path under testdata */
} pairing;

static const pairing k_pairs[] = {
    {"llama-spm", NULL},     {"phi-3", NULL},          {"bert-bge", NULL},       {"gpt-2", NULL},
    {"mpt", NULL},           {"starcoder", NULL},      {"refact", NULL},         {"falcon", NULL},
    {"deepseek-coder", NULL}, {"deepseek-llm", NULL},  {"llama-bpe", "tokenizers/hf/llama3"},
    {"qwen2", "tokenizers/hf/qwen3"},
    /* the same Llama 2 vocabulary inside a model file */
    {"llama-spm", "models/llama-2-tiny-random/llama-2-tiny-random.gguf"},
};

static int run_pair(const pairing *pr, int *n_pass, int *n_total) {
    const char *sd = shared_dir();
    char inp[1024], outp[1024], src[1024];
    snprintf(inp, sizeof inp, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-%s.gguf.inp", sd, pr->vocab);
    snprintf(outp, sizeof outp, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-%s.gguf.out", sd, pr->vocab);
    if (pr->source) snprintf(src, sizeof src, "%s/testdata/%s", sd, pr->source);
    else snprintf(src, sizeof src, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-%s.gguf", sd, pr->vocab);
    char *in = tt_read(inp, NULL), *out = tt_read(outp, NULL);
    CHECKF(in && out, "%s: test files missing", pr->vocab);
    if (!in || !out) {
        free(in);
        free(out);
        return 1;
    }
    ember_tokenizer *t;
    ember_error err = {0};
    int rc = ember_tok_load(src, &t, &err);
    CHECKF(rc == 0, "%s: %s", src, err.msg);
    if (rc) {
        free(in);
        free(out);
        return 1;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const char *p = in, *o = out;
    int pass = 0, total = 0, stream_ok = 0;
    for (;;) {
        const char *e = strstr(p, sep);
        if (!e) break;
        const char *eol = strchr(o, '\n');
        if (!eol) break;
        while (*o == ' ') o++;
        int32_t *want;
        size_t nw = tt_ids(&o, &want);
        int32_t *got;
        size_t ng;
        total++;
        rc = ember_tok_encode(t, NULL, p, (size_t)(e - p), EMBER_TOK_NO_PARSE_SPECIAL, &got, &ng, &err);
        if (rc == 0 && ng == nw && (nw == 0 || memcmp(got, want, nw * sizeof *got) == 0)) {
            pass++;
        } else if (g_shown++ < 20) {
            fprintf(stderr, "%s (%s): test %d differs: \"%.*s\"\n", pr->vocab, pr->source ? pr->source : "gguf", total,
                    (int)(e - p > 80 ? 80 : e - p), p);
            tt_print_ids(stderr, "want", want, nw);
            if (!rc) tt_print_ids(stderr, "got ", got, ng);
            else fprintf(stderr, "  error: %s\n", err.msg);
        }
        if (!rc) free(got);
        char *txt;
        size_t tl;
        if (ember_tok_decode(t, want, nw, 0, &txt, &tl, &err) == 0) {
            if (tt_stream_equals(t, want, nw, 0, txt, tl, NULL)) stream_ok++;
            free(txt);
        }
        free(want);
        p = e + strlen(sep);
    }
    fprintf(stderr, "%-15s %-52s %2d/%2d   (stream == decode %d/%d)\n", pr->vocab,
            pr->source ? pr->source : "(its GGUF)", pass, total, stream_ok, total);
    CHECKF(pass == total && total > 0, "%s: %d/%d", pr->vocab, pass, total);
    CHECK(stream_ok == total);
    *n_pass += pass;
    *n_total += total;
    ember_tok_free(t);
    free(in);
    free(out);
    return 0;
}

static void stories(const char *model) {
    const char *sd = shared_dir();
    char g[1024], jl[1024];
    snprintf(g, sizeof g, "%s/testdata/models/%s/%s.gguf", sd, model, model);
    snprintf(jl, sizeof jl, "%s/testdata/models/%s/expected/greedy.jsonl", sd, model);
    ember_tokenizer *t;
    ember_error err = {0};
    int rc = ember_tok_load(g, &t, &err);
    CHECKF(rc == 0, "%s: %s", g, err.msg);
    if (rc) return;
    char *all = tt_read(jl, NULL);
    CHECK(all != NULL);
    int pass = 0, total = 0, dec_ok = 0;
    for (char *line = all; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (o) {
            const char *prompt = json_string_value(json_object_get(o, "prompt"));
            json_t *pids = json_object_get(o, "prompt_ids"), *gids = json_object_get(o, "generated_ids");
            size_t np = json_array_size(pids), ng = json_array_size(gids);
            int32_t *want = malloc((np + ng + 1) * sizeof *want);
            for (size_t i = 0; i < np; i++) want[i] = (int32_t)json_integer_value(json_array_get(pids, i));
            for (size_t i = 0; i < ng; i++) want[np + i] = (int32_t)json_integer_value(json_array_get(gids, i));
            int32_t *got;
            size_t n;
            total++;
            rc = ember_tok_encode(t, NULL, prompt, strlen(prompt), EMBER_TOK_ADD_SPECIAL, &got, &n, &err);
            if (rc == 0 && n == np && memcmp(got, want, np * sizeof *got) == 0) pass++;
            else {
                fprintf(stderr, "%s: prompt \"%s\" differs\n", model, prompt);
                tt_print_ids(stderr, "want", want, np);
                if (!rc) tt_print_ids(stderr, "got ", got, n);
            }
            if (!rc) free(got);
            /* decode(prompt ids + generated ids) = prompt + generated text */
            const char *gtext = json_string_value(json_object_get(o, "generated_text"));
            char *txt;
            size_t tl;
            if (ember_tok_decode(t, want, np + ng, EMBER_TOK_SKIP_SPECIAL, &txt, &tl, &err) == 0) {
                size_t lp = strlen(prompt), lg = strlen(gtext);
                if (tl == lp + lg && memcmp(txt, prompt, lp) == 0 && memcmp(txt + lp, gtext, lg) == 0) dec_ok++;
                else fprintf(stderr, "%s: decode of prompt \"%s\" + generated ids differs:\n  got  \"%.120s\"\n  want \"%s%.120s\"\n",
                             model, prompt, txt, prompt, gtext);
                CHECK(tt_stream_equals(t, want, np + ng, EMBER_TOK_SKIP_SPECIAL, txt, tl, NULL));
                free(txt);
            }
            free(want);
            json_decref(o);
        }
        line = nl ? nl + 1 : NULL;
    }
    fprintf(stderr, "%-15s prompt ids %d/%d, decode %d/%d\n", model, pass, total, dec_ok, total);
    CHECK(total > 0 && pass == total && dec_ok == total);
    free(all);
    ember_tok_free(t);
}

int main(void) {
    (void)shared_dir();
    shared_require("testdata/tokenizers/llama.cpp-vocab");
    shared_require("testdata/models/stories260K");
    int pass = 0, total = 0;
    for (size_t k = 0; k < sizeof k_pairs / sizeof k_pairs[0]; k++) run_pair(&k_pairs[k], &pass, &total);
    fprintf(stderr, "llama.cpp vectors: %d/%d (no vocabulary here for command-r, gemma-4, qwen35)\n", pass, total);
    stories("stories260K");
    return test_done();
}
