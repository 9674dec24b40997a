/*
 * jsonutil.h - the one copy of the small jansson helpers that the config
 * reader, the tokenizer loader and the server share: the name of a JSON
 * value's type for error messages. No state, no allocation.
 */
#ifndef EMBER_CORE_JSONUTIL_H
#define EMBER_CORE_JSONUTIL_H

#include <jansson.h>

/* The type of v with its article, for "expected X, got Y" messages: "an
   object", "an array", "a string", "an integer", "a number", "a boolean",
   "null"; "nothing" when v is NULL (an absent field). A static string. */
const char *ember_json_type(const json_t *v);

/* The same without the article: "object", "array", "string", "integer",
   "number", "boolean", "null"; "nothing" for NULL. A static string. */
const char *ember_json_type_bare(const json_t *v);

#endif
