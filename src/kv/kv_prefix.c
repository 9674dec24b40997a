/*
 * kv_prefix.c - the in-memory prefix cache (see kv_prefix.h).
 *
 * Entries live in one array (free slots chained through `next`), found
 * through a bucket array of chains keyed by the 64-bit chain hash. An
 * entry's blocks are in blk[e * n_groups + g]; each holds one reference.
 * Children are counted so that eviction takes leaves only.
 */
#include "kv_prefix.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv_internal.h"

#define B EMBER_KV_BLOCK

typedef struct px_ent {
    uint64_t key, salt, stamp;
    int32_t parent; /* entry index, -1 for a first block */
    int32_t next;   /* bucket chain, or free list */
    int32_t n_children;
    bool live, converted;
    int32_t tok[B];
} px_ent;

struct ember_kv_prefix {
    ember_kv *kv;
    bool supported;
    px_ent *e;
    int32_t *blk; /* [cap * n_groups] */
    int cap, n_live;
    int32_t free_head;
    int32_t *bucket; /* [n_buckets] head entry, -1 */
    size_t n_buckets;
    uint64_t clock;
    ember_kv_prefix_stats st;
};

/* The key of a block: its parent's key (or the salt's seed) and its tokens. */
static uint64_t block_key(uint64_t parent_key, const int32_t *tok) {
    uint64_t h = parent_key;
    for (int i = 0; i < B; i++) h = ember_mix64(h ^ ((uint64_t)(uint32_t)tok[i] + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
    return h;
}

static uint64_t root_key(uint64_t salt) {
    return ember_mix64(salt ^ 0x70726566697843ull); /* "prefixC" */
}

int ember_kv_prefix_new(ember_kv *kv, ember_kv_prefix **out, ember_error *err) {
    ember_kv_prefix *px = ember_calloc(1, sizeof *px);
    if (!px) return ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the prefix cache");
    px->kv = kv;
    /* every kind shares (rotating groups: the blocks a row still held); a
       recurrent state holds only its end, not the prefixes the table's
       entries stand for: such rows reuse per row and through the disk tier,
       where a whole row is restored exactly */
    px->supported = kv->rec.n_layers == 0;
    px->free_head = -1;
    px->n_buckets = 1024;
    px->bucket = ember_malloc(px->n_buckets * sizeof *px->bucket);
    if (!px->bucket) {
        free(px);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the prefix cache");
    }
    for (size_t i = 0; i < px->n_buckets; i++) px->bucket[i] = -1;
    *out = px;
    return EMBER_OK;
}

bool ember_kv_prefix_supported(const ember_kv_prefix *px) {
    return px && px->supported;
}

static kv_pool *ent_pool(ember_kv_prefix *px, const px_ent *e, int g) {
    return &px->kv->g[g].pool[e->converted ? 1 : 0];
}

/* Unlinks entry i from its bucket. */
static void bucket_unlink(ember_kv_prefix *px, int32_t i) {
    int32_t *pp = &px->bucket[px->e[i].key & (px->n_buckets - 1)];
    while (*pp != i) pp = &px->e[*pp].next;
    *pp = px->e[i].next;
}

/* Drops entry i (its references, its link, its count in the parent). */
static void ent_drop(ember_kv_prefix *px, int32_t i) {
    px_ent *e = &px->e[i];
    const int ng = px->kv->n_groups;
    for (int g = 0; g < ng; g++) kv_pool_unref(px->kv, ent_pool(px, e, g), px->blk[(size_t)i * (size_t)ng + (size_t)g]);
    bucket_unlink(px, i);
    if (e->parent >= 0) px->e[e->parent].n_children--;
    e->live = false;
    e->next = px->free_head;
    px->free_head = i;
    px->n_live--;
}

void ember_kv_prefix_clear(ember_kv_prefix *px) {
    if (!px) return;
    /* leaves first (slots are reused, so a child's index may be below its
       parent's): each pass drops the leaves it meets */
    while (px->n_live > 0)
        for (int32_t i = 0; i < px->cap; i++)
            if (px->e[i].live && px->e[i].n_children == 0) ent_drop(px, i);
}

void ember_kv_prefix_free(ember_kv_prefix *px) {
    if (!px) return;
    ember_kv_prefix_clear(px);
    free(px->e);
    free(px->blk);
    free(px->bucket);
    free(px);
}

/* The entry for (parent, tokens, salt) with key `key`, or -1. */
static int32_t find(const ember_kv_prefix *px, uint64_t key, int32_t parent, const int32_t *tok, uint64_t salt) {
    for (int32_t i = px->bucket[key & (px->n_buckets - 1)]; i >= 0; i = px->e[i].next) {
        const px_ent *e = &px->e[i];
        if (e->key == key && e->parent == parent && (parent >= 0 || e->salt == salt) &&
            memcmp(e->tok, tok, sizeof e->tok) == 0)
            return i;
    }
    return -1;
}

/* Room for one more entry and a bucket array fit for the count; -1 on no memory. */
static int grow(ember_kv_prefix *px) {
    const int ng = px->kv->n_groups;
    if (px->free_head < 0) {
        int cap = px->cap ? px->cap * 2 : 64;
        px_ent *e = ember_realloc(px->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        px->e = e;
        int32_t *b = ember_realloc(px->blk, (size_t)cap * (size_t)ng * sizeof *b);
        if (!b) return -1;
        px->blk = b;
        for (int i = cap - 1; i >= px->cap; i--) {
            px->e[i].live = false;
            px->e[i].next = px->free_head;
            px->free_head = i;
        }
        px->cap = cap;
    }
    if ((size_t)px->n_live + 1 > px->n_buckets) { /* rehash into twice the buckets */
        size_t nb = px->n_buckets * 2;
        int32_t *bk = ember_malloc(nb * sizeof *bk);
        if (!bk) return 0; /* longer chains, still correct */
        for (size_t i = 0; i < nb; i++) bk[i] = -1;
        for (int32_t i = 0; i < px->cap; i++)
            if (px->e[i].live) {
                size_t h = px->e[i].key & (nb - 1);
                px->e[i].next = bk[h];
                bk[h] = i;
            }
        free(px->bucket);
        px->bucket = bk;
        px->n_buckets = nb;
    }
    return 0;
}

int ember_kv_prefix_publish(ember_kv_prefix *px, int r, const int32_t *tokens, int n, uint64_t salt) {
    ember_kv *kv = px->kv;
    if (!px->supported || r < 0 || r >= kv->n_rows || n <= 0) return 0;
    const kv_row *row = &kv->rows[r];
    if (n > row->len) n = row->len;
    const bool converting = kv->type.quant_start > 0;
    if (converting && !row->converted) return 0;
    if (row->spec_base >= 0 && n > row->spec_base) n = row->spec_base; /* only committed positions */
    const int ng = kv->n_groups, nb = n / B;
    uint64_t key = root_key(salt);
    int32_t parent = -1, made = 0;
    px->clock++;
    for (int b = 0; b < nb; b++) {
        const int32_t *tok = tokens + (size_t)b * B;
        key = block_key(key, tok);
        int32_t i = find(px, key, parent, tok, salt);
        if (i < 0) {
            for (int g = 0; g < ng; g++) { /* the row must hold the block in every group */
                const kv_tab *t = &kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r];
                if (b < t->first || b - t->first >= t->n) return made;
            }
            if (grow(px)) return made ? made : EMBER_ERR_NOMEM;
            i = px->free_head;
            px_ent *e = &px->e[i];
            px->free_head = e->next;
            e->key = key;
            e->salt = parent < 0 ? salt : 0;
            e->parent = parent;
            e->n_children = 0;
            e->live = true;
            e->converted = converting;
            memcpy(e->tok, tok, sizeof e->tok);
            for (int g = 0; g < ng; g++) {
                const kv_tab *t = &kv->tabs[(size_t)g * (size_t)kv->n_rows + (size_t)r];
                int32_t id = t->blk[b - t->first];
                px->blk[(size_t)i * (size_t)ng + (size_t)g] = id;
                kv_pool_ref(ent_pool(px, e, g), id);
            }
            size_t h = key & (px->n_buckets - 1);
            e->next = px->bucket[h];
            px->bucket[h] = i;
            if (parent >= 0) px->e[parent].n_children++;
            px->n_live++;
            made++;
        }
        px->e[i].stamp = px->clock;
        parent = i;
    }
    return made;
}

/* The entries of the longest cached run of tokens[0..n): their count, their
   indices in idx (room for n / B, or NULL); touch marks them used. */
static int walk(ember_kv_prefix *px, const int32_t *tokens, int n, uint64_t salt, int32_t *idx, bool touch) {
    uint64_t key = root_key(salt);
    int32_t parent = -1;
    int k = 0;
    if (touch) px->clock++;
    for (int b = 0; b < n / B; b++) {
        const int32_t *tok = tokens + (size_t)b * B;
        key = block_key(key, tok);
        int32_t i = find(px, key, parent, tok, salt);
        if (i < 0) break;
        if (idx) idx[k] = i;
        if (touch) px->e[i].stamp = px->clock;
        k++;
        parent = i;
    }
    return k;
}

int ember_kv_prefix_match(ember_kv_prefix *px, const int32_t *tokens, int n, uint64_t salt) {
    int m = px->supported && n >= B ? walk(px, tokens, n, salt, NULL, true) * B : 0;
    if (m < px->kv->type.quant_start) m = 0; /* below a converting kind's offset: not shareable */
    return m;
}

int ember_kv_prefix_attach(ember_kv_prefix *px, int r, const int32_t *tokens, int n, uint64_t salt,
                           ember_error *err) {
    ember_kv *kv = px->kv;
    if (r < 0 || r >= kv->n_rows || kv->rows[r].len != 0 || kv->rows[r].spec_base >= 0 || n % B || n <= 0 ||
        !px->supported)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "prefix cache: cannot install %d positions into KV row %d", n, r);
    const int ng = kv->n_groups, nb = n / B;
    int32_t *idx = ember_malloc((size_t)nb * sizeof *idx);
    if (!idx) return ember_err(err, EMBER_ERR_NOMEM, "out of memory installing a cached prefix");
    if (walk(px, tokens, n, salt, idx, false) < nb || n < kv->type.quant_start) {
        free(idx);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "prefix cache: the %d positions are no longer cached", n);
    }
    for (int g = 0; g < ng; g++) /* reserve the tables first: failure changes nothing */
        if (kv_tab_reserve(kv_tab_of(kv, g, r), nb)) {
            free(idx);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory installing a cached prefix");
        }
    kv->rows[r].converted = kv->type.quant_start > 0;
    for (int g = 0; g < ng; g++) {
        kv_tab *t = kv_tab_of(kv, g, r);
        kv_pool *p = kv_pool_of(kv, g, r);
        /* a rotating group takes only the blocks a row of n positions keeps (kv.c's
           row_release_old): those before its window and retain are not needed */
        int first = 0, keep = kv->g[g].window ? n - kv->g[g].window - kv->retain : 0;
        if (keep > 0) first = keep / B;
        for (int b = first; b < nb; b++) {
            int32_t id = px->blk[(size_t)idx[b] * (size_t)ng + (size_t)g];
            kv_pool_ref(p, id);
            t->blk[b - first] = id;
        }
        t->n = nb - first;
        t->first = first;
    }
    kv->rows[r].len = n;
    px->st.tokens_reused += (uint64_t)n;
    free(idx);
    return EMBER_OK;
}

/* true when no row refers to entry i's blocks. */
static bool exclusive(ember_kv_prefix *px, int32_t i) {
    const int ng = px->kv->n_groups;
    for (int g = 0; g < ng; g++)
        if (ent_pool(px, &px->e[i], g)->ref[px->blk[(size_t)i * (size_t)ng + (size_t)g]] != 1) return false;
    return true;
}

typedef struct px_cand {
    uint64_t stamp;
    int32_t i;
} px_cand;

static int by_stamp(const void *a, const void *b) {
    const px_cand *x = a, *y = b;
    if (x->stamp != y->stamp) return x->stamp < y->stamp ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

size_t ember_kv_prefix_evict(ember_kv_prefix *px, size_t bytes) {
    ember_kv *kv = px->kv;
    size_t start = kv->used, freed = 0;
    px_cand *cand = px->n_live ? ember_malloc((size_t)px->n_live * sizeof *cand) : NULL;
    while (freed < bytes && cand) { /* a round takes today's leaves; their parents may be next round's */
        int n = 0;
        for (int32_t i = 0; i < px->cap; i++)
            if (px->e[i].live && px->e[i].n_children == 0 && exclusive(px, i)) cand[n++] = (px_cand){px->e[i].stamp, i};
        if (n == 0) break;
        qsort(cand, (size_t)n, sizeof *cand, by_stamp);
        for (int k = 0; k < n && freed < bytes; k++) {
            ent_drop(px, cand[k].i);
            px->st.evictions++;
            freed = start - kv->used;
        }
    }
    free(cand);
    return freed;
}

void ember_kv_prefix_get_stats(const ember_kv_prefix *px, ember_kv_prefix_stats *st) {
    *st = px->st;
    st->entries = px->n_live;
    st->bytes = st->bytes_exclusive = 0;
    const int ng = px->kv->n_groups;
    for (int32_t i = 0; i < px->cap; i++) {
        const px_ent *e = &px->e[i];
        if (!e->live) continue;
        for (int g = 0; g < ng; g++) {
            const kv_pool *p = &px->kv->g[g].pool[e->converted ? 1 : 0];
            st->bytes += p->block_bytes;
            if (p->ref[px->blk[(size_t)i * (size_t)ng + (size_t)g]] == 1) st->bytes_exclusive += p->block_bytes;
        }
    }
}
