/*
 * fuzz_prompt_file.c - libFuzzer entry point for the prompt cache's file
 * reader (src/kv/kv_disk.c): the index built from a directory's headers and
 * the streaming restore of a row.
 *
 * The input (after its first byte) becomes the only cache file of a
 * directory. The first byte picks one of two small caches (dense f32; q8
 * converting at 32 with a rotating layer); bit 7 set: the header's and the
 * blob's CRCs are recomputed first, so the fuzzer reaches the checks behind
 * them. Opening must never fail because of the file; a file the index keeps
 * is restored into a row with its own tokens: it loads (the row then holds
 * exactly its length, readable where a row must be) or fails cleanly,
 * leaving the row as it was. No block may leak either way.
 *
 * With EMBER_FUZZ_PF_SEEDS=DIR set, the first call writes one valid file
 * per cache into DIR (the seed corpus) and returns.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv.h"
#include "kv/kv_disk.h"
#include "kv/kv_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_CACHES 2
#define FP 0x66757a7a70667031ull
static ember_backend *g_be;
static ember_kv *g_kv[N_CACHES];
static char g_dir[256];
static const int k_heads[2] = {2, 1}, k_dims[2] = {16, 8}, k_win[2] = {0, 24};

static void setup(void) {
    if (g_be) return;
    ember_error err;
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    if (ember_backend_cpu_new(&cp, &g_be, &err)) abort();
    static const struct {
        const char *kind;
        int qs;
        bool rot;
    } kinds[N_CACHES] = {{"f32", 0, false}, {"q8", 32, true}};
    for (int i = 0; i < N_CACHES; i++) {
        ember_kv_type t;
        if (ember_kv_type_parse(kinds[i].kind, 0, kinds[i].qs, &t, &err)) abort();
        ember_kv_params p = {t, 2, k_heads, k_dims, kinds[i].rot ? k_win : NULL, 2, 128, 0, 8, 16, NULL, {0}};
        if (ember_kv_new(g_be, &p, &g_kv[i], &err)) abort();
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-fuzz-pf-%ld", (long)getpid());
}

#include "kv_fill.h"

static void clean_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *de;
    char p[512];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
            unlink(p);
        }
    closedir(d);
}

static void write_seeds(const char *dir) {
    int32_t tok[128];
    for (int i = 0; i < 128; i++) tok[i] = (i * 37 + 5) % 1000;
    for (int c = 0; c < N_CACHES; c++) {
        clean_dir();
        ember_error err;
        ember_kv_disk *d;
        if (ember_kv_disk_open(g_kv[c], g_dir, 0, FP, NULL, &d, &err)) abort();
        fill(g_kv[c], 40 + 13 * c);
        if (ember_kv_disk_queue(d, 1, tok, 0, &err)) abort();
        while (ember_kv_disk_work(d, 1 << 20)) {}
        ember_kv_disk_free(d);
        ember_kv_clear(g_kv[c], 1);
        DIR *dh = opendir(g_dir);
        struct dirent *de;
        while (dh && (de = readdir(dh))) {
            if (!strstr(de->d_name, ".emkv")) continue;
            char from[512], to[4096];
            snprintf(from, sizeof from, "%s/%s", g_dir, de->d_name);
            snprintf(to, sizeof to, "%s/seed%d.bin", dir, c);
            FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
            if (in && out) {
                fputc(c, out);
                int ch;
                while ((ch = fgetc(in)) != EOF) fputc(ch, out);
            }
            if (in) fclose(in);
            if (out) fclose(out);
        }
        if (dh) closedir(dh);
    }
    clean_dir();
}

static uint32_t rd32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static void wr32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16), b[3] = (uint8_t)(v >> 24);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    static int seeded;
    if (!seeded) {
        seeded = 1;
        (void)mkdir(g_dir, 0700);
        const char *dir = getenv("EMBER_FUZZ_PF_SEEDS");
        if (dir) {
            write_seeds(dir);
            return 0;
        }
    }
    if (size < 1) return 0;
    ember_kv *kv = g_kv[(data[0] & 0x7f) % N_CACHES];
    size_t n = size - 1;
    uint8_t *f = malloc(n ? n : 1);
    if (!f) return 0;
    memcpy(f, data + 1, n);
    uint32_t hb = n >= 16 ? rd32(f + 12) : 0;
    if ((data[0] & 0x80) && hb >= 8 && hb <= n) {
        wr32(f + hb - 4, kv_crc32(0, f, hb - 4));
        if (n >= hb + 4) wr32(f + n - 4, kv_crc32(0, f + hb, n - hb - 4));
    }
    clean_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/0123456789abcdef.emkv", g_dir);
    FILE *fp = fopen(path, "wb");
    if (!fp) abort();
    if (n) fwrite(f, 1, n, fp);
    fclose(fp);
    /* the tokens the header claims, as a request would send them */
    int nt = n >= 40 ? (int)(rd32(f + 32) & 0xffff) : 0;
    if (nt > 256 || (size_t)40 + 4 * (size_t)nt > n) nt = 0;
    int32_t tok[256];
    for (int i = 0; i < nt; i++) tok[i] = (int32_t)rd32(f + 40 + 4 * (size_t)i);
    free(f);

    ember_error err;
    ember_kv_disk *d;
    if (ember_kv_disk_open(kv, g_dir, 0, FP, NULL, &d, &err)) abort(); /* never because of a file */
    ember_kv_disk_stats st;
    ember_kv_disk_get_stats(d, &st);
    if (st.files + (int)st.removed != 1) abort(); /* kept or removed, nothing else */
    int file = -1;
    int m = nt ? ember_kv_disk_match(d, tok, nt, 0, &file) : 0;
    if (st.files == 1 && file >= 0 && m > 0) {
        fill(kv, 20); /* row 1 holds something; restore goes to row 0 */
        int rc = ember_kv_disk_restore(d, file, 0, &err);
        if (rc) {
            if (!err.msg[0] || strchr(err.msg, '\n') || ember_kv_len(kv, 0) != 0) abort();
        } else {
            if (ember_kv_len(kv, 0) != nt) abort();
            float k[64], v[64];
            for (int l = 0; l < 2; l++)
                for (int p = ember_kv_min_reuse(kv, 0); p < nt; p++)
                    if (ember_kv_read_pos(kv, 0, l, p, k, v, &err)) abort();
        }
        ember_kv_clear(kv, 0);
        ember_kv_clear(kv, 1);
    }
    ember_kv_disk_free(d);
    if (ember_kv_used_bytes(kv) != 0) abort();
    clean_dir();
    return 0;
}
