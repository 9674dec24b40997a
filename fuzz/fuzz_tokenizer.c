/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer: tokenizer.json
 * loading, encoding, decoding and streaming on arbitrary bytes.
 *
 * Input layout: [tokenizer.json bytes] 0xFF 0xFE 0xFD [text bytes]. Without
 * the separator the whole input is the tokenizer.json and a fixed text is
 * encoded. Anything may fail to load (that must be a clean error); once a
 * tokenizer loads, every call must succeed or fail cleanly, never crash,
 * hang or leak.
 *
 * Build (not part of CMake), e.g. with the library sources:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc -Iinclude fuzz/fuzz_tokenizer.c \
 *     src/core/[eu]*.c src/core/mapfile.c src/formats/gguf.c src/formats/quant.c src/core/dtype.c \
 *     src/tok/tok_*.c $(pkg-config --cflags --libs libpcre2-8 libutf8proc jansson) -lm -o fuzz_tokenizer
 *   ./fuzz_tokenizer -max_len=65536 corpus_dir/
 * A seed corpus: small tokenizer.json files (tests/test_tok_unit.c has some)
 * with a separator and a text appended.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tokenizer.h"

static const char k_text[] = "Hello, world! <s> <|im_start|> 123 \xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80 \xFF\xFE  \n\t";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *text = k_text;
    size_t jn = size, tn = sizeof k_text - 1;
    for (size_t i = 0; i + 3 <= size; i++) {
        if (data[i] == 0xFF && data[i + 1] == 0xFE && data[i + 2] == 0xFD) {
            jn = i;
            text = (const char *)data + i + 3;
            tn = size - i - 3;
            break;
        }
    }
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    if (ember_tok_load_json_mem("fuzz.json", json, jn, NULL, 0, &t, &err)) return 0;
    ember_tok_ws *ws = ember_tok_ws_new(t);
    static const unsigned flags[] = {0, EMBER_TOK_ADD_SPECIAL, EMBER_TOK_NO_PARSE_SPECIAL | EMBER_TOK_ADD_SPECIAL};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ember_tok_encode(t, f & 1 ? ws : NULL, text, tn, flags[f], &ids, &n, &err) == 0) {
            char *out = NULL;
            size_t on;
            if (ember_tok_decode(t, ids, n, f == 1 ? EMBER_TOK_SKIP_SPECIAL : 0, &out, &on, &err) == 0) free(out);
            ember_tok_stream *s;
            if (ember_tok_stream_new(t, 0, &s, &err) == 0) {
                const char *piece;
                size_t pl;
                for (size_t i = 0; i < n; i++) ember_tok_stream_push(s, ids[i], &piece, &pl, &err);
                ember_tok_stream_flush(s, &piece, &pl, &err);
                ember_tok_stream_free(s);
            }
            free(ids);
        }
    }
    /* ids taken from the text bytes, in and out of range */
    int32_t v[64];
    size_t m = 0, nv = (size_t)ember_tok_n_vocab(t);
    for (size_t i = 0; i + 1 < tn && m < 64; i += 2)
        v[m++] = (int32_t)((((unsigned char)text[i] << 8) | (unsigned char)text[i + 1]) % (nv + 2)) - 1;
    char *out = NULL;
    if (ember_tok_decode(t, v, m, 0, &out, NULL, &err) == 0) free(out);
    ember_tok_ws_free(ws);
    ember_tok_free(t);
    return 0;
}
