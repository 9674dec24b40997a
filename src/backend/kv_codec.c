/*
 * kv_codec.c - the KV block codecs (see kv_codec.h and backend.h).
 *
 * The TQ codebooks are the Lloyd-Max quantizers of N(0, 1): centroids that
 * are the conditional means of their cells, thresholds at the midpoints.
 * Computed once by iterating those two conditions in double precision until
 * no centroid moved by 1e-13 (8 bits: 1e-10), printed to 10 significant
 * digits; tests/test_kv_codec.c checks both conditions against these values.
 * Only the positive half is stored; the codebooks are symmetric.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "core/dtype.h"
#include "kv_codec.h"

static const float k_half2[2] = {
    4.527800346e-01f, 1.510417608e+00f};

static const float k_half3[4] = {
    2.450941789e-01f, 7.560052812e-01f, 1.343909279e+00f, 2.151945705e+00f};

static const float k_half4[8] = {
    1.283950299e-01f, 3.880482995e-01f, 6.567591185e-01f, 9.423404565e-01f, 1.256231197e+00f,
    1.618046386e+00f, 2.069017227e+00f, 2.732589571e+00f};

static const float k_half5[16] = {
    6.588965977e-02f, 1.980518297e-01f, 3.313783058e-01f, 4.666995230e-01f, 6.049336240e-01f,
    7.471357037e-01f, 8.945651174e-01f, 1.048783320e+00f, 1.211804381e+00f, 1.386340340e+00f,
    1.576228079e+00f, 1.787233218e+00f, 2.028728399e+00f, 2.317739404e+00f, 2.691119577e+00f, 3.260732493e+00f};

static const float k_half6[32] = {
    3.340950637e-02f, 1.002782893e-01f, 1.672969034e-01f, 2.345669853e-01f, 3.021928464e-01f,
    3.702826453e-01f, 4.389496717e-01f, 5.083137809e-01f, 5.785030305e-01f, 6.496555811e-01f,
    7.219219406e-01f, 7.954676559e-01f, 8.704765866e-01f, 9.471549448e-01f, 1.025736349e+00f,
    1.106488240e+00f, 1.189720142e+00f, 1.275794486e+00f, 1.365141020e+00f, 1.458276375e+00f,
    1.555831225e+00f, 1.658588900e+00f, 1.767541883e+00f, 1.883977241e+00f, 2.009611043e+00f,
    2.146810217e+00f, 2.298981210e+00f, 2.471304798e+00f, 2.672273835e+00f, 2.917406791e+00f,
    3.240437055e+00f, 3.744101271e+00f};

static const float k_half7[64] = {
    1.682816946e-02f, 5.049086396e-02f, 8.417264206e-02f, 1.178862823e-01f, 1.516446479e-01f,
    1.854607214e-01f, 2.193476402e-01f, 2.533187332e-01f, 2.873875584e-01f, 3.215679432e-01f,
    3.558740251e-01f, 3.903202964e-01f, 4.249216498e-01f, 4.596934288e-01f, 4.946514803e-01f,
    5.298122120e-01f, 5.651926541e-01f, 6.008105263e-01f, 6.366843110e-01f, 6.728333330e-01f,
    7.092778475e-01f, 7.460391366e-01f, 7.831396163e-01f, 8.206029554e-01f, 8.584542071e-01f,
    8.967199573e-01f, 9.354284901e-01f, 9.746099739e-01f, 1.014296673e+00f, 1.054523185e+00f,
    1.095326716e+00f, 1.136747386e+00f, 1.178828593e+00f, 1.221617419e+00f, 1.265165107e+00f,
    1.309527620e+00f, 1.354766285e+00f, 1.400948559e+00f, 1.448148931e+00f, 1.496449998e+00f,
    1.545943749e+00f, 1.596733126e+00f, 1.648933906e+00f, 1.702677023e+00f, 1.758111438e+00f,
    1.815407713e+00f, 1.874762548e+00f, 1.936404559e+00f, 2.000601772e+00f, 2.067671476e+00f,
    2.137993378e+00f, 2.212027518e+00f, 2.290339162e+00f, 2.373634270e+00f, 2.462811433e+00f,
    2.559040522e+00f, 2.663886539e+00f, 2.779514258e+00f, 2.909047074e+00f, 3.057246151e+00f,
    3.231933204e+00f, 3.447430271e+00f, 3.734936644e+00f, 4.189694157e+00f};

static const float k_half8[128] = {
    8.446193223e-03f, 2.533938310e-02f, 4.223498380e-02f, 5.913460434e-02f, 7.603985639e-02f,
    9.295235540e-02f, 1.098737217e-01f, 1.268055814e-01f, 1.437495678e-01f, 1.607073224e-01f,
    1.776804958e-01f, 1.946707493e-01f, 2.116797555e-01f, 2.287091999e-01f, 2.457607821e-01f,
    2.628362168e-01f, 2.799372353e-01f, 2.970655865e-01f, 3.142230386e-01f, 3.314113801e-01f,
    3.486324215e-01f, 3.658879965e-01f, 3.831799637e-01f, 4.005102078e-01f, 4.178806415e-01f,
    4.352932072e-01f, 4.527498783e-01f, 4.702526612e-01f, 4.878035973e-01f, 5.054047644e-01f,
    5.230582793e-01f, 5.407662992e-01f, 5.585310246e-01f, 5.763547006e-01f, 5.942396202e-01f,
    6.121881261e-01f, 6.302026133e-01f, 6.482855322e-01f, 6.664393910e-01f, 6.846667587e-01f,
    7.029702684e-01f, 7.213526204e-01f, 7.398165857e-01f, 7.583650094e-01f, 7.770008149e-01f,
    7.957270074e-01f, 8.145466788e-01f, 8.334630114e-01f, 8.524792833e-01f, 8.715988732e-01f,
    8.908252655e-01f, 9.101620563e-01f, 9.296129591e-01f, 9.491818112e-01f, 9.688725810e-01f,
    9.886893743e-01f, 1.008636443e+00f, 1.028718192e+00f, 1.048939189e+00f, 1.069304174e+00f,
    1.089818070e+00f, 1.110485990e+00f, 1.131313252e+00f, 1.152305393e+00f, 1.173468176e+00f,
    1.194807612e+00f, 1.216329968e+00f, 1.238041790e+00f, 1.259949915e+00f, 1.282061497e+00f,
    1.304384022e+00f, 1.326925335e+00f, 1.349693660e+00f, 1.372697633e+00f, 1.395946328e+00f,
    1.419449287e+00f, 1.443216559e+00f, 1.467258735e+00f, 1.491586992e+00f, 1.516213138e+00f,
    1.541149662e+00f, 1.566409792e+00f, 1.592007553e+00f, 1.617957841e+00f, 1.644276490e+00f,
    1.670980366e+00f, 1.698087453e+00f, 1.725616962e+00f, 1.753589448e+00f, 1.782026939e+00f,
    1.810953088e+00f, 1.840393341e+00f, 1.870375122e+00f, 1.900928058e+00f, 1.932084218e+00f,
    1.963878399e+00f, 1.996348455e+00f, 2.029535665e+00f, 2.063485177e+00f, 2.098246509e+00f,
    2.133874148e+00f, 2.170428249e+00f, 2.207975464e+00f, 2.246589930e+00f, 2.286354451e+00f,
    2.327361935e+00f, 2.369717125e+00f, 2.413538744e+00f, 2.458962134e+00f, 2.506142560e+00f,
    2.555259397e+00f, 2.606521466e+00f, 2.660173966e+00f, 2.716507579e+00f, 2.775870653e+00f,
    2.838685787e+00f, 2.905472904e+00f, 2.976882134e+00f, 3.053742016e+00f, 3.137132532e+00f,
    3.228500211e+00f, 3.329848470e+00f, 3.444071678e+00f, 3.575587972e+00f, 3.731666262e+00f,
    3.925637784e+00f, 4.186595443e+00f, 4.603535612e+00f};

static const float *const k_half[9] = {NULL, NULL, k_half2, k_half3, k_half4, k_half5, k_half6, k_half7, k_half8};

/* Full codebooks and thresholds, built from the halves once. */
static float g_cb[9][256], g_bd[9][255];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void tables_fill(void) {
    for (int b = 2; b <= 8; b++) {
        int n = 1 << b, h = n / 2;
        for (int i = 0; i < h; i++) {
            g_cb[b][h + i] = k_half[b][i];
            g_cb[b][h - 1 - i] = -k_half[b][i];
        }
        for (int i = 0; i + 1 < n; i++) g_bd[b][i] = 0.5f * (g_cb[b][i] + g_cb[b][i + 1]);
    }
}

const float *ember_tq_codebook(int bits) {
    if (bits < 2 || bits > 8) return NULL;
    pthread_once(&g_once, tables_fill);
    return g_cb[bits];
}

const float *ember_tq_bounds(int bits) {
    if (bits < 2 || bits > 8) return NULL;
    pthread_once(&g_once, tables_fill);
    return g_bd[bits];
}

/* ---- the TQ rotation ---------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ember_tq_signs(uint64_t seed, int D, float *signs) {
    uint64_t s = seed ^ ((uint64_t)(uint32_t)D << 32);
    uint64_t bits = 0;
    for (int i = 0; i < D; i++) {
        if (i % 64 == 0) bits = splitmix64(&s);
        signs[i] = (bits >> (i % 64)) & 1 ? -1.0f : 1.0f;
    }
}

/* In-place unnormalized Walsh-Hadamard transform of v[n], n a power of two. */
static void fwht(float *v, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* The largest power of two <= n (n >= 1). */
static int pow2_floor(int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

void ember_tq_rotate(const float *signs, int D, const float *x, float *y) {
    for (int off = 0; off < D;) {
        int n = pow2_floor(D - off);
        float sc = 1.0f / sqrtf((float)n);
        for (int i = 0; i < n; i++) y[off + i] = x[off + i] * signs[off + i];
        fwht(y + off, n);
        for (int i = 0; i < n; i++) y[off + i] *= sc;
        off += n;
    }
}

void ember_tq_unrotate(const float *signs, int D, const float *y, float *x) {
    for (int off = 0; off < D;) {
        int n = pow2_floor(D - off);
        float sc = 1.0f / sqrtf((float)n);
        if (x != y) memcpy(x + off, y + off, (size_t)n * sizeof *x);
        fwht(x + off, n);
        for (int i = 0; i < n; i++) x[off + i] = x[off + i] * sc * signs[off + i];
        off += n;
    }
}

/* ---- sizes --------------------------------------------------------------------- */

size_t ember_kv_head_bytes(const ember_kv_codec *c, int D, bool is_k) {
    const size_t S = EMBER_KV_BLOCK, d = (size_t)D;
    if (D < 1) return 0;
    switch (c->enc) {
    case EMBER_KVE_F32: return S * d * 4;
    case EMBER_KVE_F16:
    case EMBER_KVE_BF16: return S * d * 2;
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4:
        if (c->group < 1 || D % c->group || (c->enc == EMBER_KVE_Q4 && D % 2)) return 0;
        if (D > EMBER_KV_NORM_MAX_D) return 0;
        return S * (c->enc == EMBER_KVE_Q8 ? d : d / 2) + S * 4 * (d / (size_t)c->group) + (is_k ? 4 * d : 0);
    case EMBER_KVE_TQ:
        if (c->bits < 2 || c->bits > 8) return 0;
        if (D > EMBER_KV_NORM_MAX_D) return 0;
        return (is_k ? d * 2 * (size_t)c->bits + 4 * d : S * ((d * (size_t)c->bits + 7) / 8)) + S * 2;
    }
    return 0;
}

/* ---- bit fields (TQ codes, LSB first) -------------------------------------------- */

static unsigned get_bits(const unsigned char *p, size_t bit, int b) {
    size_t i = bit / 8;
    unsigned sh = (unsigned)(bit % 8), v = p[i];
    if (sh + (unsigned)b > 8) v |= (unsigned)p[i + 1] << 8;
    return (v >> sh) & ((1u << b) - 1);
}

static void put_bits(unsigned char *p, size_t bit, int b, unsigned code) {
    size_t i = bit / 8;
    unsigned sh = (unsigned)(bit % 8), m = (1u << b) - 1;
    p[i] = (unsigned char)((p[i] & ~(m << sh)) | (code << sh));
    if (sh + (unsigned)b > 8) {
        unsigned sh2 = 8 - sh;
        p[i + 1] = (unsigned char)((p[i + 1] & ~(m >> sh2)) | (code >> sh2));
    }
}

static uint16_t ld16(const unsigned char *p, size_t idx) {
    uint16_t h;
    memcpy(&h, p + 2 * idx, 2);
    return h;
}
static void st16(unsigned char *p, size_t idx, uint16_t h) {
    memcpy(p + 2 * idx, &h, 2);
}

/* ---- affine (Q8, Q4) ------------------------------------------------------------ */

/* Scale and bias of one group, as stored (f16): every x in [mn, mx] maps to
   a code in 0..qmax with |x - (scale * code + bias)| <= scale / 2 plus the
   rounding of bias to f16. */
static void affine_params(float mn, float mx, int qmax, uint16_t *hs, uint16_t *hb) {
    *hb = ember_f32_to_f16(mn);
    float b = ember_f16_to_f32(*hb);
    float range = mx - b;
    if (!(range > 0)) {
        *hs = 0;
        return;
    }
    *hs = ember_f32_to_f16(range / (float)qmax);
    /* round the scale up so the largest value still gets a code <= qmax */
    while (ember_f16_to_f32(*hs) * (float)qmax < range && (*hs & 0x7fffu) < 0x7c00u) (*hs)++;
}

static unsigned affine_code(float x, float scale, float bias, int qmax) {
    if (!(scale > 0)) return 0;
    float q = rintf((x - bias) / scale);
    if (!(q >= 0)) return 0; /* also NaN */
    return q > (float)qmax ? (unsigned)qmax : (unsigned)q;
}

/* Offsets of an affine piece: codes, scales, biases, then (K) the block's
   channel means and spreads. */
static size_t aff_codes(int D, bool q8) {
    return (size_t)EMBER_KV_BLOCK * (size_t)(q8 ? D : D / 2);
}
static size_t aff_norm(int D, int G, bool q8) {
    return aff_codes(D, q8) + (size_t)EMBER_KV_BLOCK * (size_t)(D / G) * 4;
}

static size_t tq_codes_bytes(int D, bool is_k, int b);

size_t ember_kv_norm_offset(const ember_kv_codec *c, int D) {
    switch (c->enc) {
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4: return aff_norm(D, c->group, c->enc == EMBER_KVE_Q8);
    case EMBER_KVE_TQ: return tq_codes_bytes(D, true, c->bits) + (size_t)EMBER_KV_BLOCK * 2;
    default: return 0;
    }
}

/* Weight of the newest block in the running channel statistics. */
#define NORM_ALPHA 0.5

/*
 * The channel normalization of a K block, set when its first slot is
 * written: a running mean and spread of each dimension, the previous
 * block's statistics mixed with those of the previous block's 16 keys
 * (prev, decoded with prev_c). A first block has none (mu 0, sigma stored
 * as 0: no scaling), unless its own keys are given as prev (a row converted
 * from f32 once its first block is complete). Stored f16.
 */
static void norm_set(const ember_kv_codec *c, int D, const unsigned char *prev, const ember_kv_codec *prev_c,
                     unsigned char *p) {
    unsigned char *mu = p + ember_kv_norm_offset(c, D), *sg = mu + 2 * (size_t)D;
    if (!prev) {
        for (int d = 0; d < D; d++) {
            st16(mu, (size_t)d, ember_f32_to_f16(0.0f));
            st16(sg, (size_t)d, 0);
        }
        return;
    }
    if (!prev_c) prev_c = c;
    /* the previous block's own running statistics, if it has any */
    size_t pno = ember_kv_norm_offset(prev_c, D);
    const unsigned char *pmu = pno ? prev + pno : NULL, *psg = pmu ? pmu + 2 * (size_t)D : NULL;
    bool have = psg && ld16(psg, 0) != 0;
    float x[EMBER_KV_BLOCK][EMBER_KV_NORM_MAX_D];
    for (int i = 0; i < EMBER_KV_BLOCK; i++) ember_kv_decode(prev_c, D, true, prev, i, x[i]);
    double sd[EMBER_KV_NORM_MAX_D], m[EMBER_KV_NORM_MAX_D], top = 0;
    for (int d = 0; d < D; d++) {
        double a = 0, q = 0;
        for (int i = 0; i < EMBER_KV_BLOCK; i++) a += x[i][d];
        a /= EMBER_KV_BLOCK;
        for (int i = 0; i < EMBER_KV_BLOCK; i++) q += (x[i][d] - a) * (x[i][d] - a);
        double var = q / EMBER_KV_BLOCK;
        if (have) {
            double pm = ember_f16_to_f32(ld16(pmu, (size_t)d)), ps = ember_f16_to_f32(ld16(psg, (size_t)d));
            double nm = (1 - NORM_ALPHA) * pm + NORM_ALPHA * a;
            var = (1 - NORM_ALPHA) * ps * ps + NORM_ALPHA * var + NORM_ALPHA * (1 - NORM_ALPHA) * (a - pm) * (a - pm);
            a = nm;
        }
        m[d] = a;
        sd[d] = sqrt(var);
        top = sd[d] > top ? sd[d] : top;
    }
    for (int d = 0; d < D; d++) {
        double v = sd[d] > 1e-3 * top ? sd[d] : 1e-3 * top;
        if (!(v > 1e-4) || !(v < 60000)) v = 1; /* constant, tiny or broken keys: no scaling */
        float mf = (float)m[d];
        if (!(fabsf(mf) < 60000)) mf = 0;
        st16(mu, (size_t)d, ember_f32_to_f16(mf));
        st16(sg, (size_t)d, ember_f32_to_f16((float)v));
    }
}

/* sigma as stored, 0 meaning 1 (no statistics). */
static float norm_sigma(const unsigned char *sg, int d) {
    uint16_t h = ld16(sg, (size_t)d);
    return h ? ember_f16_to_f32(h) : 1.0f;
}

/* xn = (x - mu) / sigma with the block's normalization, set first when slot
   0 is written. */
static void norm_in(const ember_kv_codec *c, int D, unsigned char *p, int slot, const unsigned char *prev,
                    const ember_kv_codec *prev_c, const float *x, float *xn) {
    if (slot == 0) norm_set(c, D, prev, prev_c, p);
    const unsigned char *mu = p + ember_kv_norm_offset(c, D), *sg = mu + 2 * (size_t)D;
    for (int d = 0; d < D; d++) xn[d] = (x[d] - ember_f16_to_f32(ld16(mu, (size_t)d))) / norm_sigma(sg, d);
}

/* x = sigma * x + mu, in place. */
static void norm_out(const ember_kv_codec *c, int D, const unsigned char *p, float *x) {
    const unsigned char *mu = p + ember_kv_norm_offset(c, D), *sg = mu + 2 * (size_t)D;
    for (int d = 0; d < D; d++) x[d] = x[d] * norm_sigma(sg, d) + ember_f16_to_f32(ld16(mu, (size_t)d));
}

static void encode_affine(const ember_kv_codec *c, int D, bool is_k, const float *xin, unsigned char *p, int slot,
                          const unsigned char *prev, const ember_kv_codec *prev_c) {
    const int S = EMBER_KV_BLOCK, G = c->group, ng = D / G;
    const bool q8 = c->enc == EMBER_KVE_Q8;
    const int qmax = q8 ? 255 : 15;
    const size_t codes = aff_codes(D, q8);
    unsigned char *sc = p + codes, *bi = sc + (size_t)S * (size_t)ng * 2;
    float xn[EMBER_KV_NORM_MAX_D];
    const float *x = xin;
    if (is_k) { /* K: per-channel normalization by the block's statistics */
        norm_in(c, D, p, slot, prev, prev_c, xin, xn);
        x = xn;
    }
    for (int g = 0; g < ng; g++) {
        float mn = x[g * G], mx = mn;
        for (int d = g * G; d < (g + 1) * G; d++) {
            mn = x[d] < mn ? x[d] : mn;
            mx = x[d] > mx ? x[d] : mx;
        }
        uint16_t hs, hb;
        affine_params(mn, mx, qmax, &hs, &hb);
        size_t si = (size_t)g * S + (size_t)slot; /* [group][16] for K and V */
        st16(sc, si, hs);
        st16(bi, si, hb);
        float scale = ember_f16_to_f32(hs), bias = ember_f16_to_f32(hb);
        for (int d = g * G; d < (g + 1) * G; d++) {
            unsigned q = affine_code(x[d], scale, bias, qmax);
            if (q8) {
                p[is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d] = (unsigned char)q;
            } else {
                size_t bi4 = is_k ? (size_t)(d / 2) * S + (size_t)slot : (size_t)slot * (size_t)(D / 2) + (size_t)(d / 2);
                unsigned sh = (unsigned)(d % 2) * 4;
                p[bi4] = (unsigned char)((p[bi4] & ~(0xfu << sh)) | (q << sh));
            }
        }
    }
}

static void decode_affine(const ember_kv_codec *c, int D, bool is_k, const unsigned char *p, int slot, float *x) {
    const int S = EMBER_KV_BLOCK, G = c->group, ng = D / G;
    const bool q8 = c->enc == EMBER_KVE_Q8;
    const size_t codes = aff_codes(D, q8);
    const unsigned char *sc = p + codes, *bi = sc + (size_t)S * (size_t)ng * 2;
    for (int g = 0; g < ng; g++) {
        size_t si = (size_t)g * S + (size_t)slot; /* [group][16] for K and V */
        float scale = ember_f16_to_f32(ld16(sc, si)), bias = ember_f16_to_f32(ld16(bi, si));
        for (int d = g * G; d < (g + 1) * G; d++) {
            unsigned q;
            if (q8) {
                q = p[is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d];
            } else {
                size_t bi4 = is_k ? (size_t)(d / 2) * S + (size_t)slot : (size_t)slot * (size_t)(D / 2) + (size_t)(d / 2);
                q = (p[bi4] >> ((unsigned)(d % 2) * 4)) & 0xfu;
            }
            x[d] = scale * (float)q + bias;
        }
    }
    if (is_k) norm_out(c, D, p, x);
}

/* ---- TQ ------------------------------------------------------------------------ */

#define TQ_MAX_D EMBER_KV_NORM_MAX_D

/* The code of u: the number of thresholds below it (binary search). */
static unsigned tq_code(const float *bounds, int n, float u) {
    unsigned lo = 0, hi = (unsigned)n - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (u > bounds[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static size_t tq_bit(int D, bool is_k, int b, int slot, int d) {
    return is_k ? (size_t)d * 16 * (size_t)b + (size_t)slot * (size_t)b
                : (size_t)slot * (((size_t)D * (size_t)b + 7) / 8) * 8 + (size_t)d * (size_t)b;
}

static size_t tq_codes_bytes(int D, bool is_k, int b) {
    return is_k ? (size_t)D * 2 * (size_t)b : (size_t)EMBER_KV_BLOCK * (((size_t)D * (size_t)b + 7) / 8);
}

static void encode_tq(const ember_kv_codec *c, int D, bool is_k, const float *xin, unsigned char *p, int slot,
                      const unsigned char *prev, const ember_kv_codec *prev_c) {
    const int b = c->bits, n = 1 << b;
    float y[TQ_MAX_D], xn[TQ_MAX_D];
    const float *x = xin;
    if (is_k) {
        norm_in(c, D, p, slot, prev, prev_c, xin, xn);
        x = xn;
    }
    ember_tq_rotate(c->signs, D, x, y);
    double nn = 0;
    for (int d = 0; d < D; d++) nn += (double)y[d] * y[d];
    float u_scale = nn > 0 ? (float)(sqrt((double)D / nn)) : 0.0f;
    double yc = 0, cc = 0;
    for (int d = 0; d < D; d++) {
        unsigned q = tq_code(c->bounds, n, y[d] * u_scale);
        put_bits(p, tq_bit(D, is_k, b, slot, d), b, q);
        float cv = c->codebook[q];
        yc += (double)y[d] * cv;
        cc += (double)cv * cv;
    }
    float scale = cc > 0 ? (float)(yc / cc) : 0.0f;
    st16(p + tq_codes_bytes(D, is_k, b), (size_t)slot, ember_f32_to_f16(scale));
}

static void decode_tq(const ember_kv_codec *c, int D, bool is_k, const unsigned char *p, int slot, float *x) {
    const int b = c->bits;
    float scale = ember_f16_to_f32(ld16(p + tq_codes_bytes(D, is_k, b), (size_t)slot));
    for (int d = 0; d < D; d++) x[d] = scale * c->codebook[get_bits(p, tq_bit(D, is_k, b, slot, d), b)];
    ember_tq_unrotate(c->signs, D, x, x);
    if (is_k) norm_out(c, D, p, x);
}

/* ---- dispatch ------------------------------------------------------------------- */

void ember_kv_encode(const ember_kv_codec *c, int D, bool is_k, const float *x, unsigned char *p, int slot,
                     const unsigned char *prev, const ember_kv_codec *prev_c) {
    const size_t S = EMBER_KV_BLOCK;
    switch (c->enc) {
    case EMBER_KVE_F32:
        for (int d = 0; d < D; d++) memcpy(p + 4 * (is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d), &x[d], 4);
        break;
    case EMBER_KVE_F16:
    case EMBER_KVE_BF16:
        for (int d = 0; d < D; d++) {
            uint16_t h = c->enc == EMBER_KVE_F16 ? ember_f32_to_f16(x[d]) : ember_f32_to_bf16(x[d]);
            st16(p, is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d, h);
        }
        break;
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4: encode_affine(c, D, is_k, x, p, slot, prev, prev_c); break;
    case EMBER_KVE_TQ: encode_tq(c, D, is_k, x, p, slot, prev, prev_c); break;
    }
}

void ember_kv_decode(const ember_kv_codec *c, int D, bool is_k, const unsigned char *p, int slot, float *x) {
    const size_t S = EMBER_KV_BLOCK;
    switch (c->enc) {
    case EMBER_KVE_F32:
        for (int d = 0; d < D; d++) memcpy(&x[d], p + 4 * (is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d), 4);
        break;
    case EMBER_KVE_F16:
    case EMBER_KVE_BF16:
        for (int d = 0; d < D; d++) {
            uint16_t h = ld16(p, is_k ? (size_t)d * S + (size_t)slot : (size_t)slot * (size_t)D + (size_t)d);
            x[d] = c->enc == EMBER_KVE_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
        }
        break;
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4: decode_affine(c, D, is_k, p, slot, x); break;
    case EMBER_KVE_TQ: decode_tq(c, D, is_k, p, slot, x); break;
    }
}

/* ---- map checks ---------------------------------------------------------------- */

/* Checks a map against the k/v-shaped tensor x ([T, H, D] f32, or NULL) and
   that every token's position lies in its row's blocks and pools. */
int ember_kv_map_check(const ember_kv_map *map, int T, int H, int D, const char *op, ember_error *err) {
    if (!map || !map->views || map->n_views < 1 || !map->refs || map->n_refs < 1 || !map->row || !map->pos)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: incomplete KV map", op);
    for (int i = 0; i < map->n_views; i++) {
        const ember_kv_layer *L = &map->views[i];
        size_t kh = ember_kv_head_bytes(&L->k, L->head_dim, true), vh = ember_kv_head_bytes(&L->v, L->head_dim, false);
        if (!L->pool || !L->pool->buf || L->n_heads != H || L->head_dim != D || !kh || !vh || kh != L->k.head_bytes ||
            vh != L->v.head_bytes || L->block_bytes == 0 || L->k_off + (size_t)H * kh > L->block_bytes ||
            L->v_off + (size_t)H * vh > L->block_bytes || L->pool->nbytes % L->block_bytes)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: KV layer view %d does not match [%d heads, %d dims]", op,
                             i, H, D);
        if (((L->k.enc == EMBER_KVE_TQ) && (!L->k.codebook || !L->k.bounds || !L->k.signs)) ||
            ((L->v.enc == EMBER_KVE_TQ) && (!L->v.codebook || !L->v.bounds || !L->v.signs)) || D > 1024)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: incomplete TQ codec", op);
    }
    for (int t = 0; t < T; t++) {
        int r = map->row[t], p = map->pos[t];
        if (r < 0 || r >= map->n_refs || p < 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: token %d: row %d / position %d invalid", op, t, r, p);
        const ember_kv_rowref *ref = &map->refs[r];
        if (ref->layer_set < 0 || ref->layer_set >= map->n_views || !ref->blocks || ref->first < 0 ||
            ref->n_blocks < 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: row %d has no block table", op, r);
    }
    return EMBER_OK;
}

/* Checks that row r's blocks for positions [lo, hi] exist in its pool. */
int ember_kv_map_check_blocks(const ember_kv_map *map, int r, int lo, int hi, const char *op, ember_error *err) {
    const ember_kv_rowref *ref = &map->refs[r];
    const ember_kv_layer *L = &map->views[ref->layer_set];
    size_t nb = L->pool->nbytes / L->block_bytes;
    if (lo / EMBER_KV_BLOCK < ref->first || hi / EMBER_KV_BLOCK - ref->first >= ref->n_blocks)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: row %d does not hold positions %d..%d", op, r, lo, hi);
    for (int b = lo / EMBER_KV_BLOCK; b <= hi / EMBER_KV_BLOCK; b++) {
        int32_t id = ref->blocks[b - ref->first];
        if (id < 0 || (size_t)id >= nb)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: row %d has no valid block for position %d", op, r,
                             b * EMBER_KV_BLOCK);
    }
    return EMBER_OK;
}

int ember_kv_rw_check(const ember_kv_map *map, const ember_tensor *k, const ember_tensor *v, const char *op, int *T,
                      int *H, int *D, ember_error *err) {
    if (k->ndim != 3 || v->ndim != 3 || v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] ||
        v->shape[2] != k->shape[2] || k->shape[0] > INT32_MAX)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: k and v must both be [T, H, D]", op);
    *T = (int)k->shape[0];
    *H = (int)k->shape[1];
    *D = (int)k->shape[2];
    int rc = ember_kv_map_check(map, *T, *H, *D, op, err);
    for (int t = 0; t < *T && !rc; t++) rc = ember_kv_map_check_blocks(map, map->row[t], map->pos[t], map->pos[t], op, err);
    return rc;
}
