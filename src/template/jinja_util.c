/*
 * jinja_util.c - the arena, the string builder, UTF-8 and JavaScript string
 * helpers of the Jinja interpreter; see jinja_internal.h.
 *
 * The arena hands out zeroed, 16-aligned blocks from 64 KiB chunks (bigger
 * requests get a chunk of their own) and frees everything at once. It counts
 * the bytes it took from malloc against a limit, so a runaway template fails
 * with EMBER_ERR_LIMIT instead of exhausting the machine.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "template/jinja_internal.h"

#define CHUNK_SIZE (64u * 1024u)

struct ja_chunk {
    ja_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void ja_init(jarena *a, size_t limit) {
    memset(a, 0, sizeof *a);
    a->limit = limit;
}

void ja_release(jarena *a) {
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->last = NULL;
    a->total = 0;
}

static size_t round16(size_t n) {
    return (n + 15u) & ~(size_t)15u;
}

void *ja_alloc(jarena *a, size_t n) {
    if (a->failed) return NULL;
    if (n == 0) n = 1;
    if (n > SIZE_MAX / 2) {
        a->failed = EMBER_ERR_LIMIT;
        return NULL;
    }
    size_t need = round16(n);
    ja_chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > CHUNK_SIZE / 4 ? need : CHUNK_SIZE;
        size_t bytes = sizeof(ja_chunk) + cap;
        if (a->limit && (a->total + bytes > a->limit)) {
            a->failed = EMBER_ERR_LIMIT;
            return NULL;
        }
        ja_chunk *nc = ember_malloc(bytes);
        if (!nc) {
            a->failed = EMBER_ERR_NOMEM;
            return NULL;
        }
        a->total += bytes;
        nc->cap = cap;
        nc->used = 0;
        if (c && cap != CHUNK_SIZE) {
            /* a dedicated big chunk: keep filling the current one afterwards */
            nc->next = c->next;
            c->next = nc;
            nc->used = need;
            memset(nc->data, 0, need);
            a->last = NULL;
            return nc->data;
        }
        nc->next = c;
        a->head = nc;
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += need;
    memset(p, 0, need);
    a->last = p;
    return p;
}

void *ja_grow(jarena *a, void *p, size_t old, size_t n) {
    if (!p) return ja_alloc(a, n);
    if (n <= old) return p;
    ja_chunk *c = a->head;
    if (p == a->last && c && (unsigned char *)p >= c->data && (unsigned char *)p < c->data + c->cap) {
        size_t off = (size_t)((unsigned char *)p - c->data);
        size_t need = round16(n);
        if (off + need <= c->cap) {
            size_t was = c->used;
            c->used = off + need;
            if (c->used > was) memset(c->data + was, 0, c->used - was);
            return p;
        }
    }
    void *q = ja_alloc(a, n);
    if (!q) return NULL;
    memcpy(q, p, old);
    return q;
}

char *ja_strdup(jarena *a, const char *s, size_t n) {
    char *r = ja_alloc(a, n + 1);
    if (!r) return NULL;
    if (n) memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

/* ---- string builder ---- */

void jsb_init(jsb *b, size_t limit) {
    memset(b, 0, sizeof *b);
    b->limit = limit;
}

void jsb_free(jsb *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

bool jsb_add(jsb *b, const char *s, size_t n) {
    if (b->failed) return false;
    if (n == 0) return true;
    size_t need;
    if (!ember_add_ok(b->len, n + 1, &need) || (b->limit && b->len + n > b->limit)) {
        b->failed = EMBER_ERR_LIMIT;
        return false;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *p = ember_realloc(b->p, cap);
        if (!p) {
            b->failed = EMBER_ERR_NOMEM;
            return false;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool jsb_addc(jsb *b, char c) {
    return jsb_add(b, &c, 1);
}

bool jsb_adds(jsb *b, const char *s) {
    return jsb_add(b, s, strlen(s));
}

/* ---- UTF-8 ---- */

size_t ju_space_len(const char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char c = (unsigned char)s[0];
    if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0D)) ? 1 : 0;
    size_t len;
    uint32_t cp = ember_utf8_decode(s, n, &len);
    return ember_js_space(cp) ? len : 0;
}

void js_num_str(double x, char *buf) {
    if (isnan(x)) {
        strcpy(buf, "NaN");
        return;
    }
    if (isinf(x)) {
        strcpy(buf, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        strcpy(buf, "0");
        return;
    }
    char *o = buf;
    if (x < 0) {
        *o++ = '-';
        x = -x;
    }
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp: d[.ddd]e[+-]XX */
    char digits[24];
    int k = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && k < 20) digits[k++] = *p;
    int e = *p == 'e' ? atoi(p + 1) : 0;
    while (k > 1 && digits[k - 1] == '0') k--;
    int n = e + 1;
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = k; i < n; i++) *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *o = '\0';
}

int jinja_err_at(ember_error *err, int code, const char *src, size_t src_len, size_t pos, const char *fmt, ...) {
    if (!err) return code;
    if (pos > src_len) pos = src_len;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xC0) != 0x80) {
            col++;
        }
    }
    char msg[EMBER_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_err(err, code, "template:%zu:%zu: %s", line, col, msg);
}
