/*
 * tokenizer.h - text <-> token ids: the tokenizer module's API.
 *
 * Owner: src/tok (tok_*.c). Chat templates are their own part,
 * src/template/.
 *
 * Sources: a HuggingFace tokenizer.json (+ tokenizer_config.json), or the
 * vocabulary inside a GGUF file (tokenizer.ggml.*). Models: byte-level BPE
 * (GPT-2 / Llama 3 / Qwen), SentencePiece-style BPE with byte fallback
 * (Llama 2 / Mistral / Gemma), WordPiece (BERT) and Unigram.
 *
 * Reference: ids and texts match the npm package @huggingface/tokenizers
 * (run in node) byte for byte on the project's corpus; GGUF vocabularies
 * match llama.cpp's tokenizer test vectors.
 *
 * Input text: any bytes. Invalid UTF-8 is never an error: each maximal
 * invalid subsequence becomes U+FFFD exactly as node's TextDecoder does
 * (the WHATWG "replacement" practice), and that text is tokenized. So a
 * string that node received through Buffer/TextDecoder tokenizes the same.
 * NUL bytes are ordinary characters.
 *
 * Threads: an ember_tokenizer is immutable once loaded; any number of
 * threads may encode and decode with it at once. A workspace
 * (ember_tok_ws: scratch memory, regex match data, a BPE cache) and a
 * stream belong to one thread at a time.
 *
 * Limits: tokenizer.json <= 512 MiB, ids < 2^22, token texts <= 64 KiB,
 * merges < 2^23, added tokens < 2^20, one encode call <= 256 MiB of text.
 * Exceeding one is an error (EMBER_ERR_LIMIT), never a crash.
 */
#ifndef EMBER_TOK_TOKENIZER_H
#define EMBER_TOK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ember_tokenizer ember_tokenizer;
typedef struct ember_tok_ws ember_tok_ws;
typedef struct ember_tok_stream ember_tok_stream;
struct ember_gguf;

typedef enum ember_tok_kind {
    EMBER_TOK_KIND_BPE = 0,
    EMBER_TOK_KIND_WORDPIECE = 1,
    EMBER_TOK_KIND_UNIGRAM = 2
} ember_tok_kind;

/* Flags for encode / decode / streams. */
enum {
    /* encode: add the special tokens the post-processor adds (BOS, CLS/SEP, ...) */
    EMBER_TOK_ADD_SPECIAL = 1u << 0,
    /* encode: special added tokens written in the text are NOT recognised
       (they are tokenized as ordinary text); non-special added tokens still are */
    EMBER_TOK_NO_PARSE_SPECIAL = 1u << 1,
    /* decode / stream: leave out special tokens */
    EMBER_TOK_SKIP_SPECIAL = 1u << 2,
    /* decode / stream: no clean_up_tokenization_spaces even if the config asks for it */
    EMBER_TOK_NO_CLEANUP = 1u << 3
};

/* ---- loading --------------------------------------------------------------- */

/* Loads from path: a directory (tokenizer.json [+ tokenizer_config.json], or
   else a single *.gguf inside it), a tokenizer.json file (its folder's
   tokenizer_config.json is read when present), or a .gguf file. On success
   *out owns everything (ember_tok_free). Errors are one line naming the
   file: "tokenizer.json: model.merges[12]: expected a string or a pair". */
int ember_tok_load(const char *path, ember_tokenizer **out, ember_error *err);

/* Loads tokenizer.json at json_path; config_path (may be NULL) is a
   tokenizer_config.json. */
int ember_tok_load_json(const char *json_path, const char *config_path, ember_tokenizer **out,
                        ember_error *err);

/* Loads from memory: json[0..n) is a tokenizer.json text, cfg (may be NULL)
   a tokenizer_config.json text. name is used in messages. Nothing is kept
   pointing into the buffers. */
int ember_tok_load_json_mem(const char *name, const char *json, size_t n, const char *cfg, size_t cfg_n,
                            ember_tokenizer **out, ember_error *err);

/* Loads the vocabulary of a GGUF file (tokenizer.ggml.model llama, gpt2 or
   bert, with tokenizer.ggml.pre naming the pre-tokenizer). */
int ember_tok_load_gguf(const char *path, ember_tokenizer **out, ember_error *err);

/* The same from an already parsed GGUF (g is not kept). */
int ember_tok_from_gguf(const struct ember_gguf *g, ember_tokenizer **out, ember_error *err);

/* Frees t (accepts NULL). */
void ember_tok_free(ember_tokenizer *t);

/* ---- encoding -------------------------------------------------------------- */

/* A workspace for repeated encodes from one thread: keeps scratch memory
   and a cache of recent words. NULL on out of memory. Must be used only
   with the tokenizer it was made for. */
ember_tok_ws *ember_tok_ws_new(const ember_tokenizer *t);
void ember_tok_ws_free(ember_tok_ws *ws);

/* Encodes text[0..len) (any bytes, see above). ws may be NULL (a temporary
   one is used). On success *ids is a malloc'd array of *n_ids ids (caller
   frees; may be NULL when *n_ids is 0). Errors: EMBER_ERR_LIMIT (input too
   large, regex match limit), EMBER_ERR_NOMEM. */
int ember_tok_encode(const ember_tokenizer *t, ember_tok_ws *ws, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n_ids, ember_error *err);

/* ---- decoding -------------------------------------------------------------- */

/* Decodes ids[0..n) into a malloc'd NUL-terminated UTF-8 string (caller
   frees) of *len bytes (len may be NULL). Ids outside [0, n_vocab) are an
   error (EMBER_ERR_INVALID_ARG) naming the position. */
int ember_tok_decode(const ember_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                     size_t *len, ember_error *err);

/* Streaming detokenization: push ids one at a time; each push yields the
   newly final text (possibly empty). Only complete UTF-8 is ever returned,
   and the concatenation of all pushes and the final flush is exactly
   ember_tok_decode of all ids (held-back text: incomplete UTF-8, trailing
   spaces a clean-up rule or Strip decoder may still remove, ...). */
int ember_tok_stream_new(const ember_tokenizer *t, unsigned flags, ember_tok_stream **out, ember_error *err);
/* *text points to stream-owned memory valid until the next call on s. */
int ember_tok_stream_push(ember_tok_stream *s, int32_t id, const char **text, size_t *len, ember_error *err);
/* Ends the sequence: returns what was held back. The stream may then be
   reused for a new sequence. */
int ember_tok_stream_flush(ember_tok_stream *s, const char **text, size_t *len, ember_error *err);
void ember_tok_stream_free(ember_tok_stream *s);

/* ---- vocabulary ------------------------------------------------------------ */

/* Size of the id space (vocabulary + added tokens). */
int32_t ember_tok_n_vocab(const ember_tokenizer *t);
ember_tok_kind ember_tok_get_kind(const ember_tokenizer *t);
/* A token's text as stored (e.g. "Ġthe", "▁the", "<|im_end|>"), not NUL-
   terminated; NULL for an id without a token. */
const char *ember_tok_id_text(const ember_tokenizer *t, int32_t id, size_t *len);
/* The id whose stored text is s[0..n), or -1. */
int32_t ember_tok_text_id(const ember_tokenizer *t, const char *s, size_t n);
/* Whether id is a special added token. */
bool ember_tok_is_special(const ember_tokenizer *t, int32_t id);
/* Ids from tokenizer_config.json / GGUF metadata, -1 when unknown. */
int32_t ember_tok_bos_id(const ember_tokenizer *t);
int32_t ember_tok_eos_id(const ember_tokenizer *t);
int32_t ember_tok_pad_id(const ember_tokenizer *t);

#endif
