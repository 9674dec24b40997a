/*
 * tok_export.h - a model directory's tokenizer as GGUF metadata.
 */
#ifndef EMBER_MODEL_TOK_EXPORT_H
#define EMBER_MODEL_TOK_EXPORT_H

#include "core/error.h"
#include "formats/gguf_write.h"

/* Adds tokenizer.ggml.* (and tokenizer.chat_template) for the tokenizer.json
   (+ tokenizer_config.json) in dir to g, padding the id space to vocab_size.
   EMBER_ERR_UNSUPPORTED when dir has no tokenizer.json or one of a kind not
   exported (only byte-level BPE with a known pre-tokenizer is). */
int ember_gguf_write_tokenizer(ember_gguf_writer *g, const char *dir, int vocab_size, ember_error *err);

#endif
