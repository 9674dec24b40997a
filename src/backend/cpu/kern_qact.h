/*
 * kern_qact.h - the activation quantizers of qkern.h (cpu_act32 for the
 * 32-element types, cpu_act256 for the K types), written once for every
 * ISA. Included by kern_quant.c (plain C: the scalar path and the
 * reference), kern_qavx2.h and kern_qavx512.h after they define
 *   qa_absmax(x, n)     max |x| over n floats (NaN skipped, as fmaxf),
 *   qa_16(x, id, q)     the levels round(x * id) of 16 floats, clamped to
 *                       [-127, 127] (NaN -> -127), stored as bytes at q;
 *                       returns their sum,
 * and KPREFIX. The SIMD primitives must give the bytes of the plain-C ones
 * (tests check every ISA against cpu_quantize_act32 / _act256). No state.
 */

static void CAT(KPREFIX, quant_act32)(const float *x, int K, void *dst) {
    unsigned char *p = dst;
    for (int i = 0; i < K / 32; i++, x += 32, p += sizeof(cpu_act32)) {
        cpu_act32 b;
        memset(&b, 0, sizeof b);
        float a = qa_absmax(x, 32);
        float d = a / 127.0f, id = a > 0 ? 127.0f / a : 0.0f;
        int s = qa_16(x, id, b.q) + qa_16(x + 16, id, b.q + 16);
        b.d = d;
        b.ds = d * (float)s;
        b.s = s;
        memcpy(p, &b, sizeof b);
    }
}

static void CAT(KPREFIX, quant_act256)(const float *x, int K, void *dst) {
    unsigned char *p = dst;
    for (int i = 0; i < K / 256; i++, x += 256, p += sizeof(cpu_act256)) {
        cpu_act256 b;
        memset(&b, 0, sizeof b);
        float a = qa_absmax(x, 256);
        float id = a > 0 ? 127.0f / a : 0.0f;
        b.d = a / 127.0f;
        for (int j = 0; j < 16; j++) {
            int s = qa_16(x + 16 * j, id, b.q + 16 * j);
            b.bsums[j] = (int16_t)s;
            b.bs16[j] = s;
        }
        for (int j = 0; j < 8; j++) b.bs32[j] = b.bs16[2 * j] + b.bs16[2 * j + 1];
        memcpy(p, &b, sizeof b);
    }
}
