/*
 * jinja_lex.c - template preprocessing and tokenizing; see jinja_internal.h.
 *
 * Mirrors the reference's lexer: the source first loses one trailing "\n",
 * then lstrip_blocks (spaces/tabs before a line's "{%" / "{#" / "{-" go),
 * trim_blocks (the "\n" right after "%}" / "#}" / "-}" goes) and the removal
 * of {% generation %} / {% endgeneration %} tags are applied as text
 * rewrites of the whole source (string literals included, as the reference
 * does). Every byte of the rewritten text keeps the offset of the byte it
 * came from, so tokens carry positions in the original source.
 *
 * Ownership: the rewritten text, its offset map and the tokens live in the
 * caller's arena (the template's).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "template/jinja_internal.h"

typedef struct ptext {
    char *s;
    size_t *m; /* original offset of each byte; m[n] = end */
    size_t n;
} ptext;

typedef struct lexer {
    jarena *a;
    ptext t;
    jtok *toks;
    size_t ntoks, cap;
    ember_error *err;
    const char *orig;
    size_t orig_len;
} lexer;

static int lex_oom(lexer *L) {
    return ember_err(L->err, L->a->failed ? L->a->failed : EMBER_ERR_NOMEM, "template: out of memory while lexing");
}

static int lex_err(lexer *L, size_t at, const char *msg, char c) {
    size_t pos = at < L->t.n ? L->t.m[at] : L->orig_len;
    if (c) return jinja_err_at(L->err, EMBER_ERR_FORMAT, L->orig, L->orig_len, pos, "%s '%c'", msg, c);
    return jinja_err_at(L->err, EMBER_ERR_FORMAT, L->orig, L->orig_len, pos, "%s", msg);
}

static bool pt_new(jarena *a, ptext *o, size_t cap) {
    o->s = ja_alloc(a, cap + 1);
    o->m = ja_alloc(a, (cap + 1) * sizeof(size_t));
    o->n = 0;
    return o->s && o->m;
}

static void pt_put(ptext *o, const ptext *in, size_t i) {
    o->s[o->n] = in->s[i];
    o->m[o->n] = in->m[i];
    o->n++;
}

static void pt_end(ptext *o, const ptext *in) {
    o->m[o->n] = in->m[in->n];
    o->s[o->n] = '\0';
}

static bool at_line_start(const ptext *in, size_t i) {
    if (i == 0) return true;
    char p = in->s[i - 1];
    if (p == '\n' || p == '\r') return true;
    /* U+2028 / U+2029 are line terminators for JavaScript's ^ too */
    return i >= 3 && (unsigned char)in->s[i - 3] == 0xE2 && (unsigned char)in->s[i - 2] == 0x80 &&
           ((unsigned char)p == 0xA8 || (unsigned char)p == 0xA9);
}

/* Whitespace run length starting at i (JavaScript \s). */
static size_t ws_run(const ptext *in, size_t i) {
    size_t j = i;
    while (j < in->n) {
        size_t l = ju_space_len(in->s + j, in->n - j);
        if (!l) break;
        j += l;
    }
    return j - i;
}

/* Matches {%-? \s* (end)?generation \s* -?%} at i; returns its length (0 if
   none) and the two strip flags. */
static size_t match_generation(const ptext *in, size_t i, bool *lstrip, bool *rstrip) {
    const char *s = in->s;
    size_t n = in->n, j = i;
    if (j + 2 > n || s[j] != '{' || s[j + 1] != '%') return 0;
    j += 2;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip) j++;
    j += ws_run(in, j);
    if (j + 3 <= n && memcmp(s + j, "end", 3) == 0) j += 3;
    if (j + 10 > n || memcmp(s + j, "generation", 10) != 0) return 0;
    j += 10;
    j += ws_run(in, j);
    *rstrip = j < n && s[j] == '-';
    if (*rstrip) j++;
    if (j + 2 > n || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2 - i;
}

static int preprocess(lexer *L, const char *src, size_t len) {
    jarena *a = L->a;
    ptext in;
    if (!pt_new(a, &in, len)) return lex_oom(L);
    memcpy(in.s, src, len);
    for (size_t i = 0; i <= len; i++) in.m[i] = i;
    in.n = len;
    if (in.n > 0 && in.s[in.n - 1] == '\n') in.n--;
    in.s[in.n] = '\0';

    /* lstrip_blocks */
    ptext o1;
    if (!pt_new(a, &o1, in.n)) return lex_oom(L);
    for (size_t i = 0; i < in.n;) {
        if (at_line_start(&in, i)) {
            size_t j = i;
            while (j < in.n && (in.s[j] == ' ' || in.s[j] == '\t')) j++;
            if (j > i && j + 1 < in.n && in.s[j] == '{' &&
                (in.s[j + 1] == '#' || in.s[j + 1] == '%' || in.s[j + 1] == '-')) {
                i = j;
                continue;
            }
        }
        pt_put(&o1, &in, i++);
    }
    pt_end(&o1, &in);

    /* trim_blocks */
    ptext o2;
    if (!pt_new(a, &o2, o1.n)) return lex_oom(L);
    for (size_t i = 0; i < o1.n;) {
        if (i + 2 < o1.n && (o1.s[i] == '#' || o1.s[i] == '%' || o1.s[i] == '-') && o1.s[i + 1] == '}' &&
            o1.s[i + 2] == '\n') {
            pt_put(&o2, &o1, i);
            pt_put(&o2, &o1, i + 1);
            i += 3;
            continue;
        }
        pt_put(&o2, &o1, i++);
    }
    pt_end(&o2, &o1);

    /* {% generation %} tags */
    ptext o3;
    if (!pt_new(a, &o3, o2.n)) return lex_oom(L);
    size_t run_start = 0; /* start of the pending whitespace run in o2 */
    bool in_run = false;
    for (size_t i = 0; i < o2.n;) {
        bool ls, rs;
        size_t mlen = o2.s[i] == '{' ? match_generation(&o2, i, &ls, &rs) : 0;
        if (mlen) {
            if (in_run && ls) {
                /* drop the whitespace run just before the tag */
                size_t drop = i - run_start;
                o3.n -= drop;
            }
            i += mlen;
            size_t w = ws_run(&o2, i);
            if (!rs)
                for (size_t k = 0; k < w; k++) pt_put(&o3, &o2, i + k);
            i += w;
            in_run = false;
            continue;
        }
        size_t w = ju_space_len(o2.s + i, o2.n - i);
        if (w) {
            if (!in_run) {
                in_run = true;
                run_start = i;
            }
            for (size_t k = 0; k < w; k++) pt_put(&o3, &o2, i + k);
            i += w;
            continue;
        }
        in_run = false;
        pt_put(&o3, &o2, i++);
    }
    pt_end(&o3, &o2);
    L->t = o3;
    return EMBER_OK;
}

static int push(lexer *L, jtok_type type, const char *s, size_t n, size_t at) {
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *t = ja_grow(L->a, L->toks, L->cap * sizeof(jtok), cap * sizeof(jtok));
        if (!t) return lex_oom(L);
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    t->type = type;
    t->s = s;
    t->n = n;
    t->pos = at < L->t.n ? L->t.m[at] : L->orig_len;
    return EMBER_OK;
}

static void strip_trailing_ws(lexer *L) {
    if (!L->ntoks) return;
    jtok *t = &L->toks[L->ntoks - 1];
    if (t->type != T_TEXT) return;
    /* trimEnd: drop trailing JavaScript whitespace */
    size_t n = t->n;
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)t->s[k] & 0xC0) == 0x80) k--;
        if (ju_space_len(t->s + k, n - k) != n - k) break;
        n = k;
    }
    t->n = n;
    if (n == 0) L->ntoks--;
}

static size_t skip_ws(lexer *L, size_t cur) {
    return cur + ws_run(&L->t, cur);
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted string starting at cur (the quote). */
static int lex_string(lexer *L, size_t *pcur) {
    const char *s = L->t.s;
    size_t n = L->t.n, cur = *pcur, start = cur;
    char q = s[cur++];
    /* worst case the value is as long as the source run */
    size_t end = cur;
    bool esc = false;
    while (end < n && s[end] != q) {
        if (s[end] == '\\') {
            esc = true;
            end++;
        }
        end++;
    }
    if (!esc) {
        if (end >= n) return lex_err(L, start, "unexpected end of template inside a string literal", 0);
        int rc = push(L, T_STRING, s + cur, end - cur, start);
        *pcur = end + 1;
        return rc;
    }
    char *out = ja_alloc(L->a, (end - cur) + 8);
    if (!out) return lex_oom(L);
    size_t o = 0;
    uint32_t pending_hi = 0;
    while (cur < n && s[cur] != q) {
        if (s[cur] == '\\') {
            cur++;
            if (cur >= n) return lex_err(L, cur, "unexpected end of template inside a string literal", 0);
            char e = s[cur++];
            if (e == 'x' || e == 'u') {
                size_t hl = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                if (cur + hl > n) return lex_err(L, cur - 2, "invalid hexadecimal escape sequence", 0);
                for (size_t k = 0; k < hl; k++) {
                    int h = hexval(s[cur + k]);
                    if (h < 0) return lex_err(L, cur - 2, "invalid hexadecimal escape sequence", 0);
                    v = v * 16 + (uint32_t)h;
                }
                cur += hl;
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (pending_hi) o += ember_utf8_put(0xFFFD, out + o);
                    pending_hi = v;
                    continue;
                }
                if (v >= 0xDC00 && v <= 0xDFFF && pending_hi) {
                    v = 0x10000 + ((pending_hi - 0xD800) << 10) + (v - 0xDC00);
                    pending_hi = 0;
                } else if (v >= 0xDC00 && v <= 0xDFFF) {
                    v = 0xFFFD;
                }
                if (pending_hi) {
                    o += ember_utf8_put(0xFFFD, out + o);
                    pending_hi = 0;
                }
                o += ember_utf8_put(v, out + o);
                continue;
            }
            char r;
            switch (e) {
            case 'n': r = '\n'; break;
            case 't': r = '\t'; break;
            case 'r': r = '\r'; break;
            case 'b': r = '\b'; break;
            case 'f': r = '\f'; break;
            case 'v': r = '\v'; break;
            case '\'': r = '\''; break;
            case '"': r = '"'; break;
            case '\\': r = '\\'; break;
            default: return lex_err(L, cur - 1, "unexpected escaped character", e);
            }
            if (pending_hi) {
                o += ember_utf8_put(0xFFFD, out + o);
                pending_hi = 0;
            }
            out[o++] = r;
            continue;
        }
        if (pending_hi) {
            o += ember_utf8_put(0xFFFD, out + o);
            pending_hi = 0;
        }
        out[o++] = s[cur++];
    }
    if (pending_hi) o += ember_utf8_put(0xFFFD, out + o);
    if (cur >= n) return lex_err(L, start, "unexpected end of template inside a string literal", 0);
    out[o] = '\0';
    *pcur = cur + 1;
    return push(L, T_STRING, out, o, start);
}

static const struct {
    const char *seq;
    jtok_type type;
} MAPPING[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_OPEN_PAREN}, {")", T_CLOSE_PAREN}, {"{", T_OPEN_CURLY},   {"}", T_CLOSE_CURLY},
    {"[", T_OPEN_SQUARE}, {"]", T_CLOSE_SQUARE}, {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},       {"|", T_PIPE},         {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},        {"!=", T_CMP},         {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},         {"-", T_ADD},          {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},         {"//", T_MUL},         {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

static bool starts(const ptext *t, size_t cur, const char *lit) {
    size_t l = strlen(lit);
    return cur + l <= t->n && memcmp(t->s + cur, lit, l) == 0;
}

static int tokenize(lexer *L) {
    const char *s = L->t.s;
    size_t n = L->t.n, cur = 0;
    int curly = 0, rc;
    while (cur < n) {
        jtok_type last = L->ntoks ? L->toks[L->ntoks - 1].type : T_COMMENT;
        bool none = L->ntoks == 0;
        if (none || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
            size_t start = cur;
            while (cur < n && !(s[cur] == '{' && cur + 1 < n && (s[cur + 1] == '%' || s[cur + 1] == '{' || s[cur + 1] == '#')))
                cur++;
            if (cur > start) {
                if ((rc = push(L, T_TEXT, s + start, cur - start, start))) return rc;
                continue;
            }
        }
        if (starts(&L->t, cur, "{#")) {
            size_t open = cur;
            cur += 2;
            bool strip_before = cur < n && s[cur] == '-';
            if (strip_before) cur++;
            size_t start = cur;
            for (;;) {
                if (cur + 1 < n && s[cur] == '#' && s[cur + 1] == '}') break;
                if (cur + 2 >= n) return lex_err(L, open, "missing end of comment tag", 0);
                cur++;
            }
            size_t clen = cur - start;
            bool strip_after = clen > 0 && s[cur - 1] == '-';
            if (strip_after) clen--;
            if (strip_before) strip_trailing_ws(L);
            if ((rc = push(L, T_COMMENT, s + start, clen, open))) return rc;
            cur += 2;
            if (strip_after) cur = skip_ws(L, cur);
            continue;
        }
        if (starts(&L->t, cur, "{%-")) {
            strip_trailing_ws(L);
            if ((rc = push(L, T_OPEN_STMT, "{%", 2, cur))) return rc;
            cur += 3;
            continue;
        }
        if (starts(&L->t, cur, "{{-")) {
            strip_trailing_ws(L);
            if ((rc = push(L, T_OPEN_EXPR, "{{", 2, cur))) return rc;
            curly = 0;
            cur += 3;
            continue;
        }
        size_t before = cur;
        cur = skip_ws(L, cur);
        if (cur >= n) {
            if (cur > before) return lex_err(L, n, "unexpected end of template", 0);
            break;
        }
        if (starts(&L->t, cur, "-%}")) {
            if ((rc = push(L, T_CLOSE_STMT, "%}", 2, cur))) return rc;
            cur = skip_ws(L, cur + 3);
            continue;
        }
        if (starts(&L->t, cur, "-}}")) {
            if ((rc = push(L, T_CLOSE_EXPR, "}}", 2, cur))) return rc;
            cur = skip_ws(L, cur + 3);
            continue;
        }
        char c = s[cur];
        if (c == '-' || c == '+') {
            jtok_type lt = L->ntoks ? L->toks[L->ntoks - 1].type : T_TEXT;
            if (lt == T_TEXT) return lex_err(L, cur, "unexpected character", c);
            if (lt != T_IDENT && lt != T_NUMBER && lt != T_STRING && lt != T_CLOSE_PAREN && lt != T_CLOSE_SQUARE) {
                size_t start = cur++;
                size_t d = cur;
                while (cur < n && is_digit(s[cur])) cur++;
                if (cur > d && cur + 1 < n && s[cur] == '.' && is_digit(s[cur + 1])) {
                    cur++;
                    while (cur < n && is_digit(s[cur])) cur++;
                }
                if (cur > d && cur >= n) return lex_err(L, n, "unexpected end of template", 0);
                if ((rc = push(L, cur > d ? T_NUMBER : T_UNARY, s + start, cur - start, start))) return rc;
                continue;
            }
        }
        bool matched = false;
        for (size_t k = 0; k < sizeof MAPPING / sizeof MAPPING[0]; k++) {
            if (MAPPING[k].type == T_CLOSE_EXPR && curly > 0) continue;
            if (starts(&L->t, cur, MAPPING[k].seq)) {
                size_t l = strlen(MAPPING[k].seq);
                if ((rc = push(L, MAPPING[k].type, s + cur, l, cur))) return rc;
                if (MAPPING[k].type == T_OPEN_EXPR)
                    curly = 0;
                else if (MAPPING[k].type == T_OPEN_CURLY)
                    curly++;
                else if (MAPPING[k].type == T_CLOSE_CURLY)
                    curly--;
                cur += l;
                matched = true;
                break;
            }
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            if ((rc = lex_string(L, &cur))) return rc;
            continue;
        }
        if (is_digit(c)) {
            size_t start = cur;
            while (cur < n && is_digit(s[cur])) cur++;
            jtok_type lt = L->ntoks ? L->toks[L->ntoks - 1].type : T_TEXT;
            if (lt != T_DOT && cur + 1 < n && s[cur] == '.' && is_digit(s[cur + 1])) {
                cur++;
                while (cur < n && is_digit(s[cur])) cur++;
            }
            if (cur >= n) return lex_err(L, n, "unexpected end of template", 0);
            if ((rc = push(L, T_NUMBER, s + start, cur - start, start))) return rc;
            continue;
        }
        if (is_word(c)) {
            size_t start = cur;
            while (cur < n && is_word(s[cur])) cur++;
            if (cur >= n) return lex_err(L, n, "unexpected end of template", 0);
            if ((rc = push(L, T_IDENT, s + start, cur - start, start))) return rc;
            continue;
        }
        if ((unsigned char)c >= 0x80) {
            size_t cl;
            uint32_t cp = ember_utf8_decode(s + cur, n - cur, &cl);
            size_t pos = L->t.m[cur];
            return jinja_err_at(L->err, EMBER_ERR_FORMAT, L->orig, L->orig_len, pos, "unexpected character U+%04X",
                                (unsigned)cp);
        }
        return lex_err(L, cur, "unexpected character", c);
    }
    return EMBER_OK;
}

int jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, size_t *ntoks, ember_error *err,
              const char *orig, size_t orig_len) {
    lexer L;
    memset(&L, 0, sizeof L);
    L.a = a;
    L.err = err;
    L.orig = orig;
    L.orig_len = orig_len;
    int rc = preprocess(&L, src, len);
    if (!rc) rc = tokenize(&L);
    if (rc) return rc;
    *toks = L.toks;
    *ntoks = L.ntoks;
    return EMBER_OK;
}
