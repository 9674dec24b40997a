/*
 * fuzz_safetensors.c - libFuzzer target: arbitrary bytes as a safetensors
 * file. Parsing must succeed or fail cleanly; on success every tensor must
 * lie inside the buffer and be findable by name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ember_st_file *f = NULL;
    ember_error err;
    if (ember_st_parse("fuzz.safetensors", data, size, &f, &err) == EMBER_OK) {
        for (int i = 0; i < f->n_tensors; i++) {
            const ember_st_tensor *t = &f->tensors[i];
            if (t->data < data || t->data + t->nbytes > data + size) abort();
            if (ember_st_find(f, t->name) != t) abort();
            volatile unsigned char sink = 0;
            if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
            (void)sink;
        }
        ember_st_free(f);
    } else if (f || strlen(err.msg) == 0) {
        abort();
    }
    return 0;
}
