/*
 * test_chat_templates.c - the chat-template corpus against the reference.
 *
 * 1. Every template of shared/testdata/chat-templates/llama.cpp is rendered
 *    with every conversation of tests/data/chat/conversations.json and
 *    compared byte for byte with tests/data/chat/expected.json (made by
 *    tests/ref/render_templates.mjs with @huggingface/jinja). Where the
 *    reference failed, ember must fail too (with an error, not a crash).
 *    Prints one line per template (with the first failure and its reason)
 *    and the total; fails below 40 fully passing templates.
 * 2. The qwen3 and llama3 templates of shared/testdata/tokenizers/hf must
 *    reproduce shared/testdata/chat-templates/expected/{qwen3,llama3}.jsonl.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "template/chat.h"

#define MIN_PASSING 40

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    char *nb = realloc(buf, n + 1);
    if (!nb) {
        free(buf);
        return NULL;
    }
    nb[n] = '\0';
    if (len) *len = n;
    return nb;
}

static struct tm fixed_now(void) {
    struct tm t;
    memset(&t, 0, sizeof t);
    t.tm_year = 2024 - 1900;
    t.tm_mon = 6;
    t.tm_mday = 26;
    t.tm_hour = 12;
    return t;
}

/* Describes where two strings first differ. */
static void describe_diff(const char *want, size_t wn, const char *got, size_t gn, char *buf, size_t bn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 20 ? i - 20 : 0;
    char w[64], g[64];
    size_t k = 0;
    for (size_t j = from; j < wn && j < from + 50 && k < sizeof w - 4; j++) w[k++] = want[j] == '\n' ? '|' : want[j];
    w[k] = '\0';
    k = 0;
    for (size_t j = from; j < gn && j < from + 50 && k < sizeof g - 4; j++) g[k++] = got[j] == '\n' ? '|' : got[j];
    g[k] = '\0';
    snprintf(buf, bn, "differs at byte %zu (lengths %zu vs %zu): want \"%s\" got \"%s\"", i, wn, gn, w, g);
}

static int corpus(const char *shared) {
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.json", EMBER_CHAT_DATA);
    json_error_t je;
    json_t *expected = json_load_file(path, 0, &je);
    snprintf(path, sizeof path, "%s/conversations.json", EMBER_CHAT_DATA);
    json_t *convs = json_load_file(path, 0, &je);
    CHECKF(expected && convs, "cannot load %s: %s", path, je.text);
    if (!expected || !convs) {
        json_decref(expected);
        json_decref(convs);
        return 0;
    }
    json_t *conv_list = json_object_get(convs, "conversations");
    json_t *templates = json_object_get(expected, "templates");
    struct tm now = fixed_now();
    ember_chat_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.now = &now;
    int n_templates = 0, n_pass = 0, n_renders = 0, n_render_ok = 0;
    const char *name;
    json_t *tv;
    json_object_foreach(templates, name, tv) {
        n_templates++;
        snprintf(path, sizeof path, "%s/testdata/chat-templates/llama.cpp/%s", shared, name);
        size_t len;
        char *src = read_file(path, &len);
        if (!src) {
            printf("FAIL %-60s cannot read %s\n", name, path);
            continue;
        }
        ember_error err = {0};
        ember_chat_template *t = NULL;
        int rc = ember_chat_template_compile(src, len, &t, &err);
        free(src);
        json_t *cerr = json_object_get(tv, "compile_error");
        if (cerr) {
            bool ok = rc != EMBER_OK;
            printf("%s %-60s reference fails to compile (%s); ember: %s\n", ok ? "PASS" : "FAIL", name,
                   json_string_value(cerr), ok ? err.msg : "compiled");
            n_pass += ok;
            ember_chat_template_free(t);
            continue;
        }
        if (rc) {
            printf("FAIL %-60s ember fails to compile: %s\n", name, err.msg);
            continue;
        }
        json_t *results = json_object_get(tv, "results");
        int ok_convs = 0, total = 0;
        char first_fail[768] = "";
        for (size_t i = 0; i < json_array_size(conv_list); i++) {
            json_t *conv = json_array_get(conv_list, i);
            const char *id = json_string_value(json_object_get(conv, "id"));
            json_t *want = json_object_get(results, id);
            if (!want) continue;
            total++;
            n_renders++;
            char *out = NULL;
            size_t out_len = 0;
            ember_error rerr = {0};
            int rrc = ember_chat_template_render(t, json_object_get(conv, "context"), &opts, &out, &out_len, &rerr);
            json_t *wr = json_object_get(want, "rendered");
            bool ok;
            char why[640] = "";
            if (wr) {
                const char *ws = json_string_value(wr);
                size_t wn = json_string_length(wr);
                ok = rrc == EMBER_OK && out_len == wn && memcmp(out, ws, wn) == 0;
                if (rrc != EMBER_OK)
                    snprintf(why, sizeof why, "ember error: %s", rerr.msg);
                else if (!ok)
                    describe_diff(ws, wn, out, out_len, why, sizeof why);
            } else {
                ok = rrc != EMBER_OK;
                if (!ok)
                    snprintf(why, sizeof why, "reference error \"%s\" but ember rendered",
                             json_string_value(json_object_get(want, "error")));
            }
            /* with extensions on, what the reference renders must not change */
            if (wr && ok) {
                ember_chat_opts xo = opts;
                xo.extensions = true;
                char *xout = NULL;
                size_t xlen = 0;
                int xrc = ember_chat_template_render(t, json_object_get(conv, "context"), &xo, &xout, &xlen, &rerr);
                bool same = xrc == EMBER_OK && xlen == out_len && memcmp(xout, out, xlen) == 0;
                CHECKF(same, "%s [%s]: output changes with extensions on", name, id);
                free(xout);
            }
            n_render_ok += ok;
            ok_convs += ok;
            if (!ok && !first_fail[0]) snprintf(first_fail, sizeof first_fail, "[%s] %s", id, why);
            free(out);
        }
        bool pass = ok_convs == total && total > 0;
        n_pass += pass;
        printf("%s %-60s %d/%d conversations%s%s\n", pass ? "PASS" : "FAIL", name, ok_convs, total,
               first_fail[0] ? "; first failure: " : "", first_fail);
        ember_chat_template_free(t);
    }
    printf("chat templates: %d of %d templates match the reference on every conversation (%d of %d renders)\n",
           n_pass, n_templates, n_render_ok, n_renders);
    CHECKF(n_pass >= MIN_PASSING, "only %d templates pass (need %d)", n_pass, MIN_PASSING);
    json_decref(expected);
    json_decref(convs);
    return n_pass;
}

/* Feature snippets: each compiled and rendered with the shared context. */
static void snippets(void) {
    char path[1024];
    json_error_t je;
    snprintf(path, sizeof path, "%s/expected.json", EMBER_CHAT_DATA);
    json_t *expected = json_load_file(path, 0, &je);
    snprintf(path, sizeof path, "%s/snippets.json", EMBER_CHAT_DATA);
    json_t *sn = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    CHECKF(expected && sn, "cannot load snippets: %s", je.text);
    if (!expected || !sn) {
        json_decref(expected);
        json_decref(sn);
        return;
    }
    json_t *ctx = json_object_get(sn, "context"), *list = json_object_get(sn, "snippets");
    json_t *want_all = json_object_get(expected, "snippets");
    struct tm now = fixed_now();
    ember_chat_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.now = &now;
    int n = 0, ok = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        const char *id = json_string_value(json_object_get(e, "id"));
        const char *src = json_string_value(json_object_get(e, "template"));
        json_t *want = json_object_get(want_all, id);
        CHECKF(want != NULL, "snippet %s has no expected output", id);
        if (!want || !src) continue;
        n++;
        ember_error err = {0};
        ember_chat_template *t = NULL;
        char *out = NULL;
        size_t out_len = 0;
        int rc = ember_chat_template_compile(src, strlen(src), &t, &err);
        if (!rc) rc = ember_chat_template_render(t, ctx, &opts, &out, &out_len, &err);
        json_t *wr = json_object_get(want, "rendered");
        bool same;
        if (wr) {
            same = rc == EMBER_OK && out_len == json_string_length(wr) && memcmp(out, json_string_value(wr), out_len) == 0;
            CHECKF(same, "snippet %s:\n  want [%s]\n  got  [%s]%s%s", id, json_string_value(wr), out ? out : "",
                   rc ? "\n  error: " : "", rc ? err.msg : "");
        } else {
            same = rc != EMBER_OK;
            CHECKF(same, "snippet %s: reference fails (%s) but ember rendered [%s]", id,
                   json_string_value(json_object_get(want, "error")), out ? out : "");
            if (same) printf("snippet %-22s fails as expected: %s\n", id, err.msg);
        }
        ok += same;
        free(out);
        ember_chat_template_free(t);
    }
    printf("snippets: %d of %d match the reference\n", ok, n);
    json_decref(expected);
    json_decref(sn);
}

static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static void expected_prompts(const char *shared, const char *model) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/tokenizers/hf/%s/tokenizer_config.json", shared, model);
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length can exceed int64 */
    CHECKF(cfg != NULL, "cannot load %s", path);
    if (!cfg) return;
    const char *text = ember_chat_template_from_config(cfg, NULL);
    CHECKF(text != NULL, "%s has no chat_template", path);
    ember_error err = {0};
    ember_chat_template *t = NULL;
    if (text) CHECKF(ember_chat_template_compile(text, strlen(text), &t, &err) == EMBER_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/testdata/chat-templates/expected/%s.jsonl", shared, model);
    size_t len;
    char *lines = read_file(path, &len);
    CHECKF(lines != NULL, "cannot read %s", path);
    int n = 0, ok = 0;
    for (char *line = lines; t && line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (*line) {
            json_t *rec = json_loads(line, 0, &je);
            CHECKF(rec != NULL, "bad line in %s", path);
            if (rec) {
                json_t *ctx = json_deep_copy(json_object_get(rec, "context"));
                const char *bos = token_text(json_object_get(cfg, "bos_token"));
                const char *eos = token_text(json_object_get(cfg, "eos_token"));
                if (bos && !json_object_get(ctx, "bos_token")) json_object_set_new(ctx, "bos_token", json_string(bos));
                if (eos && !json_object_get(ctx, "eos_token")) json_object_set_new(ctx, "eos_token", json_string(eos));
                char *out = NULL;
                size_t out_len = 0;
                ember_error rerr = {0};
                int rc = ember_chat_template_render(t, ctx, NULL, &out, &out_len, &rerr);
                const char *want = json_string_value(json_object_get(rec, "rendered"));
                bool same = rc == EMBER_OK && want && strlen(want) == out_len && memcmp(want, out, out_len) == 0;
                n++;
                ok += same;
                CHECKF(same, "%s/%s: %s", model, json_string_value(json_object_get(rec, "id")),
                       rc ? rerr.msg : "rendered text differs");
                free(out);
                json_decref(ctx);
                json_decref(rec);
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    printf("%s expected prompts: %d of %d identical\n", model, ok, n);
    CHECK(n > 0);
    free(lines);
    ember_chat_template_free(t);
    json_decref(cfg);
}

int main(void) {
    snippets(); /* tests/data/chat only: runs without ../shared */
    const char *shared = shared_dir();
    shared_require("testdata/chat-templates");
    shared_require("testdata/tokenizers/hf");
    corpus(shared);
    expected_prompts(shared, "qwen3");
    expected_prompts(shared, "llama3");
    return test_done();
}
