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
 * kernel turns AMX_CHUNK blocks of a pair of groups at a time into
 * "panels" on the stack: per block, the 16 scales as f32 and the 512 level
 * bytes as signed int8 (Q8_0: stored byte ^ 0x80; Q4_0: nibble - 8; Q5_0:
 * nibble + 16 * high bit - 16), then sweeps the pairs of 16-row tiles of
 * activations over them (an A32 tile's block is 16 rows x 32 bytes, stride
 * 32, and its 16 scales). Rows past the last are zero in the tiles and
 * never stored.
 *
 * Blocking (issue 18): the per-block f32 step forces every block's 16 x 16
 * sums through memory (a tile store, then AVX-512 loads), so the kernel
 * works in units of 2 x 2 output tiles (two row tiles by two groups) and
 * AMX_CHUNK blocks: per block, two A and two B tile loads feed four
 * TDPBSSD (each loaded tile feeds two), and the four results are stored to
 * a sum buffer; then each output tile's 16 accumulators (registers) take
 * the unit's blocks in order. Units are software-pipelined: the tile work
 * of the next unit is issued before the vector work of this one (two sum
 * buffers in turn), so the tile unit and the vector units overlap and a
 * sum is read long after it was stored. An odd last row tile or group
 * makes a narrower unit (1 x 2, 2 x 1, 1 x 1). Between chunks the
 * accumulators rest in out (f32 stored and reloaded exactly); the loop
 * order (m-blocks of row tiles that keep their activations near 1 MB,
 * then pairs of groups, then chunks, then pairs of row tiles) keeps the
 * out rows of a pair of groups and the m-block's activations in cache.
 * None of this changes an output's chain of fused multiply-adds.
 *
 * Tiles: 0-3 the int32 results (16 x 16) of the unit's four products; 4,
 * 5 activations (16 rows x 32 bytes); 6, 7 weights (8 rows x 64 bytes).
 * Each call loads this
 * configuration and releases the tiles before it returns, so a worker
 * thread carries no tile state between calls. The process must have been
 * granted the tile state (ember_cpu_amx_ready) before the first call.
 * No other state; a call writes only its own outputs.
 */

#define AMX_MIN_M 32 /* fewer activation rows: the VNNI kernels (faster below ~32 rows on a 16-core Xeon) */
#ifndef AMX_CHUNK
#define AMX_CHUNK 4 /* blocks per unit: 4.5 KB of panels and 34 KB of sums (two buffers) on the stack */
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

/* Tiles 0-3 the sums (16 x 16 int32) of a unit, 4, 5 activations (16 x 32 bytes), 6, 7 weights (8 x 64 bytes). */
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

/* int32s from one block's sums to the next in the sum buffer: 1 KB and a
   line of padding, so that consecutive blocks do not alias at 4 KB */
#define AMX_CST (256 + 16)

/* The sum buffer of one unit: [output tile q][block b] at C + (q * AMX_CHUNK
   + b) * AMX_CST. */
#define AMX_CB(C, q, b) ((C) + ((size_t)(q) * AMX_CHUNK + (size_t)(b)) * AMX_CST)

/* The tile work of one unit: for each of its nbc blocks, the activation
   tiles of NM (1, 2) row tiles x0, x1 times the weight tiles of NG (1, 2)
   panels p0, p1: NM * NG results (tile 0: x0 p0, 1: x0 p1, 2: x1 p0, 3:
   x1 p1), each stored to its place in C (output tile q = 2 i + j). Each
   loaded A and B tile feeds NG and NM products. */
ALWAYS_INLINE void amx_unit_tiles(const amx_blk *p0, const amx_blk *p1, const cpu_act32_tile *x0,
                                  const cpu_act32_tile *x1, int nbc, int32_t *C, const int NM, const int NG) {
    for (int b = 0; b < nbc; b++) {
        _tile_loadd(4, x0[b].q, 32);
        _tile_loadd(6, p0[b].q, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 4, 6);
        if (NG == 2) {
            _tile_loadd(7, p1[b].q, 64);
            _tile_zero(1);
            _tile_dpbssd(1, 4, 7);
        }
        if (NM == 2) {
            _tile_loadd(5, x1[b].q, 32);
            _tile_zero(2);
            _tile_dpbssd(2, 5, 6);
            if (NG == 2) {
                _tile_zero(3);
                _tile_dpbssd(3, 5, 7);
            }
        }
        _tile_stored(0, AMX_CB(C, 0, b), 64);
        if (NG == 2) _tile_stored(1, AMX_CB(C, 1, b), 64);
        if (NM == 2) _tile_stored(2, AMX_CB(C, 2, b), 64);
        if (NM == 2 && NG == 2) _tile_stored(3, AMX_CB(C, 3, b), 64);
    }
}

/* The vector work of one output tile (16 activation rows x 16 weight
   rows) over a unit's nbc blocks: the stored sums Cq (block b at Cq + b *
   AMX_CST), the panel pan, the activation tile xt (its first block of the
   unit). Rows [0, mr) of out (16 columns, rows ldo apart) are read first
   unless first, and written; the padded rows past mr start at 0 and are
   never written. */
ALWAYS_INLINE void amx_post(const amx_blk *pan, const cpu_act32_tile *xt, int nbc, const int32_t *Cq, float *out,
                            size_t ldo, int mr, bool first) {
    __m512 a[16];
    for (int r = 0; r < 16; r++)
        a[r] = first || r >= mr ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (size_t)r * ldo);
    __m512 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7], a8 = a[8],
           a9 = a[9], a10 = a[10], a11 = a[11], a12 = a[12], a13 = a[13], a14 = a[14], a15 = a[15];
    for (int b = 0; b < nbc; b++) {
        const int32_t *C = Cq + (size_t)b * AMX_CST;
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

/* The vector work of one unit: NM row tiles (x0, x1: their first block of
   the chunk; mr0, mr1 real rows) by NG groups (panels p0, p1) over nbc
   blocks, from the sums that amx_unit_tiles stored at C; out points at row
   0, column 0 of output tile (0, 0). */
ALWAYS_INLINE void amx_unit_post(const amx_blk *p0, const amx_blk *p1, const cpu_act32_tile *x0,
                                 const cpu_act32_tile *x1, int nbc, const int32_t *C, float *out, size_t ldo, int mr0,
                                 int mr1, bool first, const int NM, const int NG) {
    amx_post(p0, x0, nbc, AMX_CB(C, 0, 0), out, ldo, mr0, first);
    if (NG == 2) amx_post(p1, x0, nbc, AMX_CB(C, 1, 0), out + 16, ldo, mr0, first);
    if (NM == 2) {
        float *o1 = out + 16 * ldo;
        amx_post(p0, x1, nbc, AMX_CB(C, 2, 0), o1, ldo, mr1, first);
        if (NG == 2) amx_post(p1, x1, nbc, AMX_CB(C, 3, 0), o1 + 16, ldo, mr1, first);
    }
}

/* The units of one chunk of one pair of groups (ng of them, panels p0,
   p1): the pairs of row tiles [tm0, tm1), software-pipelined: the tile
   work of a unit is issued before the vector work of the unit before it
   (sum buffers C0 and C1 in turn), so that the tile unit and the vector
   units overlap and sums are read long after they were stored. */
ALWAYS_INLINE void amx_chunk(const amx_blk *p0, const amx_blk *p1, const cpu_act32_tile *x, int nb, int b0, int nbc,
                             int tm0, int tm1, int mm, float *out, size_t ldo, int32_t *C0, int32_t *C1,
                             const int NG) {
    const bool first = b0 == 0;
    int pt = -1; /* the pending unit's first row tile */
    for (int t = tm0;; t += 2) {
        int32_t *Cn = ((t - tm0) / 2) & 1 ? C1 : C0;
        if (t < tm1) {
            const cpu_act32_tile *x0 = x + (size_t)t * (size_t)nb + (size_t)b0;
            if (tm1 - t >= 2)
                amx_unit_tiles(p0, p1, x0, x0 + nb, nbc, Cn, 2, NG);
            else
                amx_unit_tiles(p0, p1, x0, x0, nbc, Cn, 1, NG);
        }
        if (pt >= 0) {
            const int32_t *Cp = Cn == C0 ? C1 : C0;
            const cpu_act32_tile *x0 = x + (size_t)pt * (size_t)nb + (size_t)b0;
            float *o = out + (size_t)(16 * pt) * ldo;
            const int mr0 = mm - 16 * pt < 16 ? mm - 16 * pt : 16;
            if (tm1 - pt >= 2) {
                const int mr1 = mm - 16 * (pt + 1) < 16 ? mm - 16 * (pt + 1) : 16;
                amx_unit_post(p0, p1, x0, x0 + nb, nbc, Cp, o, ldo, mr0, mr1, first, 2, NG);
            } else {
                amx_unit_post(p0, p1, x0, x0, nbc, Cp, o, ldo, mr0, 0, first, 1, NG);
            }
        }
        if (t >= tm1) break;
        pt = t;
    }
}

/* Row tiles per m-block: as many as keep the m-block's activations (nb *
   576 bytes a tile) near 1 MB (L2), an even number, at least 2. */
static int amx_mblock(int nb) {
    int mt = (int)((1u << 20) / ((unsigned)nb * sizeof(cpu_act32_tile)));
    return mt < 2 ? 2 : mt & ~1;
}

/* Loop order: m-blocks of row tiles (activations kept in L2); in each,
   pairs of groups; for each pair, chunks of AMX_CHUNK blocks, whose panels
   are made once and swept by every pair of row tiles of the m-block (a
   unit of 2 x 2 output tiles; a last odd tile or group makes a narrower
   unit). Between chunks the accumulators rest in out (f32 stored and
   reloaded exactly); the out rows of a pair of groups stay in cache. */
ALWAYS_INLINE void amx_drive(const void *wp, int ngroups, const void *xt, int mm, int K, float *out, size_t ldo,
                             const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    const int nb = K / 32, ntiles = (mm + 15) / 16, mblk = amx_mblock(nb);
    const size_t gbytes = 16 * bb * (size_t)nb;
    const cpu_act32_tile *x = xt;
    _Alignas(64) amx_blk pan[2][AMX_CHUNK];
    _Alignas(64) int32_t C[2 * 4 * AMX_CHUNK * AMX_CST];
    amx_configure();
    for (int tm0 = 0; tm0 < ntiles; tm0 += mblk) {
        const int tm1 = ntiles - tm0 < mblk ? ntiles : tm0 + mblk;
        for (int g = 0; g < ngroups; g += 2) {
            const int ng = ngroups - g < 2 ? 1 : 2;
            for (int b0 = 0; b0 < nb; b0 += AMX_CHUNK) {
                const int nbc = nb - b0 < AMX_CHUNK ? nb - b0 : AMX_CHUNK;
                for (int j = 0; j < ng; j++) {
                    const unsigned char *wg =
                        (const unsigned char *)wp + (size_t)(g + j) * gbytes + (size_t)b0 * 16 * bb;
                    for (int b = 0; b < nbc; b++) amx_panel_blk(wg + (size_t)b * 16 * bb, &pan[j][b], T);
                }
                float *o = out + 16 * (size_t)g;
                if (ng == 2)
                    amx_chunk(pan[0], pan[1], x, nb, b0, nbc, tm0, tm1, mm, o, ldo, C, C + 4 * AMX_CHUNK * AMX_CST, 2);
                else
                    amx_chunk(pan[0], pan[0], x, nb, b0, nbc, tm0, tm1, mm, o, ldo, C, C + 4 * AMX_CHUNK * AMX_CST, 1);
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
