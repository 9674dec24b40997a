/*
 * responses.c - OpenAI's Responses API (POST /v1/responses) over the chat
 * machinery of server.c (see serve_int.h):
 *   - a request's input items, instructions, flat function tools, tool_choice
 *     and text.format become the chat request's messages, tools, tool_choice
 *     and response_format, so that rendering, tool-call parsing and
 *     constrained decoding are the chat endpoint's own;
 *   - the answer becomes output items (messages with output_text parts,
 *     function_call items) and, when streaming, the typed events that build
 *     them (response.created ... response.completed), numbered in order;
 *   - finished conversations are kept in memory for previous_response_id.
 *
 * Ownership: resp_req and resp_out own what they hold until their _free;
 * every jansson call that allocates is checked, and a failure is a 500 (or,
 * mid-stream, a broken stream) rather than a silently missing field.
 */
#include <string.h>

#include "core/alloc.h"
#include "core/jsonutil.h"
#include "core/util.h"
#include "serve_int.h"

#define MAX_CALL_ID 256
#define MAX_ITEMS 100000

/* ---- request ------------------------------------------------------------------------------ */

/* Whether v is absent or JSON null. */
static bool absent(const json_t *v) {
    return !v || json_is_null(v);
}

/* The text parts of an input message's content, as the chat request's
   content parts ([{"type": "text", "text"}]); a string stays a string. */
static json_t *message_content(const json_t *c, size_t i, bad *b) {
    if (json_is_string(c)) {
        json_t *s = json_incref((json_t *)c);
        return s;
    }
    if (!json_is_array(c)) {
        fail(b, 400, "input", "input[%zu].content must be a string or an array of input_text / output_text parts, not %s",
             i, ember_json_type(c));
        return NULL;
    }
    json_t *parts = json_array();
    if (!parts) goto oom;
    size_t k;
    const json_t *p;
    json_array_foreach(c, k, p) {
        const char *ty = json_string_value(json_object_get(p, "type"));
        const json_t *tx = json_object_get(p, "text");
        if (!json_is_object(p) || !ty) {
            fail(b, 400, "input", "input[%zu].content[%zu] must be an object with a 'type'", i, k);
            json_decref(parts);
            return NULL;
        }
        if (strcmp(ty, "input_text") && strcmp(ty, "output_text")) {
            fail(b, 400, "input", "input[%zu].content[%zu]: '%.32s' parts are not supported (input_text, output_text)", i, k,
                 ty);
            json_decref(parts);
            return NULL;
        }
        if (!json_is_string(tx)) {
            fail(b, 400, "input", "input[%zu].content[%zu].text must be a string", i, k);
            json_decref(parts);
            return NULL;
        }
        if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", tx))) {
            json_decref(parts);
            goto oom;
        }
    }
    return parts;
oom:
    fail(b, 500, NULL, "out of memory");
    return NULL;
}

/* A function_call_output's output: a string, or input_text parts joined. */
static json_t *call_output(const json_t *o, size_t i, bad *b) {
    if (json_is_string(o)) return json_incref((json_t *)o);
    if (!json_is_array(o)) {
        fail(b, 400, "input", "input[%zu].output must be a string or an array of input_text parts", i);
        return NULL;
    }
    strbuf sb = {0};
    size_t k;
    const json_t *p;
    json_array_foreach(o, k, p) {
        const char *ty = json_string_value(json_object_get(p, "type"));
        const json_t *tx = json_object_get(p, "text");
        if (!ty || strcmp(ty, "input_text") || !json_is_string(tx)) {
            sb_free(&sb);
            fail(b, 400, "input", "input[%zu].output[%zu] must be an input_text part with a string 'text'", i, k);
            return NULL;
        }
        if (sb_append(&sb, json_string_value(tx), json_string_length(tx))) {
            sb_free(&sb);
            fail(b, 500, NULL, "out of memory");
            return NULL;
        }
    }
    json_t *s = json_stringn(sb.data ? sb.data : "", sb.len);
    sb_free(&sb);
    if (!s) fail(b, 500, NULL, "out of memory");
    return s;
}

/* The call ids (with their function names) of the assistant messages in
   msgs, into ids. */
static int history_calls(const json_t *msgs, json_t *ids) {
    size_t i, k;
    const json_t *m, *tc;
    json_array_foreach(msgs, i, m) {
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            const char *id = json_string_value(json_object_get(tc, "id"));
            const json_t *name = json_object_get(json_object_get(tc, "function"), "name");
            if (id && json_is_string(name) && json_object_set(ids, id, (json_t *)name)) return -1;
        }
    }
    return 0;
}

/* Appends the input (a string, or items) to convo as chat messages. Calls
   follow the assistant message before them (one message with tool_calls, as
   chat templates expect); outputs must answer a call of the input or of the
   history. first_new: where this request's messages begin in convo. */
static int input_messages(const json_t *input, json_t *convo, size_t first_new, bad *b) {
    if (json_is_string(input))
        return json_array_append_new(convo, json_pack("{s:s, s:O}", "role", "user", "content", input))
                   ? fail(b, 500, NULL, "out of memory")
                   : 0;
    if (!json_is_array(input) || json_array_size(input) == 0)
        return fail(b, 400, "input", "'input' must be a string or a non-empty array of input items, not %s",
                    json_is_array(input) ? "an empty array" : ember_json_type(input));
    if (json_array_size(input) > MAX_ITEMS) return fail(b, 400, "input", "'input' holds too many items");
    json_t *ids = json_object();
    if (!ids || history_calls(convo, ids)) {
        json_decref(ids);
        return fail(b, 500, NULL, "out of memory");
    }
    int rc = 0;
    size_t i;
    const json_t *it;
    json_array_foreach(input, i, it) {
        if (!json_is_object(it)) {
            rc = fail(b, 400, "input", "input[%zu] must be an object, not %s", i, ember_json_type(it));
            break;
        }
        const json_t *tyv = json_object_get(it, "type");
        if (!absent(tyv) && !json_is_string(tyv)) {
            rc = fail(b, 400, "input", "input[%zu].type must be a string", i);
            break;
        }
        const char *ty = absent(tyv) ? "message" : json_string_value(tyv);
        json_t *msg = NULL;
        if (!strcmp(ty, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer"))) {
                rc = fail(b, 400, "input", "input[%zu].role must be user, assistant, system or developer", i);
                break;
            }
            json_t *content = message_content(json_object_get(it, "content"), i, b);
            if (!content) {
                rc = -1;
                break;
            }
            msg = json_pack("{s:s, s:o}", "role", role, "content", content);
        } else if (!strcmp(ty, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                         *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > MAX_CALL_ID) {
                rc = fail(b, 400, "input", "input[%zu].call_id must be a string of 1 to %d bytes", i, MAX_CALL_ID);
                break;
            }
            if (!json_is_string(name) || !json_is_string(args)) {
                rc = fail(b, 400, "input", "input[%zu]: a function_call needs a string 'name' and 'arguments' (JSON text)", i);
                break;
            }
            json_error_t je;
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
            bool is_obj = json_is_object(parsed);
            json_decref(parsed);
            if (!is_obj) {
                rc = parsed || json_error_code(&je) != json_error_out_of_memory
                         ? fail(b, 400, "input", "input[%zu].arguments must be JSON text of an object", i)
                         : fail(b, 500, NULL, "out of memory");
                break;
            }
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name", name,
                                     "arguments", args);
            if (!call || json_object_set(ids, json_string_value(id), (json_t *)name)) {
                json_decref(call);
                rc = fail(b, 500, NULL, "out of memory");
                break;
            }
            /* the assistant message just before takes the call; else one of its own */
            size_t n = json_array_size(convo);
            json_t *last = n > first_new ? json_array_get(convo, n - 1) : NULL;
            const char *lr = json_string_value(json_object_get(last, "role"));
            if (lr && !strcmp(lr, "assistant")) {
                json_t *calls = json_object_get(last, "tool_calls");
                if (!calls) {
                    calls = json_array();
                    if (json_object_set_new(last, "tool_calls", calls)) calls = NULL;
                }
                if (!calls || json_array_append_new(calls, call)) {
                    rc = fail(b, 500, NULL, "out of memory");
                    break;
                }
                continue;
            }
            msg = json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content", "tool_calls", call);
        } else if (!strcmp(ty, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id");
            if (!json_is_string(id)) {
                rc = fail(b, 400, "input", "input[%zu].call_id must be a string", i);
                break;
            }
            const json_t *name = json_object_get(ids, json_string_value(id));
            if (!name) {
                rc = fail(b, 400, "input",
                          "input[%zu]: call_id '%.64s' answers no function_call of the input or of the previous response", i,
                          json_string_value(id));
                break;
            }
            json_t *out = call_output(json_object_get(it, "output"), i, b);
            if (!out) {
                rc = -1;
                break;
            }
            msg = json_pack("{s:s, s:O, s:O, s:o}", "role", "tool", "tool_call_id", id, "name", name, "content", out);
        } else {
            rc = fail(b, 400, "input",
                      "input[%zu]: items of type '%.32s' are not supported (message, function_call, function_call_output)", i,
                      ty);
            break;
        }
        if (!msg || json_array_append_new(convo, msg)) {
            rc = fail(b, 500, NULL, "out of memory");
            break;
        }
    }
    json_decref(ids);
    return rc;
}

/* Flat function tools ({"type": "function", "name", "description",
   "parameters", "strict"}) in the chat request's shape; names and schemas
   are the chat validation's to check. */
static int chat_tools(const json_t *tools, json_t *view, bad *b) {
    if (absent(tools)) return 0;
    if (!json_is_array(tools)) return fail(b, 400, "tools", "'tools' must be an array, not %s", ember_json_type(tools));
    json_t *out = json_array();
    if (!out || json_object_set_new(view, "tools", out)) return fail(b, 500, NULL, "out of memory");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !ty) return fail(b, 400, "tools", "tools[%zu] must be an object with a 'type'", i);
        if (strcmp(ty, "function"))
            return fail(b, 400, "tools", "tools[%zu]: only function tools are supported, not '%.40s'", i, ty);
        json_t *fn = json_object();
        static const char *const keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; fn && k < sizeof keys / sizeof keys[0]; k++) {
            json_t *v = json_object_get(t, keys[k]);
            if (v && json_object_set(fn, keys[k], v)) {
                json_decref(fn);
                fn = NULL;
            }
        }
        if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
            return fail(b, 500, NULL, "out of memory");
    }
    return 0;
}

/* tool_choice: the strings as they are, {"type": "function", "name"} as the
   chat request's named choice. */
static int chat_tool_choice(const json_t *tc, json_t *view, bad *b) {
    if (absent(tc)) return 0;
    json_t *v = NULL;
    if (json_is_string(tc)) {
        v = json_incref((json_t *)tc);
    } else if (json_is_object(tc)) {
        const char *ty = json_string_value(json_object_get(tc, "type"));
        const json_t *name = json_object_get(tc, "name");
        if (!ty || strcmp(ty, "function"))
            return fail(b, 400, "tool_choice", "tool_choice.type must be \"function\" (only function tools are supported)");
        if (!json_is_string(name)) return fail(b, 400, "tool_choice", "a named tool_choice is {\"type\": \"function\", \"name\": ...}");
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return fail(b, 400, "tool_choice", "'tool_choice' must be a string or an object, not %s", ember_json_type(tc));
    }
    if (!v || json_object_set_new(view, "tool_choice", v)) return fail(b, 500, NULL, "out of memory");
    return 0;
}

/* text.format as the chat request's response_format. */
static int chat_format(const json_t *text, json_t *view, bad *b) {
    if (absent(text)) return 0;
    if (!json_is_object(text)) return fail(b, 400, "text", "'text' must be an object, not %s", ember_json_type(text));
    const json_t *f = json_object_get(text, "format");
    if (absent(f)) return 0;
    const char *ty = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !ty) return fail(b, 400, "text.format", "'text.format' must be an object with a 'type'");
    json_t *rf;
    if (!strcmp(ty, "text") || !strcmp(ty, "json_object")) {
        rf = json_pack("{s:s}", "type", ty);
    } else if (!strcmp(ty, "json_schema")) {
        const json_t *name = json_object_get(f, "name"), *schema = json_object_get(f, "schema"),
                     *strict = json_object_get(f, "strict");
        if (!json_is_string(name)) return fail(b, 400, "text.format", "text.format of type json_schema needs a string 'name'");
        if (!json_is_object(schema)) return fail(b, 400, "text.format", "text.format.schema must be an object (a JSON schema)");
        if (!absent(strict) && !json_is_boolean(strict)) return fail(b, 400, "text.format", "text.format.strict must be a boolean");
        rf = json_pack("{s:s, s:{s:O, s:O}}", "type", "json_schema", "json_schema", "name", name, "schema", schema);
    } else {
        return fail(b, 400, "text.format", "text.format.type must be text, json_object or json_schema, not '%.32s'", ty);
    }
    if (!rf || json_object_set_new(view, "response_format", rf)) return fail(b, 500, NULL, "out of memory");
    return 0;
}

/* Fields of the Responses API that ember does not implement and that would
   change the answer: refused rather than ignored. */
static int refuse_unsupported(const json_t *body, bad *b) {
    const json_t *bg = json_object_get(body, "background");
    if (!absent(bg) && !json_is_boolean(bg)) return fail(b, 400, "background", "'background' must be a boolean");
    if (json_is_true(bg)) return fail(b, 400, "background", "background responses are not supported");
    if (!absent(json_object_get(body, "conversation")))
        return fail(b, 400, "conversation", "'conversation' is not supported; continue with 'previous_response_id'");
    if (!absent(json_object_get(body, "prompt")))
        return fail(b, 400, "prompt", "stored prompt templates ('prompt') are not supported");
    const json_t *tl = json_object_get(body, "top_logprobs");
    if (!absent(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0))
        return fail(b, 400, "top_logprobs", "'top_logprobs' is not supported on /v1/responses");
    const json_t *inc = json_object_get(body, "include");
    if (!absent(inc) && !json_is_array(inc)) return fail(b, 400, "include", "'include' must be an array of strings");
    return 0;
}

/* The request's metadata: at most 16 string values (keys up to 64 bytes,
   values up to 512), as OpenAI accepts them. */
static int check_metadata(const json_t *md, bad *b) {
    if (absent(md)) return 0;
    if (!json_is_object(md) || json_object_size(md) > 16)
        return fail(b, 400, "metadata", "'metadata' must be an object of at most 16 string values");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)md, k, v) {
        if (strlen(k) > 64 || !json_is_string(v) || json_string_length(v) > 512)
            return fail(b, 400, "metadata", "metadata keys are at most 64 bytes and values strings of at most 512 bytes");
    }
    return 0;
}

/* body's value of key, or dflt (a new reference either way; NULL only when
   out of memory). */
static json_t *echo(const json_t *body, const char *key, json_t *dflt) {
    json_t *v = json_object_get(body, key);
    if (!absent(v)) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

/* The response object as the request makes it: everything but id, created_at,
   model, output and usage echoes the request. */
static json_t *response_echo(const json_t *body, bool store) {
    const json_t *text = json_object_get(body, "text");
    const json_t *fmt = json_object_get(text, "format");
    json_t *pt = json_object_get(body, "parallel_tool_calls");
    return json_pack("{s:s, s:s, s:i, s:s, s:b, s:n, s:n, s:o, s:o, s:o, s:s, s:[], s:b, s:o, s:o, s:s, s:b, s:o, "
                     "s:{s:o}, s:o, s:o, s:o, s:o, s:n, s:o}",
                     "id", "", "object", "response", "created_at", 0, "status", "in_progress", "background", 0, "error",
                     "incomplete_details", "instructions", echo(body, "instructions", json_null()), "max_output_tokens",
                     echo(body, "max_output_tokens", json_null()), "max_tool_calls",
                     echo(body, "max_tool_calls", json_null()), "model", "", "output", "parallel_tool_calls",
                     !json_is_false(pt), "previous_response_id", echo(body, "previous_response_id", json_null()),
                     "reasoning", echo(body, "reasoning", json_pack("{s:n, s:n}", "effort", "summary")), "service_tier",
                     "default", "store", store, "temperature", echo(body, "temperature", json_real(1.0)), "text",
                     "format", absent(fmt) ? json_pack("{s:s}", "type", "text") : json_incref((json_t *)fmt),
                     "tool_choice", echo(body, "tool_choice", json_string("auto")), "tools",
                     echo(body, "tools", json_array()), "top_p", echo(body, "top_p", json_real(1.0)), "truncation",
                     echo(body, "truncation", json_string("disabled")), "usage", "metadata",
                     echo(body, "metadata", json_object()));
}

int resp_translate(const json_t *body, const json_t *history, resp_req *out, bad *b) {
    memset(out, 0, sizeof *out);
    if (refuse_unsupported(body, b) || check_metadata(json_object_get(body, "metadata"), b)) return -1;
    const json_t *st = json_object_get(body, "store"), *instr = json_object_get(body, "instructions"),
                 *input = json_object_get(body, "input"), *reasoning = json_object_get(body, "reasoning");
    if (!absent(st) && !json_is_boolean(st)) return fail(b, 400, "store", "'store' must be a boolean, not %s", ember_json_type(st));
    out->store = !json_is_false(st);
    if (!absent(instr) && !json_is_string(instr))
        return fail(b, 400, "instructions", "'instructions' must be a string, not %s", ember_json_type(instr));
    if (!absent(reasoning) && !json_is_object(reasoning))
        return fail(b, 400, "reasoning", "'reasoning' must be an object, not %s", ember_json_type(reasoning));
    const json_t *tr = json_object_get(body, "truncation");
    if (!absent(tr) && !(json_is_string(tr) && (!strcmp(json_string_value(tr), "auto") ||
                                                !strcmp(json_string_value(tr), "disabled"))))
        return fail(b, 400, "truncation", "'truncation' must be \"auto\" or \"disabled\"");
    if (!input) return fail(b, 400, "input", "'input' is required");
    out->view = json_object();
    out->convo = json_array();
    json_t *msgs = json_array();
    if (!out->view || !out->convo || !msgs || json_object_set_new(out->view, "messages", msgs) ||
        (history && json_array_extend(out->convo, (json_t *)history))) {
        if (!out->view) json_decref(msgs);
        fail(b, 500, NULL, "out of memory");
        goto bad;
    }
    out->n_history = json_array_size(out->convo);
    if (input_messages(input, out->convo, out->n_history, b)) goto bad;
    if ((json_is_string(instr) &&
         json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", instr))) ||
        json_array_extend(msgs, out->convo)) {
        fail(b, 500, NULL, "out of memory");
        goto bad;
    }
    if (chat_tools(json_object_get(body, "tools"), out->view, b) ||
        chat_tool_choice(json_object_get(body, "tool_choice"), out->view, b) ||
        chat_format(json_object_get(body, "text"), out->view, b))
        goto bad;
    json_t *ptc = json_object_get(body, "parallel_tool_calls");
    if (ptc && json_object_set(out->view, "parallel_tool_calls", ptc)) {
        fail(b, 500, NULL, "out of memory");
        goto bad;
    }
    out->response = response_echo(body, out->store);
    if (!out->response) {
        fail(b, 500, NULL, "out of memory");
        goto bad;
    }
    return 0;
bad:
    resp_req_free(out);
    return -1;
}

void resp_req_free(resp_req *q) {
    json_decref(q->view);
    json_decref(q->convo);
    json_decref(q->response);
    memset(q, 0, sizeof *q);
}

/* ---- response ------------------------------------------------------------------------------- */

/* Sends ev (consumed) with its sequence number; streaming only (EMIT). */
static void emit(resp_out *o, const char *type, json_t *ev) {
    if (!ev || json_object_set_new(ev, "sequence_number", json_integer(o->seq))) {
        json_decref(ev);
        o->failed = true;
        return;
    }
    o->seq++;
    if (o->emit(o->user, type, ev)) o->failed = true;
}

/* An event when streaming: its JSON is not even made otherwise. */
#define EMIT(o, type, ev)                   \
    do {                                    \
        if ((o)->emit) emit(o, type, (ev)); \
    } while (0)

static json_t *output(const resp_out *o) {
    return json_object_get(o->resp, "output");
}

static int out_index(const resp_out *o) {
    return (int)json_array_size(output(o));
}

/* A new item's id: its kind's prefix, the response's id, its index. */
static json_t *item_id(const resp_out *o, const char *prefix) {
    const char *rid = json_string_value(json_object_get(o->resp, "id"));
    if (rid && !strncmp(rid, "resp_", 5)) rid += 5;
    char id[96];
    snprintf(id, sizeof id, "%s_%.60s_%d", prefix, rid ? rid : "", out_index(o));
    return json_string(id);
}

static const char *open_id(const resp_out *o) {
    return json_string_value(json_object_get(o->item, "id"));
}

void resp_out_start(resp_out *o, json_t *resp, resp_emit_fn emit_fn, void *user) {
    memset(o, 0, sizeof *o);
    o->resp = resp;
    o->emit = emit_fn;
    o->user = user;
    if (!resp) o->failed = true;
    if (!o->emit || !resp) return;
    EMIT(o, "response.created", json_pack("{s:s, s:o}", "type", "response.created", "response", json_deep_copy(resp)));
    EMIT(o, "response.in_progress",
         json_pack("{s:s, s:o}", "type", "response.in_progress", "response", json_deep_copy(resp)));
}

static json_t *text_part(const resp_out *o) {
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text",
                     ember_json_string_clean(o->text.data ? o->text.data : "", o->text.len), "annotations", "logprobs");
}

static void open_message(resp_out *o) {
    o->text.len = 0;
    o->item = json_pack("{s:o, s:s, s:s, s:s, s:[]}", "id", item_id(o, "msg"), "type", "message", "status",
                        "in_progress", "role", "assistant", "content");
    o->msg_open = true;
    if (!o->item) {
        o->failed = true;
        return;
    }
    int idx = out_index(o);
    EMIT(o, "response.output_item.added", json_pack("{s:s, s:i, s:O}", "type", "response.output_item.added",
                                                    "output_index", idx, "item", o->item));
    EMIT(o, "response.content_part.added",
         json_pack("{s:s, s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "type", "response.content_part.added", "item_id",
                   open_id(o), "output_index", idx, "content_index", 0, "part", "type", "output_text", "text", "",
                   "annotations", "logprobs"));
}

static void close_message(resp_out *o, const char *status) {
    o->msg_open = false;
    if (!o->item) return;
    int idx = out_index(o);
    json_t *part = text_part(o);
    if (!part || json_object_set_new(o->item, "status", json_string(status)) ||
        json_array_append(json_object_get(o->item, "content"), part))
        o->failed = true;
    if (part) {
        EMIT(o, "response.output_text.done",
             json_pack("{s:s, s:s, s:i, s:i, s:O, s:[]}", "type", "response.output_text.done", "item_id", open_id(o),
                       "output_index", idx, "content_index", 0, "text", json_object_get(part, "text"), "logprobs"));
        EMIT(o, "response.content_part.done",
             json_pack("{s:s, s:s, s:i, s:i, s:O}", "type", "response.content_part.done", "item_id", open_id(o),
                       "output_index", idx, "content_index", 0, "part", part));
    }
    json_decref(part);
    EMIT(o, "response.output_item.done",
         json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", idx, "item", o->item));
    if (json_array_append_new(output(o), o->item)) o->failed = true;
    o->item = NULL;
}

void resp_out_text(resp_out *o, const char *text, size_t len) {
    if (!len) return;
    if (!o->msg_open) open_message(o);
    if (sb_append(&o->text, text, len)) o->failed = true;
    if (o->item)
        EMIT(o, "response.output_text.delta",
             json_pack("{s:s, s:s, s:i, s:i, s:o, s:[]}", "type", "response.output_text.delta", "item_id", open_id(o),
                       "output_index", out_index(o), "content_index", 0, "delta", ember_json_string_clean(text, len),
                       "logprobs"));
}

void resp_out_call_start(resp_out *o, const char *call_id, const char *name) {
    if (o->call_open) resp_out_call_end(o);
    if (o->msg_open) close_message(o, "completed");
    o->args.len = 0;
    o->call_open = true;
    o->item = json_pack("{s:o, s:s, s:s, s:s, s:s, s:s}", "id", item_id(o, "fc"), "type", "function_call", "status",
                        "in_progress", "call_id", call_id, "name", name, "arguments", "");
    if (!o->item) {
        o->failed = true;
        return;
    }
    EMIT(o, "response.output_item.added", json_pack("{s:s, s:i, s:O}", "type", "response.output_item.added",
                                                    "output_index", out_index(o), "item", o->item));
}

void resp_out_call_args(resp_out *o, const char *text, size_t len) {
    if (!o->call_open || !len) return;
    if (sb_append(&o->args, text, len)) o->failed = true;
    if (o->item)
        EMIT(o, "response.function_call_arguments.delta",
             json_pack("{s:s, s:s, s:i, s:o}", "type", "response.function_call_arguments.delta", "item_id", open_id(o),
                       "output_index", out_index(o), "delta", ember_json_string_clean(text, len)));
}

void resp_out_call_end(resp_out *o) {
    if (!o->call_open) return;
    o->call_open = false;
    if (!o->item) return;
    int idx = out_index(o);
    json_t *args = ember_json_string_clean(o->args.data ? o->args.data : "", o->args.len);
    if (!args || json_object_set(o->item, "arguments", args) ||
        json_object_set_new(o->item, "status", json_string("completed")))
        o->failed = true;
    if (args)
        EMIT(o, "response.function_call_arguments.done",
             json_pack("{s:s, s:s, s:i, s:O, s:O}", "type", "response.function_call_arguments.done", "item_id",
                       open_id(o), "output_index", idx, "name", json_object_get(o->item, "name"), "arguments", args));
    json_decref(args);
    EMIT(o, "response.output_item.done",
         json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", idx, "item", o->item));
    if (json_array_append_new(output(o), o->item)) o->failed = true;
    o->item = NULL;
}

void resp_out_finish(resp_out *o, const char *reason, json_t *usage) {
    if (o->call_open) resp_out_call_end(o);
    if (!o->msg_open && out_index(o) == 0) open_message(o); /* nothing at all: one empty message */
    if (o->msg_open) close_message(o, reason ? "incomplete" : "completed");
    json_t *details = reason ? json_pack("{s:s}", "reason", reason) : json_null();
    if (!usage || !details || json_object_set_new(o->resp, "status", json_string(reason ? "incomplete" : "completed")) ||
        json_object_set_new(o->resp, "incomplete_details", details) || json_object_set_new(o->resp, "usage", usage))
        o->failed = true;
    const char *type = reason ? "response.incomplete" : "response.completed";
    EMIT(o, type, json_pack("{s:s, s:O}", "type", type, "response", o->resp));
}

void resp_out_fail(resp_out *o, const char *message) {
    EMIT(o, "error", json_pack("{s:s, s:s, s:s, s:n}", "type", "error", "code", "server_error", "message", message, "param"));
    if (json_object_set_new(o->resp, "status", json_string("failed")) ||
        json_object_set_new(o->resp, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", message)))
        o->failed = true;
    EMIT(o, "response.failed", json_pack("{s:s, s:O}", "type", "response.failed", "response", o->resp));
}

json_t *resp_out_message(const resp_out *o) {
    strbuf text = {0};
    json_t *calls = json_array();
    bool ok = calls != NULL;
    size_t i;
    const json_t *it;
    json_array_foreach(output(o), i, it) {
        const char *ty = json_string_value(json_object_get(it, "type"));
        if (ty && !strcmp(ty, "message")) {
            const json_t *t = json_object_get(json_array_get(json_object_get(it, "content"), 0), "text");
            ok = ok && json_is_string(t) && !sb_append(&text, json_string_value(t), json_string_length(t));
        } else if (ty && !strcmp(ty, "function_call")) {
            ok = ok && !json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                                              json_object_get(it, "call_id"), "type", "function",
                                                              "function", "name", json_object_get(it, "name"),
                                                              "arguments", json_object_get(it, "arguments")));
        }
    }
    json_t *m = NULL;
    if (ok) {
        bool calls_only = text.len == 0 && json_array_size(calls) > 0;
        m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                      calls_only ? json_null() : json_stringn(text.data ? text.data : "", text.len));
        if (m && json_array_size(calls) && json_object_set(m, "tool_calls", calls)) {
            json_decref(m);
            m = NULL;
        }
    }
    sb_free(&text);
    json_decref(calls);
    return m;
}

void resp_out_free(resp_out *o) {
    json_decref(o->resp);
    json_decref(o->item);
    sb_free(&o->text);
    sb_free(&o->args);
    memset(o, 0, sizeof *o);
}

/* ---- the store ------------------------------------------------------------------------------------ */

struct resp_entry {
    resp_entry *next;
    char id[64];
    json_t *convo;    /* the conversation, for previous_response_id */
    json_t *response; /* the final response object, for GET /v1/responses/{id} */
    size_t bytes;
};

void resp_store_init(resp_store *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
}

/* Unlinks e (prev: the entry before it, NULL for the head) and frees it. */
static void drop(resp_store *st, resp_entry *prev, resp_entry *e) {
    if (prev)
        prev->next = e->next;
    else
        st->head = e->next;
    if (st->tail == e) st->tail = prev;
    st->n--;
    st->bytes -= e->bytes;
    json_decref(e->convo);
    json_decref(e->response);
    free(e);
}

void resp_store_free(resp_store *st) {
    while (st->head) drop(st, NULL, st->head);
    pthread_mutex_destroy(&st->mu);
}

int resp_store_put(resp_store *st, const char *id, json_t *convo, const json_t *response, size_t bytes) {
    resp_entry *e = ember_calloc(1, sizeof *e);
    if (!e) return -1;
    /* a copy: the answer's own object is still referenced by its events */
    e->response = json_deep_copy(response);
    if (!e->response) {
        free(e);
        return -1;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->convo = json_incref(convo);
    e->bytes = bytes + json_dumpb(response, NULL, 0, JSON_COMPACT);
    pthread_mutex_lock(&st->mu);
    if (st->tail)
        st->tail->next = e;
    else
        st->head = e;
    st->tail = e;
    st->n++;
    st->bytes += bytes;
    while (st->head != e && (st->n > RESP_STORE_MAX || st->bytes > RESP_STORE_BYTES)) drop(st, NULL, st->head);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

json_t *resp_store_get(resp_store *st, const char *id, bool response) {
    json_t *c = NULL;
    pthread_mutex_lock(&st->mu);
    for (resp_entry *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) {
            c = json_incref(response ? e->response : e->convo);
            break;
        }
    pthread_mutex_unlock(&st->mu);
    return c;
}

bool resp_store_delete(resp_store *st, const char *id) {
    bool found = false;
    pthread_mutex_lock(&st->mu);
    for (resp_entry *e = st->head, *prev = NULL; e; prev = e, e = e->next)
        if (!strcmp(e->id, id)) {
            drop(st, prev, e);
            found = true;
            break;
        }
    pthread_mutex_unlock(&st->mu);
    return found;
}
