/*
 * soak.c - a soak test of `ember serve` as a separate process, on loopback,
 * bounded in time (SOAK_SECONDS, default 240; longer by hand).
 *
 * usage: soak EMBER_BIN MODEL_DIR [seconds] [concurrency]
 *
 * Load: CONC client threads (default 24) issue a mix of streaming and
 * non-streaming chat and completion requests; some clients drop the
 * connection at a random point; malformed requests are interleaved; some
 * requests ask for exactly the rest of the context. A fixed set of greedy
 * "probe" requests, whose solo outputs are recorded first, is re-issued
 * throughout: each answer under load must equal its solo answer.
 * At the end: the server must go idle (no running or waiting requests, no
 * KV in use), answer /health, and exit 0 on SIGTERM within a bounded time.
 * The resident memory of the server is sampled once a second, less the KV
 * pools' high-water mark (/metrics ember_kv_cache_touched_bytes: the pools
 * are mapped untouched and become resident as the load peaks, bounded by the
 * KV budget); the slope of that after the first quarter of the run (and at
 * least 30 s) is reported and must stay under
 * SOAK_MAX_RSS_SLOPE_KIB per minute (default 2048), unless one half of that
 * span grows less (a step, not sustained growth) or the slope is within
 * three standard errors of the fit (the allocator's second-to-second swings
 * of a few MiB, not growth). Under AddressSanitizer
 * the quarantine of freed memory grows RSS by design, so the sanitizer pass
 * raises that limit and relies on LeakSanitizer, which makes the server's
 * exit status non-zero on any leak.
 *
 * Prints a report: requests by kind and outcome, disconnects, errors by
 * status, RSS slope, KV at idle.
 */
#include "http_client.h"

#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

static int g_port;
static pid_t g_pid;
static double g_end;
static atomic_long n_ok, n_stream_ok, n_dropped, n_bad_ok, n_limit, n_probe, n_probe_bad, n_fail, n_ctxlimit;
static atomic_long by_status[6];

#define N_PROBES 6
static char *g_probe_out[N_PROBES];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void probe_body(int i, char *b, size_t n) {
    snprintf(b, n, "{\"prompt\":[%d,%d,%d,%d,%d],\"max_tokens\":%d,\"temperature\":0}", 10 + i, 20 + i, 30, 40 + i,
             50, 16 + 4 * i);
}

static char *completion_text(const char *body, int *status) {
    http_resp r;
    http_request(g_port, "POST", "/v1/completions", body, &r);
    *status = r.status;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    char *out = t ? strdup(t) : NULL;
    json_decref(j);
    http_resp_free(&r);
    return out;
}

static void *client(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    char body[2048];
    while (now() < g_end) {
        seed = seed * 1103515245u + 12345u;
        unsigned kind = (seed >> 8) % 100;
        if (kind < 15) { /* a probe: must match its solo run */
            int i = (int)((seed >> 16) % N_PROBES), st;
            probe_body(i, body, sizeof body);
            char *t = completion_text(body, &st);
            if (st == 429) {
                n_limit++;
            } else {
                n_probe++;
                if (!t || strcmp(t, g_probe_out[i])) n_probe_bad++;
            }
            free(t);
        } else if (kind < 25) { /* malformed */
            static const char *const bad[] = {"{", "{\"messages\":5}", "{\"prompt\":[-1]}", "[]", "{\"temperature\":\"x\"}",
                                              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}"};
            http_resp r;
            http_request(g_port, "POST", (seed >> 12) & 1 ? "/v1/chat/completions" : "/v1/completions",
                         bad[(seed >> 16) % 6], &r);
            if (r.status == 400) n_bad_ok++;
            else n_fail++;
            if (r.status / 100 < 6) by_status[r.status / 100]++;
            http_resp_free(&r);
        } else if (kind < 45) { /* a streaming client that drops */
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"drop %u\"}],\"max_tokens\":200,\"stream\":true,"
                     "\"temperature\":0.9,\"seed\":%u}",
                     seed, seed);
            int fd = http_connect(g_port);
            if (fd >= 0) {
                http_send(fd, "POST", "/v1/chat/completions", body, strlen(body), NULL);
                size_t n;
                free(http_read_all(fd, (seed >> 10) % 4000, &n));
                close(fd);
                n_dropped++;
            }
        } else if (kind < 50) { /* exactly the rest of the context (512 - prompt) */
            snprintf(body, sizeof body, "{\"prompt\":[1,2,3,4,5,6,7,8],\"max_tokens\":%d,\"temperature\":1}", 512 - 8);
            int st;
            char *t = completion_text(body, &st);
            if (st == 200) n_ctxlimit++;
            else if (st == 429) n_limit++;
            else n_fail++;
            if (st / 100 < 6) by_status[st / 100]++;
            free(t);
        } else { /* ordinary requests, streaming or not */
            bool stream = (seed >> 20) & 1;
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hello %u\"}],\"max_tokens\":%u,\"stream\":%s,"
                     "\"temperature\":0.8,\"top_p\":0.9,\"seed\":%u,\"stop\":[\"zz\"]}",
                     seed % 1000, 8 + (seed >> 4) % 64, stream ? "true" : "false", seed);
            http_resp r;
            http_request(g_port, "POST", "/v1/chat/completions", body, &r);
            if (r.status == 200 && (!stream || strstr(r.body, "data: [DONE]"))) {
                if (stream) n_stream_ok++;
                else n_ok++;
            } else if (r.status == 429) {
                n_limit++;
            } else {
                n_fail++;
            }
            if (r.status / 100 < 6) by_status[r.status / 100]++;
            http_resp_free(&r);
        }
    }
    return NULL;
}

/* The server's ember_kv_cache_touched_bytes in KiB, or -1 when /metrics
   does not answer or lacks it. */
static long kv_touched_kb(void) {
    http_resp r;
    long kb = -1;
    if (http_request(g_port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200 && r.body) {
        const char *k = strstr(r.body, "\nember_kv_cache_touched_bytes ");
        if (k) kb = (long)(strtod(k + strlen("\nember_kv_cache_touched_bytes "), NULL) / 1024);
    }
    http_resp_free(&r);
    return kb;
}

static long rss_kb(void) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)g_pid);
    FILE *fp = fopen(p, "r");
    long kb = -1;
    while (fp && fgets(line, sizeof line, fp))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    if (fp) fclose(fp);
    return kb;
}

static bool metric_is(const char *body, const char *name, const char *value) {
    char want[128];
    snprintf(want, sizeof want, "\n%s %s\n", name, value);
    return strstr(body, want) != NULL;
}

/* The least-squares slope of rs[i] over ts[i] for i in [from, to), in KiB
   per minute, and in *se its standard error (from the fit's residuals: how
   far the sampling noise alone moves the slope); 0 and 0 for fewer than 3
   samples. */
static double rss_slope(const double *ts, const long *rs, int from, int to, double *se) {
    double sx = 0, sy = 0;
    int m = to - from;
    *se = 0;
    if (m < 3) return 0;
    for (int i = from; i < to; i++) {
        sx += ts[i];
        sy += (double)rs[i];
    }
    const double mx = sx / m, my = sy / m;
    double sxx = 0, sxy = 0;
    for (int i = from; i < to; i++) {
        sxx += (ts[i] - mx) * (ts[i] - mx);
        sxy += (ts[i] - mx) * ((double)rs[i] - my);
    }
    if (sxx <= 0) return 0;
    const double b = sxy / sxx, a = my - b * mx;
    double ssr = 0;
    for (int i = from; i < to; i++) {
        const double e = (double)rs[i] - (a + b * ts[i]);
        ssr += e * e;
    }
    *se = sqrt(ssr / (m - 2) / sxx) * 60.0;
    return b * 60.0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: soak EMBER_BIN MODEL_DIR [seconds] [concurrency]\n");
        return 2;
    }
    const char *env = getenv("SOAK_SECONDS");
    double secs = argc > 3 ? atof(argv[3]) : env ? atof(env) : 240;
    int conc = argc > 4 ? atoi(argv[4]) : 24;
    if (conc < 1 || conc > 256 || secs < 1) return 2;
    g_port = 30000 + (int)(getpid() % 20000);
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", g_port);
    g_pid = fork();
    if (g_pid == 0) {
        execl(argv[1], argv[1], "serve", argv[2], "--port", port_s, "--parallel", "16", "--ctx", "512", "--max-queue",
              "32", "--drain", "5", (char *)NULL);
        _exit(127);
    }
    int up = 0;
    for (int i = 0; i < 300 && !up; i++) {
        http_resp r;
        if (http_request(g_port, "GET", "/health", NULL, &r) == 0 && r.status == 200) up = 1;
        http_resp_free(&r);
        if (!up) usleep(100000);
    }
    if (!up) {
        fprintf(stderr, "soak: server did not start\n");
        kill(g_pid, SIGKILL);
        return 1;
    }
    int fails = 0;
    for (int i = 0; i < N_PROBES; i++) { /* solo outputs */
        char body[256];
        int st;
        probe_body(i, body, sizeof body);
        g_probe_out[i] = completion_text(body, &st);
        if (st != 200 || !g_probe_out[i]) {
            fprintf(stderr, "soak: probe %d failed alone\n", i);
            fails++;
        }
    }
    double t0 = now();
    g_end = t0 + secs;
    pthread_t *th = calloc((size_t)conc, sizeof *th);
    for (int i = 0; i < conc; i++) pthread_create(&th[i], NULL, client, (void *)(uintptr_t)(i + 1));
    /* sample RSS once a second, and the KV pools' high-water mark: those
       pools are mapped untouched and fill as the load peaks (up to the KV
       budget, 16 MiB here), which is growth but not a leak, so the slope is
       taken of RSS less that mark */
    static double ts[100000];
    static long rs[100000], net[100000];
    int ns = 0;
    long kv_last = 0;
    while (now() < g_end && ns < 100000) {
        sleep(1);
        long kv = kv_touched_kb();
        if (kv >= 0) kv_last = kv;
        ts[ns] = now() - t0;
        rs[ns] = rss_kb();
        net[ns] = rs[ns] - kv_last;
        if (getenv("SOAK_TRACE")) fprintf(stderr, "soak-trace %.1f %ld %ld\n", ts[ns], rs[ns], kv_last);
        ns++;
    }
    for (int i = 0; i < conc; i++) pthread_join(th[i], NULL);
    /* idle: nothing running, nothing waiting, no KV held */
    bool idle = false;
    char metrics_tail[256] = "";
    for (int i = 0; i < 100 && !idle; i++) {
        http_resp r;
        http_request(g_port, "GET", "/metrics", NULL, &r);
        idle = r.body && metric_is(r.body, "ember_requests_running", "0") &&
               metric_is(r.body, "ember_requests_waiting", "0") && metric_is(r.body, "ember_kv_cache_used_bytes", "0");
        if (r.body) {
            const char *k = strstr(r.body, "\nember_kv_cache_used_bytes ");
            if (k) k++;
            if (k) snprintf(metrics_tail, sizeof metrics_tail, "%.*s", (int)strcspn(k, "\n"), k);
        }
        http_resp_free(&r);
        if (!idle) usleep(100000);
    }
    http_resp hr;
    http_request(g_port, "GET", "/health", NULL, &hr);
    bool healthy = hr.status == 200;
    http_resp_free(&hr);
    /* RSS (less the KV high-water mark) slope after the warm-up, and in each
       half of that span. The warm-up is the first quarter, and at least 30 s:
       the allocator's arenas (a thread per connection) take most of a minute
       to reach their working size (a 180 s trace here: 38 MiB at 1 s, 56 at
       7 s, 59 at 60 s, 57-62 from there to the end) */
    int s0 = ns / 4;
    while (s0 < ns && ts[s0] < 30.0) s0++;
    int mid = (s0 + ns) / 2;
    double se, se_a, se_b, se_raw;
    double slope = rss_slope(ts, net, s0, ns, &se), slope_a = rss_slope(ts, net, s0, mid, &se_a),
           slope_b = rss_slope(ts, net, mid, ns, &se_b), slope_raw = rss_slope(ts, rs, s0, ns, &se_raw);
    /* SIGTERM: exit 0, promptly */
    double tk = now();
    kill(g_pid, SIGTERM);
    int status = 0;
    pid_t w = 0;
    while ((w = waitpid(g_pid, &status, WNOHANG)) == 0 && now() - tk < 30) usleep(50000);
    if (w == 0) kill(g_pid, SIGKILL), waitpid(g_pid, &status, 0);
    bool clean_exit = w == g_pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;

    printf("soak report (%.0f s, %d clients)\n", secs, conc);
    printf("  completed: %ld non-streaming, %ld streaming, %ld at the context limit\n", (long)n_ok, (long)n_stream_ok,
           (long)n_ctxlimit);
    printf("  probes under load: %ld, differing from their solo run: %ld\n", (long)n_probe, (long)n_probe_bad);
    printf("  disconnects: %ld; malformed requests answered 400: %ld; 429s: %ld; unexpected: %ld\n", (long)n_dropped,
           (long)n_bad_ok, (long)n_limit, (long)n_fail);
    printf("  responses by class: 2xx %ld, 4xx %ld, 5xx %ld\n", (long)by_status[2], (long)by_status[4], (long)by_status[5]);
    printf("  RSS: first %ld KiB, last %ld KiB (KV pools touched: %ld KiB); slope after warm-up %.1f KiB/min, "
           "less the KV pools %.1f +- %.1f KiB/min (halves %.1f, %.1f)\n",
           ns ? rs[0] : 0L, ns ? rs[ns - 1] : 0L, kv_last, slope_raw, slope, se, slope_a, slope_b);
    printf("  idle after the load: %s (%s); health: %s; SIGTERM exit: %s in %.1f s\n", idle ? "yes" : "NO",
           metrics_tail, healthy ? "ok" : "FAILED", clean_exit ? "0" : "FAILED", now() - tk);
    if (n_probe_bad || n_fail || !idle || !healthy || !clean_exit || n_probe == 0) fails++;
    const char *lim_s = getenv("SOAK_MAX_RSS_SLOPE_KIB");
    double lim = lim_s ? atof(lim_s) : 2048; /* 2 MiB per minute of sustained growth is a leak */
    /* sustained: in the whole span and in both of its halves (a leak grows all
       along; one late step, an allocator arena or a cache filling, does not),
       and beyond three standard errors of the fit: the allocator moves RSS up
       and down by megabytes from one second to the next (arenas grow and
       trim), which over a short run can tilt a line by more than the limit.
       A short run (CI's 60 s) therefore catches gross leaks only; a small one
       is LeakSanitizer's to find (the sanitizer pass), or a long run's. */
    if (slope > lim && slope > 3 * se && slope_a > lim && slope_b > lim) {
        printf("  RSS keeps growing\n");
        fails++;
    }
    for (int i = 0; i < N_PROBES; i++) free(g_probe_out[i]);
    free(th);
    printf("soak: %s\n", fails ? "FAILED" : "passed");
    return fails ? 1 : 0;
}
