/*
 * kern_bamx.h - AMX-BF16 matmuls for bf16 weights. Included by
 * kern_avx512.c when it is built as kern_amx.c (EMBER_AMX, with
 * -mamx-tile -mamx-bf16 -mavx512bf16), after kern_qamx.h. The AMX table
 * sets qgemm_packed[EMBER_BF16] to bamx_bf16 and quantize_actbf16 to
 * bamx_act: the backend then packs a bf16 weight whose K is a multiple of
 * 32 into qkern.h's BF16 layout (each 32-element chunk of 16 rows is one
 * 1 KiB B tile) and multiplies every number of activation rows, one row
 * or five hundred, through these tiles.
 *
 * Precision. TDPBF16PS multiplies bf16 by bf16. An activation x is split
 * into hi = bf16(x) and lo = bf16(x - hi) (both rounded to nearest even;
 * x - hi is exact in f32), so hi + lo keeps 16 of x's 24 significand bits
 * (|x - hi - lo| <= 2^-17 |x|), and every product w * x is taken as
 * w * hi + w * lo. The sums are f32 in the tile unit.
 *
 * Arithmetic order, the batch-invariance contract. Output (m, n) starts
 * at +0 and takes, for chunk c = 0, 1, ... K/32 - 1 in order, one
 * TDPBF16PS with row m of hi's chunk c, then one with row m of lo's
 * chunk c, each against column n of the weight's chunk c. The tile unit's
 * own rounding inside an instruction is not documented (it matches no
 * sequential f32 model: probed on a Sapphire Rapids class Xeon), so these
 * results are not those of the other ISAs' bf16 kernels; but an output
 * depends only on its activation row, its weight row and this fixed
 * sequence, never on the other rows of a tile, the tiling, the number of
 * rows or the thread that runs it, so a row's logits are the same alone
 * or batched. Between K blocks (BAMX_KC chunks) the sums rest in out as
 * f32 and are loaded back exactly.
 *
 * Tiles: 0-3 the f32 sums (2 row tiles x 2 column tiles of 16 x 16),
 * 4, 5 activations (hi, lo: 16 rows x 32 bf16), 6, 7 weights (16 pairs x
 * 16 columns). A call of fewer than 16 rows (decode) configures 0, 1, 4
 * and 5 with its own rows and takes weights into 2, 3 as well (bamx_few).
 * Each call loads its configuration and releases the tiles before it
 * returns. The activation buffer holds 16-row tiles: rows past
 * mm must be readable (the backend pads it to a whole tile plus one); their
 * sums are computed and dropped.
 */

#define BAMX_KC 32  /* chunks of 32 elements per K block: the sums go back to out between blocks */
#define BAMX_MB 128 /* activation rows per M block, swept by each pair of weight groups */
#define BAMX_PF 4   /* fewer than 16 rows: the weights are prefetched this many 1 KiB chunks ahead */

static void bamx_configure(void) { /* every tile 16 rows of 64 bytes */
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_load_cfg(rows, colsb);
}

/* Row x of K floats (K a multiple of 32) -> dst: K bf16 hi, then K bf16
   lo. */
static void CAT(KPREFIX, bamx_act)(const float *x, int K, void *dst) {
    uint16_t *hi = dst, *lo = hi + K;
    for (int k = 0; k < K; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        const __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
        _mm256_storeu_si256((__m256i *)(void *)(hi + k), h);
        _mm256_storeu_si256((__m256i *)(void *)(lo + k), l);
    }
}

/* The sums of a 16 x 16 output tile: in place (a whole tile of rows) or
   through buf (the last rows: only rows [0, mr) of out exist). */
#define BAMX_CLOAD(t, o, mr, buf)                                                                                  \
    do {                                                                                                           \
        if (first) {                                                                                               \
            _tile_zero(t);                                                                                         \
        } else if ((mr) == 16) {                                                                                   \
            _tile_loadd(t, o, (int)(ldo * 4));                                                                     \
        } else {                                                                                                   \
            for (int r_ = 0; r_ < (mr); r_++) memcpy((buf) + 16 * r_, (o) + (size_t)r_ * ldo, 64);              \
            _tile_loadd(t, buf, 64);                                                                               \
        }                                                                                                          \
    } while (0)
#define BAMX_CSTORE(t, o, mr, buf)                                                                                 \
    do {                                                                                                           \
        if ((mr) == 16) {                                                                                          \
            _tile_stored(t, o, (int)(ldo * 4));                                                                    \
        } else {                                                                                                   \
            _tile_stored(t, buf, 64);                                                                              \
            for (int r_ = 0; r_ < (mr); r_++) memcpy((o) + (size_t)r_ * ldo, (buf) + 16 * r_, 64);              \
        }                                                                                                          \
    } while (0)

/* Chunk c of the sums tiles 0 (group w0) and 1 (w1; cw of them, 1 or 2)
   against the activation rows at a (hi, then lo at lo_off; rows xa_row
   apart): the weights into tiles ta and tb, the activations into 4 and 5,
   then per sums tile the hi product, then the lo one. With pf, the groups'
   weights BAMX_PF chunks ahead are prefetched while they are below end. */
#define BAMX_CHUNK(c, ta, tb, pf, end)                                                                             \
    do {                                                                                                           \
        const size_t wo_ = (size_t)(c) * 1024, ao_ = (size_t)(c) * 64;                                             \
        if ((pf) && (c) + BAMX_PF < (end))                                                                         \
            for (int l_ = 0; l_ < 1024; l_ += 64) {                                                                \
                _mm_prefetch((const char *)w0 + wo_ + BAMX_PF * 1024 + l_, _MM_HINT_T0);                           \
                if (cw > 1) _mm_prefetch((const char *)w1 + wo_ + BAMX_PF * 1024 + l_, _MM_HINT_T0);               \
            }                                                                                                      \
        _tile_loadd(ta, w0 + wo_, 64);                                                                             \
        if (cw > 1) _tile_loadd(tb, w1 + wo_, 64);                                                                 \
        _tile_loadd(4, a + ao_, (int)xa_row);                                                                      \
        _tile_loadd(5, a + lo_off + ao_, (int)xa_row);                                                             \
        _tile_dpbf16ps(0, 4, ta);                                                                                  \
        if (cw > 1) _tile_dpbf16ps(1, 4, tb);                                                                      \
        _tile_dpbf16ps(0, 5, ta);                                                                                  \
        if (cw > 1) _tile_dpbf16ps(1, 5, tb);                                                                      \
    } while (0)

/* Chunks [c0, c1) of up to 2 x 2 output tiles: activation rows from a
   (16-row tiles at a and a + 16 rows; ra of them exist, 1 or 2; mr0, mr1
   real rows in each), weight groups w0 and w1 (cw of them, 1 or 2), sums
   in out (rows ldo apart). first: the sums start at zero. */
static void bamx_block(const unsigned char *a, size_t xa_row, size_t lo_off, int ra, int mr0, int mr1,
                       const unsigned char *w0, const unsigned char *w1, int cw, int c0, int c1, float *out,
                       size_t ldo, bool first) {
    _Alignas(64) float buf[4][256];
    float *o00 = out, *o01 = out + 16, *o10 = out + 16 * ldo, *o11 = out + 16 * ldo + 16;
    BAMX_CLOAD(0, o00, mr0, buf[0]);
    if (cw > 1) BAMX_CLOAD(1, o01, mr0, buf[1]);
    if (ra > 1) {
        BAMX_CLOAD(2, o10, mr1, buf[2]);
        if (cw > 1) BAMX_CLOAD(3, o11, mr1, buf[3]);
    }
    const unsigned char *a1 = a + 16 * xa_row;
    for (int c = c0; c < c1; c++) {
        BAMX_CHUNK(c, 6, 7, 0, c1);
        if (ra > 1) {
            const size_t ao = (size_t)c * 64;
            _tile_loadd(4, a1 + ao, (int)xa_row);
            _tile_loadd(5, a1 + lo_off + ao, (int)xa_row);
            _tile_dpbf16ps(2, 4, 6);
            if (cw > 1) _tile_dpbf16ps(3, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            if (cw > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    BAMX_CSTORE(0, o00, mr0, buf[0]);
    if (cw > 1) BAMX_CSTORE(1, o01, mr0, buf[1]);
    if (ra > 1) {
        BAMX_CSTORE(2, o10, mr1, buf[2]);
        if (cw > 1) BAMX_CSTORE(3, o11, mr1, buf[3]);
    }
}

/* Fewer than 16 rows (decode): the sums' (0, 1) and activations' (4, 5)
   tiles hold mr rows; tiles 2, 3 and 6, 7 all take weights. */
static void bamx_configure_few(int mr) {
    const uint8_t rows[8] = {(uint8_t)mr, (uint8_t)mr, 16, 16, (uint8_t)mr, (uint8_t)mr, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_load_cfg(rows, colsb);
}

/* All nc chunks of the mr (< 16) activation rows at a against weight
   groups w0 and w1 (cw of them, 1 or 2) into out (rows ldo apart), under
   bamx_configure_few(mr). The same sequence of instructions per output as
   bamx_block's (the whole K at once: bamx_block's K blocks only rest the
   sums in out, exactly), so the same bits (test_bamx: a row alone here
   against the same row in a batch of 16 or more). The weights of
   consecutive chunks alternate between tiles 6, 7 and 2, 3 (a tile load
   waits for the products still reading that tile) and are prefetched
   BAMX_PF chunks ahead. On a Sapphire Rapids class Xeon the two together
   took one-row bf16 decode from 0.6-0.75x the AVX-512 f32 kernel's speed to
   0.85-0.95x; the alternation alone, or the prefetch alone on the 16-row
   tiles, gained little (bench/RESULTS.md, "AMX-BF16 one-row decode"). */
static void bamx_few(const unsigned char *a, size_t xa_row, size_t lo_off, const unsigned char *w0,
                     const unsigned char *w1, int cw, int nc, float *out, size_t ldo) {
    _tile_zero(0);
    _tile_zero(1);
    int c = 0;
    for (; c + 2 <= nc; c += 2) {
        BAMX_CHUNK(c, 6, 7, 1, nc);
        BAMX_CHUNK(c + 1, 2, 3, 1, nc);
    }
    if (c < nc) BAMX_CHUNK(c, 6, 7, 1, nc);
    _tile_stored(0, out, (int)(ldo * 4));
    if (cw > 1) _tile_stored(1, out + 16, (int)(ldo * 4));
}

/* qgemm_packed for EMBER_BF16: out[m * ldo + 16 g + r] for g < ngroups,
   r < 16, m < mm; xa: mm rows of CPU_ACT_BF16X2 (xa_row = 4 K bytes) in a
   buffer with whole 16-row tiles. */
static void CAT(KPREFIX, bamx_bf16)(const void *wp, int ngroups, const void *xa, size_t xa_row, int mm, int K,
                                    float *out, size_t ldo) {
    const int nc = K / 32;
    const size_t gbytes = (size_t)K * 32, lo_off = (size_t)K * 2;
    const unsigned char *W = wp, *X = xa;
    if (mm <= 0) return; /* (a tile of 0 rows is not configured: using it would fault) */
    if (mm < 16) {
        bamx_configure_few(mm);
        for (int g = 0; g < ngroups; g += 2) {
            const int cw = ngroups - g > 1 ? 2 : 1;
            bamx_few(X, xa_row, lo_off, W + (size_t)g * gbytes, W + (size_t)(g + cw - 1) * gbytes, cw, nc,
                     out + 16 * (size_t)g, ldo);
        }
        _tile_release();
        return;
    }
    bamx_configure();
    for (int c0 = 0; c0 < nc; c0 += BAMX_KC) {
        const int c1 = nc - c0 < BAMX_KC ? nc : c0 + BAMX_KC;
        for (int m0 = 0; m0 < mm; m0 += BAMX_MB) {
            const int m1 = mm - m0 < BAMX_MB ? mm : m0 + BAMX_MB;
            for (int g = 0; g < ngroups; g += 2) {
                const int cw = ngroups - g > 1 ? 2 : 1;
                for (int m = m0; m < m1; m += 32) {
                    const int left = m1 - m, ra = left > 16 ? 2 : 1;
                    const int mr0 = left < 16 ? left : 16, mr1 = left - 16 < 16 ? left - 16 : 16;
                    bamx_block(X + (size_t)m * xa_row, xa_row, lo_off, ra, mr0, mr1, W + (size_t)g * gbytes,
                               W + (size_t)(g + cw - 1) * gbytes, cw, c0, c1, out + (size_t)m * ldo + 16 * (size_t)g,
                               ldo, c0 == 0);
                }
            }
        }
    }
    _tile_release();
}

#undef QP_EXTRA /* kern_qpack.h's empty default */
#define QP_EXTRA , [EMBER_BF16] = CAT(KPREFIX, bamx_bf16)
#define BAMX_TABLE .quantize_actbf16 = CAT(KPREFIX, bamx_act)
