/*
 * kv_codec.h - the KV block codecs of backend.h in plain C: encoding one
 * head vector into a block piece, decoding it back, and the static tables of
 * the rotation-based (TQ) codec.
 *
 * Every backend stores exactly these bytes, so a row serialized on one
 * machine (or backend) reads the same on another. Encoding is plain C with
 * no contraction (-ffp-contract=off), the same on every ISA: the codes a
 * cache holds never depend on the CPU. Decoding here is the reference the
 * per-ISA attention kernels are tested against.
 *
 * Nothing here allocates; callers own every buffer.
 */
#ifndef EMBER_BACKEND_KV_CODEC_H
#define EMBER_BACKEND_KV_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* The Lloyd-Max codebook of the standard normal with 2^bits levels (bits
   2..8), increasing, and its 2^bits - 1 decision thresholds (midpoints);
   NULL for other widths. Static storage. */
const float *ember_tq_codebook(int bits);
const float *ember_tq_bounds(int bits);

/* Fills signs[D] with the +-1 of the TQ rotation for a cache: a fixed
   function of (seed, D), so a serialized row decodes anywhere. */
void ember_tq_signs(uint64_t seed, int D, float *signs);

/* y = R x for the TQ rotation of dimension D: per power-of-two segment of D
   (largest first), y = H (signs * x) / sqrt(n). x and y may alias. */
void ember_tq_rotate(const float *signs, int D, const float *x, float *y);
/* x = R^T y, the inverse. x and y may alias. */
void ember_tq_unrotate(const float *signs, int D, const float *y, float *x);

/* Bytes of one head's EMBER_KV_BLOCK positions under codec c for head
   dimension D (0 if the codec does not fit D). */
size_t ember_kv_head_bytes(const ember_kv_codec *c, int D, bool is_k);

/* Byte offset, in a K piece of a normalizing codec (Q8, Q4, TQ), of the
   block's channel means mu [D] f16, followed by the spreads sigma [D] f16;
   0 for codecs without. */
size_t ember_kv_norm_offset(const ember_kv_codec *c, int D);

/* Head sizes the K codecs with normalization support. */
#define EMBER_KV_NORM_MAX_D 1024

/* Encodes x[D] into slot `slot` (0..15) of the piece at p (head_bytes
   bytes); is_k selects the K layout (transposed) or the V layout. prev: the
   same head's piece of the row's previous block (NULL for the first block),
   in codec prev_c (NULL: c); a normalizing K piece (Q8, Q4, TQ) takes its
   channel statistics from it when slot 0 is written, so blocks are written
   in position order. A converted row's first block passes its own complete
   f32 piece as prev. */
void ember_kv_encode(const ember_kv_codec *c, int D, bool is_k, const float *x, unsigned char *p, int slot,
                     const unsigned char *prev, const ember_kv_codec *prev_c);
/* Decodes slot `slot` of the piece at p into x[D]. */
void ember_kv_decode(const ember_kv_codec *c, int D, bool is_k, const unsigned char *p, int slot, float *x);

/* Checks a KV map against k/v-shaped tensors [T, H, D]: every view matches
   (H, D) and its codecs, every token's row and position is valid and its row
   has a block table. Returns EMBER_OK or EMBER_ERR_INVALID_ARG naming op. */
int ember_kv_map_check(const ember_kv_map *map, int T, int H, int D, const char *op, ember_error *err);
/* Checks that row r's blocks for positions [lo, hi] exist in its pool. */
int ember_kv_map_check_blocks(const ember_kv_map *map, int r, int lo, int hi, const char *op, ember_error *err);

/* The checks kv_write / kv_read share on every backend: k and v both
   [T, H, D] (filled in), the map valid for them, every token's position in
   its row's blocks. The caller checks dtype and memory itself. */
int ember_kv_rw_check(const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v, const char *op, int *T,
                      int *H, int *D, ember_error *err);

#endif
