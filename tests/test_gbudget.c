/*
 * test_gbudget.c - the engine-side grammar constraint (src/sample/gbudget.c):
 * a matcher plus the tokens a request may still take, as the server and
 * `ember generate --grammar-file` hand it to the engine.
 *   - a greedy walk whose logits always prefer to go on must still end
 *     within max_tokens, in text the grammar accepts, for every budget from
 *     the grammar's shortest output up;
 *   - the budget counts down by one per token and never below 1;
 *   - an owned grammar is freed with the constraint (the ASan run sees a
 *     leak otherwise), a borrowed one is not; free(NULL) is a no-op.
 */
#include "sample/gbudget.h"
#include "sample/grammar.h"
#include "test.h"

/* 255 one-byte tokens (ids 0..254 write bytes 1..255) and an end id, 255. */
#define N_VOCAB 256
#define END_ID 255

static ember_gvocab *byte_vocab(void) {
    static char store[255];
    const char *bytes[N_VOCAB];
    size_t lens[N_VOCAB];
    bool end[N_VOCAB];
    for (int i = 0; i < 255; i++) {
        store[i] = (char)(i + 1);
        bytes[i] = &store[i];
        lens[i] = 1;
        end[i] = false;
    }
    bytes[END_ID] = NULL;
    lens[END_ID] = 0;
    end[END_ID] = true;
    ember_gvocab *v = NULL;
    ember_error err = {0};
    CHECKF(ember_gvocab_new(N_VOCAB, bytes, lens, end, &v, &err) == 0, "%s", err.msg);
    return v;
}

static ember_grammar *gbnf(const char *text) {
    ember_grammar *g = ember_grammar_new();
    ember_error err = {0};
    CHECK(g != NULL);
    if (g && ember_grammar_gbnf(g, text, strlen(text), &err)) {
        CHECKF(0, "%s: %s", text, err.msg);
        ember_grammar_free(g);
        return NULL;
    }
    return g;
}

/* Greedy walk under logits that rank 'z' first, then every other byte by
   its value, the end id last; returns the bytes written (out, NUL ended)
   and whether the end id came, within max_tokens tokens. */
static bool walk(ember_gbudget *b, int max_tokens, char *out, int cap) {
    int n = 0;
    for (int step = 0; step < max_tokens; step++) {
        float logits[N_VOCAB];
        for (int i = 0; i < N_VOCAB; i++) logits[i] = (float)i;
        logits['z' - 1] = 1000.0f;
        logits[END_ID] = -1000.0f;
        int left_before = ember_gbudget_left(b);
        CHECK(ember_gbudget_mask(b, logits, N_VOCAB) >= 1);
        int best = 0;
        for (int i = 1; i < N_VOCAB; i++)
            if (logits[i] > logits[best]) best = i;
        if (best == END_ID) {
            out[n] = 0;
            return true;
        }
        ember_gbudget_accept(b, best);
        CHECKF(ember_gbudget_left(b) == (left_before > 1 ? left_before - 1 : 1), "left %d after %d",
               ember_gbudget_left(b), left_before);
        if (n + 1 < cap) out[n++] = (char)(best + 1);
    }
    out[n] = 0;
    return false;
}

static void test_budget_ends(ember_gvocab *v) {
    /* shortest output "ab" (2 bytes); goes on forever with letters */
    ember_grammar *g = gbnf("root ::= \"ab\" [c-z]*\n");
    if (!g) return;
    CHECK(ember_grammar_min_bytes(g) == 2);
    for (int max = 3; max <= 12; max++) {
        ember_gbudget *b = NULL;
        ember_error err = {0};
        CHECKF(ember_gbudget_new(g, v, max, &b, &err) == 0, "%s", err.msg);
        if (!b) continue;
        CHECK(ember_gbudget_left(b) == max);
        char out[64];
        bool ended = walk(b, max, out, sizeof out);
        CHECKF(ended, "max %d: no end within the budget (wrote \"%s\")", max, out);
        /* the walk prefers 'z' to ending: it writes as many as the budget lets */
        size_t want = (size_t)max - 1;
        CHECKF(strlen(out) == want && !strncmp(out, "ab", 2) && strspn(out + 2, "z") == want - 2,
               "max %d: wrote \"%s\"", max, out);
        ember_gbudget_free(b); /* borrowed grammar: still ours */
    }
    ember_grammar_free(g);
}

static void test_no_budget(ember_gvocab *v) {
    /* max_tokens <= 0: no budget to speak of; the grammar alone ends it */
    ember_grammar *g = gbnf("root ::= \"a\" [b-y]{0,5}\n");
    if (!g) return;
    ember_gbudget *b = NULL;
    ember_error err = {0};
    CHECKF(ember_gbudget_new(g, v, 0, &b, &err) == 0, "%s", err.msg);
    if (b) {
        CHECK(ember_gbudget_left(b) == 1 << 29);
        ember_gbudget_own_grammar(b, g); /* freed with b from here on */
        char out[64];
        CHECK(walk(b, 100, out, sizeof out));
        CHECKF(!strcmp(out, "ayyyyy"), "wrote \"%s\"", out);
        ember_gbudget_free(b);
    } else {
        ember_grammar_free(g);
    }
    ember_gbudget_free(NULL);
}

int main(void) {
    ember_gvocab *v = byte_vocab();
    if (!v) return test_done();
    test_budget_ends(v);
    test_no_budget(v);
    ember_gvocab_free(v);
    return test_done();
}
