/*
 * tok_export.c - writing a model directory's tokenizer into a GGUF file
 * (tokenizer.ggml.*), so that `ember quantize` output carries a real
 * vocabulary that both Ember and llama.cpp read.
 *
 * Supported: byte-level BPE tokenizer.json files whose pre-tokenizer regex is
 * one llama.cpp knows by name (Qwen2/3 -> "qwen2", Llama 3 -> "llama-bpe",
 * GPT-2 -> "gpt-2"). Others are refused with a clear error (the caller then
 * falls back to no vocabulary).
 *
 * Layout written: tokens[i] is the text of id i (vocabulary, then added
 * tokens; ids the tokenizer lacks up to the model's vocab_size become
 * "[PAD<i>]" of type UNUSED), token_type (1 normal, 3 control = special added,
 * 4 user defined = other added, 5 unused), merges as "a b", the special ids,
 * add_bos_token, and the chat template when tokenizer_config.json has one.
 *
 * Ownership: everything read is freed before returning; the writer copies
 * what it keeps.
 */
#define _POSIX_C_SOURCE 200809L
#include "tok_export.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapfile.h"
#include "core/util.h"

#define MAX_TOK_JSON (512u << 20)

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5 };

/* llama.cpp's name for a byte-level pre-tokenizer, from its Split regex. */
static const char *pre_name(const json_t *pre) {
    const json_t *list = json_object_get(pre, "pretokenizers");
    size_t i;
    const json_t *p;
    const char *rx = NULL;
    if (json_is_array(list)) {
        json_array_foreach(list, i, p) {
            const json_t *pat = json_object_get(json_object_get(p, "pattern"), "Regex");
            if (json_is_string(pat)) rx = json_string_value(pat);
        }
    }
    if (!rx) {
        /* plain ByteLevel with its own regex: GPT-2 */
        const char *t = json_string_value(json_object_get(pre, "type"));
        return t && !strcmp(t, "ByteLevel") ? "gpt-2" : NULL;
    }
    if (strstr(rx, "\\p{N}{1,3}")) return "llama-bpe";
    if (strstr(rx, "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|")) return "qwen2";
    return NULL;
}

static int read_json(const char *dir, const char *name, json_t **out, ember_error *err) {
    *out = NULL;
    char *p = ember_path_join(dir, name), *text = NULL;
    size_t len;
    struct stat st;
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (stat(p, &st) != 0) {
        free(p);
        return EMBER_OK; /* absent */
    }
    int rc = ember_read_file(p, MAX_TOK_JSON, &text, &len, err);
    if (!rc) {
        json_error_t je;
        *out = json_loadb(text, len, 0, &je);
        if (!*out) rc = ember_err(err, EMBER_ERR_FORMAT, "%s: not valid JSON: %s", p, je.text);
    }
    free(text);
    free(p);
    return rc;
}

/* The id of a special token named in tokenizer_config.json (a string or
   {"content": ...}), or -1. */
static int config_token_id(const json_t *cfg, const char *key, const json_t *vocab, const json_t *added) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    const char *s = json_string_value(v);
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, s)) return (int)json_integer_value(json_object_get(a, "id"));
    }
    const json_t *id = json_object_get(vocab, s);
    return json_is_integer(id) ? (int)json_integer_value(id) : -1;
}

int ember_gguf_write_tokenizer(ember_gguf_writer *g, const char *dir, int vocab_size, ember_error *err) {
    json_t *tj = NULL, *cfg = NULL;
    char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    size_t n_merges = 0; /* entries of merges (calloc'd, so unset ones are NULL) */
    int n = 0;            /* entries of tokens */
    const json_t *model = NULL, *vocab = NULL, *mj = NULL, *added = NULL;
    int rc = read_json(dir, "tokenizer.json", &tj, err);
    if (rc) return rc;
    if (!tj) return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: no tokenizer.json", dir);
    if ((rc = read_json(dir, "tokenizer_config.json", &cfg, err))) goto done;
    model = json_object_get(tj, "model");
    vocab = json_object_get(model, "vocab");
    mj = json_object_get(model, "merges");
    added = json_object_get(tj, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    const char *pre = pre_name(json_object_get(tj, "pre_tokenizer"));
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab) || !json_is_array(mj) || !pre) {
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED,
                       "%s/tokenizer.json: only byte-level BPE tokenizers with a pre-tokenizer llama.cpp names "
                       "(qwen2, llama-bpe, gpt-2) can be written to GGUF",
                       dir);
        goto done;
    }
    if (!json_is_array(added)) added = NULL;
    /* the id space: the model's vocab_size, or larger if the tokenizer is */
    n = vocab_size;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val) if (json_is_integer(val) && json_integer_value(val) >= n) n =
        (int)json_integer_value(val) + 1;
    size_t ai;
    const json_t *a;
    if (added) json_array_foreach(added, ai, a) {
            json_int_t id = json_integer_value(json_object_get(a, "id"));
            if (id >= n) n = (int)id + 1;
        }
    if (n < 1 || n > (1 << 22)) {
        rc = ember_err(err, EMBER_ERR_LIMIT, "%s/tokenizer.json: %d token ids is out of range", dir, n);
        goto done;
    }
    tokens = ember_calloc((size_t)n, sizeof *tokens);
    types = ember_calloc((size_t)n, sizeof *types);
    n_merges = json_array_size(mj);
    merges = ember_calloc(n_merges ? n_merges : 1, sizeof *merges);
    if (!tokens || !types || !merges) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= n || tokens[id]) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s/tokenizer.json: vocab entry '%.64s' has a bad or repeated id", dir,
                           key);
            goto done;
        }
        tokens[id] = ember_strdup(key);
        types[id] = TT_NORMAL;
        if (!tokens[id]) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (added) json_array_foreach(added, ai, a) {
            json_int_t id = json_integer_value(json_object_get(a, "id"));
            const char *c = json_string_value(json_object_get(a, "content"));
            if (id < 0 || id >= n || !c) continue;
            free(tokens[id]);
            tokens[id] = ember_strdup(c);
            types[id] = json_is_true(json_object_get(a, "special")) ? TT_CONTROL : TT_USER;
            if (!tokens[id]) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
    for (int i = 0; i < n; i++)
        if (!tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            if (!(tokens[i] = ember_strdup(pad))) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
                goto done;
            }
            types[i] = TT_UNUSED;
        }
    for (size_t i = 0; i < n_merges; i++) {
        const json_t *m = json_array_get(mj, i);
        if (json_is_string(m)) {
            merges[i] = ember_strdup(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            const char *l = json_string_value(json_array_get(m, 0)), *r = json_string_value(json_array_get(m, 1));
            size_t ll = strlen(l), rl = strlen(r);
            merges[i] = ember_malloc(ll + rl + 2);
            if (merges[i]) {
                memcpy(merges[i], l, ll);
                merges[i][ll] = ' ';
                memcpy(merges[i] + ll + 1, r, rl + 1);
            }
        } else {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s/tokenizer.json: model.merges[%zu] is not a merge", dir, i);
            goto done;
        }
        if (!merges[i]) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if ((rc = ember_gguf_set_str(g, "tokenizer.ggml.model", "gpt2", err)) ||
        (rc = ember_gguf_set_str(g, "tokenizer.ggml.pre", pre, err)) ||
        (rc = ember_gguf_set_strs(g, "tokenizer.ggml.tokens", (const char *const *)tokens, (size_t)n, err)) ||
        (rc = ember_gguf_set_i32s(g, "tokenizer.ggml.token_type", types, (size_t)n, err)) ||
        (rc = ember_gguf_set_strs(g, "tokenizer.ggml.merges", (const char *const *)merges, n_merges, err)))
        goto done;
    static const char *const k_special[][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                               {"eos_token", "tokenizer.ggml.eos_token_id"},
                                               {"pad_token", "tokenizer.ggml.padding_token_id"},
                                               {"unk_token", "tokenizer.ggml.unknown_token_id"}};
    for (size_t i = 0; cfg && i < EMBER_ARRAY_LEN(k_special); i++) {
        int id = config_token_id(cfg, k_special[i][0], vocab, added);
        if (id >= 0 && (rc = ember_gguf_set_u32(g, k_special[i][1], (uint32_t)id, err))) goto done;
    }
    const json_t *abos = json_object_get(cfg, "add_bos_token");
    if ((rc = ember_gguf_set_bool(g, "tokenizer.ggml.add_bos_token", json_is_true(abos), err))) goto done;
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct) && (rc = ember_gguf_set_str(g, "tokenizer.chat_template", json_string_value(ct), err)))
        goto done;
done:
    for (int i = 0; tokens && i < n; i++) free(tokens[i]);
    for (size_t i = 0; merges && i < n_merges; i++) free(merges[i]);
    free(tokens);
    free(merges);
    free(types);
    json_decref(tj);
    json_decref(cfg);
    return rc;
}
