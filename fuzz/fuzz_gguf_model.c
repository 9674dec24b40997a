/*
 * fuzz_gguf_model.c - libFuzzer entry point for loading a model from a
 * GGUF image: the reader, the llama-family metadata mapping
 * (src/model/gguf_model.c) and the model loader's checks of every
 * tensor's presence, dtype and shape. Any input must load or fail with a
 * one-line message naming the input; sanitizers catch the rest.
 * Build (clang): clang -fsanitize=fuzzer,address,undefined -Iinclude -Isrc
 *   fuzz/fuzz_gguf_model.c <libember sources> -ljansson -lm -lpthread
 * Owns nothing between calls; every allocation is freed before returning.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ember_gguf *f = NULL;
    ember_error err;
    if (ember_gguf_parse("fuzz.gguf", data, size, &f, &err) != EMBER_OK) return 0;
    ember_backend *be = NULL;
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, true, {0}};
    if (ember_backend_cpu_new(&cp, &be, &err) != EMBER_OK) {
        ember_gguf_free(f);
        return 0;
    }
    ember_model_config cfg;
    ember_llm *m = NULL;
    if (ember_llm_from_gguf(f, be, &cfg, &m, &err) != EMBER_OK) {
        if (strchr(err.msg, '\n')) abort();
    }
    ember_llm_free(m);
    ember_backend_free(be);
    return 0;
}
