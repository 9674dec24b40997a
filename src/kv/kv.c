/*
 * kv.c - pools, block tables and the row contract of kv.h.
 *
 * Data: per layer group, one or two pools (two when transitioning: pool 0
 * f32 for rows not yet converted, pool 1 the quantized kind) and per row a
 * block table (tabs[g * n_rows + r]). A pool hands out block ids: freed ids
 * first (a stack, so recently touched memory is reused), then never-used
 * ids in order, so a pool's resident memory follows the most blocks ever
 * held at once. The budget caps the bytes of blocks held over all pools.
 *
 * A forward pass is a transaction: ember_kv_begin records every change it
 * makes (new blocks, copies of shared blocks, conversions) in a journal;
 * ember_kv_end(ok) keeps them or plays the journal backwards.
 *
 * Only the backend touches block bytes (kv_write, kv_read, copy); this file
 * only moves ids.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kv_codec.h"
#include "core/alloc.h"
#include "core/util.h"
#include "kv_internal.h"

/* ---- pools -------------------------------------------------------------------- */

/* A block with reference count 1, or -1 when the pool or the budget is full. */
int32_t kv_pool_take(ember_kv *kv, kv_pool *p) {
    if (kv->used + p->block_bytes > kv->budget) return -1;
    int32_t id;
    if (p->n_free)
        id = p->free[--p->n_free];
    else if (p->next < p->cap)
        id = p->next++;
    else
        return -1;
    p->ref[id] = 1;
    kv->used += p->block_bytes;
    return id;
}

void kv_pool_ref(kv_pool *p, int32_t id) {
    p->ref[id]++;
}

void kv_pool_unref(ember_kv *kv, kv_pool *p, int32_t id) {
    if (--p->ref[id] == 0) {
        p->free[p->n_free++] = id;
        kv->used -= p->block_bytes;
    }
}

/* ---- tables ------------------------------------------------------------------- */

int kv_tab_reserve(kv_tab *t, int n) {
    if (n <= t->cap) return 0;
    int cap = t->cap ? t->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *b = ember_realloc(t->blk, (size_t)cap * sizeof *b);
    if (!b) return -1;
    t->blk = b;
    t->cap = cap;
    return 0;
}

static void tab_release(ember_kv *kv, kv_pool *p, kv_tab *t) {
    for (int i = 0; i < t->n; i++) kv_pool_unref(kv, p, t->blk[i]);
    t->n = 0;
    t->first = 0;
}

kv_tab *kv_tab_of(ember_kv *kv, int g, int r) {
    return &kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r];
}

kv_pool *kv_pool_of(ember_kv *kv, int g, int r) {
    return &kv->g[g].pool[kv->rows[r].converted ? 1 : 0];
}

/* Drops blocks of rotating groups that no position still needed lies in:
   below (base - window - retain), base = the round's start or the length. */
static void row_release_old(ember_kv *kv, int r) {
    const kv_row *row = &kv->rows[r];
    int base = row->spec_base >= 0 ? row->spec_base : row->len;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        if (!G->window) continue;
        int keep = base - G->window - kv->retain;
        if (keep <= 0) continue;
        kv_tab *t = kv_tab_of(kv, g, r);
        int drop = keep / EMBER_KV_BLOCK - t->first;
        if (drop <= 0) continue;
        if (drop > t->n) drop = t->n;
        kv_pool *p = kv_pool_of(kv, g, r);
        for (int i = 0; i < drop; i++) kv_pool_unref(kv, p, t->blk[i]);
        if (t->n > drop) memmove(t->blk, t->blk + drop, (size_t)(t->n - drop) * sizeof *t->blk);
        t->n -= drop;
        t->first += drop;
    }
}

/* Keeps positions [0, n) of row r (n <= len); no checks. */
static void row_cut(ember_kv *kv, int r, int n) {
    for (int g = 0; g < kv->n_groups; g++) {
        kv_tab *t = kv_tab_of(kv, g, r);
        int keep = (n + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK - t->first;
        if (keep < 0) keep = 0;
        kv_pool *p = kv_pool_of(kv, g, r);
        while (t->n > keep) kv_pool_unref(kv, p, t->blk[--t->n]);
        if (n == 0) t->first = 0;
    }
    kv->rows[r].len = n;
    if (n == 0) kv->rows[r].converted = false;
}

/* ---- creation ----------------------------------------------------------------- */

static int pool_init(ember_kv *kv, kv_pool *p, size_t block_bytes, size_t budget, ember_error *err) {
    p->block_bytes = block_bytes;
    size_t cap = budget / block_bytes;
    if (cap > INT32_MAX / 2) cap = INT32_MAX / 2;
    if (cap < 1) cap = 1;
    p->cap = (int)cap;
    if (!kv->be) return EMBER_OK; /* a plan: the size only */
    p->free = ember_malloc(cap * sizeof *p->free);
    p->ref = ember_calloc(cap, sizeof *p->ref);
    if (!p->free || !p->ref) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV block tables");
    const int64_t shape[1] = {(int64_t)(cap * block_bytes)};
    int rc = ember_tensor_alloc(kv->be, &p->t, &p->buf, EMBER_U8, 1, shape, err);
    if (rc && err)
        ember_err_prefix(err, "KV cache pool (%zu blocks of %zu bytes): ", cap, block_bytes);
    return rc;
}

static void pool_fini(kv_pool *p) {
    ember_buffer_free(p->buf);
    free(p->free);
    free(p->ref);
}

void ember_kv_free(ember_kv *kv) {
    if (!kv) return;
    if (kv->tabs)
        for (size_t i = 0; i < (size_t)kv->n_groups * (size_t)kv->n_rows; i++) free(kv->tabs[i].blk);
    for (int g = 0; g < kv->n_groups && kv->g; g++) {
        for (int i = 0; i < 2; i++) pool_fini(&kv->g[g].pool[i]);
        free(kv->g[g].signs);
        free(kv->g[g].layers);
    }
    free(kv->g);
    free(kv->tabs);
    free(kv->refs);
    free(kv->layer_group);
    free(kv->layer_index);
    free(kv->jr);
    free(kv->in_batch);
    if (kv->rows)
        for (int r = 0; r < kv->n_rows; r++) ember_buffer_free(kv->rows[r].log_buf);
    if (kv->rec.n_layers) pool_fini(&kv->rec.pool);
    free(kv->rec.index);
    free(kv->rec.views);
    free(kv->rec.refs);
    free(kv->rows);
    free(kv);
}

/* The codec of the kind for one side (K or V) and head size D. */
static int make_codec(const ember_kv_type *t, bool is_k, bool final, int D, const float *signs, ember_kv_codec *c,
                      ember_error *err) {
    memset(c, 0, sizeof *c);
    c->enc = final ? (is_k ? t->k_enc : t->v_enc) : EMBER_KVE_F32;
    if (c->enc == EMBER_KVE_Q8 || c->enc == EMBER_KVE_Q4) {
        c->group = t->group < D ? t->group : D;
        if (D % c->group)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "KV group size %d does not divide the head size %d",
                             c->group, D);
        if (c->enc == EMBER_KVE_Q4 && D % 2)
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "4-bit KV needs an even head size, not %d", D);
    } else if (c->enc == EMBER_KVE_TQ) {
        c->bits = is_k ? t->k_bits : t->v_bits;
        c->codebook = ember_tq_codebook(c->bits);
        c->bounds = ember_tq_bounds(c->bits);
        c->signs = signs;
        if (D > 1024) return ember_err(err, EMBER_ERR_UNSUPPORTED, "TQ KV supports head sizes up to 1024, not %d", D);
    }
    c->head_bytes = ember_kv_head_bytes(c, D, is_k);
    if (!c->head_bytes) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV kind '%s' cannot hold heads of %d", t->name, D);
    return EMBER_OK;
}

/* Bytes of one block of group G in pool i. */
static size_t group_block_bytes(const kv_group *G, int i) {
    return (size_t)G->n_layers * (size_t)G->n_heads * (G->pool[i].k.head_bytes + G->pool[i].v.head_bytes);
}

/* Blocks a row of n positions holds at most in group G (rotating groups
   keep window + retain positions behind the newest, plus a chunk). */
static size_t group_row_blocks(const ember_kv *kv, const kv_group *G, int n) {
    size_t b = ((size_t)n + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK;
    if (G->window) {
        size_t cap = ((size_t)G->window + (size_t)kv->retain + (size_t)kv->max_chunk) / EMBER_KV_BLOCK + 2;
        if (b > cap) b = cap;
    }
    return b;
}

size_t ember_kv_request_bytes(const ember_kv *kv, int n) {
    size_t total = 2 * kv->rec.pool.block_bytes; /* the state, and the next one during a forward */
    bool trans = kv->type.quant_start > 0;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        size_t b = group_row_blocks(kv, G, n);
        if (!trans || n <= kv->type.quant_start) {
            total += b * G->pool[0].block_bytes;
        } else { /* the forward that converts holds the f32 copy of the first
                    quant_start positions beside the quantized row */
            total += group_row_blocks(kv, G, kv->type.quant_start) * G->pool[0].block_bytes + b * G->pool[1].block_bytes;
        }
    }
    return total;
}

int ember_kv_new(ember_backend *be, const ember_kv_params *p, ember_kv **out, ember_error *err) {
    *out = NULL;
    if (!p || p->n_layers < 1 || p->n_rows < 1 || p->n_ctx < 1 || !p->n_heads || !p->head_dim ||
        p->n_rows > (1 << 20) || p->n_ctx > (1 << 28))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid KV cache dimensions");
    for (int l = 0; l < p->n_layers; l++)
        if (p->n_heads[l] < 1 || p->head_dim[l] < 1 || p->n_heads[l] > 4096 || p->head_dim[l] > 4096 ||
            (p->window && p->window[l] < 0))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid KV cache dimensions for layer %d", l);
    ember_kv *kv = ember_calloc(1, sizeof *kv);
    if (!kv) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    kv->be = be;
    kv->type = p->type;
    kv->n_layers = p->n_layers;
    kv->n_rows = p->n_rows;
    kv->n_ctx = p->n_ctx;
    kv->retain = p->retain < 0 ? 64 : p->retain;
    kv->max_chunk = p->max_chunk > 0 ? p->max_chunk : 512;
    kv->layer_group = ember_calloc((size_t)p->n_layers, sizeof *kv->layer_group);
    kv->layer_index = ember_calloc((size_t)p->n_layers, sizeof *kv->layer_index);
    kv->g = ember_calloc((size_t)p->n_layers, sizeof *kv->g);
    kv->rows = ember_calloc((size_t)p->n_rows, sizeof *kv->rows);
    kv->in_batch = ember_calloc((size_t)p->n_rows, sizeof *kv->in_batch);
    int rc = EMBER_OK;
    if (!kv->layer_group || !kv->layer_index || !kv->g || !kv->rows || !kv->in_batch)
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    /* layer groups */
    if (!rc) rc = kv_rec_init(kv, p, err);
    for (int l = 0; l < p->n_layers && !rc; l++) {
        if (kv->rec.n_layers && kv->rec.index[l] >= 0) {
            kv->layer_group[l] = -1; /* recurrent state, no keys and values */
            continue;
        }
        int w = p->window ? p->window[l] : 0;
        if (w >= p->n_ctx) w = 0; /* a window the context never exceeds is full attention */
        int g = 0;
        while (g < kv->n_groups &&
               !(kv->g[g].n_heads == p->n_heads[l] && kv->g[g].head_dim == p->head_dim[l] && kv->g[g].window == w))
            g++;
        kv_group *G = &kv->g[g];
        if (g == kv->n_groups) {
            if (kv->n_groups == EMBER_KV_MAX_GROUPS) {
            rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "more than %d distinct KV layer shapes", EMBER_KV_MAX_GROUPS);
            break;
        }
        kv->n_groups++;
            G->n_heads = p->n_heads[l];
            G->head_dim = p->head_dim[l];
            G->window = w;
            G->layers = ember_calloc((size_t)p->n_layers, sizeof *G->layers);
            if (!G->layers) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
        }
        if (!rc) {
            kv->layer_group[l] = g;
            kv->layer_index[l] = G->n_layers;
            G->layers[G->n_layers++] = l;
        }
    }
    bool trans = p->type.quant_start > 0;
    for (int g = 0; g < kv->n_groups && !rc; g++) {
        kv_group *G = &kv->g[g];
        G->signs = ember_malloc((size_t)G->head_dim * sizeof *G->signs);
        if (!G->signs) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
            break;
        }
        ember_tq_signs(EMBER_KV_TQ_SEED, G->head_dim, G->signs);
        G->n_pools = trans ? 2 : 1;
        for (int i = 0; i < G->n_pools && !rc; i++) {
            bool final = !trans || i == 1;
            if (!(rc = make_codec(&p->type, true, final, G->head_dim, G->signs, &G->pool[i].k, err)))
                rc = make_codec(&p->type, false, final, G->head_dim, G->signs, &G->pool[i].v, err);
            G->pool[i].block_bytes = group_block_bytes(G, i);
        }
    }
    if (!rc) {
        size_t per_row = ember_kv_request_bytes(kv, p->n_ctx), budget;
        if (!ember_mul_ok(per_row, (size_t)p->n_rows, &budget))
            rc = ember_err(err, EMBER_ERR_NOMEM, "the KV cache size overflows");
        if (!rc && p->budget > 0 && p->budget < budget) budget = p->budget;
        size_t min_blocks = 0; /* a row must get at least one block of each group (both pools when converting) */
        for (int g = 0; g < kv->n_groups; g++)
            for (int i = 0; i < kv->g[g].n_pools; i++) min_blocks += kv->g[g].pool[i].block_bytes;
        min_blocks += 2 * kv->rec.pool.block_bytes;
        if (!rc && budget < min_blocks)
            rc = ember_err(err, EMBER_ERR_NOMEM, "a KV budget of %zu bytes holds no block (one is %zu bytes)", budget,
                           min_blocks);
        kv->budget = budget;
    }
    for (int g = 0; g < kv->n_groups && !rc; g++)
        for (int i = 0; i < kv->g[g].n_pools && !rc; i++)
            rc = pool_init(kv, &kv->g[g].pool[i], kv->g[g].pool[i].block_bytes, kv->budget, err);
    if (!rc && kv->rec.n_layers) rc = pool_init(kv, &kv->rec.pool, kv->rec.pool.block_bytes, kv->budget, err);
    if (!rc && kv->rec.n_layers) {
        for (int i = 0; i < kv->rec.n_layers; i++) kv->rec.views[i].pool = &kv->rec.pool.t;
        if (!(kv->rec.refs = ember_calloc((size_t)p->n_rows, sizeof *kv->rec.refs)))
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    }
    if (!rc) {
        size_t n = (size_t)kv->n_groups * (size_t)p->n_rows;
        kv->tabs = ember_calloc(n, sizeof *kv->tabs);
        kv->refs = ember_calloc(n, sizeof *kv->refs);
        if (!kv->tabs || !kv->refs) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    }
    for (int r = 0; r < p->n_rows && kv->rows; r++) {
        kv->rows[r].spec_base = -1;
        kv->rows[r].slot = kv->rows[r].ckpt = kv->rows[r].nxt = -1;
    }
    if (rc) {
        ember_kv_free(kv);
        return rc;
    }
    *out = kv;
    return EMBER_OK;
}

/* ---- sizes -------------------------------------------------------------------- */

int ember_kv_rows(const ember_kv *kv) {
    return kv->n_rows;
}
int ember_kv_ctx(const ember_kv *kv) {
    return kv->n_ctx;
}
const ember_kv_type *ember_kv_get_type(const ember_kv *kv) {
    return &kv->type;
}

void ember_kv_describe(const ember_kv *kv, char *buf, size_t n) {
    ember_kv_type t = kv->type;
    const kv_pool *p = kv->n_groups ? &kv->g[0].pool[kv->g[0].n_pools - 1] : NULL;
    if (p && (p->k.enc == EMBER_KVE_Q8 || p->k.enc == EMBER_KVE_Q4)) t.group = p->k.group; /* as used: at most the head */
    ember_kv_type_describe(&t, buf, n);
}

size_t ember_kv_bytes_per_token(const ember_kv *kv, bool before_conversion) {
    size_t b = 0;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        b += G->pool[before_conversion ? 0 : G->n_pools - 1].block_bytes / EMBER_KV_BLOCK;
    }
    return b;
}

size_t ember_kv_used_bytes(const ember_kv *kv) {
    return kv->used;
}
size_t ember_kv_touched_bytes(const ember_kv *kv) {
    size_t n = 0;
    for (int g = 0; g < kv->n_groups; g++)
        for (int i = 0; i < kv->g[g].n_pools; i++) n += (size_t)kv->g[g].pool[i].next * kv->g[g].pool[i].block_bytes;
    if (kv->rec.n_layers) n += (size_t)kv->rec.pool.next * kv->rec.pool.block_bytes;
    return n;
}
size_t ember_kv_capacity_bytes(const ember_kv *kv) {
    return kv->budget;
}
size_t ember_kv_pool_bytes(const ember_kv *kv) {
    size_t n = 0;
    for (int g = 0; g < kv->n_groups; g++)
        for (int i = 0; i < kv->g[g].n_pools; i++) n += (size_t)kv->g[g].pool[i].cap * kv->g[g].pool[i].block_bytes;
    if (kv->rec.n_layers) n += (size_t)kv->rec.pool.cap * kv->rec.pool.block_bytes;
    return n;
}
size_t ember_kv_free_bytes(const ember_kv *kv) {
    return kv->budget - kv->used;
}
size_t ember_kv_row_bytes(const ember_kv *kv, int r) {
    if (r < 0 || r >= kv->n_rows) return 0;
    size_t b = 0;
    for (int g = 0; g < kv->n_groups; g++)
        b += (size_t)kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r].n *
             kv->g[g].pool[kv->rows[r].converted ? 1 : 0].block_bytes;
    if (kv->rows[r].slot >= 0) b += kv->rec.pool.block_bytes;
    return b;
}

int ember_kv_blocks_used(const ember_kv *kv) {
    int n = 0;
    for (int g = 0; g < kv->n_groups; g++)
        for (int i = 0; i < kv->g[g].n_pools; i++) n += kv->g[g].pool[i].next - kv->g[g].pool[i].n_free;
    if (kv->rec.n_layers) n += kv->rec.pool.next - kv->rec.pool.n_free; /* state slots count as blocks */
    return n;
}

size_t ember_kv_need_bytes(const ember_kv *kv, int r, int n) {
    if (r < 0 || r >= kv->n_rows || n <= 0) return 0;
    const kv_row *row = &kv->rows[r];
    size_t total = kv->rec.pool.block_bytes; /* the forward's new state slot */
    bool convert = kv->type.quant_start > 0 && !row->converted && row->len + n > kv->type.quant_start;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        const kv_tab *t = &kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r];
        int have = t->first + t->n, want = (row->len + n + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK;
        size_t nb = want > have ? (size_t)(want - have) : 0;
        const kv_pool *p = &G->pool[row->converted ? 1 : 0];
        if (row->len % EMBER_KV_BLOCK && t->n && p->ref[t->blk[t->n - 1]] > 1) nb++; /* copy on write */
        if (convert) {
            total += (size_t)t->n * G->pool[1].block_bytes + nb * G->pool[1].block_bytes;
        } else {
            total += nb * p->block_bytes;
        }
    }
    return total;
}

/* ---- rows --------------------------------------------------------------------- */

int ember_kv_len(const ember_kv *kv, int r) {
    return r >= 0 && r < kv->n_rows ? kv->rows[r].len : 0;
}

int ember_kv_min_reuse(const ember_kv *kv, int r) {
    if (r < 0 || r >= kv->n_rows) return 0;
    const kv_row *row = &kv->rows[r];
    if (kv->rec.n_layers) return row->len; /* a recurrent state holds only its end */
    int m = 0;
    if (row->converted && kv->type.quant_start > m) m = kv->type.quant_start;
    for (int g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        const kv_tab *t = &kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r];
        if (G->window && t->first > 0 && t->first * EMBER_KV_BLOCK + G->window - 1 > m)
            m = t->first * EMBER_KV_BLOCK + G->window - 1;
    }
    return m < row->len ? m : row->len;
}

/* Row r is in a speculative round begun below the conversion offset: its
   positions from there on are not committed, so it must not convert. */
static bool row_spec_before(const ember_kv *kv, int r) {
    const kv_row *row = &kv->rows[r];
    return row->spec_base >= 0 && row->spec_base < kv->type.quant_start;
}

int ember_kv_max_append(const ember_kv *kv, int r) {
    if (r < 0 || r >= kv->n_rows) return 0;
    const kv_row *row = &kv->rows[r];
    int m = kv->n_ctx - row->len;
    int qs = kv->type.quant_start;
    if (qs > 0 && !row->converted && (row->len < qs || row_spec_before(kv, r)) && qs - row->len < m)
        m = qs - row->len; /* chunks stop there; a round begun before it stops there too */
    return m;
}

void ember_kv_clear(ember_kv *kv, int r) {
    if (r < 0 || r >= kv->n_rows) return;
    row_cut(kv, r, 0);
    kv->rows[r].spec_base = -1;
    kv->rows[r].converted = false;
    kv_rec_clear(kv, r);
}

int ember_kv_trim(ember_kv *kv, int r, int n, ember_error *err) {
    if (r < 0 || r >= kv->n_rows)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist (%d rows)", r, kv->n_rows);
    const kv_row *row = &kv->rows[r];
    if (row->spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in a speculative round: commit or roll back", r);
    if (n < 0 || n > row->len)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "cannot trim KV row %d of %d positions to %d", r, row->len, n);
    int lo = ember_kv_min_reuse(kv, r);
    if (n > 0 && n < lo)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "cannot trim KV row %d to %d positions: it no longer holds what that needs (minimum %d)", r, n,
                         lo);
    if (n == 0)
        ember_kv_clear(kv, r);
    else
        row_cut(kv, r, n);
    return EMBER_OK;
}

int ember_kv_clone(ember_kv *kv, int src, int dst, ember_error *err) {
    if (src < 0 || src >= kv->n_rows || dst < 0 || dst >= kv->n_rows)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV rows %d -> %d: no such row", src, dst);
    if (src == dst) return EMBER_OK;
    if (kv->rec.n_layers && kv->rows[src].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in a speculative round", src);
    for (int g = 0; g < kv->n_groups; g++) /* reserve first: failure changes nothing */
        if (kv_tab_reserve(kv_tab_of(kv, g, dst), kv_tab_of(kv, g, src)->n))
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory cloning a KV row");
    ember_kv_clear(kv, dst);
    for (int g = 0; g < kv->n_groups; g++) {
        kv_tab *s = kv_tab_of(kv, g, src), *d = kv_tab_of(kv, g, dst);
        kv_pool *p = kv_pool_of(kv, g, src);
        for (int i = 0; i < s->n; i++) kv_pool_ref(p, s->blk[i]);
        if (s->n) memcpy(d->blk, s->blk, (size_t)s->n * sizeof *d->blk);
        d->n = s->n;
        d->first = s->first;
    }
    kv->rows[dst].len = kv->rows[src].len;
    kv->rows[dst].converted = kv->rows[src].converted;
    kv->rows[dst].spec_base = -1;
    if ((kv->rows[dst].slot = kv->rows[src].slot) >= 0) kv_pool_ref(&kv->rec.pool, kv->rows[dst].slot);
    return EMBER_OK;
}

void ember_kv_filter(ember_kv *kv, const int *keep, int n) {
    for (int r = 0; r < kv->n_rows; r++) {
        bool k = false;
        for (int i = 0; i < n && !k; i++) k = keep[i] == r;
        if (!k) ember_kv_clear(kv, r);
    }
}

int ember_kv_spec_begin(ember_kv *kv, int r, ember_error *err) {
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is already in a speculative round", r);
    kv->rows[r].spec_base = kv->rows[r].len;
    if ((kv->rows[r].ckpt = kv->rows[r].slot) >= 0) kv_pool_ref(&kv->rec.pool, kv->rows[r].ckpt);
    return EMBER_OK;
}

int ember_kv_spec_commit(ember_kv *kv, int r, int k, ember_error *err) {
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    kv_row *row = &kv->rows[r];
    if (row->spec_base < 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is not in a speculative round", r);
    if (k < 0 || row->spec_base + k > row->len)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d: cannot keep %d of %d speculative positions", r, k,
                         row->len - row->spec_base);
    int rc = kv_rec_spec_end(kv, r, k, err);
    if (rc) return rc;
    row_cut(kv, r, row->spec_base + k);
    row->spec_base = -1;
    row_release_old(kv, r);
    return EMBER_OK;
}

int ember_kv_spec_rollback(ember_kv *kv, int r, ember_error *err) {
    return ember_kv_spec_commit(kv, r, 0, err);
}

bool ember_kv_in_spec(const ember_kv *kv, int r) {
    return r >= 0 && r < kv->n_rows && kv->rows[r].spec_base >= 0;
}

/* ---- detached rows -------------------------------------------------------------- */

struct ember_kv_prepared {
    int n;
    int *dst;
    ember_kv_rowstate **states;
    int32_t **arrays; /* [n * n_groups] block arrays for the new tables */
};

int ember_kv_rowstate_len(const ember_kv_rowstate *s) {
    return s ? s->len : 0;
}

void ember_kv_rowstate_free(ember_kv *kv, ember_kv_rowstate *s) {
    if (!s) return;
    if (s->slot >= 0) kv_pool_unref(kv, &kv->rec.pool, s->slot);
    for (int g = 0; g < kv->n_groups; g++) {
        kv_pool *p = &kv->g[g].pool[s->converted ? 1 : 0];
        for (int i = 0; i < s->tabs[g].n; i++) kv_pool_unref(kv, p, s->tabs[g].blk[i]);
        free(s->tabs[g].blk);
    }
    free(s->tabs);
    free(s);
}

int ember_kv_extract(ember_kv *kv, int r, ember_kv_rowstate **out, ember_error *err) {
    *out = NULL;
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (kv->rows[r].spec_base >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d is in a speculative round", r);
    ember_kv_rowstate *s = ember_calloc(1, sizeof *s);
    if (s) s->tabs = ember_calloc((size_t)kv->n_groups, sizeof *s->tabs);
    bool ok = s && s->tabs;
    for (int g = 0; g < kv->n_groups && ok; g++) ok = !kv_tab_reserve(&s->tabs[g], kv_tab_of(kv, g, r)->n + 1);
    if (!ok) {
        if (s && s->tabs)
            for (int g = 0; g < kv->n_groups; g++) free(s->tabs[g].blk);
        if (s) free(s->tabs);
        free(s);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory extracting a KV row");
    }
    s->kv = kv;
    s->len = kv->rows[r].len;
    s->converted = kv->rows[r].converted;
    if ((s->slot = kv->rows[r].slot) >= 0) kv_pool_ref(&kv->rec.pool, s->slot);
    for (int g = 0; g < kv->n_groups; g++) {
        kv_tab *t = kv_tab_of(kv, g, r);
        kv_pool *p = kv_pool_of(kv, g, r);
        for (int i = 0; i < t->n; i++) kv_pool_ref(p, t->blk[i]);
        if (t->n) memcpy(s->tabs[g].blk, t->blk, (size_t)t->n * sizeof *t->blk);
        s->tabs[g].n = t->n;
        s->tabs[g].first = t->first;
    }
    *out = s;
    return EMBER_OK;
}

void ember_kv_merge_abort(ember_kv *kv, ember_kv_prepared *p) {
    if (!p) return;
    if (p->arrays)
        for (int i = 0; i < p->n * kv->n_groups; i++) free(p->arrays[i]);
    free(p->arrays);
    free(p->dst);
    free(p->states);
    free(p);
}

int ember_kv_merge_prepare(ember_kv *kv, ember_kv_rowstate *const *states, const int *dst, int n,
                           ember_kv_prepared **out, ember_error *err) {
    *out = NULL;
    if (n < 0 || (n && (!states || !dst))) return ember_err(err, EMBER_ERR_INVALID_ARG, "bad KV merge arguments");
    for (int i = 0; i < n; i++) {
        if (!states[i] || states[i]->kv != kv)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "KV merge: state %d does not come from this cache", i);
        if (dst[i] < 0 || dst[i] >= kv->n_rows)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "KV merge: row %d does not exist", dst[i]);
        if (kv->rows[dst[i]].len || kv->rows[dst[i]].spec_base >= 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "KV merge: row %d is not empty", dst[i]);
        for (int j = 0; j < i; j++)
            if (dst[j] == dst[i]) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV merge: row %d named twice", dst[i]);
    }
    ember_kv_prepared *p = ember_calloc(1, sizeof *p);
    if (p) {
        p->n = n;
        p->dst = ember_malloc((size_t)(n ? n : 1) * sizeof *p->dst);
        p->states = ember_malloc((size_t)(n ? n : 1) * sizeof *p->states);
        p->arrays = ember_calloc((size_t)(n ? n : 1) * (size_t)kv->n_groups, sizeof *p->arrays);
    }
    bool ok = p && p->dst && p->states && p->arrays;
    for (int i = 0; i < n && ok; i++) {
        p->dst[i] = dst[i];
        p->states[i] = states[i];
        for (int g = 0; g < kv->n_groups && ok; g++) {
            int cnt = states[i]->tabs[g].n;
            int32_t *a = ember_malloc((size_t)(cnt + 8) * sizeof *a);
            p->arrays[i * kv->n_groups + g] = a;
            ok = a != NULL;
            if (ok && cnt) memcpy(a, states[i]->tabs[g].blk, (size_t)cnt * sizeof *a);
        }
    }
    if (!ok) {
        if (p) {
            p->n = n;
            ember_kv_merge_abort(kv, p);
        }
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory merging KV rows");
    }
    *out = p;
    return EMBER_OK;
}

void ember_kv_merge_commit(ember_kv *kv, ember_kv_prepared *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        const ember_kv_rowstate *s = p->states[i];
        int r = p->dst[i];
        ember_kv_clear(kv, r);
        kv->rows[r].len = s->len;
        kv->rows[r].converted = s->converted;
        if ((kv->rows[r].slot = s->slot) >= 0) kv_pool_ref(&kv->rec.pool, s->slot);
        for (int g = 0; g < kv->n_groups; g++) {
            kv_tab *t = kv_tab_of(kv, g, r);
            free(t->blk);
            t->blk = p->arrays[i * kv->n_groups + g];
            p->arrays[i * kv->n_groups + g] = NULL;
            t->cap = s->tabs[g].n + 8;
            t->n = s->tabs[g].n;
            t->first = s->tabs[g].first;
            kv_pool *pl = kv_pool_of(kv, g, r);
            for (int b = 0; b < t->n; b++) kv_pool_ref(pl, t->blk[b]);
        }
    }
    ember_kv_merge_abort(kv, p); /* frees what is left */
}

int ember_kv_merge(ember_kv *kv, ember_kv_rowstate *const *states, const int *dst, int n, ember_error *err) {
    ember_kv_prepared *p;
    int rc = ember_kv_merge_prepare(kv, states, dst, n, &p, err);
    if (rc) return rc;
    ember_kv_merge_commit(kv, p);
    return EMBER_OK;
}

/* ---- a forward pass ------------------------------------------------------------- */

enum { J_NEW, J_COW, J_CONV, J_REC };


static int journal_push(ember_kv *kv, kv_jent e) {
    if (kv->n_j == kv->cap_j) {
        int cap = kv->cap_j ? kv->cap_j * 2 : 64;
        kv_jent *j = ember_realloc(kv->jr, (size_t)cap * sizeof *j);
        if (!j) return -1;
        kv->jr = j;
        kv->cap_j = cap;
    }
    kv->jr[kv->n_j++] = e;
    return 0;
}

_Static_assert(J_REC == J_REC_KIND, "kv_internal.h's J_REC_KIND");

int kv_journal_push(ember_kv *kv, kv_jent e) {
    return journal_push(kv, e);
}

static void journal_undo(ember_kv *kv) {
    while (kv->n_j > 0) {
        kv_jent *e = &kv->jr[--kv->n_j];
        kv_tab *t = e->kind == J_REC ? NULL : kv_tab_of(kv, e->g, e->r);
        if (e->kind == J_NEW) {
            kv_pool_unref(kv, kv_pool_of(kv, e->g, e->r), e->nw);
            t->n--;
            t->first = e->old; /* as it was before this block came */
        } else if (e->kind == J_COW) {
            t->blk[e->idx] = e->old;
            kv_pool_unref(kv, kv_pool_of(kv, e->g, e->r), e->nw);
        } else if (e->kind == J_REC) { /* the forward's new state slot */
            kv_pool_unref(kv, &kv->rec.pool, e->nw);
            kv->rows[e->r].nxt = -1;
        } else { /* J_CONV: drop the quantized table, bring the f32 one back */
            tab_release(kv, &kv->g[e->g].pool[1], t);
            free(t->blk);
            *t = e->saved;
            kv->rows[e->r].converted = false;
        }
    }
}

static void journal_commit(ember_kv *kv) {
    for (int i = 0; i < kv->n_j; i++) {
        kv_jent *e = &kv->jr[i];
        if (e->kind == J_COW) {
            kv_pool_unref(kv, kv_pool_of(kv, e->g, e->r), e->old);
        } else if (e->kind == J_CONV) {
            tab_release(kv, &kv->g[e->g].pool[0], &e->saved);
            free(e->saved.blk);
        }
    }
    kv->n_j = 0;
}

/* The view of layer l (index li in its group) on pool i. */
static void layer_view(const ember_kv *kv, int g, int li, int i, ember_kv_layer *v) {
    const kv_group *G = &kv->g[g];
    const kv_pool *p = &G->pool[i];
    size_t per = (size_t)G->n_heads * (p->k.head_bytes + p->v.head_bytes);
    *v = (ember_kv_layer){
        .pool = (ember_tensor *)&p->t,
        .block_bytes = p->block_bytes,
        .k_off = (size_t)li * per,
        .v_off = (size_t)li * per + (size_t)G->n_heads * p->k.head_bytes,
        .n_heads = G->n_heads,
        .head_dim = G->head_dim,
        .k = p->k,
        .v = p->v,
    };
}

/* Re-encodes the pieces of one layer's head (K or V) of row r from the f32
   pool into the quantized pool, block by block, on the host (the codecs of
   backend/kv_codec.h): a K block takes its channel statistics from the
   block before it, and the row's first block from its own complete f32
   keys. */
static int convert_piece(ember_kv *kv, kv_group *G, const kv_tab *t, const kv_tab *nt, int li, int h, bool is_k,
                         int len, unsigned char *src, unsigned char *dst, unsigned char *prev, ember_error *err) {
    const kv_pool *p0 = &G->pool[0], *p1 = &G->pool[1];
    const ember_kv_codec *c0 = is_k ? &p0->k : &p0->v, *c1 = is_k ? &p1->k : &p1->v;
    size_t per0 = (size_t)G->n_heads * (p0->k.head_bytes + p0->v.head_bytes),
           per1 = (size_t)G->n_heads * (p1->k.head_bytes + p1->v.head_bytes);
    size_t off0 = (size_t)li * per0 + (is_k ? 0 : (size_t)G->n_heads * p0->k.head_bytes) + (size_t)h * c0->head_bytes;
    size_t off1 = (size_t)li * per1 + (is_k ? 0 : (size_t)G->n_heads * p1->k.head_bytes) + (size_t)h * c1->head_bytes;
    float x[EMBER_KV_NORM_MAX_D];
    int rc = EMBER_OK;
    for (int i = 0; i < t->n && !rc; i++) {
        int p_lo = (t->first + i) * EMBER_KV_BLOCK, n = len - p_lo < EMBER_KV_BLOCK ? len - p_lo : EMBER_KV_BLOCK;
        if ((rc = kv->be->ops->read(kv->be, &p0->t, (size_t)t->blk[i] * p0->block_bytes + off0, src, c0->head_bytes,
                                    err)))
            break;
        memset(dst, 0, c1->head_bytes);
        const unsigned char *pv = prev;
        const ember_kv_codec *pc = NULL;
        if (i == 0) { /* the first block: its own keys, when complete */
            pv = n == EMBER_KV_BLOCK ? src : NULL;
            pc = c0;
        }
        for (int s = 0; s < n; s++) {
            ember_kv_decode(c0, G->head_dim, is_k, src, s, x);
            ember_kv_encode(c1, G->head_dim, is_k, x, dst, s, pv, pc);
        }
        rc = kv->be->ops->write(kv->be, (ember_tensor *)&p1->t, (size_t)nt->blk[i] * p1->block_bytes + off1, dst,
                                c1->head_bytes, err);
        memcpy(prev, dst, c1->head_bytes);
    }
    return rc;
}

/* Converts row r of group g to the quantized pool (journaled). */
static int convert_group(ember_kv *kv, int g, int r, ember_error *err) {
    kv_group *G = &kv->g[g];
    kv_tab *t = kv_tab_of(kv, g, r);
    kv_tab nt = {0};
    if (kv_tab_reserve(&nt, t->n + 1)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory converting a KV row");
    for (int i = 0; i < t->n; i++) {
        int32_t id = kv_pool_take(kv, &G->pool[1]);
        if (id < 0) {
            tab_release(kv, &G->pool[1], &nt);
            free(nt.blk);
            return ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (converting row %d to %s)", r, kv->type.name);
        }
        nt.blk[nt.n++] = id;
    }
    nt.first = t->first;
    size_t big = G->pool[0].k.head_bytes > G->pool[0].v.head_bytes ? G->pool[0].k.head_bytes : G->pool[0].v.head_bytes;
    size_t qbig = G->pool[1].k.head_bytes > G->pool[1].v.head_bytes ? G->pool[1].k.head_bytes : G->pool[1].v.head_bytes;
    unsigned char *src = ember_malloc(big), *dst = ember_malloc(qbig), *prev = ember_malloc(qbig);
    int rc = src && dst && prev ? EMBER_OK : ember_err(err, EMBER_ERR_NOMEM, "out of memory converting a KV row");
    for (int li = 0; li < G->n_layers && !rc; li++)
        for (int h = 0; h < G->n_heads && !rc; h++)
            for (int is_k = 1; is_k >= 0 && !rc; is_k--)
                rc = convert_piece(kv, G, t, &nt, li, h, is_k, kv->rows[r].len, src, dst, prev, err);
    free(src);
    free(dst);
    free(prev);
    if (!rc && journal_push(kv, (kv_jent){J_CONV, g, r, 0, 0, 0, *t}))
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory converting a KV row");
    if (rc) {
        tab_release(kv, &G->pool[1], &nt);
        free(nt.blk);
        return rc;
    }
    *t = nt;
    return EMBER_OK;
}

int ember_kv_begin(ember_kv *kv, const int32_t *row, const int32_t *pos, int T, ember_error *err) {
    if (kv->open) return ember_err(err, EMBER_ERR_INTERNAL, "a KV forward is already open");
    if (T < 1 || !row || !pos) return ember_err(err, EMBER_ERR_INVALID_ARG, "empty KV batch");
    /* continuity, context and conversion boundary, before anything changes */
    for (int t = 0; t < T; t++) {
        int r = row[t];
        if (r < 0 || r >= kv->n_rows) {
            for (int u = 0; u < t; u++) kv->in_batch[row[u]] = 0;
            return ember_err(err, EMBER_ERR_INVALID_ARG, "row %d is outside the KV cache's %d rows", r, kv->n_rows);
        }
        int next = kv->rows[r].len + kv->in_batch[r];
        int rc = EMBER_OK;
        if (pos[t] != next)
            rc = ember_err(err, EMBER_ERR_INVALID_ARG, "row %d: position %d does not continue the row (next is %d)", r,
                           pos[t], next);
        else if (pos[t] >= kv->n_ctx)
            rc = ember_err(err, EMBER_ERR_LIMIT, "row %d: position %d is beyond the context of %d tokens", r, pos[t],
                           kv->n_ctx);
        else if (kv->type.quant_start > 0 && !kv->rows[r].converted && pos[t] >= kv->type.quant_start &&
                 (kv->rows[r].len < kv->type.quant_start || row_spec_before(kv, r)))
            rc = ember_err(err, EMBER_ERR_INVALID_ARG,
                           "row %d: the batch crosses the KV quantization offset %d (split the chunk there)", r,
                           kv->type.quant_start);
        if (rc) {
            for (int u = 0; u < t; u++) kv->in_batch[row[u]] = 0;
            return rc;
        }
        kv->in_batch[r]++;
    }
    int rc = EMBER_OK;
    kv->n_j = 0;
    for (int t = 0; t < T && !rc; t++) {
        int r = row[t], n = kv->in_batch[r];
        if (n == 0) continue; /* this row was handled at its first token */
        kv->in_batch[r] = 0;
        kv_row *R = &kv->rows[r];
        if (kv->type.quant_start > 0 && !R->converted && R->len == kv->type.quant_start) {
            for (int g = 0; g < kv->n_groups && !rc; g++) rc = convert_group(kv, g, r, err);
            if (!rc) R->converted = true;
            if (rc) break;
        }
        if (kv->rec.n_layers && (rc = kv_rec_begin_row(kv, r, n, err))) break;
        for (int g = 0; g < kv->n_groups && !rc; g++) {
            kv_tab *tb = kv_tab_of(kv, g, r);
            kv_pool *p = kv_pool_of(kv, g, r);
            int want = (R->len + n + EMBER_KV_BLOCK - 1) / EMBER_KV_BLOCK - tb->first;
            if (kv_tab_reserve(tb, want + 1)) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for a KV block table");
                break;
            }
            if (R->len % EMBER_KV_BLOCK && tb->n && p->ref[tb->blk[tb->n - 1]] > 1) { /* copy on write */
                int32_t old = tb->blk[tb->n - 1], nw = kv_pool_take(kv, p);
                if (nw < 0 || journal_push(kv, (kv_jent){J_COW, g, r, tb->n - 1, old, nw, {0}})) {
                    if (nw >= 0) kv_pool_unref(kv, p, nw);
                    rc = ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full");
                    break;
                }
                ember_tensor *pt = &p->t;
                if ((rc = kv->be->ops->copy(kv->be, pt, (size_t)nw * p->block_bytes, pt,
                                            (size_t)old * p->block_bytes, p->block_bytes, err)))
                    break;
                tb->blk[tb->n - 1] = nw;
            }
            while (tb->n < want) {
                int32_t id = kv_pool_take(kv, p);
                if (id < 0 || journal_push(kv, (kv_jent){J_NEW, g, r, tb->n, tb->first, id, {0}})) {
                    if (id >= 0) kv_pool_unref(kv, p, id);
                    rc = ember_err(err, EMBER_ERR_NOMEM,
                                   "the KV cache is full (%zu of %zu bytes in use; row %d needs more)", kv->used,
                                   kv->budget, r);
                    break;
                }
                if (tb->n == 0) tb->first = R->len / EMBER_KV_BLOCK;
                tb->blk[tb->n++] = id;
            }
        }
    }
    if (rc) {
        for (int t = 0; t < T; t++) kv->in_batch[row[t]] = 0;
        journal_undo(kv);
        return rc;
    }
    /* the refs the backend reads */
    for (int t = 0; t < T; t++) {
        int r = row[t];
        for (int g = 0; g < kv->n_groups; g++) {
            kv_tab *tb = kv_tab_of(kv, g, r);
            kv->refs[(size_t)g * (size_t)kv->n_rows + (size_t)r] =
                (ember_kv_rowref){tb->blk, tb->first, tb->n, kv->rows[r].converted ? 1 : 0};
        }
    }
    kv->open = true;
    kv->batch_row = row;
    kv->batch_pos = pos;
    kv->batch_n = T;
    return EMBER_OK;
}

void ember_kv_map_for(const ember_kv *kv, int layer, const int32_t *row, const int32_t *pos, ember_kv_layer *views,
                      ember_kv_map *map) {
    int g = kv->layer_group[layer], li = kv->layer_index[layer];
    const kv_group *G = &kv->g[g];
    for (int i = 0; i < G->n_pools; i++) layer_view(kv, g, li, i, &views[i]);
    *map = (ember_kv_map){views, G->n_pools, &kv->refs[(size_t)g * (size_t)kv->n_rows], kv->n_rows, row, pos};
}

void ember_kv_end(ember_kv *kv, bool ok) {
    if (!kv->open) return;
    kv->open = false;
    if (!ok) {
        journal_undo(kv);
        return;
    }
    journal_commit(kv);
    kv_rec_commit(kv);
    for (int t = 0; t < kv->batch_n; t++) {
        int r = kv->batch_row[t];
        if (kv->batch_pos[t] + 1 > kv->rows[r].len) kv->rows[r].len = kv->batch_pos[t] + 1;
    }
    for (int t = 0; t < kv->batch_n; t++) row_release_old(kv, kv->batch_row[t]);
}

int ember_kv_read_pos(ember_kv *kv, int r, int layer, int p, float *k, float *v, ember_error *err) {
    if (r < 0 || r >= kv->n_rows || layer < 0 || layer >= kv->n_layers || p < 0 || p >= kv->rows[r].len ||
        kv->layer_group[layer] < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d layer %d has no position %d", r, layer, p);
    int g = kv->layer_group[layer];
    const kv_group *G = &kv->g[g];
    kv_tab *tb = kv_tab_of(kv, g, r);
    if (p / EMBER_KV_BLOCK < tb->first)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d no longer holds position %d", r, p);
    ember_kv_layer views[2];
    ember_kv_rowref ref = {tb->blk, tb->first, tb->n, kv->rows[r].converted ? 1 : 0};
    for (int i = 0; i < G->n_pools; i++) layer_view(kv, g, kv->layer_index[layer], i, &views[i]);
    int32_t zero = 0;
    ember_kv_map m = {views, G->n_pools, &ref, 1, &zero, &p};
    /* host tensors for the backend: wrap the caller's memory */
    const int64_t shape[3] = {1, G->n_heads, G->head_dim};
    size_t bytes = (size_t)G->n_heads * (size_t)G->head_dim * 4;
    ember_buffer *kb = NULL, *vb = NULL;
    ember_tensor kt, vt;
    int rc = kv->be->ops->buffer_alloc(kv->be, bytes, &kb, err);
    if (!rc) rc = kv->be->ops->buffer_alloc(kv->be, bytes, &vb, err);
    if (!rc) rc = ember_tensor_view(&kt, kb, 0, EMBER_F32, 3, shape, err);
    if (!rc) rc = ember_tensor_view(&vt, vb, 0, EMBER_F32, 3, shape, err);
    if (!rc) rc = kv->be->ops->kv_read(kv->be, &m, &kt, &vt, err);
    if (!rc) rc = kv->be->ops->read(kv->be, &kt, 0, k, bytes, err);
    if (!rc) rc = kv->be->ops->read(kv->be, &vt, 0, v, bytes, err);
    ember_buffer_free(kb);
    ember_buffer_free(vb);
    return rc;
}
