/*
 * tok_json.c - loading a HuggingFace tokenizer.json (+ tokenizer_config.json).
 *
 * Owner: tokenizer module; runs on the loading thread. Every value read
 * from the file is type-checked and bounded; a problem is one line naming
 * the file and the JSON path: "tokenizer.json: model.merges[3]: expected
 * a string \"a b\" or a pair of strings".
 *
 * Accepted: normalizers NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
 * Strip, StripAccents, BertNormalizer, Precompiled, Sequence; pre-tokenizers
 * Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit,
 * BertPreTokenizer, Punctuation, Digits, Replace, FixedLength, Sequence;
 * models BPE, WordPiece, Unigram; post-processors TemplateProcessing,
 * ByteLevel, BertProcessing, RobertaProcessing, Sequence; decoders
 * ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece,
 * BPEDecoder, CTC, Sequence. Anything else is EMBER_ERR_UNSUPPORTED.
 * Defaults for absent fields are the ones HuggingFace writes.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/jsonutil.h"
#include "tok_internal.h"

typedef struct jctx {
    const char *name;
    ember_error *err;
    ember_tokenizer *t;
    tok_sv fv, fm; /* fast-path spans of model.vocab / model.merges (p NULL: none) */
    size_t fv_strings, fm_strings; /* the JSON strings in each */
} jctx;

#define TOK_FALLBACK 1 /* the fast path does not apply: load again through jansson */

static int jfail(jctx *c, int code, const char *path, const char *fmt, ...) EMBER_PRINTF(4, 5);
static int jfail(jctx *c, int code, const char *path, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_err(c->err, code, "%s: %s: %s", c->name, path, msg);
}

static int nomem(jctx *c) { return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->name); }

/* path helpers: "a.b" and "a[3]" into a caller buffer */
static const char *pth(char *buf, size_t n, const char *base, const char *key) {
    if (snprintf(buf, n, "%s%s%s", base, *base ? "." : "", key) >= (int)n && n > 4) memcpy(buf + n - 4, "...", 4);
    return buf;
}
static const char *pthi(char *buf, size_t n, const char *base, size_t i) {
    if (snprintf(buf, n, "%s[%zu]", base, i) >= (int)n && n > 4) memcpy(buf + n - 4, "...", 4);
    return buf;
}

#define PATH 256

static int strcasecmp_ascii(const char *a, const char *b) {
    for (;; a++, b++) {
        int x = (*a >= 'A' && *a <= 'Z') ? *a + 32 : *a, y = (*b >= 'A' && *b <= 'Z') ? *b + 32 : *b;
        if (x != y || !x) return x - y;
    }
}

static int get_bool(jctx *c, const json_t *o, const char *base, const char *key, bool def, bool *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EMBER_OK;
    }
    char p[PATH];
    if (!json_is_boolean(v))
        return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, key), "expected true or false, got %s", ember_json_type(v));
    *out = json_is_true(v);
    return EMBER_OK;
}

/* A string field; *s NULL when absent or null (unless required). */
static int get_str(jctx *c, const json_t *o, const char *base, const char *key, bool required, const char **s,
                   size_t *n) {
    const json_t *v = json_object_get(o, key);
    char p[PATH];
    *s = NULL;
    *n = 0;
    if (!v || json_is_null(v)) {
        if (required) return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, key), "missing");
        return EMBER_OK;
    }
    if (!json_is_string(v))
        return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, key), "expected a string, got %s", ember_json_type(v));
    *s = json_string_value(v);
    *n = json_string_length(v);
    if (*n > TOK_MAX_TOKEN_BYTES)
        return jfail(c, EMBER_ERR_LIMIT, pth(p, sizeof p, base, key), "string of %zu bytes (limit %d)", *n,
                     TOK_MAX_TOKEN_BYTES);
    return EMBER_OK;
}

/* An integer (or an integral real, for files parsed with big numbers). */
static bool jint(const json_t *v, long long *x) {
    if (json_is_integer(v)) {
        *x = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= -9.0e15 && d <= 9.0e15 && d == (double)(long long)d) {
            *x = (long long)d;
            return true;
        }
    }
    return false;
}

static int get_uint(jctx *c, const json_t *o, const char *base, const char *key, long long def, long long hi,
                    long long *out) {
    const json_t *v = json_object_get(o, key);
    char p[PATH];
    if (!v || json_is_null(v)) {
        *out = def;
        return EMBER_OK;
    }
    long long x;
    if (!jint(v, &x))
        return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, key), "expected an integer, got %s", ember_json_type(v));
    if (x < 0 || x > hi)
        return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, key), "%lld is outside [0, %lld]", x, hi);
    *out = x;
    return EMBER_OK;
}

static char *dupn(const char *s, size_t n) {
    char *d = ember_malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int get_type(jctx *c, const json_t *o, const char *base, const char **type) {
    char p[PATH];
    if (!json_is_object(o)) return jfail(c, EMBER_ERR_FORMAT, base, "expected an object, got %s", ember_json_type(o));
    const json_t *v = json_object_get(o, "type");
    if (!json_is_string(v))
        return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, "type"), "expected a string, got %s", ember_json_type(v));
    *type = json_string_value(v);
    return EMBER_OK;
}

/* "pattern": {"String": s} | {"Regex": r} */
static int get_pattern(jctx *c, const json_t *o, const char *base, tok_pattern *pat) {
    char p[PATH], q[PATH];
    const json_t *v = json_object_get(o, "pattern");
    pth(p, sizeof p, base, "pattern");
    if (!json_is_object(v)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an object, got %s", ember_json_type(v));
    const json_t *r = json_object_get(v, "Regex"), *s = json_object_get(v, "String");
    const json_t *x = r ? r : s;
    if (!x) return jfail(c, EMBER_ERR_FORMAT, p, "expected a \"String\" or a \"Regex\"");
    pth(q, sizeof q, p, r ? "Regex" : "String");
    if (!json_is_string(x)) return jfail(c, EMBER_ERR_FORMAT, q, "expected a string, got %s", ember_json_type(x));
    char where[PATH + 64];
    snprintf(where, sizeof where, "%s: %s", c->name, q);
    return tok_pattern_init(pat, r != NULL, json_string_value(x), json_string_length(x), c->err, where);
}

static int init_raw_pattern(jctx *c, tok_pattern *pat, const char *pcre) {
    memset(pat, 0, sizeof *pat);
    int rc = tok_regex_compile_raw(pcre, strlen(pcre), &pat->re, c->err, c->name);
    if (rc) return rc;
    pat->is_regex = true;
    return EMBER_OK;
}

/* ---- normalizers ------------------------------------------------------------------ */

static int parse_norm(jctx *c, const json_t *o, const char *base, int depth, tok_norm *nm) {
    const char *type;
    char p[PATH];
    int rc = get_type(c, o, base, &type);
    if (rc) return rc;
    memset(nm, 0, sizeof *nm);
    if (!strcmp(type, "NFC")) nm->type = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) nm->type = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) nm->type = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) nm->type = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm->type = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) nm->type = TOK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Precompiled")) nm->type = TOK_NORM_PRECOMPILED;
    else if (!strcmp(type, "Strip")) {
        nm->type = TOK_NORM_STRIP;
        if ((rc = get_bool(c, o, base, "strip_left", false, &nm->left)) ||
            (rc = get_bool(c, o, base, "strip_right", false, &nm->right)))
            return rc;
    } else if (!strcmp(type, "Prepend")) {
        nm->type = TOK_NORM_PREPEND;
        const char *s;
        size_t n;
        if ((rc = get_str(c, o, base, "prepend", true, &s, &n))) return rc;
        if (!(nm->str = dupn(s, n))) return nomem(c);
        nm->str_n = n;
    } else if (!strcmp(type, "Replace")) {
        nm->type = TOK_NORM_REPLACE;
        const char *s;
        size_t n;
        if ((rc = get_str(c, o, base, "content", false, &s, &n))) return rc;
        if (!(nm->str = dupn(s ? s : "", n))) return nomem(c);
        nm->str_n = n;
        if ((rc = get_pattern(c, o, base, &nm->pat))) return rc;
    } else if (!strcmp(type, "BertNormalizer")) {
        nm->type = TOK_NORM_BERT;
        if ((rc = get_bool(c, o, base, "clean_text", true, &nm->clean_text)) ||
            (rc = get_bool(c, o, base, "handle_chinese_chars", true, &nm->chinese_chars)) ||
            (rc = get_bool(c, o, base, "lowercase", true, &nm->lowercase)))
            return rc;
        const json_t *sa = json_object_get(o, "strip_accents");
        if (!sa || json_is_null(sa)) nm->strip_accents_mode = -1;
        else if (json_is_boolean(sa)) nm->strip_accents_mode = json_is_true(sa) ? 1 : 0;
        else return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, "strip_accents"), "expected a boolean or null");
    } else if (!strcmp(type, "Sequence")) {
        nm->type = TOK_NORM_SEQUENCE;
        if (depth >= TOK_MAX_DEPTH) return jfail(c, EMBER_ERR_LIMIT, base, "Sequence nested too deeply");
        const json_t *l = json_object_get(o, "normalizers");
        pth(p, sizeof p, base, "normalizers");
        if (!json_is_array(l)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an array, got %s", ember_json_type(l));
        size_t n = json_array_size(l);
        if (n > TOK_MAX_SEQ_ITEMS) return jfail(c, EMBER_ERR_LIMIT, p, "%zu items (limit %d)", n, TOK_MAX_SEQ_ITEMS);
        nm->kids = ember_calloc(n ? n : 1, sizeof *nm->kids);
        if (!nm->kids) return nomem(c);
        for (size_t i = 0; i < n; i++) {
            char q[PATH];
            const json_t *it = json_array_get(l, i);
            if (json_is_null(it)) continue; /* the reference skips null entries */
            rc = parse_norm(c, it, pthi(q, sizeof q, p, i), depth + 1, &nm->kids[nm->n_kids]);
            nm->n_kids++;
            if (rc) return rc;
        }
    } else {
        return jfail(c, EMBER_ERR_UNSUPPORTED, pth(p, sizeof p, base, "type"), "unsupported normalizer '%s'", type);
    }
    return EMBER_OK;
}

/* ---- pre-tokenizers -------------------------------------------------------------------- */

int tok_pre_bytelevel_init(tok_pretok *pt, bool add_prefix_space, bool use_regex, ember_error *err, const char *name) {
    memset(pt, 0, sizeof *pt);
    pt->type = TOK_PRE_BYTELEVEL;
    pt->map_bytes = true;
    pt->add_prefix_space = add_prefix_space;
    pt->use_regex = use_regex;
    if (!use_regex) return EMBER_OK;
    char pat[1024];
    const char *js = tok_js_space_class;
    snprintf(pat, sizeof pat, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^%s\\p{L}\\p{N}]+|[%s]+(?![^%s])|[%s]+", js,
             js, js, js);
    int rc = tok_regex_compile_raw(pat, strlen(pat), &pt->pat.re, err, name);
    if (rc) return rc;
    pt->pat.is_regex = true;
    pt->has_pat = true;
    return EMBER_OK;
}

static int parse_pre(jctx *c, const json_t *o, const char *base, int depth, tok_pretok *pt) {
    const char *type;
    char p[PATH], pat[1024];
    int rc = get_type(c, o, base, &type);
    if (rc) return rc;
    memset(pt, 0, sizeof *pt);
    const char *js = tok_js_space_class;
    const char *punct = "\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}";
    if (!strcmp(type, "ByteLevel")) {
        bool aps, ur;
        if ((rc = get_bool(c, o, base, "add_prefix_space", false, &aps)) ||
            (rc = get_bool(c, o, base, "use_regex", true, &ur)))
            return rc;
        return tok_pre_bytelevel_init(pt, aps, ur, c->err, c->name);
    } else if (!strcmp(type, "Split")) {
        pt->type = TOK_PRE_SPLIT;
        if ((rc = get_pattern(c, o, base, &pt->pat))) return rc;
        pt->has_pat = true;
        if ((rc = get_bool(c, o, base, "invert", false, &pt->invert))) return rc;
        const char *b;
        size_t bn;
        if ((rc = get_str(c, o, base, "behavior", false, &b, &bn))) return rc;
        pt->behavior = TOK_SPLIT_ISOLATED;
        if (b) {
            if (!strcasecmp_ascii(b, "removed")) pt->behavior = TOK_SPLIT_REMOVED;
            else if (!strcasecmp_ascii(b, "isolated")) pt->behavior = TOK_SPLIT_ISOLATED;
            else if (!strcasecmp_ascii(b, "mergedwithprevious")) pt->behavior = TOK_SPLIT_MERGED_WITH_PREVIOUS;
            else if (!strcasecmp_ascii(b, "mergedwithnext")) pt->behavior = TOK_SPLIT_MERGED_WITH_NEXT;
            else if (!strcasecmp_ascii(b, "contiguous")) pt->behavior = TOK_SPLIT_CONTIGUOUS;
            else return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, "behavior"), "unknown behavior '%s'", b);
        }
    } else if (!strcmp(type, "Metaspace")) {
        pt->type = TOK_PRE_METASPACE;
        const char *r, *ps;
        size_t rn, psn;
        if ((rc = get_str(c, o, base, "replacement", false, &r, &rn))) return rc;
        if (!r || rn == 0) {
            r = "\xE2\x96\x81";
            rn = 3;
        }
        if (!(pt->repl = dupn(r, rn))) return nomem(c);
        pt->repl_n = rn;
        if ((rc = get_str(c, o, base, "prepend_scheme", false, &ps, &psn))) return rc;
        pt->prepend = TOK_PREPEND_ALWAYS;
        if (ps) {
            if (!strcmp(ps, "always")) pt->prepend = TOK_PREPEND_ALWAYS;
            else if (!strcmp(ps, "first")) pt->prepend = TOK_PREPEND_FIRST;
            else if (!strcmp(ps, "never")) pt->prepend = TOK_PREPEND_NEVER;
            else return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, "prepend_scheme"), "unknown scheme '%s'", ps);
        } else {
            bool aps;
            if ((rc = get_bool(c, o, base, "add_prefix_space", true, &aps))) return rc;
            pt->prepend = aps ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        }
        if ((rc = get_bool(c, o, base, "split", true, &pt->split))) return rc;
    } else if (!strcmp(type, "Whitespace")) {
        pt->type = TOK_PRE_WHITESPACE;
        snprintf(pat, sizeof pat, "[A-Za-z0-9_]+|[^A-Za-z0-9_%s]+", js);
        if ((rc = init_raw_pattern(c, &pt->pat, pat))) return rc;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        pt->type = TOK_PRE_WHITESPACE_SPLIT;
        snprintf(pat, sizeof pat, "[^%s]+", js);
        if ((rc = init_raw_pattern(c, &pt->pat, pat))) return rc;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        pt->type = TOK_PRE_BERT;
        snprintf(pat, sizeof pat, "[^%s%s]+|[%s]", js, punct, punct);
        if ((rc = init_raw_pattern(c, &pt->pat, pat))) return rc;
    } else if (!strcmp(type, "Punctuation")) {
        pt->type = TOK_PRE_PUNCTUATION;
        snprintf(pat, sizeof pat, "[^%s]+|[%s]+", punct, punct);
        if ((rc = init_raw_pattern(c, &pt->pat, pat))) return rc;
    } else if (!strcmp(type, "Digits")) {
        pt->type = TOK_PRE_DIGITS;
        if ((rc = get_bool(c, o, base, "individual_digits", false, &pt->individual_digits))) return rc;
        if ((rc = init_raw_pattern(c, &pt->pat, pt->individual_digits ? "[^0-9]+|[0-9]" : "[^0-9]+|[0-9]+"))) return rc;
    } else if (!strcmp(type, "Replace")) {
        pt->type = TOK_PRE_REPLACE;
        const char *s;
        size_t n;
        if ((rc = get_str(c, o, base, "content", false, &s, &n))) return rc;
        if (!(pt->repl = dupn(s ? s : "", n))) return nomem(c);
        pt->repl_n = n;
        if ((rc = get_pattern(c, o, base, &pt->pat))) return rc;
    } else if (!strcmp(type, "FixedLength")) {
        pt->type = TOK_PRE_FIXED_LENGTH;
        long long len;
        if ((rc = get_uint(c, o, base, "length", 5, 1 << 20, &len))) return rc;
        if (len == 0) return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, "length"), "must be at least 1");
        pt->length = (size_t)len;
    } else if (!strcmp(type, "Sequence")) {
        pt->type = TOK_PRE_SEQUENCE;
        if (depth >= TOK_MAX_DEPTH) return jfail(c, EMBER_ERR_LIMIT, base, "Sequence nested too deeply");
        const json_t *l = json_object_get(o, "pretokenizers");
        pth(p, sizeof p, base, "pretokenizers");
        if (!json_is_array(l)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an array, got %s", ember_json_type(l));
        size_t n = json_array_size(l);
        if (n > TOK_MAX_SEQ_ITEMS) return jfail(c, EMBER_ERR_LIMIT, p, "%zu items (limit %d)", n, TOK_MAX_SEQ_ITEMS);
        pt->kids = ember_calloc(n ? n : 1, sizeof *pt->kids);
        if (!pt->kids) return nomem(c);
        for (size_t i = 0; i < n; i++) {
            char q[PATH];
            const json_t *it = json_array_get(l, i);
            if (json_is_null(it)) continue;
            rc = parse_pre(c, it, pthi(q, sizeof q, p, i), depth + 1, &pt->kids[pt->n_kids]);
            pt->n_kids++;
            if (rc) return rc;
        }
    } else {
        return jfail(c, EMBER_ERR_UNSUPPORTED, pth(p, sizeof p, base, "type"), "unsupported pre-tokenizer '%s'", type);
    }
    return EMBER_OK;
}

/* ---- decoders ------------------------------------------------------------------------------ */

static int parse_dec(jctx *c, const json_t *o, const char *base, int depth, tok_dec *d) {
    const char *type;
    char p[PATH];
    int rc = get_type(c, o, base, &type);
    if (rc) return rc;
    memset(d, 0, sizeof *d);
    const char *s;
    size_t n;
    if (!strcmp(type, "ByteLevel")) d->type = TOK_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = TOK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = TOK_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = TOK_DEC_METASPACE;
        if ((rc = get_str(c, o, base, "replacement", false, &s, &n))) return rc;
        if (!s) {
            s = "\xE2\x96\x81";
            n = 3;
        }
        if (!(d->str = dupn(s, n))) return nomem(c);
        d->str_n = n;
    } else if (!strcmp(type, "WordPiece")) {
        d->type = TOK_DEC_WORDPIECE;
        if ((rc = get_str(c, o, base, "prefix", false, &s, &n))) return rc;
        if (!s) {
            s = "##";
            n = 2;
        }
        if (!(d->str = dupn(s, n))) return nomem(c);
        d->str_n = n;
        if ((rc = get_bool(c, o, base, "cleanup", true, &d->cleanup))) return rc;
    } else if (!strcmp(type, "BPEDecoder")) {
        d->type = TOK_DEC_BPE;
        if ((rc = get_str(c, o, base, "suffix", false, &s, &n))) return rc;
        if (!s) {
            s = "</w>";
            n = 4;
        }
        if (!(d->str = dupn(s, n))) return nomem(c);
        d->str_n = n;
    } else if (!strcmp(type, "CTC")) {
        d->type = TOK_DEC_CTC;
        if ((rc = get_str(c, o, base, "pad_token", false, &s, &n))) return rc;
        if (!s) {
            s = "<pad>";
            n = 5;
        }
        if (!(d->str = dupn(s, n))) return nomem(c);
        d->str_n = n;
        if ((rc = get_str(c, o, base, "word_delimiter_token", false, &s, &n))) return rc;
        if (!s) {
            s = "|";
            n = 1;
        }
        if (!(d->str2 = dupn(s, n))) return nomem(c);
        d->str2_n = n;
        if ((rc = get_bool(c, o, base, "cleanup", true, &d->cleanup))) return rc;
    } else if (!strcmp(type, "Replace")) {
        d->type = TOK_DEC_REPLACE;
        if ((rc = get_str(c, o, base, "content", false, &s, &n))) return rc;
        if (!(d->str = dupn(s ? s : "", n))) return nomem(c);
        d->str_n = n;
        if ((rc = get_pattern(c, o, base, &d->pat))) return rc;
        d->has_pat = true;
    } else if (!strcmp(type, "Strip")) {
        d->type = TOK_DEC_STRIP;
        if ((rc = get_str(c, o, base, "content", false, &s, &n))) return rc;
        d->strip_cp = 0x110000;
        if (s && n) {
            uint32_t cp;
            size_t l = tok_utf8_next((const unsigned char *)s, (const unsigned char *)s + n, &cp);
            if (l == n && cp < 0x10000) d->strip_cp = cp;
        }
        long long a, b;
        if ((rc = get_uint(c, o, base, "start", 0, 1 << 20, &a)) || (rc = get_uint(c, o, base, "stop", 0, 1 << 20, &b)))
            return rc;
        d->start = (size_t)a;
        d->stop = (size_t)b;
    } else if (!strcmp(type, "Sequence")) {
        d->type = TOK_DEC_SEQUENCE;
        if (depth >= TOK_MAX_DEPTH) return jfail(c, EMBER_ERR_LIMIT, base, "Sequence nested too deeply");
        const json_t *l = json_object_get(o, "decoders");
        pth(p, sizeof p, base, "decoders");
        if (!json_is_array(l)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an array, got %s", ember_json_type(l));
        size_t cnt = json_array_size(l);
        if (cnt > TOK_MAX_SEQ_ITEMS) return jfail(c, EMBER_ERR_LIMIT, p, "%zu items (limit %d)", cnt, TOK_MAX_SEQ_ITEMS);
        d->kids = ember_calloc(cnt ? cnt : 1, sizeof *d->kids);
        if (!d->kids) return nomem(c);
        for (size_t i = 0; i < cnt; i++) {
            char q[PATH];
            rc = parse_dec(c, json_array_get(l, i), pthi(q, sizeof q, p, i), depth + 1, &d->kids[d->n_kids]);
            d->n_kids++;
            if (rc) return rc;
        }
    } else {
        return jfail(c, EMBER_ERR_UNSUPPORTED, pth(p, sizeof p, base, "type"), "unsupported decoder '%s'", type);
    }
    return EMBER_OK;
}

/* ---- model ------------------------------------------------------------------------------------ */

static int parse_vocab_obj(jctx *c, const json_t *vocab, const char *path) {
    const char *key;
    size_t klen;
    json_t *val;
    if (json_object_size(vocab) > TOK_MAX_VOCAB)
        return jfail(c, EMBER_ERR_LIMIT, path, "%zu entries (limit %d)", json_object_size(vocab), TOK_MAX_VOCAB);
    if (tok_smap_reserve(&c->t->map, json_object_size(vocab) + 1024)) return nomem(c);
    json_object_keylen_foreach((json_t *)vocab, key, klen, val) {
        long long id;
        if (!jint(val, &id) || id < 0 || id >= TOK_MAX_VOCAB) {
            char p[PATH];
            if (snprintf(p, sizeof p, "%s[\"%.40s\"]", path, key) < 0) p[0] = 0;
            return jfail(c, EMBER_ERR_FORMAT, p, "expected a token id in [0, %d), got %s", TOK_MAX_VOCAB,
                         json_is_number(val) ? "a number out of range" : ember_json_type(val));
        }
        int rc = tok_set_text(c->t, (int32_t)id, key, klen, c->err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

static int parse_merges(jctx *c, const json_t *merges, const char *path) {
    ember_tokenizer *t = c->t;
    size_t n = json_array_size(merges);
    if (n > TOK_MAX_MERGES) return jfail(c, EMBER_ERR_LIMIT, path, "%zu merges (limit %d)", n, TOK_MAX_MERGES);
    if (tok_umap_init(&t->model.merges, n + 16)) return nomem(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            /* "a b": the first two space-separated parts */
            const char *s = json_string_value(m);
            size_t sn = json_string_length(m);
            const char *sp = memchr(s, ' ', sn);
            if (!sp) {
                char p[PATH];
                return jfail(c, EMBER_ERR_FORMAT, pthi(p, sizeof p, path, i), "merge \"%.40s\" has no space", s);
            }
            a = s;
            an = (size_t)(sp - s);
            b = sp + 1;
            const char *sp2 = memchr(b, ' ', sn - an - 1);
            bn = sp2 ? (size_t)(sp2 - b) : sn - an - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            char p[PATH];
            return jfail(c, EMBER_ERR_FORMAT, pthi(p, sizeof p, path, i),
                         "expected a string \"a b\" or a pair of strings, got %s", ember_json_type(m));
        }
        if (an > TOK_MAX_TOKEN_BYTES || bn > TOK_MAX_TOKEN_BYTES) {
            char p[PATH];
            return jfail(c, EMBER_ERR_LIMIT, pthi(p, sizeof p, path, i), "merge part too long");
        }
        int32_t ia, ib;
        int rc = tok_id_or_phantom(t, a, an, &ia, c->err);
        if (!rc) rc = tok_id_or_phantom(t, b, bn, &ib, c->err);
        if (!rc) rc = tok_add_merge(t, ia, ib, (uint32_t)i, c->err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

static int set_str_field(jctx *c, const json_t *o, const char *base, const char *key, char **dst, size_t *dn,
                         const char *def) {
    const char *s;
    size_t n;
    int rc = get_str(c, o, base, key, false, &s, &n);
    if (rc) return rc;
    if (!s) {
        if (!def) return EMBER_OK;
        s = def;
        n = strlen(def);
    }
    if (!(*dst = dupn(s, n))) return nomem(c);
    *dn = n;
    return EMBER_OK;
}

/* The model's type (as the reference infers it when "type" is absent). */
static int model_type(jctx *c, const json_t *m, tok_model_type *ty) {
    const json_t *tv = json_object_get(m, "type");
    if (json_is_string(tv)) {
        const char *s = json_string_value(tv);
        if (!strcmp(s, "BPE")) *ty = TOK_MODEL_BPE;
        else if (!strcmp(s, "WordPiece")) *ty = TOK_MODEL_WORDPIECE;
        else if (!strcmp(s, "Unigram")) *ty = TOK_MODEL_UNIGRAM;
        else return jfail(c, EMBER_ERR_UNSUPPORTED, "model.type", "unsupported model '%s'", s);
        return EMBER_OK;
    }
    if (tv && !json_is_null(tv)) return jfail(c, EMBER_ERR_FORMAT, "model.type", "expected a string, got %s", ember_json_type(tv));
    const json_t *v = json_object_get(m, "vocab");
    if (json_is_array(v)) *ty = TOK_MODEL_UNIGRAM;
    else if (json_object_get(m, "continuing_subword_prefix") && json_object_get(m, "unk_token"))
        *ty = json_object_get(m, "merges") ? TOK_MODEL_BPE : TOK_MODEL_WORDPIECE;
    else return jfail(c, EMBER_ERR_UNSUPPORTED, "model", "cannot tell the model type (no \"type\")");
    return EMBER_OK;
}

/* Vocabulary (before added tokens). */
static int parse_model_vocab(jctx *c, const json_t *m) {
    tok_model *md = &c->t->model;
    int rc;
    if (!json_is_object(m)) return jfail(c, EMBER_ERR_FORMAT, "model", "expected an object, got %s", ember_json_type(m));
    if ((rc = model_type(c, m, &md->type))) return rc;
    const json_t *vocab = json_object_get(m, "vocab");
    if (md->type == TOK_MODEL_UNIGRAM) {
        if (!json_is_array(vocab)) return jfail(c, EMBER_ERR_FORMAT, "model.vocab", "expected an array, got %s", ember_json_type(vocab));
        size_t n = json_array_size(vocab);
        if (n == 0) return jfail(c, EMBER_ERR_FORMAT, "model.vocab", "is empty");
        if (n > TOK_MAX_VOCAB) return jfail(c, EMBER_ERR_LIMIT, "model.vocab", "%zu entries (limit %d)", n, TOK_MAX_VOCAB);
        md->scores = ember_malloc(n * sizeof *md->scores);
        if (!md->scores) return nomem(c);
        md->n_scores = n;
        double mn = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(vocab, i);
            if (!json_is_array(e) || json_array_size(e) < 2 || !json_is_string(json_array_get(e, 0)) ||
                !json_is_number(json_array_get(e, 1))) {
                char p[PATH];
                return jfail(c, EMBER_ERR_FORMAT, pthi(p, sizeof p, "model.vocab", i),
                             "expected a pair [piece, score], got %s", ember_json_type(e));
            }
            const json_t *ps = json_array_get(e, 0);
            if ((rc = tok_set_text(c->t, (int32_t)i, json_string_value(ps), json_string_length(ps), c->err))) return rc;
            double sc = json_number_value(json_array_get(e, 1));
            md->scores[i] = sc;
            if (i == 0 || sc < mn) mn = sc;
            size_t chars = 0, l = json_string_length(ps);
            for (size_t k = 0; k < l; k++) chars += (json_string_value(ps)[k] & 0xC0) != 0x80;
            if (chars > md->max_piece_chars) md->max_piece_chars = chars;
        }
        md->unk_score = mn - 10;
        md->fuse_unk = true;
        /* the prefix trie (the last of duplicate pieces wins, as the reference's map) */
        if (!(md->pieces = ember_calloc(1, sizeof *md->pieces))) return nomem(c);
        for (size_t i = 0; i < n; i++) {
            tok_sv s = c->t->text[i];
            int32_t last = tok_smap_get(&c->t->map, s.p, s.n);
            if (tok_trie_add(md->pieces, s.p, s.n, last >= 0 && (size_t)last < n ? last : (int32_t)i)) return nomem(c);
        }
        long long unk;
        if ((rc = get_uint(c, m, "model", "unk_id", -1, (long long)n - 1, &unk))) return rc;
        if (unk >= 0) {
            md->scores[unk] = md->unk_score;
            tok_sv s = c->t->text[unk];
            if (!(md->unk_str = dupn(s.p, s.n))) return nomem(c);
            md->unk_n = s.n;
        }
        return EMBER_OK;
    }
    if (!json_is_object(vocab)) return jfail(c, EMBER_ERR_FORMAT, "model.vocab", "expected an object, got %s", ember_json_type(vocab));
    if (c->fv.p) {
        if (tok_jfast_vocab(c->t, c->fv, c->fv_strings, c->err) != 1) return TOK_FALLBACK;
    } else if ((rc = parse_vocab_obj(c, vocab, "model.vocab"))) {
        return rc;
    }
    if ((rc = set_str_field(c, m, "model", "unk_token", &md->unk_str, &md->unk_n, NULL))) return rc;
    if (md->type == TOK_MODEL_WORDPIECE) {
        if ((rc = set_str_field(c, m, "model", "continuing_subword_prefix", &md->cont_prefix, &md->cont_prefix_n, "##")))
            return rc;
        if (!(md->word_prefix = dupn("", 0))) return nomem(c);
        long long mx;
        if ((rc = get_uint(c, m, "model", "max_input_chars_per_word", 100, 1 << 30, &mx))) return rc;
        md->max_chars = (size_t)mx;
        return EMBER_OK;
    }
    if ((rc = get_bool(c, m, "model", "byte_fallback", false, &md->byte_fallback)) ||
        (rc = get_bool(c, m, "model", "ignore_merges", false, &md->ignore_merges)) ||
        (rc = get_bool(c, m, "model", "fuse_unk", false, &md->fuse_unk)))
        return rc;
    if ((rc = set_str_field(c, m, "model", "end_of_word_suffix", &md->eow_suffix, &md->eow_n, NULL)) ||
        (rc = set_str_field(c, m, "model", "continuing_subword_suffix", &md->cont_suffix, &md->cont_n, NULL)))
        return rc;
    const json_t *dr = json_object_get(m, "dropout");
    if (json_is_number(dr) && json_number_value(dr) > 0)
        return jfail(c, EMBER_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported");
    return EMBER_OK;
}

/* ---- post-processors ----------------------------------------------------------------------------- */

/* The id the reference ends up with for a special token text. */
static int32_t special_id(const ember_tokenizer *t, const char *s, size_t n, const json_t *specials) {
    int32_t k = tok_smap_get(&t->added_map, s, n);
    if (k >= 0) return t->added[k].id;
    int32_t id = tok_smap_get(&t->map, s, n);
    if (id >= 0 && id < t->n_ids) return id;
    const json_t *st = specials ? json_object_getn(specials, s, n) : NULL;
    const json_t *ids = st ? json_object_get(st, "ids") : NULL;
    long long v;
    if (json_is_array(ids) && json_array_size(ids) > 0 && jint(json_array_get(ids, 0), &v)) {
        if (v >= 0 && v < t->n_ids) return (int32_t)v;
    }
    if (t->model.unk_str) {
        id = tok_smap_get(&t->map, t->model.unk_str, t->model.unk_n);
        if (id >= 0 && id < t->n_ids) return id;
    }
    return TOK_POST_SKIP;
}

static int push_post(jctx *c, tok_post *p) {
    ember_tokenizer *t = c->t;
    if (t->n_posts >= TOK_MAX_SEQ_ITEMS) return jfail(c, EMBER_ERR_LIMIT, "post_processor", "too many steps");
    tok_post *v = ember_realloc(t->posts, (t->n_posts + 1) * sizeof *v);
    if (!v) {
        free(p->single);
        return nomem(c);
    }
    t->posts = v;
    t->posts[t->n_posts++] = *p;
    return EMBER_OK;
}

static int parse_post(jctx *c, const json_t *o, const char *base, int depth) {
    const char *type;
    char p[PATH];
    int rc = get_type(c, o, base, &type);
    if (rc) return rc;
    ember_tokenizer *t = c->t;
    if (!strcmp(type, "ByteLevel")) return EMBER_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        const json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
        pth(p, sizeof p, base, "single");
        if (!json_is_array(single)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an array, got %s", ember_json_type(single));
        size_t n = json_array_size(single);
        if (n > TOK_MAX_TEMPLATE_ITEMS) return jfail(c, EMBER_ERR_LIMIT, p, "%zu items (limit %d)", n, TOK_MAX_TEMPLATE_ITEMS);
        tok_post post = {TOK_POST_TEMPLATE, ember_calloc(n ? n : 1, sizeof(int32_t)), 0, -1, -1};
        if (!post.single) return nomem(c);
        for (size_t i = 0; i < n; i++) {
            const json_t *it = json_array_get(single, i);
            char q[PATH];
            pthi(q, sizeof q, p, i);
            const json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (json_is_object(sp)) {
                const json_t *id = json_object_get(sp, "id");
                if (!json_is_string(id)) {
                    free(post.single);
                    return jfail(c, EMBER_ERR_FORMAT, q, "SpecialToken.id must be a string");
                }
                post.single[post.n_single++] = special_id(t, json_string_value(id), json_string_length(id), specials);
            } else if (json_is_object(sq)) {
                const json_t *id = json_object_get(sq, "id");
                if (json_is_string(id) && !strcmp(json_string_value(id), "A")) post.single[post.n_single++] = TOK_POST_SEQ_A;
                /* "B" (the pair sequence) is absent for one text */
            } else {
                free(post.single);
                return jfail(c, EMBER_ERR_FORMAT, q, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
            }
        }
        return push_post(c, &post);
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        tok_post post = {TOK_POST_BERT, NULL, 0, TOK_POST_SKIP, TOK_POST_SKIP};
        const char *keys[2] = {"cls", "sep"};
        for (int k = 0; k < 2; k++) {
            const json_t *v = json_object_get(o, keys[k]);
            if (!json_is_array(v) || json_array_size(v) < 1 || !json_is_string(json_array_get(v, 0)))
                return jfail(c, EMBER_ERR_FORMAT, pth(p, sizeof p, base, keys[k]), "expected [token, id]");
            const json_t *s = json_array_get(v, 0);
            int32_t id = special_id(t, json_string_value(s), json_string_length(s), NULL);
            long long x;
            if (id == TOK_POST_SKIP && json_array_size(v) > 1 && jint(json_array_get(v, 1), &x)) {
                if (x >= 0 && x < t->n_ids) id = (int32_t)x;
            }
            if (k == 0) post.cls_id = id;
            else post.sep_id = id;
        }
        return push_post(c, &post);
    }
    if (!strcmp(type, "Sequence")) {
        if (depth >= TOK_MAX_DEPTH) return jfail(c, EMBER_ERR_LIMIT, base, "Sequence nested too deeply");
        const json_t *l = json_object_get(o, "processors");
        pth(p, sizeof p, base, "processors");
        if (!json_is_array(l)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an array, got %s", ember_json_type(l));
        for (size_t i = 0; i < json_array_size(l); i++) {
            char q[PATH];
            if ((rc = parse_post(c, json_array_get(l, i), pthi(q, sizeof q, p, i), depth + 1))) return rc;
        }
        return EMBER_OK;
    }
    return jfail(c, EMBER_ERR_UNSUPPORTED, pth(p, sizeof p, base, "type"), "unsupported post-processor '%s'", type);
}

/* ---- byte-level mode --------------------------------------------------------------------------------- */

static void flatten_pre(tok_pretok *p, tok_pretok **v, size_t *n, size_t cap) {
    if (p->type == TOK_PRE_SEQUENCE) {
        for (size_t k = 0; k < p->n_kids; k++) flatten_pre(&p->kids[k], v, n, cap);
        return;
    }
    if (*n < cap) v[*n] = p;
    (*n)++;
}

/* When ByteLevel is the last pre-tokenizer (and the only one) the model
   can work on raw bytes: the mapping and its inverse are skipped. */
void tok_choose_byte_mode(ember_tokenizer *t) {
    if (!t->pre || t->model.type != TOK_MODEL_BPE) return;
    tok_pretok *v[TOK_MAX_SEQ_ITEMS * 4];
    size_t n = 0;
    flatten_pre(t->pre, v, &n, sizeof v / sizeof v[0]);
    if (n == 0 || n > sizeof v / sizeof v[0]) return;
    size_t count = 0;
    for (size_t k = 0; k < n; k++) count += v[k]->type == TOK_PRE_BYTELEVEL;
    if (count != 1 || v[n - 1]->type != TOK_PRE_BYTELEVEL) return;
    if (t->model.eow_n || t->model.cont_n) return;
    v[n - 1]->map_bytes = false;
    t->model.byte_mode = true;
    t->pre_ends_bytelevel = true;
}

/* ---- tokenizer_config.json ---------------------------------------------------------------------------- */

static int cfg_token_id(const ember_tokenizer *t, const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    int32_t k = tok_smap_get(&t->added_map, s, n);
    if (k >= 0) return t->added[k].id;
    int32_t id = tok_smap_get(&t->map, s, n);
    return (id >= 0 && id < t->n_ids) ? id : -1;
}

static int parse_config_early(jctx *c0, const json_t *cfg, const char *cfg_name) {
    jctx cc = {cfg_name, c0->err, c0->t, {NULL, 0}, {NULL, 0}, 0, 0}, *c = &cc;
    ember_tokenizer *t = c->t;
    if (!cfg) return EMBER_OK;
    const char *base = "";
    int rc;
    if ((rc = get_bool(c, cfg, base, "clean_up_tokenization_spaces", true, &t->cleanup)) ||
        (rc = get_bool(c, cfg, base, "remove_space", false, &t->remove_space)) ||
        (rc = get_bool(c, cfg, base, "do_lowercase_and_remove_accent", false, &t->lower_remove_accent)) ||
        (rc = get_bool(c, cfg, base, "add_bos_token", false, &t->add_bos)) ||
        (rc = get_bool(c, cfg, base, "add_eos_token", false, &t->add_eos)))
        return rc;
    return EMBER_OK;
}

static int parse_config_late(jctx *c, const json_t *cfg) {
    ember_tokenizer *t = c->t;
    if (!cfg) return EMBER_OK;
    const json_t *ast = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(ast)) {
        for (size_t i = 0; i < json_array_size(ast) && i < TOK_MAX_ADDED; i++) {
            const json_t *v = json_array_get(ast, i);
            if (json_is_object(v)) v = json_object_get(v, "content");
            if (!json_is_string(v)) continue;
            char *s = tok_arena_strdup(&t->pool, json_string_value(v), json_string_length(v));
            if (!s || tok_smap_put(&t->special_set, s, json_string_length(v), 0, false, NULL)) return nomem(c);
        }
    }
    t->bos_id = cfg_token_id(t, cfg, "bos_token");
    t->eos_id = cfg_token_id(t, cfg, "eos_token");
    t->pad_id = cfg_token_id(t, cfg, "pad_token");
    t->unk_cfg_id = cfg_token_id(t, cfg, "unk_token");
    /* ids flagged special by string need the late specials too */
    for (int32_t id = 0; id < t->n_ids; id++) {
        tok_sv s = t->text[id];
        if (s.p && tok_smap_get(&t->special_set, s.p, s.n) >= 0) t->flags[id] |= TOK_F_SPECIAL;
    }
    return EMBER_OK;
}

/* ---- the whole file ------------------------------------------------------------------------------------ */

static int parse_added(jctx *c, const json_t *root) {
    const json_t *at = json_object_get(root, "added_tokens");
    if (!at || json_is_null(at)) return EMBER_OK;
    if (!json_is_array(at)) return jfail(c, EMBER_ERR_FORMAT, "added_tokens", "expected an array, got %s", ember_json_type(at));
    size_t n = json_array_size(at);
    if (n > TOK_MAX_ADDED) return jfail(c, EMBER_ERR_LIMIT, "added_tokens", "%zu entries (limit %d)", n, TOK_MAX_ADDED);
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(at, i);
        char p[PATH];
        pthi(p, sizeof p, "added_tokens", i);
        if (!json_is_object(a)) return jfail(c, EMBER_ERR_FORMAT, p, "expected an object, got %s", ember_json_type(a));
        const json_t *id = json_object_get(a, "id");
        long long idv;
        if (!jint(id, &idv) || idv < 0 || idv >= TOK_MAX_VOCAB) {
            char q[PATH];
            return jfail(c, EMBER_ERR_FORMAT, pth(q, sizeof q, p, "id"), "expected a token id in [0, %d)", TOK_MAX_VOCAB);
        }
        const char *s;
        size_t sn;
        bool special, lstrip, rstrip, normalized, single_word;
        int rc;
        if ((rc = get_str(c, a, p, "content", true, &s, &sn)) || (rc = get_bool(c, a, p, "special", false, &special)) ||
            (rc = get_bool(c, a, p, "lstrip", false, &lstrip)) || (rc = get_bool(c, a, p, "rstrip", false, &rstrip)) ||
            (rc = get_bool(c, a, p, "single_word", false, &single_word)) ||
            (rc = get_bool(c, a, p, "normalized", !special, &normalized)))
            return rc;
        if ((rc = tok_add_added(c->t, (int32_t)idv, s, sn, special, lstrip, rstrip, normalized,
                                single_word, c->err)))
            return rc;
    }
    return EMBER_OK;
}

static int load_root(jctx *c, const json_t *root, const json_t *cfg, const char *cfg_name) {
    ember_tokenizer *t = c->t;
    int rc;
    if (!json_is_object(root)) return ember_err(c->err, EMBER_ERR_FORMAT, "%s: expected a JSON object at the top", c->name);
    const json_t *model = json_object_get(root, "model");
    if (!model) return jfail(c, EMBER_ERR_FORMAT, "model", "missing");
    if ((rc = parse_config_early(c, cfg, cfg_name))) return rc;
    if ((rc = parse_model_vocab(c, model))) return rc;
    if ((rc = parse_added(c, root))) return rc;
    if (t->model.type == TOK_MODEL_BPE) {
        const json_t *merges = json_object_get(model, "merges");
        if (!merges || json_is_null(merges)) merges = NULL;
        else if (!json_is_array(merges))
            return jfail(c, EMBER_ERR_FORMAT, "model.merges", "expected an array, got %s", ember_json_type(merges));
        if (merges && c->fm.p) {
            if (tok_jfast_merges(t, c->fm, c->fm_strings, c->err) != 1) return TOK_FALLBACK;
        } else if (merges && (rc = parse_merges(c, merges, "model.merges"))) {
            return rc;
        }
    }
    const json_t *v = json_object_get(root, "normalizer");
    if (v && !json_is_null(v)) {
        if (!(t->norm = ember_calloc(1, sizeof *t->norm))) return nomem(c);
        if ((rc = parse_norm(c, v, "normalizer", 0, t->norm))) return rc;
    }
    v = json_object_get(root, "pre_tokenizer");
    if (v && !json_is_null(v)) {
        if (!(t->pre = ember_calloc(1, sizeof *t->pre))) return nomem(c);
        if ((rc = parse_pre(c, v, "pre_tokenizer", 0, t->pre))) return rc;
    }
    v = json_object_get(root, "decoder");
    if (v && !json_is_null(v)) {
        if (!(t->dec = ember_calloc(1, sizeof *t->dec))) return nomem(c);
        if ((rc = parse_dec(c, v, "decoder", 0, t->dec))) return rc;
    }
    tok_choose_byte_mode(t);
    if ((rc = tok_finish(t, c->err))) return rc;
    /* post-processors after the added-token map exists (they map texts to ids) */
    v = json_object_get(root, "post_processor");
    if (v && !json_is_null(v) && (rc = parse_post(c, v, "post_processor", 0))) return rc;
    return parse_config_late(c, cfg);
}

/* Parses JSON; numbers too big for an integer are retried as reals (the
   integer readers accept integral reals). */
static json_t *load_json(const char *s, size_t n, json_error_t *je) {
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL, je);
    if (!v && strstr(je->text, "too big")) v = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, je);
    return v;
}

int tok_load_json_text(const char *name, const char *json, size_t n, const char *cfg_name, const char *cfg_json,
                       size_t cfg_n, ember_tokenizer **out, ember_error *err) {
    *out = NULL;
    if (!cfg_name) cfg_name = "tokenizer_config.json";
    if (n > TOK_MAX_FILE_BYTES)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: %zu bytes is over the limit of %u", name, n, TOK_MAX_FILE_BYTES);
    json_error_t je;
    json_t *cfg = NULL;
    if (cfg_json) {
        cfg = load_json(cfg_json, cfg_n, &je);
        if (!cfg || !json_is_object(cfg)) {
            if (cfg) {
                json_decref(cfg);
                return ember_err(err, EMBER_ERR_FORMAT, "%s: expected a JSON object at the top", cfg_name);
            }
            return ember_err(err, EMBER_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", cfg_name, je.line,
                             je.column, je.text);
        }
    }
    /* First with the big values read directly (see tok_jfast.c), then, when
       that does not apply, through jansson alone. */
    int rc = TOK_FALLBACK;
    tok_sv fv, fm;
    size_t fvs, fms;
    if (tok_jfast_locate(json, n, &fv, &fm, &fvs, &fms)) {
        size_t cn = 0;
        char *copy = tok_jfast_compact(json, n, &fv, &fm, &cn);
        json_t *root = copy ? load_json(copy, cn, &je) : NULL;
        if (root) {
            ember_tokenizer *t;
            rc = tok_new(name, &t, err);
            if (!rc) {
                jctx c = {t->name, err, t, fv, fm, fvs, fms};
                rc = load_root(&c, root, cfg, cfg_name);
                if (rc) ember_tok_free(t);
                else *out = t;
            }
            json_decref(root);
        }
        free(copy);
    }
    if (rc == TOK_FALLBACK) {
        json_t *root = load_json(json, n, &je);
        if (!root) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", name, je.line, je.column,
                           je.text);
        } else {
            ember_tokenizer *t;
            rc = tok_new(name, &t, err);
            if (!rc) {
                jctx c = {t->name, err, t, {NULL, 0}, {NULL, 0}, 0, 0};
                rc = load_root(&c, root, cfg, cfg_name);
                if (rc) ember_tok_free(t);
                else *out = t;
            }
            json_decref(root);
        }
    }
    if (cfg) json_decref(cfg);
    return rc;
}
