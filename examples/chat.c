/*
 * chat.c - a chat over libember's text API: reads lines from stdin, keeps
 * the conversation, streams each reply to stdout (greedy unless a
 * temperature is given).
 * One thread; the library's engine thread does the compute.
 *
 *   cc chat.c $(pkg-config --cflags --libs ember) -o chat
 *   ./chat MODEL [MAX_TOKENS [TEMPERATURE SEED]]
 *   (MODEL: a model directory, a GGUF file or org/name in the HF cache)
 */
#include <ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_piece(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* go on */
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [MAX_TOKENS [TEMPERATURE SEED]]\n", argv[0]);
        return 2;
    }
    ember_error err;
    ember_text *t;
    if (ember_text_open(argv[1], NULL, &t, &err)) {
        fprintf(stderr, "chat: %s\n", err.msg);
        return 1;
    }
    ember_gen_text_params g;
    ember_gen_text_params_init(&g);
    g.max_tokens = argc > 2 ? atoi(argv[2]) : 256;
    g.temperature = argc > 4 ? (float)atof(argv[3]) : 0.0f;
    g.seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    g.on_text = print_piece;
    ember_message msgs[64]; /* strings owned here: lines and replies */
    int n = 0, rc = 0;
    char line[4096];
    while (n + 2 <= 64 && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *copy = malloc(strlen(line) + 1);
        if (!copy) break;
        strcpy(copy, line);
        msgs[n++] = (ember_message){"user", copy};
        ember_text_result res;
        ember_text_result_init(&res);
        if ((rc = ember_text_chat(t, msgs, n, &g, &res, &err))) {
            fprintf(stderr, "chat: %s\n", err.msg);
            break;
        }
        printf("\n");
        msgs[n++] = (ember_message){"assistant", res.text}; /* freed below */
    }
    for (int i = 0; i < n; i++) {
        if (msgs[i].role[0] == 'u') free((char *)msgs[i].content);
        else ember_free((char *)msgs[i].content);
    }
    ember_text_free(t);
    return rc ? 1 : 0;
}
