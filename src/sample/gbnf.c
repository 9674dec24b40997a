/* gbnf.c - see gbnf.h.
 *
 * Compilation: a recursive-descent parser writes each rule's alternatives
 * as flat element lists (a byte set, a reference to a rule, END closing an
 * alternative). Everything becomes rules of byte sets: a literal is one
 * single-byte set per UTF-8 byte; a class with characters beyond ASCII is
 * a rule whose alternatives are the UTF-8 byte-range sequences of its code
 * point ranges; a group is a rule; x* is a rule R ::= x R | (empty), x{m,n}
 * is m copies of x and a chain of n - m optional ones. Then the checks
 * (defined, not left recursive, able to finish) and one flat program.
 *
 * Matching: a stack's top is the position of the byte set it reads next;
 * below it, where to go on in each rule that called. A byte advances each
 * stack whose set holds it; the closure then pops finished alternatives and
 * expands references (a reference in last place replaces its caller's entry
 * instead of stacking on it, so right recursion and repetition do not grow
 * the stack). An empty stack is a complete output.
 *
 * Ownership: the program owns its arrays; a cache owns its states and
 * scratch and borrows the program.
 */
#include "gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "regex.h"

#define END (-1)
#define REF(r) (-(r)-2)
#define IS_REF(c) ((c) <= -2)
#define REF_RULE(c) (-(c)-2)
#define BIG (1 << 28)
#define MAX_CLASS_RANGES 1024
#define MAX_STEPS 8192         /* closure expansions per byte */
#define MAX_STATE_INTS 16384   /* ints of one state */
#define CACHE_SOFT 2048        /* states kept across gb_cache_trim */
#define CACHE_HARD 8192        /* states at most (8 MiB of transitions) */

/* ---- the program ------------------------------------------------------------------------------ */

struct gb_prog {
    int n_rules, root;
    int32_t *el;      /* [n_el] codes: >= 0 a byte set, END, REF(r) */
    int32_t *minrest; /* [n_el] fewest bytes from the position to its alternative's end */
    int n_el;
    int32_t *alt0;    /* [n_rules + 1] rule r's alternatives: alts[alt0[r] .. alt0[r + 1]) */
    int32_t *alts;    /* start positions */
    uint64_t (*sets)[4];
    int n_sets;
};

void gb_prog_free(gb_prog *p) {
    if (!p) return;
    free(p->el);
    free(p->minrest);
    free(p->alt0);
    free(p->alts);
    free(p->sets);
    free(p);
}

int gb_prog_min_bytes(const gb_prog *p) {
    int v = BIG;
    for (int a = p->alt0[p->root]; a < p->alt0[p->root + 1]; a++)
        if (p->minrest[p->alts[a]] < v) v = p->minrest[p->alts[a]];
    return v;
}

/* ---- building -------------------------------------------------------------------------------- */

typedef struct ibuf {
    int32_t *v;
    int n, cap;
} ibuf;

typedef struct brule {
    const char *name; /* into the source; generated rules: their parent's */
    int nlen;
    bool defined, generated;
    int line, col; /* the definition (the first reference until then) */
    ibuf body;     /* alternatives, each closed by END */
} brule;

typedef struct builder {
    const char *src, *p, *end;
    brule *rules;
    int n_rules, cap_rules;
    uint64_t (*sets)[4];
    int n_sets, cap_sets;
    int32_t single[256]; /* the set of each single byte (-1: not made yet) */
    long total;          /* elements written */
    int depth;
    int cur;             /* the rule being defined (names generated rules) */
    ember_error *err;
    const char *what; /* a regular expression's field (NULL: GBNF text) */
    bool failed;
} builder;

/* Line and column (from 1) of s in the source. */
static void where(const builder *b, const char *s, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *q = b->src; q < s && q < b->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)*q & 0xc0) != 0x80) {
            (*col)++;
        }
    }
}

/* Fails at s (NULL: no position) with the formatted problem. */
static int bfail(builder *b, const char *s, int code, const char *fmt, ...) EMBER_PRINTF(4, 5);
static int bfail(builder *b, const char *s, int code, const char *fmt, ...) {
    if (b->failed) return -1;
    b->failed = true;
    char msg[EMBER_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->what) {
        ember_err(b->err, code, "%s: %s", b->what, msg);
    } else if (s) {
        int l, c;
        where(b, s, &l, &c);
        ember_err(b->err, code, "grammar: line %d, column %d: %s", l, c, msg);
    } else {
        ember_err(b->err, code, "grammar: %s", msg);
    }
    return -1;
}

static int push_int(builder *b, ibuf *v, int32_t x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 16;
        int32_t *nv = ember_realloc(v->v, (size_t)cap * sizeof *nv);
        if (!nv) return bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory");
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

/* Appends an element to rule r's body (counted against GB_MAX_ELEMS). */
static int emit(builder *b, int r, int32_t code) {
    if (++b->total > GB_MAX_ELEMS)
        return bfail(b, b->p, EMBER_ERR_LIMIT, "the grammar is too large (over %d elements once repetitions are expanded)",
                     GB_MAX_ELEMS);
    return push_int(b, &b->rules[r].body, code);
}

/* A new rule (named name[0..nlen) or generated from the current rule). */
static int new_rule(builder *b, const char *name, int nlen, bool generated, const char *at) {
    if (b->n_rules == GB_MAX_RULES)
        return bfail(b, at, EMBER_ERR_LIMIT, "the grammar has too many rules (over %d, groups and repetitions included)",
                     GB_MAX_RULES);
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 32;
        brule *nr = ember_realloc(b->rules, (size_t)cap * sizeof *nr);
        if (!nr) return bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory");
        b->rules = nr;
        b->cap_rules = cap;
    }
    brule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->generated = generated;
    r->name = generated && b->cur >= 0 ? b->rules[b->cur].name : name;
    r->nlen = generated && b->cur >= 0 ? b->rules[b->cur].nlen : nlen;
    r->defined = generated;
    where(b, at, &r->line, &r->col);
    return b->n_rules++;
}

/* The rule named name[0..nlen), made (undefined) on first sight. */
static int rule_named(builder *b, const char *name, int nlen, const char *at) {
    for (int i = 0; i < b->n_rules; i++)
        if (!b->rules[i].generated && b->rules[i].nlen == nlen && !memcmp(b->rules[i].name, name, (size_t)nlen)) return i;
    return new_rule(b, name, nlen, false, at);
}

/* The index of byte set s (deduplicated for single bytes). */
static int add_set(builder *b, const uint64_t s[4]) {
    int single = -1, n = 0;
    for (int i = 0; i < 256; i++)
        if (s[i >> 6] >> (i & 63) & 1) {
            single = i;
            n++;
        }
    if (n == 1 && b->single[single] >= 0) return b->single[single];
    if (b->n_sets == b->cap_sets) {
        int cap = b->cap_sets ? b->cap_sets * 2 : 64;
        if (cap > GB_MAX_ELEMS) return bfail(b, b->p, EMBER_ERR_LIMIT, "the grammar has too many character classes");
        uint64_t(*ns)[4] = ember_realloc(b->sets, (size_t)cap * sizeof *ns);
        if (!ns) return bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory");
        b->sets = ns;
        b->cap_sets = cap;
    }
    memcpy(b->sets[b->n_sets], s, sizeof b->sets[0]);
    if (n == 1) b->single[single] = b->n_sets;
    return b->n_sets++;
}

static int byte_set(builder *b, int lo, int hi) {
    uint64_t s[4] = {0, 0, 0, 0};
    for (int i = lo; i <= hi; i++) s[i >> 6] |= 1ull << (i & 63);
    return add_set(b, s);
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when nl. */
static void skip_space(builder *b, bool nl) {
    while (b->p < b->end) {
        char c = *b->p;
        if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) {
            b->p++;
        } else if (c == '#') {
            while (b->p < b->end && *b->p != '\n') b->p++;
        } else if (c == '\r' && b->p + 1 < b->end && b->p[1] == '\n' && nl) {
            b->p++;
        } else {
            break;
        }
    }
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class (an escape or a UTF-8 sequence) at
   b->p: its code point, or -1 (failed). */
static long read_char(builder *b) {
    const char *at = b->p;
    unsigned char c = (unsigned char)*b->p;
    if (c == '\\') {
        if (b->p + 1 >= b->end) return bfail(b, at, EMBER_ERR_INVALID_ARG, "an escape at the end of the text");
        char e = b->p[1];
        b->p += 2;
        int n = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (n) {
            long v = 0;
            for (int i = 0; i < n; i++) {
                int h = b->p < b->end ? hexv(*b->p) : -1;
                if (h < 0) return bfail(b, at, EMBER_ERR_INVALID_ARG, "'\\%c' needs %d hexadecimal digits", e, n);
                v = v * 16 + h;
                b->p++;
            }
            if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
                return bfail(b, at, EMBER_ERR_INVALID_ARG, "'\\%c' names no character (U+%lX)", e, v);
            return v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return (unsigned char)e;
        default:
            return bfail(b, at, EMBER_ERR_INVALID_ARG, "unknown escape '\\%c' (\\n \\r \\t \\\\ \\\" \\[ \\] \\- \\x \\u \\U)",
                         e ? e : '0');
        }
    }
    int n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!n || b->p + n > b->end) return bfail(b, at, EMBER_ERR_INVALID_ARG, "the text is not valid UTF-8");
    long v = n == 1 ? c : c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        unsigned char k = (unsigned char)b->p[i];
        if ((k & 0xc0) != 0x80) return bfail(b, at, EMBER_ERR_INVALID_ARG, "the text is not valid UTF-8");
        v = v << 6 | (k & 0x3f);
    }
    static const long k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < k_min[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return bfail(b, at, EMBER_ERR_INVALID_ARG, "the text is not valid UTF-8");
    b->p += n;
    return v;
}

static int utf8_encode(long v, unsigned char *o) {
    if (v < 0x80) {
        o[0] = (unsigned char)v;
        return 1;
    }
    if (v < 0x800) {
        o[0] = (unsigned char)(0xc0 | v >> 6);
        o[1] = (unsigned char)(0x80 | (v & 0x3f));
        return 2;
    }
    if (v < 0x10000) {
        o[0] = (unsigned char)(0xe0 | v >> 12);
        o[1] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
        o[2] = (unsigned char)(0x80 | (v & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | v >> 18);
    o[1] = (unsigned char)(0x80 | (v >> 12 & 0x3f));
    o[2] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
    o[3] = (unsigned char)(0x80 | (v & 0x3f));
    return 4;
}

/* The UTF-8 byte-range sequences of code points [lo, hi] (no surrogates
   inside) as alternatives of rule r: each alternative one byte range per
   byte. Splits the range until every byte position spans a full range. */
static int utf8_ranges(builder *b, int r, long lo, long hi) {
    if (lo > hi || b->failed) return b->failed ? -1 : 0;
    static const long k_bound[3] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= k_bound[i] && hi > k_bound[i])
            return utf8_ranges(b, r, lo, k_bound[i]) || utf8_ranges(b, r, k_bound[i] + 1, hi) ? -1 : 0;
    unsigned char a[4], z[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, z);
    for (int i = 1; i < n; i++) {
        long m = (1L << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_ranges(b, r, lo, lo | m) || utf8_ranges(b, r, (lo | m) + 1, hi) ? -1 : 0;
            if ((hi & m) != m) return utf8_ranges(b, r, lo, (hi & ~m) - 1) || utf8_ranges(b, r, hi & ~m, hi) ? -1 : 0;
        }
    }
    for (int i = 0; i < n; i++) {
        int s = byte_set(b, a[i], z[i]);
        if (s < 0 || emit(b, r, s)) return -1;
    }
    return emit(b, r, END);
}

typedef struct crange {
    long lo, hi;
} crange;

static int cmp_range(const void *x, const void *y) {
    const crange *a = x, *c = y;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

/* Sorted, merged, negated when neg, surrogates cut out. Returns the count. */
static int normalize_ranges(crange *rg, int n, bool neg) {
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi) rg[m - 1].hi = rg[i].hi;
        } else {
            rg[m++] = rg[i];
        }
    }
    if (neg) {
        crange out[MAX_CLASS_RANGES + 2];
        int k = 0;
        long at = 0;
        for (int i = 0; i < m; i++) {
            if (rg[i].lo > at) out[k++] = (crange){at, rg[i].lo - 1};
            at = rg[i].hi + 1;
        }
        if (at <= 0x10ffff) out[k++] = (crange){at, 0x10ffff};
        memcpy(rg, out, (size_t)k * sizeof *rg);
        m = k;
    }
    int k = 0; /* cut [D800, DFFF] (may split one range in two) */
    crange out[MAX_CLASS_RANGES + 4];
    for (int i = 0; i < m; i++) {
        if (rg[i].lo < 0xd800) out[k++] = (crange){rg[i].lo, rg[i].hi < 0xd7ff ? rg[i].hi : 0xd7ff};
        if (rg[i].hi > 0xdfff) out[k++] = (crange){rg[i].lo > 0xe000 ? rg[i].lo : 0xe000, rg[i].hi};
    }
    memcpy(rg, out, (size_t)k * sizeof *rg);
    return k;
}

/* A class of code point ranges as one element of rule r: a byte set when
   it is all ASCII, else a reference to a rule of its UTF-8 sequences. rg
   has room for n + 2 ranges (normalize_ranges may add two). */
static int emit_class(builder *b, int r, crange *rg, int n, bool neg, const char *at) {
    n = normalize_ranges(rg, n, neg);
    if (n == 0) return bfail(b, at, EMBER_ERR_INVALID_ARG, "the character class matches no character");
    uint64_t s[4] = {0, 0, 0, 0};
    bool multi = false;
    for (int i = 0; i < n; i++) {
        for (long c = rg[i].lo; c <= rg[i].hi && c < 0x80; c++) s[c >> 6] |= 1ull << (c & 63);
        if (rg[i].hi >= 0x80) multi = true;
    }
    if (!multi) {
        int k = add_set(b, s);
        return k < 0 ? -1 : emit(b, r, k);
    }
    int g = new_rule(b, NULL, 0, true, at);
    if (g < 0) return -1;
    if (s[0] | s[1]) {
        int k = add_set(b, s);
        if (k < 0 || emit(b, g, k) || emit(b, g, END)) return -1;
    }
    for (int i = 0; i < n; i++)
        if (rg[i].hi >= 0x80 && utf8_ranges(b, g, rg[i].lo < 0x80 ? 0x80 : rg[i].lo, rg[i].hi)) return -1;
    return emit(b, r, REF(g));
}

/* [...] at b->p (the '['). */
static int parse_class(builder *b, int r) {
    const char *at = b->p++;
    bool neg = b->p < b->end && *b->p == '^';
    if (neg) b->p++;
    crange rg[MAX_CLASS_RANGES + 2];
    int n = 0;
    while (b->p < b->end && *b->p != ']') {
        if (n == MAX_CLASS_RANGES)
            return bfail(b, at, EMBER_ERR_LIMIT, "a character class of more than %d ranges", MAX_CLASS_RANGES);
        long lo = read_char(b), hi = lo;
        if (lo < 0) return -1;
        if (b->p + 1 < b->end && *b->p == '-' && b->p[1] != ']') {
            b->p++;
            hi = read_char(b);
            if (hi < 0) return -1;
            if (hi < lo) return bfail(b, at, EMBER_ERR_INVALID_ARG, "a range whose end comes before its start");
        }
        rg[n++] = (crange){lo, hi};
    }
    if (b->p >= b->end) return bfail(b, at, EMBER_ERR_INVALID_ARG, "an unterminated character class (no ']')");
    b->p++;
    if (n == 0 && !neg) return bfail(b, at, EMBER_ERR_INVALID_ARG, "an empty character class");
    return emit_class(b, r, rg, n, neg, at);
}

/* "..." at b->p: one single-byte set per byte. */
static int parse_literal(builder *b, int r) {
    const char *at = b->p++;
    while (b->p < b->end && *b->p != '"') {
        long v = read_char(b);
        if (v < 0) return -1;
        unsigned char u[4];
        int n = utf8_encode(v, u);
        for (int i = 0; i < n; i++) {
            int s = byte_set(b, u[i], u[i]);
            if (s < 0 || emit(b, r, s)) return -1;
        }
    }
    if (b->p >= b->end) return bfail(b, at, EMBER_ERR_INVALID_ARG, "an unterminated string literal (no closing '\"')");
    b->p++;
    return 0;
}

/* A count of {m,n} at b->p. */
static int read_count(builder *b, const char *at, int *out) {
    if (b->p >= b->end || *b->p < '0' || *b->p > '9')
        return bfail(b, at, EMBER_ERR_INVALID_ARG, "a repetition {m,n} needs a number");
    long v = 0;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (*b->p++ - '0');
        if (v > GB_MAX_REPEAT)
            return bfail(b, at, EMBER_ERR_LIMIT, "a repetition count over the limit of %d", GB_MAX_REPEAT);
    }
    *out = (int)v;
    return 0;
}

/* Repeats the element code of rule r (already taken off its body) lo..hi
   times (hi < 0: no bound). */
static int repeat(builder *b, int r, int32_t code, int lo, int hi, const char *at) {
    for (int i = 0; i < lo; i++)
        if (emit(b, r, code)) return -1;
    if (hi < 0) { /* R ::= x R | (empty) */
        int g = new_rule(b, NULL, 0, true, at);
        if (g < 0 || emit(b, g, code) || emit(b, g, REF(g)) || emit(b, g, END) || emit(b, g, END)) return -1;
        return emit(b, r, REF(g));
    }
    if (hi == lo) return 0;
    int first = b->n_rules; /* O_i ::= x O_i+1 | (empty), the last without O_i+1 */
    for (int i = 0; i < hi - lo; i++) {
        int g = new_rule(b, NULL, 0, true, at);
        if (g < 0 || emit(b, g, code) || (i + 1 < hi - lo && emit(b, g, REF(g + 1))) || emit(b, g, END) ||
            emit(b, g, END))
            return -1;
    }
    return emit(b, r, REF(first));
}

/* A postfix operator at b->p applied to rule r's last item, which starts at
   item (its elements r's body[item ..)). */
static int postfix(builder *b, int r, int item) {
    const char *at = b->p;
    char op = *b->p++;
    int lo = 0, hi = -1;
    if (op == '+') lo = 1;
    if (op == '?') hi = 1;
    if (op == '{') {
        skip_space(b, true);
        if (read_count(b, at, &lo)) return -1;
        skip_space(b, true);
        hi = lo;
        if (b->p < b->end && *b->p == ',') {
            b->p++;
            skip_space(b, true);
            hi = -1;
            if (b->p < b->end && *b->p != '}' && read_count(b, at, &hi)) return -1;
            skip_space(b, true);
        }
        if (b->p >= b->end || *b->p != '}') return bfail(b, at, EMBER_ERR_INVALID_ARG, "a repetition {m,n} without its '}'");
        b->p++;
        if (hi >= 0 && hi < lo) return bfail(b, at, EMBER_ERR_INVALID_ARG, "a repetition {%d,%d}: m is over n", lo, hi);
    }
    ibuf *body = &b->rules[r].body;
    int n = body->n - item;
    if (n == 0) return bfail(b, at, EMBER_ERR_INVALID_ARG, "'%c' repeats something that matches only the empty string", op);
    int32_t code;
    if (n == 1) {
        code = body->v[item];
    } else { /* the item's elements become a rule of their own */
        int g = new_rule(b, NULL, 0, true, at);
        if (g < 0) return -1;
        body = &b->rules[r].body;
        for (int i = item; i < body->n; i++)
            if (push_int(b, &b->rules[g].body, body->v[i])) return -1;
        if (push_int(b, &b->rules[g].body, END)) return -1;
        code = REF(g);
    }
    b->rules[r].body.n = item;
    if (n == 1) b->total--; /* repeat writes it again (moved elements stay counted) */
    return repeat(b, r, code, lo, hi, at);
}

static int parse_alternates(builder *b, int r, bool nested);

/* One item (literal, class, '.', group, rule name) of rule r's sequence. */
static int parse_item(builder *b, int r, bool nested) {
    const char *at = b->p;
    char c = *b->p;
    if (c == '"') return parse_literal(b, r);
    if (c == '[') return parse_class(b, r);
    if (c == '.') {
        b->p++;
        crange any[4] = {{0, 0x10ffff}}; /* room: the surrogates cut it in two */
        return emit_class(b, r, any, 1, false, at);
    }
    if (c == '(') {
        if (b->depth >= GB_MAX_NEST) return bfail(b, at, EMBER_ERR_LIMIT, "groups nest deeper than %d", GB_MAX_NEST);
        b->p++;
        int g = new_rule(b, NULL, 0, true, at);
        if (g < 0) return -1;
        b->depth++;
        if (parse_alternates(b, g, true)) return -1;
        b->depth--;
        skip_space(b, true);
        if (b->p >= b->end || *b->p != ')') return bfail(b, at, EMBER_ERR_INVALID_ARG, "a '(' without its ')'");
        b->p++;
        return emit(b, r, REF(g));
    }
    if (name_char(c)) {
        const char *s = b->p;
        while (b->p < b->end && name_char(*b->p)) b->p++;
        if ((size_t)(b->p - s) > 128) return bfail(b, s, EMBER_ERR_INVALID_ARG, "a rule name longer than 128 bytes");
        int k = rule_named(b, s, (int)(b->p - s), s);
        return k < 0 ? -1 : emit(b, r, REF(k));
    }
    (void)nested;
    if (c == ':' && b->p + 2 < b->end && !memcmp(b->p, "::=", 3))
        return bfail(b, at, EMBER_ERR_INVALID_ARG, "'::=' inside a rule (a rule begins on a line of its own)");
    if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
        return bfail(b, at, EMBER_ERR_INVALID_ARG, "unexpected character (byte 0x%02x)", (unsigned char)c);
    return bfail(b, at, EMBER_ERR_INVALID_ARG, "unexpected '%c'", c);
}

/* A sequence of items with their postfix operators, closed by END. */
static int parse_sequence(builder *b, int r, bool nested) {
    for (;;) {
        skip_space(b, nested);
        if (b->p >= b->end) break;
        char c = *b->p;
        if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
        int item = b->rules[r].body.n;
        if (parse_item(b, r, nested)) return -1;
        for (;;) {
            skip_space(b, nested);
            if (b->p >= b->end || !strchr("*+?{", *b->p)) break;
            if (postfix(b, r, item)) return -1;
        }
    }
    return emit(b, r, END);
}

/* Alternatives of rule r up to the end of its line (nested: up to ')'). */
static int parse_alternates(builder *b, int r, bool nested) {
    skip_space(b, true);
    for (;;) {
        if (parse_sequence(b, r, nested)) return -1;
        const char *p = b->p;
        skip_space(b, true); /* a '|' may begin the next line */
        if (b->p < b->end && *b->p == '|') {
            b->p++;
            skip_space(b, true);
            continue;
        }
        if (!nested) b->p = p;
        return 0;
    }
}

/* Every rule: `name ::= alternatives`. */
static int parse_rules(builder *b) {
    skip_space(b, true);
    while (b->p < b->end) {
        const char *s = b->p;
        while (b->p < b->end && name_char(*b->p)) b->p++;
        if (b->p == s) return bfail(b, s, EMBER_ERR_INVALID_ARG, "expected a rule name ('name ::= ...')");
        int nlen = (int)(b->p - s);
        if (nlen > 128) return bfail(b, s, EMBER_ERR_INVALID_ARG, "a rule name longer than 128 bytes");
        skip_space(b, false);
        if (b->end - b->p < 3 || memcmp(b->p, "::=", 3))
            return bfail(b, b->p, EMBER_ERR_INVALID_ARG, "expected '::=' after the rule name '%.*s'", nlen, s);
        b->p += 3;
        int r = rule_named(b, s, nlen, s);
        if (r < 0) return -1;
        if (b->rules[r].defined) return bfail(b, s, EMBER_ERR_INVALID_ARG, "the rule '%.*s' is defined twice", nlen, s);
        b->rules[r].defined = true;
        where(b, s, &b->rules[r].line, &b->rules[r].col);
        b->cur = r;
        if (parse_alternates(b, r, false)) return -1;
        skip_space(b, false);
        if (b->p < b->end && *b->p == ')') return bfail(b, b->p, EMBER_ERR_INVALID_ARG, "a ')' without its '('");
        skip_space(b, true);
    }
    return 0;
}

/* ---- checks ----------------------------------------------------------------------------------- */

/* A rule's name for messages. */
static void rule_desc(const builder *b, int r, char *o, size_t n) {
    const brule *x = &b->rules[r];
    if (x->generated)
        snprintf(o, n, "the group or repetition at line %d, column %d (in '%.*s')", x->line, x->col, x->nlen > 64 ? 64 : x->nlen,
                 x->name ? x->name : "");
    else
        snprintf(o, n, "'%.*s'", x->nlen > 64 ? 64 : x->nlen, x->name);
}

/* a + b for lengths: BIG means never (it stays), finite sums stop short of it. */
static int add_len(long a, long b) {
    if (a >= BIG || b >= BIG) return BIG;
    return a + b >= BIG ? BIG - 1 : (int)(a + b);
}

/* nullable[] and minlen[] to their fixed points. */
static void lengths(const builder *b, bool *nullable, int *minlen) {
    for (int r = 0; r < b->n_rules; r++) {
        nullable[r] = false;
        minlen[r] = BIG;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < b->n_rules; r++) {
            const ibuf *v = &b->rules[r].body;
            int best = BIG, sum = 0;
            bool nul = false, cur_nul = true;
            for (int i = 0; i < v->n; i++) {
                int32_t c = v->v[i];
                if (c == END) {
                    if (sum < best) best = sum;
                    nul = nul || cur_nul;
                    sum = 0;
                    cur_nul = true;
                } else if (c >= 0) {
                    sum = add_len(sum, 1);
                    cur_nul = false;
                } else {
                    int k = REF_RULE(c);
                    sum = add_len(sum, minlen[k]);
                    cur_nul = cur_nul && nullable[k];
                }
            }
            if (best < minlen[r] || (nul && !nullable[r])) {
                minlen[r] = best < minlen[r] ? best : minlen[r];
                nullable[r] = nullable[r] || nul;
                changed = true;
            }
        }
    }
}

/* Left recursion: a rule reached again at the start of itself (through
   rules that may match nothing). Depth-first from r over its first refs;
   color 0 new, 1 on the path, 2 done. */
static int left_rec(builder *b, const bool *nullable, int r, uint8_t *color, int *path, int depth) {
    color[r] = 1;
    path[depth] = r;
    const ibuf *v = &b->rules[r].body;
    bool at_start = true;
    for (int i = 0; i < v->n; i++) {
        int32_t c = v->v[i];
        if (c == END) {
            at_start = true;
            continue;
        }
        if (!at_start) continue;
        if (c >= 0) {
            at_start = false;
            continue;
        }
        int k = REF_RULE(c);
        if (color[k] == 1) {
            char d[160], e[160];
            rule_desc(b, k, d, sizeof d);
            if (b->rules[k].generated && k == r && b->what)
                return bfail(b, NULL, EMBER_ERR_INVALID_ARG, "a repetition of something that can match the empty string");
            if (b->rules[k].generated && k == r)
                return bfail(b, NULL, EMBER_ERR_INVALID_ARG,
                             "line %d, column %d: a repetition of something that can match the empty string (in '%.*s')",
                             b->rules[k].line, b->rules[k].col, b->rules[k].nlen > 64 ? 64 : b->rules[k].nlen,
                             b->rules[k].name ? b->rules[k].name : "");
            rule_desc(b, r, e, sizeof e);
            return bfail(b, NULL, EMBER_ERR_INVALID_ARG,
                         "left recursion: %s can begin with itself (through %s); rewrite it with repetition, e.g. "
                         "'expr ::= term (\"+\" term)*' for 'expr ::= expr \"+\" term | term'",
                         d, e);
        }
        if (color[k] == 0 && depth + 1 < GB_MAX_RULES && left_rec(b, nullable, k, color, path, depth + 1)) return -1;
        if (!nullable[k]) at_start = false;
    }
    color[r] = 2;
    return 0;
}

static int check(builder *b, int *minlen, bool *nullable, int *root) {
    *root = -1;
    for (int r = 0; r < b->n_rules; r++) {
        const brule *x = &b->rules[r];
        if (!x->defined)
            return bfail(b, NULL, EMBER_ERR_INVALID_ARG, "line %d, column %d: undefined rule '%.*s'", x->line, x->col,
                         x->nlen > 64 ? 64 : x->nlen, x->name);
        if (!x->generated && x->nlen == 4 && !memcmp(x->name, "root", 4)) *root = r;
    }
    if (b->n_rules == 0) return bfail(b, NULL, EMBER_ERR_INVALID_ARG, "the grammar is empty (no rules)");
    if (*root < 0) return bfail(b, NULL, EMBER_ERR_INVALID_ARG, "the grammar has no 'root' rule (where the output starts)");
    lengths(b, nullable, minlen);
    uint8_t *color = ember_calloc((size_t)b->n_rules, 1);
    int *path = ember_malloc((size_t)b->n_rules * sizeof *path);
    int rc = !color || !path ? bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory") : 0;
    for (int r = 0; r < b->n_rules && !rc; r++)
        if (!color[r]) rc = left_rec(b, nullable, r, color, path, 0);
    free(color);
    free(path);
    if (rc) return -1;
    for (int r = 0; r < b->n_rules; r++)
        if (minlen[r] >= BIG) {
            char d[160];
            rule_desc(b, r, d, sizeof d);
            return bfail(b, NULL, EMBER_ERR_INVALID_ARG,
                         "%s can never finish: each of its alternatives refers back to it (or to a rule that never "
                         "finishes) without an end",
                         d);
        }
    return 0;
}

/* The flat program from the checked rules. */
static int flatten(builder *b, const int *minlen, int root, gb_prog **out) {
    gb_prog *p = ember_calloc(1, sizeof *p);
    if (!p) return bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory");
    long n_el = 0, n_alt = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_el += b->rules[r].body.n;
        for (int i = 0; i < b->rules[r].body.n; i++) n_alt += b->rules[r].body.v[i] == END;
    }
    p->n_rules = b->n_rules;
    p->root = root;
    p->n_el = (int)n_el;
    p->el = ember_malloc((size_t)(n_el + 1) * sizeof *p->el);
    p->minrest = ember_malloc((size_t)(n_el + 1) * sizeof *p->minrest);
    p->alt0 = ember_malloc((size_t)(b->n_rules + 1) * sizeof *p->alt0);
    p->alts = ember_malloc((size_t)(n_alt + 1) * sizeof *p->alts);
    p->sets = ember_malloc((size_t)(b->n_sets + 1) * sizeof *p->sets);
    if (!p->el || !p->minrest || !p->alt0 || !p->alts || !p->sets) {
        gb_prog_free(p);
        return bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory");
    }
    if (b->n_sets > 0) memcpy(p->sets, b->sets, (size_t)b->n_sets * sizeof *p->sets);
    p->n_sets = b->n_sets;
    int e = 0, a = 0;
    for (int r = 0; r < b->n_rules; r++) {
        p->alt0[r] = a;
        const ibuf *v = &b->rules[r].body;
        bool start = true;
        for (int i = 0; i < v->n; i++) {
            if (start) p->alts[a++] = e;
            p->el[e++] = v->v[i];
            start = v->v[i] == END;
        }
    }
    p->alt0[b->n_rules] = a;
    for (int i = e - 1; i >= 0; i--) {
        int32_t c = p->el[i];
        p->minrest[i] = c == END ? 0 : add_len(c >= 0 ? 1 : minlen[REF_RULE(c)], p->minrest[i + 1]);
    }
    *out = p;
    return 0;
}

/* An empty builder over text[0, len), errors into err. */
static void builder_init(builder *b, const char *text, size_t len, ember_error *err) {
    memset(b, 0, sizeof *b);
    b->src = b->p = text;
    b->end = text + len;
    b->err = err;
    b->cur = -1;
    for (int i = 0; i < 256; i++) b->single[i] = -1;
}

/* The end of a compile: with rc == 0 (rules built), checks them from root
   (which check may pick) and flattens them into *out; then frees the
   builder's rules and sets whatever happened. Returns 0 or the error code
   (err says why). */
static int finish(builder *b, int rc, int root, gb_prog **out, ember_error *err) {
    int *minlen = NULL;
    bool *nullable = NULL;
    if (!rc) {
        minlen = ember_malloc(((size_t)b->n_rules + 1) * sizeof *minlen);
        nullable = ember_malloc(((size_t)b->n_rules + 1) * sizeof *nullable);
        rc = !minlen || !nullable ? bfail(b, NULL, EMBER_ERR_NOMEM, "out of memory") : check(b, minlen, nullable, &root);
    }
    if (!rc) rc = flatten(b, minlen, root, out);
    free(minlen);
    free(nullable);
    for (int r = 0; r < b->n_rules; r++) free(b->rules[r].body.v);
    free(b->rules);
    free(b->sets);
    return rc ? (err && err->code ? err->code : EMBER_ERR_INVALID_ARG) : 0;
}

int gb_compile(const char *text, size_t len, gb_prog **out, ember_error *err) {
    *out = NULL;
    if (len > GB_MAX_TEXT)
        return ember_err(err, EMBER_ERR_LIMIT, "grammar: the text is over the limit of %d bytes", GB_MAX_TEXT);
    if (memchr(text, 0, len)) return ember_err(err, EMBER_ERR_INVALID_ARG, "grammar: the text holds a NUL byte");
    builder b;
    builder_init(&b, text, len, err);
    int root = -1, rc = parse_rules(&b);
    return finish(&b, rc, root, out, err);
}

/* ---- regular expressions ---------------------------------------------------------------------- */

/* Node k of t into rule r's current alternative. */
static int rx_node(builder *b, const ember_rx_tree *t, int k, int r, int depth) {
    const ember_rx_node *x = &t->nodes[k];
    if (depth > 2 * EMBER_RX_NODES) return bfail(b, NULL, EMBER_ERR_LIMIT, "the pattern nests too deep");
    switch (x->kind) {
    case EMBER_RXT_EMPTY: return 0;
    case EMBER_RXT_CLS: {
        uint64_t s[4] = {x->cls[0], x->cls[1], 0, 0};
        int set = add_set(b, s);
        return set < 0 ? -1 : emit(b, r, set);
    }
    case EMBER_RXT_CAT: return rx_node(b, t, x->a, r, depth + 1) || rx_node(b, t, x->b, r, depth + 1) ? -1 : 0;
    case EMBER_RXT_ALT: {
        int g = new_rule(b, NULL, 0, true, b->src);
        if (g < 0) return -1;
        int stack[EMBER_RX_NODES], n = 0; /* the alternatives of a chain of ALTs, in order */
        stack[n++] = k;
        while (n > 0) {
            int q = stack[--n];
            if (t->nodes[q].kind == EMBER_RXT_ALT && n + 2 <= EMBER_RX_NODES) {
                stack[n++] = t->nodes[q].b;
                stack[n++] = t->nodes[q].a;
                continue;
            }
            if (rx_node(b, t, q, g, depth + 1) || emit(b, g, END)) return -1;
        }
        return emit(b, r, REF(g));
    }
    case EMBER_RXT_REP: {
        int item = b->rules[r].body.n;
        if (rx_node(b, t, x->a, r, depth + 1)) return -1;
        int n = b->rules[r].body.n - item;
        if (n == 0) return 0; /* an empty body repeated: empty */
        int32_t code;
        if (n == 1) {
            code = b->rules[r].body.v[item];
            b->total--;
        } else {
            int g = new_rule(b, NULL, 0, true, b->src);
            if (g < 0) return -1;
            for (int i = item; i < b->rules[r].body.n; i++)
                if (push_int(b, &b->rules[g].body, b->rules[r].body.v[i])) return -1;
            if (push_int(b, &b->rules[g].body, END)) return -1;
            code = REF(g);
        }
        b->rules[r].body.n = item;
        return repeat(b, r, code, x->lo, x->hi, b->src);
    }
    }
    return bfail(b, NULL, EMBER_ERR_INTERNAL, "a bad pattern node");
}

int gb_compile_regex(const char *pattern, const char *what, gb_prog **out, ember_error *err) {
    *out = NULL;
    size_t len = strlen(pattern);
    if (len > 65536) return ember_err(err, EMBER_ERR_LIMIT, "%s: the pattern is over 64 KiB", what);
    ember_rx_tree *t = ember_malloc(sizeof *t);
    if (!t) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    char why[EMBER_ERROR_MSG_MAX] = "";
    if (ember_rx_parse(pattern, what, t, why, sizeof why)) {
        free(t);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s", why[0] ? why : "the pattern cannot be read");
    }
    builder b;
    builder_init(&b, pattern, len, err);
    b.what = what;
    int root = new_rule(&b, "root", 4, false, pattern);
    int rc = root < 0 ? -1 : 0;
    if (!rc) {
        b.rules[root].defined = true;
        b.cur = root;
        rc = rx_node(&b, t, t->root, root, 0) || emit(&b, root, END) ? -1 : 0;
    }
    free(t);
    return finish(&b, rc, root, out, err);
}

/* ---- matching ---------------------------------------------------------------------------------- */

/* A state: ints [n stacks, then each stack as its length and its entries
   from the bottom]. */
struct gb_cache {
    const gb_prog *p;
    int32_t *arena; /* the states' ints */
    size_t an, acap;
    int32_t *off, *len, *cost; /* [cap] each state's place, size, fewest bytes to finish */
    uint8_t *done;
    int32_t *trans; /* [cap * 256] next state; -2 unknown, -1 refused */
    int n, cap;
    int32_t *ht; /* open addressing: state ids, -1 empty */
    int hcap;
    int32_t *work; /* closure's pending stacks, each its entries then its length */
    int32_t *out;  /* the state being made */
    int32_t tmp[GB_MAX_DEPTH + 2];
    unsigned gen; /* gb_cache_generation */
    long budget;  /* closure steps new transitions may still take (< 0: no limit) */
};

void gb_cache_free(gb_cache *c) {
    if (!c) return;
    free(c->arena);
    free(c->off);
    free(c->len);
    free(c->cost);
    free(c->done);
    free(c->trans);
    free(c->ht);
    free(c->work);
    free(c->out);
    free(c);
}

gb_cache *gb_cache_new(const gb_prog *p) {
    gb_cache *c = ember_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->p = p;
    c->work = ember_malloc(MAX_STATE_INTS * sizeof *c->work);
    c->out = ember_malloc(MAX_STATE_INTS * sizeof *c->out);
    c->hcap = 1024;
    c->ht = ember_malloc((size_t)c->hcap * sizeof *c->ht);
    if (!c->work || !c->out || !c->ht) {
        gb_cache_free(c);
        return NULL;
    }
    memset(c->ht, 0xff, (size_t)c->hcap * sizeof *c->ht);
    c->budget = -1;
    return c;
}

void gb_cache_set_budget(gb_cache *c, long steps) {
    c->budget = steps;
}

/* Adds stack s[0..n) to the state in c->out unless it is there. false when
   the state is full. */
static bool add_stack(gb_cache *c, const int32_t *s, int n) {
    int32_t *o = c->out;
    int at = 1;
    for (int k = 0; k < o[0]; k++) {
        if (o[at] == n && !memcmp(o + at + 1, s, (size_t)n * sizeof *s)) return true;
        at += 1 + o[at];
    }
    if (o[0] >= GB_MAX_STACKS || at + 1 + n > MAX_STATE_INTS) return false;
    o[at] = n;
    memcpy(o + at + 1, s, (size_t)n * sizeof *s);
    o[0]++;
    return true;
}

/* Pushes s[0..n) with extra (>= 0) on top onto the work list. */
static bool work_push(gb_cache *c, int *wn, const int32_t *s, int n, int32_t extra) {
    int m = n + (extra >= 0);
    if (m > GB_MAX_DEPTH || *wn + m + 1 > MAX_STATE_INTS) return false;
    if (n > 0) memcpy(c->work + *wn, s, (size_t)n * sizeof *s);
    if (extra >= 0) c->work[*wn + n] = extra;
    c->work[*wn + m] = m;
    *wn += m + 1;
    return true;
}

/* Runs the work list into c->out: every stack closed until its top reads
   a byte (or it is empty: complete). false past a limit. */
static bool close_all(gb_cache *c, int wn) {
    const gb_prog *p = c->p;
    int steps = 0;
    while (wn > 0) {
        if (++steps > MAX_STEPS) return false;
        if (c->budget == 0) return false;
        if (c->budget > 0) c->budget--;
        int n = c->work[wn - 1];
        wn -= n + 1;
        memcpy(c->tmp, c->work + wn, (size_t)n * sizeof *c->tmp);
        for (;;) {
            if (n == 0) {
                if (!add_stack(c, c->tmp, 0)) return false;
                break;
            }
            int32_t pos = c->tmp[n - 1], code = p->el[pos];
            if (code == END) {
                n--;
                continue;
            }
            if (code >= 0) {
                if (!add_stack(c, c->tmp, n)) return false;
                break;
            }
            int r = REF_RULE(code);
            if (p->el[pos + 1] == END)
                n--; /* a call in last place: nothing to come back to */
            else
                c->tmp[n - 1] = pos + 1;
            for (int a = p->alt0[r + 1] - 1; a >= p->alt0[r]; a--)
                if (!work_push(c, &wn, c->tmp, n, p->alts[a])) return false;
            break;
        }
    }
    return true;
}

static uint64_t hash_state(const int32_t *s, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int state_ints(const int32_t *s) {
    int at = 1;
    for (int k = 0; k < s[0]; k++) at += 1 + s[at];
    return at;
}

static int grow_states(gb_cache *c) {
    int cap = c->cap ? c->cap * 2 : 64;
    int32_t *off = ember_realloc(c->off, (size_t)cap * sizeof *off);
    if (off) c->off = off;
    int32_t *len = ember_realloc(c->len, (size_t)cap * sizeof *len);
    if (len) c->len = len;
    int32_t *cost = ember_realloc(c->cost, (size_t)cap * sizeof *cost);
    if (cost) c->cost = cost;
    uint8_t *done = ember_realloc(c->done, (size_t)cap);
    if (done) c->done = done;
    int32_t *tr = ember_realloc(c->trans, (size_t)cap * 256 * sizeof *tr);
    if (tr) c->trans = tr;
    if (!off || !len || !cost || !done || !tr) return -1;
    c->cap = cap;
    return 0;
}

static int rehash(gb_cache *c, int hcap) {
    int32_t *ht = ember_malloc((size_t)hcap * sizeof *ht);
    if (!ht) return -1;
    memset(ht, 0xff, (size_t)hcap * sizeof *ht);
    for (int i = 0; i < c->n; i++) {
        uint64_t h = hash_state(c->arena + c->off[i], c->len[i]) & (uint64_t)(hcap - 1);
        while (ht[h] >= 0) h = (h + 1) & (uint64_t)(hcap - 1);
        ht[h] = i;
    }
    free(c->ht);
    c->ht = ht;
    c->hcap = hcap;
    return 0;
}

/* The id of state s (c->out or a copy), made when new; -1 when out of
   memory or past CACHE_HARD states. */
static int intern(gb_cache *c, const int32_t *s) {
    int n = state_ints(s);
    uint64_t h = hash_state(s, n) & (uint64_t)(c->hcap - 1);
    for (; c->ht[h] >= 0; h = (h + 1) & (uint64_t)(c->hcap - 1)) {
        int i = c->ht[h];
        if (c->len[i] == n && !memcmp(c->arena + c->off[i], s, (size_t)n * sizeof *s)) return i;
    }
    if (c->n >= CACHE_HARD || (c->n == c->cap && grow_states(c))) return -1;
    if (c->an + (size_t)n > c->acap) {
        size_t cap = c->acap ? c->acap * 2 : 4096;
        while (cap < c->an + (size_t)n) cap *= 2;
        int32_t *na = ember_realloc(c->arena, cap * sizeof *na);
        if (!na) return -1;
        c->arena = na;
        c->acap = cap;
    }
    int id = c->n;
    memcpy(c->arena + c->an, s, (size_t)n * sizeof *s);
    c->off[id] = (int32_t)c->an;
    c->len[id] = n;
    c->an += (size_t)n;
    for (int b = 0; b < 256; b++) c->trans[(size_t)id * 256 + b] = -2;
    int best = BIG, at = 1; /* the cheapest stack: the sum of its entries' rests */
    bool done = false;
    for (int k = 0; k < s[0]; k++) {
        int v = 0;
        for (int i = 0; i < s[at]; i++) v = add_len(v, c->p->minrest[s[at + 1 + i]]);
        if (v < best) best = v;
        done = done || s[at] == 0;
        at += 1 + s[at];
    }
    c->cost[id] = best;
    c->done[id] = done;
    c->ht[h] = id;
    c->n++;
    if (2 * c->n > c->hcap && rehash(c, c->hcap * 2)) return -1;
    return id;
}

int gb_cache_start(gb_cache *c) {
    const gb_prog *p = c->p;
    int wn = 0;
    c->out[0] = 0;
    for (int a = p->alt0[p->root + 1] - 1; a >= p->alt0[p->root]; a--)
        if (!work_push(c, &wn, NULL, 0, p->alts[a])) return -1;
    if (!close_all(c, wn) || c->out[0] == 0) return -1;
    return intern(c, c->out);
}

int gb_cache_next(gb_cache *c, int sid, unsigned char byte) {
    int32_t *tr = &c->trans[(size_t)sid * 256 + byte];
    if (*tr != -2) return *tr;
    if (c->budget == 0) return -1; /* out of steps: refused, not remembered */
    const gb_prog *p = c->p;
    const int32_t *s = c->arena + c->off[sid];
    int wn = 0, at = 1;
    bool ok = true;
    for (int k = 0; k < s[0] && ok; k++) {
        int n = s[at];
        if (n > 0) {
            int32_t pos = s[at + n], code = p->el[pos];
            if (p->sets[code][byte >> 6] >> (byte & 63) & 1) {
                ok = work_push(c, &wn, s + at + 1, n - 1, pos + 1);
            }
        }
        at += 1 + n;
    }
    c->out[0] = 0;
    if (ok) ok = close_all(c, wn);
    bool refused = ok && c->out[0] == 0;
    int id = ok && !refused ? intern(c, c->out) : -1;
    if (refused || id >= 0) c->trans[(size_t)sid * 256 + byte] = id; /* a limit or memory: not remembered */
    return id;
}

int gb_cache_cost(const gb_cache *c, int sid) {
    return c->cost[sid];
}

bool gb_cache_done(const gb_cache *c, int sid) {
    return c->done[sid];
}

unsigned gb_cache_generation(const gb_cache *c) {
    return c->gen;
}

int gb_cache_trim(gb_cache *c, int sid) {
    if (c->n <= CACHE_SOFT) return sid;
    c->gen++;
    int n = c->len[sid];
    if (n > MAX_STATE_INTS) return -1;
    memcpy(c->out, c->arena + c->off[sid], (size_t)n * sizeof *c->out);
    c->n = 0;
    c->an = 0;
    memset(c->ht, 0xff, (size_t)c->hcap * sizeof *c->ht);
    return intern(c, c->out);
}
