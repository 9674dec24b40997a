/*
 * cmd_tokenize.c - `ember tokenize` (text in, ids out) and `ember detokenize`
 * (ids in, text out), on the tokenizer of a model directory, a directory of
 * tokenizer files, a tokenizer.json or a GGUF file (src/tok/tokenizer.h).
 *
 * Owner: CLI; single-threaded. Prints results on stdout, errors (one line)
 * on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "core/mapfile.h"
#include "tok/tokenizer.h"

#define MAX_TEXT_FILE (256u << 20)

static int load_tok(const char *verb, const char *model, ember_tokenizer **t) {
    ember_error err = {0};
    if (ember_tok_load(model, t, &err)) return cli_fail(verb, "%s", err.msg);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    bool no_special = false, no_parse_special = false;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "PATH",
         "model directory, tokenizer directory, tokenizer.json or .gguf file", 0, 0, false},
        {"text", 0, OPT_STR, &text, "TEXT", "the text to tokenize", 0, 0, false},
        {"file", 'f', OPT_STR, &file, "FILE", "tokenize the contents of FILE instead", 0, 0, false},
        {"no-special", 0, OPT_FLAG, &no_special, NULL,
         "do not add the special tokens the tokenizer adds (BOS, ...)", 0, 0, false},
        {"no-parse-special", 0, OPT_FLAG, &no_parse_special, NULL,
         "treat special-token text (e.g. <|im_start|>) as ordinary text", 0, 0, false},
    };
    cli_cmd cmd = {"tokenize", "Print the token ids of a text on one line, space-separated.",
                   "--model PATH --text TEXT [options]",
                   "Special tokens are added as the tokenizer's post-processor says unless --no-special; added\n"
                   "tokens written in the text (e.g. <|im_end|>) are recognised unless --no-parse-special.\n"
                   "Invalid UTF-8 in the text is read as U+FFFD (as a browser or node would).",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("tokenize", "--model is required (see 'ember tokenize --help')");
    if (!text == !file) return cli_fail("tokenize", "give exactly one of --text and --file");
    char *buf = NULL;
    size_t len;
    if (file) {
        ember_error err = {0};
        if (ember_read_file(file, MAX_TEXT_FILE, &buf, &len, &err)) return cli_fail("tokenize", "%s", err.msg);
        text = buf;
    } else {
        len = strlen(text);
    }
    ember_tokenizer *t;
    if (load_tok("tokenize", model, &t)) {
        free(buf);
        return 1;
    }
    unsigned flags = (no_special ? 0u : EMBER_TOK_ADD_SPECIAL) | (no_parse_special ? EMBER_TOK_NO_PARSE_SPECIAL : 0u);
    int32_t *ids;
    size_t n;
    ember_error err = {0};
    rc = ember_tok_encode(t, NULL, text, len, flags, &ids, &n, &err);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    } else {
        cli_fail("tokenize", "%s", err.msg);
    }
    ember_tok_free(t);
    free(buf);
    return rc ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL;
    bool skip_special = false;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "PATH",
         "model directory, tokenizer directory, tokenizer.json or .gguf file", 0, 0, false},
        {"ids", 0, OPT_STR, &ids_s, "LIST", "token ids, e.g. 1,2,3", 0, 0, false},
        {"skip-special", 0, OPT_FLAG, &skip_special, NULL, "leave special tokens out of the text", 0, 0, false},
    };
    cli_cmd cmd = {"detokenize", "Print the text of a list of token ids (followed by a newline).",
                   "--model PATH --ids LIST [options]", NULL, opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("detokenize", "--model is required (see 'ember detokenize --help')");
    if (!ids_s) return cli_fail("detokenize", "--ids is required");
    int32_t *ids;
    int n;
    if (cli_parse_ids("detokenize", "ids", ids_s, &ids, &n)) return 1;
    ember_tokenizer *t;
    if (load_tok("detokenize", model, &t)) {
        free(ids);
        return 1;
    }
    char *text;
    size_t len;
    ember_error err = {0};
    rc = ember_tok_decode(t, ids, (size_t)n, skip_special ? EMBER_TOK_SKIP_SPECIAL : 0u, &text, &len, &err);
    if (rc == 0) {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
        free(text);
    } else {
        cli_fail("detokenize", "%s", err.msg);
    }
    ember_tok_free(t);
    free(ids);
    return rc ? 1 : 0;
}
