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

#endif
