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
 *   recurrent:   (a cache with recurrent layers only) i32 n_layers conv_dim
 *                conv_k n_k_heads n_v_heads k_dim v_dim v_tiled (the value
 *                heads' order: a GGUF model's state is not a safetensors
 *                one's)  u64 slot bytes
 *   the row:     i32 len converted, then per group i32 first n_blocks;
 *                with recurrent layers, i32 has_state (1 iff len > 0)
 *   payload:     per group, its blocks' bytes in table order; then the
 *                state slot's bytes when has_state
 *   u32 CRC-32 (IEEE) of every byte before it
 * A blob loads only into a cache of the same kind and shape; every field is
 * checked before anything is allocated, and the row changes only once the
 * whole blob has been taken.
 *
 * Both directions stream: the writer emits the header, then one block at a
 * time (so a caller can interleave writing a long row with other work, and
 * a file never needs the row twice in memory); the reader takes blocks one
 * at a time into the row's new blocks and checks the CRC at the end.
 * ember_kv_row_save / ember_kv_row_load are the in-memory forms.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/util.h"
#include "kv_internal.h"

#define BLOB_MAGIC "EMKVROW"
#define BLOB_VERSION 1u
#define BLOB_MAX_HEADER 4096u /* far above any real header (16 + 60 + 32 per group) */

/* CRC-32, reflected polynomial 0xEDB88320, eight bytes per step through
   eight 256-entry tables built once. */
static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 255];
}

uint32_t kv_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_tab[7][lo & 255] ^ crc_tab[6][lo >> 8 & 255] ^ crc_tab[5][lo >> 16 & 255] ^ crc_tab[4][lo >> 24] ^
            crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^ crc_tab[0][p[7]];
    }
    while (n--) c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 255];
    return ~c;
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
        unsigned char *q = ember_realloc(w->p, cap);
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

static uint32_t rd32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, at;
} rbuf;

static bool get32(rbuf *r, uint32_t *v) {
    if (r->n - r->at < 4) return false;
    *v = rd32(r->p + r->at);
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
    if (kv->rec.n_layers) {
        const ember_rec_shape *r = &kv->rec.shape;
        int q[] = {kv->rec.n_layers, r->conv_dim, r->conv_k, r->n_k_heads, r->n_v_heads, r->k_dim, r->v_dim, r->v_tiled};
        for (size_t i = 0; i < EMBER_ARRAY_LEN(q); i++) put32(w, (uint32_t)q[i]);
        put64(w, kv->rec.pool.block_bytes);
    }
}

/* ---- writing ---------------------------------------------------------------------- */

struct kv_blob_writer {
    ember_kv *kv;
    const ember_kv_rowstate *s;
    wbuf hdr;            /* the header, written by the first step */
    int stage;           /* 0 header, 1 blocks, 2 CRC, 3 done */
    int g, i;            /* the next block: group g, table entry i */
    uint32_t crc;
    unsigned char *blk;  /* [big] scratch */
    size_t big;          /* the largest block, at least 64 KiB (state pieces) */
    size_t off;          /* stage 4: bytes of the state slot written */
    size_t total;
};

int kv_blob_writer_new(ember_kv *kv, const ember_kv_rowstate *s, kv_blob_writer **out, ember_error *err) {
    *out = NULL;
    kv_blob_writer *w = ember_calloc(1, sizeof *w);
    if (!w) return ember_err(err, EMBER_ERR_NOMEM, "out of memory saving a KV row");
    w->kv = kv;
    w->s = s;
    put(&w->hdr, BLOB_MAGIC, 8);
    put32(&w->hdr, BLOB_VERSION);
    put32(&w->hdr, 0); /* header bytes, filled below */
    put_shape(&w->hdr, kv, s->converted);
    put32(&w->hdr, (uint32_t)s->len);
    put32(&w->hdr, s->converted ? 1u : 0u);
    size_t big = 0, total = 0;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_tab *t = &s->tabs[g];
        put32(&w->hdr, (uint32_t)t->first);
        put32(&w->hdr, (uint32_t)t->n);
        size_t bb = kv->g[g].pool[s->converted ? 1 : 0].block_bytes;
        if (bb > big) big = bb;
        total += (size_t)t->n * bb;
    }
    if (kv->rec.n_layers) {
        put32(&w->hdr, s->slot >= 0 ? 1u : 0u);
        if (s->slot >= 0) total += kv->rec.pool.block_bytes;
    }
    if (!w->hdr.fail) {
        uint32_t h = (uint32_t)w->hdr.n;
        unsigned char b[4] = {(unsigned char)h, (unsigned char)(h >> 8), (unsigned char)(h >> 16),
                              (unsigned char)(h >> 24)};
        memcpy(w->hdr.p + 12, b, 4);
    }
    w->total = w->hdr.n + total + 4;
    if (kv->rec.n_layers && big < (1u << 16)) big = 1u << 16;
    w->big = big ? big : 1;
    if (w->hdr.fail || !(w->blk = ember_malloc(w->big))) {
        kv_blob_writer_free(w);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory saving a KV row");
    }
    *out = w;
    return EMBER_OK;
}

size_t kv_blob_writer_size(const kv_blob_writer *w) { return w->total; }

void kv_blob_writer_free(kv_blob_writer *w) {
    if (!w) return;
    free(w->hdr.p);
    free(w->blk);
    free(w);
}

int kv_blob_writer_step(kv_blob_writer *w, kv_sink *out, size_t bytes, ember_error *err) {
    ember_kv *kv = w->kv;
    size_t done = 0;
    int rc;
    if (w->stage == 0) {
        if ((rc = out->write(out->u, w->hdr.p, w->hdr.n, err))) return rc;
        w->crc = kv_crc32(0, w->hdr.p, w->hdr.n);
        done += w->hdr.n;
        w->stage = 1;
    }
    while (w->stage == 1 && done < bytes) {
        if (w->g == kv->n_groups) {
            w->stage = kv->rec.n_layers && w->s->slot >= 0 ? 4 : 2;
            break;
        }
        const kv_tab *t = &w->s->tabs[w->g];
        if (w->i >= t->n) {
            w->g++;
            w->i = 0;
            continue;
        }
        kv_pool *p = &kv->g[w->g].pool[w->s->converted ? 1 : 0];
        if ((rc = kv->be->ops->read(kv->be, &p->t, (size_t)t->blk[w->i] * p->block_bytes, w->blk, p->block_bytes,
                                    err)))
            return rc;
        if ((rc = out->write(out->u, w->blk, p->block_bytes, err))) return rc;
        w->crc = kv_crc32(w->crc, w->blk, p->block_bytes);
        done += p->block_bytes;
        w->i++;
    }
    while (w->stage == 4 && done < bytes) { /* the state slot, in pieces of the largest block */
        const size_t sb = kv->rec.pool.block_bytes, piece = sb - w->off < w->big ? sb - w->off : w->big;
        if ((rc = kv->be->ops->read(kv->be, &kv->rec.pool.t, (size_t)w->s->slot * sb + w->off, w->blk, piece, err)) ||
            (rc = out->write(out->u, w->blk, piece, err)))
            return rc;
        w->crc = kv_crc32(w->crc, w->blk, piece);
        done += piece;
        if ((w->off += piece) == sb) w->stage = 2;
    }
    if (w->stage == 2) {
        unsigned char b[4] = {(unsigned char)w->crc, (unsigned char)(w->crc >> 8), (unsigned char)(w->crc >> 16),
                              (unsigned char)(w->crc >> 24)};
        if ((rc = out->write(out->u, b, 4, err))) return rc;
        w->stage = 3;
    }
    return w->stage == 3 ? 0 : 1;
}

static int mem_write(void *u, const void *p, size_t n, ember_error *err) {
    wbuf *w = u;
    put(w, p, n);
    return w->fail ? ember_err(err, EMBER_ERR_NOMEM, "out of memory saving a KV row") : EMBER_OK;
}

int ember_kv_row_save(ember_kv *kv, int r, void **blob, size_t *n, ember_error *err) {
    *blob = NULL;
    *n = 0;
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->open || kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in the middle of a forward or a speculative round",
                         r);
    ember_kv_rowstate *s;
    int rc = ember_kv_extract(kv, r, &s, err);
    if (rc) return rc;
    kv_blob_writer *w;
    wbuf out = {0};
    if (!(rc = kv_blob_writer_new(kv, s, &w, err))) {
        kv_sink sink = {mem_write, &out};
        while ((rc = kv_blob_writer_step(w, &sink, SIZE_MAX, err)) > 0) {}
        kv_blob_writer_free(w);
    }
    ember_kv_rowstate_free(kv, s);
    if (rc) {
        free(out.p);
        return rc;
    }
    *blob = out.p;
    *n = out.n;
    return EMBER_OK;
}

/* ---- reading ---------------------------------------------------------------------- */

#define BAD(...) ember_err(err, EMBER_ERR_FORMAT, "KV row blob: " __VA_ARGS__)

/* The parsed header of a blob that fits this cache. */
typedef struct blob_info {
    size_t hdr, total;
    int len;
    bool conv;
    bool state; /* a recurrent state follows the blocks */
    int first[EMBER_KV_MAX_GROUPS], cnt[EMBER_KV_MAX_GROUPS];
} blob_info;

/* Parses and checks the header at b (n bytes available, >= 16). When n is
   short of the header, *need gets its size and EMBER_OK is returned with bi
   untouched; otherwise *need is 0. */
static int parse_header(ember_kv *kv, const unsigned char *b, size_t n, size_t *need, blob_info *bi,
                        ember_error *err) {
    *need = 0;
    if (n < 16) return BAD("too short (%zu bytes)", n);
    if (memcmp(b, BLOB_MAGIC, 8)) return BAD("not a KV row (bad magic)");
    uint32_t ver = rd32(b + 8), hdr = rd32(b + 12);
    if (ver != BLOB_VERSION) return BAD("version %u, this build reads version %u", ver, BLOB_VERSION);
    if (hdr < 16 || hdr > BLOB_MAX_HEADER) return BAD("bad header size");
    if (n < hdr) {
        *need = hdr;
        return EMBER_OK;
    }
    rbuf rd = {b, hdr, 16};
    /* the kind and shape must be this cache's, byte for byte */
    uint32_t lenv, conv;
    size_t shape_at = rd.at;
    if (shape_at + 24 > rd.n) return BAD("truncated header");
    rd.at += 24;
    int f[9];
    for (int i = 0; i < 9; i++)
        if (!geti(&rd, &f[i])) return BAD("truncated header");
    uint64_t bb;
    if (f[8] != kv->n_groups || (f[8] < 1 && !kv->rec.n_layers) || f[8] > EMBER_KV_MAX_GROUPS)
        return BAD("made by a cache of another shape");
    for (int g = 0; g < f[8]; g++) {
        int gl, gh, gd, gw;
        if (!geti(&rd, &gl) || !geti(&rd, &gh) || !geti(&rd, &gd) || !geti(&rd, &gw) || !get64(&rd, &bb))
            return BAD("truncated header");
    }
    if (kv->rec.n_layers) { /* the recurrent fields (compared below with the rest of the shape) */
        int q;
        for (int i = 0; i < 8; i++)
            if (!geti(&rd, &q)) return BAD("truncated header");
        if (!get64(&rd, &bb)) return BAD("truncated header");
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
    size_t payload = 0;
    for (int g = 0; g < kv->n_groups; g++) {
        if (!geti(&rd, &bi->first[g]) || !geti(&rd, &bi->cnt[g])) return BAD("truncated header");
        const kv_group *G = &kv->g[g];
        int first = bi->first[g], cnt = bi->cnt[g];
        int end = (len + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK;
        if (first < 0 || cnt < 0 || first > end || cnt != end - first || (!G->window && first) ||
            (len == 0 && (first || cnt)))
            return BAD("block table of group %d does not match %d positions", g, len);
        if (G->window && first > 0 && first * EMBER_KV_BLOCK + G->window - 1 > len)
            return BAD("group %d dropped positions its window still needs", g);
        size_t add;
        if (!ember_mul_ok((size_t)cnt, G->pool[conv ? 1 : 0].block_bytes, &add) ||
            !ember_add_ok(payload, add, &payload))
            return BAD("payload size overflows");
    }
    bi->state = false;
    if (kv->rec.n_layers) {
        uint32_t has;
        if (!get32(&rd, &has)) return BAD("truncated header");
        if (has > 1 || (has == 1) != (len > 0)) return BAD("recurrent state flag %u does not match its length %d", has, len);
        bi->state = has == 1;
        if (bi->state && !ember_add_ok(payload, kv->rec.pool.block_bytes, &payload)) return BAD("payload size overflows");
    }
    if (rd.at != hdr) return BAD("header size does not match its fields");
    if (!ember_add_ok(payload, (size_t)hdr + 4, &bi->total)) return BAD("payload size overflows");
    bi->hdr = hdr;
    bi->len = len;
    bi->conv = conv == 1;
    return EMBER_OK;
}

int kv_blob_check(ember_kv *kv, const void *b, size_t n, size_t *need, size_t *total, int *len, ember_error *err) {
    blob_info bi;
    int rc = parse_header(kv, b, n, need, &bi, err);
    if (rc || *need) return rc;
    *total = bi.total;
    *len = bi.len;
    return EMBER_OK;
}

/* Takes the blocks of bi from in (positioned after the header, crc so far
   in *crc), then the CRC; on success row r holds them. */
static int read_payload(ember_kv *kv, int r, const blob_info *bi, kv_source *in, uint32_t crc, ember_error *err) {
    kv_tab nt[EMBER_KV_MAX_GROUPS];
    memset(nt, 0, sizeof nt);
    size_t big = 0;
    for (int g = 0; g < kv->n_groups; g++)
        if (kv->g[g].pool[bi->conv ? 1 : 0].block_bytes > big) big = kv->g[g].pool[bi->conv ? 1 : 0].block_bytes;
    unsigned char *blk = ember_malloc(big ? big : 1);
    int rc = blk ? EMBER_OK : ember_err(err, EMBER_ERR_NOMEM, "out of memory loading a KV row");
    for (int g = 0; g < kv->n_groups && !rc; g++) {
        kv_pool *p = &kv->g[g].pool[bi->conv ? 1 : 0];
        int cnt = bi->cnt[g];
        if (cnt && !(nt[g].blk = ember_malloc((size_t)(cnt + 8) * sizeof *nt[g].blk))) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory loading a KV row");
            break;
        }
        nt[g].cap = cnt ? cnt + 8 : 0;
        nt[g].first = bi->first[g];
        for (int i = 0; i < cnt && !rc; i++) {
            int32_t id = kv_pool_take(kv, p);
            if (id < 0) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (loading a row of %d positions)", bi->len);
                break;
            }
            nt[g].blk[nt[g].n++] = id;
            if ((rc = in->read(in->u, blk, p->block_bytes, err))) break;
            crc = kv_crc32(crc, blk, p->block_bytes);
            rc = kv->be->ops->write(kv->be, &p->t, (size_t)id * p->block_bytes, blk, p->block_bytes, err);
        }
    }
    int32_t slot = -1; /* the recurrent state, read in pieces into a new slot */
    if (!rc && bi->state) {
        const size_t sb = kv->rec.pool.block_bytes;
        size_t piece = big > (1u << 16) ? big : (1u << 16);
        unsigned char *tmp = ember_realloc(blk, piece);
        if (!tmp) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory loading a KV row");
        } else {
            blk = tmp;
            if ((slot = kv_pool_take(kv, &kv->rec.pool)) < 0)
                rc = ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (loading a row's recurrent state)");
        }
        for (size_t off = 0; !rc && off < sb; off += piece) {
            size_t nb = sb - off < piece ? sb - off : piece;
            if (!(rc = in->read(in->u, blk, nb, err))) {
                crc = kv_crc32(crc, blk, nb);
                rc = kv->be->ops->write(kv->be, &kv->rec.pool.t, (size_t)slot * sb + off, blk, nb, err);
            }
        }
    }
    unsigned char cb[4];
    if (!rc && !(rc = in->read(in->u, cb, 4, err)) && rd32(cb) != crc)
        rc = BAD("checksum mismatch (corrupt or truncated)");
    free(blk);
    if (rc) {
        if (slot >= 0) kv_pool_unref(kv, &kv->rec.pool, slot);
        for (int g = 0; g < kv->n_groups; g++) {
            kv_pool *p = &kv->g[g].pool[bi->conv ? 1 : 0];
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
    kv->rows[r].len = bi->len;
    kv->rows[r].converted = bi->conv;
    kv->rows[r].spec_base = -1;
    kv->rows[r].slot = slot;
    return EMBER_OK;
}

static int row_check(ember_kv *kv, int r, ember_error *err) {
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->open || kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in the middle of a forward or a speculative round",
                         r);
    return EMBER_OK;
}

int kv_blob_read(ember_kv *kv, int r, kv_source *in, size_t n, ember_error *err) {
    int rc = row_check(kv, r, err);
    if (rc) return rc;
    unsigned char hb[BLOB_MAX_HEADER];
    if (n < 16) return BAD("too short (%zu bytes)", n);
    if ((rc = in->read(in->u, hb, 16, err))) return rc;
    blob_info bi;
    size_t need;
    if ((rc = parse_header(kv, hb, 16, &need, &bi, err))) return rc;
    if (need) {
        if (need > n) return BAD("truncated header");
        if ((rc = in->read(in->u, hb + 16, need - 16, err))) return rc;
        if ((rc = parse_header(kv, hb, need, &need, &bi, err))) return rc;
    }
    if (bi.total != n) return BAD("%zu bytes, its header says %zu", n, bi.total);
    return read_payload(kv, r, &bi, in, kv_crc32(0, hb, bi.hdr), err);
}

static int mem_read(void *u, void *p, size_t n, ember_error *err) {
    rbuf *r = u;
    if (r->n - r->at < n) return BAD("truncated");
    memcpy(p, r->p + r->at, n);
    r->at += n;
    return EMBER_OK;
}

int ember_kv_row_load(ember_kv *kv, int r, const void *blob, size_t n, ember_error *err) {
    int rc = row_check(kv, r, err);
    if (rc) return rc;
    if (!blob || n < 16 + 4) return BAD("too short (%zu bytes)", n);
    const unsigned char *b = blob;
    /* the whole blob is at hand: its checksum first, so a damaged blob is named as such */
    if (!memcmp(b, BLOB_MAGIC, 8) && rd32(b + 8) == BLOB_VERSION && kv_crc32(0, b, n - 4) != rd32(b + n - 4))
        return BAD("checksum mismatch (corrupt or truncated)");
    rbuf rd = {b, n, 0};
    kv_source src = {mem_read, &rd};
    return kv_blob_read(kv, r, &src, n, err);
}
