/*
 * kern_qamx.h - AMX-INT8 kernels for the packed 32-element quantized types
 * (Q8_0, Q4_0, Q5_0) when a matmul has several activation rows (prefill,
 * batched decode). Included by kern_avx512.c when it is built as
 * kern_amx.c (EMBER_AMX, with -mamx-tile -mamx-int8), after kern_qpack.h.
 * They are the table's qgemm_tiled kernels (kernels.h): the backend gives
 * them the activations as A32 tiles (qkern.h) when a matmul has at least
 * AMX_MIN_M rows; fewer rows, and the K types, stay on the VNNI kernels.
 *
 * The arithmetic is qkern.h's canonical dot product, bit for bit: one
 * TDPBSSD per block computes the exact int32 sums S of 16 activation rows
 * by 16 weight rows (signed levels times signed activation bytes, K = 32),
 * the tile is stored, and each output takes
 * acc = fmaf(f32(w.d) * y.d, (float)S, acc) in block order, in AVX-512
 * lanes. So results equal every other ISA's, whatever the tiling.
 *
 * Layout: a packed block group's level dwords are already AMX's B layout
 * (row k of the tile = 16 weight rows x 4 consecutive elements). The
 * kernel turns AMX_CHUNK blocks of one group at a time into a "panel" on
 * the stack: per block, the 16 scales as f32 and the 512 level bytes as
 * signed int8 (Q8_0: stored byte ^ 0x80; Q4_0: nibble - 8; Q5_0: nibble +
 * 16 * high bit - 16), then sweeps every 16-row tile of activations over
 * it (an A32 tile's block is 16 rows x 32 bytes, stride 32, and its 16
 * scales). Rows past the last are zero in the tiles and never stored.
 * Between chunks the accumulators rest in out (f32 stored and reloaded
 * exactly).
 *
 * Loop order (issue 18): m-blocks of AMX_MBLK row tiles, then chunks, then
 * groups, then the m-block's tiles. The activations a panel is swept by
 * (4 tiles x 16 blocks x 576 bytes) and the panel stay in L1 across all
 * the groups, and the out rows an m-block revisits per chunk (64 rows) in
 * L2; sweeping every tile of a long prompt instead (M = 512: 295 KB of
 * activations per panel and the whole 10 MB out per chunk) ran at half the
 * speed. Panels are made once per m-block (a few percent of the work),
 * and the weights are read once per m-block, so a call whose out fits L2
 * (AMX_MBLK_OUT: fewer rows, fewer weight rows per thread, N = 896 at M =
 * 512) sweeps all its tiles as one m-block, which measured faster there.
 * The order never changes an output's chain of fused multiply-adds.
 *
 * Tiles: 0-3 the int32 results (16 x 16), so that four blocks are in
 * flight; 4, 5 activations (16 rows x 32 bytes); 6, 7 weights (8 rows x 64
 * bytes). Each call loads this
 * configuration and releases the tiles before it returns, so a worker
 * thread carries no tile state between calls. The process must have been
 * granted the tile state (ember_cpu_amx_ready) before the first call.
 * No other state; a call writes only its own outputs.
 */

#define AMX_MIN_M 32 /* fewer activation rows: the VNNI kernels (faster below ~32 rows on a 16-core Xeon) */
#define AMX_MBLK 4   /* row tiles per m-block: their chunk of activations (36 KB) and the panel (9 KB) fit L1 */
#define AMX_MBLK_OUT (2u << 20) /* m-blocks only when a call's out exceeds this many bytes (about L2) */
#define AMX_CHUNK 16 /* blocks per panel: 9 KB on the stack */
#ifndef AMX_AHEAD
#define AMX_AHEAD 3 /* blocks the tile unit runs ahead of the post-processing (1..3) */
#endif

typedef struct amx_blk {
    float d[16];      /* the 16 rows' scales */
    int8_t q[8][64];  /* B tile: row k = elements 4k..4k+3 of rows 0..15 */
} amx_blk;            /* 576 bytes */

typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Loads palette 1 with tile t of rows[t] rows of colsb[t] bytes, t < 8. */
static void amx_load_cfg(const uint8_t rows[8], const uint16_t colsb[8]) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    memcpy(c.rows, rows, 8);
    memcpy(c.colsb, colsb, 8 * sizeof *colsb);
    _tile_loadconfig(&c);
}

/* Tiles 0-3 the sums (16 x 16 int32), 4, 5 activations (16 x 32 bytes), 6, 7 weights (8 x 64 bytes). */
static void amx_configure(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 8, 8};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
    amx_load_cfg(rows, colsb);
}

/* Block group p (one block of 16 rows, qkern.h layout of type T) -> o. */
ALWAYS_INLINE void amx_panel_blk(const unsigned char *p, amx_blk *o, const int T) {
    _mm512_store_ps(o->d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)));
    if (T == EMBER_Q8_0) {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            _mm512_store_si512(o->q[k], _mm512_xor_si512(_mm512_loadu_si512(p + 32 + 64 * k), x80));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const size_t qo = T == EMBER_Q4_0 ? 32 : 96;
    const __m512i off = _mm512_set1_epi8(T == EMBER_Q4_0 ? 8 : 16);
    const __m512i H = T == EMBER_Q5_0 ? _mm512_loadu_si512(p + 32) : _mm512_setzero_si512();
    const __m512i m10 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_loadu_si512(p + qo + 64 * k);
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (T == EMBER_Q5_0) { /* element 4g + i's high bit is bit 8i + g of the row's dword */
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi32(H, (unsigned)(4 - k)), m10));
            hi = _mm512_or_si512(hi, _mm512_and_si512(k == 0 ? H : _mm512_srli_epi32(H, (unsigned)k), m10));
        }
        _mm512_store_si512(o->q[k], _mm512_sub_epi8(lo, off));
        _mm512_store_si512(o->q[4 + k], _mm512_sub_epi8(hi, off));
    }
}

/* The post-processing of one block's stored sums C (16 x 16 int32) for
   row r of the tile: acc = fma(w * yd[r], (float)C[r], acc), w the 16
   weight rows' scales. (Sixteen named accumulators, not an array, so that
   they stay in registers.) */
#define AMX_ROW(acc, r) acc = _mm512_fmadd_ps(_mm512_mul_ps(w, _mm512_set1_ps(yd[r])), \
                                              _mm512_cvtepi32_ps(_mm512_load_si512(C + 16 * (r))), acc)

/* Block b's sums into C (16 x 16 int32) through result tile b & 3, with
   operand tiles 4 + (b & 1) and 6 + (b & 1): four blocks in flight. */
#define AMX_CHAIN(c, a, w)                                                                                         \
    do {                                                                                                           \
        _tile_zero(c);                                                                                             \
        _tile_loadd(a, xt[b].q, 32);                                                                               \
        _tile_loadd(w, pan[b].q, 64);                                                                              \
        _tile_dpbssd(c, a, w);                                                                                     \
        _tile_stored(c, C, 64);                                                                                    \
    } while (0)
ALWAYS_INLINE void amx_block(const amx_blk *pan, const cpu_act32_tile *xt, int b, int32_t *C) {
    switch (b & 3) {
    case 0: AMX_CHAIN(0, 4, 6); break;
    case 1: AMX_CHAIN(1, 5, 7); break;
    case 2: AMX_CHAIN(2, 4, 6); break;
    default: AMX_CHAIN(3, 5, 7); break;
    }
}

/* One tile of 16 activation rows (xt: its first block of the chunk)
   against the panel's nbc blocks; rows [0, mr) of out (16 columns, rows
   ldo apart) are read first unless first, and written. The tile unit runs
   AMX_AHEAD blocks ahead of the vector post-processing (a ring of four
   result buffers), so a block's stored sums have landed before they are
   read. */
static void amx_tile16(const amx_blk *pan, int nbc, const cpu_act32_tile *xt, float *out, size_t ldo, int mr,
                       bool first) {
    _Alignas(64) int32_t Cb[4][256];
    __m512 a[16];
    for (int r = 0; r < 16; r++)
        a[r] = first || r >= mr ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (size_t)r * ldo);
    __m512 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7], a8 = a[8],
           a9 = a[9], a10 = a[10], a11 = a[11], a12 = a[12], a13 = a[13], a14 = a[14], a15 = a[15];
    for (int b = 0; b < AMX_AHEAD && b < nbc; b++) amx_block(pan, xt, b, Cb[b]);
    for (int b = 0; b < nbc; b++) {
        if (b + AMX_AHEAD < nbc) amx_block(pan, xt, b + AMX_AHEAD, Cb[(b + AMX_AHEAD) & 3]);
        const int32_t *C = Cb[b & 3];
        const float *yd = xt[b].d;
        const __m512 w = _mm512_load_ps(pan[b].d);
        AMX_ROW(a0, 0), AMX_ROW(a1, 1), AMX_ROW(a2, 2), AMX_ROW(a3, 3), AMX_ROW(a4, 4), AMX_ROW(a5, 5);
        AMX_ROW(a6, 6), AMX_ROW(a7, 7), AMX_ROW(a8, 8), AMX_ROW(a9, 9), AMX_ROW(a10, 10), AMX_ROW(a11, 11);
        AMX_ROW(a12, 12), AMX_ROW(a13, 13), AMX_ROW(a14, 14), AMX_ROW(a15, 15);
    }
    a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3, a[4] = a4, a[5] = a5, a[6] = a6, a[7] = a7;
    a[8] = a8, a[9] = a9, a[10] = a10, a[11] = a11, a[12] = a12, a[13] = a13, a[14] = a14, a[15] = a15;
    for (int r = 0; r < mr; r++) _mm512_storeu_ps(out + (size_t)r * ldo, a[r]);
}

/* M-block by m-block of AMX_MBLK row tiles, and in each chunk by chunk of
   AMX_CHUNK blocks: each group's panel is made once per m-block and swept
   by the m-block's tiles, whose chunk of activations (16 x 576 bytes per
   block and tile) stays in L1 across the groups. */
ALWAYS_INLINE void amx_drive(const void *wp, int ngroups, const void *xt, int mm, int K, float *out, size_t ldo,
                             const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    const int nb = K / 32, ntiles = (mm + 15) / 16;
    const size_t gbytes = 16 * bb * (size_t)nb;
    const cpu_act32_tile *x = xt;
    const int mblk = (size_t)mm * (size_t)ngroups * 64 > AMX_MBLK_OUT ? AMX_MBLK : ntiles;
    _Alignas(64) amx_blk pan[AMX_CHUNK];
    amx_configure();
    for (int tm0 = 0; tm0 < ntiles; tm0 += mblk) {
        const int tm1 = ntiles - tm0 < mblk ? ntiles : tm0 + mblk;
        for (int b0 = 0; b0 < nb; b0 += AMX_CHUNK) {
            const int nbc = nb - b0 < AMX_CHUNK ? nb - b0 : AMX_CHUNK;
            for (int g = 0; g < ngroups; g++) {
                const unsigned char *wg = (const unsigned char *)wp + (size_t)g * gbytes + (size_t)b0 * 16 * bb;
                for (int b = 0; b < nbc; b++) amx_panel_blk(wg + (size_t)b * 16 * bb, &pan[b], T);
                if (g + 1 < ngroups) /* the next group's chunk into L2 while this panel is swept */
                    for (size_t o = 0; o < (size_t)nbc * 16 * bb; o += 64)
                        __builtin_prefetch((const void *)((uintptr_t)wg + gbytes + o), 0, 2);
                for (int t = tm0; t < tm1; t++)
                    amx_tile16(pan, nbc, x + (size_t)t * (size_t)nb + (size_t)b0,
                               out + (size_t)(16 * t) * ldo + 16 * g, ldo, mm - 16 * t < 16 ? mm - 16 * t : 16,
                               b0 == 0);
            }
        }
    }
    _tile_release();
}

#define AMX_ENTRY(name, T)                                                                                         \
    static void CAT(KPREFIX, name)(const void *wp, int ngroups, const void *xt, int mm, int K, float *out,        \
                                   size_t ldo) {                                                                   \
        amx_drive(wp, ngroups, xt, mm, K, out, ldo, T);                                                            \
    }
AMX_ENTRY(amx_q8_0, EMBER_Q8_0)
AMX_ENTRY(amx_q4_0, EMBER_Q4_0)
AMX_ENTRY(amx_q5_0, EMBER_Q5_0)

#define AMX_TABLE                                                                                                  \
    .qgemm_tiled = {[EMBER_Q8_0] = CAT(KPREFIX, amx_q8_0), [EMBER_Q4_0] = CAT(KPREFIX, amx_q4_0),                  \
                    [EMBER_Q5_0] = CAT(KPREFIX, amx_q5_0)},                                                        \
    .tiled_min_m = AMX_MIN_M
