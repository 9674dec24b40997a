/*
 * test_tok_corpus.c - Ember's tokenizers against the reference on the
 * project's corpus (tests/data/tok, written by tests/ref/tok/tokenize_corpus.mjs
 * with npm @huggingface/tokenizers): for Qwen3, Llama 3 and Mistral 7B,
 * every string's ids without and with special tokens, the decoded text
 * (plain and skip_special_tokens), decodes of random id lists, and
 * streaming detokenization equal to the full decode.
 */
#include "test.h"
#include "tok_common.h"

#ifndef EMBER_TOK_DATA
#define EMBER_TOK_DATA "tests/data/tok"
#endif

typedef struct {
    const char *p;
    size_t n;
} str;

static int g_shown;

static bool ids_eq(const int32_t *a, size_t an, const int32_t *b, size_t bn) {
    return an == bn && (an == 0 || memcmp(a, b, an * sizeof *a) == 0);
}

/* "D <n>\n<bytes>\n" or "S =\n" (same) */
static bool read_text(const char **s, char tag, str *out, bool *same) {
    const char *p = *s;
    if (p[0] != tag || p[1] != ' ') return false;
    if (same) *same = false;
    if (p[2] == '=') {
        if (same) *same = true;
        *s = p + 4;
        return true;
    }
    char *e;
    long n = strtol(p + 2, &e, 10);
    if (*e != '\n') return false;
    out->p = e + 1;
    out->n = (size_t)n;
    *s = e + 1 + n + 1;
    return true;
}

static void show_text(const char *what, const char *s, size_t n) {
    fprintf(stderr, "  %s (%zu bytes): \"", what, n);
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7F) fprintf(stderr, "\\x%02X", c);
        else fputc(c, stderr);
    }
    fprintf(stderr, "\"\n");
}

static void run(const char *name, const str *corpus, size_t nc) {
    char dir[1024], exp_path[1024];
    snprintf(dir, sizeof dir, "%s/testdata/tokenizers/hf/%s", shared_dir(), name);
    snprintf(exp_path, sizeof exp_path, "%s/%s.expected", EMBER_TOK_DATA, name);
    char *exp = tt_read(exp_path, NULL);
    CHECKF(exp != NULL, "%s", exp_path);
    if (!exp) return;
    ember_tokenizer *t;
    ember_error err = {0};
    int rc = ember_tok_load(dir, &t, &err);
    CHECKF(rc == 0, "%s: %s", name, err.msg);
    if (rc) {
        free(exp);
        return;
    }
    ember_tok_ws *ws = ember_tok_ws_new(t);
    size_t ok_n = 0, ok_i = 0, ok_d = 0, ok_s = 0, ok_st = 0, ok_sts = 0, ok_r = 0, ok_rst = 0, n_r = 0;
    const char *p = exp;
    for (size_t k = 0; k < nc; k++) {
        tt_rec rec;
        if (!tt_read_rec(&p, &rec)) {
            CHECKF(false, "%s: bad expected file at record %zu", name, k);
            tt_rec_free(&rec);
            break;
        }
        int32_t *want_n = rec.n, *want_i = rec.i;
        size_t nn = rec.nn, ni = rec.ni;
        str d = {rec.d, rec.dn}, sk = {rec.s, rec.sn};

        int32_t *got;
        size_t ng;
        rc = ember_tok_encode(t, ws, corpus[k].p, corpus[k].n, 0, &got, &ng, &err);
        if (rc == 0 && ids_eq(got, ng, want_n, nn)) ok_n++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: record %zu: encode differs\n", name, k);
            show_text("text", corpus[k].p, corpus[k].n);
            tt_print_ids(stderr, "want", want_n, nn);
            if (!rc) tt_print_ids(stderr, "got ", got, ng);
            else fprintf(stderr, "  error: %s\n", err.msg);
        }
        if (!rc) free(got);
        rc = ember_tok_encode(t, ws, corpus[k].p, corpus[k].n, EMBER_TOK_ADD_SPECIAL, &got, &ng, &err);
        if (rc == 0 && ids_eq(got, ng, want_i, ni)) ok_i++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: record %zu: encode with special tokens differs\n", name, k);
            tt_print_ids(stderr, "want", want_i, ni);
            if (!rc) tt_print_ids(stderr, "got ", got, ng);
        }
        if (!rc) free(got);

        char *txt;
        size_t tl;
        rc = ember_tok_decode(t, want_i, ni, 0, &txt, &tl, &err);
        if (rc == 0 && tl == d.n && memcmp(txt, d.p, tl) == 0) ok_d++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: record %zu: decode differs\n", name, k);
            tt_print_ids(stderr, "ids", want_i, ni);
            show_text("want", d.p, d.n);
            if (!rc) show_text("got ", txt, tl);
        }
        if (!rc) free(txt);
        rc = ember_tok_decode(t, want_i, ni, EMBER_TOK_SKIP_SPECIAL, &txt, &tl, &err);
        if (rc == 0 && tl == sk.n && memcmp(txt, sk.p, tl) == 0) ok_s++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: record %zu: decode (skip special) differs\n", name, k);
            show_text("want", sk.p, sk.n);
            if (!rc) show_text("got ", txt, tl);
        }
        if (!rc) free(txt);
        char *sgot;
        if (tt_stream_equals(t, want_i, ni, 0, d.p, d.n, &sgot)) ok_st++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: record %zu: streaming differs from the full decode\n", name, k);
            tt_print_ids(stderr, "ids", want_i, ni);
            show_text("want", d.p, d.n);
            if (sgot) show_text("got ", sgot, strlen(sgot));
        }
        free(sgot);
        if (tt_stream_equals(t, want_i, ni, EMBER_TOK_SKIP_SPECIAL, sk.p, sk.n, NULL)) ok_sts++;
        tt_rec_free(&rec);
    }
    while (p[0] == 'R') {
        p += 1;
        int32_t *ids;
        size_t n = tt_ids(&p, &ids);
        str d = {0};
        if (!read_text(&p, 'D', &d, NULL)) {
            free(ids);
            break;
        }
        n_r++;
        char *txt;
        size_t tl;
        rc = ember_tok_decode(t, ids, n, 0, &txt, &tl, &err);
        if (rc == 0 && tl == d.n && memcmp(txt, d.p, tl) == 0) ok_r++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: random ids: decode differs\n", name);
            tt_print_ids(stderr, "ids", ids, n);
            show_text("want", d.p, d.n);
            if (!rc) show_text("got ", txt, tl);
        }
        if (!rc) free(txt);
        char *sgot;
        if (tt_stream_equals(t, ids, n, 0, d.p, d.n, &sgot)) ok_rst++;
        else if (g_shown++ < 12) {
            fprintf(stderr, "%s: random ids: streaming differs\n", name);
            tt_print_ids(stderr, "ids", ids, n);
            show_text("want", d.p, d.n);
            if (sgot) show_text("got ", sgot, strlen(sgot));
        }
        free(sgot);
        free(ids);
    }
    fprintf(stderr,
            "%-16s encode %zu/%zu, with specials %zu/%zu, decode %zu/%zu, skip-special %zu/%zu, "
            "stream %zu/%zu + %zu/%zu, random-id decode %zu/%zu, stream %zu/%zu\n",
            name, ok_n, nc, ok_i, nc, ok_d, nc, ok_s, nc, ok_st, nc, ok_sts, nc, ok_r, n_r, ok_rst, n_r);
    CHECK(ok_n == nc);
    CHECK(ok_i == nc);
    CHECK(ok_d == nc);
    CHECK(ok_s == nc);
    CHECK(ok_st == nc);
    CHECK(ok_sts == nc);
    CHECK(n_r > 0 && ok_r == n_r);
    CHECK(ok_rst == n_r);
    ember_tok_ws_free(ws);
    ember_tok_free(t);
    free(exp);
}

int main(void) {
    (void)shared_dir();
    shared_require("testdata/tokenizers/hf");
    size_t len;
    char *cb = tt_read(EMBER_TOK_DATA "/corpus.bin", &len);
    CHECKF(cb != NULL, "%s/corpus.bin is missing", EMBER_TOK_DATA);
    if (!cb) return test_done();
    size_t cap = 4096, nc = 0;
    str *corpus = malloc(cap * sizeof *corpus);
    for (const char *p = cb; p < cb + len;) {
        char *e;
        long n = strtol(p, &e, 10);
        if (*e != '\n') break;
        if (nc == cap) corpus = realloc(corpus, (cap *= 2) * sizeof *corpus);
        corpus[nc].p = e + 1;
        corpus[nc].n = (size_t)n;
        nc++;
        p = e + 1 + n + 1;
    }
    fprintf(stderr, "corpus: %zu strings\n", nc);
    CHECK(nc >= 2000);
    run("qwen3", corpus, nc);
    run("llama3", corpus, nc);
    run("mistral-7b-v0.1", corpus, nc);
    free(corpus);
    free(cb);
    return test_done();
}
