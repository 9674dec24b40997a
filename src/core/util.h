/*
 * util.h - small helpers: checked size arithmetic, string duplication.
 * Every size that comes from a file or a socket goes through the checked
 * helpers before it is used.
 */
#ifndef EMBER_CORE_UTIL_H
#define EMBER_CORE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"

/* *out = a * b; returns false (and leaves *out unspecified) on overflow. */
static inline bool ember_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
/* *out = a + b; returns false on overflow. */
static inline bool ember_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* malloc'd copy of s (caller frees), NULL on OOM. */
char *ember_strdup(const char *s);
/* malloc'd copy of the first n bytes of s, NUL-terminated (caller frees). */
char *ember_strndup(const char *s, size_t n);
/* malloc'd "a/b" (caller frees), NULL on OOM. */
char *ember_path_join(const char *a, const char *b);
/* The last path component of p (a pointer into p). */
const char *ember_basename(const char *p);

/* Monotonic time in seconds. */
double ember_now(void);

/* A 64-bit finalizer (MurmurHash3's fmix64): every input bit affects every
   output bit. For hash tables keyed by integers. */
static inline uint64_t ember_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

#define EMBER_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EMBER_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EMBER_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
