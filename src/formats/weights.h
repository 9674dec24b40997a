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
    /* a multimodal checkpoint's text model (ember_weights_use_text_model):
       names "model.X" are looked up as text_prefix + "X", "lm_head.X" as
       head_prefix + "X" when set; static strings, NULL otherwise */
    const char *text_prefix, *head_prefix;
} ember_weights;

/* Opens the weights of a model directory. Errors name the file at fault.
   Every tensor named by a shard index must exist in the shard it names,
   and a tensor name may not appear in two shards. */
int ember_weights_open(const char *dir, ember_weights **out, ember_error *err);
void ember_weights_free(ember_weights *w);

/* Reads the text model of a multimodal checkpoint from here on: finds
   which layout the files use (transformers 5's model.language_model.* with
   lm_head.*, or the older language_model.model.* with
   language_model.lm_head.*), and maps the plain text-model names onto it.
   EMBER_ERR_FORMAT when the files hold neither. */
int ember_weights_use_text_model(ember_weights *w, ember_error *err);
/* Whether a tensor of the files (its stored name) belongs to the text model
   (always true for a plain checkpoint): the vision and audio towers, the
   projector and MTP layers of a multimodal one do not. */
bool ember_weights_is_text(const ember_weights *w, const char *stored_name);

/* The tensor called name and (if file != NULL) the path of its file, or NULL. */
const ember_st_tensor *ember_weights_find(const ember_weights *w, const char *name, const char **file);

#endif
