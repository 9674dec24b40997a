/*
 * test_kv_prefix.c - the in-memory prefix cache (src/kv/kv_prefix.c) over
 * every kind: what a row built from cached blocks holds is bit for bit what
 * a row built from scratch holds; salts and token differences miss; shared
 * blocks are held once; eviction frees only blocks no row refers to,
 * leaves and the least recently used first; failures leave rows as they
 * were; at the end every block is back in its pool.
 *
 * The K and V written at a position are a function of (token, position)
 * only, the way a model's are a function of the tokens up to it.
 */
#define TEST_RNG_SEED 0x707265666978ull
#include <math.h>

#include "kv/kv.h"
#include "kv/kv_internal.h"
#include "kv/kv_prefix.h"
#include "test.h"

#define ROWS 4
#define CTX 256
#define LAYERS 2
#define HEADS 2
#define HD 16

static ember_backend *g_be;

#include "kv_rows.h"

/* Rows a and b hold the same bits at every position of a's length. */
static bool same_rows(ember_kv *kv, int a, int b) {
    if (ember_kv_len(kv, a) != ember_kv_len(kv, b)) return false;
    ember_error err = {0};
    for (int p = 0; p < ember_kv_len(kv, a); p++)
        for (int l = 0; l < LAYERS; l++) {
            float ka[HEADS * HD], va[HEADS * HD], kb[HEADS * HD], vb[HEADS * HD];
            if (ember_kv_read_pos(kv, a, l, p, ka, va, &err) || ember_kv_read_pos(kv, b, l, p, kb, vb, &err)) return false;
            if (memcmp(ka, kb, sizeof ka) || memcmp(va, vb, sizeof va)) return false;
        }
    return true;
}

static void run_kind(const char *kind, int quant_start) {
    ember_error err = {0};
    ember_kv_type t;
    CHECK(ember_kv_type_parse(kind, 0, quant_start, &t, &err) == EMBER_OK);
    const int heads[LAYERS] = {HEADS, HEADS}, dims[LAYERS] = {HD, HD};
    ember_kv_params p = {t, LAYERS, heads, dims, NULL, ROWS, CTX, 0, 0, 24, NULL, {0}};
    ember_kv *kv;
    CHECK(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK);
    ember_kv_prefix *px;
    CHECK(ember_kv_prefix_new(kv, &px, &err) == EMBER_OK);
    CHECK(ember_kv_prefix_supported(px));
    const int qs = t.quant_start;
    const size_t blk = ember_kv_bytes_per_token(kv, false) * EMBER_KV_BLOCK;

    int32_t A[CTX], Bt[CTX], C[CTX];
    for (int i = 0; i < CTX; i++) {
        A[i] = (int32_t)(rnd() % 500);
        Bt[i] = A[i];
        C[i] = (int32_t)(rnd() % 500);
    }
    Bt[100] = (A[100] + 1) % 500; /* B shares A's first 100 tokens: 6 full blocks */

    /* row 0: A's 120 tokens, published */
    feed(kv, 0, A, 0, 120);
    int made = ember_kv_prefix_publish(px, 0, A, 120, 0);
    CHECKF(made == 120 / EMBER_KV_BLOCK, "%s: published %d blocks, want %d", kind, made, 120 / EMBER_KV_BLOCK);
    CHECK(ember_kv_prefix_publish(px, 0, A, 120, 0) == 0); /* already there */
    int used0 = ember_kv_blocks_used(kv);

    /* lookups: B matches its shared full blocks, a salt or another start misses */
    CHECKF(ember_kv_prefix_match(px, Bt, 150, 0) == 96, "%s: B matches %d", kind, ember_kv_prefix_match(px, Bt, 150, 0));
    CHECK(ember_kv_prefix_match(px, Bt, 150, 7) == 0);
    CHECK(ember_kv_prefix_match(px, C, 150, 0) == 0);
    CHECK(ember_kv_prefix_match(px, A, 40, 0) == 32); /* limited by n */
    CHECK(ember_kv_prefix_match(px, A, 15, 0) == 0);

    /* row 1 from the cache, then the rest of B; row 2 B from scratch */
    CHECK(ember_kv_prefix_attach(px, 1, Bt, 96, 0, &err) == EMBER_OK);
    CHECK(ember_kv_blocks_used(kv) == used0); /* shared, not copied */
    feed(kv, 1, Bt, 96, 150);
    feed(kv, 2, Bt, 0, 150);
    CHECKF(same_rows(kv, 1, 2), "%s: a row from cached blocks differs from a fresh one", kind);
    /* and a row from cache of a fully cached length: row 3 = A's first 112 positions, then 8 more */
    CHECK(ember_kv_prefix_attach(px, 3, A, 112, 0, &err) == EMBER_OK);
    feed(kv, 3, A, 112, 120);
    CHECKF(same_rows(kv, 0, 3), "%s: a row continued from 112 cached positions differs", kind);

    /* refusals leave rows as they were */
    int len1 = ember_kv_len(kv, 1);
    CHECK(ember_kv_prefix_attach(px, 1, A, 32, 0, &err) != EMBER_OK); /* not empty */
    CHECK(ember_kv_len(kv, 1) == len1);
    ember_kv_clear(kv, 3);
    CHECK(ember_kv_prefix_attach(px, 3, C, 32, 0, &err) != EMBER_OK); /* not cached */
    CHECK(ember_kv_len(kv, 3) == 0);
    CHECK(ember_kv_prefix_attach(px, 3, A, 20, 0, &err) != EMBER_OK); /* not a block multiple */
    CHECK(ember_kv_len(kv, 3) == 0);

    /* eviction: nothing while rows hold the blocks */
    ember_kv_prefix_stats st;
    ember_kv_prefix_get_stats(px, &st);
    CHECK(st.entries == 7); /* A's 7 blocks; B's are not published yet */
    CHECK(st.bytes == 7 * blk && st.bytes_exclusive == 0);
    CHECK(ember_kv_prefix_evict(px, (size_t)1 << 40) == 0);
    CHECK(st.tokens_reused == 96 + 112);

    /* rows 1 and 2 publish B: its first 6 blocks are A's entries (no new
       ones), then 3 of its own */
    CHECK(ember_kv_prefix_publish(px, 1, Bt, 150, 0) == 150 / EMBER_KV_BLOCK - 6);
    CHECK(ember_kv_prefix_publish(px, 2, Bt, 150, 0) == 0);
    /* C under salt 5 from row 3 */
    feed(kv, 3, C, 0, 48);
    CHECK(ember_kv_prefix_publish(px, 3, C, 48, 5) == 3);
    CHECK(ember_kv_prefix_match(px, C, 48, 5) == (qs > 48 ? 0 : 48));
    CHECK(ember_kv_prefix_match(px, C, 48, 0) == 0);
    for (int r = 0; r < ROWS; r++) ember_kv_clear(kv, r);
    ember_kv_prefix_get_stats(px, &st);
    CHECK(st.bytes == st.bytes_exclusive && st.entries == 7 + 3 + 3);
    CHECK((size_t)ember_kv_blocks_used(kv) * blk == st.bytes); /* the cache holds every block left */

    /* least recently used leaves first: touch A's chain, then ask for one
       block: C's last block goes (C is older than A, B's leaf too) */
    ember_kv_prefix_match(px, Bt, 150, 0); /* B's chain, A's shared part with it */
    ember_kv_prefix_match(px, A, 120, 0);
    CHECK(ember_kv_prefix_evict(px, 1) == blk);
    CHECK(ember_kv_prefix_match(px, C, 48, 5) == (qs > 32 ? 0 : 32));
    CHECK(ember_kv_prefix_match(px, A, 120, 0) == 112);
    CHECK(ember_kv_prefix_match(px, Bt, 150, 0) == 144);
    /* a row holding A's blocks again pins them; everything else can go */
    CHECK(ember_kv_prefix_attach(px, 0, A, 64, 0, &err) == EMBER_OK);
    size_t freed = ember_kv_prefix_evict(px, (size_t)1 << 40);
    ember_kv_prefix_get_stats(px, &st);
    CHECKF(st.entries == 4 && freed == (size_t)(7 + 3 + 2 - 4) * blk, "%s: %d entries left, %zu bytes freed",
           kind, st.entries, freed);
    CHECK(ember_kv_prefix_match(px, A, 120, 0) == 64);
    CHECK(st.evictions == 1 + 8);

    ember_kv_prefix_free(px);
    CHECK(ember_kv_blocks_used(kv) == 4); /* row 0's */
    ember_kv_clear(kv, 0);
    CHECK(ember_kv_blocks_used(kv) == 0 && ember_kv_used_bytes(kv) == 0);
    ember_kv_free(kv);
}

/* A rotating group (window 32, no retain): blocks published while the row
   holds them are shared; a row installed from them takes only the blocks
   its length keeps and continues exactly like a fresh one; blocks a row
   dropped before publishing end the chain. */
static void rotating(const char *kind, int qs) {
    ember_error err = {0};
    ember_kv_type t;
    CHECK(ember_kv_type_parse(kind, 0, qs, &t, &err) == EMBER_OK);
    const int heads[LAYERS] = {HEADS, HEADS}, dims[LAYERS] = {HD, HD}, win[LAYERS] = {0, 32};
    ember_kv_params p = {t, LAYERS, heads, dims, win, ROWS, CTX, 0, 0, 24, NULL, {0}};
    ember_kv *kv;
    CHECK(ember_kv_new(g_be, &p, &kv, &err) == EMBER_OK);
    ember_kv_prefix *px;
    CHECK(ember_kv_prefix_new(kv, &px, &err) == EMBER_OK);
    CHECK(ember_kv_prefix_supported(px));
    int32_t A[192], C[192];
    for (int i = 0; i < 192; i++) A[i] = (int32_t)(rnd() % 500), C[i] = (int32_t)(rnd() % 500);
    int made = 0;
    for (int at = 0; at < 160; at += 16) { /* published block by block, as the engine's chunks do */
        feed(kv, 0, A, at, at + 16);
        made += ember_kv_prefix_publish(px, 0, A, at + 16, 0);
    }
    CHECKF(made == 10, "%s rotating: %d blocks published, want 10", kind, made);
    CHECKF(ember_kv_prefix_match(px, A, 170, 0) == 160, "%s rotating: A matches %d", kind,
           ember_kv_prefix_match(px, A, 170, 0));
    int used = ember_kv_blocks_used(kv);
    CHECK(ember_kv_prefix_attach(px, 1, A, 144, 0, &err) == EMBER_OK);
    CHECK(ember_kv_blocks_used(kv) == used); /* by reference */
    CHECK(kv_tab_of(kv, 1, 1)->first == (144 - 32) / EMBER_KV_BLOCK && kv_tab_of(kv, 0, 1)->first == 0);
    feed(kv, 1, A, 144, 180);
    feed(kv, 2, A, 0, 180);
    CHECKF(same_held(kv, 1, 2), "%s rotating: a row from cached blocks differs from a fresh one", kind);
    /* C prefilled past its window before publishing: its first blocks are gone, nothing is cached */
    feed(kv, 3, C, 0, 100);
    CHECK(ember_kv_prefix_publish(px, 3, C, 100, 0) == 0);
    CHECK(ember_kv_prefix_match(px, C, 100, 0) == 0);
    for (int r = 0; r < ROWS; r++) ember_kv_clear(kv, r);
    ember_kv_prefix_evict(px, (size_t)1 << 40);
    ember_kv_prefix_stats st;
    ember_kv_prefix_get_stats(px, &st);
    CHECK(st.entries == 0 && ember_kv_blocks_used(kv) == 0);
    ember_kv_prefix_free(px);
    ember_kv_free(kv);
}

int main(void) {
    ember_error err = {0};
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_backend_cpu_new(&cp, &g_be, &err) == EMBER_OK);
    run_kind("f32", 0);
    run_kind("f16", 0);
    run_kind("bf16", 0);
    run_kind("q8", 0);
    run_kind("q4", 0);
    run_kind("tq-k4v3", 0);
    run_kind("q8", 32); /* transitioning at 32 */
    rotating("f16", 0);
    rotating("q8", 0); /* converting at 16: before the window drops a block */
    ember_backend_free(g_be);
    return test_done();
}
