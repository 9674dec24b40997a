/*
 * serve_util.c - the small helpers the server's source files share
 * (serve_int.h).
 */
#include <stdbool.h>
#include <string.h>

#include "core/alloc.h"
#include "serve_int.h"

/* Copies s[0..n) replacing invalid UTF-8 with U+FFFD (malloc'd, NUL-terminated). */
static char *utf8_clean(const char *s, size_t n) {
    char *o = ember_malloc(n * 3 + 1), *p = o;
    if (!o) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = (u[i + k] & 0xc0) == 0x80;
        if (ok && len > 1) { /* no overlongs, surrogates or > U+10FFFF */
            unsigned cp = len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
            for (size_t k = 1; k < len; k++) cp = (cp << 6) | (u[i + k] & 0x3f);
            ok = !(len == 2 && cp < 0x80) && !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) &&
                 !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
        }
        if (ok) {
            memcpy(p, s + i, len);
            p += len;
            i += len;
        } else {
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
            i++;
        }
    }
    *p = 0;
    return o;
}

json_t *serve_jstr_clean(const char *s, size_t n) {
    char *c = utf8_clean(s, n);
    json_t *j = c ? json_string(c) : NULL;
    free(c);
    return j; /* NULL when out of memory: a json_pack taking it fails too, never an empty text */
}

