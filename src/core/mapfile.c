/* mapfile.c - see mapfile.h. */
#define _POSIX_C_SOURCE 200809L
#include "mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"
#include "util.h"

static int open_regular(const char *path, int *fd_out, size_t *size_out, ember_error *err) {
    int fd = ember_fault_hit(EMBER_FAULT_READ) ? (errno = EIO, -1) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ember_err(err, EMBER_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ember_err(err, EMBER_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ember_err(err, EMBER_ERR_IO, "%s: not a regular file", path);
    }
    *fd_out = fd;
    *size_out = (size_t)st.st_size;
    return EMBER_OK;
}

int ember_mapfile_open(const char *path, ember_mapfile **out, ember_error *err) {
    *out = NULL;
    int fd;
    size_t size;
    int rc = open_regular(path, &fd, &size, err);
    if (rc) return rc;
    ember_mapfile *m = ember_calloc(1, sizeof *m);
    char *p = ember_strdup(path);
    if (!m || !p) {
        free(m);
        free(p);
        close(fd);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
    }
    m->path = p;
    m->size = size;
    if (size > 0) {
        void *d = ember_fault_hit(EMBER_FAULT_READ) ? (errno = EIO, MAP_FAILED)
                                                    : mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (d == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(m->path);
            free(m);
            return ember_err(err, EMBER_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        m->data = d;
    }
    close(fd);
    *out = m;
    return EMBER_OK;
}

void ember_mapfile_free(ember_mapfile *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    free(m);
}

int ember_read_file(const char *path, size_t max_size, char **out, size_t *out_len,
                    ember_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    int fd;
    size_t size;
    int rc = open_regular(path, &fd, &size, err);
    if (rc) return rc;
    if (size > max_size) {
        close(fd);
        return ember_err(err, EMBER_ERR_LIMIT, "%s: file is %zu bytes, larger than the %zu-byte limit",
                         path, size, max_size);
    }
    char *buf = ember_malloc(size + 1);
    if (!buf) {
        close(fd);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = ember_fault_hit(EMBER_FAULT_READ) ? (errno = EIO, -1)
                                                      : read(fd, buf + got, ember_fault_read_cap(size - got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return ember_err(err, EMBER_ERR_IO, "%s: read failed: %s", path,
                             n < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)n;
    }
    close(fd);
    buf[size] = '\0';
    *out = buf;
    if (out_len) *out_len = size;
    return EMBER_OK;
}
