/*
 * qkern.h - quantized weights in the CPU backend: the activation formats,
 * the canonical definition of a quantized dot product, the packed
 * (row-interleaved) weight layouts, and the per-type helpers shared by
 * every ISA.
 *
 * Ownership: header only; no state. Everything here is a pure function of
 * its arguments and may run on any worker thread.
 *
 * Activations. A matmul with quantized weights first quantizes each input
 * row on its own (so a row's result never depends on the other rows):
 *   A32  (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MLX): blocks of 32 elements,
 *        struct cpu_act32 { f32 d; f32 ds; i8 q[32]; i32 s }, d = amax / 127,
 *        q = round_to_nearest_even(x * (127 / amax)) (0 when amax is 0;
 *        NaN -> -127), s = sum(q), ds = d * (float)s.
 *   A256 (for Q4_K, Q5_K, Q6_K, Q8_K): blocks of 256, struct cpu_act256
 *        { f32 d; i16 bsums[16]; i8 q[256]; i32 bs16[16]; i32 bs32[8] },
 *        same rule with amax over 256 elements; bsums[j] = bs16[j] = sum of
 *        q[16j .. 16j+15], bs32[j] = sum of q[32j .. 32j+31].
 *   A32 tiles (for kernels with qgemm_tiled, kernels.h: AMX): the A32 rows
 *        regrouped for 16-row tiles, struct cpu_act32_tile { f32 d[16];
 *        i8 q[16][32] } per (tile, block), tile t = rows 16t .. 16t+15,
 *        tiles in order and blocks in order within a tile; rows past the
 *        last are zero (d = 0, q = 0).
 * The quantizers give the same bytes on every ISA (the SIMD ones in the ISA
 * files evaluate the same f32 operations; kern_quant.c has the plain-C
 * reference), so every kernel sees the same activations.
 *
 * The canonical dot product of a weight row w with an activation row y
 * (every ISA's kernel must give exactly this float, bit for bit):
 *   32-element types, per block b in order, with a scalar accumulator:
 *     integer weight levels w_e (Q4_0: nibble - 8, Q5_0: q5 - 16, Q8_0: qs,
 *     Q4_1 / Q5_1: the unsigned level q); S = sum_e w_e * y_e (exact
 *     int32); dd = f32(w.d) * y.d (one rounding);
 *     acc = fmaf(dd, (float)S, acc);
 *     Q4_1 / Q5_1 then add the min term: acc = fmaf(f32(w.m), y.ds, acc).
 *   K types, per super-block b in order, with a scalar accumulator:
 *     Q4_K / Q5_K: S1 = sum_j sc_j * sum_{e in j} q_e y_e, S2 = sum_j m_j *
 *       bs32[j] (exact int32);
 *       acc = fmaf(f32(d) * y.d, (float)S1, acc);
 *       acc = fmaf(-(f32(dmin) * y.d), (float)S2, acc).
 *     Q6_K: S1 = sum_j sc_j * sum_{e in j} (q_e - 32) y_e;
 *       acc = fmaf(f32(d) * y.d, (float)S1, acc).
 *     Q8_K: S1 = sum_e q_e y_e; acc = fmaf(w.d * y.d, (float)S1, acc).
 * The result is acc (0 for K = 0). Integer parts are exact in any order and
 * the float steps are one fixed chain per output, so scalar, AVX2 and
 * AVX-512 (with or without VNNI) agree bit for bit, and a SIMD kernel may
 * put different outputs (weight rows, activation rows) in different lanes.
 *
 * Packed weights. Row-major block rows are what the files hold; the SIMD
 * kernels want CPU_QP_ROWS (16) rows side by side, one row per 32-bit lane,
 * so that one vector load feeds 16 outputs and no reduction across lanes is
 * ever needed. The CPU backend repacks a weight matrix in place (the bytes
 * of each group of 16 rows are permuted, the size is unchanged) once, when
 * the model loader prepares it (backend.h prepare_weight, docs/backend.md),
 * for the dtypes whose ISA table has a packed
 * kernel (cpu_kernels.qgemm_packed); rows past the last whole group stay in
 * row-major order. Repacking only moves bits: the canonical dot product of
 * a row is the same whatever the layout, and cpu_qpack_get_block recovers
 * every original block byte for byte (get_rows, read and write use it).
 * The group of 16 rows holds, for each (super-)block index b in order, a
 * "block group" of 16 x block_bytes bytes (r = row in the group 0..15,
 * "dword [k][r]" = 4 bytes at offset 4 * (16 k + r) of that array):
 *   Q8_0 (544):  f16 d[r]; u8 q[8][16][4]: q[g][r][i] = qs_r[4g+i] ^ 0x80.
 *   Q4_0 (288):  f16 d[r]; u8 q[4][16][4]: q[k][r][i] = qs_r[4k+i] (low
 *                nibble: element 4k+i, high nibble: element 16+4k+i).
 *   Q5_0 (352):  f16 d[r]; u32 h[r] with bit 8i+g = high bit of element
 *                4g+i; then q[4][16][4] as Q4_0.
 *   Q4_K (2304): f16 d[r]; f16 dmin[r]; u32 sc[3][r] = the 12 scale bytes
 *                of row r as three dwords; u8 q[4][8][16][4]:
 *                q[c][t][r][i] = qs_r[32c + 4t + i] (low nibble: element
 *                64c + 4t + i, high: element 64c + 32 + 4t + i).
 *   Q5_K (2816): as Q4_K, then u8 qh[8][16][4] = qh_r[4t + i] before q.
 *   Q6_K (3360): f16 d[r]; i8 sc[16][r]; u8 ql[2][2][8][16][4] =
 *                ql_r[64n + 32h + 4t + i]; u8 qh[2][8][16][4] =
 *                qh_r[32n + 4t + i].
 *   BF16 (1024, in chunks of 32 elements, on the AMX tables only, for K a
 *                multiple of 32): u16 w[16][16][2]: dword [k][r] = elements
 *                32b + 2k and 32b + 2k + 1 of row r (AMX's B tile layout).
 */
#ifndef EMBER_CPU_QKERN_H
#define EMBER_CPU_QKERN_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels.h"

typedef struct cpu_act32 {
    float d, ds;
    int8_t q[32];
    int32_t s;
} cpu_act32; /* 44 bytes; d, ds and q keep the offsets of the first A32 layout */

typedef struct cpu_act256 {
    float d;
    int16_t bsums[16];
    int8_t q[256];
    int32_t bs16[16], bs32[8];
} cpu_act256; /* 388 bytes */

typedef struct cpu_act32_tile {
    float d[16];
    int8_t q[16][32];
} cpu_act32_tile; /* 576 bytes; q at offset 64 */

/* Bytes of the A32 tiles of mm rows of K elements (K a multiple of 32). */
size_t cpu_act32_tiled_bytes(int mm, int K);
/* Writes blocks [b0, b1) of tile number tile of the A32 tiles at xt (for
   mm rows of K elements) from the A32 rows at act (row r at act + r * arow):
   the tile's rows past mm become zero. Each (tile, block) is 576 bytes on
   its own (64-aligned when xt is), so tasks that write disjoint (tile,
   block range) pairs share no cache line of xt. */
void cpu_act32_tile_blocks(const void *act, size_t arow, int K, int mm, int tile, int b0, int b1, void *xt);

/* Rows per packed group. */
#define CPU_QP_ROWS 16

/* CPU_ACT_BF16X2: a row of K floats as K bf16 "hi" values then K bf16 "lo"
   values (hi = bf16(x), lo = bf16(x - hi), both rounded to nearest even),
   for the AMX-BF16 kernels of bf16 weights (kern_bamx.h). */
typedef enum cpu_act_kind { CPU_ACT_NONE = 0, CPU_ACT_32, CPU_ACT_256, CPU_ACT_BF16X2, CPU_ACT_COUNT } cpu_act_kind;

/* The activation format a weight dtype multiplies with (NONE for float
   weights and for dtypes the CPU backend cannot multiply). */
cpu_act_kind cpu_act_kind_for(ember_dtype t);

/* Bytes of one quantized activation row of K elements (K a multiple of the
   block), or 0 for NONE. */
size_t cpu_act_row_bytes(cpu_act_kind k, int K);

/* Quantizes one row of K floats (K a multiple of 32 / 256) into dst. */
void cpu_quantize_act32(const float *x, int K, void *dst);
void cpu_quantize_act256(const float *x, int K, void *dst);

/* Converts n elements (a whole number of blocks) of a weight dtype to f32,
   exactly as the format defines (formats/quant.h spells out the formulas).
   Returns false for a dtype it does not know. */
bool cpu_dequant_row(ember_dtype t, const void *src, float *dst, int64_t n);

/* Bytes of one row of K elements of dtype t (0 when K is not a whole number
   of blocks). */
size_t cpu_row_bytes(ember_dtype t, int64_t K);

/* ---- packed weights ---------------------------------------------------- */

/* true when t has a packed layout (above). */
bool cpu_qpack_has(ember_dtype t);

/* Moves original block blk (block_bytes of t) to row r of the block group
   bg, and back. */
void cpu_qpack_put_block(ember_dtype t, void *bg, int r, const void *blk);
void cpu_qpack_get_block(ember_dtype t, const void *bg, int r, void *blk);

/* Packs rows [0, nrows) (nrows <= 16) of src (row stride src_row bytes, K
   elements) into the group dst (16 * row bytes); rows nrows..15 become
   all-zero blocks (whose outputs are 0). dst must not overlap src. */
void cpu_qpack_group(ember_dtype t, const void *src, size_t src_row, int nrows, int K, void *dst);
/* The inverse for rows [0, nrows): dst gets the original row-major bytes. */
void cpu_qunpack_group(ember_dtype t, const void *src, int K, void *dst, size_t dst_row, int nrows);

/* Row r of the packed group g, dequantized (exactly as cpu_dequant_row). */
void cpu_qpack_dequant_row(ember_dtype t, const void *g, int r, int K, float *dst);

/* out[m * ldo + n] = canonical dot of weight row n with activation row m for
   n < nn, m < mm, whatever the weights' layout: packed (then w starts at a
   group boundary, whole groups are packed and the last nn % 16 rows are
   row-major) or row-major. Uses k's packed kernel when it has one (packing
   row-major groups into scratch on the fly), else k->qgemm or the generic
   kernel. scratch: cpu_qmatmul_scratch_bytes(t, K, mm) bytes, 64-aligned. */
void cpu_qmatmul(const cpu_kernels *k, ember_dtype t, const void *w, bool packed, int nn, const void *xa,
                 size_t xa_row, int mm, int K, float *out, size_t ldo, void *scratch);
size_t cpu_qmatmul_scratch_bytes(ember_dtype t, int K, int mm);
/* cpu_qmatmul with the activations as A32 tiles (xt, mm rows) and k's
   qgemm_tiled kernel for t (which must be set); same outputs, same
   scratch. */
void cpu_qmatmul_tiled(const cpu_kernels *k, ember_dtype t, const void *w, bool packed, int nn, const void *xt, int mm,
                       int K, float *out, size_t ldo, void *scratch);

/* The canonical quantized gemm for every supported block type (plain C):
   out[m * ldo + n] = dot(w row n, activation row m). Used as the scalar
   kernels and as the reference the SIMD kernels are tested against. */
cpu_qgemm_fn_t cpu_qgemm_generic(ember_dtype t);

/* ---- helpers shared with the SIMD files ------------------------------- */

static inline float cpu_h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ember_f16_to_f32(h);
}

/* The fixed tree sum of 16 lanes (kernels.h). */
static inline float cpu_tree16(const float a[16]) {
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
    return s0 + s1;
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j. */
static inline void cpu_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
