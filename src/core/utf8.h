/*
 * utf8.h - the one copy of the UTF-8 helpers the tokenizer (src/tok) and the
 * template interpreter (src/template) share: encoding a code point,
 * decoding one with validation, checking a text, the UTF-16 length JavaScript reports, and
 * JavaScript's whitespace set. Pure functions: no state, no allocation.
 */
#ifndef EMBER_CORE_UTF8_H
#define EMBER_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Writes cp (<= 0x10FFFF) as UTF-8 into out, which has room for 4 bytes;
   returns the number of bytes written (1 to 4). */
size_t ember_utf8_put(uint32_t cp, char *out);

/* Decodes the code point at s[0..n) (n > 0) and sets *len to its byte
   length. Anything that is not well-formed UTF-8 (a bad lead or
   continuation byte, a truncated sequence, an overlong form, a surrogate,
   a value above U+10FFFF) decodes as U+FFFD with *len = 1. */
uint32_t ember_utf8_decode(const char *s, size_t n, size_t *len);

/* Whether s[0..n) is well-formed UTF-8 (nothing ember_utf8_decode would
   replace). */
bool ember_utf8_valid(const char *s, size_t n);

/* The length of s[0..n) in UTF-16 code units (JavaScript's String length):
   2 for a code point above U+FFFF, 1 for any other, and 1 for each byte that
   ember_utf8_decode replaces with U+FFFD. */
size_t ember_utf16_len(const char *s, size_t n);

/* JavaScript's whitespace (WhiteSpace + LineTerminator: what \s and
   String.prototype.trim mean). */
bool ember_js_space(uint32_t cp);

#endif
