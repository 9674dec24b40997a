/*
 * hfcache.c - resolving "org/name" to a snapshot directory of the local
 * HuggingFace cache. Reads the environment and the file system; keeps no
 * state, so any thread may call it (the environment must not change
 * meanwhile).
 */
#define _DEFAULT_SOURCE
#include "api/hfcache.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void ember_hf_hub_dir(char *buf, size_t n) {
    const char *e = getenv("HF_HUB_CACHE");
    if (e && *e) {
        snprintf(buf, n, "%s", e);
        return;
    }
    e = getenv("HF_HOME");
    if (e && *e) {
        snprintf(buf, n, "%s/hub", e);
        return;
    }
    const char *home = getenv("HOME");
    snprintf(buf, n, "%s/.cache/huggingface/hub", home ? home : ".");
}

bool ember_hf_snapshot(const char *repo_dir, char *out, size_t n) {
    char p[4096], ref[128] = "";
    snprintf(p, sizeof p, "%s/refs/main", repo_dir);
    FILE *fp = fopen(p, "r");
    if (fp) {
        if (fgets(ref, sizeof ref, fp)) ref[strcspn(ref, "\r\n")] = 0;
        fclose(fp);
    }
    if (ref[0] && !strchr(ref, '/')) {
        snprintf(out, n, "%s/snapshots/%s", repo_dir, ref);
        if (is_dir(out)) return true;
    }
    snprintf(p, sizeof p, "%s/snapshots", repo_dir);
    DIR *d = opendir(p);
    if (!d) return false;
    struct dirent *de;
    bool found = false;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            int k = snprintf(out, n, "%s/%.255s", p, de->d_name);
            found = k > 0 && (size_t)k < n && is_dir(out);
            if (found) break;
        }
    closedir(d);
    return found;
}

bool ember_hf_resolve(const char *name, char *out, size_t n) {
    const char *slash = strchr(name, '/');
    if (!slash || slash == name || !slash[1] || strchr(slash + 1, '/')) return false;
    char hub[2048], repo[4096];
    ember_hf_hub_dir(hub, sizeof hub);
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - name), name, slash + 1);
    return ember_hf_snapshot(repo, out, n);
}
