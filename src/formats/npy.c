/* npy.c - see npy.h. */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"

int ember_npy_begin(ember_npy_writer *w, const char *path, int64_t rows, int64_t cols, ember_error *err) {
    memset(w, 0, sizeof *w);
    if (rows < 0 || cols < 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: negative array shape", path);
    w->path = ember_strdup(path);
    if (!w->path) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        int e = errno;
        free(w->path);
        w->path = NULL;
        return ember_err(err, EMBER_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    w->rows = rows;
    w->cols = cols;
    char dict[160];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    /* magic(6) + version(2) + len(2) + dict + padding + '\n' is a multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    fwrite(pre, 1, 10, w->fp);
    fwrite(dict, 1, (size_t)n, w->fp);
    for (size_t i = 0; i < pad; i++) fputc(' ', w->fp);
    fputc('\n', w->fp);
    if (ferror(w->fp)) {
        ember_npy_abort(w);
        return ember_err(err, EMBER_ERR_IO, "%s: write failed", path);
    }
    return EMBER_OK;
}

int ember_npy_rows(ember_npy_writer *w, const float *data, int64_t n, ember_error *err) {
    if (n < 0 || w->written + n > w->rows)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: more rows than the header declares", w->path);
    size_t cnt = (size_t)n * (size_t)w->cols;
    if (fwrite(data, sizeof(float), cnt, w->fp) != cnt)
        return ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->written += n;
    return EMBER_OK;
}

void ember_npy_abort(ember_npy_writer *w) {
    if (w->fp) fclose(w->fp);
    if (w->path) unlink(w->path);
    free(w->path);
    memset(w, 0, sizeof *w);
}

int ember_npy_end(ember_npy_writer *w, ember_error *err) {
    if (w->written != w->rows) {
        int rc = ember_err(err, EMBER_ERR_INTERNAL, "%s: %lld of %lld rows written", w->path,
                           (long long)w->written, (long long)w->rows);
        ember_npy_abort(w);
        return rc;
    }
    if (fclose(w->fp) != 0) {
        w->fp = NULL;
        int rc = ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        ember_npy_abort(w);
        return rc;
    }
    free(w->path);
    memset(w, 0, sizeof *w);
    return EMBER_OK;
}
