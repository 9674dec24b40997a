/*
 * error.h - how library code reports failures.
 *
 * A failing function fills a caller-provided ember_error (may be NULL) and
 * returns the negative status code; it never prints. Messages are one line
 * and start with the thing at fault ("model.safetensors: ...").
 */
#ifndef EMBER_CORE_ERROR_H
#define EMBER_CORE_ERROR_H

#include "ember.h"

#if defined(__GNUC__)
#define EMBER_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define EMBER_PRINTF(a, b)
#endif

/* Sets err (if non-NULL) to code and the formatted message; returns code.
   Newlines in the message are replaced by spaces so it stays one line. */
int ember_err(ember_error *err, int code, const char *fmt, ...) EMBER_PRINTF(3, 4);

/* Prepends a formatted prefix to err->msg (keeps the code); returns err->code
   (or EMBER_ERR_INTERNAL if err is NULL). */
int ember_err_prefix(ember_error *err, const char *fmt, ...) EMBER_PRINTF(2, 3);

/* Clears err to EMBER_OK with an empty message. */
void ember_err_clear(ember_error *err);

#endif
