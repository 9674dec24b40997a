/*
 * main.c - the `ember` command: dispatches to a verb.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct verb {
    const char *name;
    int (*run)(int, char **);
    const char *about;
} verb;

static const verb k_verbs[] = {
    {"serve", cmd_serve, "serve a model over an OpenAI / Anthropic compatible HTTP API"},
    {"generate", cmd_generate, "generate tokens after a prompt (text or token ids)"},
    {"logits", cmd_logits, "write the logits of every prompt position to a .npy file"},
    {"bench", cmd_bench, "measure prompt processing and generation speed"},
    {"info", cmd_info, "describe a model"},
    {"mkmodel", cmd_mkmodel, "write a model with random weights (demo, tests, benchmarks)"},
    {"quantize", cmd_quantize, "write a quantized copy of a model (GGUF or MLX)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
};

static void usage(FILE *fp) {
    fprintf(fp, "usage: ember <command> [options]\n\nEmber %s: a local LLM inference engine.\n\ncommands:\n",
            EMBER_VERSION_STRING);
    for (size_t i = 0; i < sizeof k_verbs / sizeof k_verbs[0]; i++)
        fprintf(fp, "  %-10s %s\n", k_verbs[i].name, k_verbs[i].about);
    fprintf(fp, "\n'ember <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ember %s\n", EMBER_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_verbs / sizeof k_verbs[0]; i++)
        if (strcmp(argv[1], k_verbs[i].name) == 0) return k_verbs[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s' (see 'ember --help')\n", argv[1]);
    return 1;
}
