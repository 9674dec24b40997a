/*
 * weights.h - the weight store of a model directory: name -> host tensor
 * view, over one model.safetensors or the shards listed by
 * model.safetensors.index.json. mmap-backed; views stay valid until
 * ember_weights_free.
 */
#ifndef EMBER_FORMATS_WEIGHTS_H
#define EMBER_FORMATS_WEIGHTS_H

#include "safetensors.h"

typedef struct ember_weights {
    char *dir;
    char *primary; /* the file errors about the whole store name */
    int n_files;
    ember_st_file **files;
} ember_weights;

/* Opens the weights of a model directory. Errors name the file at fault.
   Every tensor named by a shard index must exist in the shard it names,
   and a tensor name may not appear in two shards. */
int ember_weights_open(const char *dir, ember_weights **out, ember_error *err);
void ember_weights_free(ember_weights *w);

/* The tensor called name and (if file != NULL) the path of its file, or NULL. */
const ember_st_tensor *ember_weights_find(const ember_weights *w, const char *name, const char **file);

#endif
