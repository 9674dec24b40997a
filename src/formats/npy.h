/*
 * npy.h - writing NumPy .npy files (format 1.0, little-endian float32,
 * C order), streamed row by row so large arrays never sit in memory twice.
 */
#ifndef EMBER_FORMATS_NPY_H
#define EMBER_FORMATS_NPY_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef struct ember_npy_writer {
    FILE *fp;
    char *path;
    int64_t rows, cols, written;
} ember_npy_writer;

/* Creates path and writes the header of a [rows, cols] float32 array. */
int ember_npy_begin(ember_npy_writer *w, const char *path, int64_t rows, int64_t cols, ember_error *err);
/* Appends n rows (n * cols floats). */
int ember_npy_rows(ember_npy_writer *w, const float *data, int64_t n, ember_error *err);
/* Checks every row was written and closes the file; on error removes it. */
int ember_npy_end(ember_npy_writer *w, ember_error *err);
/* Closes and removes a half-written file (after an error elsewhere). */
void ember_npy_abort(ember_npy_writer *w);

#endif
