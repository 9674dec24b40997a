/*
 * arch.h - the family table: the one list of the architectures Ember runs.
 * Each row names a config.json model_type, the GGUF architecture llama.cpp
 * (and `ember quantize`) uses for it, which forward pass runs it, and the
 * one layout fact GGUF conversion needs. The config reader, the GGUF reader
 * and writer, quantize, the model loader and `ember serve`'s model search
 * all ask this table; supporting a new model_type starts with a row here.
 * The table is constant: no state, safe from any thread.
 */
#ifndef EMBER_FORMATS_ARCH_H
#define EMBER_FORMATS_ARCH_H

#include <stdbool.h>
#include <stddef.h>

/* Which forward pass runs a model (src/model: llama.c, gemma.c, qwen3_moe.c or gemma4.c). */
typedef enum ember_arch_family {
    EMBER_FAMILY_LLAMA = 0, /* llama, mistral, qwen2, qwen3, phi3 */
    EMBER_FAMILY_GEMMA,     /* gemma2, gemma3_text */
    EMBER_FAMILY_QWEN3_MOE, /* qwen3_moe, glm4_moe (qwen3_moe.c) */
    EMBER_FAMILY_HYBRID,    /* qwen3_next, qwen3_5_text, qwen3_5_moe_text (qwen3_next.c) */
    EMBER_FAMILY_GEMMA4     /* gemma4_text (gemma4.c) */
} ember_arch_family;

typedef struct ember_arch {
    const char *model_type; /* config.json "model_type" */
    const char *gguf;       /* GGUF general.architecture of this model type */
    const char *gguf_alias; /* another GGUF architecture read as this row, or NULL */
    ember_arch_family family;
    bool rope_interleaved;  /* RoPE on interleaved pairs: llama.cpp permutes the
                               Q/K rows of these in GGUF files */
} ember_arch;

/* The row of a config.json model_type, NULL when Ember does not run it. */
const ember_arch *ember_arch_find(const char *model_type);

/* Whether model_type is run by gemma.c (a gemma row of the table). */
bool ember_arch_is_gemma(const char *model_type);

/* The row a GGUF general.architecture reads as (its gguf name or alias;
   the first row that has it), NULL when Ember does not run it. */
const ember_arch *ember_arch_find_gguf(const char *gguf_arch);

/* Writes the supported names, comma-separated in table order, into buf
   (NUL-terminated, cut at n - 1 bytes): the model types, or with gguf the
   GGUF architectures (each once). For messages; returns buf. */
const char *ember_arch_list(bool gguf, char *buf, size_t n);

#endif
