/*
 * loadgen.c - a load generator for OpenAI-compatible servers (ember serve,
 * llama-server, ...): C concurrent streaming /v1/completions clients on
 * loopback, a bounded number of requests and a time limit. Reports aggregate
 * output tokens/s, time to first token and inter-token latency (p50 / p99).
 *
 * usage: loadgen --port P [--concurrency 4] [--requests 32] [--prompt-len 128]
 *                [--max-tokens 128] [--vocab 32000] [--timeout 600]
 *                [--temperature 0] [--top-p 1] [--seed 0] [--json]
 *
 * Prompts are random token ids below --vocab (so no tokenizer differences
 * enter; request i's prompt is the same in every run with the same --seed;
 * another seed gives other prompts, which a server's prefix cache cannot
 * have seen in an earlier run), sent as
 * {"prompt": [ids], "max_tokens": N, "stream": true, "ignore_eos": true,
 *  "temperature": 0, "stream_options": {"include_usage": true}}.
 * --temperature T > 0 samples instead: "temperature": T, "top_p": P (from
 * --top-p), "top_k": 0 and "min_p": 0 (so no server adds filters of its
 * own) and "seed": the request's index.
 * Output tokens come from each response's final usage when present,
 * otherwise from the number of SSE chunks. TTFT is measured from sending the
 * request to the first chunk carrying text; ITL is the gap between
 * consecutive text chunks. "short_requests" counts the answers with fewer
 * output tokens than max_tokens (a server that stopped early).
 *
 * Loopback only (127.0.0.1): it is a benchmark, not a stress tool for
 * other hosts.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int g_port = 8080, g_conc = 4, g_requests = 32, g_prompt = 128, g_max_tokens = 128, g_vocab = 32000;
static double g_timeout = 600, g_temp = 0, g_top_p = 1;
static unsigned g_seed = 0;
static bool g_json = false;
static atomic_int g_next;
static double g_deadline;

typedef struct stats {
    double *ttft, *itl;
    size_t n_ttft, n_itl, cap_itl;
    long tokens, errors, done, short_reqs; /* short: fewer output tokens than max_tokens */
} stats;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int connect_local(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {600, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void add_itl(stats *s, double v) {
    if (s->n_itl == s->cap_itl) {
        s->cap_itl = s->cap_itl ? s->cap_itl * 2 : 4096;
        s->itl = realloc(s->itl, s->cap_itl * sizeof *s->itl);
    }
    s->itl[s->n_itl++] = v;
}

/* One streaming request; returns 0 on success. */
static int one_request(unsigned *seed, int index, stats *st) {
    char *body = malloc((size_t)g_prompt * 8 + 512);
    int n = sprintf(body, "{\"prompt\":[");
    for (int i = 0; i < g_prompt; i++) {
        *seed = *seed * 1103515245u + 12345u;
        n += sprintf(body + n, "%s%u", i ? "," : "", (*seed >> 8) % (unsigned)(g_vocab - 3));
    }
    if (g_temp > 0)
        n += sprintf(body + n, "],\"temperature\":%g,\"top_p\":%g,\"top_k\":0,\"min_p\":0,\"seed\":%d", g_temp,
                     g_top_p, index);
    else
        n += sprintf(body + n, "],\"temperature\":0");
    n += sprintf(body + n,
                 ",\"max_tokens\":%d,\"stream\":true,\"ignore_eos\":true,"
                 "\"stream_options\":{\"include_usage\":true}}",
                 g_max_tokens);
    int fd = connect_local();
    if (fd < 0) {
        free(body);
        return -1;
    }
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
                      "application/json\r\nContent-Length: %d\r\n\r\n",
                      n);
    double t0 = now();
    if (send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn || send(fd, body, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        free(body);
        return -1;
    }
    free(body);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    double t_prev = 0;
    bool first = true, ok_status = false, header_done = false;
    long chunks = 0, usage_tokens = -1;
    size_t scan = 0;
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t k = recv(fd, buf + len, cap - len, 0);
        if (k <= 0) break;
        double t = now();
        len += (size_t)k;
        buf[len] = 0;
        if (!header_done) {
            char *e = strstr(buf, "\r\n\r\n");
            if (!e) continue;
            header_done = true;
            ok_status = strncmp(buf, "HTTP/1.1 200", 12) == 0 || strncmp(buf, "HTTP/1.0 200", 12) == 0;
            scan = (size_t)(e + 4 - buf);
        }
        /* each "data: {...}" line is one event; count those with text */
        char *p;
        while ((p = strstr(buf + scan, "data: ")) && strchr(p, '\n')) {
            char *eol = strchr(p, '\n');
            *eol = 0;
            char *u = strstr(p, "\"completion_tokens\":");
            if (u) usage_tokens = strtol(u + 20, NULL, 10);
            char *tx = strstr(p, "\"text\":\"");
            bool has_text = tx && tx[8] != '"';
            if (has_text) {
                chunks++;
                if (first) {
                    st->ttft[st->n_ttft++] = t - t0;
                    first = false;
                } else {
                    add_itl(st, t - t_prev);
                }
                t_prev = t;
            }
            *eol = '\n';
            scan = (size_t)(eol + 1 - buf);
        }
    }
    close(fd);
    free(buf);
    if (!ok_status || first) return -1;
    long got = usage_tokens >= 0 ? usage_tokens : chunks;
    st->tokens += got;
    if (got < g_max_tokens) st->short_reqs++;
    return 0;
}

static void *worker(void *arg) {
    stats *st = arg;
    for (;;) {
        int i = atomic_fetch_add(&g_next, 1);
        if (i >= g_requests || now() > g_deadline) break;
        unsigned seed = 0x9e3779b9u * (unsigned)(i + 1) ^ 0x85ebca6bu * g_seed; /* request i's prompt: the same per --seed */
        if (one_request(&seed, i, st))
            st->errors++;
        else
            st->done++;
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmp);
    size_t i = (size_t)ceil(p / 100.0 * (double)n);
    return v[i ? i - 1 : 0];
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            g_json = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "loadgen: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--port")) g_port = atoi(v);
        else if (!strcmp(a, "--concurrency")) g_conc = atoi(v);
        else if (!strcmp(a, "--requests")) g_requests = atoi(v);
        else if (!strcmp(a, "--prompt-len")) g_prompt = atoi(v);
        else if (!strcmp(a, "--max-tokens")) g_max_tokens = atoi(v);
        else if (!strcmp(a, "--vocab")) g_vocab = atoi(v);
        else if (!strcmp(a, "--timeout")) g_timeout = atof(v);
        else if (!strcmp(a, "--temperature")) g_temp = atof(v);
        else if (!strcmp(a, "--top-p")) g_top_p = atof(v);
        else if (!strcmp(a, "--seed")) g_seed = (unsigned)strtoul(v, NULL, 10);
        else {
            fprintf(stderr, "loadgen: unknown option %s\n", a);
            return 2;
        }
    }
    if (g_conc < 1 || g_conc > 1024 || g_requests < 1 || g_prompt < 1 || g_max_tokens < 1 || g_vocab < 256 ||
        g_port < 1 || g_port > 65535 || !(g_temp >= 0 && g_temp <= 100) || !(g_top_p > 0 && g_top_p <= 1)) {
        fprintf(stderr, "loadgen: bad arguments\n");
        return 2;
    }
    stats *st = calloc((size_t)g_conc, sizeof *st);
    pthread_t *th = calloc((size_t)g_conc, sizeof *th);
    for (int i = 0; i < g_conc; i++) st[i].ttft = calloc((size_t)g_requests, sizeof(double));
    double t0 = now();
    g_deadline = t0 + g_timeout;
    for (int i = 0; i < g_conc; i++) pthread_create(&th[i], NULL, worker, &st[i]);
    for (int i = 0; i < g_conc; i++) pthread_join(th[i], NULL);
    double wall = now() - t0;
    stats all = {0};
    all.ttft = calloc((size_t)g_requests, sizeof(double));
    for (int i = 0; i < g_conc; i++) {
        memcpy(all.ttft + all.n_ttft, st[i].ttft, st[i].n_ttft * sizeof(double));
        all.n_ttft += st[i].n_ttft;
        for (size_t k = 0; k < st[i].n_itl; k++) add_itl(&all, st[i].itl[k]);
        all.tokens += st[i].tokens;
        all.errors += st[i].errors;
        all.done += st[i].done;
        all.short_reqs += st[i].short_reqs;
    }
    double tps = all.tokens / wall;
    double t50 = pct(all.ttft, all.n_ttft, 50), t99 = pct(all.ttft, all.n_ttft, 99);
    double i50 = pct(all.itl, all.n_itl, 50), i99 = pct(all.itl, all.n_itl, 99);
    if (g_json)
        printf("{\"concurrency\": %d, \"requests\": %ld, \"errors\": %ld, \"output_tokens\": %ld, \"seconds\": %.3f, "
               "\"output_tokens_per_s\": %.2f, \"ttft_p50_ms\": %.1f, \"ttft_p99_ms\": %.1f, \"itl_p50_ms\": %.2f, "
               "\"itl_p99_ms\": %.2f, \"short_requests\": %ld}\n",
               g_conc, all.done, all.errors, all.tokens, wall, tps, t50 * 1e3, t99 * 1e3, i50 * 1e3, i99 * 1e3,
               all.short_reqs);
    else
        printf("concurrency %d: %ld requests (%ld errors), %ld tokens in %.1f s = %.1f tok/s; TTFT p50 %.0f ms p99 %.0f "
               "ms; ITL p50 %.1f ms p99 %.1f ms\n",
               g_conc, all.done, all.errors, all.tokens, wall, tps, t50 * 1e3, t99 * 1e3, i50 * 1e3, i99 * 1e3);
    return all.errors ? 1 : 0;
}
