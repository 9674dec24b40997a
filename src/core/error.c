/* error.c - filling ember_error; see error.h. */
#define _POSIX_C_SOURCE 200809L
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

int ember_err(ember_error *err, int code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    one_line(err->msg);
    err->code = code;
    return code;
}

int ember_err_prefix(ember_error *err, const char *fmt, ...) {
    if (!err) return EMBER_ERR_INTERNAL;
    char prefix[EMBER_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[EMBER_ERROR_MSG_MAX];
    size_t lp = strnlen(prefix, sizeof joined - 1);
    size_t lm = strnlen(err->msg, sizeof err->msg);
    if (lm > sizeof joined - 1 - lp) lm = sizeof joined - 1 - lp;
    memcpy(joined, prefix, lp);
    memcpy(joined + lp, err->msg, lm);
    joined[lp + lm] = '\0';
    memcpy(err->msg, joined, sizeof joined);
    one_line(err->msg);
    return err->code;
}

void ember_err_clear(ember_error *err) {
    if (!err) return;
    err->code = EMBER_OK;
    err->msg[0] = '\0';
}

const char *ember_status_str(int code) {
    switch (code) {
    case EMBER_OK: return "ok";
    case EMBER_ERR_INVALID_ARG: return "invalid argument";
    case EMBER_ERR_IO: return "i/o error";
    case EMBER_ERR_FORMAT: return "malformed file";
    case EMBER_ERR_UNSUPPORTED: return "unsupported";
    case EMBER_ERR_NOMEM: return "out of memory";
    case EMBER_ERR_LIMIT: return "limit exceeded";
    case EMBER_ERR_INTERNAL: return "internal error";
    default: return "unknown error";
    }
}
