/*
 * load.c - finding and compiling a model's own chat template: a GGUF file's
 * tokenizer.chat_template, or a model directory's chat_template.jinja, else
 * tokenizer_config.json's "chat_template". Used by the text API
 * (src/api/text.c) and the CLI (src/cli/common.c).
 *
 * Ownership: the compiled template goes to the caller; every buffer read
 * here is freed here. No state: safe from any thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "template/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapfile.h"
#include "formats/gguf.h"
#include "template/toolcall.h"

/* A GGUF file's template (none when the file does not open: loading the
   model reports that). */
static int load_gguf(const char *path, ember_chat_template **out, int *tools, ember_error *err) {
    ember_gguf *g = NULL;
    ember_error gerr = {0};
    int orc = ember_gguf_open(path, &g, &gerr);
    if (orc == EMBER_ERR_NOMEM || orc == EMBER_ERR_IO) return ember_err(err, orc, "%s", gerr.msg);
    if (orc) return EMBER_OK;
    const char *src = NULL;
    size_t n = 0;
    int rc = EMBER_OK;
    if (ember_gguf_find_kv(g, "tokenizer.chat_template") &&
        ember_gguf_get_str(g, "tokenizer.chat_template", &src, &n, &gerr) == EMBER_OK) {
        if (tools) *tools = (int)ember_tool_format_detect(src, n);
        if ((rc = ember_chat_template_compile(src, n, out, &gerr)))
            rc = ember_err(err, rc, "%s: chat template does not compile: %s", path, gerr.msg);
    }
    ember_gguf_free(g);
    return rc;
}

int ember_chat_template_load(const char *model, ember_chat_template **out, int *tools, ember_error *err) {
    *out = NULL;
    if (tools) *tools = EMBER_TOOLS_NONE;
    struct stat st;
    if (stat(model, &st) != 0) return EMBER_OK;
    if (!S_ISDIR(st.st_mode)) return load_gguf(model, out, tools, err);
    char p[4096], *text = NULL;
    size_t len = 0;
    ember_error rerr = {0};
    const char *src = NULL;
    json_t *cfg = NULL;
    /* a file that is there but cannot be read (I/O error, no memory) is an
       error, not a model without a template */
    int rc = EMBER_OK;
    snprintf(p, sizeof p, "%.4000s/chat_template.jinja", model);
    if (stat(p, &st) == 0) {
        if ((rc = ember_read_file(p, 4 << 20, &text, &len, &rerr))) return ember_err(err, rc, "%s", rerr.msg);
        src = text;
    } else {
        snprintf(p, sizeof p, "%.4000s/tokenizer_config.json", model);
        if (stat(p, &st) == 0) {
            if ((rc = ember_read_file(p, 64 << 20, &text, &len, &rerr))) return ember_err(err, rc, "%s", rerr.msg);
            cfg = json_loadb(text, len, 0, NULL);
            src = ember_chat_template_from_config(cfg, NULL);
            if (src) len = strlen(src);
        }
    }
    if (src && tools) *tools = (int)ember_tool_format_detect(src, len);
    if (src && (rc = ember_chat_template_compile(src, len, out, &rerr)))
        rc = ember_err(err, rc, "%s: chat template does not compile: %s", p, rerr.msg);
    json_decref(cfg);
    free(text);
    return rc;
}
