/*
 * hfcache.h - models in the local HuggingFace cache (read only: nothing is
 * downloaded). Used by the text API (ember_llm_open) and `ember serve`.
 */
#ifndef EMBER_API_HFCACHE_H
#define EMBER_API_HFCACHE_H

#include <stdbool.h>
#include <stddef.h>

/* $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub into buf. */
void ember_hf_hub_dir(char *buf, size_t n);

/* The snapshot directory of a cache entry (HUB/models--ORG--NAME):
   refs/main's, else the first one found. Returns false when there is none
   (out is then unspecified). */
bool ember_hf_snapshot(const char *repo_dir, char *out, size_t n);

/* A name "org/name" in the cache into its snapshot directory. Returns false
   when name is not of that shape or not in the cache. */
bool ember_hf_resolve(const char *name, char *out, size_t n);

#endif
