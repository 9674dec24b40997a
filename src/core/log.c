/* log.c - formats a message and hands it to the logger's callback. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>

void ember_log(const ember_logger *lg, ember_log_level level, const char *fmt, ...) {
    if (!lg || !lg->fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    lg->fn(lg->user, level, buf);
}
