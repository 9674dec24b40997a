/*
 * test_tok_variants.c - tokenizer pipelines beyond the three shipped ones,
 * against the reference: tests/data/tok/variants.json describes each
 * variant (a real tokenizer.json from shared/ with another normalizer,
 * pre-tokenizer, decoder, post-processor or added tokens, or a small
 * synthetic WordPiece / Unigram tokenizer) and variants.expected holds what
 * npm @huggingface/tokenizers gives on every 8th corpus string (ids with and
 * without special tokens, decoded texts) and on random id lists. Streaming
 * detokenization must equal each full decode.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>

#include "test.h"
#include "tok_common.h"

#ifndef EMBER_TOK_DATA
#define EMBER_TOK_DATA "tests/data/tok"
#endif

static int g_shown;

typedef struct {
    const char *p;
    size_t n;
} str;

static bool read_text(const char **s, char tag, str *out) {
    const char *p = *s;
    if (p[0] != tag || p[1] != ' ') return false;
    char *e;
    long n = strtol(p + 2, &e, 10);
    if (*e != '\n') return false;
    out->p = e + 1;
    out->n = (size_t)n;
    *s = e + 1 + n + 1;
    return true;
}

/* The tokenizer.json text and config text of a variant (malloc'd). */
static bool build(json_t *v, char **tj, char **tc) {
    const char *sd = shared_dir();
    json_t *tok = json_object_get(v, "tokenizer"), *cfg;
    if (tok) {
        *tj = json_dumps(tok, JSON_COMPACT);
        cfg = json_object_get(v, "config");
        *tc = cfg ? json_dumps(cfg, JSON_COMPACT) : strdup("{}");
        return *tj && *tc;
    }
    const char *base = json_string_value(json_object_get(v, "base"));
    char p[1024];
    snprintf(p, sizeof p, "%s/testdata/tokenizers/hf/%s/tokenizer.json", sd, base);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    snprintf(p, sizeof p, "%s/testdata/tokenizers/hf/%s/tokenizer_config.json", sd, base);
    json_t *conf = json_load_file(p, JSON_DECODE_INT_AS_REAL, &je);
    if (!root || !conf) return false;
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(v, "patch"), key, val) json_object_set(root, key, val);
    json_object_foreach(json_object_get(v, "model"), key, val) json_object_set(json_object_get(root, "model"), key, val);
    json_object_foreach(json_object_get(v, "config"), key, val) json_object_set(conf, key, val);
    size_t i;
    json_array_foreach(json_object_get(v, "add"), i, val) json_array_append(json_object_get(root, "added_tokens"), val);
    *tj = json_dumps(root, JSON_COMPACT);
    *tc = json_dumps(conf, JSON_COMPACT);
    json_decref(root);
    json_decref(conf);
    return *tj && *tc;
}

static bool same_ids(const int32_t *a, size_t an, const int32_t *b, size_t bn) {
    return an == bn && (an == 0 || memcmp(a, b, an * sizeof *a) == 0);
}

int main(void) {
    (void)shared_dir();
    shared_require("testdata/tokenizers/hf");
    json_error_t je;
    json_t *vars = json_load_file(EMBER_TOK_DATA "/variants.json", 0, &je);
    size_t clen;
    char *cb = tt_read(EMBER_TOK_DATA "/corpus.bin", &clen), *exp = tt_read(EMBER_TOK_DATA "/variants.expected", NULL);
    CHECK(vars && cb && exp);
    if (!vars || !cb || !exp) return test_done();
    str corpus[4096];
    size_t nc = 0;
    for (const char *p = cb; p < cb + clen && nc < 4096;) {
        char *e;
        long n = strtol(p, &e, 10);
        corpus[nc].p = e + 1;
        corpus[nc].n = (size_t)n;
        nc++;
        p = e + 1 + n + 1;
    }
    const char *p = exp;
    size_t vi;
    json_t *v;
    json_array_foreach(vars, vi, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        size_t nl = strlen(name);
        if (strncmp(p, "V ", 2) || strncmp(p + 2, name, nl) || p[2 + nl] != '\n') {
            CHECKF(false, "variants.expected out of step at %s", name);
            break;
        }
        p += 3 + nl;
        char *tj = NULL, *tc = NULL;
        bool built = build(v, &tj, &tc);
        CHECKF(built, "%s: cannot build the tokenizer.json", name);
        if (!built) { /* nothing to load: stop here (the failure is counted) */
            free(tj);
            free(tc);
            break;
        }
        ember_tokenizer *t = NULL;
        ember_error err = {0};
        int rc = ember_tok_load_json_mem(name, tj, strlen(tj), tc, strlen(tc), &t, &err);
        CHECKF(rc == 0, "%s: %s", name, err.msg);
        free(tj);
        free(tc);
        int n_rec = 0, ok_n = 0, ok_i = 0, ok_d = 0, ok_s = 0, ok_st = 0, n_r = 0, ok_r = 0, ok_rst = 0;
        while (p[0] == 'K') {
            long k = strtol(p + 2, (char **)&p, 10);
            p++;
            tt_rec rec;
            if (!tt_read_rec(&p, &rec)) {
                CHECKF(false, "%s: bad expected file", name);
                tt_rec_free(&rec);
                break;
            }
            int32_t *wn = rec.n, *wi = rec.i;
            size_t nn = rec.nn, ni = rec.ni;
            str d = {rec.d, rec.dn}, s = {rec.s, rec.sn};
            n_rec++;
            if (t && k >= 0 && (size_t)k < nc) {
                int32_t *got;
                size_t ng;
                if (ember_tok_encode(t, NULL, corpus[k].p, corpus[k].n, 0, &got, &ng, &err) == 0) {
                    if (same_ids(got, ng, wn, nn)) ok_n++;
                    else if (g_shown++ < 15) {
                        fprintf(stderr, "%s: string %ld: encode differs: \"%.*s\"\n", name, k, (int)(corpus[k].n > 100 ? 100 : corpus[k].n), corpus[k].p);
                        tt_print_ids(stderr, "want", wn, nn);
                        tt_print_ids(stderr, "got ", got, ng);
                    }
                    free(got);
                }
                if (ember_tok_encode(t, NULL, corpus[k].p, corpus[k].n, EMBER_TOK_ADD_SPECIAL, &got, &ng, &err) == 0) {
                    if (same_ids(got, ng, wi, ni)) ok_i++;
                    else if (g_shown++ < 15) {
                        fprintf(stderr, "%s: string %ld: encode with specials differs\n", name, k);
                        tt_print_ids(stderr, "want", wi, ni);
                        tt_print_ids(stderr, "got ", got, ng);
                    }
                    free(got);
                }
                char *txt;
                size_t tl;
                if (ember_tok_decode(t, wi, ni, 0, &txt, &tl, &err) == 0) {
                    if (tl == d.n && !memcmp(txt, d.p, tl)) ok_d++;
                    else if (g_shown++ < 15)
                        fprintf(stderr, "%s: string %ld: decode differs:\n  want \"%.*s\"\n  got  \"%s\"\n", name, k,
                                (int)d.n, d.p, txt);
                    free(txt);
                }
                if (ember_tok_decode(t, wi, ni, EMBER_TOK_SKIP_SPECIAL, &txt, &tl, &err) == 0) {
                    if (tl == s.n && !memcmp(txt, s.p, tl)) ok_s++;
                    else if (g_shown++ < 15)
                        fprintf(stderr, "%s: string %ld: decode (skip special) differs:\n  want \"%.*s\"\n  got  \"%s\"\n",
                                name, k, (int)s.n, s.p, txt);
                    free(txt);
                }
                char *sg;
                if (tt_stream_equals(t, wi, ni, 0, d.p, d.n, &sg) &&
                    tt_stream_equals(t, wi, ni, EMBER_TOK_SKIP_SPECIAL, s.p, s.n, NULL))
                    ok_st++;
                else if (g_shown++ < 15)
                    fprintf(stderr, "%s: string %ld: streaming differs:\n  want \"%.*s\"\n  got  \"%s\"\n", name, k,
                            (int)d.n, d.p, sg ? sg : "(skip-special stream)");
                free(sg);
            }
            tt_rec_free(&rec);
        }
        while (p[0] == 'R') {
            p++;
            int32_t *ids;
            size_t n = tt_ids(&p, &ids);
            str d = {0};
            read_text(&p, 'D', &d);
            n_r++;
            char *txt;
            size_t tl;
            if (t && ember_tok_decode(t, ids, n, 0, &txt, &tl, &err) == 0) {
                if (tl == d.n && !memcmp(txt, d.p, tl)) ok_r++;
                else if (g_shown++ < 15)
                    fprintf(stderr, "%s: random ids: decode differs:\n  want \"%.*s\"\n  got  \"%s\"\n", name, (int)d.n, d.p, txt);
                free(txt);
            }
            if (t && tt_stream_equals(t, ids, n, 0, d.p, d.n, NULL)) ok_rst++;
            free(ids);
        }
        fprintf(stderr, "%-34s encode %d/%d, specials %d/%d, decode %d/%d, skip %d/%d, stream %d/%d, random %d/%d, stream %d/%d\n",
                name, ok_n, n_rec, ok_i, n_rec, ok_d, n_rec, ok_s, n_rec, ok_st, n_rec, ok_r, n_r, ok_rst, n_r);
        CHECKF(n_rec > 0 && ok_n == n_rec && ok_i == n_rec && ok_d == n_rec && ok_s == n_rec && ok_st == n_rec,
               "%s", name);
        CHECKF(ok_r == n_r && ok_rst == n_r, "%s: random ids", name);
        ember_tok_free(t);
    }
    json_decref(vars);
    free(cb);
    free(exp);
    return test_done();
}
