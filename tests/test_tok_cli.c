/*
 * test_tok_cli.c - `ember tokenize` and `ember detokenize` end to end: ids on
 * one line, --no-special, added tokens written in the text, GGUF and
 * tokenizer directories, and one-line errors.
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

/* Runs cmd, captures stdout (and stderr when err_too) into out. Returns the exit status. */
static int run(const char *cmd, char *out, size_t cap, int err_too) {
    char full[4096];
    snprintf(full, sizeof full, "%s%s", cmd, err_too ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    const char *sd = shared_dir();
    shared_require("testdata/tokenizers/hf");
    shared_require("testdata/models/stories260K");
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/qwen3 --text 'Hello <|im_start|>world'",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "9707 220 151644 14615\n") == 0);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/llama3/tokenizer.json --text 'Hello world'",
             EMBER_BIN, sd);
    CHECKF(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "128000 9906 1917\n") == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/llama3 --text 'Hello world' --no-special",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "9906 1917\n") == 0);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/qwen3 --text '<|im_end|>' --no-parse-special",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "151645\n") != 0 && strlen(out) > 8);
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s/testdata/tokenizers/hf/llama3 --ids 128000,9906,1917", EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "<|begin_of_text|>Hello world\n") == 0);
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s/testdata/tokenizers/hf/llama3 --ids '128000 9906 1917' --skip-special",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "Hello world\n") == 0);
    /* GGUF: a model file and a model directory (llama2.c adds BOS and a dummy-prefix space) */
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/models/stories260K/stories260K.gguf --text 'Once upon a time'",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "1 403 407 261 378\n") == 0);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/models/stories260K --text 'Once upon a time'", EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "1 403 407 261 378\n") == 0);
    /* as HuggingFace's Llama decoder: only the text's first space is stripped, so BOS keeps it */
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s/testdata/models/stories260K/stories260K.gguf --ids 1,403,407,261,378",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "<s> Once upon a time\n") == 0);
    snprintf(cmd, sizeof cmd,
             "%s detokenize --model %s/testdata/models/stories260K/stories260K.gguf --ids 1,403,407,261,378 --skip-special",
             EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "Once upon a time\n") == 0);
    /* round trip through a file with invalid UTF-8 and newlines */
    char path[512];
    snprintf(path, sizeof path, "%s/tok_cli_input.txt", EMBER_TEST_TMP);
    FILE *f = fopen(path, "wb");
    fputs("line one\nline \xff two\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/qwen3 --file %s", EMBER_BIN, sd, path);
    CHECK(run(cmd, out, sizeof out, 0) == 0);
    char ids[1024];
    int idn = snprintf(ids, sizeof ids, "%s", out);
    CHECK(idn > 0 && (size_t)idn < sizeof ids);
    ids[strcspn(ids, "\n")] = 0;
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s/testdata/tokenizers/hf/qwen3 --ids '%s'", EMBER_BIN, sd, ids);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strcmp(out, "line one\nline \xEF\xBF\xBD two\n\n") == 0);
    /* errors: one line, naming the verb and the problem */
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s/testdata/tokenizers/hf/qwen3 --ids 1,999999", EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 1) == 1 && strstr(out, "ember detokenize: token id 999999") &&
          strchr(out, '\n') == out + strlen(out) - 1);
    snprintf(cmd, sizeof cmd, "%s tokenize --model /nonexistent --text x", EMBER_BIN);
    CHECK(run(cmd, out, sizeof out, 1) == 1 && strstr(out, "ember tokenize: /nonexistent"));
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/testdata/tokenizers/hf/qwen3", EMBER_BIN, sd);
    CHECK(run(cmd, out, sizeof out, 1) == 1 && strstr(out, "--text"));
    snprintf(cmd, sizeof cmd, "%s tokenize --help", EMBER_BIN);
    CHECK(run(cmd, out, sizeof out, 0) == 0 && strstr(out, "--no-special"));
    return test_done();
}
