/*
 * engine.h - the loaded model as the engine sees it: weights, backend,
 * model, KV rows and run state, and the generation loop over rows.
 *
 * Ownership: struct ember_model (the public handle) owns everything listed
 * here; ember_model_free releases it in reverse order of creation.
 * Threading: one thread drives a model at a time.
 */
#ifndef EMBER_ENGINE_H
#define EMBER_ENGINE_H

#include <stdbool.h>

#include "backend/backend.h"
#include "core/log.h"
#include "formats/config.h"
#include "formats/weights.h"
#include "kv/kv.h"
#include "model/model.h"

struct ember_model {
    ember_model_params params; /* as resolved at load */
    ember_logger log;
    ember_model_config cfg;
    ember_weights *weights;
    ember_backend *be;
    ember_llm *llm;
    ember_kv *kv;
    ember_llm_state *st;
    float *logits;       /* host logits of one forward, grown on demand */
    size_t logits_rows;  /* rows logits can hold */
    int32_t *b_tok, *b_pos, *b_row, *b_out; /* [max_batch_tokens] batch staging */
    uint64_t fingerprint; /* of the model's files: what a KV row saved to disk depends on */
    char device[16];      /* params.device points here: "cpu" or "cuda:N" */
    bool borrowed;        /* an MTP head's: weights and be are its model's (not freed here) */
};

/*
 * The MTP head of `target` (model/mtp.c) as a model of its own: one layer
 * read from the target's weight store (mtp.*) on the target's backend,
 * bound to the target's embedding and lm_head, with its own KV cache
 * (the target's kind, rows and context; full rows, not the target's
 * budget) and run state. ember_model_free releases what it owns; the
 * target must outlive it. A model without an MTP head (not a hybrid,
 * mtp_num_hidden_layers 0, no mtp.fc.weight, a GGUF file) is refused with
 * one line; a wrong mtp.* tensor is named.
 */
int ember_model_mtp_new(ember_model *target, ember_model **out, ember_error *err);

/* Whether m's forward can draw sampled tokens on its backend
   (ember_batch.draw): a backend with sample_rows and a vocabulary of at
   most EMBER_DRAW_MAX_IDS. */
static inline bool ember_model_draws(const ember_model *m) {
    return m->be->ops->sample_rows && m->cfg.vocab_size <= EMBER_DRAW_MAX_IDS;
}

/* Makes room for rows x vocab host logits. */
int ember_engine_reserve_logits(ember_model *m, size_t rows, ember_error *err);

#endif
