/* util.c - see util.h. */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

char *ember_strdup(const char *s) {
    return ember_strndup(s, strlen(s));
}

char *ember_strndup(const char *s, size_t n) {
    char *r = ember_malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

char *ember_path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    bool slash = la > 0 && a[la - 1] != '/';
    char *r = ember_malloc(la + slash + lb + 1);
    if (!r) return NULL;
    memcpy(r, a, la);
    if (slash) r[la] = '/';
    memcpy(r + la + slash, b, lb + 1);
    return r;
}

const char *ember_basename(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

double ember_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
