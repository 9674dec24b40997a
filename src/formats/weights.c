/* weights.c - see weights.h. */
#define _POSIX_C_SOURCE 200809L
#include "weights.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"

#define MAX_INDEX_BYTES (64u * 1024u * 1024u)
#define MAX_SHARDS 4096

void ember_weights_free(ember_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_files; i++) ember_st_free(w->files[i]);
    free(w->files);
    free(w->dir);
    free(w->primary);
    free(w);
}

const ember_st_tensor *ember_weights_find(const ember_weights *w, const char *name, const char **file) {
    char mapped[512];
    if (w->text_prefix && strncmp(name, "model.", 6) == 0) {
        if ((size_t)snprintf(mapped, sizeof mapped, "%s%s", w->text_prefix, name + 6) >= sizeof mapped) return NULL;
        name = mapped;
    } else if (w->head_prefix && strncmp(name, "lm_head.", 8) == 0) {
        if ((size_t)snprintf(mapped, sizeof mapped, "%s%s", w->head_prefix, name + 8) >= sizeof mapped) return NULL;
        name = mapped;
    }
    for (int i = 0; i < w->n_files; i++) {
        const ember_st_tensor *t = ember_st_find(w->files[i], name);
        if (t) {
            if (file) *file = w->files[i]->path;
            return t;
        }
    }
    return NULL;
}

int ember_weights_use_text_model(ember_weights *w, ember_error *err) {
    static const struct {
        const char *text, *head;
    } k_layouts[] = {{"model.language_model.", NULL}, {"language_model.model.", "language_model.lm_head."}};
    w->text_prefix = w->head_prefix = NULL;
    for (size_t i = 0; i < sizeof k_layouts / sizeof k_layouts[0]; i++) {
        w->text_prefix = k_layouts[i].text;
        w->head_prefix = k_layouts[i].head;
        if (ember_weights_find(w, "model.embed_tokens.weight", NULL)) return EMBER_OK;
    }
    w->text_prefix = w->head_prefix = NULL;
    return ember_err(err, EMBER_ERR_FORMAT,
                     "%s: a multimodal checkpoint without its text model's tensors (no "
                     "model.language_model.embed_tokens.weight or language_model.model.embed_tokens.weight)",
                     w->primary);
}

bool ember_weights_is_text(const ember_weights *w, const char *stored_name) {
    if (!w->text_prefix) return true;
    if (strncmp(stored_name, w->text_prefix, strlen(w->text_prefix)) == 0) return true;
    const char *head = w->head_prefix ? w->head_prefix : "lm_head.";
    return strncmp(stored_name, head, strlen(head)) == 0;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int add_file(ember_weights *w, const char *path, ember_error *err) {
    ember_st_file **nf = ember_realloc(w->files, (size_t)(w->n_files + 1) * sizeof *nf);
    if (!nf) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
    w->files = nf;
    int rc = ember_st_open(path, &w->files[w->n_files], err);
    if (rc) return rc;
    w->n_files++;
    return EMBER_OK;
}

/* A shard name must be a plain file name in the model directory. */
static bool safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..") && strlen(s) < 1024;
}

static int open_sharded(ember_weights *w, const char *index_path, ember_error *err) {
    char *text = NULL;
    size_t len;
    int rc = ember_read_file(index_path, MAX_INDEX_BYTES, &text, &len, err);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", index_path,
                         je.text, je.line, je.column);
    json_t *map = json_object_get(root, "weight_map");
    const char *name;
    json_t *val;
    if (!json_is_object(map)) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: missing or non-object 'weight_map'", index_path);
        goto done;
    }
    /* open each distinct shard once, in order of first mention */
    json_object_foreach(map, name, val) {
        if (!json_is_string(val) || !safe_shard_name(json_string_value(val))) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: weight_map entry '%.128s' must name a file in the model directory",
                           index_path, name);
            goto done;
        }
        char *p = ember_path_join(w->dir, json_string_value(val));
        if (!p) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
        bool seen = false;
        for (int i = 0; i < w->n_files && !seen; i++) seen = strcmp(w->files[i]->path, p) == 0;
        if (!seen) {
            if (w->n_files >= MAX_SHARDS) {
                free(p);
                rc = ember_err(err, EMBER_ERR_LIMIT, "%s: more than %d shards", index_path, MAX_SHARDS);
                goto done;
            }
            rc = add_file(w, p, err);
        }
        free(p);
        if (rc) goto done;
    }
    json_object_foreach(map, name, val) {
        const char *file = NULL;
        char *p = ember_path_join(w->dir, json_string_value(val));
        if (!p) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
        const ember_st_tensor *t = ember_weights_find(w, name, &file);
        if (!t || strcmp(file, p) != 0) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%.128s' is listed in %s but %s", index_path, name,
                           json_string_value(val), t ? "found in another shard" : "is not in it");
            free(p);
            goto done;
        }
        free(p);
    }
    /* a name in two shards is ambiguous */
    for (int i = 0; i < w->n_files; i++)
        for (int k = 0; k < w->files[i]->n_tensors; k++)
            for (int j = i + 1; j < w->n_files; j++)
                if (ember_st_find(w->files[j], w->files[i]->tensors[k].name)) {
                    rc = ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%.128s' appears in both %s and %s",
                                   index_path, w->files[i]->tensors[k].name, ember_basename(w->files[i]->path),
                                   ember_basename(w->files[j]->path));
                    goto done;
                }
done:
    json_decref(root);
    return rc;
}

int ember_weights_open(const char *dir, ember_weights **out, ember_error *err) {
    *out = NULL;
    ember_weights *w = ember_calloc(1, sizeof *w);
    if (!w || !(w->dir = ember_strdup(dir))) {
        free(w);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    char *single = ember_path_join(dir, "model.safetensors");
    char *index = ember_path_join(dir, "model.safetensors.index.json");
    int rc;
    if (!single || !index)
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    else if (file_exists(index))
        rc = (w->primary = ember_strdup(index)) ? open_sharded(w, index, err)
                                                : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    else if (file_exists(single))
        rc = (w->primary = ember_strdup(single)) ? add_file(w, single, err)
                                                 : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    else
        rc = ember_err(err, EMBER_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    free(single);
    free(index);
    if (rc) {
        ember_weights_free(w);
        return rc;
    }
    *out = w;
    return EMBER_OK;
}
