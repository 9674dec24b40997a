/*
 * input.c - the variables of a chat render (see ember_chat_input in
 * chat.h): the one function that fills them, for the server, the text API
 * and the CLI alike.
 *
 * Ownership: the variables object is new and the caller's; messages, tools
 * and kwargs are added by reference (json_object_set), never copied, so
 * they must not change while the object lives.
 */
#include "template/chat.h"
#include "tok/tokenizer.h"

/* The text of token id as the tokenizer stores it, "" without one. */
static json_t *token_string(const ember_tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *s = tok && id >= 0 ? ember_tok_id_text(tok, id, &n) : NULL;
    return json_stringn_nocheck(s ? s : "", s ? n : 0);
}

int ember_chat_vars(const ember_chat_input *in, json_t **out, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: out is NULL");
    *out = NULL;
    if (!in || !json_is_array(in->messages))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: messages must be an array");
    if (in->tools && !json_is_array(in->tools))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: tools must be an array");
    if (in->kwargs && !json_is_object(in->kwargs))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: the template's keyword arguments must be an object");
    json_t *vars = json_object();
    /* every jansson call that allocates is checked: a variable missing
       from the render would go unnoticed */
    bool oom = !vars;
    if (!oom && in->kwargs) oom = json_object_update(vars, (json_t *)in->kwargs) != 0;
    if (!oom) oom = json_object_set(vars, "messages", (json_t *)in->messages) != 0;
    if (!oom && in->tools && json_array_size(in->tools) > 0)
        oom = json_object_set(vars, "tools", (json_t *)in->tools) != 0;
    if (!oom) oom = json_object_set_new(vars, "add_generation_prompt", json_boolean(in->add_generation_prompt)) != 0;
    if (!oom) oom = json_object_set_new(vars, "bos_token", token_string(in->tok, in->tok ? ember_tok_bos_id(in->tok) : -1)) != 0;
    if (!oom) oom = json_object_set_new(vars, "eos_token", token_string(in->tok, in->tok ? ember_tok_eos_id(in->tok) : -1)) != 0;
    if (oom) {
        json_decref(vars);
        return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    }
    *out = vars;
    return EMBER_OK;
}

int ember_chat_render_input(const ember_chat_template *t, const ember_chat_input *in, char **out, size_t *out_len,
                            ember_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    json_t *vars = NULL;
    int rc = ember_chat_vars(in, &vars, err);
    if (rc) return rc;
    ember_chat_opts o = {0};
    o.extensions = true;
    rc = ember_chat_template_render(t, vars, &o, out, out_len, err);
    json_decref(vars);
    return rc;
}
