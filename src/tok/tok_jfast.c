/*
 * tok_jfast.c - a fast path for the two large values of a tokenizer.json,
 * model.vocab (an object of token -> id) and model.merges (an array of
 * "a b" strings or [a, b] pairs), which make up most of the file: they are
 * located by a light scan, cut out of the text given to jansson (a copy
 * where they are "{}" and "[]": jansson then reads some kilobytes instead
 * of megabytes), and read here directly into the tokenizer (jansson would
 * allocate an object per string).
 *
 * Owner: tokenizer module; runs on the loading thread.
 *
 * The fast path only accepts the plain form those values always have
 * (strict JSON strings, non-negative integer ids without exponent). On
 * anything else it reports "not applicable" and the caller loads the file
 * again through jansson alone, so error messages and edge cases (escaped
 * keys, duplicate keys, reals, ...) stay those of the slow path.
 *
 * Speed (a load is mostly waiting on memory: ~450k hash-table lookups in
 * tables of megabytes for Qwen3): the scan counts the strings of both
 * values, which sizes the tables once; entries are read 16 ahead of the
 * one being added, so their map slots (and then the keys those slots point
 * to) are prefetched while earlier entries are added; merge-table entries
 * are put 8 merges after their slot was prefetched. Results are exactly
 * those of adding the entries one by one in file order: prefetches are
 * hints, and lookups and insertions still happen in order.
 */
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

typedef struct cur {
    const char *p, *e;
    size_t strings; /* strings skipped so far (skip_str) */
} cur;

static void sp(cur *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* Skips a string at c->p ('"'); false when unterminated. *esc: it had a backslash. */
static bool skip_str(cur *c, bool *esc) {
    if (c->p >= c->e || *c->p != '"') return false;
    c->p++;
    c->strings++;
    if (esc) *esc = false;
    while (c->p < c->e) {
        char ch = *c->p++;
        if (ch == '"') return true;
        if (ch == '\\') {
            if (esc) *esc = true;
            if (c->p >= c->e) return false;
            c->p++;
        }
    }
    return false;
}

/* Skips any value; depth-bounded. */
static bool skip_val(cur *c, int depth) {
    if (depth > 512) return false;
    sp(c);
    if (c->p >= c->e) return false;
    char ch = *c->p;
    if (ch == '"') return skip_str(c, NULL);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++;
        sp(c);
        if (c->p < c->e && *c->p == close) {
            c->p++;
            return true;
        }
        for (;;) {
            if (ch == '{') {
                sp(c);
                if (!skip_str(c, NULL)) return false;
                sp(c);
                if (c->p >= c->e || *c->p != ':') return false;
                c->p++;
            }
            if (!skip_val(c, depth + 1)) return false;
            sp(c);
            if (c->p >= c->e) return false;
            if (*c->p == ',') {
                c->p++;
                continue;
            }
            if (*c->p == close) {
                c->p++;
                return true;
            }
            return false;
        }
    }
    /* literal or number: up to a delimiter */
    const char *s = c->p;
    while (c->p < c->e) {
        char d = *c->p;
        if (d == ',' || d == '}' || d == ']' || d == ' ' || d == '\t' || d == '\r' || d == '\n' || d == 0) break;
        c->p++;
    }
    return c->p > s;
}

static bool key_is(const char *k, size_t n, const char *lit) { return strlen(lit) == n && memcmp(k, lit, n) == 0; }

int tok_jfast_locate(const char *json, size_t n, tok_sv *vocab, tok_sv *merges, size_t *vocab_strings,
                     size_t *merges_strings) {
    cur c = {json, json + n, 0};
    vocab->p = merges->p = NULL;
    vocab->n = merges->n = 0;
    *vocab_strings = *merges_strings = 0;
    sp(&c);
    if (c.p >= c.e || *c.p != '{') return 0;
    c.p++;
    bool seen_model = false;
    for (;;) {
        sp(&c);
        if (c.p < c.e && *c.p == '}') break;
        const char *k = c.p + 1;
        bool esc;
        if (!skip_str(&c, &esc) || esc) return 0;
        size_t kn = (size_t)(c.p - 1 - k);
        sp(&c);
        if (c.p >= c.e || *c.p != ':') return 0;
        c.p++;
        sp(&c);
        if (key_is(k, kn, "model")) {
            if (seen_model || c.p >= c.e || *c.p != '{') return 0;
            seen_model = true;
            c.p++;
            for (;;) {
                sp(&c);
                if (c.p < c.e && *c.p == '}') {
                    c.p++;
                    break;
                }
                const char *mk = c.p + 1;
                if (!skip_str(&c, &esc) || esc) return 0;
                size_t mkn = (size_t)(c.p - 1 - mk);
                sp(&c);
                if (c.p >= c.e || *c.p != ':') return 0;
                c.p++;
                sp(&c);
                const char *vs = c.p;
                size_t s0 = c.strings;
                if (!skip_val(&c, 0)) return 0;
                if (key_is(mk, mkn, "vocab")) {
                    if (vocab->p || *vs != '{') return 0;
                    vocab->p = vs;
                    vocab->n = (size_t)(c.p - vs);
                    *vocab_strings = c.strings - s0;
                } else if (key_is(mk, mkn, "merges")) {
                    if (merges->p || *vs != '[') return 0;
                    merges->p = vs;
                    merges->n = (size_t)(c.p - vs);
                    *merges_strings = c.strings - s0;
                }
                sp(&c);
                if (c.p < c.e && *c.p == ',') {
                    c.p++;
                    continue;
                }
                if (c.p < c.e && *c.p == '}') {
                    c.p++;
                    break;
                }
                return 0;
            }
        } else if (!skip_val(&c, 0)) {
            return 0;
        }
        sp(&c);
        if (c.p < c.e && *c.p == ',') {
            c.p++;
            continue;
        }
        if (c.p < c.e && *c.p == '}') break;
        return 0;
    }
    return vocab->p != NULL;
}

char *tok_jfast_compact(const char *json, size_t n, const tok_sv *vocab, const tok_sv *merges, size_t *out_n) {
    /* the spans in file order (either may come first; merges may be absent) */
    const tok_sv *sp1 = vocab, *sp2 = merges->p ? merges : NULL;
    const char *rep1 = "{}", *rep2 = "[]";
    if (sp2 && sp2->p < sp1->p) {
        sp1 = merges;
        sp2 = vocab;
        rep1 = "[]";
        rep2 = "{}";
    }
    size_t cut = sp1->n + (sp2 ? sp2->n : 0), add = sp2 ? 4 : 2;
    char *out = ember_malloc(n - cut + add + 1);
    if (!out) return NULL;
    char *d = out;
    const char *s = json;
    size_t k = (size_t)(sp1->p - s);
    memcpy(d, s, k);
    d += k;
    memcpy(d, rep1, 2);
    d += 2;
    s = sp1->p + sp1->n;
    if (sp2) {
        k = (size_t)(sp2->p - s);
        memcpy(d, s, k);
        d += k;
        memcpy(d, rep2, 2);
        d += 2;
        s = sp2->p + sp2->n;
    }
    k = (size_t)(json + n - s);
    memcpy(d, s, k);
    d += k;
    *d = 0;
    *out_n = (size_t)(d - out);
    return out;
}

/* A strict JSON string at c->p into b (unescaped); false when not plain. */
static bool read_str(cur *c, tok_buf *b) {
    b->n = 0;
    if (c->p >= c->e || *c->p != '"') return false;
    c->p++;
    const char *run = c->p;
    while (c->p < c->e) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            if (tok_buf_put(b, run, (size_t)(c->p - run))) return false;
            c->p++;
            return tok_utf8_valid(b->p ? b->p : "", b->n);
        }
        if (ch < 0x20) return false;
        if (ch != '\\') {
            c->p++;
            continue;
        }
        if (tok_buf_put(b, run, (size_t)(c->p - run))) return false;
        c->p++;
        if (c->p >= c->e) return false;
        char e = *c->p++;
        uint32_t cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'u': {
            uint32_t v = 0;
            for (int k = 0; k < 4; k++) {
                if (c->p >= c->e) return false;
                char h = *c->p++;
                int d = (h >= '0' && h <= '9') ? h - '0' : ((h | 32) >= 'a' && (h | 32) <= 'f') ? (h | 32) - 'a' + 10 : -1;
                if (d < 0) return false;
                v = v * 16 + (uint32_t)d;
            }
            if (v >= 0xDC00 && v <= 0xDFFF) return false;
            if (v >= 0xD800 && v <= 0xDBFF) {
                if (c->e - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u') return false;
                uint32_t lo = 0;
                for (int k = 2; k < 6; k++) {
                    char h = c->p[k];
                    int d = (h >= '0' && h <= '9') ? h - '0' : ((h | 32) >= 'a' && (h | 32) <= 'f') ? (h | 32) - 'a' + 10 : -1;
                    if (d < 0) return false;
                    lo = lo * 16 + (uint32_t)d;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) return false;
                c->p += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            }
            cp = v;
            break;
        }
        default: return false;
        }
        if (tok_buf_put_cp(b, cp)) return false;
        run = c->p;
    }
    return false;
}

/* Vocabulary entries read ahead of the one being added (as merges below):
   the map slot of each is being loaded meanwhile. */
#define VQ 16
typedef struct pend_tok {
    tok_buf s;
    int32_t id;
    uint64_t h;
} pend_tok;

/* Reads one "token": id entry at c->p into q; false when not plain. */
static bool read_vocab_entry(cur *c, pend_tok *q) {
    if (!read_str(c, &q->s) || q->s.n > TOK_MAX_TOKEN_BYTES) return false;
    sp(c);
    if (c->p >= c->e || *c->p != ':') return false;
    c->p++;
    sp(c);
    long long id = 0;
    const char *ds = c->p;
    while (c->p < c->e && *c->p >= '0' && *c->p <= '9' && c->p - ds < 10) id = id * 10 + (*c->p++ - '0');
    if (c->p == ds || (c->p - ds > 1 && *ds == '0') || id >= TOK_MAX_VOCAB) return false;
    if (c->p < c->e && (*c->p == '.' || *c->p == 'e' || *c->p == 'E' || (*c->p >= '0' && *c->p <= '9'))) return false;
    q->id = (int32_t)id;
    q->h = tok_hash(q->s.p ? q->s.p : "", q->s.n);
    return true;
}

int tok_jfast_vocab(ember_tokenizer *t, tok_sv span, size_t strings, ember_error *err) {
    cur c = {span.p, span.p + span.n, 0};
    pend_tok ring[VQ];
    memset(ring, 0, sizeof ring);
    int rc = 0; /* 0 = not applicable */
    size_t count = 0, head = 0, nq = 0;
    bool at_end = false;
    /* a string an entry, and room for the added tokens and the merges'
       phantoms without a rehash in most files */
    if (tok_smap_reserve(&t->map, strings + 1024)) goto done;
    sp(&c);
    if (c.p >= c.e || *c.p != '{') goto done;
    c.p++;
    sp(&c);
    if (c.p < c.e && *c.p == '}') {
        c.p++;
        at_end = true;
    }
    for (;;) {
        while (!at_end && nq < VQ) {
            pend_tok *q = &ring[(head + nq) % VQ];
            sp(&c);
            if (!read_vocab_entry(&c, q)) goto done;
            if (++count > TOK_MAX_VOCAB) goto done;
            tok_smap_prefetch(&t->map, q->h);
            nq++;
            sp(&c);
            if (c.p < c.e && *c.p == ',') {
                c.p++;
            } else if (c.p < c.e && *c.p == '}') {
                c.p++;
                at_end = true;
            } else {
                goto done;
            }
        }
        if (!nq) break;
        const pend_tok *q = &ring[head];
        if (tok_set_text_h(t, q->id, q->s.p ? q->s.p : "", q->s.n, q->h, err)) {
            rc = -1;
            goto done;
        }
        head = (head + 1) % VQ;
        nq--;
    }
    sp(&c);
    rc = c.p == c.e ? 1 : 0;
done:
    for (size_t k = 0; k < VQ; k++) tok_buf_free(&ring[k].s);
    return rc;
}

/* The entries of a merges array of `strings` strings (one per "a b"
   string, two per ["a", "b"] pair), so the merge table is sized once,
   neither grown nor shrunk. */
static size_t merges_estimate(tok_sv span, size_t strings) {
    const char *q = span.p + 1, *e = span.p + span.n;
    while (q < e && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    return (q < e && *q == '[' ? strings / 2 : strings) + 16;
}

/* Merges read ahead of the one being added: their hashes are known, their
   map slots (and then the keys those slots point to) are being loaded while
   earlier merges are added. A merge's strings live in its ring entry's
   buffers until the entry is reused. */
#define MQ 16
typedef struct pend_merge {
    tok_buf a, b; /* "a b" in a; [a, b] in a and b */
    const char *ap, *bp;
    size_t an, bn;
    uint64_t ha, hb;
    uint64_t hab; /* hash of a + b (a hint: the merged text is looked up
                     when its id is not the guessed one) */
} pend_merge;

/* Reads one merge at c->p into q; false when it is not in the plain form.
   with_ab: also hash the merged text (when recent guesses missed). */
static bool read_merge(cur *c, pend_merge *q, bool with_ab) {
    if (c->p < c->e && *c->p == '"') {
        if (!read_str(c, &q->a)) return false;
        const char *s = q->a.p ? q->a.p : "";
        const char *space = memchr(s, ' ', q->a.n);
        if (!space) return false; /* the slow path names the bad merge */
        q->ap = s;
        q->an = (size_t)(space - s);
        q->bp = space + 1;
        const char *sp2 = memchr(q->bp, ' ', q->a.n - q->an - 1);
        q->bn = sp2 ? (size_t)(sp2 - q->bp) : q->a.n - q->an - 1;
    } else if (c->p < c->e && *c->p == '[') {
        c->p++;
        sp(c);
        if (!read_str(c, &q->a)) return false;
        sp(c);
        if (c->p >= c->e || *c->p != ',') return false;
        c->p++;
        sp(c);
        if (!read_str(c, &q->b)) return false;
        sp(c);
        if (c->p >= c->e || *c->p != ']') return false;
        c->p++;
        q->ap = q->a.p ? q->a.p : "";
        q->an = q->a.n;
        q->bp = q->b.p ? q->b.p : "";
        q->bn = q->b.n;
    } else {
        return false;
    }
    if (q->an > TOK_MAX_TOKEN_BYTES || q->bn > TOK_MAX_TOKEN_BYTES) return false;
    q->ha = tok_hash(q->ap, q->an);
    q->hb = tok_hash(q->bp, q->bn);
    char ab[128];
    q->hab = 0;
    if (with_ab && q->an + q->bn <= sizeof ab) {
        memcpy(ab, q->ap, q->an);
        memcpy(ab + q->an, q->bp, q->bn);
        q->hab = tok_hash(ab, q->an + q->bn);
    }
    return true;
}

/* Puts the oldest of the pending merge table entries pk / pv. */
#define PQ 8
static int put_oldest(ember_tokenizer *t, const uint64_t *pk, const uint64_t *pv, size_t *pput, size_t *np,
                      ember_error *err) {
    if (tok_umap_put(&t->model.merges, pk[*pput], pv[*pput], true))
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    *pput = (*pput + 1) % PQ;
    (*np)--;
    return EMBER_OK;
}

int tok_jfast_merges(ember_tokenizer *t, tok_sv span, size_t strings, ember_error *err) {
    cur c = {span.p, span.p + span.n, 0};
    pend_merge ring[MQ];
    memset(ring, 0, sizeof ring);
    int rc = 0;
    uint32_t rank = 0;
    size_t head = 0, nq = 0; /* ring[head .. head + nq) are read, not added */
    uint64_t pk[PQ], pv[PQ];  /* merge table entries not put yet */
    unsigned misses = 0;      /* decaying count of merged ids that were not the guess */
    size_t pput = 0, np = 0;
    bool at_end = false;
    if (tok_umap_init(&t->model.merges, merges_estimate(span, strings))) goto done;
    sp(&c);
    if (c.p >= c.e || *c.p != '[') goto done;
    c.p++;
    sp(&c);
    if (c.p < c.e && *c.p == ']') {
        c.p++;
        at_end = true;
    }
    for (;;) {
        while (!at_end && nq < MQ) {
            pend_merge *q = &ring[(head + nq) % MQ];
            sp(&c);
            if (!read_merge(&c, q, misses > 64)) goto done;
            tok_smap_prefetch(&t->map, q->ha);
            tok_smap_prefetch(&t->map, q->hb);
            if (q->hab) tok_smap_prefetch(&t->map, q->hab);
            nq++;
            sp(&c);
            if (c.p < c.e && *c.p == ',') {
                c.p++;
            } else if (c.p < c.e && *c.p == ']') {
                c.p++;
                at_end = true;
            } else {
                goto done;
            }
        }
        if (!nq) break;
        if (nq > MQ / 2) { /* its slots were asked for MQ / 2 merges ago: now the keys */
            const pend_merge *q = &ring[(head + MQ / 2) % MQ];
            tok_smap_prefetch_key(&t->map, q->ha);
            tok_smap_prefetch_key(&t->map, q->hb);
            if (q->hab) tok_smap_prefetch_key(&t->map, q->hab);
        }
        const pend_merge *q = &ring[head];
        if (rank >= TOK_MAX_MERGES) goto done;
        int32_t ia, ib;
        uint64_t key, val;
        int64_t off = t->merge_off; /* changes when the guess missed */
        if (tok_id_or_phantom_h(t, q->ap, q->an, q->ha, &ia, err) ||
            tok_id_or_phantom_h(t, q->bp, q->bn, q->hb, &ib, err) ||
            tok_merge_entry(t, ia, ib, rank, &key, &val, err)) {
            rc = -1;
            goto done;
        }
        misses = misses - misses / 8 + (t->merge_off != off ? 32 : 0);
        /* into the table PQ merges later, its slot loaded meanwhile (in rank
           order still: a repeated pair keeps the last rank, as before) */
        tok_umap_prefetch(&t->model.merges, key);
        if (np == PQ && put_oldest(t, pk, pv, &pput, &np, err)) {
            rc = -1;
            goto done;
        }
        pk[(pput + np) % PQ] = key;
        pv[(pput + np) % PQ] = val;
        np++;
        rank++;
        head = (head + 1) % MQ;
        nq--;
    }
    while (np)
        if (put_oldest(t, pk, pv, &pput, &np, err)) {
            rc = -1;
            goto done;
        }
    sp(&c);
    rc = c.p == c.e ? 1 : 0;
done:
    for (size_t k = 0; k < MQ; k++) {
        tok_buf_free(&ring[k].a);
        tok_buf_free(&ring[k].b);
    }
    return rc;
}
