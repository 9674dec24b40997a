/*
 * utf8.c - UTF-8 helpers (utf8.h). Decoding follows the well-formedness
 * rules of Unicode (table 3-7): shortest form only, no surrogates, nothing
 * above U+10FFFF; what fails them is one U+FFFD per byte.
 */
#include "core/utf8.h"

size_t ember_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t ember_utf8_decode(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    size_t need;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
        need = 2;
        c &= 0x1F;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3;
        c &= 0x0F;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4;
        c &= 0x07;
        min = 0x10000;
    } else {
        *len = 1;
        return 0xFFFD;
    }
    if (n < need) {
        *len = 1;
        return 0xFFFD;
    }
    for (size_t i = 1; i < need; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        c = (c << 6) | (u[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *len = 1;
        return 0xFFFD;
    }
    *len = need;
    return c;
}

size_t ember_utf16_len(const char *s, size_t n) {
    size_t units = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            units++;
            i++;
            continue;
        }
        size_t len;
        uint32_t cp = ember_utf8_decode(s + i, n - i, &len);
        units += cp >= 0x10000 ? 2 : 1;
        i += len;
    }
    return units;
}

bool ember_js_space(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

bool ember_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0, len; i < n; i += len)
        if (ember_utf8_decode(s + i, n - i, &len) == 0xFFFD && len == 1) return false;
    return true;
}
