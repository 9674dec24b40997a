/*
 * kv_internal.h - the KV cache's structures, shared by kv.c (pools, tables,
 * the row contract) and kv_blob.c (the row codec). Not for other parts.
 */
#ifndef EMBER_KV_INTERNAL_H
#define EMBER_KV_INTERNAL_H

#include "kv.h"

/* The seed of the TQ rotation's signs: part of the format of saved rows. */
#define EMBER_KV_TQ_SEED 0x656d6265724b5631ull /* "emberKV1" */

typedef struct kv_pool {
    ember_buffer *buf;
    ember_tensor t;      /* u8 [cap * block_bytes] */
    size_t block_bytes;
    int cap, next;       /* blocks; ids >= next were never handed out */
    int32_t *free;       /* [cap] stack of freed ids */
    int n_free;
    uint32_t *ref;       /* [cap] reference counts */
    ember_kv_codec k, v; /* head_bytes filled */
} kv_pool;

typedef struct kv_group {
    int n_layers, n_heads, head_dim, window;
    int *layers;    /* [n_layers] model layer of each member */
    int n_pools;    /* 1, or 2 when transitioning (0: f32, 1: quantized) */
    kv_pool pool[2];
    float *signs;   /* [head_dim] TQ rotation signs */
} kv_group;

typedef struct kv_tab {
    int32_t *blk; /* [cap], n used: block of logical block first + i */
    int first, n, cap;
} kv_tab;

typedef struct kv_row {
    int len;
    int spec_base; /* -1: no speculative round */
    bool converted;
    /* recurrent state (kv_rec): slots of rec.pool, -1 for none */
    int32_t slot;        /* the state after the row's positions (-1: zeros, an empty row) */
    int32_t ckpt;        /* the state at the round's start (a reference), or -1 */
    int32_t nxt;         /* the open forward's output slot, or -1 */
    ember_buffer *log_buf; /* the round's log (backend.h), grown on demand */
    ember_tensor log;
    int log_cap;         /* positions the log holds */
} kv_row;

/* The recurrent part of a cache (none when n_layers is 0). */
typedef struct kv_rec {
    int n_layers;          /* recurrent layers */
    int *index;            /* [kv n_layers] a layer's index among them, -1 for attention layers */
    ember_rec_layer *views; /* [n_layers] */
    ember_rec_shape shape;
    kv_pool pool;          /* slots: block_bytes = one slot */
    size_t slot_floats, log_stride;
    ember_rec_rowref *refs; /* [n_rows], valid for the rows of the open forward */
} kv_rec;

typedef struct kv_jent {
    int kind, g, r, idx;
    int32_t old, nw;
    kv_tab saved; /* J_CONV: the row's f32 table */
} kv_jent;

struct ember_kv {
    ember_backend *be;
    ember_kv_type type;
    int n_layers, n_rows, n_ctx, retain, max_chunk;
    int *layer_group, *layer_index; /* [n_layers] */
    kv_group *g;
    int n_groups;
    kv_row *rows;          /* [n_rows] */
    kv_tab *tabs;          /* [n_groups * n_rows] */
    ember_kv_rowref *refs; /* [n_groups * n_rows], valid for the rows of the open forward */
    size_t budget, used;
    /* the open forward */
    bool open;
    const int32_t *batch_row, *batch_pos;
    int batch_n;
    int *in_batch; /* [n_rows] scratch of ember_kv_begin */
    kv_rec rec;
    kv_jent *jr;
    int n_j, cap_j;
};

#define EMBER_KV_MAX_GROUPS 64

kv_tab *kv_tab_of(ember_kv *kv, int g, int r);
/* A block of pool p with reference count 1, or -1 when the pool or the
   budget is full; and its release. */
int32_t kv_pool_take(ember_kv *kv, kv_pool *p);
void kv_pool_unref(ember_kv *kv, kv_pool *p, int32_t id);
/* One more reference to block id of pool p. */
void kv_pool_ref(kv_pool *p, int32_t id);
/* Room for n blocks in table t (its entries kept); -1 on no memory. */
int kv_tab_reserve(kv_tab *t, int n);
kv_pool *kv_pool_of(ember_kv *kv, int g, int r);

/* ---- recurrent state (kv_rec.c) ---- */
#define J_REC_KIND 3 /* kv.c's journal kind of a forward's new state slot */
int kv_journal_push(ember_kv *kv, kv_jent e);
/* Sets up kv->rec from p (not the pool: kv.c sizes it with the budget). */
int kv_rec_init(ember_kv *kv, const ember_kv_params *p, ember_error *err);
/* Drops row r's slots and log. */
void kv_rec_clear(ember_kv *kv, int r);
/* The recurrent side of ending row r's round keeping k positions. On error
   the row is unchanged (still in its round). */
int kv_rec_spec_end(ember_kv *kv, int r, int k, ember_error *err);
/* ember_kv_begin for row r growing by n: its next slot (journaled), its
   log when in a round, its map entry. */
int kv_rec_begin_row(ember_kv *kv, int r, int n, ember_error *err);
/* ember_kv_end(ok): every row of the batch moves to its next slot. */
void kv_rec_commit(ember_kv *kv);

/* A row detached from the cache (ember_kv_extract): references on its blocks. */
struct ember_kv_rowstate {
    const ember_kv *kv;
    int len;
    bool converted;
    int32_t slot; /* a reference on the recurrent state's slot, or -1 */
    kv_tab *tabs; /* [n_groups] */
};

/* ---- the row blob (kv_blob.c) ---- */
/* CRC-32 (IEEE, as zlib's crc32): crc of the bytes so far (0 for none)
   extended by p[0..n). */
uint32_t kv_crc32(uint32_t crc, const void *p, size_t n);

/* A stream of blob bytes. write takes all n bytes or fails; read gives
   exactly n bytes or fails (a short file is an error, with its message). */
typedef struct kv_sink {
    int (*write)(void *u, const void *p, size_t n, ember_error *err);
    void *u;
} kv_sink;
typedef struct kv_source {
    int (*read)(void *u, void *p, size_t n, ember_error *err);
    void *u;
} kv_source;

/* Writes a blob of s in steps: each call writes at least `bytes` (the
   header, then whole blocks, then the CRC) and returns 1 while more is to
   come, 0 when the blob is complete, or a negative error code. The writer
   holds no references of its own: s must outlive it. Free with
   kv_blob_writer_free (NULL is fine). */
typedef struct kv_blob_writer kv_blob_writer;
int kv_blob_writer_new(ember_kv *kv, const ember_kv_rowstate *s, kv_blob_writer **out, ember_error *err);
int kv_blob_writer_step(kv_blob_writer *w, kv_sink *out, size_t bytes, ember_error *err);
size_t kv_blob_writer_size(const kv_blob_writer *w); /* the whole blob's bytes */
void kv_blob_writer_free(kv_blob_writer *w);

/* Replaces row r with the blob read from in, whose total size is n bytes
   (nothing may follow it), reading it one block at a time: its memory is
   the row's blocks plus one block of scratch. On any error row r is
   unchanged. */
int kv_blob_read(ember_kv *kv, int r, kv_source *in, size_t n, ember_error *err);
/* Checks that the blob header at b (n >= 16 bytes of the blob's start)
   fits this cache: *need receives the header's size when n is too short
   to judge (call again with that many bytes), else 0. EMBER_OK when the
   header is this cache's, with *total the blob's whole size and *len its
   positions. */
int kv_blob_check(ember_kv *kv, const void *b, size_t n, size_t *need, size_t *total, int *len, ember_error *err);

#endif
