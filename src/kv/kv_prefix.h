/*
 * kv_prefix.h - the in-memory prefix cache: full KV blocks of earlier
 * requests, found again by the tokens that produced them.
 *
 * Every full block (EMBER_KV_BLOCK positions) a row publishes becomes an
 * entry keyed by a chain hash of (the parent entry's key, the block's
 * tokens), the first block's key also mixing a per-request salt. An entry
 * holds one reference on the block of every layer group at that index, so
 * the blocks outlive the row. A later request finds the longest run of
 * entries matching its prompt and installs them into an empty row by
 * reference: no copy, and rows of one batch share them. Lookups compare
 * tokens, parent and salt, never the hash alone: a collision only costs a
 * miss.
 *
 * Kinds: dense rows share from any block boundary; quantized (converting)
 * rows publish only once converted and share at or after their conversion
 * offset (their blocks are then a pure function of the tokens before them,
 * kv_codec.c). A rotating (sliding-window) group publishes a block only
 * while the row still holds it, so a chain of entries stops where a row
 * had dropped blocks before publishing them (the window wrapped within one
 * chunk); a row installed from the cache takes, in such a group, only the
 * blocks its length keeps (window and retain).
 *
 * Eviction frees only blocks no row refers to (reference count 1: the
 * cache's own), leaves before their parents, least recently used first.
 *
 * Ownership: the prefix cache belongs to one ember_kv, holds references to
 * its blocks, and must be freed (ember_kv_prefix_free) before that cache.
 * Threading: the thread that owns the ember_kv.
 */
#ifndef EMBER_KV_PREFIX_H
#define EMBER_KV_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"

typedef struct ember_kv_prefix ember_kv_prefix;

typedef struct ember_kv_prefix_stats {
    int entries;             /* cached blocks (one entry holds a block of every group) */
    size_t bytes;            /* bytes of the blocks entries refer to */
    size_t bytes_exclusive;  /* of which no row refers to (what eviction can free) */
    uint64_t tokens_reused;  /* positions installed from the cache */
    uint64_t evictions;      /* entries evicted */
} ember_kv_prefix_stats;

/* A prefix cache over kv's blocks; *out is freed with ember_kv_prefix_free. */
int ember_kv_prefix_new(ember_kv *kv, ember_kv_prefix **out, ember_error *err);
/* Drops every entry (releasing its references), then frees px. */
void ember_kv_prefix_free(ember_kv_prefix *px);
/* Drops every entry. */
void ember_kv_prefix_clear(ember_kv_prefix *px);
/* false when the cache's kinds cannot share (none today: kept for kinds to come). */
bool ember_kv_prefix_supported(const ember_kv_prefix *px);

/*
 * Publishes the full blocks of row r's first n positions, whose tokens are
 * tokens[0..n) (n <= the row's length). Blocks already cached are only
 * marked as used. Returns the number of new entries, or a negative error
 * code (out of memory: what was published stays, nothing else changes).
 * A converting row that has not converted yet publishes nothing.
 */
int ember_kv_prefix_publish(ember_kv_prefix *px, int r, const int32_t *tokens, int n, uint64_t salt);

/* The longest cached prefix of tokens[0..n), in positions (a multiple of
   EMBER_KV_BLOCK, 0 when shorter than the kind's minimum reusable offset).
   Marks the entries used. */
int ember_kv_prefix_match(ember_kv_prefix *px, const int32_t *tokens, int n, uint64_t salt);

/*
 * Installs the cached blocks of tokens[0..n) into row r, which must be
 * empty (length 0) and not in a speculative round; n a multiple of
 * EMBER_KV_BLOCK that ember_kv_prefix_match returned. On error (entries
 * gone, no memory for the table) row r stays empty.
 */
int ember_kv_prefix_attach(ember_kv_prefix *px, int r, const int32_t *tokens, int n, uint64_t salt,
                           ember_error *err);

/* Evicts unreferenced entries, leaves first, least recently used first,
   until at least `bytes` of blocks went back to the pools or nothing more
   can go. Returns the bytes freed. */
size_t ember_kv_prefix_evict(ember_kv_prefix *px, size_t bytes);

void ember_kv_prefix_get_stats(const ember_kv_prefix *px, ember_kv_prefix_stats *st);

#endif
