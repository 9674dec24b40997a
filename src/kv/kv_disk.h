/*
 * kv_disk.h - the prompt cache's disk tier: whole prefixes (a row's
 * tokens and its KV) kept as files in one directory, so a restarted server
 * answers the next turn of a conversation from where it stood.
 *
 * A file holds one row as it stood when its request ended: the tokens of
 * its positions and the KV row blob (kv_blob.c) of exactly those positions.
 * A later request whose prompt shares a prefix with a file's tokens loads
 * the row from it (one block at a time: peak memory is the restored row
 * plus a block) and trims it to the shared length. Whole prefixes rather
 * than blocks: one file per conversation state, one read per restore, and
 * a newer state of a conversation replaces the older one it extends.
 *
 * File format (version 1, little-endian):
 *   "EMPROMPT"  u32 version  u32 header bytes (40 + 4 n + 4)
 *   u64 fingerprint (model, tokenizer: the caller's)  u64 cache salt
 *   u32 n tokens  u32 0
 *   i32 tokens[n]
 *   u32 CRC-32 of the header so far
 *   the KV row blob of n positions (its own header, payload and CRC)
 * The file's size must be exactly the header's plus the blob's.
 *
 * Writing is behind: ember_kv_disk_queue takes references on a row's
 * blocks (no copy; the row is free to change), ember_kv_disk_work writes a
 * slice at a time into a temporary file, then fsync and rename into place.
 * The byte cap is kept when a write starts: least recently used files go
 * first. Opening rebuilds the index from the files' headers; a file that is
 * corrupt, truncated, of another version, model, tokenizer or cache kind is
 * removed with a log line (a damaged payload is found on restore, and goes
 * the same way). Nothing about a file is fatal.
 *
 * Ownership: the disk tier belongs to one ember_kv and must be freed
 * before it (queued writes hold references on its blocks). Threading: the
 * thread that owns the ember_kv. Errors are returned; the log callback
 * hears about files skipped or removed and writes that failed.
 */
#ifndef EMBER_KV_DISK_H
#define EMBER_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "kv.h"

typedef struct ember_kv_disk ember_kv_disk;

typedef struct ember_kv_disk_stats {
    int files;             /* cache files in the index */
    size_t bytes;          /* their size */
    uint64_t restores;     /* rows loaded from a file */
    uint64_t tokens_restored;
    uint64_t writes;       /* files written */
    uint64_t removed;      /* files removed as bad (corrupt, foreign, truncated) */
    uint64_t evictions;    /* files removed to keep the byte cap */
} ember_kv_disk_stats;

/* The default byte cap when none is given. */
#define EMBER_KV_DISK_DEFAULT_MAX ((size_t)4 << 30)

/*
 * Opens the directory dir (created, one level, when missing) as kv's disk
 * tier; max_bytes caps the files' total size (0: the default).
 * fingerprint identifies everything beyond the cache's kind and shape that
 * the KV depends on (the model's weights, the tokenizer): a file with
 * another is removed. Errors: the directory cannot be made or read or
 * written (a clear message naming it). *out is freed with ember_kv_disk_free.
 */
int ember_kv_disk_open(ember_kv *kv, const char *dir, size_t max_bytes, uint64_t fingerprint,
                       const ember_logger *log, ember_kv_disk **out, ember_error *err);
/* Abandons any unfinished write (its temporary file is removed), drops the
   queue's references, frees d. The files stay. */
void ember_kv_disk_free(ember_kv_disk *d);

/* The longest prefix of tokens[0..n) a file with this salt holds, and in
   *file the file to restore (-1 when none). */
int ember_kv_disk_match(ember_kv_disk *d, const int32_t *tokens, int n, uint64_t salt, int *file);

/*
 * Loads file (from ember_kv_disk_match, before any other call) into row r,
 * replacing it: the row then holds the file's whole prefix. On error row r
 * is unchanged; a file found damaged is removed (and logged).
 */
int ember_kv_disk_restore(ember_kv_disk *d, int file, int r, ember_error *err);

/*
 * Queues row r's positions, whose tokens are tokens[0..len of row r), for
 * writing: references on its blocks, no copy. Nothing is queued when a
 * file or a queued write with this salt already holds these tokens (or
 * more); a queued write the new one extends is dropped. Out of memory:
 * nothing queued, an error returned.
 */
int ember_kv_disk_queue(ember_kv_disk *d, int r, const int32_t *tokens, uint64_t salt, ember_error *err);

/* Writes about `bytes` of the queue (a write finishing completes with its
   fsync and rename). Returns true while queued work remains. A failed write
   is logged, its temporary file removed, and the write dropped. */
bool ember_kv_disk_work(ember_kv_disk *d, size_t bytes);

/* Drops every queued write, the one under way too (its temporary file is
   removed), and their block references; true when any was dropped. For
   when KV memory is short. */
bool ember_kv_disk_drop_queued(ember_kv_disk *d);

void ember_kv_disk_get_stats(const ember_kv_disk *d, ember_kv_disk_stats *st);

#endif
