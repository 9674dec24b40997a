/*
 * tok_load.c - where a tokenizer comes from: a model directory, a
 * tokenizer.json (+ tokenizer_config.json beside it), a GGUF file, or
 * memory.
 *
 * Owner: tokenizer module; runs on the loading thread.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapfile.h"
#include "core/util.h"
#include "tok_internal.h"

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int ember_tok_load_json_mem(const char *name, const char *json, size_t n, const char *cfg, size_t cfg_n,
                            ember_tokenizer **out, ember_error *err) {
    if (!out || (!json && n)) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_load_json_mem: NULL argument");
    *out = NULL;
    return tok_load_json_text(name ? name : "tokenizer.json", json ? json : "", n, NULL, cfg, cfg_n, out, err);
}

int ember_tok_load_json(const char *json_path, const char *config_path, ember_tokenizer **out, ember_error *err) {
    if (!json_path || !out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_load_json: NULL argument");
    *out = NULL;
    char *json = NULL, *cfg = NULL;
    size_t n = 0, cn = 0;
    int rc = ember_read_file(json_path, TOK_MAX_FILE_BYTES, &json, &n, err);
    if (rc) return rc;
    if (config_path) {
        rc = ember_read_file(config_path, TOK_MAX_CONFIG_BYTES, &cfg, &cn, err);
        if (rc) {
            free(json);
            return rc;
        }
    }
    rc = tok_load_json_text(json_path, json, n, config_path, cfg, cn, out, err);
    free(json);
    free(cfg);
    return rc;
}

/* The directory part of path ("." when none); malloc'd. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ember_strdup(".");
    if (slash == path) return ember_strdup("/");
    return ember_strndup(path, (size_t)(slash - path));
}

static int load_json_with_config(const char *json_path, ember_tokenizer **out, ember_error *err) {
    char *dir = dir_of(json_path);
    char *cfg = dir ? ember_path_join(dir, "tokenizer_config.json") : NULL;
    free(dir);
    if (!cfg) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    int rc = ember_tok_load_json(json_path, is_file(cfg) ? cfg : NULL, out, err);
    free(cfg);
    return rc;
}

static bool has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4] = {0};
    size_t r = fread(m, 1, 4, f);
    fclose(f);
    return r == 4 && memcmp(m, "GGUF", 4) == 0;
}

int ember_tok_load(const char *path, ember_tokenizer **out, ember_error *err) {
    if (!path || !out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_load: NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return ember_err(err, EMBER_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        char *tj = ember_path_join(path, "tokenizer.json");
        if (!tj) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        if (is_file(tj)) {
            int rc = load_json_with_config(tj, out, err);
            free(tj);
            return rc;
        }
        free(tj);
        /* a directory with a GGUF file: the first in name order */
        DIR *d = opendir(path);
        if (!d) return ember_err(err, EMBER_ERR_IO, "%s: cannot read the directory", path);
        char *best = NULL;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!ends_with(e->d_name, ".gguf")) continue;
            if (!best || strcmp(e->d_name, best) < 0) {
                char *c = ember_strdup(e->d_name);
                if (!c) {
                    free(best);
                    closedir(d);
                    return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
                }
                free(best);
                best = c;
            }
        }
        closedir(d);
        if (!best) return ember_err(err, EMBER_ERR_IO, "%s: no tokenizer.json and no .gguf file in this directory", path);
        char *gp = ember_path_join(path, best);
        free(best);
        if (!gp) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        int rc = ember_tok_load_gguf(gp, out, err);
        free(gp);
        return rc;
    }
    if (ends_with(path, ".gguf") || has_gguf_magic(path)) return ember_tok_load_gguf(path, out, err);
    return load_json_with_config(path, out, err);
}
