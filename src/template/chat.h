/*
 * chat.h - chat templates: turning a conversation (JSON) into the prompt text
 * a model was trained on, by running the model's Jinja chat template
 * (tokenizer_config.json "chat_template", chat_template.jinja, or a GGUF's
 * tokenizer.chat_template) through the interpreter of jinja.h.
 *
 * Ownership: an ember_chat_template owns its compiled program and is
 * immutable after compilation (render it from any number of threads). A
 * render allocates a private arena for the conversion of the JSON variables
 * and every temporary value, and frees it before returning; the caller owns
 * the returned string. The JSON -> template value conversion lives here, so
 * the interpreter knows nothing of jansson.
 *
 * Rendering follows @huggingface/jinja byte for byte (see jinja.h), including
 * its JavaScript-flavoured details: JSON numbers that are whole (1.0) become
 * integers, object keys that look like array indices come first, as
 * Object.entries orders them.
 */
#ifndef EMBER_TEMPLATE_CHAT_H
#define EMBER_TEMPLATE_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "core/error.h"
#include "template/jinja.h"

typedef struct ember_chat_template ember_chat_template;

/* Options of a render; NULL means all defaults. */
typedef struct ember_chat_opts {
    const struct tm *now; /* what strftime_now() sees; NULL: the local time now */
    jinja_limits limits;  /* zero fields take the defaults of jinja.h */
    bool extensions;      /* Python-Jinja2 features the reference lacks (see
                             jinja_ctx_enable_extensions); off: exactly the
                             reference's behaviour, errors included */
} ember_chat_opts;

/* Compiles a chat template from text (len bytes, need not be
   NUL-terminated). Returns EMBER_OK and sets *out (free with
   ember_chat_template_free), or EMBER_ERR_FORMAT / EMBER_ERR_LIMIT /
   EMBER_ERR_NOMEM with "template:LINE:COL: ..." in err. */
int ember_chat_template_compile(const char *text, size_t len, ember_chat_template **out, ember_error *err);

/* Frees a template (NULL is fine). */
void ember_chat_template_free(ember_chat_template *t);

/* Renders the template with the members of vars (a JSON object) as its
   variables: typically messages (array of {role, content (string or array
   of parts), tool_calls, reasoning_content, ...}), tools, add_generation_prompt,
   bos_token, eos_token, enable_thinking and any other template kwargs.
   Nothing is added or normalized. On EMBER_OK, *out is a malloc'd
   NUL-terminated UTF-8 string (caller frees) of *out_len bytes (out_len may
   be NULL). Errors: EMBER_ERR_INVALID_ARG for bad vars or a template's
   raise_exception() (the message says which), EMBER_ERR_FORMAT for template
   errors with line and column, EMBER_ERR_LIMIT, EMBER_ERR_NOMEM. */
int ember_chat_template_render(const ember_chat_template *t, const json_t *vars, const ember_chat_opts *opts,
                               char **out, size_t *out_len, ember_error *err);

/* Picks a template out of a parsed tokenizer_config.json: "chat_template"
   is either a string or an array of {"name", "template"}; name selects one
   of the array (NULL: "default", else the first). Returns a pointer into
   cfg (borrowed, valid while cfg lives) or NULL when there is none. */
const char *ember_chat_template_from_config(const json_t *cfg, const char *name);

/* What a chat render puts in the template's variables: the one place that
   fills them (the server's chat endpoints, the text API and `ember
   generate` all render through ember_chat_render_input). */
typedef struct ember_chat_input {
    const json_t *messages;     /* the conversation, an array (borrowed) */
    const json_t *tools;        /* the OpenAI-shaped tools array, NULL (or empty): no tools variable */
    const json_t *kwargs;       /* extra variables (chat_template_kwargs: enable_thinking, ...), may be
                                   NULL; the variables below win over a kwarg of the same name */
    bool add_generation_prompt; /* end where the assistant's reply begins */
    const struct ember_tokenizer *tok; /* bos_token / eos_token as its text spells them ("" without
                                          one); NULL: both "" */
} ember_chat_input;

/* Fills the variables of in into a new JSON object *out (the caller
   decrefs): kwargs' members, then messages, tools (when non-empty),
   add_generation_prompt, bos_token and eos_token. Errors: EMBER_ERR_NOMEM,
   EMBER_ERR_INVALID_ARG (messages not an array, tools not an array, kwargs
   not an object). */
int ember_chat_vars(const ember_chat_input *in, json_t **out, ember_error *err);

/* ember_chat_vars, then ember_chat_template_render with the Python Jinja2
   extensions on (they only change renders the reference would refuse, as
   transformers would accept them). Same returns as the render. */
int ember_chat_render_input(const ember_chat_template *t, const ember_chat_input *in, char **out, size_t *out_len,
                            ember_error *err);

#endif
