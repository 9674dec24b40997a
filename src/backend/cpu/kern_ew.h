/*
 * kern_ew.h - elementwise kernels written once for every ISA.
 *
 * Included by kern_scalar.c, kern_avx2.c and kern_avx512.c after kern_attn.h,
 * with its primitives and these:
 *   v_div(a, b)        a / b per lane (IEEE division)
 *
 * silu_mul: dst[i] = (a[i] / (1 + e^-a[i])) * b[i], swiglu's activation.
 * Every element goes through the same lane operations, the last partial
 * vector through a zero-padded copy, so an element's bits never depend on
 * where it lies in the range (batch invariance: a decode row's elements
 * sit at other offsets of a step's batch than of a prompt's). The scalar
 * tier's v_exp is expf, so it keeps the plain C loop's bits; the AVX2 and
 * AVX-512 tiers share their v_exp polynomial (the same bits as each other,
 * within a few ulp of expf; tests/test_kernels.c bounds the result by 5e-7
 * of |a b|). Their v_exp clamps its input to [-87, 88], so below a = -88
 * the result is a tiny negative number where expf's overflow gives -0, and
 * a NaN stays NaN. dst may be a or b. No allocation.
 *
 * add, norm_apply and rope_rotate: plain loops of one IEEE addition, two
 * multiplications (and 1 + w), or a rotation's two products and their
 * difference or sum (no fused multiply-add: the build turns contraction
 * off) per element, which the compiler vectorizes in this file's ISA (the
 * backend's own files are built at -O2, where these loops stayed scalar):
 * the same bits on every tier and at any offset.
 */
static void CAT(KPREFIX, silu_mul)(float *dst, const float *a, const float *b, int64_t n) {
    const vec16 one = v_set1(1.0f), neg = v_set1(-1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vec16 g = v_load_f32(a + i);
        vec16 s = v_div(g, v_fma(v_exp(v_mul(g, neg)), one, one)); /* e * 1 + 1: the sum, rounded once */
        v_store(dst + i, v_mul(s, v_load_f32(b + i)));
    }
    if (i < n) {
        float ta[16] = {0}, tb[16] = {0};
        const int r = (int)(n - i);
        for (int l = 0; l < r; l++) ta[l] = a[i + l], tb[l] = b[i + l];
        vec16 g = v_load_f32(ta);
        vec16 s = v_div(g, v_fma(v_exp(v_mul(g, neg)), one, one));
        v_store(ta, v_mul(s, v_load_f32(tb)));
        for (int l = 0; l < r; l++) dst[i + l] = ta[l];
    }
}

static void CAT(KPREFIX, add)(float *dst, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

static void CAT(KPREFIX, norm_apply)(float *y, const float *x, const float *w, float r, bool plus_one, int64_t n) {
    if (plus_one)
        for (int64_t i = 0; i < n; i++) y[i] = (1.0f + w[i]) * (x[i] * r);
    else
        for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

static void CAT(KPREFIX, rope_rotate)(float *x, int H, int D, int half, bool neox, const float *cs, const float *sn) {
    for (int h = 0; h < H; h++) {
        float *v = x + (size_t)h * (size_t)D;
        if (neox) {
            float *u = v + half;
            for (int i = 0; i < half; i++) {
                const float x0 = v[i], x1 = u[i];
                v[i] = x0 * cs[i] - x1 * sn[i];
                u[i] = x1 * cs[i] + x0 * sn[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                const float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * cs[i] - x1 * sn[i];
                v[2 * i + 1] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
}

/* The largest by lanes (v_max(x, m) keeps m where x is NaN, on every tier),
   then the first element equal to it, found a chunk of 256 at a time (-0 ==
   +0: the first zero of either sign, as a scan keeping the first strictly
   larger value finds; no element equals -inf's start when all are NaN). */
static int64_t CAT(KPREFIX, argmax_range)(const float *x, int64_t n) {
    vec16 m = v_set1(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = v_max(v_load_f32(x + i), m);
    float mx = v_hmax(m);
    for (; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int64_t c = 0; c < n; c += 256) {
        const int64_t e = c + 256 < n ? c + 256 : n;
        int any = 0;
        for (int64_t t = c; t < e; t++) any |= x[t] == mx;
        if (any)
            for (int64_t t = c; t < e; t++)
                if (x[t] == mx) return t;
    }
    return -1;
}
