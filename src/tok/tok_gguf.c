/*
 * tok_gguf.c - tokenizers from the vocabulary stored in a GGUF file
 * (tokenizer.ggml.*), read through src/formats/gguf.h.
 *
 * Owner: tokenizer module; runs on the loading thread. The GGUF object is
 * only read, never kept.
 *
 * Each GGUF tokenizer type becomes the HuggingFace pipeline that model
 * ships with, so encoding follows the same code as tokenizer.json:
 *   llama  SentencePiece BPE: normalizer Prepend("\u2581") (when
 *          add_space_prefix, the default) + Replace(" " -> "\u2581"); merges
 *          derived from the scores (a pair merges into the token it spells,
 *          higher score first, leftmost first); byte fallback; decoder
 *          Replace / ByteFallback / Fuse / Strip.
 *   gpt2   byte-level BPE with tokenizer.ggml.merges; the pre-tokenizer is
 *          chosen by tokenizer.ggml.pre (regexes of the original models);
 *          ignore_merges for Llama 3.
 *   bert   WordPiece on BertNormalizer (lowercase) + BertPreTokenizer; GGUF
 *          marks word-initial pieces with "\u2581" (no "##" on the others).
 * Token types: control (3) and unknown (2) become special added tokens,
 * user-defined (4) non-special added tokens (recognised even with
 * EMBER_TOK_NO_PARSE_SPECIAL, as llama.cpp does).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "tok_internal.h"
#include "core/alloc.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"  \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"                       \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_BLOOM " ?[^(\\s|[.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c])]+"

/* Pre-tokenizer recipes by tokenizer.ggml.pre: Split regexes (isolated),
   then ByteLevel (use_regex false), or ByteLevel with the GPT-2 regex. */
static const struct {
    const char *names; /* '|'-separated */
    const char *re[6];
    bool gpt2_bytelevel; /* ByteLevel(use_regex = true) at the end */
    bool ignore_merges;
} k_pre[] = {
    {"gpt-2|mpt|olmo|jais|trillion|granite-docling|gpt2", {NULL}, true, false},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", {RE_LLAMA3}, false, true},
    {"dbrx|smaug-bpe|chatglm-bpe|chatglm4", {RE_LLAMA3}, false, false},
    {"qwen2|stablelm2|hunyuan|solar-open|grok-2", {RE_QWEN2}, false, false},
    {"deepseek-llm",
     {"[\\r\\n]",
      "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-"
      "\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1"
      "\xce\xa3-\xcf\xb5\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-\xe1\x8f\xb5"
      "\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-"
      "\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85"
      "\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd"
      "\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c"
      "\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-"
      "\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2\x84\x9d\xe2\x84\xa4"
      "\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9\xe2\x84\xbc-\xe2\x84\xbf"
      "\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4"
      "\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b\xea\x9c\xa2-"
      "\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86"
      "\xef\xac\x93-\xef\xac\x97\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f"
      "\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-"
      "\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
      "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
      "\\s+$", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+", "\\p{N}+"},
     false, false},
    {"deepseek-coder",
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
      "\\p{N}"},
     false, false},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva", {"\\p{N}", RE_GPT2}, false, false},
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {"poro-chat|bloom|gpt3-finnish", {RE_BLOOM}, false, false},
    {"viking", {RE_BLOOM, "\\p{N}"}, false, false},
    {"tekken", {RE_TEKKEN}, false, false},
    {"gpt-4o|minimax-m2", {RE_GPT4O}, false, false},
    {"qwen35",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    {"seed-coder",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+"},
     false, false},
    {"deepseek-v3|deepseek3-llm|hunyuan-dense|joyai-llm",
     {"\\p{N}{1,3}", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
      " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2},
     false, false},
};

static bool name_in(const char *names, const char *s) {
    size_t n = strlen(s);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, s, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static int build_pre(ember_tokenizer *t, const char *pre, ember_error *err) {
    size_t k;
    for (k = 0; k < sizeof k_pre / sizeof k_pre[0]; k++)
        if (name_in(k_pre[k].names, pre)) break;
    if (k == sizeof k_pre / sizeof k_pre[0])
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: unsupported tokenizer.ggml.pre '%s'", t->name, pre);
    t->pre = ember_calloc(1, sizeof *t->pre);
    if (!t->pre) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    t->model.ignore_merges = k_pre[k].ignore_merges;
    if (k_pre[k].gpt2_bytelevel) return tok_pre_bytelevel_init(t->pre, false, true, err, t->name);
    size_t n = 0;
    while (n < 6 && k_pre[k].re[n]) n++;
    tok_pretok *seq = t->pre;
    seq->type = TOK_PRE_SEQUENCE;
    seq->kids = ember_calloc(n + 1, sizeof *seq->kids);
    if (!seq->kids) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    for (size_t i = 0; i < n; i++) {
        tok_pretok *s = &seq->kids[seq->n_kids++];
        s->type = TOK_PRE_SPLIT;
        s->behavior = TOK_SPLIT_ISOLATED;
        s->has_pat = true;
        char where[256];
        snprintf(where, sizeof where, "%s: pre-tokenizer '%s'", t->name, pre);
        int rc = tok_pattern_init(&s->pat, true, k_pre[k].re[i], strlen(k_pre[k].re[i]), err, where);
        if (rc) return rc;
    }
    return tok_pre_bytelevel_init(&seq->kids[seq->n_kids++], false, false, err, t->name);
}

static int mk_str(char **dst, size_t *dn, const char *s) {
    size_t n = strlen(s);
    *dst = ember_malloc(n + 1);
    if (!*dst) return EMBER_ERR_NOMEM;
    memcpy(*dst, s, n + 1);
    *dn = n;
    return EMBER_OK;
}

/* Decoder: Replace(from -> " "), then ByteFallback (optional), Fuse, Strip(" ", 1, 0) (optional). */
static int build_spm_decoder(ember_tokenizer *t, bool byte_fallback, bool strip, ember_error *err) {
    tok_dec *d = ember_calloc(1, sizeof *d);
    if (!d) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    t->dec = d;
    d->type = TOK_DEC_SEQUENCE;
    d->kids = ember_calloc(4, sizeof *d->kids);
    if (!d->kids) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    tok_dec *r = &d->kids[d->n_kids++];
    r->type = TOK_DEC_REPLACE;
    r->has_pat = true;
    int rc = tok_pattern_init(&r->pat, false, "\xE2\x96\x81", 3, err, t->name);
    if (rc) return rc;
    if (mk_str(&r->str, &r->str_n, " ")) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    if (byte_fallback) d->kids[d->n_kids++].type = TOK_DEC_BYTEFALLBACK;
    d->kids[d->n_kids++].type = TOK_DEC_FUSE;
    if (strip) {
        tok_dec *s = &d->kids[d->n_kids++];
        s->type = TOK_DEC_STRIP;
        s->strip_cp = ' ';
        s->start = 1;
        s->stop = 0;
    }
    return EMBER_OK;
}

static int add_template(ember_tokenizer *t, int32_t first, int32_t last, ember_error *err) {
    tok_post p = {TOK_POST_TEMPLATE, ember_calloc(3, sizeof(int32_t)), 0, -1, -1};
    if (!p.single) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    if (first >= 0) p.single[p.n_single++] = first;
    p.single[p.n_single++] = TOK_POST_SEQ_A;
    if (last >= 0) p.single[p.n_single++] = last;
    t->posts = ember_malloc(sizeof *t->posts);
    if (!t->posts) {
        free(p.single);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    }
    t->posts[0] = p;
    t->n_posts = 1;
    return EMBER_OK;
}

static int32_t opt_id(const struct ember_gguf *g, const char *key, int32_t n) {
    const ember_gguf_kv *kv = ember_gguf_find_kv(g, key);
    uint32_t v;
    if (!kv || ember_gguf_get_u32(g, key, &v, NULL)) return -1;
    return v < (uint32_t)n ? (int32_t)v : -1;
}

static bool opt_bool(const struct ember_gguf *g, const char *key, bool def) {
    bool v;
    if (!ember_gguf_find_kv(g, key) || ember_gguf_get_bool(g, key, &v, NULL)) return def;
    return v;
}

/* SentencePiece merges: every split of a token into two tokens is a merge
   ranked by the token's score (equal scores share a rank). */
typedef struct scored {
    float s;
    int32_t id;
} scored;
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int spm_merges(ember_tokenizer *t, const float *scores, size_t n, ember_error *err) {
    scored *v = ember_malloc(n * sizeof *v);
    uint32_t *rank = ember_malloc(n * sizeof *rank);
    if (!v || !rank) {
        free(v);
        free(rank);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    }
    for (size_t i = 0; i < n; i++) {
        v[i].s = scores ? scores[i] : 0.0f;
        if (v[i].s != v[i].s) v[i].s = -1e30f; /* NaN sorts last */
        v[i].id = (int32_t)i;
    }
    qsort(v, n, sizeof *v, cmp_scored);
    uint32_t r = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && v[i].s != v[i - 1].s) r++;
        rank[v[i].id] = r;
    }
    free(v);
    int rc = tok_umap_init(&t->model.merges, n * 4);
    for (size_t i = 0; i < n && !rc; i++) {
        tok_sv s = t->text[i];
        if (!s.p || s.n < 2) continue;
        if (tok_smap_get(&t->map, s.p, s.n) != (int32_t)i) continue; /* a duplicate text */
        for (size_t k = tok_utf8_len((unsigned char)s.p[0]); k < s.n; k += tok_utf8_len((unsigned char)s.p[k])) {
            int32_t a = tok_smap_get(&t->map, s.p, k), b = tok_smap_get(&t->map, s.p + k, s.n - k);
            if (a < 0 || b < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            if (tok_umap_put(&t->model.merges, key, ((uint64_t)rank[i] << 32) | (uint32_t)i, true)) rc = EMBER_ERR_NOMEM;
        }
    }
    free(rank);
    return rc ? ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name) : EMBER_OK;
}

static int build(ember_tokenizer *t, const struct ember_gguf *g, ember_error *err) {
    const char *model;
    int rc = ember_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL, err);
    if (rc) return rc;
    const char *const *toks;
    const size_t *lens;
    size_t n;
    if ((rc = ember_gguf_get_strs(g, "tokenizer.ggml.tokens", &toks, &lens, &n, err))) return rc;
    if (n == 0 || n > TOK_MAX_VOCAB)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %zu entries", t->name, n);
    int32_t *types = NULL;
    size_t nt = 0;
    if (ember_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        if ((rc = ember_gguf_get_i32s(g, "tokenizer.ggml.token_type", &types, &nt, err))) return rc;
        if (nt != n) {
            free(types);
            return ember_err(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens",
                             t->name, nt, n);
        }
    }
    /* vocabulary, then added tokens (control / unknown / user-defined) */
    for (size_t i = 0; i < n && !rc; i++) rc = tok_set_text(t, (int32_t)i, toks[i], lens[i], err);
    for (size_t i = 0; i < n && !rc && types; i++) {
        int ty = types[i];
        if (ty == 2 || ty == 3 || ty == 4)
            rc = tok_add_added(t, (int32_t)i, toks[i], lens[i], ty != 4, false, false, false, false, err);
    }
    free(types);
    if (rc) return rc;
    int32_t nn = (int32_t)n;
    t->bos_id = opt_id(g, "tokenizer.ggml.bos_token_id", nn);
    t->eos_id = opt_id(g, "tokenizer.ggml.eos_token_id", nn);
    t->pad_id = opt_id(g, "tokenizer.ggml.padding_token_id", nn);
    int32_t unk = opt_id(g, "tokenizer.ggml.unknown_token_id", nn);
    t->cleanup = false;
    tok_model *m = &t->model;
    m->type = TOK_MODEL_BPE;
    if (unk >= 0) {
        m->unk_str = ember_malloc(t->text[unk].n + 1);
        if (!m->unk_str) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        memcpy(m->unk_str, t->text[unk].p, t->text[unk].n);
        m->unk_str[t->text[unk].n] = 0;
        m->unk_n = t->text[unk].n;
    }
    if (!strcmp(model, "llama")) {
        float *scores = NULL;
        size_t ns = 0;
        if (ember_gguf_find_kv(g, "tokenizer.ggml.scores")) {
            if ((rc = ember_gguf_get_f32s(g, "tokenizer.ggml.scores", &scores, &ns, err))) return rc;
            if (ns != n) {
                free(scores);
                return ember_err(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.scores has %zu entries for %zu tokens",
                                 t->name, ns, n);
            }
        }
        rc = spm_merges(t, scores, n, err);
        free(scores);
        if (rc) return rc;
        m->byte_fallback = true;
        bool prefix = opt_bool(g, "tokenizer.ggml.add_space_prefix", true);
        t->norm = ember_calloc(1, sizeof *t->norm);
        if (!t->norm) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        t->norm->type = TOK_NORM_SEQUENCE;
        t->norm->kids = ember_calloc(2, sizeof *t->norm->kids);
        if (!t->norm->kids) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        if (prefix) {
            tok_norm *p = &t->norm->kids[t->norm->n_kids++];
            p->type = TOK_NORM_PREPEND;
            if (mk_str(&p->str, &p->str_n, "\xE2\x96\x81")) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        }
        tok_norm *r = &t->norm->kids[t->norm->n_kids++];
        r->type = TOK_NORM_REPLACE;
        if ((rc = tok_pattern_init(&r->pat, false, " ", 1, err, t->name))) return rc;
        if (mk_str(&r->str, &r->str_n, "\xE2\x96\x81")) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        if ((rc = build_spm_decoder(t, true, prefix, err))) return rc;
        t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", true);
        t->add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token", false);
    } else if (!strcmp(model, "gpt2")) {
        const char *const *mg;
        const size_t *ml;
        size_t nm;
        if ((rc = ember_gguf_get_strs(g, "tokenizer.ggml.merges", &mg, &ml, &nm, err))) return rc;
        if (nm > TOK_MAX_MERGES) return ember_err(err, EMBER_ERR_LIMIT, "%s: %zu merges", t->name, nm);
        if (tok_umap_init(&m->merges, nm + 16)) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        for (size_t i = 0; i < nm; i++) {
            const char *sp = memchr(mg[i], ' ', ml[i]);
            if (!sp)
                return ember_err(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] has no space", t->name, i);
            size_t an = (size_t)(sp - mg[i]);
            const char *b = sp + 1;
            const char *sp2 = memchr(b, ' ', ml[i] - an - 1);
            size_t bn = sp2 ? (size_t)(sp2 - b) : ml[i] - an - 1;
            int32_t ia, ib;
            if ((rc = tok_id_or_phantom(t, mg[i], an, &ia, err)) || (rc = tok_id_or_phantom(t, b, bn, &ib, err)) ||
                (rc = tok_add_merge(t, ia, ib, (uint32_t)i, err)))
                return rc;
        }
        const char *pre = "default";
        if (ember_gguf_find_kv(g, "tokenizer.ggml.pre") && (rc = ember_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL, err)))
            return rc;
        if ((rc = build_pre(t, pre, err))) return rc;
        t->dec = ember_calloc(1, sizeof *t->dec);
        if (!t->dec) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        t->dec->type = TOK_DEC_BYTELEVEL;
        t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", false);
        t->add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token", false);
    } else if (!strcmp(model, "bert")) {
        m->type = TOK_MODEL_WORDPIECE;
        m->max_chars = 100;
        if (mk_str(&m->word_prefix, &m->word_prefix_n, "\xE2\x96\x81") || mk_str(&m->cont_prefix, &m->cont_prefix_n, ""))
            return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        t->norm = ember_calloc(1, sizeof *t->norm);
        t->pre = ember_calloc(1, sizeof *t->pre);
        if (!t->norm || !t->pre) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        t->norm->type = TOK_NORM_BERT;
        t->norm->clean_text = t->norm->chinese_chars = t->norm->lowercase = true;
        t->norm->strip_accents_mode = -1;
        t->pre->type = TOK_PRE_BERT;
        char pat[512];
        const char *punct = "\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}";
        snprintf(pat, sizeof pat, "[^%s%s]+|[%s]", tok_js_space_class, punct, punct);
        if ((rc = tok_regex_compile_raw(pat, strlen(pat), &t->pre->pat.re, err, t->name))) return rc;
        t->pre->pat.is_regex = true;
        if ((rc = build_spm_decoder(t, false, true, err))) return rc;
        int32_t cls = opt_id(g, "tokenizer.ggml.cls_token_id", nn), sep = opt_id(g, "tokenizer.ggml.seperator_token_id", nn);
        if (cls < 0) cls = t->bos_id;
        if (sep < 0) sep = t->eos_id;
        if (t->bos_id < 0) t->bos_id = cls;
        if (t->eos_id < 0) t->eos_id = sep;
        t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", true);
        t->add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token", true);
        if (!t->add_bos) cls = -1;
        if (!t->add_eos) sep = -1;
        if ((rc = add_template(t, cls, sep, err))) return rc;
        return tok_finish(t, err);
    } else {
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: unsupported tokenizer.ggml.model '%s'", t->name, model);
    }
    tok_choose_byte_mode(t);
    if ((rc = add_template(t, t->add_bos ? t->bos_id : -1, t->add_eos ? t->eos_id : -1, err))) return rc;
    return tok_finish(t, err);
}

int ember_tok_from_gguf(const struct ember_gguf *g, ember_tokenizer **out, ember_error *err) {
    if (!g || !out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_from_gguf: NULL argument");
    *out = NULL;
    ember_tokenizer *t;
    int rc = tok_new(g->path ? g->path : "model.gguf", &t, err);
    if (rc) return rc;
    rc = build(t, g, err);
    if (rc) {
        ember_tok_free(t);
        return rc;
    }
    *out = t;
    return EMBER_OK;
}

int ember_tok_load_gguf(const char *path, ember_tokenizer **out, ember_error *err) {
    if (!path || !out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_load_gguf: NULL argument");
    *out = NULL;
    ember_gguf *g;
    int rc = ember_gguf_open(path, &g, err);
    if (rc) return rc;
    rc = ember_tok_from_gguf(g, out, err);
    ember_gguf_free(g);
    return rc;
}
