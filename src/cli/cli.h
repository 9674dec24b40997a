/*
 * cli.h - the ember command's verbs. Each returns the process exit code:
 * 0 on success, 1 on any error (one line on stderr), 0 after --help.
 */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

#include <stdbool.h>

#include "ember.h"

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);

/* Loads a model with the common options; prints the error and returns 1 on
   failure. isa may be NULL ("auto"). */
int cli_load_model(const char *verb, const char *path, int threads, const char *isa, int ctx, int rows,
                   bool verbose, ember_model **out);

#endif
