/*
 * jsonutil.h - the one copy of the small jansson helpers that the config
 * reader, the tokenizer loader and the server share: the name of a JSON
 * value's type for error messages, and a JSON string made from bytes that
 * may not be valid UTF-8. No state.
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

/* A JSON string of s[0..n) with each byte that is not well-formed UTF-8
   replaced by U+FFFD (as ember_utf8_decode reads it), ending at the first
   NUL byte if s holds one: model output can be any bytes. NULL when out of memory (a json_pack or set_new taking it then
   fails too, never an empty text). */
json_t *ember_json_string_clean(const char *s, size_t n);

#endif
