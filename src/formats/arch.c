/*
 * arch.c - the family table (arch.h). Order matters only for messages and
 * for a GGUF name two rows share ("llama": the llama row comes first, so a
 * GGUF "llama" file reads as model_type llama, never mistral).
 */
#include "formats/arch.h"

#include <stdio.h>
#include <string.h>

static const ember_arch k_archs[] = {
    {"llama", "llama", "mistral", EMBER_FAMILY_LLAMA, true},
    {"mistral", "llama", NULL, EMBER_FAMILY_LLAMA, true},
    {"qwen2", "qwen2", NULL, EMBER_FAMILY_LLAMA, false},
    {"qwen3", "qwen3", NULL, EMBER_FAMILY_LLAMA, false},
    {"phi3", "phi3", NULL, EMBER_FAMILY_LLAMA, false},
    {"gemma2", "gemma2", NULL, EMBER_FAMILY_GEMMA, false},
    {"gemma3_text", "gemma3", NULL, EMBER_FAMILY_GEMMA, false},
    {"qwen3_moe", "qwen3moe", NULL, EMBER_FAMILY_QWEN3_MOE, false},
    {"glm4_moe", "glm4moe", NULL, EMBER_FAMILY_QWEN3_MOE, false},
    {"qwen3_next", "qwen3next", NULL, EMBER_FAMILY_HYBRID, false},
    {"qwen3_5_text", "qwen35", NULL, EMBER_FAMILY_HYBRID, false},
    {"qwen3_5_moe_text", "qwen35moe", NULL, EMBER_FAMILY_HYBRID, false},
    {"gemma4_text", "gemma4", NULL, EMBER_FAMILY_GEMMA4, false},
};
#define N_ARCHS (sizeof k_archs / sizeof k_archs[0])

const ember_arch *ember_arch_find(const char *model_type) {
    for (size_t i = 0; model_type && i < N_ARCHS; i++)
        if (strcmp(model_type, k_archs[i].model_type) == 0) return &k_archs[i];
    return NULL;
}

bool ember_arch_is_gemma(const char *model_type) {
    const ember_arch *row = ember_arch_find(model_type);
    return row && row->family == EMBER_FAMILY_GEMMA;
}

const ember_arch *ember_arch_find_gguf(const char *gguf_arch) {
    for (size_t i = 0; gguf_arch && i < N_ARCHS; i++)
        if (strcmp(gguf_arch, k_archs[i].gguf) == 0 ||
            (k_archs[i].gguf_alias && strcmp(gguf_arch, k_archs[i].gguf_alias) == 0))
            return &k_archs[i];
    return NULL;
}

/* Appends name to buf[0..*used) unless already listed (the GGUF names). */
static void list_add(char *buf, size_t n, size_t *used, const char *name, bool unique) {
    if (!name || *used >= n) return;
    if (unique) {
        size_t len = strlen(name);
        for (const char *p = buf; (p = strstr(p, name)) != NULL; p += len)
            if ((p == buf || p[-1] == ' ') && (p[len] == ',' || p[len] == '\0')) return;
    }
    int w = snprintf(buf + *used, n - *used, "%s%s", *used ? ", " : "", name);
    if (w > 0) *used += (size_t)w < n - *used ? (size_t)w : n - *used - 1;
}

const char *ember_arch_list(bool gguf, char *buf, size_t n) {
    if (!n) return buf;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (!gguf) {
            list_add(buf, n, &used, k_archs[i].model_type, false);
            continue;
        }
        list_add(buf, n, &used, k_archs[i].gguf, true);
        list_add(buf, n, &used, k_archs[i].gguf_alias, true);
    }
    return buf;
}
