/*
 * tok_util.c - buffers, arenas, hash maps, UTF-8 and whitespace helpers for
 * the tokenizer (see tok_internal.h).
 *
 * Owner: tokenizer module. No global mutable state: the only file-scope
 * data are constant tables. Every function is reentrant.
 */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/util.h"
#include "tok_internal.h"

/* ---- tok_buf -------------------------------------------------------------- */

int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->n - 1) return EMBER_ERR_NOMEM;
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return EMBER_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = ember_realloc(b->p, cap);
    if (!p) return EMBER_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return EMBER_OK;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (tok_buf_reserve(b, n)) return EMBER_ERR_NOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return EMBER_OK;
}

int tok_buf_putc(tok_buf *b, char c) {
    if (b->n + 1 >= b->cap && tok_buf_reserve(b, 1)) return EMBER_ERR_NOMEM;
    b->p[b->n++] = c;
    b->p[b->n] = '\0';
    return EMBER_OK;
}

int tok_buf_put_cp(tok_buf *b, uint32_t cp) {
    char tmp[4];
    return tok_buf_put(b, tmp, ember_utf8_put(cp, tmp));
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- tok_ivec ------------------------------------------------------------- */

int tok_ivec_reserve(tok_ivec *v, size_t extra) {
    if (extra > (SIZE_MAX / sizeof(int32_t)) / 2 - v->n) return EMBER_ERR_NOMEM;
    size_t need = v->n + extra;
    if (need <= v->cap) return EMBER_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *p = ember_realloc(v->v, cap * sizeof *p);
    if (!p) return EMBER_ERR_NOMEM;
    v->v = p;
    v->cap = cap;
    return EMBER_OK;
}

int tok_ivec_push(tok_ivec *v, int32_t x) {
    if (v->n == v->cap && tok_ivec_reserve(v, 1)) return EMBER_ERR_NOMEM;
    v->v[v->n++] = x;
    return EMBER_OK;
}

void tok_ivec_free(tok_ivec *v) {
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

/* ---- tok_arena ------------------------------------------------------------ */

struct tok_arena_chunk {
    tok_arena_chunk *next; /* in `all` */
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *tok_arena_alloc(tok_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->head && a->head->cap - a->head->used >= n) {
        void *p = a->head->data + a->head->used;
        a->head->used += n;
        return p;
    }
    /* look for a free chunk left by a reset */
    for (tok_arena_chunk *c = a->all; c; c = c->next) {
        if (c->used == 0 && c->cap >= n) {
            a->head = c;
            c->used = n;
            return c->data;
        }
    }
    size_t cap = n > (1u << 16) ? n : (1u << 16);
    tok_arena_chunk *c = ember_malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->cap = cap;
    c->used = n;
    c->next = a->all;
    a->all = c;
    a->head = c;
    return c->data;
}

char *tok_arena_strdup(tok_arena *a, const char *s, size_t n) {
    if (n > SIZE_MAX - 1) return NULL;
    char *p = tok_arena_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void tok_arena_reset(tok_arena *a) {
    for (tok_arena_chunk *c = a->all; c; c = c->next) c->used = 0;
    a->head = NULL;
}

void tok_arena_free(tok_arena *a) {
    tok_arena_chunk *c = a->all;
    while (c) {
        tok_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->all = a->head = NULL;
}

/* ---- tok_pieces ----------------------------------------------------------- */

int tok_pieces_push(tok_pieces *l, const char *p, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *l->v) return EMBER_ERR_NOMEM;
        tok_piece *v = ember_realloc(l->v, cap * sizeof *v);
        if (!v) return EMBER_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].p = p;
    l->v[l->n].n = n;
    l->n++;
    return EMBER_OK;
}

void tok_pieces_free(tok_pieces *l) {
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* ---- hashing and maps ----------------------------------------------------- */

uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0x9FB21C651E98DF25ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    /* the 0-7 bytes left, read with fixed-size loads (a memcpy of n bytes
       would be a call): two overlapping 4-byte words, or first / middle /
       last byte; the length is in h already */
    uint64_t v = 0;
    if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, s, 4);
        memcpy(&hi, s + n - 4, 4);
        v = (uint64_t)lo | (uint64_t)hi << 32;
    } else if (n) {
        v = (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
    }
    h = (h ^ v) * 0x9FB21C651E98DF25ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

/* Memory for a hash table of `bytes` bytes, released with free(). Tables
   of megabytes are probed at random, one access per lookup: they come
   2 MiB aligned and advised to be backed by huge pages, which cuts the TLB
   misses (advice only: where the kernel declines, nothing changes). */
#define TABLE_HUGE (2u << 20)
static void *table_alloc(size_t bytes) {
    if (bytes < 2 * TABLE_HUGE) return ember_malloc(bytes ? bytes : 1);
    size_t r = (bytes + TABLE_HUGE - 1) & ~(size_t)(TABLE_HUGE - 1);
    void *p = ember_aligned_alloc(TABLE_HUGE, r);
    if (p) madvise(p, r, MADV_HUGEPAGE);
    return p;
}

/* The slot word of a key: its length and 8 bits of its hash (bits the slot
   index does not use, as long as the table has fewer than 2^56 slots). */
static inline uint32_t smap_nt(size_t n, uint64_t h) { return (uint32_t)n | (uint32_t)(h >> 56) << 24; }

/* Rehashes into a table of nslots (a power of two above twice the keys). */
static int smap_resize(tok_smap *m, size_t nslots) {
    if (nslots > ((size_t)1 << 31)) return EMBER_ERR_NOMEM;
    tok_smap_ent *slot = table_alloc(nslots * sizeof *slot);
    if (!slot) return EMBER_ERR_NOMEM;
    memset(slot, 0, nslots * sizeof *slot);
    size_t mask = nslots - 1;
    for (size_t i = 0; m->slot && i <= m->mask; i++) {
        const tok_smap_ent *e = &m->slot[i];
        if (!e->k) continue;
        size_t j = (size_t)tok_hash(e->k, e->nt & (TOK_SMAP_MAX_KEY - 1)) & mask;
        while (slot[j].k) j = (j + 1) & mask;
        slot[j] = *e;
    }
    free(m->slot);
    m->slot = slot;
    m->mask = mask;
    return EMBER_OK;
}

int tok_smap_reserve(tok_smap *m, size_t n) {
    if (n > ((size_t)1 << 30)) return EMBER_ERR_NOMEM;
    size_t have = m->slot ? m->mask + 1 : 0, want = have ? have : 64;
    while (want < n * 2) want *= 2;
    return want == have ? EMBER_OK : smap_resize(m, want);
}

int tok_smap_put(tok_smap *m, const char *k, size_t n, int32_t v, bool replace, int32_t *prev) {
    if (!k) k = "";
    return tok_smap_put_h(m, k, n, tok_hash(k, n), v, replace, prev);
}

int tok_smap_put_h(tok_smap *m, const char *k, size_t n, uint64_t h, int32_t v, bool replace, int32_t *prev) {
    if (prev) *prev = -1;
    if (n >= TOK_SMAP_MAX_KEY) return EMBER_ERR_LIMIT;
    if (!k) k = "";
    if (!m->slot || (m->n + 1) * 2 > m->mask + 1) {
        if (smap_resize(m, m->slot ? (m->mask + 1) * 2 : 64)) return EMBER_ERR_NOMEM;
    }
    uint32_t nt = smap_nt(n, h);
    size_t j = (size_t)h & m->mask;
    while (m->slot[j].k) {
        tok_smap_ent *e = &m->slot[j];
        if (e->nt == nt && (n == 0 || memcmp(e->k, k, n) == 0)) {
            if (prev) *prev = e->v;
            if (replace) e->v = v;
            return EMBER_OK;
        }
        j = (j + 1) & m->mask;
    }
    m->slot[j] = (tok_smap_ent){k, nt, v};
    m->n++;
    return EMBER_OK;
}

int32_t tok_smap_get(const tok_smap *m, const char *k, size_t n) {
    if (!m->slot || n >= TOK_SMAP_MAX_KEY) return -1;
    return tok_smap_get_h(m, k, n, tok_hash(k, n));
}

int32_t tok_smap_get_h(const tok_smap *m, const char *k, size_t n, uint64_t h) {
    if (!m->slot || n >= TOK_SMAP_MAX_KEY) return -1;
    uint32_t nt = smap_nt(n, h);
    size_t j = (size_t)h & m->mask;
    while (m->slot[j].k) {
        const tok_smap_ent *e = &m->slot[j];
        if (e->nt == nt && (n == 0 || memcmp(e->k, k, n) == 0)) return e->v;
        j = (j + 1) & m->mask;
    }
    return -1;
}

void tok_smap_free(tok_smap *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

int tok_umap_init(tok_umap *m, size_t expected) {
    size_t n = 16;
    while (n < expected * 2 + 2) {
        if (n > ((size_t)1 << 40)) return EMBER_ERR_NOMEM;
        n *= 2;
    }
    m->e = table_alloc(n * sizeof *m->e);
    if (!m->e) return EMBER_ERR_NOMEM;
    memset(m->e, 0xFF, n * sizeof *m->e);
    m->mask = n - 1;
    m->n = 0;
    return EMBER_OK;
}

static int umap_rebuild(tok_umap *m, size_t expected) {
    tok_umap g;
    if (tok_umap_init(&g, expected)) return EMBER_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->e[i].key != UINT64_MAX) tok_umap_put(&g, m->e[i].key, m->e[i].val, true);
    tok_umap_free(m);
    *m = g;
    return EMBER_OK;
}

int tok_umap_fit(tok_umap *m) {
    if (!m->e || m->mask + 1 <= 64 || (m->mask + 1) / 4 <= m->n) return EMBER_OK;
    return umap_rebuild(m, m->n);
}

int tok_umap_put(tok_umap *m, uint64_t k, uint64_t v, bool replace) {
    if (!m->e && tok_umap_init(m, 16)) return EMBER_ERR_NOMEM;
    if ((m->n + 1) * 2 > m->mask + 1 && umap_rebuild(m, m->mask + 1)) return EMBER_ERR_NOMEM;
    size_t j = (size_t)ember_mix64(k) & m->mask;
    while (m->e[j].key != UINT64_MAX) {
        if (m->e[j].key == k) {
            if (replace) m->e[j].val = v;
            return EMBER_OK;
        }
        j = (j + 1) & m->mask;
    }
    m->e[j].key = k;
    m->e[j].val = v;
    m->n++;
    return EMBER_OK;
}

bool tok_umap_get(const tok_umap *m, uint64_t k, uint64_t *v) {
    if (!m->e) return false;
    size_t j = (size_t)ember_mix64(k) & m->mask;
    while (m->e[j].key != UINT64_MAX) {
        if (m->e[j].key == k) {
            *v = m->e[j].val;
            return true;
        }
        j = (j + 1) & m->mask;
    }
    return false;
}

void tok_umap_free(tok_umap *m) {
    free(m->e);
    m->e = NULL;
    m->mask = m->n = 0;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

static const uint32_t k_fffd = 0xFFFD;

int tok_u8dec_byte(tok_u8dec *d, unsigned char b, tok_buf *out) {
    for (;;) {
        if (d->need == 0) {
            if (b < 0x80) return tok_buf_putc(out, (char)b);
            if (b >= 0xC2 && b <= 0xDF) {
                d->need = 1;
                d->cp = b & 0x1Fu;
            } else if (b >= 0xE0 && b <= 0xEF) {
                if (b == 0xE0) d->lo = 0xA0;
                if (b == 0xED) d->hi = 0x9F;
                d->need = 2;
                d->cp = b & 0x0Fu;
            } else if (b >= 0xF0 && b <= 0xF4) {
                if (b == 0xF0) d->lo = 0x90;
                if (b == 0xF4) d->hi = 0x8F;
                d->need = 3;
                d->cp = b & 0x07u;
            } else {
                return tok_buf_put_cp(out, k_fffd);
            }
            if (d->lo == 0) d->lo = 0x80;
            if (d->hi == 0) d->hi = 0xBF;
            d->seen = 0;
            return EMBER_OK;
        }
        if (b < d->lo || b > d->hi) {
            /* the sequence so far is invalid: U+FFFD, then reprocess b */
            d->need = d->seen = 0;
            d->lo = d->hi = 0;
            d->cp = 0;
            if (tok_buf_put_cp(out, k_fffd)) return EMBER_ERR_NOMEM;
            continue;
        }
        d->lo = 0x80;
        d->hi = 0xBF;
        d->cp = (d->cp << 6) | (b & 0x3Fu);
        d->seen++;
        if (d->seen == d->need) {
            uint32_t cp = d->cp;
            d->need = d->seen = 0;
            d->lo = d->hi = 0;
            d->cp = 0;
            return tok_buf_put_cp(out, cp);
        }
        return EMBER_OK;
    }
}

int tok_u8dec_finish(tok_u8dec *d, tok_buf *out) {
    if (d->need) {
        memset(d, 0, sizeof *d);
        return tok_buf_put_cp(out, k_fffd);
    }
    memset(d, 0, sizeof *d);
    return EMBER_OK;
}

bool tok_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str, *e = s + n;
    while (s < e) {
        /* fast path: 8 ASCII bytes */
        if (e - s >= 8) {
            uint64_t v;
            memcpy(&v, s, 8);
            if (!(v & 0x8080808080808080ull)) {
                s += 8;
                continue;
            }
        }
        unsigned c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (e - s < 2 || (s[1] & 0xC0) != 0x80) return false;
            s += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (e - s < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return false;
            s += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (e - s < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
                return false;
            s += 4;
        } else {
            return false;
        }
    }
    return true;
}

int tok_utf8_sanitize(const char *s, size_t n, tok_buf *buf, tok_sv *out) {
    if (tok_utf8_valid(s, n)) {
        out->p = s;
        out->n = n;
        return EMBER_OK;
    }
    buf->n = 0;
    if (tok_buf_reserve(buf, n + n / 2 + 4)) return EMBER_ERR_NOMEM;
    tok_u8dec d = {0};
    for (size_t i = 0; i < n; i++)
        if (tok_u8dec_byte(&d, (unsigned char)s[i], buf)) return EMBER_ERR_NOMEM;
    if (tok_u8dec_finish(&d, buf)) return EMBER_ERR_NOMEM;
    out->p = buf->p;
    out->n = buf->n;
    return EMBER_OK;
}

/* ---- whitespace ----------------------------------------------------------- */

bool tok_uni_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

tok_sv tok_trim_start(tok_sv s) {
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        if (!ember_js_space(cp)) break;
        p += l;
    }
    tok_sv r = {(const char *)p, (size_t)(e - p)};
    return r;
}

tok_sv tok_trim_end(tok_sv s) {
    const unsigned char *b = (const unsigned char *)s.p, *e = b + s.n;
    while (e > b) {
        const unsigned char *q = e - 1;
        while (q > b && (*q & 0xC0) == 0x80) q--;
        uint32_t cp;
        tok_utf8_next(q, e, &cp);
        if (!ember_js_space(cp)) break;
        e = q;
    }
    tok_sv r = {s.p, (size_t)(e - b)};
    return r;
}

/* ---- GPT-2 byte mapping ----------------------------------------------------
   Printable bytes map to themselves; the others (0-32, 127-160, 173) take
   the code points 256, 257, ... in byte order. */

#define R16(a) a, a + 1, a + 2, a + 3, a + 4, a + 5, a + 6, a + 7, a + 8, a + 9, a + 10, a + 11, a + 12, a + 13, a + 14, a + 15
const uint16_t tok_byte_to_cp[256] = {
    /* 0x00-0x20 -> 256..288 */
    R16(256), R16(272), 288,
    /* 0x21-0x7E: themselves */
    33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, R16(48), R16(64), R16(80), R16(96),
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126,
    /* 0x7F-0xA0 -> 289..322 */
    289, 290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305, 306, 307, 308,
    309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322,
    /* 0xA1-0xAC: themselves */
    161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172,
    /* 0xAD -> 323 */
    323,
    /* 0xAE-0xFF: themselves */
    174, 175, R16(176), R16(192), R16(208), R16(224), R16(240)};
#undef R16

int tok_cp_to_byte(uint32_t cp) {
    if (cp >= 256 && cp <= 323) {
        uint32_t k = cp - 256;
        if (k <= 32) return (int)k;               /* 0x00..0x20 */
        if (k <= 66) return (int)(0x7F + k - 33); /* 0x7F..0xA0 */
        return 0xAD;
    }
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    return -1;
}
