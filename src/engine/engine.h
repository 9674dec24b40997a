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
};

/* Makes room for rows x vocab host logits. */
int ember_engine_reserve_logits(ember_model *m, size_t rows, ember_error *err);

#endif
