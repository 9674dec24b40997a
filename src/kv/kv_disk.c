/*
 * kv_disk.c - the prompt cache's disk tier (kv_disk.h): the index of the
 * directory's files, restoring a row from one, and writing queued rows
 * behind, a slice at a time.
 *
 * The index lives in memory: per file its name, size, salt, tokens and a
 * last-use stamp (seeded from the file's mtime at open, refreshed in memory
 * and on disk by a restore). Files are named by a hash of (salt, tokens),
 * so the same prefix written twice replaces itself.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/util.h"
#include "kv_disk.h"
#include "kv_internal.h"

#define FILE_MAGIC "EMPROMPT"
#define FILE_VERSION 1u
#define FILE_FIXED 40u   /* magic, version, header bytes, fingerprint, salt, n, 0 */
#define FILE_EXT ".emkv"
#define TMP_PREFIX ".tmp-"
#define QUEUE_MAX 8

typedef struct dfile {
    char name[32];    /* <16 hex>.emkv */
    size_t size;
    uint64_t salt;
    int n;
    int32_t *tokens;  /* [n] */
    uint64_t used;    /* last use: larger is more recent */
} dfile;

typedef struct qjob {
    ember_kv_rowstate *st;
    int32_t *tokens;  /* [st->len] */
    uint64_t salt;
} qjob;

struct ember_kv_disk {
    ember_kv *kv;
    char *dir;
    size_t max_bytes, bytes;
    uint64_t fingerprint, clock;
    ember_logger log;
    dfile *f;
    int n_files, cap_files;
    qjob q[QUEUE_MAX];
    int n_q;
    /* the write under way (q[0] while active) */
    bool active;
    double t_begin; /* when the active write began (ember_now) */
    kv_blob_writer *w;
    FILE *out;
    char tmp[64];
    size_t out_size;
    ember_kv_disk_stats st;
};

static void put32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8), b[2] = (unsigned char)(v >> 16),
    b[3] = (unsigned char)(v >> 24);
}
static void put64(unsigned char *b, uint64_t v) {
    put32(b, (uint32_t)v);
    put32(b + 4, (uint32_t)(v >> 32));
}
static uint32_t get32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t get64(const unsigned char *b) { return get32(b) | (uint64_t)get32(b + 4) << 32; }

/* dir/name into buf (false when it does not fit). */
static bool path_of(const ember_kv_disk *d, const char *name, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s/%s", d->dir, name);
    return k > 0 && (size_t)k < n;
}

static void remove_file(ember_kv_disk *d, const char *name) {
    char p[4096];
    if (path_of(d, name, p, sizeof p)) (void)unlink(p);
}

static void drop_index(ember_kv_disk *d, int i) {
    d->bytes -= d->f[i].size;
    free(d->f[i].tokens);
    d->f[i] = d->f[--d->n_files];
}

/* Removes the least recently used files until they total at most limit bytes. */
static void evict_to(ember_kv_disk *d, size_t limit) {
    while (d->bytes > limit && d->n_files) {
        int old = 0;
        for (int i = 1; i < d->n_files; i++)
            if (d->f[i].used < d->f[old].used) old = i;
        remove_file(d, d->f[old].name);
        drop_index(d, old);
        d->st.evictions++;
    }
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* ---- reading a file --------------------------------------------------------------- */

typedef struct fsrc {
    FILE *f;
} fsrc;

static int file_read(void *u, void *p, size_t n, ember_error *err) {
    fsrc *s = u;
    if (n && fread(p, 1, n, s->f) != n)
        return ember_err(err, EMBER_ERR_FORMAT, "%s", ferror(s->f) ? "read error" : "truncated");
    return EMBER_OK;
}

/*
 * Reads and checks the header of the open file f (size bytes): magic,
 * version, fingerprint, tokens and their CRC, then the blob's header
 * against this cache and the total size. On success *tokens (malloc'd, the
 * caller frees) holds the n tokens, *salt the salt, and f stands at the
 * blob's start. Errors: EMBER_ERR_FORMAT with why.
 */
static int read_header(ember_kv_disk *d, FILE *f, size_t size, int32_t **tokens, int *n, uint64_t *salt,
                       ember_error *err) {
    *tokens = NULL;
    unsigned char fx[FILE_FIXED];
    fsrc src = {f};
    if (size < FILE_FIXED + 4 || file_read(&src, fx, FILE_FIXED, err))
        return ember_err(err, EMBER_ERR_FORMAT, "truncated header");
    if (memcmp(fx, FILE_MAGIC, 8)) return ember_err(err, EMBER_ERR_FORMAT, "not a prompt cache file");
    if (get32(fx + 8) != FILE_VERSION)
        return ember_err(err, EMBER_ERR_FORMAT, "version %u, this build reads version %u", get32(fx + 8), FILE_VERSION);
    if (get64(fx + 16) != d->fingerprint)
        return ember_err(err, EMBER_ERR_FORMAT, "made with another model or tokenizer");
    uint32_t nt = get32(fx + 32), hb = get32(fx + 12);
    if (nt == 0 || nt > (uint32_t)d->kv->n_ctx || get32(fx + 36) != 0)
        return ember_err(err, EMBER_ERR_FORMAT, "bad token count %u", nt);
    if (hb != FILE_FIXED + 4 * nt + 4) return ember_err(err, EMBER_ERR_FORMAT, "bad header size");
    if (size < hb) return ember_err(err, EMBER_ERR_FORMAT, "truncated header");
    unsigned char *tb = ember_malloc((size_t)nt * 4 + 4);
    if (!tb) return ember_err(err, EMBER_ERR_NOMEM, "out of memory reading a prompt cache file");
    int rc = file_read(&src, tb, (size_t)nt * 4 + 4, err);
    if (!rc && kv_crc32(kv_crc32(0, fx, FILE_FIXED), tb, (size_t)nt * 4) != get32(tb + (size_t)nt * 4))
        rc = ember_err(err, EMBER_ERR_FORMAT, "header checksum mismatch");
    int32_t *t = rc ? NULL : ember_malloc((size_t)nt * sizeof *t);
    if (!rc && !t) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory reading a prompt cache file");
    for (uint32_t i = 0; !rc && i < nt; i++) {
        t[i] = (int32_t)get32(tb + 4 * (size_t)i);
        if (t[i] < 0) rc = ember_err(err, EMBER_ERR_FORMAT, "bad token id %d", t[i]);
    }
    free(tb);
    /* the blob's header: this cache's kind and shape, n positions, the exact size */
    unsigned char bh[4096];
    size_t need = 16, total = 0;
    int len = 0;
    if (!rc && size - hb < 16) rc = ember_err(err, EMBER_ERR_FORMAT, "truncated");
    if (!rc) rc = file_read(&src, bh, 16, err);
    if (!rc) rc = kv_blob_check(d->kv, bh, 16, &need, &total, &len, err);
    if (!rc && need) {
        if (need > sizeof bh || need > size - hb) rc = ember_err(err, EMBER_ERR_FORMAT, "truncated");
        if (!rc) rc = file_read(&src, bh + 16, need - 16, err);
        if (!rc) rc = kv_blob_check(d->kv, bh, need, &need, &total, &len, err);
    }
    if (!rc && (uint32_t)len != nt) rc = ember_err(err, EMBER_ERR_FORMAT, "%d positions for %u tokens", len, nt);
    if (!rc && size - hb != total)
        rc = ember_err(err, EMBER_ERR_FORMAT, "%zu bytes, %zu expected (truncated?)", size, (size_t)hb + total);
    if (!rc && fseeko(f, (off_t)hb, SEEK_SET)) rc = ember_err(err, EMBER_ERR_FORMAT, "cannot seek");
    if (rc) {
        free(t);
        return rc;
    }
    *tokens = t;
    *n = (int)nt;
    *salt = get64(fx + 24);
    return EMBER_OK;
}

static bool grow_index(ember_kv_disk *d) {
    if (d->n_files < d->cap_files) return true;
    int cap = d->cap_files ? 2 * d->cap_files : 16;
    dfile *f = ember_realloc(d->f, (size_t)cap * sizeof *f);
    if (!f) return false;
    d->f = f;
    d->cap_files = cap;
    return true;
}

static bool is_cache_name(const char *s) {
    size_t n = strlen(s);
    if (n != 16 + strlen(FILE_EXT) || strcmp(s + 16, FILE_EXT)) return false;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static int cmp_used(const void *a, const void *b) {
    const dfile *x = a, *y = b;
    return x->used < y->used ? -1 : x->used > y->used;
}

int ember_kv_disk_open(ember_kv *kv, const char *dir, size_t max_bytes, uint64_t fingerprint,
                       const ember_logger *log, ember_kv_disk **out, ember_error *err) {
    *out = NULL;
    if (!dir || !*dir) return ember_err(err, EMBER_ERR_INVALID_ARG, "no prompt cache directory given");
    if (strlen(dir) > 3900) return ember_err(err, EMBER_ERR_INVALID_ARG, "prompt cache directory path too long");
    if (mkdir(dir, 0777) && errno != EEXIST)
        return ember_err(err, EMBER_ERR_IO, "cannot create the prompt cache directory %s: %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
        return ember_err(err, EMBER_ERR_IO, "the prompt cache directory %s is not a directory", dir);
    if (access(dir, R_OK | W_OK | X_OK))
        return ember_err(err, EMBER_ERR_IO, "the prompt cache directory %s is not writable: %s", dir, strerror(errno));
    DIR *dh = opendir(dir);
    if (!dh) return ember_err(err, EMBER_ERR_IO, "cannot read the prompt cache directory %s: %s", dir, strerror(errno));
    ember_kv_disk *d = ember_calloc(1, sizeof *d);
    if (d) d->dir = ember_strdup(dir);
    if (!d || !d->dir) {
        closedir(dh);
        if (d) free(d);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory opening the prompt cache directory");
    }
    d->kv = kv;
    d->max_bytes = max_bytes ? max_bytes : EMBER_KV_DISK_DEFAULT_MAX;
    d->fingerprint = fingerprint;
    if (log) d->log = *log;
    int rc = EMBER_OK;
    struct dirent *de;
    while (!rc && (de = readdir(dh))) {
        const char *nm = de->d_name;
        char p[4096];
        if (!path_of(d, nm, p, sizeof p)) continue;
        if (!strncmp(nm, TMP_PREFIX, strlen(TMP_PREFIX))) { /* a write a crash interrupted */
            ember_log(&d->log, EMBER_LOG_INFO, "prompt cache: removing the unfinished write %s", p);
            (void)unlink(p);
            continue;
        }
        if (!is_cache_name(nm)) continue; /* not ours: left alone */
        FILE *f = fopen(p, "rb");
        struct stat fs;
        if (!f || fstat(fileno(f), &fs) || !S_ISREG(fs.st_mode)) {
            ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: skipping %s: cannot open it", p);
            if (f) fclose(f);
            continue;
        }
        ember_error fe = {0};
        int32_t *tok;
        int n;
        uint64_t salt;
        int hr = read_header(d, f, (size_t)fs.st_size, &tok, &n, &salt, &fe);
        fclose(f);
        if (hr == EMBER_ERR_NOMEM) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "%s", fe.msg);
            break;
        }
        if (hr) {
            ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: removing %s: %s", p, fe.msg);
            (void)unlink(p);
            d->st.removed++;
            continue;
        }
        if (!grow_index(d)) {
            free(tok);
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory opening the prompt cache directory");
            break;
        }
        dfile *e = &d->f[d->n_files++];
        memset(e, 0, sizeof *e);
        memcpy(e->name, nm, strlen(nm) + 1); /* is_cache_name: 21 characters */
        e->size = (size_t)fs.st_size;
        e->salt = salt;
        e->n = n;
        e->tokens = tok;
        e->used = (uint64_t)fs.st_mtim.tv_sec * 1000000000ull + (uint64_t)fs.st_mtim.tv_nsec;
        d->bytes += e->size;
    }
    closedir(dh);
    if (rc) {
        ember_kv_disk_free(d);
        return rc;
    }
    /* last-use stamps become ranks: older files first, the clock after them */
    if (d->n_files) qsort(d->f, (size_t)d->n_files, sizeof *d->f, cmp_used);
    for (int i = 0; i < d->n_files; i++) d->f[i].used = (uint64_t)i + 1;
    d->clock = (uint64_t)d->n_files + 1;
    /* a cap lowered since the files were written */
    evict_to(d, d->max_bytes);
    *out = d;
    return EMBER_OK;
}

static void job_free(ember_kv_disk *d, qjob *j) {
    ember_kv_rowstate_free(d->kv, j->st);
    free(j->tokens);
    memset(j, 0, sizeof *j);
}

/* Removes queue entry i (not the active write). */
static void queue_remove(ember_kv_disk *d, int i) {
    job_free(d, &d->q[i]);
    memmove(&d->q[i], &d->q[i + 1], (size_t)(d->n_q - i - 1) * sizeof *d->q);
    d->n_q--;
    memset(&d->q[d->n_q], 0, sizeof *d->q);
}

/* Ends the active write: the temporary file goes (after a failure), the job too. */
static void end_active(ember_kv_disk *d, bool remove_tmp) {
    kv_blob_writer_free(d->w);
    d->w = NULL;
    if (d->out) fclose(d->out);
    d->out = NULL;
    if (remove_tmp) remove_file(d, d->tmp);
    d->active = false;
    queue_remove(d, 0);
}

void ember_kv_disk_free(ember_kv_disk *d) {
    if (!d) return;
    if (d->active) end_active(d, true);
    while (d->n_q) queue_remove(d, 0);
    for (int i = 0; i < d->n_files; i++) free(d->f[i].tokens);
    free(d->f);
    free(d->dir);
    free(d);
}

int ember_kv_disk_match(ember_kv_disk *d, const int32_t *tokens, int n, uint64_t salt, int *file) {
    int best = 0;
    *file = -1;
    for (int i = 0; i < d->n_files; i++) {
        if (d->f[i].salt != salt) continue;
        int c = common_prefix(d->f[i].tokens, d->f[i].n, tokens, n);
        if (c > best || (c == best && c > 0 && *file >= 0 && d->f[i].n < d->f[*file].n)) {
            best = c;
            *file = i;
        }
    }
    return best;
}

/* The restore proper, its errors in *err (never NULL: the log line names them). */
static int restore(ember_kv_disk *d, int file, int r, ember_error *err);

int ember_kv_disk_restore(ember_kv_disk *d, int file, int r, ember_error *err) {
    ember_error e = {0};
    int rc = restore(d, file, r, &e);
    if (rc && err) *err = e;
    return rc;
}

static int restore(ember_kv_disk *d, int file, int r, ember_error *err) {
    if (file < 0 || file >= d->n_files) return ember_err(err, EMBER_ERR_INVALID_ARG, "no such prompt cache file");
    dfile *e = &d->f[file];
    char p[4096];
    if (!path_of(d, e->name, p, sizeof p)) return ember_err(err, EMBER_ERR_IO, "prompt cache path too long");
    FILE *f = fopen(p, "rb");
    struct stat fs;
    int rc;
    if (!f || fstat(fileno(f), &fs)) {
        rc = ember_err(err, EMBER_ERR_IO, "cannot open %s: %s", p, strerror(errno));
        if (f) fclose(f);
        drop_index(d, file); /* gone from under us */
        return rc;
    }
    int32_t *tok = NULL;
    int n = 0;
    uint64_t salt = 0;
    double t0 = ember_now();
    rc = read_header(d, f, (size_t)fs.st_size, &tok, &n, &salt, err);
    if (!rc && (n != e->n || salt != e->salt || memcmp(tok, e->tokens, (size_t)n * sizeof *tok)))
        rc = ember_err(err, EMBER_ERR_FORMAT, "changed since the index was read");
    free(tok);
    if (!rc) {
        fsrc src = {f};
        kv_source in = {file_read, &src};
        uint32_t hb = FILE_FIXED + 4u * (uint32_t)n + 4u;
        rc = kv_blob_read(d->kv, r, &in, (size_t)fs.st_size - hb, err);
    }
    fclose(f);
    if (rc == EMBER_ERR_NOMEM || rc == EMBER_ERR_INVALID_ARG) return rc; /* the file is not at fault */
    if (rc) {
        ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: removing %s: %s", p, err->msg);
        (void)unlink(p);
        drop_index(d, file);
        d->st.removed++;
        return rc;
    }
    e->used = ++d->clock;
    (void)utimensat(AT_FDCWD, p, NULL, 0); /* the order survives a restart */
    ember_log(&d->log, EMBER_LOG_DEBUG, "prompt cache: restored %d tokens from %s (%.1f MiB) in %.3f s", e->n,
              e->name, (double)e->size / (1 << 20), ember_now() - t0);
    d->st.restores++;
    d->st.tokens_restored += (uint64_t)e->n;
    return EMBER_OK;
}

/* true when a file or a queued write with this salt holds tokens[0..n) or more. */
static bool covered(const ember_kv_disk *d, const int32_t *tokens, int n, uint64_t salt) {
    for (int i = 0; i < d->n_files; i++)
        if (d->f[i].salt == salt && d->f[i].n >= n && common_prefix(d->f[i].tokens, d->f[i].n, tokens, n) == n)
            return true;
    for (int i = 0; i < d->n_q; i++)
        if (d->q[i].salt == salt && d->q[i].st->len >= n &&
            common_prefix(d->q[i].tokens, d->q[i].st->len, tokens, n) == n)
            return true;
    return false;
}

int ember_kv_disk_queue(ember_kv_disk *d, int r, const int32_t *tokens, uint64_t salt, ember_error *err) {
    int n = ember_kv_len(d->kv, r);
    if (n <= 0 || covered(d, tokens, n, salt)) return EMBER_OK;
    /* queued writes the new one extends go (not the one being written) */
    for (int i = d->active ? 1 : 0; i < d->n_q;) {
        qjob *j = &d->q[i];
        if (j->salt == salt && common_prefix(j->tokens, j->st->len, tokens, n) == j->st->len)
            queue_remove(d, i);
        else
            i++;
    }
    if (d->n_q == QUEUE_MAX) queue_remove(d, d->active ? 1 : 0); /* full: the oldest not yet begun gives way */
    qjob j = {0};
    j.salt = salt;
    int rc = ember_kv_extract(d->kv, r, &j.st, err);
    if (rc) return rc;
    if (!(j.tokens = ember_malloc((size_t)n * sizeof *j.tokens))) {
        ember_kv_rowstate_free(d->kv, j.st);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory queueing a prompt cache write");
    }
    memcpy(j.tokens, tokens, (size_t)n * sizeof *j.tokens);
    d->q[d->n_q++] = j;
    return EMBER_OK;
}

bool ember_kv_disk_drop_queued(ember_kv_disk *d) {
    bool any = d->n_q > 0;
    if (d->active) end_active(d, true);
    while (d->n_q) {
        queue_remove(d, d->n_q - 1);
    }
    return any;
}

static int out_write(void *u, const void *p, size_t n, ember_error *err) {
    ember_kv_disk *d = u;
    if (n && fwrite(p, 1, n, d->out) != n)
        return ember_err(err, EMBER_ERR_IO, "writing %s/%s: %s", d->dir, d->tmp, strerror(errno));
    return EMBER_OK;
}

/* The name of a file holding tokens[0..n) with salt. */
static void file_name(const int32_t *tokens, int n, uint64_t salt, char *buf, size_t cap) {
    uint64_t h = ember_mix64(salt ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = ember_mix64(h ^ (uint64_t)(uint32_t)tokens[i]);
    snprintf(buf, cap, "%016llx%s", (unsigned long long)h, FILE_EXT);
}

/* true when a file with j's salt already holds j's tokens or more (written
   since j was queued). */
static bool covered_by_file(const ember_kv_disk *d, const qjob *j) {
    for (int i = 0; i < d->n_files; i++)
        if (d->f[i].salt == j->salt && d->f[i].n >= j->st->len &&
            common_prefix(d->f[i].tokens, d->f[i].n, j->tokens, j->st->len) == j->st->len)
            return true;
    return false;
}

/* Begins writing q[0]: room under the cap, the temporary file, its header.
   false (and the job dropped) when it cannot or need not be written. */
static bool begin_write(ember_kv_disk *d) {
    qjob *j = &d->q[0];
    int n = j->st->len;
    ember_error err = {0};
    if (kv_blob_writer_new(d->kv, j->st, &d->w, &err)) {
        ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: not writing a prefix of %d tokens: %s", n, err.msg);
        queue_remove(d, 0);
        return false;
    }
    size_t hb = FILE_FIXED + 4 * (size_t)n + 4, size = hb + kv_blob_writer_size(d->w);
    if (size > d->max_bytes) {
        ember_log(&d->log, EMBER_LOG_DEBUG, "prompt cache: a prefix of %d tokens (%zu bytes) exceeds the cap", n, size);
        kv_blob_writer_free(d->w);
        d->w = NULL;
        queue_remove(d, 0);
        return false;
    }
    /* the files it extends go now; then the least recently used until it fits */
    for (int i = 0; i < d->n_files;) {
        dfile *f = &d->f[i];
        if (f->salt == j->salt && f->n <= n && common_prefix(f->tokens, f->n, j->tokens, n) == f->n) {
            remove_file(d, f->name);
            drop_index(d, i);
        } else {
            i++;
        }
    }
    evict_to(d, size <= d->max_bytes ? d->max_bytes - size : 0);
    snprintf(d->tmp, sizeof d->tmp, TMP_PREFIX "%ld-%llu%s", (long)getpid(), (unsigned long long)d->clock++, FILE_EXT);
    char p[4096];
    unsigned char *hdr = ember_malloc(hb);
    bool ok = hdr && path_of(d, d->tmp, p, sizeof p) && (d->out = fopen(p, "wb"));
    if (ok) {
        memcpy(hdr, FILE_MAGIC, 8);
        put32(hdr + 8, FILE_VERSION);
        put32(hdr + 12, (uint32_t)hb);
        put64(hdr + 16, d->fingerprint);
        put64(hdr + 24, j->salt);
        put32(hdr + 32, (uint32_t)n);
        put32(hdr + 36, 0);
        for (int i = 0; i < n; i++) put32(hdr + FILE_FIXED + 4 * (size_t)i, (uint32_t)j->tokens[i]);
        put32(hdr + hb - 4, kv_crc32(0, hdr, hb - 4));
        ok = fwrite(hdr, 1, hb, d->out) == hb;
    }
    if (!ok) {
        ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: cannot write %s/%s: %s", d->dir, d->tmp,
                  hdr ? strerror(errno) : "out of memory");
        free(hdr);
        d->active = true;
        end_active(d, true);
        return false;
    }
    free(hdr);
    d->out_size = size;
    d->active = true;
    d->t_begin = ember_now();
    return true;
}

/* Completes the active write: flush, fsync, rename into place, fsync the
   directory, index it. */
static void finish_write(ember_kv_disk *d) {
    qjob *j = &d->q[0];
    char name[32], from[4096], to[4096];
    file_name(j->tokens, j->st->len, j->salt, name, sizeof name);
    bool ok = path_of(d, d->tmp, from, sizeof from) && path_of(d, name, to, sizeof to);
    const char *why = "path too long";
    if (ok && (fflush(d->out) || fsync(fileno(d->out)))) ok = false, why = strerror(errno);
    if (ok) {
        int rc = fclose(d->out);
        d->out = NULL;
        if (rc) ok = false, why = strerror(errno);
    }
    if (ok && rename(from, to)) ok = false, why = strerror(errno);
    if (!ok) {
        ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: writing %s/%s failed: %s", d->dir, name, why);
        end_active(d, true);
        return;
    }
    int dfd = open(d->dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    for (int i = 0; i < d->n_files; i++) /* the same prefix written again replaced its file */
        if (!strcmp(d->f[i].name, name)) {
            drop_index(d, i);
            break;
        }
    if (grow_index(d)) {
        dfile *e = &d->f[d->n_files++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", name);
        e->size = d->out_size;
        e->salt = j->salt;
        e->n = j->st->len;
        e->tokens = j->tokens; /* the index takes them over */
        j->tokens = NULL;
        e->used = ++d->clock;
        d->bytes += e->size;
        d->st.writes++;
        ember_log(&d->log, EMBER_LOG_DEBUG, "prompt cache: wrote %s (%d tokens, %.1f MiB) in %.3f s", name, e->n,
                  (double)e->size / (1 << 20), ember_now() - d->t_begin);
    } else { /* the file stays on disk; the next start indexes it */
        ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: out of memory indexing %s", name);
    }
    end_active(d, false);
}

bool ember_kv_disk_work(ember_kv_disk *d, size_t bytes) {
    while (d->n_q && bytes > 0) {
        if (!d->active) {
            if (covered_by_file(d, &d->q[0])) {
                queue_remove(d, 0);
                continue;
            }
            if (!begin_write(d)) continue;
        }
        ember_error err = {0};
        kv_sink sink = {out_write, d};
        int rc = kv_blob_writer_step(d->w, &sink, bytes, &err);
        if (rc < 0) {
            ember_log(&d->log, EMBER_LOG_WARN, "prompt cache: writing %s/%s failed: %s", d->dir, d->tmp, err.msg);
            end_active(d, true);
            continue;
        }
        if (rc == 0) finish_write(d);
        break; /* one slice per call */
    }
    return d->n_q > 0;
}

void ember_kv_disk_get_stats(const ember_kv_disk *d, ember_kv_disk_stats *st) {
    *st = d->st;
    st->files = d->n_files;
    st->bytes = d->bytes;
}
