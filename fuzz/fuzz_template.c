/*
 * fuzz_template.c - libFuzzer target: compiles arbitrary bytes as a chat
 * template and, when that succeeds, renders it with a small fixed
 * conversation under tight limits. Any crash, hang, leak or sanitizer report
 * is a bug; errors are the expected outcome for most inputs.
 * Build (by the fuzz harness): clang -fsanitize=fuzzer,address,undefined
 * with src/template/jinja*.c src/template/chat.c src/core/error.c src/core/util.c -ljansson -lm.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template/chat.h"

static const char CONTEXT[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \\u00e9 \\ud83d\\ude80\"}]},"
    "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"think\", \"tool_calls\": ["
    "{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": [1.5, null, true]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call00001\", \"content\": \"42\"},"
    "{\"role\": \"user\", \"content\": \"again\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"2\": {}}}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ember_error err;
    ember_chat_template *t = NULL;
    if (ember_chat_template_compile((const char *)data, size, &t, &err) != EMBER_OK) return 0;
    json_error_t je;
    json_t *vars = json_loads(CONTEXT, 0, &je);
    if (vars) {
        struct tm now;
        memset(&now, 0, sizeof now);
        now.tm_year = 124;
        now.tm_mon = 6;
        now.tm_mday = 26;
        ember_chat_opts opts;
        memset(&opts, 0, sizeof opts);
        opts.now = &now;
        opts.limits.max_output = 1u << 20;
        opts.limits.max_memory = 64u << 20;
        opts.limits.max_iterations = 100000;
        opts.limits.max_depth = 200;
        opts.extensions = size & 1; /* both modes */
        char *out = NULL;
        size_t len = 0;
        if (ember_chat_template_render(t, vars, &opts, &out, &len, &err) == EMBER_OK) free(out);
        json_decref(vars);
    }
    ember_chat_template_free(t);
    return 0;
}
