/*
 * grammar_bench.c - the cost of constrained decoding's token mask
 * (src/sample/grammar.c) per token of one row, on one core, over a real
 * vocabulary (bench/RESULTS.md, section "Constrained decoding").
 *
 * usage: grammar_bench TOKENIZER_DIR [--vocab N] [--runs R] [--tokens T] [--schema FILE | --gbnf FILE]
 *
 * The vocabulary is built as `ember serve` builds it (byte-level tokens mapped
 * back to their bytes, the end id <|im_end|> / <|endoftext|> ending the
 * output) and padded with empty rows to --vocab (default 151,936, the
 * logits rows of Qwen models). R walks (default 40) of at most T tokens
 * (default 256, the budget of ember_gmatch_mask_left) generate JSON for a
 * nested schema (built in, or --schema): random logits every step, the best
 * allowed token taken (a random walk through the grammar, so strings are
 * long and every state kind is visited). What is timed is the row's work
 * per token: ember_gmatch_mask_left over all rows of logits, then
 * ember_gmatch_accept (the argmax between them is the sampler's and is not
 * timed). Three matchers are fed the same tokens, and the mask is timed once
 * on each (on fresh copies of the logits), the least kept: a preemption on
 * the shared machine is not counted, while what a matcher remembers from
 * its own earlier masks (refused bytes, kept GBNF masks) is the same for
 * the three, so a repeat of the same mask on one matcher, which would find
 * its own work remembered, is never what is timed. The first matcher's
 * time alone is printed too (the "first run": the caches of the machine
 * cold for this state's tables). Wall time, CLOCK_MONOTONIC. Prints p50 / p90 / p99 / max / mean in microseconds,
 * and checks each output parses as JSON (jansson); a hash of the outputs
 * shows two builds wrote the same bytes. With --gbnf FILE the
 * grammar is that GBNF file instead of a schema (bench/json.gbnf: JSON; the
 * outputs are checked the same way).
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample/grammar.h"
#include "tok/tokenizer.h"

#define REPEAT 3

static const char k_schema[] =
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"order\",\"items\",\"customer\"],"
    "\"properties\":{"
    "\"order\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{4}$\"},"
    "\"customer\":{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"email\"],"
    "\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"email\":{\"type\":\"string\"},"
    "\"vip\":{\"type\":\"boolean\"},\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^\\\\d{5}$\"}},\"required\":[\"city\"]}}},"
    "\"items\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":4,\"items\":{\"type\":\"object\","
    "\"additionalProperties\":false,\"required\":[\"sku\",\"qty\"],\"properties\":{\"sku\":{\"type\":\"string\"},"
    "\"qty\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99},\"price\":{\"type\":\"number\",\"minimum\":0},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}}}},"
    "\"status\":{\"enum\":[\"new\",\"paid\",\"shipped\",\"cancelled\"]}}}";

/* GPT-2's byte alphabet: code point -> byte, or -1. */
static int bytelevel_byte(unsigned cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp > 323) return -1;
    unsigned k = cp - 256;
    for (int b = 0; b < 256; b++) {
        bool in = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!in && k-- == 0) return b;
    }
    return -1;
}

/* The bytes id writes (byte-level vocabularies); false when unknown. */
static bool token_bytes(const char *t, size_t len, char *buf, size_t *n) {
    const unsigned char *u = (const unsigned char *)t;
    *n = 0;
    for (size_t i = 0; i < len;) {
        unsigned cp = u[i];
        size_t l = cp < 0x80 ? 1 : (cp >> 5) == 6 ? 2 : (cp >> 4) == 14 ? 3 : 4;
        if (i + l > len || l > 2) return false;
        if (l == 2) cp = (cp & 0x1fu) << 6 | (u[i + 1] & 0x3fu);
        int b = bytelevel_byte(cp);
        if (b < 0) return false;
        buf[(*n)++] = (char)b;
        i += l;
    }
    return true;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / (float)(1 << 24);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: grammar_bench TOKENIZER_DIR [--vocab N] [--runs R] [--tokens T] [--schema FILE | --gbnf FILE]\n");
        return 2;
    }
    int nv = 151936, runs = 40, max_tokens = 256;
    const char *schema_path = NULL, *gbnf_path = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) nv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) max_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--schema")) schema_path = argv[i + 1];
        else if (!strcmp(argv[i], "--gbnf")) gbnf_path = argv[i + 1];
    }
    char tj[4096], tc[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", argv[1]);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", argv[1]);
    ember_tokenizer *tok = NULL;
    ember_error err = {0};
    if (ember_tok_load_json(tj, tc, &tok, &err)) {
        fprintf(stderr, "grammar_bench: %s\n", err.msg);
        return 1;
    }
    int nt = ember_tok_n_vocab(tok);
    if (nt > nv) nv = nt;
    char **bytes = calloc((size_t)nv, sizeof *bytes);
    size_t *lens = calloc((size_t)nv, sizeof *lens);
    bool *end = calloc((size_t)nv, sizeof *end);
    int n_tok = 0;
    for (int i = 0; i < nt; i++) {
        size_t len = 0;
        const char *t = ember_tok_id_text(tok, i, &len);
        if (!t) continue;
        if (ember_tok_is_special(tok, i)) {
            end[i] = (len == 10 && !memcmp(t, "<|im_end|>", 10)) || (len == 13 && !memcmp(t, "<|endoftext|>", 13));
            continue;
        }
        char buf[1024];
        size_t n = 0;
        if (len > 512 || !token_bytes(t, len, buf, &n) || n == 0) continue;
        bytes[i] = malloc(n);
        memcpy(bytes[i], buf, n);
        lens[i] = n;
        n_tok++;
    }
    double t0 = now_us();
    ember_gvocab *gv = NULL;
    if (ember_gvocab_new(nv, (const char *const *)bytes, lens, end, &gv, &err)) {
        fprintf(stderr, "grammar_bench: %s\n", err.msg);
        return 1;
    }
    double t_vocab = now_us() - t0;
    char *stext = NULL;
    if (schema_path || gbnf_path) {
        const char *path = gbnf_path ? gbnf_path : schema_path;
        FILE *fp = fopen(path, "rb");
        if (!fp) return fprintf(stderr, "grammar_bench: cannot read %s\n", path), 1;
        stext = calloc(1, 1 << 20);
        size_t r = fread(stext, 1, (1 << 20) - 1, fp);
        stext[r] = 0;
        fclose(fp);
    }
    json_t *schema = gbnf_path ? NULL : json_loads(stext ? stext : k_schema, 0, NULL);
    ember_grammar *g = ember_grammar_new();
    if (gbnf_path) {
        if (ember_grammar_gbnf(g, stext, strlen(stext), &err)) {
            fprintf(stderr, "grammar_bench: %s: %s\n", gbnf_path, err.msg);
            return 1;
        }
    } else {
        int root = schema ? ember_grammar_schema(g, schema, schema, "schema", &err) : -1;
        if (root < 0 || ember_grammar_set_root(g, root, &err)) {
            fprintf(stderr, "grammar_bench: the schema: %s\n", schema ? err.msg : "does not parse");
            return 1;
        }
    }
    float *lg = malloc((size_t)nv * sizeof *lg), *lg0 = malloc((size_t)nv * sizeof *lg0);
    double *us = malloc((size_t)runs * (size_t)max_tokens * sizeof *us);
    double *us1 = malloc((size_t)runs * (size_t)max_tokens * sizeof *us1); /* the first of the repeats */
    int nus = 0, parsed = 0, ended = 0;
    size_t total_bytes = 0;
    uint64_t fnv = 1469598103934665603ull; /* of every output, in order: the same bytes from two builds */
    for (int r = 0; r < runs; r++) {
        ember_gmatch *ms[REPEAT] = {0};
        for (int k = 0; k < REPEAT; k++)
            if (ember_gmatch_new(g, gv, &ms[k], &err)) return fprintf(stderr, "grammar_bench: %s\n", err.msg), 1;
        char *out = calloc(1, (size_t)max_tokens * 130 + 1);
        size_t on = 0;
        for (int s = 0; s < max_tokens; s++) {
            for (int i = 0; i < nv; i++) lg0[i] = frand();
            /* timed once on each of REPEAT matchers in the same state, the least kept (a
               preemption on a shared machine is not the mask's cost) */
            double best_mask = 1e30, first_mask = 0;
            for (int k = 0; k < REPEAT; k++) { /* the matchers are in one state: their masks are the same */
                memcpy(lg, lg0, (size_t)nv * sizeof *lg);
                double a = now_us();
                ember_gmatch_mask_left(ms[k], lg, nv, max_tokens - s);
                double b = now_us();
                if (b - a < best_mask) best_mask = b - a;
                if (k == 0) first_mask = b - a;
            }
            int best = 0; /* the sampler's work: not timed */
            for (int i = 1; i < nv; i++)
                if (lg[i] > lg[best]) best = i;
            bool is_end = end[best];
            double c = now_us();
            if (!is_end) ember_gmatch_accept(ms[0], best);
            double acc = now_us() - c;
            for (int k = 1; k < REPEAT && !is_end; k++) ember_gmatch_accept(ms[k], best);
            us1[nus] = first_mask + acc;
            us[nus++] = best_mask + acc;
            if (getenv("GB_DEBUG") && us[nus-1] > (getenv("GB_DEBUG") ? atof(getenv("GB_DEBUG")) : 1e9)) fprintf(stderr, "%.0f us left %d after: [%.*s]\n", us[nus-1], max_tokens - s, (int)(on > 60 ? 60 : on), out + (on > 60 ? on - 60 : 0));
            if (is_end) {
                ended++;
                break;
            }
            memcpy(out + on, bytes[best], lens[best]);
            on += lens[best];
        }
        for (size_t i = 0; i < on; i++) fnv = (fnv ^ (unsigned char)out[i]) * 1099511628211ull;
        fnv = (fnv ^ 0xff) * 1099511628211ull;
        json_t *x = json_loadb(out, on, JSON_DECODE_ANY, NULL);
        parsed += x != NULL;
        total_bytes += on;
        json_decref(x);
        free(out);
        for (int k = 0; k < REPEAT; k++) ember_gmatch_free(ms[k]);
    }
    qsort(us, (size_t)nus, sizeof *us, cmp_d);
    qsort(us1, (size_t)nus, sizeof *us1, cmp_d);
    double sum = 0;
    for (int i = 0; i < nus; i++) sum += us[i];
    printf("vocabulary: %d rows, %d tokens with bytes; trie and string tables built in %.0f ms\n", nv, n_tok,
           t_vocab / 1e3);
    printf("walks: %d (budget %d tokens), %d ended with the end id, %d parsed as JSON, %.0f bytes per walk "
           "(FNV-1a of the outputs %016llx)\n",
           runs, max_tokens, ended, parsed, (double)total_bytes / runs, (unsigned long long)fnv);
    printf("mask + accept per token, one row, one thread: %d tokens: p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us  "
           "mean %.1f us\n",
           nus, us[nus / 2], us[(int)(nus * 0.9)], us[(int)(nus * 0.99)], us[nus - 1], sum / nus);
    printf("  (least of %d matchers in the same state; the first alone: p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us)\n",
           REPEAT, us1[nus / 2], us1[(int)(nus * 0.9)], us1[(int)(nus * 0.99)], us1[nus - 1]);
    for (int i = 0; i < nv; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(end);
    free(lg);
    free(lg0);
    free(us1);
    free(us);
    free(stext);
    json_decref(schema);
    ember_grammar_free(g);
    ember_gvocab_free(gv);
    ember_tok_free(tok);
    return parsed == runs ? 0 : 1;
}
