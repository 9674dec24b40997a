/*
 * fuzz_config.c - libFuzzer target: arbitrary bytes as config.json, then as
 * generation_config.json over the parsed config, then the RoPE frequencies.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/config.h"
#include "model/rope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ember_model_config *c = malloc(sizeof *c);
    ember_error err;
    if (ember_config_parse("config.json", (const char *)data, size, c, &err) == EMBER_OK) {
        ember_generation_config_parse("generation_config.json", (const char *)data, size, c, &err);
        float *f = malloc(((size_t)c->head_dim / 2 + 1) * sizeof *f);
        int n_rot;
        float af;
        ember_rope_freqs(&c->rope, c->head_dim, f, &n_rot, &af, &err);
        free(f);
    } else if (strlen(err.msg) == 0) {
        abort();
    }
    free(c);
    return 0;
}
