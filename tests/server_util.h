/*
 * server_util.h - what the in-process server tests share (test_server,
 * test_server_tools, test_faults): starting ember_server on a free loopback
 * port, a POST whose answer is parsed as JSON, /health, waiting until the
 * server is idle.
 */
#ifndef EMBER_TEST_SERVER_UTIL_H
#define EMBER_TEST_SERVER_UTIL_H

#include "http_client.h"

#include <jansson.h>

#include "core/mapfile.h"
#include "ember.h"
#include "serve/serve.h"
#include "test.h"

static int g_port; /* the port of the server the test talks to */

/* Starts a server with opts o (its port is chosen here: loopback ports from
   20000 on, spread by pid and salt so that tests running at once differ),
   sets g_port. Exits the test when no port can be had. */
static inline ember_server *server_start(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl,
                                         ember_server_opts *o, int salt) {
    ember_error err = {0};
    for (int attempt = 0; attempt < 50; attempt++) {
        o->port = 20000 + (int)(((unsigned)getpid() * 7u + (unsigned)salt * 7919u + (unsigned)attempt * 131u) % 20000u);
        ember_server *s;
        if (ember_server_start(m, tok, tmpl, o, &s, &err) == EMBER_OK) {
            g_port = o->port;
            return s;
        }
    }
    fprintf(stderr, "cannot start the server: %s\n", err.msg);
    exit(1);
}

/* POST body to path; returns the parsed JSON answer (NULL if not JSON) and
   its status; raw (may be NULL) keeps the whole response (http_resp_free). */
static inline json_t *post(const char *path, const char *body, int *status, http_resp *raw) {
    http_resp r;
    http_request(g_port, "POST", path, body, &r);
    *status = r.status;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    if (raw)
        *raw = r;
    else
        http_resp_free(&r);
    return j;
}

static inline int health(void) {
    http_resp r;
    http_request(g_port, "GET", "/health", NULL, &r);
    int st = r.status;
    http_resp_free(&r);
    return st;
}

/* Waits (up to 10 s) until /metrics shows no running or waiting request and
   no KV in use; false if it never does. */
static inline bool server_wait_idle(void) {
    for (int i = 0; i < 200; i++) {
        http_resp r;
        http_request(g_port, "GET", "/metrics", NULL, &r);
        bool idle = r.body && strstr(r.body, "ember_requests_running 0\n") && strstr(r.body, "ember_requests_waiting 0\n") &&
                    strstr(r.body, "ember_kv_cache_used_bytes 0\n");
        http_resp_free(&r);
        if (idle) return true;
        usleep(50000);
    }
    return false;
}

/* The demo model (random weights; ember mkmodel writes it to EMBER_TEST_TMP/name, d->dir)
   with Qwen2.5's real chat template from shared/testdata, which renders tools and writes
   calls as <tool_call>{json}</tool_call>: what the tool-call server tests run on. */
typedef struct qwen_demo {
    char dir[600];
    ember_model *m;
    ember_tokenizer *tok;
    ember_chat_template *tmpl;
    ember_tool_format fmt; /* detected from the template: hermes */
} qwen_demo;

/* Loads *d; false (the test is skipped, 77) when shared/testdata is absent. */
static inline bool qwen_demo_load(const char *name, qwen_demo *d) {
    memset(d, 0, sizeof *d);
    char tpl_path[1024];
    snprintf(tpl_path, sizeof tpl_path, "%s/testdata/chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja",
             EMBER_SHARED_DIR);
    char *tpl = NULL;
    size_t tpl_len = 0;
    ember_error err = {0};
    if (ember_read_file(tpl_path, 1 << 20, &tpl, &tpl_len, &err)) {
        fprintf(stderr, "skip: %s\n", err.msg);
        return false;
    }
    char cmd[1400];
    snprintf(d->dir, sizeof d->dir, "%s/%s", EMBER_TEST_TMP, name);
    snprintf(cmd, sizeof cmd, "%s mkmodel --preset demo --out %s", EMBER_BIN, d->dir);
    CHECK(system(cmd) == 0);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 2;
    mp.n_ctx = 2048;
    mp.n_threads = 2;
    CHECKF(ember_model_load(d->dir, &mp, &d->m, &err) == EMBER_OK, "%s", err.msg);
    CHECKF(ember_tok_load(d->dir, &d->tok, &err) == EMBER_OK, "%s", err.msg);
    CHECKF(ember_chat_template_compile(tpl, tpl_len, &d->tmpl, &err) == EMBER_OK, "%s", err.msg);
    d->fmt = ember_tool_format_detect(tpl, tpl_len);
    CHECK(d->fmt == EMBER_TOOLS_HERMES);
    free(tpl);
    return true;
}

static inline void qwen_demo_free(qwen_demo *d) {
    ember_chat_template_free(d->tmpl);
    ember_tok_free(d->tok);
    ember_model_free(d->m);
    memset(d, 0, sizeof *d);
}

#endif
