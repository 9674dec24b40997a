/*
 * fuzz_gguf.c - libFuzzer entry point for the GGUF reader.
 *
 * Parses the input from memory; when it parses, touches everything a
 * loader would: every metadata pair through the typed getters, every
 * tensor's first and last byte, a lookup by name, and the first block of
 * every tensor whose type the reference decoders handle. Any input must
 * give EMBER_OK or a clean error; sanitizers catch the rest.
 * Owns nothing between calls; every allocation is freed before returning.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "formats/quant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ember_gguf *f = NULL;
    ember_error err;
    if (ember_gguf_parse("fuzz.gguf", data, size, &f, &err) != EMBER_OK) {
        /* the message must be one line that names the input */
        if (strncmp(err.msg, "fuzz.gguf: ", 11) != 0 || strchr(err.msg, '\n')) abort();
        return 0;
    }
    volatile unsigned sink = 0;
    for (size_t i = 0; i < f->n_kv; i++) {
        const char *key = f->kv[i].key;
        if (ember_gguf_find_kv(f, key) != &f->kv[i]) abort();
        uint32_t u32;
        int64_t i64;
        double f64;
        bool b;
        const char *s;
        size_t len, n;
        const char *const *strs;
        const size_t *lens;
        float *fv = NULL;
        int32_t *iv = NULL;
        ember_gguf_get_u32(f, key, &u32, NULL);
        ember_gguf_get_i64(f, key, &i64, NULL);
        ember_gguf_get_f64(f, key, &f64, NULL);
        ember_gguf_get_bool(f, key, &b, NULL);
        if (ember_gguf_get_str(f, key, &s, &len, NULL) == EMBER_OK) sink += (unsigned char)s[len];
        if (ember_gguf_get_strs(f, key, &strs, &lens, &n, NULL) == EMBER_OK)
            for (size_t j = 0; j < n; j++) sink += (unsigned char)strs[j][lens[j]];
        if (ember_gguf_get_f32s(f, key, &fv, &n, &err) == EMBER_OK) free(fv);
        if (ember_gguf_get_i32s(f, key, &iv, &n, &err) == EMBER_OK) free(iv);
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ember_gguf_tensor *t = &f->tensors[i];
        if (ember_gguf_find_tensor(f, t->name) != t) abort();
        sink += t->data[0] + t->data[t->nbytes - 1];
        if (ember_can_dequantize(t->dtype)) {
            float block[256];
            ember_dequantize(t->dtype, t->data, block, ember_dtype_get(t->dtype)->block_elems, NULL);
        }
    }
    (void)sink;
    ember_gguf_free(f);
    return 0;
}
