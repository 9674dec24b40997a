/*
 * jsonutil.c - JSON type names (jsonutil.h): one table, read with or
 * without the article.
 */
#include "core/jsonutil.h"

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
