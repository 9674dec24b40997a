/*
 * jsonutil.c - JSON type names (jsonutil.h): one table, read with or
 * without the article; strings cleaned to UTF-8.
 */
#include "core/jsonutil.h"
#include "core/alloc.h"
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

/* "an object" and its bare name start at offset 3 ("an ") or 2 ("a "). */
static const char *type_name(const json_t *v, size_t *article) {
    if (!v) {
        *article = 0;
        return "nothing";
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: *article = 3; return "an object";
    case JSON_ARRAY: *article = 3; return "an array";
    case JSON_STRING: *article = 2; return "a string";
    case JSON_INTEGER: *article = 3; return "an integer";
    case JSON_REAL: *article = 2; return "a number";
    case JSON_TRUE:
    case JSON_FALSE: *article = 2; return "a boolean";
    default: *article = 0; return "null";
    }
}

const char *ember_json_type(const json_t *v) {
    size_t article;
    return type_name(v, &article);
}

const char *ember_json_type_bare(const json_t *v) {
    size_t article;
    const char *s = type_name(v, &article);
    return s + article;
}

json_t *ember_json_string_clean(const char *s, size_t n) {
    char *o = ember_malloc(n * 3 + 1), *p = o; /* each byte grows to U+FFFD at most */
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = ember_utf8_decode(s + i, n - i, &len);
        if (cp == 0xFFFD && len == 1) {
            p += ember_utf8_put(cp, p);
        } else {
            memcpy(p, s + i, len);
            p += len;
        }
        i += len;
    }
    *p = 0;
    json_t *j = json_string_nocheck(o); /* up to a NUL byte, as the server has always sent text */
    free(o);
    return j;
}
