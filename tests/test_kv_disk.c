/*
 * test_kv_disk.c - the prompt cache's disk tier (src/kv/kv_disk.c).
 *
 * Part 1, over KV caches of every kind (a rotating one too): a row written
 * behind (in small slices) and restored by a new index holds bit for bit
 * what it held; trimmed and continued it equals a row built from scratch;
 * a longer prefix replaces the file it extends; a covered prefix is not
 * written twice; the byte cap evicts least recently used files; files that
 * are corrupt, truncated, of another fingerprint or KV kind, and stale
 * temporary files are removed (with the row untouched), other files are
 * left alone; dropping the queue returns every block.
 *
 * Part 2, the engine over every fixture family: a request answered by an
 * engine that then shuts down is answered by a new engine (nothing in
 * memory) from the file, with the same greedy tokens, and a prompt that
 * shares only part of it reuses that part, also with the same tokens.
 */
#define TEST_RNG_SEED 0x6469736b6b76ull
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include "fixture.h"
#include "kv/kv.h"
#include "kv/kv_disk.h"
#include "kv/kv_internal.h"
#include "test.h"

#define ROWS 4
#define CTX 256
#define LAYERS 2
#define HEADS 2
#define HD 16

static ember_backend *g_be;

#include "kv_rows.h"

static char g_dir[512];

static int count_files(const char *suffix) {
    DIR *d = opendir(g_dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        if (l >= s && !strcmp(de->d_name + l - s, suffix) && de->d_name[0] != '.') n++;
    }
    closedir(d);
    return n;
}

/* The path of the (first) cache file, or false. */
static bool first_file(char *out, size_t n) {
    DIR *d = opendir(g_dir);
    if (!d) return false;
    struct dirent *de;
    bool ok = false;
    while (!ok && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 5 && !strcmp(de->d_name + l - 5, ".emkv") && de->d_name[0] != '.') {
            snprintf(out, n, "%s/%s", g_dir, de->d_name);
            ok = true;
        }
    }
    closedir(d);
    return ok;
}

static void empty_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *de;
    char p[1024];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
            unlink(p);
        }
    closedir(d);
}

static void drain_writes(ember_kv_disk *d) {
    int guard = 0;
    while (ember_kv_disk_work(d, 700) && guard++ < 100000) {} /* small slices: many steps per file */
    CHECK(guard < 100000);
}

static ember_kv *make_kv(const char *kind, int qs, bool rotating) {
    ember_error err = {0};
    ember_kv_type t;
    CHECK(ember_kv_type_parse(kind, 0, qs, &t, &err) == EMBER_OK);
    static const int heads[LAYERS] = {HEADS, HEADS}, dims[LAYERS] = {HD, HD}, win[LAYERS] = {0, 48};
    ember_kv_params p = {t, LAYERS, heads, dims, rotating ? win : NULL, ROWS, CTX, 0, 64, 24, NULL, {0}};
    ember_kv *kv = NULL;
    CHECKF(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK, "%s", err.msg);
    return kv;
}

static void run_kind(const char *kind, int qs, bool rotating) {
    ember_error err = {0};
    empty_dir();
    ember_kv *kv = make_kv(kind, qs, rotating);
    if (!kv) return;
    const uint64_t FP = 0x1234;
    int32_t A[CTX], Bt[CTX], C[CTX];
    for (int i = 0; i < CTX; i++) {
        A[i] = (int32_t)(rnd() % 500);
        Bt[i] = A[i];
        C[i] = (int32_t)(rnd() % 500);
    }
    Bt[100] = (A[100] + 1) % 500; /* B shares A's first 100 tokens */

    /* row 0 holds A's 120 positions: written behind, a slice at a time */
    ember_kv_disk *d;
    CHECKF(ember_kv_disk_open(kv, g_dir, 0, FP, NULL, &d, &err) == EMBER_OK, "%s", err.msg);
    feed(kv, 0, A, 0, 120);
    CHECK(ember_kv_disk_queue(d, 0, A, 0, &err) == EMBER_OK);
    ember_kv_clear(kv, 0); /* the queue holds its own references */
    feed(kv, 0, A, 0, 120);
    drain_writes(d);
    ember_kv_disk_stats st;
    ember_kv_disk_get_stats(d, &st);
    CHECKF(st.files == 1 && st.writes == 1 && count_files(".emkv") == 1, "%s: %d files", kind, st.files);
    size_t fsize = st.bytes;
    /* covered: the same tokens or fewer are not written again */
    CHECK(ember_kv_disk_queue(d, 0, A, 0, &err) == EMBER_OK);
    CHECK(!ember_kv_disk_work(d, 1 << 20));
    ember_kv_disk_get_stats(d, &st);
    CHECK(st.writes == 1);
    ember_kv_disk_free(d);

    /* a new index from the files' headers: matches, then restores bit for bit */
    CHECK(ember_kv_disk_open(kv, g_dir, 0, FP, NULL, &d, &err) == EMBER_OK);
    int file = -1;
    CHECK(ember_kv_disk_match(d, A, 150, 0, &file) == 120 && file >= 0);
    CHECK(ember_kv_disk_match(d, Bt, 150, 0, &file) == 100 && file >= 0);
    CHECK(ember_kv_disk_match(d, Bt, 150, 7, &file) == 0 && file < 0); /* another salt */
    CHECK(ember_kv_disk_match(d, C, 150, 0, &file) == 0 && file < 0);
    ember_kv_disk_match(d, A, 150, 0, &file);
    CHECKF(ember_kv_disk_restore(d, file, 1, &err) == EMBER_OK, "%s: %s", kind, err.msg);
    CHECKF(same_held(kv, 0, 1), "%s: the restored row differs", kind);
    /* trimmed to B's shared 100 and continued: B from scratch */
    if (ember_kv_min_reuse(kv, 1) <= 100) {
        CHECK(ember_kv_trim(kv, 1, 100, &err) == EMBER_OK);
        feed(kv, 1, Bt, 100, 150);
        feed(kv, 2, Bt, 0, 150);
        CHECKF(same_held(kv, 1, 2), "%s: a restored and continued row differs from a fresh one", kind);
    } else {
        CHECKF(rotating, "%s: a restored row cannot go back to 100", kind);
    }
    ember_kv_disk_get_stats(d, &st);
    CHECK(st.restores == 1 && st.tokens_restored == 120);

    /* a longer state of the same conversation replaces the file it extends */
    feed(kv, 0, A, 120, 150);
    CHECK(ember_kv_disk_queue(d, 0, A, 0, &err) == EMBER_OK);
    drain_writes(d);
    ember_kv_disk_get_stats(d, &st);
    CHECK(st.files == 1 && count_files(".emkv") == 1 && st.bytes > fsize);
    CHECK(ember_kv_disk_match(d, A, 200, 0, &file) == 150);
    fsize = st.bytes;

    /* the cap: room for one file of this size, so C's write evicts A's */
    ember_kv_disk_free(d);
    CHECK(ember_kv_disk_open(kv, g_dir, fsize + fsize / 2, FP, NULL, &d, &err) == EMBER_OK);
    ember_kv_clear(kv, 3);
    feed(kv, 3, C, 0, 150);
    CHECK(ember_kv_disk_queue(d, 3, C, 5, &err) == EMBER_OK);
    drain_writes(d);
    ember_kv_disk_get_stats(d, &st);
    CHECKF(st.files == 1 && st.evictions == 1 && count_files(".emkv") == 1, "%s: %d files, %llu evictions", kind,
           st.files, (unsigned long long)st.evictions);
    CHECK(ember_kv_disk_match(d, C, 150, 5, &file) == 150 && ember_kv_disk_match(d, A, 150, 0, &file) == 0);
    ember_kv_disk_free(d);
    /* a prefix larger than the cap is not written */
    CHECK(ember_kv_disk_open(kv, g_dir, fsize / 2, FP, NULL, &d, &err) == EMBER_OK);
    ember_kv_disk_get_stats(d, &st);
    CHECK(st.files == 0 && st.evictions == 1); /* the cap, lowered, was kept at open */
    CHECK(ember_kv_disk_queue(d, 3, C, 5, &err) == EMBER_OK);
    drain_writes(d);
    ember_kv_disk_get_stats(d, &st);
    CHECK(st.files == 0 && st.writes == 0 && count_files(".emkv") == 0);
    ember_kv_disk_free(d);

    /* damaged and foreign files: each removed, never trusted */
    char path[1024];
    for (int damage = 0; damage < 5; damage++) {
        empty_dir();
        CHECK(ember_kv_disk_open(kv, g_dir, 0, FP, NULL, &d, &err) == EMBER_OK);
        CHECK(ember_kv_disk_queue(d, 0, A, 0, &err) == EMBER_OK);
        drain_writes(d);
        ember_kv_disk_free(d);
        CHECK(first_file(path, sizeof path));
        FILE *f = fopen(path, "r+b");
        CHECK(f != NULL);
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        if (damage == 0) { /* a flipped payload byte: found on restore */
            fseek(f, size - 100, SEEK_SET);
            int c = fgetc(f);
            fseek(f, size - 100, SEEK_SET);
            fputc(c ^ 0x40, f);
        } else if (damage == 1) { /* a flipped token: the header's checksum */
            fseek(f, 40 + 4 * 7, SEEK_SET);
            fputc(0x7f, f);
        }
        fclose(f);
        if (damage == 2) CHECK(truncate(path, size - 33) == 0);
        int64_t fp = damage == 3 ? (int64_t)FP + 1 : (int64_t)FP; /* another model or tokenizer */
        ember_kv *other = damage == 4 ? make_kv(strcmp(kind, "f32") ? "f32" : "f16", 0, rotating) : kv;
        /* a stale temporary file goes too; an unrelated file stays */
        char tmp[1024], keep[1024];
        snprintf(tmp, sizeof tmp, "%s/.tmp-1-2.emkv", g_dir);
        snprintf(keep, sizeof keep, "%s/notes.txt", g_dir);
        FILE *t = fopen(tmp, "wb"), *k = fopen(keep, "wb");
        if (t) fclose(t);
        if (k) fclose(k);
        CHECK(ember_kv_disk_open(other, g_dir, 0, (uint64_t)fp, NULL, &d, &err) == EMBER_OK);
        ember_kv_disk_get_stats(d, &st);
        CHECK(access(tmp, F_OK) != 0 && access(keep, F_OK) == 0);
        if (damage == 0) { /* the header is fine: indexed, and rejected when read */
            CHECK(st.files == 1);
            ember_kv_clear(kv, 2);
            feed(kv, 2, C, 0, 40);
            CHECK(ember_kv_disk_match(d, A, 150, 0, &file) == 150);
            int rc = ember_kv_disk_restore(d, file, 2, &err);
            CHECKF(rc == EMBER_ERR_FORMAT, "%s: a damaged payload restored (%d)", kind, rc);
            CHECK(ember_kv_len(kv, 2) == 40); /* the row as it was */
            ember_kv_disk_get_stats(d, &st);
        }
        CHECKF(st.files == 0 && st.removed == 1 && count_files(".emkv") == 0, "%s damage %d: %d files, %llu removed",
               kind, damage, st.files, (unsigned long long)st.removed);
        ember_kv_disk_free(d);
        if (other != kv) ember_kv_free(other);
        unlink(keep);
    }

    /* dropping the queue (memory is short) writes nothing and returns the blocks */
    empty_dir();
    for (int r = 0; r < ROWS; r++) ember_kv_clear(kv, r);
    CHECK(ember_kv_disk_open(kv, g_dir, 0, FP, NULL, &d, &err) == EMBER_OK);
    feed(kv, 0, A, 0, 100);
    feed(kv, 1, C, 0, 100);
    CHECK(ember_kv_disk_queue(d, 0, A, 0, &err) == EMBER_OK);
    CHECK(ember_kv_disk_queue(d, 1, C, 0, &err) == EMBER_OK);
    CHECK(ember_kv_disk_work(d, 100)); /* the first write under way */
    ember_kv_clear(kv, 0);
    ember_kv_clear(kv, 1);
    CHECK(ember_kv_blocks_used(kv) > 0);
    CHECK(ember_kv_disk_drop_queued(d));
    CHECK(ember_kv_blocks_used(kv) == 0);
    CHECK(!ember_kv_disk_work(d, 1 << 20));
    CHECK(count_files(".emkv") == 0);
    DIR *dh = opendir(g_dir);
    int entries = 0;
    struct dirent *de;
    while (dh && (de = readdir(dh))) entries += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (dh) closedir(dh);
    CHECK(entries == 0); /* the abandoned temporary file too */
    ember_kv_disk_free(d);
    for (int r = 0; r < ROWS; r++) ember_kv_clear(kv, r);
    CHECK(ember_kv_blocks_used(kv) == 0);
    ember_kv_free(kv);
}

/* ---- part 2: the engine ------------------------------------------------------------ */

typedef struct result {
    int32_t ids[32];
    int n;
    ember_event done;
} result;

static void run(ember_engine *e, const int32_t *ids, int n, int max_tokens, bool no_cache, result *r) {
    ember_gen_params g;
    memset(&g, 0, sizeof g);
    g.prompt = ids;
    g.n_prompt = n;
    g.max_tokens = max_tokens;
    ember_sampling_init(&g.sampling);
    g.ignore_eos = 1;
    g.no_prompt_cache = no_cache;
    memset(r, 0, sizeof *r);
    ember_stream *s;
    ember_error err = {0};
    CHECKF(ember_engine_submit(e, &g, &s, &err) == EMBER_OK, "%s", err.msg);
    ember_event ev;
    while (ember_stream_next(s, &ev, 60000) == 1) {
        if (ev.kind == EMBER_EV_TOKEN) {
            if (r->n < 32) r->ids[r->n++] = ev.token;
        } else {
            r->done = ev;
            break;
        }
    }
    ember_stream_free(s);
}

static void engine_family(const char *family, const char *kind) {
    empty_dir();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/fixtures/%s", shared_dir(), family);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 2;
    mp.n_threads = 2;
    mp.n_ctx = 256;
    mp.max_batch_tokens = 64;
    mp.kv_type = kind;
    ember_model *m = fx_load_params(dir, &mp);
    CHECKF(m != NULL, "%s", family);
    if (!m) return;
    enum { NP = 90, MAXT = 12 };
    int32_t P[NP + 20], Q[NP + 20];
    for (int t = 0; t < NP + 20; t++) {
        P[t] = (int32_t)((t * 37 + 11) % 400 + 3);
        Q[t] = t < 70 ? P[t] : (int32_t)((t * 13 + 5) % 400 + 3); /* shares 70 tokens with P */
    }
    ember_engine_params ep = {0};
    ep.prompt_cache_dir = g_dir;
    ep.prompt_cache_tag = 42;
    ember_error err = {0};
    ember_engine *e;
    CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
    result solo_p, solo_q, a, b;
    run(e, Q, NP, MAXT, true, &solo_q); /* opted out: not written */
    run(e, P, NP, MAXT, false, &solo_p);
    CHECK(solo_p.n == MAXT && solo_p.done.n_cached == 0 && solo_q.n == MAXT);
    ember_engine_shutdown(e); /* writes what is queued */
    ember_engine_stats st;
    ember_engine_get_stats(e, &st);
    CHECKF(st.disk_cache_files == 1 && st.disk_cache_writes == 1, "%s %s: %d files", family, kind,
           st.disk_cache_files);
    ember_engine_free(e);

    /* a new engine: nothing in memory, the file on disk */
    CHECK(ember_engine_new(m, &ep, &e, &err) == EMBER_OK);
    run(e, P, NP, MAXT, false, &a);
    CHECKF(a.done.n_cached == NP - 1, "%s %s: %d positions from disk, want %d", family, kind, a.done.n_cached, NP - 1);
    CHECKF(a.n == MAXT && !memcmp(a.ids, solo_p.ids, sizeof(int32_t) * MAXT),
           "%s %s: tokens after a restore differ", family, kind);
    ember_engine_free(e);
    CHECK(ember_engine_new(m, &ep, &e, &err) == EMBER_OK);
    run(e, Q, NP, MAXT, false, &b);
    CHECKF(b.done.n_cached == 70, "%s %s: %d positions shared from disk, want 70", family, kind, b.done.n_cached);
    CHECKF(b.n == MAXT && !memcmp(b.ids, solo_q.ids, sizeof(int32_t) * MAXT),
           "%s %s: tokens after a partial restore differ", family, kind);
    ember_engine_get_stats(e, &st);
    CHECK(st.disk_cache_restores == 1 && st.disk_cache_tokens_restored > 0);
    ember_engine_free(e);
    /* another tag (tokenizer): the files are foreign, removed, and the answer the same */
    ep.prompt_cache_tag = 43;
    CHECK(ember_engine_new(m, &ep, &e, &err) == EMBER_OK);
    ember_engine_get_stats(e, &st);
    CHECK(st.disk_cache_files == 0 && st.disk_cache_removed >= 1);
    run(e, P, NP, MAXT, false, &a);
    CHECK(a.done.n_cached == 0 && !memcmp(a.ids, solo_p.ids, sizeof(int32_t) * MAXT));
    ember_engine_free(e);
    ember_model_free(m);
}

int main(void) {
    ember_error err = {0};
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_backend_cpu_new(&cp, &g_be, &err) == EMBER_OK);
    snprintf(g_dir, sizeof g_dir, "%s/kv_disk_%ld", EMBER_TEST_TMP, (long)getpid());
    run_kind("f32", 0, false);
    run_kind("f16", 0, false);
    run_kind("q8", 0, false);
    run_kind("q4", 32, false); /* transitioning at 32 */
    run_kind("tq-k4v3", 0, false);
    run_kind("f16", 0, true); /* a rotating group */
    ember_backend_free(g_be);

    char probe[600];
    snprintf(probe, sizeof probe, "%s/fixtures/llama/config.json", shared_dir());
    if (access(probe, F_OK) == 0) {
        static const char *const fams[] = {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3"};
        for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) engine_family(fams[i], "f32");
        engine_family("llama", "q8");
        engine_family("qwen3", "q4");
        engine_family("llama", "tq-k4v3");
        engine_family("gemma3_text", "q8");
    } else {
        fprintf(stderr, "skipping the engine part: no fixtures at %s\n", probe);
    }
    empty_dir();
    rmdir(g_dir);
    return test_done();
}
