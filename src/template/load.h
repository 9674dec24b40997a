/*
 * load.h - a model's own chat template, found next to its weights.
 */
#ifndef EMBER_TEMPLATE_LOAD_H
#define EMBER_TEMPLATE_LOAD_H

#include "template/chat.h"

/* Reads and compiles the chat template of model (a directory:
   chat_template.jinja, else tokenizer_config.json "chat_template"; a GGUF
   file: tokenizer.chat_template). Returns EMBER_OK with *out NULL when the
   model has none (or the path does not exist: loading the model reports
   that), EMBER_OK with *out set (free with ember_chat_template_free), or the
   compile error ("PATH: chat template does not compile: ...") with *out
   NULL. *tools (may be NULL) receives the tool-call format the template's
   text shows (template/toolcall.h; EMBER_TOOLS_NONE without one).
   Thread-safe (no shared state). */
int ember_chat_template_load(const char *model, ember_chat_template **out, int *tools, ember_error *err);

#endif
