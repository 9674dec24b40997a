/*
 * mapfile.h - read-only memory maps of whole files.
 */
#ifndef EMBER_CORE_MAPFILE_H
#define EMBER_CORE_MAPFILE_H

#include <stddef.h>

#include "error.h"

typedef struct ember_mapfile {
    const unsigned char *data; /* NULL when size is 0 */
    size_t size;
    char *path; /* owned copy */
} ember_mapfile;

/* Maps path read-only. On success *out owns the mapping (ember_mapfile_free).
   Errors name the path: "PATH: cannot open: No such file or directory". */
int ember_mapfile_open(const char *path, ember_mapfile **out, ember_error *err);
void ember_mapfile_free(ember_mapfile *m);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer (caller
   frees). Files larger than max_size are refused with EMBER_ERR_LIMIT. */
int ember_read_file(const char *path, size_t max_size, char **out, size_t *out_len,
                    ember_error *err);

#endif
