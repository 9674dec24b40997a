/*
 * tok_regex.c - tokenizer.json regexes on PCRE2, with the reference's meaning.
 *
 * Owner: tokenizer module. Compiled patterns belong to the tokenizer and
 * are shared read-only by all threads; match data, the match context and
 * the JIT stack live in a per-thread tok_rx.
 *
 * tokenizer.json regexes are written for Oniguruma (HF's Rust library); the
 * reference (node) rewrites them into JavaScript regexes. This file rewrites
 * them into PCRE2 syntax with the same meaning as the reference:
 *   \s \S       Unicode White_Space (not PCRE2's \s, which adds U+180E)
 *   \d \D \w \W \h \H \b \B   Unicode digits / word characters / hex
 *   .           any character but \n;  ^ $  line anchors (\n only)
 *   (?i:...)    ASCII-only case folding of the letters inside
 *   (?>...)     a plain group; X++ X*+ X?+ lose the possessive '+'
 *   X{n,m}+     (?:X{n,m})+ (a repeated repeat, as in Oniguruma)
 *   \xHH \uHHHH \x{H..}   code points;  \v = U+000B (not a class)
 *   [a&&b]      class intersection;  [[:alpha:]]  POSIX classes;  nested classes
 * Everything else passes through. Unsupported syntax (inline flags other
 * than (?i:, unbalanced groups) is a load error naming the tokenizer file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tok_internal.h"

#define WORD_CHARS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_CHARS_X WORD_CHARS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define WORD_CLASS "[" WORD_CHARS_X "]"
#define NONWORD_CLASS "[^" WORD_CHARS_X "]"
#define ANY_CP "[\\s\\S]"

const char tok_js_space_class[] =
    "\\x{09}-\\x{0D}\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";
const char tok_uni_space_class[] = "\\p{White_Space}";

typedef struct rx_tr {
    const char *s;
    size_t n, i;
    tok_buf out;
    ember_error *err;
    const char *where;
    int fail;
} rx_tr;

static int tr_fail(rx_tr *t, const char *msg) {
    if (!t->fail)
        t->fail = ember_err(t->err, EMBER_ERR_FORMAT, "%s: unsupported regex syntax at offset %zu: %s", t->where,
                            t->i, msg);
    return t->fail;
}

static int puts_(tok_buf *b, const char *s) { return tok_buf_put(b, s, strlen(s)); }

static int put_cp_escape(tok_buf *b, uint32_t cp) {
    char tmp[16];
    int k = snprintf(tmp, sizeof tmp, "\\x{%X}", (unsigned)cp);
    return tok_buf_put(b, tmp, (size_t)k);
}

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_alnum(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Reads a code point of the pattern at t->i. */
static uint32_t peek_cp(const rx_tr *t, size_t at, size_t *len) {
    const unsigned char *p = (const unsigned char *)t->s + at, *e = (const unsigned char *)t->s + t->n;
    uint32_t cp;
    *len = tok_utf8_next(p, e, &cp);
    return cp;
}

/* Parses hex digits s[a..b) into *cp; false when empty / not hex / too big. */
static bool parse_hex(const char *s, size_t a, size_t b, uint32_t *cp) {
    if (a >= b || b - a > 8) return false;
    uint32_t v = 0;
    for (size_t k = a; k < b; k++) {
        if (!is_hex(s[k])) return false;
        char c = s[k];
        v = v * 16 + (uint32_t)(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
    *cp = v;
    return true;
}

/* A code-point escape at t->i ("\x{..}", "\xHH", "\uHHHH"): returns its
   length (0 when there is none) and the code point. */
static size_t cp_escape(const rx_tr *t, size_t at, uint32_t *cp) {
    const char *s = t->s;
    size_t n = t->n;
    if (at + 1 >= n || s[at] != '\\') return 0;
    char k = s[at + 1];
    if (k == 'x' && at + 2 < n && s[at + 2] == '{') {
        size_t e = at + 3;
        while (e < n && s[e] != '}') e++;
        if (e >= n || !parse_hex(s, at + 3, e, cp)) return 0;
        return e + 1 - at;
    }
    if (k == 'x' && at + 3 < n && is_hex(s[at + 2]) && is_hex(s[at + 3])) {
        parse_hex(s, at + 2, at + 4, cp);
        return 4;
    }
    if (k == 'u' && at + 5 < n && is_hex(s[at + 2]) && is_hex(s[at + 3]) && is_hex(s[at + 4]) &&
        is_hex(s[at + 5])) {
        if (!parse_hex(s, at + 2, at + 6, cp)) return 0;
        return 6;
    }
    return 0;
}

/* A \p{..} / \P{..} escape at `at`: length or 0. */
static size_t prop_escape(const rx_tr *t, size_t at, bool *neg, size_t *bs, size_t *be) {
    const char *s = t->s;
    size_t n = t->n;
    if (at + 2 >= n || s[at] != '\\' || (s[at + 1] != 'p' && s[at + 1] != 'P') || s[at + 2] != '{') return 0;
    size_t e = at + 3;
    while (e < n && s[e] != '}') e++;
    if (e >= n || e == at + 3) return 0;
    *neg = s[at + 1] == 'P';
    *bs = at + 3;
    *be = e;
    return e + 1 - at;
}

/* ---- character classes ------------------------------------------------------ */

typedef struct cls_op {
    tok_buf frag; /* PCRE2 class body (ranges as \x{..}, properties) */
    tok_buf alts; /* alternatives joined by '|' */
    size_t n_alts;
    bool any; /* something was added */
    /* literal ranges, for ASCII case folding */
    uint32_t (*rng)[2];
    size_t n_rng, cap_rng;
} cls_op;

static void cls_op_free(cls_op *o) {
    tok_buf_free(&o->frag);
    tok_buf_free(&o->alts);
    free(o->rng);
    memset(o, 0, sizeof *o);
}

static int cls_add_range(cls_op *o, uint32_t lo, uint32_t hi) {
    if (o->n_rng == o->cap_rng) {
        size_t cap = o->cap_rng ? o->cap_rng * 2 : 8;
        void *p = ember_realloc(o->rng, cap * sizeof *o->rng);
        if (!p) return EMBER_ERR_NOMEM;
        o->rng = p;
        o->cap_rng = cap;
    }
    o->rng[o->n_rng][0] = lo;
    o->rng[o->n_rng][1] = hi;
    o->n_rng++;
    o->any = true;
    if (put_cp_escape(&o->frag, lo)) return EMBER_ERR_NOMEM;
    if (hi != lo) {
        if (tok_buf_putc(&o->frag, '-') || put_cp_escape(&o->frag, hi)) return EMBER_ERR_NOMEM;
    }
    return EMBER_OK;
}

static int cls_add_alt(cls_op *o, const char *atom, size_t n) {
    o->any = true;
    if (o->n_alts && tok_buf_putc(&o->alts, '|')) return EMBER_ERR_NOMEM;
    o->n_alts++;
    return tok_buf_put(&o->alts, atom, n);
}

/* Compiles an operand to one atom matching one code point. */
static int cls_op_atom(cls_op *o, bool fold, tok_buf *out) {
    if (fold) { /* ASCII case folding of literal ranges */
        size_t n = o->n_rng;
        for (size_t k = 0; k < n; k++) {
            uint32_t lo = o->rng[k][0], hi = o->rng[k][1];
            uint32_t a = lo > 'a' ? lo : 'a', b = hi < 'z' ? hi : 'z';
            if (a <= b && cls_add_range(o, a - 32, b - 32)) return EMBER_ERR_NOMEM;
            a = lo > 'A' ? lo : 'A';
            b = hi < 'Z' ? hi : 'Z';
            if (a <= b && cls_add_range(o, a + 32, b + 32)) return EMBER_ERR_NOMEM;
        }
    }
    bool has_frag = o->frag.n > 0;
    if (!o->n_alts) {
        if (tok_buf_putc(out, '[') || tok_buf_put(out, o->frag.p, o->frag.n) || tok_buf_putc(out, ']'))
            return EMBER_ERR_NOMEM;
        return EMBER_OK;
    }
    if (puts_(out, "(?:")) return EMBER_ERR_NOMEM;
    if (has_frag) {
        if (tok_buf_putc(out, '[') || tok_buf_put(out, o->frag.p, o->frag.n) || puts_(out, "]|"))
            return EMBER_ERR_NOMEM;
    }
    if (tok_buf_put(out, o->alts.p, o->alts.n) || tok_buf_putc(out, ')')) return EMBER_ERR_NOMEM;
    return EMBER_OK;
}

static const struct {
    const char *name, *frag;
} k_posix[] = {
    {"alpha", "\\p{Alphabetic}"},
    {"alnum", "\\p{Alphabetic}\\p{Nd}"},
    {"digit", "\\p{Nd}"},
    {"lower", "\\p{Lowercase}"},
    {"upper", "\\p{Uppercase}"},
    {"space", "\\p{White_Space}"},
    {"blank", "\\x{09}\\p{Zs}"},
    {"punct", "\\p{P}\\p{S}"},
    {"cntrl", "\\p{Cc}"},
    {"word", WORD_CHARS},
    {"xdigit", "0-9A-Fa-f"},
};

static int parse_class(rx_tr *t, bool fold, int depth, tok_buf *out);

/* One class element at t->i: a literal (returns 1, *cp), a set added to o
   (returns 2), or an error (< 0). */
static int class_elem(rx_tr *t, cls_op *o, bool fold, int depth, uint32_t *cp) {
    const char *s = t->s;
    size_t n = t->n, i = t->i;
    if (s[i] == '\\') {
        size_t l;
        bool neg;
        size_t bs, be;
        if ((l = prop_escape(t, i, &neg, &bs, &be))) {
            t->i += l;
            if (be - bs == 4 && memcmp(s + bs, "Word", 4) == 0) {
                if (neg) return cls_add_alt(o, NONWORD_CLASS, strlen(NONWORD_CLASS)) ? EMBER_ERR_NOMEM : 2;
                o->any = true;
                return puts_(&o->frag, WORD_CHARS_X) ? EMBER_ERR_NOMEM : 2;
            }
            o->any = true;
            return tok_buf_put(&o->frag, s + i, l) ? EMBER_ERR_NOMEM : 2;
        }
        if ((l = cp_escape(t, i, cp))) {
            t->i += l;
            return 1;
        }
        if (i + 1 >= n) return tr_fail(t, "unterminated escape in a character class");
        size_t cl;
        uint32_t c = peek_cp(t, i + 1, &cl);
        t->i = i + 1 + cl;
        const char *set = NULL, *alt = NULL;
        switch (c) {
        case 'n': *cp = '\n'; return 1;
        case 'r': *cp = '\r'; return 1;
        case 't': *cp = '\t'; return 1;
        case 'f': *cp = '\f'; return 1;
        case 'v': *cp = 0x0B; return 1;
        case 'a': *cp = 0x07; return 1;
        case 'e': *cp = 0x1B; return 1;
        case '0': *cp = 0; return 1;
        case 'h': set = "0-9A-Fa-f"; break;
        case 'w': set = WORD_CHARS; break;
        case 'd': set = "\\p{Nd}"; break;
        case 'D': set = "\\P{Nd}"; break;
        case 's': set = "\\p{White_Space}"; break;
        case 'S': set = "\\P{White_Space}"; break;
        case 'W': alt = "[^" WORD_CHARS "]"; break;
        case 'H': alt = "[^0-9A-Fa-f]"; break;
        case 'b': *cp = 0x08; return 1;
        default:
            if (c < 0x80 && is_alnum((char)c)) return tr_fail(t, "unknown escape in a character class");
            *cp = c; /* an escaped literal */
            return 1;
        }
        if (set) {
            o->any = true;
            return puts_(&o->frag, set) ? EMBER_ERR_NOMEM : 2;
        }
        return cls_add_alt(o, alt, strlen(alt)) ? EMBER_ERR_NOMEM : 2;
    }
    if (s[i] == '[') {
        /* POSIX bracket [:name:] / [:^name:] */
        if (i + 1 < n && s[i + 1] == ':') {
            size_t e = i + 2;
            bool neg = e < n && s[e] == '^';
            if (neg) e++;
            size_t ns = e;
            while (e < n && is_alpha(s[e])) e++;
            if (e + 1 < n && s[e] == ':' && s[e + 1] == ']' && e > ns) {
                for (size_t k = 0; k < EMBER_ARRAY_LEN(k_posix); k++) {
                    if (strlen(k_posix[k].name) == e - ns && memcmp(k_posix[k].name, s + ns, e - ns) == 0) {
                        t->i = e + 2;
                        if (neg) {
                            tok_buf a = {0};
                            int rc = tok_buf_put(&a, "[^", 2) || puts_(&a, k_posix[k].frag) || tok_buf_putc(&a, ']');
                            if (!rc) rc = cls_add_alt(o, a.p, a.n);
                            tok_buf_free(&a);
                            return rc ? EMBER_ERR_NOMEM : 2;
                        }
                        o->any = true;
                        return puts_(&o->frag, k_posix[k].frag) ? EMBER_ERR_NOMEM : 2;
                    }
                }
                return tr_fail(t, "unknown POSIX class");
            }
        }
        tok_buf a = {0};
        int rc = parse_class(t, fold, depth + 1, &a);
        if (!rc) rc = cls_add_alt(o, a.p, a.n);
        tok_buf_free(&a);
        return rc ? rc : 2;
    }
    size_t cl;
    *cp = peek_cp(t, i, &cl);
    t->i = i + cl;
    return 1;
}

/* Parses a class starting at t->i == '['; appends one atom to out. */
static int parse_class(rx_tr *t, bool fold, int depth, tok_buf *out) {
    if (depth > 32) return tr_fail(t, "character classes nested too deeply");
    const char *s = t->s;
    size_t n = t->n;
    size_t start = t->i;
    t->i++;
    bool neg = t->i < n && s[t->i] == '^';
    if (neg) t->i++;
    size_t first = t->i;
    cls_op ops[8];
    size_t n_ops = 1;
    memset(ops, 0, sizeof ops);
    int rc = EMBER_OK;
    for (;;) {
        if (t->i >= n) {
            rc = tr_fail(t, "unterminated character class");
            break;
        }
        cls_op *o = &ops[n_ops - 1];
        if (s[t->i] == ']' && t->i != first) {
            t->i++;
            break;
        }
        if (s[t->i] == '&' && t->i + 1 < n && s[t->i + 1] == '&') {
            if (!o->any || n_ops == EMBER_ARRAY_LEN(ops)) {
                rc = tr_fail(t, "bad class intersection");
                break;
            }
            n_ops++;
            t->i += 2;
            continue;
        }
        if (s[t->i] == ']') { /* ']' first: a literal */
            t->i++;
            rc = cls_add_range(o, ']', ']');
            if (rc) break;
            continue;
        }
        uint32_t lo;
        int k = class_elem(t, o, fold, depth, &lo);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k == 2) continue;
        /* a literal: maybe the start of a range */
        if (t->i + 1 < n && s[t->i] == '-' && s[t->i + 1] != ']' &&
            !(s[t->i + 1] == '&' && t->i + 2 < n && s[t->i + 2] == '&')) {
            t->i++;
            uint32_t hi;
            k = class_elem(t, o, fold, depth, &hi);
            if (k < 0) {
                rc = k;
                break;
            }
            if (k == 2 || hi < lo) {
                rc = tr_fail(t, "bad range in a character class");
                break;
            }
            rc = cls_add_range(o, lo, hi);
        } else {
            rc = cls_add_range(o, lo, lo);
        }
        if (rc) break;
    }
    if (!rc && !ops[n_ops - 1].any) rc = tr_fail(t, "empty character class");
    tok_buf atom = {0};
    if (!rc) {
        if (n_ops == 1 && ops[0].n_alts == 0) {
            rc = cls_op_atom(&ops[0], fold, &atom); /* may add fold ranges */
            if (!rc && neg) {
                atom.n = 0;
                rc = tok_buf_put(&atom, "[^", 2) || tok_buf_put(&atom, ops[0].frag.p, ops[0].frag.n) ||
                     tok_buf_putc(&atom, ']');
            }
        } else {
            tok_buf pos = {0};
            if (n_ops > 1) {
                rc = puts_(&pos, "(?:");
                for (size_t k = 1; !rc && k < n_ops; k++) {
                    rc = puts_(&pos, "(?=");
                    if (!rc) rc = cls_op_atom(&ops[k], fold, &pos);
                    if (!rc) rc = tok_buf_putc(&pos, ')');
                }
                if (!rc) rc = cls_op_atom(&ops[0], fold, &pos);
                if (!rc) rc = tok_buf_putc(&pos, ')');
            } else {
                rc = cls_op_atom(&ops[0], fold, &pos);
            }
            if (!rc) {
                if (neg)
                    rc = puts_(&atom, "(?:(?!") || tok_buf_put(&atom, pos.p, pos.n) || puts_(&atom, ")" ANY_CP ")");
                else
                    rc = tok_buf_put(&atom, pos.p, pos.n);
            }
            tok_buf_free(&pos);
        }
        if (rc > 0) rc = EMBER_ERR_NOMEM;
    }
    if (!rc) rc = tok_buf_put(out, atom.p, atom.n);
    tok_buf_free(&atom);
    for (size_t k = 0; k < EMBER_ARRAY_LEN(ops); k++) cls_op_free(&ops[k]);
    (void)start;
    return rc;
}

/* ---- the whole pattern ------------------------------------------------------- */

/* What the translation of the whole pattern tracks besides rx_tr: where the
   last atom starts in the output (for a repeat that wraps it; -1: none),
   whether a quantifier was just written (a '+' after one is possessive),
   ASCII case folding inside (?i:...), and the open groups. */
typedef struct tr_state {
    long atom_start;
    bool last_quant, fold;
    struct {
        long start;
        bool fold;
    } stack[256];
    size_t depth;
} tr_state;

/* The helpers below return 0 (go on; a syntax error is left in t->fail),
   TR_NOMEM when the output could not grow, or another error code of
   parse_class. */
#define TR_NOMEM 1

/* Writes one atom (a unit a quantifier applies to) to the output. */
static int emit_atom(rx_tr *t, tr_state *st, const char *str, size_t len) {
    st->atom_start = (long)t->out.n;
    st->last_quant = false;
    return tok_buf_put(&t->out, str, len) ? TR_NOMEM : 0;
}
static int emit_atom_s(rx_tr *t, tr_state *st, const char *str) {
    return emit_atom(t, st, str, strlen(str));
}

/* A code point as a literal atom: [xX] under ASCII folding, escaped when it
   is ASCII punctuation (escape_punct), else its own bytes (src[at..at+len)). */
static int emit_literal(rx_tr *t, tr_state *st, uint32_t cp, bool escape_punct, size_t at, size_t len) {
    if (st->fold && cp < 0x80 && is_alpha((char)cp)) {
        char b[5] = {'[', (char)(cp | 32), (char)(cp & ~32u), ']', 0};
        return emit_atom(t, st, b, 4);
    }
    if (escape_punct) {
        st->atom_start = (long)t->out.n;
        st->last_quant = false;
        return put_cp_escape(&t->out, cp) ? TR_NOMEM : 0;
    }
    return emit_atom(t, st, t->s + at, len);
}

/* The PCRE2 text of the one-letter escape \e that has a fixed rewrite, or
   NULL. \G (a no-op here) is "". */
static const char *letter_escape(uint32_t e) {
    switch (e) {
    case 'G': return "";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\f': return "\\f";
    case 0x0B: case 'v': return "\\x{0B}";
    case 'A': return "(?<!" ANY_CP ")";
    case 'z': return "(?!" ANY_CP ")";
    case 'Z': return "(?=\\n?(?!" ANY_CP "))";
    case 'h': return "[0-9A-Fa-f]";
    case 'H': return "[^0-9A-Fa-f]";
    case 'w': return WORD_CLASS;
    case 'W': return NONWORD_CLASS;
    case 'd': return "\\p{Nd}";
    case 'D': return "\\P{Nd}";
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'b': return "(?:(?<!" WORD_CLASS ")(?=" WORD_CLASS ")|(?<=" WORD_CLASS ")(?!" WORD_CLASS "))";
    case 'B': return "(?:(?<!" WORD_CLASS ")(?!" WORD_CLASS ")|(?<=" WORD_CLASS ")(?=" WORD_CLASS "))";
    case 'a': return "\\x{07}";
    case 'e': return "\\x{1B}";
    default: return NULL;
    }
}

/* A backslash escape at t->i: a property (\p{..}), a code point (\xHH,
   \uHHHH, ...), a fixed rewrite, a PCRE2 escape that means the same, or an
   escaped literal. Advances t->i past it. */
static int tr_escape(rx_tr *t, tr_state *st) {
    const char *src = t->s;
    size_t l, bs, be;
    bool neg;
    uint32_t cp;
    if ((l = prop_escape(t, t->i, &neg, &bs, &be))) {
        size_t at = t->i;
        t->i += l;
        if (be - bs == 4 && memcmp(src + bs, "Word", 4) == 0) return emit_atom_s(t, st, neg ? NONWORD_CLASS : WORD_CLASS);
        return emit_atom(t, st, src + at, l);
    }
    if ((l = cp_escape(t, t->i, &cp))) {
        t->i += l;
        return emit_literal(t, st, cp, true, 0, 0);
    }
    if (t->i + 1 >= t->n) {
        tr_fail(t, "pattern ends with a backslash");
        return 0;
    }
    size_t cl;
    uint32_t e = peek_cp(t, t->i + 1, &cl);
    t->i += 1 + cl;
    const char *fixed = letter_escape(e);
    if (fixed) return *fixed ? emit_atom_s(t, st, fixed) : 0;
    if (e < 0x80 && is_alnum((char)e)) {
        char b[3] = {'\\', (char)e, 0};
        if (e == 'n' || e == 'r' || e == 't' || e == 'f' || (e >= '0' && e <= '9')) return emit_atom(t, st, b, 2);
        tr_fail(t, "unknown escape");
        return 0;
    }
    /* an escaped literal */
    st->atom_start = (long)t->out.n;
    st->last_quant = false;
    return put_cp_escape(&t->out, e) ? TR_NOMEM : 0;
}

/* An opening '(' at t->i: (?i:...) turns ASCII folding on and becomes
   (?:, (?>...) becomes (?:, lookarounds, (?:, (?<name> and plain groups pass
   through; other (? forms are unsupported. Pushes the group. */
static int tr_group_open(rx_tr *t, tr_state *st) {
    if (st->depth == EMBER_ARRAY_LEN(st->stack)) {
        tr_fail(t, "groups nested too deeply");
        return 0;
    }
    const char *p = t->s + t->i;
    size_t left = t->n - t->i, pl;
    const char *emit;
    bool new_fold = st->fold;
    if (left >= 4 && memcmp(p, "(?i:", 4) == 0) {
        emit = "(?:";
        pl = 4;
        new_fold = true;
    } else if (left >= 4 && (memcmp(p, "(?<=", 4) == 0 || memcmp(p, "(?<!", 4) == 0)) {
        emit = NULL;
        pl = 4;
    } else if (left >= 3 && (memcmp(p, "(?:", 3) == 0 || memcmp(p, "(?=", 3) == 0 || memcmp(p, "(?!", 3) == 0)) {
        emit = NULL;
        pl = 3;
    } else if (left >= 3 && memcmp(p, "(?>", 3) == 0) {
        emit = "(?:";
        pl = 3;
    } else if (left >= 3 && memcmp(p, "(?<", 3) == 0 && left > 3 && (is_alpha(p[3]) || p[3] == '_')) {
        size_t e = 3;
        while (e < left && (is_alnum(p[e]) || p[e] == '_')) e++;
        if (e >= left || p[e] != '>') {
            tr_fail(t, "bad group name");
            return 0;
        }
        emit = NULL;
        pl = e + 1;
    } else if (left >= 2 && p[1] == '?') {
        tr_fail(t, "unsupported group or inline flag");
        return 0;
    } else {
        emit = NULL;
        pl = 1;
    }
    st->stack[st->depth].start = (long)t->out.n;
    st->stack[st->depth].fold = st->fold;
    st->depth++;
    st->fold = new_fold;
    if (emit ? puts_(&t->out, emit) : tok_buf_put(&t->out, p, pl)) return TR_NOMEM;
    st->last_quant = false;
    t->i += pl;
    return 0;
}

/* A closing ')': pops the group, which becomes the atom a quantifier after
   it applies to. */
static int tr_group_close(rx_tr *t, tr_state *st) {
    if (!st->depth) {
        tr_fail(t, "unbalanced ')'");
        return 0;
    }
    if (tok_buf_putc(&t->out, ')')) return TR_NOMEM;
    st->depth--;
    st->atom_start = st->stack[st->depth].start;
    st->fold = st->stack[st->depth].fold;
    st->last_quant = false;
    t->i++;
    return 0;
}

/* A '{' at t->i: a counted repeat {n}, {n,}, {n,m}, {,m} ({,m} becomes
   {0,m}; X{n,m}+ and X{n,m}* repeat the repeat, as Oniguruma does), or a
   literal '{' when it is none or follows no atom. */
static int tr_repeat(rx_tr *t, tr_state *st) {
    const char *src = t->s;
    tok_buf *o = &t->out;
    size_t n = t->n, e = t->i + 1, d1 = 0, d2 = 0;
    bool comma = false;
    while (e < n && src[e] >= '0' && src[e] <= '9') e++, d1++;
    if (e < n && src[e] == ',') {
        comma = true;
        e++;
        while (e < n && src[e] >= '0' && src[e] <= '9') e++, d2++;
    }
    bool ok = e < n && src[e] == '}' && (d1 > 0 || (comma && d2 > 0)) && d1 <= 5 && d2 <= 5;
    if (!ok || st->atom_start < 0) {
        t->i++;
        return emit_atom_s(t, st, "\\{");
    }
    char body[16];
    int bl = 0;
    if (d1 == 0) body[bl++] = '0';
    memcpy(body + bl, src + t->i + 1, e - t->i - 1);
    bl += (int)(e - t->i - 1);
    body[bl] = 0;
    t->i = e + 1;
    st->last_quant = true;
    if (!(t->i < n && (src[t->i] == '+' || src[t->i] == '*')))
        return tok_buf_putc(o, '{') || puts_(o, body) || tok_buf_putc(o, '}') ? TR_NOMEM : 0;
    /* Oniguruma: X{n,m}+ repeats the repeat */
    tok_buf g = {0};
    size_t as = (size_t)st->atom_start;
    int r = puts_(&g, "(?:") || tok_buf_put(&g, o->p + as, o->n - as) || tok_buf_putc(&g, '{') || puts_(&g, body) ||
            tok_buf_putc(&g, '}') || tok_buf_putc(&g, ')') || tok_buf_putc(&g, src[t->i]);
    if (!r) {
        o->n = as;
        r = tok_buf_put(o, g.p, g.n);
    }
    tok_buf_free(&g);
    t->i++;
    return r ? TR_NOMEM : 0;
}

/* One piece of the pattern at t->i (an escape, a class, a group, an
   alternation, a quantifier or a literal), written to t->out. */
static int tr_piece(rx_tr *t, tr_state *st) {
    char c = t->s[t->i];
    switch (c) {
    case '\\': return tr_escape(t, st);
    case '[': {
        long at = (long)t->out.n;
        int rc = parse_class(t, st->fold, 0, &t->out);
        if (rc) return rc;
        st->atom_start = at;
        st->last_quant = false;
        return 0;
    }
    case ']': t->i++; return emit_atom_s(t, st, "\\]");
    case '.': t->i++; return emit_atom_s(t, st, "[^\\n]");
    case '^': t->i++; return emit_atom_s(t, st, "(?:(?<!" ANY_CP ")|(?<=\\n))");
    case '$': t->i++; return emit_atom_s(t, st, "(?:(?=\\n)|(?!" ANY_CP "))");
    case '(': return tr_group_open(t, st);
    case ')': return tr_group_close(t, st);
    case '|':
        t->i++;
        st->atom_start = -1;
        st->last_quant = false;
        return tok_buf_putc(&t->out, '|') ? TR_NOMEM : 0;
    case '{': return tr_repeat(t, st);
    case '}': t->i++; return emit_atom_s(t, st, "\\}");
    case '+':
        t->i++;
        if (st->last_quant) return 0; /* possessive: dropped */
        st->last_quant = true;
        return tok_buf_putc(&t->out, '+') ? TR_NOMEM : 0;
    case '*':
    case '?':
        t->i++;
        st->last_quant = true;
        return tok_buf_putc(&t->out, c) ? TR_NOMEM : 0;
    default: {
        size_t cl;
        uint32_t cp = peek_cp(t, t->i, &cl);
        t->i += cl;
        bool punct = cp < 0x80 && !is_alnum((char)cp) && cp != ' ' && cp != '_';
        return emit_literal(t, st, cp, punct, t->i - cl, cl);
    }
    }
}

int tok_regex_translate(const char *src, size_t n, char **out, size_t *out_n, ember_error *err,
                        const char *where) {
    if (n > TOK_MAX_PATTERN_BYTES)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: regex of %zu bytes (limit %u)", where, n, TOK_MAX_PATTERN_BYTES);
    if (!tok_utf8_valid(src, n)) return ember_err(err, EMBER_ERR_FORMAT, "%s: regex is not valid UTF-8", where);
    rx_tr t = {src, n, 0, {0}, err, where, 0};
    tr_state st = {.atom_start = -1};
    int rc = EMBER_OK;
    while (!rc && t.i < n && !t.fail) rc = tr_piece(&t, &st);
    if (!rc && !t.fail && st.depth) tr_fail(&t, "unbalanced '('");
    if (!rc && !t.fail && !t.out.p && tok_buf_reserve(&t.out, 1)) rc = TR_NOMEM;
    if (rc || t.fail) {
        tok_buf_free(&t.out);
        if (rc == TR_NOMEM || rc == EMBER_ERR_NOMEM) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", where);
        return t.fail ? t.fail : rc;
    }
    *out = t.out.p;
    *out_n = t.out.n;
    return EMBER_OK;
}

int tok_regex_compile_raw(const char *pcre, size_t n, pcre2_code **out, ember_error *err, const char *where) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", where);
    pcre2_set_max_pattern_length(cc, (PCRE2_SIZE)1 << 22);
    pcre2_set_parens_nest_limit(cc, 250);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pcre, n, PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ember_err(err, EMBER_ERR_FORMAT, "%s: regex does not compile: %s", where, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    *out = re;
    return EMBER_OK;
}

int tok_pattern_init(tok_pattern *p, bool is_regex, const char *text, size_t n, ember_error *err,
                     const char *where) {
    memset(p, 0, sizeof *p);
    if (n > TOK_MAX_PATTERN_BYTES)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: pattern of %zu bytes (limit %u)", where, n, TOK_MAX_PATTERN_BYTES);
    if (!is_regex) {
        p->lit = ember_malloc(n + 1);
        if (!p->lit) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", where);
        if (n) memcpy(p->lit, text, n);
        p->lit[n] = 0;
        p->lit_n = n;
        return EMBER_OK;
    }
    char *tr;
    size_t tn;
    int rc = tok_regex_translate(text, n, &tr, &tn, err, where);
    if (rc) return rc;
    rc = tok_regex_compile_raw(tr, tn, &p->re, err, where);
    free(tr);
    if (rc) return rc;
    p->is_regex = true;
    uint32_t caps = 0;
    pcre2_pattern_info(p->re, PCRE2_INFO_CAPTURECOUNT, &caps);
    p->n_caps = caps;
    return EMBER_OK;
}

void tok_pattern_free(tok_pattern *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

int tok_rx_init(tok_rx *rx, uint32_t max_caps) {
    memset(rx, 0, sizeof *rx);
    rx->ovec_pairs = max_caps + 1;
    rx->md = pcre2_match_data_create(rx->ovec_pairs, NULL);
    rx->mctx = pcre2_match_context_create(NULL);
    rx->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!rx->md || !rx->mctx) {
        tok_rx_free(rx);
        return EMBER_ERR_NOMEM;
    }
    pcre2_set_match_limit(rx->mctx, TOK_REGEX_MATCH_LIMIT);
    pcre2_set_depth_limit(rx->mctx, 100000);
    if (rx->jit) pcre2_jit_stack_assign(rx->mctx, NULL, rx->jit);
    return EMBER_OK;
}

void tok_rx_free(tok_rx *rx) {
    if (rx->md) pcre2_match_data_free(rx->md);
    if (rx->mctx) pcre2_match_context_free(rx->mctx);
    if (rx->jit) pcre2_jit_stack_free(rx->jit);
    memset(rx, 0, sizeof *rx);
}

int tok_pattern_find(const tok_pattern *p, tok_rx *rx, const char *s, size_t n, size_t from, size_t *ms,
                     size_t *me, ember_error *err) {
    if (from > n) return 0;
    if (!p->is_regex) {
        if (p->lit_n == 0) {
            *ms = *me = from;
            return 1;
        }
        if (p->lit_n > n - from) return 0;
        const char first = p->lit[0];
        const char *q = s + from, *end = s + n - p->lit_n + 1;
        while (q < end) {
            q = memchr(q, first, (size_t)(end - q));
            if (!q) return 0;
            if (memcmp(q, p->lit, p->lit_n) == 0) {
                *ms = (size_t)(q - s);
                *me = *ms + p->lit_n;
                return 1;
            }
            q++;
        }
        return 0;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, rx->md, rx->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return ember_err(err, EMBER_ERR_LIMIT, "pre-tokenizer regex gave up on the input: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rx->md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) *me = *ms; /* \K tricks cannot occur (translated patterns), but stay safe */
    return 1;
}

bool tok_rx_group(const tok_rx *rx, uint32_t g, size_t *gs, size_t *ge) {
    if (g >= pcre2_get_ovector_count(rx->md)) return false;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rx->md);
    if (ov[2 * g] == PCRE2_UNSET) return false;
    *gs = ov[2 * g];
    *ge = ov[2 * g + 1];
    return true;
}

/* JS GetSubstitution for one match. */
static int substitute(const tok_pattern *p, tok_rx *rx, const char *s, size_t n, size_t ms, size_t me,
                      const char *c, size_t cn, tok_buf *out) {
    for (size_t k = 0; k < cn; k++) {
        if (c[k] != '$' || k + 1 >= cn) {
            if (tok_buf_putc(out, c[k])) return EMBER_ERR_NOMEM;
            continue;
        }
        char d = c[k + 1];
        if (d == '$') {
            if (tok_buf_putc(out, '$')) return EMBER_ERR_NOMEM;
            k++;
        } else if (d == '&') {
            if (tok_buf_put(out, s + ms, me - ms)) return EMBER_ERR_NOMEM;
            k++;
        } else if (d == '`') {
            if (tok_buf_put(out, s, ms)) return EMBER_ERR_NOMEM;
            k++;
        } else if (d == '\'') {
            if (tok_buf_put(out, s + me, n - me)) return EMBER_ERR_NOMEM;
            k++;
        } else if (d >= '0' && d <= '9' && p->is_regex) {
            uint32_t g = (uint32_t)(d - '0'), used = 2;
            if (k + 2 < cn && c[k + 2] >= '0' && c[k + 2] <= '9') {
                uint32_t g2 = g * 10 + (uint32_t)(c[k + 2] - '0');
                if (g2 >= 1 && g2 <= p->n_caps) {
                    g = g2;
                    used = 3;
                }
            }
            if (g < 1 || g > p->n_caps) {
                if (tok_buf_putc(out, '$')) return EMBER_ERR_NOMEM;
                continue;
            }
            size_t gs, ge;
            if (tok_rx_group(rx, g, &gs, &ge) && tok_buf_put(out, s + gs, ge - gs)) return EMBER_ERR_NOMEM;
            k += used - 1;
        } else {
            if (tok_buf_putc(out, '$')) return EMBER_ERR_NOMEM;
        }
    }
    return EMBER_OK;
}

int tok_pattern_replace_all(const tok_pattern *p, tok_rx *rx, const char *s, size_t n, const char *content,
                            size_t content_n, tok_buf *out, ember_error *err) {
    bool plain = memchr(content, '$', content_n) == NULL;
    size_t pos = 0, last = 0;
    while (pos <= n) {
        size_t ms, me;
        int rc = tok_pattern_find(p, rx, s, n, pos, &ms, &me, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (tok_buf_put(out, s + last, ms - last)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        if (plain ? tok_buf_put(out, content, content_n) : substitute(p, rx, s, n, ms, me, content, content_n, out))
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        last = me;
        if (me == ms) {
            if (me >= n) break;
            pos = me + tok_utf8_len((unsigned char)s[me]);
        } else {
            pos = me;
        }
    }
    if (tok_buf_put(out, s + last, n - last)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return EMBER_OK;
}
