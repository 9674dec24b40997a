/*
 * tok_normalize.c - normalizers (NFC/NFD/NFKC/NFKD via utf8proc, Lowercase,
 * Replace, Prepend, Strip, StripAccents, BertNormalizer, Precompiled,
 * Sequence), with the reference's semantics.
 *
 * Owner: tokenizer module. Runs on the calling thread; results go to the
 * workspace arena (valid until the next encode with that workspace).
 *
 * Notes on the reference (node):
 *  - Unicode forms use the engine's tables; here utf8proc's. Characters
 *    assigned after utf8proc's Unicode version normalize as unassigned.
 *  - Lowercase is JS toLowerCase: per code point, plus U+0130 -> "i\u0307"
 *    and a final-sigma rule (capital sigma after a cased letter and not
 *    before one becomes U+03C2).
 *  - BertNormalizer's Chinese-character test sees UTF-16 code units, so
 *    only BMP ideographs get spaces; kept as is.
 *  - Precompiled ignores the charsmap (as the reference does): a fixed
 *    control-character clean-up, a whitespace map, then NFKC (not across
 *    U+FF5E).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int to_arena(struct ember_tok_ws *ws, const tok_buf *b, tok_sv *out, ember_error *err) {
    char *p = tok_arena_strdup(&ws->arena, b->p ? b->p : "", b->n);
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    out->p = p;
    out->n = b->n;
    return EMBER_OK;
}

static bool all_below(tok_sv s, unsigned char lim) {
    for (size_t i = 0; i < s.n; i++)
        if ((unsigned char)s.p[i] >= lim) return false;
    return true;
}

static int unicode_form(struct ember_tok_ws *ws, tok_sv s, int opts, tok_sv *out, ember_error *err) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s.p, (utf8proc_ssize_t)s.n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | opts));
    if (r < 0) {
        free(dst);
        if (r == UTF8PROC_ERROR_NOMEM) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        return ember_err(err, EMBER_ERR_INTERNAL, "unicode normalization failed: %s", utf8proc_errmsg(r));
    }
    char *p = tok_arena_strdup(&ws->arena, (const char *)dst, (size_t)r);
    free(dst);
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    out->p = p;
    out->n = (size_t)r;
    return EMBER_OK;
}

static bool is_cased(uint32_t cp) {
    return utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
}

static bool is_case_ignorable(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == 0x2019 || cp == '.' ||
           cp == ':' || cp == 0xB7;
}

/* JS String.prototype.toLowerCase (full mapping for the cases that differ
   from the simple one in practice). */
static int js_lower(tok_sv s, tok_buf *o) {
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        if (cp < 0x80) {
            if (tok_buf_putc(o, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp))) return EMBER_ERR_NOMEM;
        } else if (cp == 0x130) {
            if (tok_buf_put(o, "i\xCC\x87", 3)) return EMBER_ERR_NOMEM;
        } else if (cp == 0x3A3) {
            /* final sigma: preceded by cased (skipping ignorables), not followed by cased */
            bool before = false, after = false;
            const unsigned char *q = p;
            while (q > (const unsigned char *)s.p) {
                const unsigned char *r = q - 1;
                while (r > (const unsigned char *)s.p && (*r & 0xC0) == 0x80) r--;
                uint32_t c2;
                tok_utf8_next(r, e, &c2);
                q = r;
                if (is_case_ignorable(c2)) continue;
                before = is_cased(c2);
                break;
            }
            q = p + l;
            while (q < e) {
                uint32_t c2;
                size_t l2 = tok_utf8_next(q, e, &c2);
                q += l2;
                if (is_case_ignorable(c2)) continue;
                after = is_cased(c2);
                break;
            }
            if (tok_buf_put_cp(o, before && !after ? 0x3C2 : 0x3C3)) return EMBER_ERR_NOMEM;
        } else {
            if (tok_buf_put_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))) return EMBER_ERR_NOMEM;
        }
        p += l;
    }
    return EMBER_OK;
}

static bool is_mark(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

static int remove_marks(tok_sv s, bool only_mn, tok_buf *o) {
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        bool drop = cp >= 0x300 && (only_mn ? utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_MN
                                            : is_mark(cp));
        if (!drop && tok_buf_put(o, p, l)) return EMBER_ERR_NOMEM;
        p += l;
    }
    return EMBER_OK;
}

static int bert(const tok_norm *nm, struct ember_tok_ws *ws, tok_sv s, tok_sv *out, ember_error *err) {
    tok_buf a = {0};
    int rc = EMBER_OK;
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    /* clean_text and Chinese characters in one pass */
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        p += l;
        if (nm->clean_text) {
            if (cp == 0 || cp == 0xFFFD) continue;
            if (cp != '\t' && cp != '\n' && cp != '\r') {
                utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
                if (c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO ||
                    c == UTF8PROC_CATEGORY_CS)
                    continue;
            }
            if (ember_js_space(cp)) cp = ' ';
        }
        bool cjk = nm->chinese_chars &&
                   ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0xF900 && cp <= 0xFAFF));
        if (cjk) rc = tok_buf_putc(&a, ' ');
        if (!rc) rc = tok_buf_put_cp(&a, cp);
        if (!rc && cjk) rc = tok_buf_putc(&a, ' ');
        if (rc) break;
    }
    tok_sv cur = {a.p ? a.p : "", a.n};
    tok_buf b = {0}, c = {0};
    bool strip = nm->lowercase ? nm->strip_accents_mode != 0 : nm->strip_accents_mode == 1;
    if (!rc && nm->lowercase) {
        rc = js_lower(cur, &b);
        cur.p = b.p ? b.p : "";
        cur.n = b.n;
    }
    if (!rc && strip) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur.p, (utf8proc_ssize_t)cur.n, &dst,
                                          (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
        if (r < 0) {
            rc = EMBER_ERR_NOMEM;
        } else {
            tok_sv d = {(const char *)dst, (size_t)r};
            rc = remove_marks(d, true, &c);
            cur.p = c.p ? c.p : "";
            cur.n = c.n;
        }
        free(dst);
    }
    if (!rc) {
        tok_buf tmp = {(char *)cur.p, cur.n, 0};
        rc = to_arena(ws, &tmp, out, err);
    } else {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    tok_buf_free(&a);
    tok_buf_free(&b);
    tok_buf_free(&c);
    return rc;
}

static bool precompiled_drop(uint32_t cp) {
    return (cp >= 0x01 && cp <= 0x08) || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F || cp == 0x8F ||
           cp == 0x9F;
}
static bool precompiled_space(uint32_t cp) {
    return cp == 0x09 || cp == 0x0A || cp == 0x0C || cp == 0x0D || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x2581 || cp == 0x3000 || cp == 0xFEFF || cp == 0xFFFD;
}

static int precompiled(struct ember_tok_ws *ws, tok_sv s, tok_sv *out, ember_error *err) {
    tok_buf a = {0}, b = {0};
    int rc = EMBER_OK;
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    while (p < e && !rc) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        p += l;
        if (precompiled_drop(cp)) continue;
        rc = tok_buf_put_cp(&a, precompiled_space(cp) ? ' ' : cp);
    }
    /* NFKC, except across U+FF5E (parts normalized separately) */
    size_t start = 0;
    while (!rc) {
        size_t end = start;
        while (end + 3 <= a.n && memcmp(a.p + end, "\xEF\xBD\x9E", 3) != 0) end++;
        if (end + 3 > a.n) end = a.n;
        if (end > start) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)a.p + start, (utf8proc_ssize_t)(end - start),
                                              &dst, (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
            if (r < 0)
                rc = EMBER_ERR_NOMEM;
            else
                rc = tok_buf_put(&b, dst, (size_t)r);
            free(dst);
        }
        if (rc || end >= a.n) break;
        rc = tok_buf_put(&b, "\xEF\xBD\x9E", 3);
        start = end + 3;
    }
    if (!rc) rc = to_arena(ws, &b, out, err);
    else rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    tok_buf_free(&a);
    tok_buf_free(&b);
    return rc;
}

/* ---- NFC without touching text that cannot change ------------------------------
   A "safe" character is a starter that is stable under NFC and never
   composes with a character before it (NFC_Quick_Check = Yes, ccc = 0).
   NFC(a + b) = NFC(a) + NFC(b) when b starts with a safe character, so
   only the windows [safe character before, run of unsafe characters] are
   normalized; the rest is copied. Verdicts are cached in the workspace. */

static bool composes_with_previous0(uint32_t cp) {
    /* characters with ccc = 0 that are the second part of a canonical
       composition (Unicode 14), and Hangul vowel / trailing jamo */
    static const uint32_t k[] = {0x9BE,   0x9D7,   0xB3E,   0xB56,   0xB57,   0xBBE,   0xBD7,   0xCC2,
                                 0xCD5,   0xCD6,   0xD3E,   0xD57,   0xDCF,   0xDDF,   0x102E,  0x1B35,
                                 0x11127, 0x1133E, 0x11357, 0x114B0, 0x114BA, 0x114BD, 0x115AF, 0x11930};
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return true;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i] == cp) return true;
    return false;
}

static bool nfc_safe_slow(uint32_t cp) {
    if (composes_with_previous0(cp)) return false;
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)cp);
    if (pr->combining_class != 0) return false;
    char in[4];
    size_t l = ember_utf8_put(cp, in);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)l, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    bool same = r == (utf8proc_ssize_t)l && memcmp(dst, in, l) == 0;
    free(dst);
    return same;
}

static bool nfc_safe(struct ember_tok_ws *ws, uint32_t cp) {
    if (cp < 0x300) return true;
    if (cp >= 0x30000) return nfc_safe_slow(cp);
    if (!ws->nfc_state) {
        ws->nfc_state = ember_calloc(0x30000 / 4, 1);
        if (!ws->nfc_state) return nfc_safe_slow(cp);
    }
    uint8_t *b = &ws->nfc_state[cp >> 2];
    unsigned sh = (cp & 3) * 2, v = (*b >> sh) & 3;
    if (!v) {
        v = nfc_safe_slow(cp) ? 1 : 2;
        *b = (uint8_t)(*b | (v << sh));
    }
    return v == 1;
}

static int nfc(struct ember_tok_ws *ws, tok_sv s, tok_sv *out, ember_error *err) {
    const unsigned char *b = (const unsigned char *)s.p, *e = b + s.n, *p = b;
    size_t copied = 0, prev = SIZE_MAX; /* start of the previous character (a safe one) */
    tok_buf o = {0};
    bool any = false;
    while (p < e) {
        if (*p < 0xCC) { /* below U+0300: safe */
            prev = (size_t)(p - b);
            p += tok_utf8_len(*p);
            continue;
        }
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        if (nfc_safe(ws, cp)) {
            prev = (size_t)(p - b);
            p += l;
            continue;
        }
        size_t start = prev == SIZE_MAX ? (size_t)(p - b) : prev;
        p += l;
        while (p < e) { /* the run of unsafe characters */
            size_t l2 = tok_utf8_next(p, e, &cp);
            if (*p < 0xCC || nfc_safe(ws, cp)) break;
            p += l2;
        }
        size_t end = (size_t)(p - b);
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map(b + start, (utf8proc_ssize_t)(end - start), &dst,
                                          (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (r < 0 || tok_buf_put(&o, s.p + copied, start - copied) || tok_buf_put(&o, dst, (size_t)r)) {
            free(dst);
            tok_buf_free(&o);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
        free(dst);
        copied = end;
        any = true;
        prev = SIZE_MAX;
    }
    if (!any) {
        *out = s;
        return EMBER_OK;
    }
    int rc = tok_buf_put(&o, s.p + copied, s.n - copied) ? ember_err(err, EMBER_ERR_NOMEM, "out of memory")
                                                         : to_arena(ws, &o, out, err);
    tok_buf_free(&o);
    return rc;
}

int tok_normalize(const tok_norm *nm, struct ember_tok_ws *ws, tok_sv s, tok_sv *out, ember_error *err) {
    tok_buf b = {0};
    int rc = EMBER_OK;
    switch (nm->type) {
    case TOK_NORM_NFC:
        if (all_below(s, 0xCC)) {
            *out = s;
            return EMBER_OK;
        }
        return nfc(ws, s, out, err);
    case TOK_NORM_NFD:
        if (all_below(s, 0x80)) {
            *out = s;
            return EMBER_OK;
        }
        return unicode_form(ws, s, UTF8PROC_DECOMPOSE, out, err);
    case TOK_NORM_NFKC:
        if (all_below(s, 0x80)) {
            *out = s;
            return EMBER_OK;
        }
        return unicode_form(ws, s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out, err);
    case TOK_NORM_NFKD:
        if (all_below(s, 0x80)) {
            *out = s;
            return EMBER_OK;
        }
        return unicode_form(ws, s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out, err);
    case TOK_NORM_LOWERCASE:
        rc = js_lower(s, &b);
        break;
    case TOK_NORM_STRIP_ACCENTS:
        rc = remove_marks(s, false, &b);
        break;
    case TOK_NORM_PREPEND:
        rc = tok_buf_put(&b, nm->str, nm->str_n);
        if (!rc) rc = tok_buf_put(&b, s.p, s.n);
        break;
    case TOK_NORM_STRIP:
        if (nm->left) s = tok_trim_start(s);
        if (nm->right) s = tok_trim_end(s);
        *out = s;
        return EMBER_OK;
    case TOK_NORM_REPLACE:
        rc = tok_pattern_replace_all(&nm->pat, &ws->rx, s.p, s.n, nm->str, nm->str_n, &b, err);
        if (rc) {
            tok_buf_free(&b);
            return rc;
        }
        break;
    case TOK_NORM_BERT:
        return bert(nm, ws, s, out, err);
    case TOK_NORM_PRECOMPILED:
        return precompiled(ws, s, out, err);
    case TOK_NORM_SEQUENCE:
        for (size_t k = 0; k < nm->n_kids; k++) {
            rc = tok_normalize(&nm->kids[k], ws, s, &s, err);
            if (rc) return rc;
        }
        *out = s;
        return EMBER_OK;
    }
    if (rc) {
        tok_buf_free(&b);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    rc = to_arena(ws, &b, out, err);
    tok_buf_free(&b);
    return rc;
}

void tok_norm_free(tok_norm *nm) {
    if (!nm) return;
    tok_pattern_free(&nm->pat);
    free(nm->str);
    for (size_t k = 0; k < nm->n_kids; k++) tok_norm_free(&nm->kids[k]);
    free(nm->kids);
    memset(nm, 0, sizeof *nm);
}
