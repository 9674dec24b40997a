/*
 * test_cli.c - the ember command on bad input: broken model files, broken
 * configs, a directory that is not a model, bad flags and values. Each case
 * must exit with status 1 (not a signal), print exactly one line on stderr
 * that names the file or option at fault, and print nothing on stdout.
 * Also checks the good paths: generate and logits agree with the library.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember.h"
#include "fixture.h"

static char g_tmp[512];

/* Runs cmd; returns its exit code (or 128 + signal), stdout and stderr in buffers. */
static int run(const char *cmd, char *out, size_t out_n, char *errb, size_t err_n) {
    char full[4096], ef[600], of[600];
    snprintf(of, sizeof of, "%s/stdout.txt", g_tmp);
    snprintf(ef, sizeof ef, "%s/stderr.txt", g_tmp);
    snprintf(full, sizeof full, "%s >%s 2>%s", cmd, of, ef);
    int st = system(full);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    const char *files[2] = {of, ef};
    char *bufs[2] = {out, errb};
    size_t ns[2] = {out_n, err_n};
    for (int i = 0; i < 2; i++) {
        FILE *fp = fopen(files[i], "rb");
        size_t n = fp ? fread(bufs[i], 1, ns[i] - 1, fp) : 0;
        bufs[i][n] = 0;
        if (fp) fclose(fp);
    }
    return code;
}

static void expect_fail(const char *args, const char *needle) {
    char cmd[2048], out[4096], err[8192];
    snprintf(cmd, sizeof cmd, "%s %s", EMBER_BIN, args);
    int code = run(cmd, out, sizeof out, err, sizeof err);
    int lines = 0;
    for (char *p = err; *p; p++) lines += *p == '\n';
    CHECKF(code == 1, "exit %d for: %s\n  stderr: %s", code, args, err);
    CHECKF(lines == 1, "%d stderr lines for: %s\n%s", lines, args, err);
    CHECKF(out[0] == 0, "stdout not empty for: %s", args);
    CHECKF(strstr(err, needle) != NULL, "stderr lacks '%s' for: %s\n  got: %s", needle, args, err);
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}

/* A copy of the llama fixture in g_tmp/<name>; returns its path. */
static const char *model_copy(const char *name, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", g_tmp, name);
    mkdir(dir, 0777);
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/fixtures/llama/%s", EMBER_SHARED_DIR, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
    return dir;
}

static void write_text(const char *dir, const char *file, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *fp = fopen(p, "w");
    fputs(text, fp);
    fclose(fp);
}

typedef void (*mutate_fn)(json_t *hdr);

/* Rewrites dir/model.safetensors with a mutated header and the same data. */
static void mutate_header(const char *dir, mutate_fn fn) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *fp = fopen(p, "rb");
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)size);
    CHECK(fread(b, 1, (size_t)size, fp) == (size_t)size);
    fclose(fp);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = (h << 8) | b[i];
    json_t *hdr = json_loadb((const char *)b + 8, h, 0, NULL);
    fn(hdr);
    char *s = json_dumps(hdr, JSON_COMPACT);
    size_t hl = strlen(s);
    fp = fopen(p, "wb");
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    fwrite(lenb, 1, 8, fp);
    fwrite(s, 1, hl, fp);
    fwrite(b + 8 + h, 1, (size_t)size - 8 - h, fp);
    fclose(fp);
    free(s);
    json_decref(hdr);
    free(b);
}

static void m_offsets(json_t *h) {
    json_t *t = json_object_get(h, "model.norm.weight");
    json_array_set_new(json_object_get(t, "data_offsets"), 0, json_integer(900000000));
    json_array_set_new(json_object_get(t, "data_offsets"), 1, json_integer(900000256));
}
static void m_dtype(json_t *h) {
    json_object_set_new(json_object_get(h, "model.layers.1.self_attn.k_proj.weight"), "dtype", json_string("I32"));
}
static void m_missing(json_t *h) {
    json_object_del(h, "model.layers.0.mlp.up_proj.weight");
}
static void m_shape(json_t *h) {
    json_t *sh = json_object_get(json_object_get(h, "model.layers.0.self_attn.q_proj.weight"), "shape");
    json_array_set_new(sh, 0, json_integer(32));
    json_array_set_new(sh, 1, json_integer(128));
}

static void truncate_file(const char *dir, long keep) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(truncate(p, keep) == 0);
}

int main(void) {
    shared_dir();
    snprintf(g_tmp, sizeof g_tmp, "%s/cli", EMBER_TEST_TMP);
    mkdir(g_tmp, 0777);
    char d[600], args[2048];
    const char *ids = "--ids 52,329,370,348,78,482,195 -n 4 --temp 0";

    /* the good path: ids match the reference */
    {
        fixture f;
        fixture_open(&f, "llama");
        char cmd[2048], out[4096], err[4096];
        snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 52,329,370,348,78,482,195 -n 24 --temp 0 --ignore-eos",
                 EMBER_BIN, f.dir);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        char want[512] = "";
        for (int i = 0; i < 24; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? " " : "", f.p[0].greedy[i]);
        strcat(want, "\n");
        CHECKF(strcmp(out, want) == 0, "generate printed '%s', want '%s'", out, want);
        /* with n-gram speculation (through the engine): the same ids; --verbose reports the drafts */
        snprintf(cmd, sizeof cmd,
                 "%s generate --model %s --ids 52,329,370,348,78,482,195 -n 24 --temp 0 --ignore-eos --spec ngram "
                 "--draft-max 4 -v",
                 EMBER_BIN, f.dir);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        CHECKF(strcmp(out, want) == 0, "generate --spec ngram printed '%s', want '%s'", out, want);
        CHECKF(strstr(err, "speculative decoding (ngram): ") && strstr(err, "tokens per target forward"),
               "--verbose: %s", err);
        /* a draft model: stories260K drafting for itself gives its plain greedy ids (every draft
           accepted); a draft whose vocabulary differs is refused naming the first differing token */
        char stories[700];
        snprintf(stories, sizeof stories, "%s/testdata/models/stories260K/stories260K.gguf", shared_dir());
        if (path_exists(stories)) {
            char plain[4096];
            snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,403,407 -n 48 --temp 0", EMBER_BIN, stories);
            CHECK(run(cmd, plain, sizeof plain, err, sizeof err) == 0);
            snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,403,407 -n 48 --temp 0 --spec draft --draft-model %s -v",
                     EMBER_BIN, stories, stories);
            CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
            CHECKF(strcmp(out, plain) == 0 && strlen(plain) > 48, "--spec draft printed '%s', plain '%s'", out, plain);
            CHECKF(strstr(err, "speculative decoding (draft model): ") && strstr(err, "(100.0%)"), "--verbose: %s", err);
            char demo[600];
            snprintf(demo, sizeof demo, "%s/demo-draft", g_tmp);
            snprintf(cmd, sizeof cmd, "%s mkmodel --preset demo --out %s", EMBER_BIN, demo);
            CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
            snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,403 -n 4 --spec draft --draft-model %s", EMBER_BIN,
                     stories, demo);
            CHECK(run(cmd, out, sizeof out, err, sizeof err) == 1);
            CHECKF(strstr(err, "its vocabulary differs from the model's at token 0: "), "draft of another vocabulary: %s", err);
        }
        /* logits -> .npy equals the library's logits and is a valid npy */
        char npy[700];
        snprintf(npy, sizeof npy, "%s/p0.npy", g_tmp);
        snprintf(cmd, sizeof cmd, "%s logits --model %s --ids 52,329,370,348,78,482,195 --out %s", EMBER_BIN, f.dir, npy);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        FILE *fp = fopen(npy, "rb");
        unsigned char hdr[128];
        CHECK(fp && fread(hdr, 1, 128, fp) == 128);
        CHECK(memcmp(hdr, "\x93NUMPY\x01\x00", 8) == 0);
        int hl = hdr[8] | hdr[9] << 8;
        CHECK((10 + hl) % 64 == 0 && strstr((char *)hdr + 10, "'shape': (7, 512)") && strstr((char *)hdr + 10, "<f4"));
        float *lg = malloc(7 * 512 * sizeof *lg), *ref = malloc(7 * 512 * sizeof *ref);
        fseek(fp, 10 + hl, SEEK_SET);
        CHECK(fread(lg, sizeof *lg, 7 * 512, fp) == 7 * 512);
        fclose(fp);
        ember_model *m;
        ember_error e = {0};
        CHECK(ember_model_load(f.dir, NULL, &m, &e) == EMBER_OK);
        CHECK(ember_logits(m, f.p[0].ids, 7, ref, &e) == EMBER_OK);
        CHECK(memcmp(lg, ref, 7 * 512 * sizeof *lg) == 0);
        float dm = 0;
        for (int i = 0; i < 7 * 512; i++) dm = fmaxf(dm, fabsf(lg[i] - f.p[0].logits[i]));
        CHECK(dm < 1e-4f);
        ember_model_free(m);
        free(lg);
        free(ref);
        fixture_close(&f);
        snprintf(cmd, sizeof cmd, "%s --help", EMBER_BIN);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(out, "generate"));
        const char *verbs[] = {"generate", "logits", "bench", "info", "mkmodel"};
        for (int i = 0; i < 5; i++) {
            snprintf(cmd, sizeof cmd, "%s %s --help", EMBER_BIN, verbs[i]);
            CHECKF(run(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(out, "usage: ember"), "%s --help", verbs[i]);
        }
    }

    /* text prompts: --prompt through the chat template gives the same tokens
       as the template's text tokenized by hand and sent as --ids */
    {
        char demo[600], cmd[8192], out[8192], err[4096], ids[4096];
        snprintf(demo, sizeof demo, "%s/demo", g_tmp);
        snprintf(cmd, sizeof cmd, "%s mkmodel --preset demo --out %s", EMBER_BIN, demo);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        snprintf(cmd, sizeof cmd, "%s tokenize --model %s --text '<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n'",
                 EMBER_BIN, demo);
        CHECK(run(cmd, ids, sizeof ids, err, sizeof err) == 0);
        ids[strcspn(ids, "\n")] = 0;
        for (char *q = ids; *q; q++)
            if (*q == ' ') *q = ',';
        char a[8192], b[8192];
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Hello -n 12 --temp 0 --print-ids", EMBER_BIN, demo);
        CHECK(run(cmd, a, sizeof a, err, sizeof err) == 0);
        snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s -n 12 --temp 0", EMBER_BIN, demo, ids);
        CHECK(run(cmd, b, sizeof b, err, sizeof err) == 0);
        CHECKF(a[0] && strcmp(a, b) == 0, "--prompt ids '%s' vs --ids '%s'", a, b);
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Hello -n 12 --temp 0", EMBER_BIN, demo);
        CHECK(run(cmd, a, sizeof a, err, sizeof err) == 0 && a[0]);
        /* --grammar-file: the text follows the grammar (sampled, plain and speculative); a bad file: one line */
        write_text(g_tmp, "g.gbnf", "root ::= (\"yes\" | \"no\") \" \" [0-9]{2,4} \"!\"\n");
        write_text(g_tmp, "bad.gbnf", "root ::= (\"yes\"\n");
        for (int k = 0; k < 3; k++) {
            snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Hello -n 16 --temp 1 --seed %d --grammar-file %s/g.gbnf%s",
                     EMBER_BIN, demo, k, g_tmp, k == 2 ? " --spec ngram" : "");
            int code = run(cmd, a, sizeof a, err, sizeof err);
            a[strcspn(a, "\n")] = 0;
            size_t d = strspn(a + (a[0] == 'y' ? 4 : 3), "0123456789");
            CHECKF(code == 0 && (!strncmp(a, "yes ", 4) || !strncmp(a, "no ", 3)) && d >= 2 && d <= 4 &&
                       !strcmp(a + (a[0] == 'y' ? 4 : 3) + d, "!"),
                   "--grammar-file output '%s' (exit %d: %s)", a, code, err);
        }
        char args[2048];
        snprintf(args, sizeof args, "generate --model %s --prompt Hello --grammar-file %s/bad.gbnf", demo, g_tmp);
        expect_fail(args, "line 1, column 10: a '(' without its ')'");
        snprintf(args, sizeof args, "generate --model %s --prompt Hello --grammar-file %s/none.gbnf", demo, g_tmp);
        expect_fail(args, "none.gbnf");
        snprintf(args, sizeof args, "serve %s --grammar-file %s/bad.gbnf", demo, g_tmp);
        expect_fail(args, "--grammar-file");
        /* the tokenizer and template travel into a quantized GGUF */
        char gguf[700], t1[4096], t2[4096];
        snprintf(gguf, sizeof gguf, "%s/demo-q8_0.gguf", g_tmp);
        snprintf(cmd, sizeof cmd, "%s quantize --model %s --type q8_0 --out %s", EMBER_BIN, demo, gguf);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        const char *texts[] = {"Hello <|im_end|> world", "  spaces\ttabs\nnewlines 12345", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"};
        for (int i = 0; i < 3; i++) {
            snprintf(cmd, sizeof cmd, "%s tokenize --model %s --text '%s'", EMBER_BIN, demo, texts[i]);
            CHECK(run(cmd, t1, sizeof t1, err, sizeof err) == 0);
            snprintf(cmd, sizeof cmd, "%s tokenize --model %s --text '%s'", EMBER_BIN, gguf, texts[i]);
            CHECK(run(cmd, t2, sizeof t2, err, sizeof err) == 0);
            CHECKF(t1[0] && !strcmp(t1, t2), "GGUF tokenizer '%s' vs directory '%s'", t2, t1);
        }
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Hello -n 6 --temp 0 --print-ids", EMBER_BIN, gguf);
        CHECK(run(cmd, t2, sizeof t2, err, sizeof err) == 0 && t2[0]); /* the chat template came along */
        snprintf(args, sizeof args, "generate --model %s --prompt hi --ids 1", demo);
        expect_fail(args, "exactly one of --ids and --prompt");
        snprintf(args, sizeof args, "generate --model %s/fixtures/llama --prompt hi", EMBER_SHARED_DIR);
        expect_fail(args, "tokenizer");
    }

    /* mkmodel writes the tensors each family's loader reads (gemma's sandwich norms, phi3's fused
       projections, qwen3_moe's experts, glm4_moe's dense first layer, shared expert and selection
       bias): the model loads and runs, and its F32 GGUF (stacked experts) gives the same logits */
    {
        static const char *const fams[] = {"gemma2", "gemma3_text", "phi3", "qwen3_moe", "glm4_moe"};
        for (int i = 0; i < 5; i++) {
            char dir[700], gguf[700], cmd[4096], out[4096], err[4096], a[700], b[700];
            snprintf(dir, sizeof dir, "%s/mk-%s", g_tmp, fams[i]);
            snprintf(gguf, sizeof gguf, "%s/mk-%s.gguf", g_tmp, fams[i]);
            snprintf(a, sizeof a, "%s/mk-%s.npy", g_tmp, fams[i]);
            snprintf(b, sizeof b, "%s/mk-%s-gguf.npy", g_tmp, fams[i]);
            snprintf(cmd, sizeof cmd, "%s mkmodel --config %s/fixtures/%s/config.json --out %s --dtype f32 --std 0.1",
                     EMBER_BIN, EMBER_SHARED_DIR, fams[i], dir);
            CHECKF(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", fams[i], err);
            snprintf(cmd, sizeof cmd, "%s quantize --model %s --type f32 --out %s", EMBER_BIN, dir, gguf);
            CHECKF(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", fams[i], err);
            snprintf(cmd, sizeof cmd, "%s logits --model %s --ids 5,6,7,300 --out %s", EMBER_BIN, dir, a);
            CHECKF(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", fams[i], err);
            snprintf(cmd, sizeof cmd, "%s logits --model %s --ids 5,6,7,300 --out %s", EMBER_BIN, gguf, b);
            CHECKF(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", fams[i], err);
            snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
            CHECKF(system(cmd) == 0, "%s: the F32 GGUF's logits differ from the directory's", fams[i]);
        }
    }

    /* the benchmark presets of a MoE and its dense twin are listed (bench/moe_vs_llamacpp.sh;
       too big to write here: the qwen3_moe config above takes the same path) */
    {
        char cmd[1024], out[4096], err[4096];
        snprintf(cmd, sizeof cmd, "%s mkmodel --list", EMBER_BIN);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        CHECKF(strstr(out, "qwen3-moe-2.4b ") && strstr(out, "qwen3-0.6b "), "mkmodel --list: %s", out);
    }

    /* paths that are not models */
    expect_fail("generate --model /nonexistent/model --ids 1", "/nonexistent/model: no such file");
    snprintf(d, sizeof d, "%s/empty", g_tmp);
    mkdir(d, 0777);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "not a model directory");
    snprintf(args, sizeof args, "generate --model %s/fixtures/llama/config.json %s", EMBER_SHARED_DIR, ids);
    expect_fail(args, "not a model directory");

    /* broken weights */
    model_copy("trunc_data", d, sizeof d);
    truncate_file(d, 200000);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "model.safetensors: tensor");
    model_copy("trunc_header", d, sizeof d);
    truncate_file(d, 100);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "runs past the end");
    model_copy("empty_file", d, sizeof d);
    truncate_file(d, 0);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "too short");
    model_copy("offsets", d, sizeof d);
    mutate_header(d, m_offsets);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "outside the");
    model_copy("dtype", d, sizeof d);
    mutate_header(d, m_dtype);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "unsupported dtype I32");
    model_copy("missing", d, sizeof d);
    mutate_header(d, m_missing);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "missing tensor 'model.layers.0.mlp.up_proj.weight'");
    model_copy("shape", d, sizeof d);
    mutate_header(d, m_shape);
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "has shape [32, 128], expected [64, 64]");

    /* broken configs */
    model_copy("cfg_missing", d, sizeof d);
    write_text(d, "config.json", "{\"model_type\":\"llama\",\"vocab_size\":512,\"intermediate_size\":128,"
                                 "\"num_hidden_layers\":2,\"num_attention_heads\":4}");
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "config.json: missing required field 'hidden_size'");
    model_copy("cfg_type", d, sizeof d);
    write_text(d, "config.json", "{\"model_type\":\"llama\",\"vocab_size\":512,\"hidden_size\":\"64\","
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4}");
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "config.json: field 'hidden_size' must be an integer, got string");
    model_copy("cfg_json", d, sizeof d);
    write_text(d, "config.json", "{\"model_type\": \"llama\",");
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "config.json: not valid JSON");
    model_copy("gencfg", d, sizeof d);
    write_text(d, "generation_config.json", "{\"eos_token_id\": \"two\"}");
    snprintf(args, sizeof args, "generate --model %s %s", d, ids);
    expect_fail(args, "generation_config.json: field 'eos_token_id'");

    /* bad flags and values */
    snprintf(d, sizeof d, "%s/fixtures/llama", EMBER_SHARED_DIR);
    snprintf(args, sizeof args, "generate --model %s --ids 1,2 --bogus", d);
    expect_fail(args, "unknown option '--bogus'");
    snprintf(args, sizeof args, "generate --model %s --ids 1,2 --temp abc", d);
    expect_fail(args, "--temp expects a finite number");
    snprintf(args, sizeof args, "generate --model %s --ids 1,2 --temp -1", d);
    expect_fail(args, "--temp must be between");
    snprintf(args, sizeof args, "generate --model %s --ids 1,2 -n -5", d);
    expect_fail(args, "-n must be between");
    snprintf(args, sizeof args, "generate --model %s --ids 1,x", d);
    expect_fail(args, "--ids: 'x' is not a token id");
    snprintf(args, sizeof args, "generate --model %s --ids 1,99999 -n 2", d);
    expect_fail(args, "outside the vocabulary");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --isa sse9", d);
    expect_fail(args, "--isa must be one of");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --top-p 0", d);
    expect_fail(args, "--top-p must be between");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --ctx 4 -n 10", d);
    expect_fail(args, "context holds 4");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --seed -3", d);
    expect_fail(args, "--seed expects a non-negative integer");
    expect_fail("generate --ids 1,2", "--model is required");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec eagle", d);
    expect_fail(args, "--spec expects ngram, draft, eagle3, dflash, mtp or none, got 'eagle'");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec draft", d);
    expect_fail(args, "--spec draft needs --draft-model PATH");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --draft-model %s", d, d);
    expect_fail(args, "--draft-model goes with --spec draft");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec draft --draft-model %s/nowhere", d, d);
    expect_fail(args, "--draft-model");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec ngram --draft-max 0", d);
    expect_fail(args, "--draft-max must be between 1 and 64");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec ngram --draft-max 65", d);
    expect_fail(args, "--draft-max must be between 1 and 64");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec ngram --draft-min x", d);
    expect_fail(args, "--draft-min expects an integer");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --spec ngram --draft-min 5 --draft-max 2", d);
    expect_fail(args, "--draft-min 5 is above --draft-max 2");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --draft-max 4", d);
    expect_fail(args, "--draft-max and --draft-min go with --spec ngram, draft, eagle3, dflash or mtp");
    snprintf(args, sizeof args, "generate --model %s --ids 1 --ctx 4 -n 10 --spec ngram", d);
    expect_fail(args, "context holds 4");
    expect_fail("serve --spec medusa", "--spec expects ngram, draft, eagle3, dflash, mtp or none, got 'medusa'");
    expect_fail("serve --spec ngram --draft-min 9", "--draft-min 9 is above --draft-max 8");
    snprintf(args, sizeof args, "generate --model %s", d);
    expect_fail(args, "exactly one of --ids and --prompt");
    snprintf(args, sizeof args, "generate --model %s --ids", d);
    expect_fail(args, "--ids needs a value");
    snprintf(args, sizeof args, "logits --model %s --ids 1,2", d);
    expect_fail(args, "--out are required");
    snprintf(args, sizeof args, "logits --model %s --ids 1,2 --out /nonexistent/dir/x.npy", d);
    expect_fail(args, "/nonexistent/dir/x.npy: cannot create");
    expect_fail("frobnicate", "unknown command 'frobnicate'");
    expect_fail("mkmodel --preset nope --out /tmp/x", "unknown preset 'nope'");
    expect_fail("bench --model /nonexistent -t 0", "--threads expects integers from 1 to");
    expect_fail("bench --model /nonexistent -d -1", "--depth expects integers from 0 to");
    expect_fail("serve /nonexistent --prompt-cache-dir /tmp --prompt-cache-max 0",
                "--prompt-cache-max expects a size such as 512M");
    expect_fail("serve /nonexistent --prompt-cache-max 1G", "--prompt-cache-max needs --prompt-cache-dir");
    expect_fail("serve /nonexistent --tool-parser qwen", "--tool-parser: unknown format 'qwen' (auto, none, hermes");
    expect_fail("serve /nonexistent --prompt-cache-dir ''", "--prompt-cache-dir expects a non-empty value");
    {   /* a directory that cannot be one: the server does not start, and says why */
        char cmd[2048], out[4096], err[8192], cfg[700], demo[600];
        snprintf(demo, sizeof demo, "%s/demo", g_tmp);
        snprintf(cmd, sizeof cmd, "%s mkmodel --preset demo --out %s", EMBER_BIN, demo);
        CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
        snprintf(cfg, sizeof cfg, "%s/config.json", demo);
        snprintf(cmd, sizeof cmd, "%s serve %s --port 1 -t 1 --prompt-cache-dir %s", EMBER_BIN, demo, cfg);
        int code = run(cmd, out, sizeof out, err, sizeof err);
        CHECKF(code == 1 && strstr(err, "is not a directory"), "exit %d: %s", code, err);
    }
    return test_done();
}
