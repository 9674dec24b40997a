/*
 * kv_blob.c - a row of the KV cache as bytes: ember_kv_row_save and
 * ember_kv_row_load (kv.h).
 *
 * Format (version 1, little-endian):
 *   "EMKVROW\0"  u32 version  u32 header bytes (H, counted from offset 0)
 *   the kind:    name[24]  i32 k_enc v_enc k_bits v_bits group quant_start
 *   the shape:   i32 block n_layers n_groups, then per group
 *                i32 n_layers n_heads head_dim window  u64 block_bytes of
 *                the pool the row uses
 *   the row:     i32 len converted, then per group i32 first n_blocks
 *   payload:     per group, its blocks' bytes in table order
 *   u32 CRC-32 (IEEE) of every byte before it
 * A blob loads only into a cache of the same kind and shape; every field is
 * checked before anything is allocated, and the row changes only once the
 * whole blob has been taken.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv_internal.h"

#define BLOB_MAGIC "EMKVROW"
#define BLOB_VERSION 1u

/* CRC-32, reflected polynomial 0xEDB88320, bitwise with a nibble table. */
static uint32_t crc32_ieee(const unsigned char *p, size_t n) {
    static const uint32_t t[16] = {0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4,
                                   0x4db26158, 0x5005713c, 0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
                                   0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c};
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        c = (c >> 4) ^ t[c & 15];
        c = (c >> 4) ^ t[c & 15];
    }
    return c ^ 0xffffffffu;
}

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    bool fail;
} wbuf;

/* Appends n bytes to w (left for the caller to fill); false when out of memory. */
static bool reserve(wbuf *w, size_t n) {
    if (w->fail) return false;
    if (n > w->cap - w->n) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->n < n) {
            if (cap > SIZE_MAX / 2) {
                w->fail = true;
                return false;
            }
            cap *= 2;
        }
        unsigned char *q = realloc(w->p, cap);
        if (!q) {
            w->fail = true;
            return false;
        }
        w->p = q;
        w->cap = cap;
    }
    w->n += n;
    return true;
}

static void put(wbuf *w, const void *src, size_t n) {
    if (reserve(w, n) && n) memcpy(w->p + w->n - n, src, n);
}

static void put32(wbuf *w, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(w, b, 4);
}

static void put64(wbuf *w, uint64_t v) {
    put32(w, (uint32_t)v);
    put32(w, (uint32_t)(v >> 32));
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, at;
} rbuf;

static bool get32(rbuf *r, uint32_t *v) {
    if (r->n - r->at < 4) return false;
    const unsigned char *b = r->p + r->at;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    r->at += 4;
    return true;
}

static bool geti(rbuf *r, int *v) {
    uint32_t u;
    if (!get32(r, &u)) return false;
    *v = (int)(int32_t)u;
    return true;
}

static bool get64(rbuf *r, uint64_t *v) {
    uint32_t lo, hi;
    if (!get32(r, &lo) || !get32(r, &hi)) return false;
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

/* The kind and shape fields, as both save and load see them. */
static void put_shape(wbuf *w, const ember_kv *kv, bool converted) {
    char name[24] = {0};
    for (size_t i = 0; i < sizeof name - 1 && kv->type.name[i]; i++) name[i] = kv->type.name[i];
    put(w, name, sizeof name);
    const ember_kv_type *t = &kv->type;
    int f[] = {(int)t->k_enc, (int)t->v_enc, t->k_bits, t->v_bits, t->group, t->quant_start, EMBER_KV_BLOCK,
               kv->n_layers, kv->n_groups};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(f); i++) put32(w, (uint32_t)f[i]);
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        put32(w, (uint32_t)G->n_layers);
        put32(w, (uint32_t)G->n_heads);
        put32(w, (uint32_t)G->head_dim);
        put32(w, (uint32_t)G->window);
        put64(w, G->pool[converted ? 1 : 0].block_bytes);
    }
}

int ember_kv_row_save(ember_kv *kv, int r, void **blob, size_t *n, ember_error *err) {
    *blob = NULL;
    *n = 0;
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->open || kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in the middle of a forward or a speculative round",
                         r);
    const kv_row *row = &kv->rows[r];
    wbuf w = {0};
    put(&w, BLOB_MAGIC, 8);
    put32(&w, BLOB_VERSION);
    size_t hdr_at = w.n;
    put32(&w, 0); /* header bytes, filled below */
    put_shape(&w, kv, row->converted);
    put32(&w, (uint32_t)row->len);
    put32(&w, row->converted ? 1u : 0u);
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_tab *t = kv_tab_of(kv, g, r);
        put32(&w, (uint32_t)t->first);
        put32(&w, (uint32_t)t->n);
    }
    if (!w.fail) {
        uint32_t h = (uint32_t)w.n;
        unsigned char b[4] = {(unsigned char)h, (unsigned char)(h >> 8), (unsigned char)(h >> 16),
                              (unsigned char)(h >> 24)};
        memcpy(w.p + hdr_at, b, 4);
    }
    int rc = EMBER_OK;
    for (int g = 0; g < kv->n_groups && !rc && !w.fail; g++) {
        const kv_tab *t = kv_tab_of(kv, g, r);
        kv_pool *p = kv_pool_of(kv, g, r);
        for (int i = 0; i < t->n && !rc && !w.fail; i++) {
            size_t at = w.n;
            if (reserve(&w, p->block_bytes))
                rc = kv->be->ops->read(kv->be, &p->t, (size_t)t->blk[i] * p->block_bytes, w.p + at, p->block_bytes,
                                       err);
        }
    }
    if (!rc && !w.fail) put32(&w, crc32_ieee(w.p, w.n));
    if (!rc && w.fail) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory saving a KV row");
    if (rc) {
        free(w.p);
        return rc;
    }
    *blob = w.p;
    *n = w.n;
    return EMBER_OK;
}

#define BAD(...) ember_err(err, EMBER_ERR_FORMAT, "KV row blob: " __VA_ARGS__)

int ember_kv_row_load(ember_kv *kv, int r, const void *blob, size_t n, ember_error *err) {
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->open || kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in the middle of a forward or a speculative round",
                         r);
    if (!blob || n < 8 + 4 + 4 + 4) return BAD("too short (%zu bytes)", n);
    const unsigned char *b = blob;
    if (memcmp(b, BLOB_MAGIC, 8)) return BAD("not a KV row (bad magic)");
    rbuf rd = {b, n - 4, 8};
    uint32_t ver, hdr, crc_have = (uint32_t)b[n - 4] | (uint32_t)b[n - 3] << 8 | (uint32_t)b[n - 2] << 16 |
                                  (uint32_t)b[n - 1] << 24;
    if (!get32(&rd, &ver) || ver != BLOB_VERSION) return BAD("version %u, this build reads version %u", ver, BLOB_VERSION);
    if (crc32_ieee(b, n - 4) != crc_have) return BAD("checksum mismatch (corrupt or truncated)");
    if (!get32(&rd, &hdr) || hdr > n - 4) return BAD("bad header size");
    /* the kind and shape must be this cache's, byte for byte */
    uint32_t lenv, conv;
    size_t shape_at = rd.at;
    if (shape_at + 24 > rd.n) return BAD("truncated header");
    rd.at += 24;
    int f[9];
    for (int i = 0; i < 9; i++)
        if (!geti(&rd, &f[i])) return BAD("truncated header");
    uint64_t bb[EMBER_KV_MAX_GROUPS];
    if (f[8] != kv->n_groups || f[8] < 1 || f[8] > EMBER_KV_MAX_GROUPS) return BAD("made by a cache of another shape");
    for (int g = 0; g < f[8]; g++) {
        int gl, gh, gd, gw;
        if (!geti(&rd, &gl) || !geti(&rd, &gh) || !geti(&rd, &gd) || !geti(&rd, &gw) || !get64(&rd, &bb[g]))
            return BAD("truncated header");
    }
    size_t shape_end = rd.at;
    if (!get32(&rd, &lenv) || !get32(&rd, &conv)) return BAD("truncated header");
    if (conv > 1) return BAD("bad conversion flag");
    wbuf mine = {0};
    put_shape(&mine, kv, conv == 1);
    bool same = !mine.fail && mine.n == shape_end - shape_at && !memcmp(mine.p, b + shape_at, mine.n);
    free(mine.p);
    if (mine.fail) return ember_err(err, EMBER_ERR_NOMEM, "out of memory loading a KV row");
    if (!same) return BAD("made by a cache of another model or KV kind");
    int len = (int)lenv;
    if (lenv > (uint32_t)kv->n_ctx) return BAD("%u positions, beyond the context of %d", lenv, kv->n_ctx);
    int qs = kv->type.quant_start;
    if ((conv && !(qs > 0 && len >= qs)) || (!conv && qs > 0 && len > qs))
        return BAD("conversion flag %u does not match its length %d (converting at %d)", conv, len, qs);
    int first[EMBER_KV_MAX_GROUPS], cnt[EMBER_KV_MAX_GROUPS];
    size_t payload = 0;
    for (int g = 0; g < kv->n_groups; g++) {
        if (!geti(&rd, &first[g]) || !geti(&rd, &cnt[g])) return BAD("truncated header");
        const kv_group *G = &kv->g[g];
        int end = (len + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK;
        if (first[g] < 0 || cnt[g] < 0 || first[g] > end || cnt[g] != end - first[g] || (!G->window && first[g]) ||
            (len == 0 && (first[g] || cnt[g])))
            return BAD("block table of group %d does not match %d positions", g, len);
        if (G->window && first[g] > 0 && first[g] * EMBER_KV_BLOCK + G->window - 1 > len)
            return BAD("group %d dropped positions its window still needs", g);
        size_t add;
        if (!ember_mul_ok((size_t)cnt[g], G->pool[conv ? 1 : 0].block_bytes, &add) ||
            !ember_add_ok(payload, add, &payload))
            return BAD("payload size overflows");
    }
    if (rd.at != hdr) return BAD("header size does not match its fields");
    if (rd.n - rd.at != payload) return BAD("%zu payload bytes, %zu expected", rd.n - rd.at, payload);
    /* take blocks, fill them, then swap the row */
    kv_tab nt[EMBER_KV_MAX_GROUPS];
    memset(nt, 0, sizeof nt);
    int rc = EMBER_OK;
    size_t at = rd.at;
    for (int g = 0; g < kv->n_groups && !rc; g++) {
        kv_pool *p = &kv->g[g].pool[conv ? 1 : 0];
        if (cnt[g] && !(nt[g].blk = malloc((size_t)(cnt[g] + 8) * sizeof *nt[g].blk))) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory loading a KV row");
            break;
        }
        nt[g].cap = cnt[g] ? cnt[g] + 8 : 0;
        nt[g].first = first[g];
        for (int i = 0; i < cnt[g] && !rc; i++) {
            int32_t id = kv_pool_take(kv, p);
            if (id < 0) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (loading a row of %d positions)", len);
                break;
            }
            nt[g].blk[nt[g].n++] = id;
            rc = kv->be->ops->write(kv->be, &p->t, (size_t)id * p->block_bytes, b + at, p->block_bytes, err);
            at += p->block_bytes;
        }
    }
    if (rc) {
        for (int g = 0; g < kv->n_groups; g++) {
            kv_pool *p = &kv->g[g].pool[conv ? 1 : 0];
            for (int i = 0; i < nt[g].n; i++) kv_pool_unref(kv, p, nt[g].blk[i]);
            free(nt[g].blk);
        }
        return rc;
    }
    ember_kv_clear(kv, r);
    for (int g = 0; g < kv->n_groups; g++) {
        kv_tab *t = kv_tab_of(kv, g, r);
        free(t->blk);
        *t = nt[g];
    }
    kv->rows[r].len = len;
    kv->rows[r].converted = conv == 1;
    kv->rows[r].spec_base = -1;
    return EMBER_OK;
}
