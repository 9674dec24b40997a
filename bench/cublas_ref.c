/*
 * cublas_ref.c - the reference for issue 15's prefill goal: the cuBLAS bf16
 * GEMM rate on the matrix products of Llama-3.2-1B and Llama-3.1-8B at the
 * prompt sizes ember runs (M = 512, its prefill chunk, and M = 2048).
 * Measuring only: ember itself does not link cuBLAS (its products are its
 * own batch-invariant kernels, docs/cuda.md); only this program does, and
 * CMake builds it only where the toolkit has cuBLAS.
 *
 * For each product (N x K weight, bf16) at M input rows it times
 *   - plain: cublasGemmEx, bf16 x bf16 -> f32, compute in f32 (the rate a
 *     bf16-activation engine gets; llama.cpp and vLLM run this);
 *   - 2K: the same with K doubled, i.e. [W | W] times [hi | lo]: the
 *     arithmetic of ember's input split (x = hi + lo, two bf16 products per
 *     weight) on cuBLAS, the fastest non-invariant way to the same numbers
 *     (cuBLAS picks its algorithm and split by shape, so it is not batch
 *     invariant).
 * TFLOP/s count 2 M N K (the 2K column too: its useful work). Per model it
 * prints the layer's products (q,k,v as one N, o, gate,up as one N, down)
 * and the prefill rate they alone would allow: M / (layers x layer time),
 * tokens/s, the head left out (a prefill computes one row of logits).
 *
 * Method: random bf16 data (never zeros), 3 warm-up calls, the median of
 * 20 calls each timed with events. One thread; everything allocated is
 * freed; exits non-zero on any error.
 *
 * usage: cublas_ref [--device N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CB(call)                                                                  \
    do {                                                                          \
        cublasStatus_t s_ = (call);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

#define REPS 20
#define RAND_HALVES (16u << 20)

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static uint16_t *g_rand; /* random bf16 values in [-1, 1), tiled into every buffer */
static cublasHandle_t g_h;
static cudaStream_t g_s;

/* A device buffer of n bf16 values from the random block. */
static void *rand_buf(size_t n) {
    void *d;
    CK(cudaMalloc(&d, n * 2));
    for (size_t o = 0, len; o < n; o += len) { /* pieces of half the block, each from a random place */
        len = n - o < RAND_HALVES / 2 ? n - o : RAND_HALVES / 2;
        CK(cudaMemcpy((uint16_t *)d + o, g_rand + rnd32() % (RAND_HALVES / 2), len * 2, cudaMemcpyHostToDevice));
    }
    return d;
}

/* Median seconds of out[M, N] = x[M, K] w[N, K]^T (row-major; cuBLAS sees
   the column-major transposes). */
static double gemm_time(int M, int N, int K) {
    void *w = rand_buf((size_t)N * K), *x = rand_buf((size_t)M * K), *c;
    CK(cudaMalloc(&c, (size_t)M * N * 4));
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms[REPS];
    for (int i = -3; i < REPS; i++) {
        CK(cudaEventRecord(a, g_s));
        CB(cublasGemmEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &zero, c,
                        CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CK(cudaEventRecord(b, g_s));
        CK(cudaEventSynchronize(b));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], a, b));
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(c));
    return 0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]) * 1e-3;
}

typedef struct shape {
    const char *what;
    int N, K;
} shape;

static void model(const char *name, int layers, const shape *sh, int n) {
    const int Ms[] = {512, 2048};
    for (int mi = 0; mi < 2; mi++) {
        const int M = Ms[mi];
        double lt = 0, lt2 = 0;
        for (int i = 0; i < n; i++) {
            double t = gemm_time(M, sh[i].N, sh[i].K), t2 = gemm_time(M, sh[i].N, 2 * sh[i].K);
            double fl = 2.0 * M * (double)sh[i].N * sh[i].K;
            printf("| %s | %s %dx%d | %d | %.1f | %.1f | %.1f | %.1f |\n", name, sh[i].what, sh[i].N, sh[i].K, M,
                   t * 1e6, fl / t / 1e12, t2 * 1e6, fl / t2 / 1e12);
            fflush(stdout);
            lt += t;
            lt2 += t2;
        }
        printf("| %s | layer (%d layers): prefill bound of the products alone | %d | %.1f | %.0f tokens/s | %.1f | %.0f "
               "tokens/s |\n",
               name, layers, M, lt * 1e6, M / (layers * lt), lt2 * 1e6, M / (layers * lt2));
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    int device = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: cublas_ref [--device N]\n");
            return 2;
        }
    }
    CK(cudaSetDevice(device));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    int ver = 0;
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    CB(cublasCreate(&g_h));
    CB(cublasSetStream(g_h, g_s));
    CB(cublasGetVersion(g_h, &ver));
    printf("device %d: %s; cuBLAS %d; bf16 x bf16 -> f32, compute f32, CUBLAS_GEMM_DEFAULT; median of %d\n\n", device,
           prop.name, ver, REPS);
    g_rand = malloc((size_t)RAND_HALVES * 2);
    if (!g_rand) return 1;
    for (size_t i = 0; i < RAND_HALVES; i++) {
        float f = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f + 1e-4f;
        uint32_t u;
        memcpy(&u, &f, 4);
        g_rand[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    printf("| model | product (N x K) | M | us | TFLOP/s | us, K doubled (hi / lo) | TFLOP/s counted once |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    double t = gemm_time(8192, 8192, 8192);
    printf("| - | 8192x8192 | 8192 | %.1f | %.1f | - | - |\n", t * 1e6, 2.0 * 8192.0 * 8192.0 * 8192.0 / t / 1e12);
    const shape l8[] = {{"q,k,v", 6144, 4096}, {"o", 4096, 4096}, {"gate,up", 28672, 4096}, {"down", 4096, 14336}};
    const shape l1[] = {{"q,k,v", 3072, 2048}, {"o", 2048, 2048}, {"gate,up", 16384, 2048}, {"down", 2048, 8192}};
    model("Llama-3.2-1B", 16, l1, 4);
    model("Llama-3.1-8B", 32, l8, 4);
    free(g_rand);
    CB(cublasDestroy(g_h));
    CK(cudaStreamDestroy(g_s));
    return 0;
}
