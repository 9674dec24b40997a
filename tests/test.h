/*
 * test.h - the tiny harness every C test uses: CHECK macros that count
 * failures and keep going, float comparison by ULP, paths to ../shared.
 * A test's main returns test_done() (0 pass, 1 fail) or 77 to skip.
 */
#ifndef EMBER_TEST_H
#define EMBER_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int g_fail, g_checks;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        g_checks++;                                                                  \
        if (!(cond)) {                                                               \
            g_fail++;                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        g_checks++;                                                         \
        if (!(cond)) {                                                      \
            g_fail++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

/* CHECKF as an expression: the condition's value. */
static inline bool check_v(bool c, const char *file, int line, const char *expr, const char *fmt, ...) {
    g_checks++;
    if (c) return true;
    g_fail++;
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return false;
}
#define CHECKV(cond, ...) check_v((cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

static inline int test_done(void) {
    fprintf(stderr, "%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}

/* Distance in units in the last place between two finite floats. */
static inline uint32_t ulp_diff(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = (int32_t)0x80000000 - ia;
    if (ib < 0) ib = (int32_t)0x80000000 - ib;
    int64_t d = (int64_t)ia - (int64_t)ib;
    return (uint32_t)(d < 0 ? -d : d);
}

/* Deterministic test data: xorshift64, seeded per file by defining
   TEST_RNG_SEED before including this header (different files keep their
   own streams). rnd(): 32 random bits; frnd(): uniform in [-1, 1). */
#ifdef TEST_RNG_SEED
static uint64_t g_rng = TEST_RNG_SEED;
static inline uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static inline float frnd(void) {
    return (float)((double)(rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}
#endif

static inline int path_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* The data a test needs from ../shared: returns EMBER_SHARED_DIR when
   <shared>/<rel> exists. When it is absent the test ends here, saying so:
   exit 77 (ctest: skipped) if every check so far passed, else 1 (a failure
   found before the missing data still fails the test). A test calls it, for
   each folder it reads, before the part that reads it. */
static inline const char *shared_require(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", EMBER_SHARED_DIR, rel);
    if (!path_exists(p)) {
        fprintf(stderr, "skipped: %s not found (test data from ../shared is absent)\n", p);
        if (g_fail) exit(test_done());
        exit(77);
    }
    return EMBER_SHARED_DIR;
}

/* shared_require("fixtures"): the reference fixtures most tests read. */
static inline const char *shared_dir(void) {
    return shared_require("fixtures");
}

#endif
