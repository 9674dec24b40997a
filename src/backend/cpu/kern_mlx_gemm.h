/*
 * kern_mlx_gemm.h - the MLX gemm driver every x86 MLX kernel file shares:
 * tiles of 4 weight rows x 1 activation row for decode (rows nn / 4 apart:
 * each tile's rows are four long streams through the weights, not four
 * rows of a few hundred bytes that end every tile), 2 x MX for prefill
 * (MX up to MX_MAX), 1 x MX for the rows left, and one instance per bit
 * width. Included at the end of kern_mlx_avx2.c / kern_mlx_avx512.c after
 * they define
 *   MLX_TILE         their tile function (the signature of avx2_tile),
 *   MX_MAX           3 or 4, the most activation rows one tile takes,
 *   MLX_GEMM_NAME    the exported cpu_mlx_gemm_fn (kern_mlx.h).
 * The tiling only chooses which outputs share loads: every output is the
 * canonical dot product of kern_mlx.h. No state.
 */

#define MLX_T(NW, MX) MLX_TILE(wr, w_row, x, xa_row, nb, G, o + n, ldo, 1, BITS, NW, MX)

MLX_AI void mlx_gemm_bits(int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K,
                          float *out, size_t ldo, const int BITS) {
    const int nb = K / 32;
    for (int m0 = 0; m0 < mm; m0 += MX_MAX) {
        const int mx = mm - m0 < MX_MAX ? mm - m0 : MX_MAX;
        const unsigned char *x = (const unsigned char *)xa + (size_t)m0 * xa_row;
        float *o = out + (size_t)m0 * ldo;
        int n = 0;
        if (mx == 1) { /* decode: tile t takes rows t, t + S, t + 2 S, t + 3 S (S = nn / 4), four long streams */
            const int S = nn / 4;
            for (; n < S; n++)
                MLX_TILE((const unsigned char *)w + (size_t)n * w_row, (size_t)S * w_row, x, xa_row, nb, G, o + n, ldo,
                         (size_t)S, BITS, 4, 1);
            n = 4 * S;
        }
        for (; mx > 1 && n + 2 <= nn; n += 2) {
            const unsigned char *wr = (const unsigned char *)w + (size_t)n * w_row;
#if MX_MAX > 3
            if (mx == 4) MLX_T(2, 4);
            else
#endif
            if (mx == 3) MLX_T(2, 3);
            else MLX_T(2, 2);
        }
        for (; n < nn; n++) {
            const unsigned char *wr = (const unsigned char *)w + (size_t)n * w_row;
#if MX_MAX > 3
            if (mx == 4) MLX_T(1, 4);
            else
#endif
            if (mx == 3) MLX_T(1, 3);
            else if (mx == 2) MLX_T(1, 2);
            else MLX_T(1, 1);
        }
    }
}

void MLX_GEMM_NAME(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm,
                   int K, float *out, size_t ldo) {
    switch (bits) {
    case 2: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 2); break;
    case 3: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 3); break;
    case 4: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 4); break;
    case 5: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 5); break;
    case 6: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 6); break;
    default: mlx_gemm_bits(G, w, w_row, nn, xa, xa_row, mm, K, out, ldo, 8); break;
    }
}
