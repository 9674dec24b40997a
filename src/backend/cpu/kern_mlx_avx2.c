/*
 * kern_mlx_avx2.c - AVX2 MLX gemm, bit-identical to the canonical dot
 * product of kern_mlx.h. Built with -mavx2 -mfma -mf16c and only called
 * after runtime detection. kern_mlx_avx2vnni.c builds it again with
 * MLX_AVXVNNI (-mavxvnni): the lane partials are one vpdpbusd.
 *
 * Tiles of NW weight rows x MX activation rows: each 32-element sub-block
 * is unpacked once per weight row and used for the MX activation rows, and
 * the NW x MX accumulator chains are independent, so their latencies
 * overlap (decode uses 4 weight rows x 1, prefill 2 x 3); weight row i of a
 * tile at w + i w_row, its output at out[j ldo + i ldi]. Blocks go in
 * pairs: the even block's lane partials accumulate in one ymm (canonical
 * lanes 0-7), the odd block's in another (lanes 8-15). No state; a call
 * writes only its own outputs.
 */
#include "kern_mlx_x86.h"

#define NW_MAX 4
#define MX_MAX 3

MLX_AI void avx2_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t xa_row, int nb, int G,
                      float *out, size_t ldo, size_t ldi, const int BITS, const int NW, const int MX) {
    const int per_g = G / 32, sh = per_g == 1 ? 0 : per_g == 2 ? 1 : 2;
    const size_t bb = 8 + (size_t)G * BITS / 8, sbb = 4 * (size_t)BITS, ys = sizeof(cpu_act32);
    __m256 ev[NW_MAX][MX_MAX], od[NW_MAX][MX_MAX];
    float macc[NW_MAX][MX_MAX];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < MX; j++) {
            ev[i][j] = od[i][j] = _mm256_setzero_ps();
            macc[i][j] = 0.0f;
        }
    for (int b = 0; b < nb; b += 2) {
        const bool pair = b + 1 < nb;
        const size_t g0 = (size_t)(b >> sh) * bb, g1 = (size_t)((b + 1) >> sh) * bb;
        const size_t c0 = 8 + (size_t)(b & (per_g - 1)) * sbb, c1 = 8 + (size_t)((b + 1) & (per_g - 1)) * sbb;
        __m256i q0[NW_MAX], q1[NW_MAX];
        float s0[NW_MAX], m0[NW_MAX], s1[NW_MAX], m1[NW_MAX];
        for (int i = 0; i < NW; i++) {
            const unsigned char *wr = w + (size_t)i * w_row;
            s0[i] = mlx_f32(wr + g0);
            m0[i] = mlx_f32(wr + g0 + 4);
            q0[i] = mlx_unpack(wr + g0 + c0, BITS);
            if (pair) {
                s1[i] = mlx_f32(wr + g1);
                m1[i] = mlx_f32(wr + g1 + 4);
                q1[i] = mlx_unpack(wr + g1 + c1, BITS);
            } else { /* unused; set so no compiler sees them uninitialized */
                s1[i] = m1[i] = 0.0f;
                q1[i] = _mm256_setzero_si256();
            }
        }
        for (int j = 0; j < MX; j++) {
            const unsigned char *y0 = x + (size_t)j * xa_row + (size_t)b * ys, *y1 = y0 + ys;
            const __m256i yq0 = _mm256_loadu_si256((const __m256i *)(const void *)(y0 + MLX_YQ));
            const float yd0 = mlx_f32(y0), yds0 = mlx_f32(y0 + 4);
            for (int i = 0; i < NW; i++) {
                __m256i p = mlx_dot4(q0[i], yq0, BITS);
                ev[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(s0[i] * yd0), _mm256_cvtepi32_ps(p), ev[i][j]);
                macc[i][j] = __builtin_fmaf(m0[i], yds0, macc[i][j]);
            }
            if (!pair) continue;
            const __m256i yq1 = _mm256_loadu_si256((const __m256i *)(const void *)(y1 + MLX_YQ));
            const float yd1 = mlx_f32(y1), yds1 = mlx_f32(y1 + 4);
            for (int i = 0; i < NW; i++) {
                __m256i p = mlx_dot4(q1[i], yq1, BITS);
                od[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(s1[i] * yd1), _mm256_cvtepi32_ps(p), od[i][j]);
                macc[i][j] = __builtin_fmaf(m1[i], yds1, macc[i][j]);
            }
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < MX; j++) out[(size_t)j * ldo + (size_t)i * ldi] = mlx_hsum(ev[i][j], od[i][j]) + macc[i][j];
}

#define MLX_TILE avx2_tile
#ifdef MLX_AVXVNNI
#define MLX_GEMM_NAME cpu_mlx_gemm_avx2vnni
#else
#define MLX_GEMM_NAME cpu_mlx_gemm_avx2
#endif
#include "kern_mlx_gemm.h"
