/*
 * ember.h - the public C API of libember, a local LLM inference engine.
 *
 * This is the only public header. Everything else under src/ is internal.
 *
 * Conventions
 *   - Every fallible function returns an ember_status (0 on success, a
 *     negative EMBER_ERR_* code on failure) and, when given a non-NULL
 *     ember_error, fills it with the code and a one-line message that names
 *     the file or argument at fault. The library never prints.
 *   - An object created by ember_X_new / ember_X_load is freed by
 *     ember_X_free, which accepts NULL.
 *   - Objects are not thread-safe unless stated: use one model from one thread
 *     at a time (the model fans its work out to its own worker pool).
 */
#ifndef EMBER_H
#define EMBER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EMBER_API __attribute__((visibility("default")))
#else
#define EMBER_API
#endif

#define EMBER_VERSION_STRING "0.1.0"

typedef enum ember_status {
    EMBER_OK = 0,
    EMBER_ERR_INVALID_ARG = -1, /* a bad argument or value from the caller */
    EMBER_ERR_IO = -2,          /* a file could not be opened / read / written */
    EMBER_ERR_FORMAT = -3,      /* a file is malformed */
    EMBER_ERR_UNSUPPORTED = -4, /* well-formed but not supported (yet) */
    EMBER_ERR_NOMEM = -5,       /* out of memory */
    EMBER_ERR_LIMIT = -6,       /* a size or count limit was exceeded */
    EMBER_ERR_INTERNAL = -7     /* a bug: please report it */
} ember_status;

#define EMBER_ERROR_MSG_MAX 512

/* Filled by failing calls. msg is one line, without a trailing newline. */
typedef struct ember_error {
    int code;
    char msg[EMBER_ERROR_MSG_MAX];
} ember_error;

/* A short static name for a status code ("invalid argument", ...). */
EMBER_API const char *ember_status_str(int code);

/* ---- logging --------------------------------------------------------- */

typedef enum ember_log_level {
    EMBER_LOG_DEBUG = 0,
    EMBER_LOG_INFO = 1,
    EMBER_LOG_WARN = 2,
    EMBER_LOG_ERROR = 3
} ember_log_level;

/* Called from the thread that did the work; msg has no trailing newline. */
typedef void (*ember_log_fn)(void *user, ember_log_level level, const char *msg);

/* ---- CPU instruction sets -------------------------------------------- */

typedef enum ember_isa {
    EMBER_ISA_AUTO = 0,   /* the best the running CPU supports */
    EMBER_ISA_SCALAR = 1, /* portable C, any x86-64 */
    EMBER_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
    EMBER_ISA_AVX512 = 3  /* AVX-512 F/BW/VL/DQ + FMA + F16C */
} ember_isa;

/* "scalar", "avx2", "avx512" or "auto". */
EMBER_API const char *ember_isa_name(ember_isa isa);
/* The best ISA the running CPU supports. */
EMBER_API ember_isa ember_isa_detect(void);

/* ---- models ---------------------------------------------------------- */

typedef struct ember_model ember_model;

typedef struct ember_model_params {
    int n_threads;        /* worker threads; <= 0: all online cores */
    ember_isa isa;        /* EMBER_ISA_AUTO picks the best available */
    int n_ctx;            /* max tokens per row; <= 0: min(model max, 4096) */
    int n_rows;           /* rows (sequences) the KV cache holds; <= 0: 1 */
    int max_batch_tokens; /* tokens per forward step; <= 0: 512 */
    int use_mmap;         /* nonzero: compute straight from the mapped files
                             (less memory, slower decode on most machines);
                             0: copy weights into huge-page backed memory */
    ember_log_fn log;     /* may be NULL */
    void *log_user;
} ember_model_params;

/* Fills p with the defaults described above. */
EMBER_API void ember_model_params_init(ember_model_params *p);

/*
 * Loads a model from a HuggingFace-style directory (config.json,
 * model.safetensors or a sharded index, generation_config.json).
 * On success *out owns the model; free it with ember_model_free.
 */
EMBER_API int ember_model_load(const char *path, const ember_model_params *params,
                               ember_model **out, ember_error *err);
EMBER_API void ember_model_free(ember_model *m);

typedef struct ember_model_info {
    const char *arch;       /* "llama", "qwen2", ... (owned by the model) */
    int vocab_size;
    int n_layers;
    int hidden_size;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int max_position_embeddings;
    int n_ctx;              /* per-row context of this instance */
    int n_rows;
    int n_eos;              /* number of entries in eos_ids */
    int32_t eos_ids[8];
    int bos_id;             /* -1 if none */
    const char *weight_dtype; /* "f32", "bf16", "f16" or "mixed" */
    size_t weight_bytes;    /* bytes of all weights used by the forward pass */
    ember_isa isa;          /* the ISA in use */
    int n_threads;
} ember_model_info;

EMBER_API void ember_model_get_info(const ember_model *m, ember_model_info *info);

/* ---- sampling -------------------------------------------------------- */

typedef struct ember_sampling {
    float temperature; /* 0: greedy (argmax, lowest id on ties) */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
} ember_sampling;

EMBER_API void ember_sampling_init(ember_sampling *s); /* greedy, seed 0 */

/* ---- generation ------------------------------------------------------ */

/*
 * One generation request. The caller owns every pointer; out_ids must have
 * room for max_new_tokens ids. On return n_out holds the number produced.
 */
typedef struct ember_request {
    const int32_t *prompt;
    int n_prompt;
    int max_new_tokens;
    int ignore_eos;           /* nonzero: do not stop at an EOS id */
    ember_sampling sampling;
    int32_t *out_ids;
    int n_out;
    /* Optional: when non-NULL, receives the logits of every prompt position
       followed by those of each generated step ((n_prompt + max_new_tokens - 1)
       x vocab floats at most; filled rows = n_prompt + n_out - 1). */
    float *out_logits;
} ember_request;

/*
 * Runs n requests to completion as rows of one batch: their prompts are
 * prefilled together and their decode steps share one forward pass. Needs
 * n <= the model's n_rows. The result of each request does not depend on
 * the others (batch invariance).
 */
EMBER_API int ember_generate(ember_model *m, ember_request *reqs, int n, ember_error *err);

/*
 * Logits of every position of one prompt: out must hold n_ids x vocab
 * floats, row-major.
 */
EMBER_API int ember_logits(ember_model *m, const int32_t *ids, int n_ids, float *out,
                           ember_error *err);

/* ---- timing helpers for benchmarks ------------------------------------ */

typedef struct ember_bench_result {
    double prefill_seconds; /* for n_prompt tokens, one row */
    double decode_seconds;  /* for n_gen tokens, one row */
} ember_bench_result;

/*
 * Prefills n_prompt synthetic tokens in chunks of max_batch_tokens, then
 * decodes n_gen tokens greedily, timing each phase.
 */
EMBER_API int ember_bench_run(ember_model *m, int n_prompt, int n_gen,
                              ember_bench_result *res, ember_error *err);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_H */
