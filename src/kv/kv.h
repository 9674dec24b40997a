/*
 * kv.h - the KV cache family: rows of positions held in blocks of one pool,
 * behind one contract for every kind.
 *
 * Storage. Layers that share a shape (KV heads, head size, sliding window)
 * form a group. A group keeps its positions in blocks of EMBER_KV_BLOCK
 * positions, all layers of the group in one block (backend.h describes the
 * bytes), taken from the group's pool. A row (one sequence) holds per group
 * a block table; its memory follows its length, not n_ctx. Blocks carry a
 * reference count: clone and extract share blocks, and a row that writes
 * into a shared block first copies it (copy on write).
 *
 * Kinds (ember_kv_type):
 *   f32, f16, bf16          dense
 *   q8, q4                  affine group-wise (MLX style), group 32/64/128
 *                           values along the head (the whole head if smaller)
 *   tq-kKvV                 rotation-based: Walsh-Hadamard with random signs,
 *                           then a K- and V-bit Lloyd-Max codebook per value
 *   any of the quantized    + quant_start > 0: transitioning, every row stays
 *                           f32 until its length reaches quant_start, then
 *                           converts (all of it) to the quantized kind. With
 *                           none given, quant_start is one block (16): a
 *                           row's first keys (attention sinks) are quantized
 *                           only once their block is complete, with their
 *                           own channel statistics (kv_codec.c).
 * and for every kind, a layer group with a sliding window is rotating: it
 * keeps only the last window + retain positions of a row.
 *
 * Recurrent state (hybrid models' linear-attention layers, backend.h): a
 * row holds one slot of a state pool, a fixed size whatever its length,
 * counted in the budget like blocks and shared by reference like them.
 * Each forward writes the row's new state to a fresh slot and drops the
 * old one when it commits, so a failed forward changes nothing. Such a
 * row cannot be trimmed (ember_kv_min_reuse is its length); a speculative
 * round keeps the starting slot and a log of the round's inputs, and
 * commit(k) rebuilds the state after k positions from them (delta_replay:
 * k recurrent steps per layer, no weights read; k = 0 or all cost nothing).
 *
 * The contract (every kind):
 *   append      ember_kv_begin / ember_kv_end around a forward pass: begin
 *               checks the batch and takes every block it needs (and any
 *               conversion), end commits or, on failure, gives everything
 *               back: the rows are exactly as before.
 *   trim        back to any position >= ember_kv_min_reuse.
 *   speculative spec_begin, then a forward of d draft positions, then
 *               spec_commit(k): keep k of them; spec_rollback keeps none.
 *               Rotating groups keep what a rollback needs meanwhile, and a
 *               round never triggers a conversion.
 *   rows        clone, extract (a detached ember_kv_rowstate sharing the
 *               blocks), merge (install detached states into empty rows,
 *               all or nothing; prepared then committed), filter, clear.
 *   codec       row_save / row_load: a versioned, checksummed blob.
 *   sizes       bytes per token, bytes a request will take, bytes in use.
 *
 * Ownership: the cache owns its pools, tables and scratch; a rowstate owns
 * references to blocks of the cache it came from and must be freed (with
 * ember_kv_rowstate_free) before that cache. Threading: one thread at a time.
 */
#ifndef EMBER_KV_H
#define EMBER_KV_H

#include <stdbool.h>

#include "backend/backend.h"

/* A parsed KV kind. */
typedef struct ember_kv_type {
    char name[24];         /* canonical name: "f16", "q4", "tq-k4v3" */
    ember_kv_enc k_enc, v_enc;
    int k_bits, v_bits;    /* TQ */
    int group;             /* affine: values per group asked for (32, 64, 128) */
    int quant_start;       /* > 0: transitioning at this offset (quantized kinds) */
    bool implicit_start;   /* quant_start is the default first block, not asked for */
} ember_kv_type;

/* Parses "f32", "f16", "bf16", "q8", "q4" or "tq-kKvV" (K, V in 2..8), with
   an affine group size (0: 64) and a transition offset (0: none). */
int ember_kv_type_parse(const char *name, int group, int quant_start, ember_kv_type *out, ember_error *err);
/* "q4 (group 64)", "tq-k4v3", "q8 (group 32) after 1024 positions", ... */
void ember_kv_type_describe(const ember_kv_type *t, char *buf, size_t n);
/* The list of kinds for help texts. */
#define EMBER_KV_TYPES "f32|f16|bf16|q8|q4|tq-kKvV (K, V bits 2..8, e.g. tq-k8v4, tq-k4v3)"

typedef struct ember_kv_params {
    ember_kv_type type;
    int n_layers;
    const int *n_heads;  /* [n_layers] KV heads */
    const int *head_dim; /* [n_layers] */
    const int *window;   /* [n_layers] sliding window, 0: full attention; may be NULL */
    int n_rows, n_ctx;
    size_t budget;       /* bytes the pools may hold; 0: n_rows rows of n_ctx positions */
    int retain;          /* rotating groups: positions kept behind the window for
                            trim and rollback (< 0: 64) */
    int max_chunk;       /* most positions a row appends in one forward (<= 0: 512);
                            sizes the rotating groups' blocks per row */
    const bool *recurrent; /* [n_layers] layers that keep recurrent state (the
                              linear-attention layers of hybrid models) instead
                              of keys and values; NULL: none */
    ember_rec_shape rec;   /* their state's shape (backend.h) */
} ember_kv_params;

typedef struct ember_kv ember_kv;
typedef struct ember_kv_rowstate ember_kv_rowstate;
typedef struct ember_kv_prepared ember_kv_prepared;

/* Makes the cache of p on be (its pools allocated there; *out freed with
   ember_kv_free). be NULL makes a plan instead: the same layout and sizes,
   no pool allocated, for asking ember_kv_pool_bytes (and the other size
   queries) what the cache would take before anything is loaded; a plan
   may be given to nothing but the size queries and ember_kv_free. */
int ember_kv_new(ember_backend *be, const ember_kv_params *p, ember_kv **out, ember_error *err);
void ember_kv_free(ember_kv *kv);

/* ---- sizes and counters ---- */
int ember_kv_rows(const ember_kv *kv);
int ember_kv_ctx(const ember_kv *kv);
const ember_kv_type *ember_kv_get_type(const ember_kv *kv);
/* The kind as this cache uses it (the group size actually used). */
void ember_kv_describe(const ember_kv *kv, char *buf, size_t n);
/* Bytes one position of a row takes in every layer, in the final kind
   (transitioning: after conversion); before_conversion: in f32. */
size_t ember_kv_bytes_per_token(const ember_kv *kv, bool before_conversion);
/* Bytes of blocks a fresh row of n positions holds at its peak. */
size_t ember_kv_request_bytes(const ember_kv *kv, int n);
/* Bytes of new blocks row r needs to grow by n positions (copies and
   conversion included; what rotating groups give back afterwards not
   subtracted). */
size_t ember_kv_need_bytes(const ember_kv *kv, int r, int n);
size_t ember_kv_used_bytes(const ember_kv *kv);     /* blocks held, in bytes */
size_t ember_kv_capacity_bytes(const ember_kv *kv); /* the budget */
/* Bytes of the pools' buffers (a plan's: those ember_kv_new would allocate).
   Each pool is sized to the whole budget (rows share the budget, not a
   pool), so a cache of several layer groups allocates up to that many
   budgets; on the CPU the part never handed out stays unmapped. */
size_t ember_kv_pool_bytes(const ember_kv *kv);
/* Bytes of the pools' blocks ever handed out (their high-water mark; blocks
   past it were never written): on the CPU, the part of the pools that is
   resident, up to page rounding. Grows until the load peaks, never shrinks. */
size_t ember_kv_touched_bytes(const ember_kv *kv);
size_t ember_kv_free_bytes(const ember_kv *kv);
int ember_kv_blocks_used(const ember_kv *kv);
/* Bytes of the blocks row r refers to (shared blocks counted in full). */
size_t ember_kv_row_bytes(const ember_kv *kv, int r);

/* ---- rows ---- */
int ember_kv_len(const ember_kv *kv, int r);
/* The smallest length row r can be trimmed to (and so the longest prefix
   shorter than its length that can be reused): 0 for dense rows; rotating
   rows need their window; converted rows their quantize offset. */
int ember_kv_min_reuse(const ember_kv *kv, int r);
/* Positions row r may take in the next forward (the context's end, and a
   transitioning row's conversion offset, which chunks must not cross). */
int ember_kv_max_append(const ember_kv *kv, int r);
void ember_kv_clear(ember_kv *kv, int r);
int ember_kv_trim(ember_kv *kv, int r, int n, ember_error *err);
/* Row dst (cleared first) shares src's positions. */
int ember_kv_clone(ember_kv *kv, int src, int dst, ember_error *err);
/* Clears every row not listed in keep[n]. */
void ember_kv_filter(ember_kv *kv, const int *keep, int n);

int ember_kv_spec_begin(ember_kv *kv, int r, ember_error *err);
/* Ends the round keeping k of the positions appended since it began. */
int ember_kv_spec_commit(ember_kv *kv, int r, int k, ember_error *err);
int ember_kv_spec_rollback(ember_kv *kv, int r, ember_error *err);
bool ember_kv_in_spec(const ember_kv *kv, int r);

/* A detached copy of row r (sharing its blocks); free it with
   ember_kv_rowstate_free before the cache. */
int ember_kv_extract(ember_kv *kv, int r, ember_kv_rowstate **out, ember_error *err);
void ember_kv_rowstate_free(ember_kv *kv, ember_kv_rowstate *s);
int ember_kv_rowstate_len(const ember_kv_rowstate *s);
/* Installs states[i] into the empty row dst[i] for i < n: prepare takes
   everything that can fail; commit cannot fail; abort undoes prepare. The
   states stay owned by the caller. */
int ember_kv_merge_prepare(ember_kv *kv, ember_kv_rowstate *const *states, const int *dst, int n,
                           ember_kv_prepared **out, ember_error *err);
void ember_kv_merge_commit(ember_kv *kv, ember_kv_prepared *p);
void ember_kv_merge_abort(ember_kv *kv, ember_kv_prepared *p);
int ember_kv_merge(ember_kv *kv, ember_kv_rowstate *const *states, const int *dst, int n, ember_error *err);

/* Serializes row r: *blob (malloc'd, the caller frees) of *n bytes. */
int ember_kv_row_save(ember_kv *kv, int r, void **blob, size_t *n, ember_error *err);
/* Replaces row r with a blob of row_save from a cache of the same model and
   kind; on any error (bad or foreign blob, no memory) row r is unchanged. */
int ember_kv_row_load(ember_kv *kv, int r, const void *blob, size_t n, ember_error *err);

/* The span, in positions, that a forward should hold whole for its result
   not to depend on how a prompt is cut (the delta rule's chunked form,
   backend.h EMBER_DELTA_SPAN); 0 when any cut gives the same bits. */
int ember_kv_chunk_span(const ember_kv *kv);
/* Bytes of one row's recurrent state (0 without recurrent layers). */
size_t ember_kv_state_bytes(const ember_kv *kv);
/* Copies row r's recurrent state (every recurrent layer, backend.h's slot
   layout) into out[ember_kv_state_bytes / 4]; zeros for an empty row. */
int ember_kv_read_state(ember_kv *kv, int r, float *out, ember_error *err);

/* ---- a forward pass ---- */
/* Checks that tokens (row[t], pos[t]) continue their rows and takes the
   blocks they need. On error nothing changed. */
int ember_kv_begin(ember_kv *kv, const int32_t *row, const int32_t *pos, int T, ember_error *err);
/* Layer l's map for the batch of the open forward (views: room for 2). */
void ember_kv_map_for(const ember_kv *kv, int layer, const int32_t *row, const int32_t *pos, ember_kv_layer *views,
                      ember_kv_map *map);
/* Recurrent layer `layer`'s map for the batch of the open forward. */
void ember_kv_rec_map_for(const ember_kv *kv, int layer, const int32_t *row, const int32_t *pos, ember_rec_map *map);
/* Ends the open forward: ok commits the new positions, !ok returns every
   row to its state before ember_kv_begin. */
void ember_kv_end(ember_kv *kv, bool ok);

/* Decodes position p of row r in layer l into k[H * D], v[H * D] (tests,
   tools). */
int ember_kv_read_pos(ember_kv *kv, int r, int layer, int p, float *k, float *v, ember_error *err);

#endif
