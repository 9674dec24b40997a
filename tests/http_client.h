/*
 * http_client.h - a minimal blocking HTTP/1.1 client for tests (one request
 * per connection, "Connection: close"). Test code only: the product uses
 * libmicrohttpd.
 */
#ifndef EMBER_TEST_HTTP_CLIENT_H
#define EMBER_TEST_HTTP_CLIENT_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef struct http_resp {
    int status;  /* 0: no response */
    char *head;  /* status line and headers */
    char *body;  /* de-chunked body, NUL-terminated */
    size_t body_len;
} http_resp;

static inline void http_resp_free(http_resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static inline int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int http_send(int fd, const char *method, const char *path, const char *body, size_t body_len,
                     const char *extra_headers) {
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, extra_headers ? extra_headers : "", body ? body_len : (size_t)0);
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n) return -1;
    size_t off = 0;
    while (body && off < body_len) {
        ssize_t k = send(fd, body + off, body_len - off, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        off += (size_t)k;
    }
    return 0;
}

/* Reads until EOF (or max bytes when max > 0); returns malloc'd raw bytes. */
static inline char *http_read_all(int fd, size_t max, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    for (;;) {
        if (max && n >= max) break;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
        size_t want = cap - n;
        if (max && want > max - n) want = max - n;
        ssize_t k = recv(fd, b + n, want, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* Splits a raw response into status, head and de-chunked body. */
static inline void http_parse(char *raw, size_t n, http_resp *r) {
    memset(r, 0, sizeof *r);
    char *sep = memmem(raw, n, "\r\n\r\n", 4);
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) {
        r->status = 0;
        r->body = calloc(1, 1);
        r->head = calloc(1, 1);
        return;
    }
    r->head = strndup(raw, (size_t)(sep - raw));
    char *p = sep + 4, *end = raw + n;
    bool chunked = strcasestr(r->head, "transfer-encoding: chunked") != NULL;
    r->body = malloc((size_t)(end - p) + 1);
    if (!chunked) {
        memcpy(r->body, p, (size_t)(end - p));
        r->body_len = (size_t)(end - p);
    } else {
        while (p < end) {
            char *e;
            unsigned long sz = strtoul(p, &e, 16);
            char *line_end = memmem(p, (size_t)(end - p), "\r\n", 2);
            if (!line_end || sz == 0) break;
            p = line_end + 2;
            if (sz > (size_t)(end - p)) sz = (size_t)(end - p);
            memcpy(r->body + r->body_len, p, sz);
            r->body_len += sz;
            p += sz + 2;
        }
    }
    r->body[r->body_len] = 0;
}

/* One request; the response is parsed into r (status 0 on failure). */
static inline int http_request(int port, const char *method, const char *path, const char *body, http_resp *r) {
    memset(r, 0, sizeof *r);
    int fd = http_connect(port);
    if (fd < 0) return -1;
    if (http_send(fd, method, path, body, body ? strlen(body) : 0, NULL)) {
        close(fd);
        return -1;
    }
    size_t n;
    char *raw = http_read_all(fd, 0, &n);
    close(fd);
    http_parse(raw, n, r);
    free(raw);
    return 0;
}

static inline const char *http_header(const http_resp *r, const char *name) {
    const char *p = r->head;
    size_t nl = strlen(name);
    while ((p = strchr(p, '\n'))) {
        p++;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') return p + nl + 1;
    }
    return NULL;
}

#endif
