/*
 * fuzz_toolcall.c - libFuzzer target for the tool-call parsers
 * (src/template/toolcall.c). The first byte picks the format and a split
 * step; the rest is the model's text. The text is parsed in one piece and
 * again in pieces cut every `step` bytes: any crash or sanitizer report is a
 * bug, and so is a difference between the two event sequences (the parser
 * promises that streamed events join into the one-piece result), or a call
 * whose arguments are not a JSON object.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template/toolcall.h"

typedef struct rec {
    char *out;
    size_t n, cap;
    int last;
    char *args;
    size_t an, acap;
} rec;

static void put(char **b, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *n + len + 1) c *= 2;
        char *p = realloc(*b, c);
        if (!p) abort();
        *b = p;
        *cap = c;
    }
    memcpy(*b + *n, s, len);
    *n += len;
    (*b)[*n] = 0;
}

static int sink(void *user, const ember_tool_event *ev) {
    rec *r = user;
    char tag[32];
    switch (ev->kind) {
    case EMBER_TOOL_EV_CONTENT:
        if (r->last != EMBER_TOOL_EV_CONTENT) put(&r->out, &r->n, &r->cap, "\x01", 1);
        put(&r->out, &r->n, &r->cap, ev->text, ev->len);
        break;
    case EMBER_TOOL_EV_CALL_START:
        snprintf(tag, sizeof tag, "\x02%d:", ev->index);
        put(&r->out, &r->n, &r->cap, tag, strlen(tag));
        put(&r->out, &r->n, &r->cap, ev->name, strlen(ev->name));
        r->an = 0;
        break;
    case EMBER_TOOL_EV_CALL_ARGS: /* streamed in pieces: consecutive pieces are one run */
        if (r->last != EMBER_TOOL_EV_CALL_ARGS) put(&r->out, &r->n, &r->cap, "\x03", 1);
        put(&r->out, &r->n, &r->cap, ev->text, ev->len);
        put(&r->args, &r->an, &r->acap, ev->text, ev->len);
        break;
    case EMBER_TOOL_EV_CALL_END: {
        put(&r->out, &r->n, &r->cap, "\x04", 1);
        /* a reported call's arguments are a JSON object, or (a call that broke or was cut off
           after its arguments began streaming) the beginning of one */
        size_t i = 0;
        while (i < r->an && (r->args[i] == ' ' || r->args[i] == '\n' || r->args[i] == '\t' || r->args[i] == '\r')) i++;
        if (r->an && (i == r->an || r->args[i] != '{')) abort();
        json_t *j = json_loadb(r->args ? r->args : "", r->an, JSON_ALLOW_NUL, NULL);
        if (j && !json_is_object(j)) abort();
        json_decref(j);
        break;
    }
    }
    r->last = ev->kind;
    return 0;
}

static void parse(ember_tool_format f, const char *text, size_t n, size_t step, rec *r) {
    memset(r, 0, sizeof *r);
    ember_tool_parser *p = ember_tool_parser_new(f, NULL);
    if (!p) abort();
    ember_error err;
    for (size_t at = 0; at < n; at += step)
        if (ember_tool_parser_feed(p, text + at, n - at < step ? n - at : step, sink, r, &err)) abort();
    if (ember_tool_parser_finish(p, sink, r, &err)) abort();
    ember_tool_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ember_tool_format f = (ember_tool_format)(data[0] % 6);
    size_t step = 1 + (data[0] >> 3) % 7;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    rec whole, pieces;
    parse(f, text, n, n ? n : 1, &whole);
    parse(f, text, n, step, &pieces);
    if (whole.n != pieces.n || (whole.n && memcmp(whole.out, pieces.out, whole.n))) abort();
    if (n && !whole.n) abort(); /* text never vanishes without a call */
    /* nothing is lost: with no calls, the content is the text itself */
    if (whole.n && !memchr(whole.out, '\x02', whole.n) && (whole.n != n + 1 || memcmp(whole.out + 1, text, n)))
        if (!memchr(text, 1, n)) abort();
    free(whole.out);
    free(whole.args);
    free(pieces.out);
    free(pieces.args);
    return 0;
}
