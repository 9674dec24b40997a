/*
 * log.h - the logging callback every context carries.
 * A NULL callback drops messages. No global state: the logger is a value
 * held by whoever logs (model, engine, ...).
 */
#ifndef EMBER_CORE_LOG_H
#define EMBER_CORE_LOG_H

#include "error.h"

typedef struct ember_logger {
    ember_log_fn fn;
    void *user;
} ember_logger;

void ember_log(const ember_logger *lg, ember_log_level level, const char *fmt, ...)
    EMBER_PRINTF(3, 4);

#endif
