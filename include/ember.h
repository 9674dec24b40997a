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
 *
 * Where to start
 *   - Text in, text out: the text API at the end of this file (ember_text:
 *     a model with its tokenizer and chat template; tokenize, render a
 *     conversation, generate with streamed text). docs/library.md is the tour.
 *   - Token ids in, token ids out: ember_model_load, ember_generate.
 *   - Many concurrent requests: the serving engine (ember_engine_new).
 *   - Build against the installed library: cc app.c $(pkg-config --cflags
 *     --libs ember)  (add --static to link libember.a).
 *
 * The ABI rule (what stays binary-compatible across releases of one major
 * version, EMBER_VERSION_MAJOR)
 *   - Handles are opaque (ember_model, ember_engine, ember_stream,
 *     ember_text): their layout is private and may change in any release.
 *   - Functions and enum values are only added, never changed or removed;
 *     a struct the caller fills gains fields only at its end.
 *   - Every params struct is filled by its init function first
 *     (ember_model_params_init, ember_text_params_init, ...), which sets the
 *     defaults of the library the program runs against. The text API's
 *     structs (ember_text_params, ember_gen_text_params,
 *     ember_text_result) also carry a leading `size` field, set by the init
 *     function to sizeof the struct the program was compiled with: a later
 *     library reads (and writes) only the fields that size covers, so a
 *     program built against 0.2 keeps working with 0.3. Structs added from
 *     now on follow the same pattern; the older structs (ember_model_params
 *     and the engine's) gain fields only at their end until the next major
 *     version gives them a size field too.
 *   - ember_version() tells the library's version at run time; the
 *     EMBER_VERSION_* macros tell the header's at compile time.
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

#define EMBER_VERSION_MAJOR 0
#define EMBER_VERSION_MINOR 2
#define EMBER_VERSION_PATCH 0
#define EMBER_VERSION_STRING "0.2.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH: compare with ember_version(). */
#define EMBER_VERSION (EMBER_VERSION_MAJOR * 10000 + EMBER_VERSION_MINOR * 100 + EMBER_VERSION_PATCH)

/* The version of the library linked at run time, as EMBER_VERSION (the
   header's); *str (may be NULL) receives a static "MAJOR.MINOR.PATCH".
   Thread-safe. */
EMBER_API int ember_version(const char **str);

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
    EMBER_ISA_AVX512 = 3, /* AVX-512 F/BW/VL/DQ + FMA + F16C (+ VNNI where present) */
    EMBER_ISA_AMX = 4     /* AVX512 with VNNI, plus AMX-INT8 tiles for quantized matmuls of
                             several rows (the OS must grant the tile state; Linux 5.16+) */
} ember_isa;

/* "scalar", "avx2", "avx512", "amx" or "auto". */
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
    size_t kv_budget;     /* > 0: bytes the KV cache may take (its blocks
                             are shared by all rows, each taking what its
                             length needs); a default context is lowered so
                             one row fits, an explicit one that does not is
                             an error. 0: n_rows full rows */
    const char *kv_type;  /* KV cache kind: "f32" (NULL: f32), "f16", "bf16",
                             "q8", "q4" (affine group-wise), "tq-kKvV"
                             (rotation-based, K and V bits 2..8) */
    int kv_group_size;    /* q8 / q4: values per scale (32, 64, 128; 0: 64) */
    int kv_quant_start;   /* > 0 with a quantized kind: rows stay f32 until
                             this many positions, then convert */
    int use_mmap;         /* nonzero: compute straight from the mapped files
                             (less memory, slower decode on most machines);
                             0: copy weights into huge-page backed memory */
    ember_log_fn log;     /* may be NULL */
    void *log_user;
    const char *device;   /* where the model runs: "cpu" (NULL), "cuda" (=
                             "cuda:0") or "cuda:N"; CUDA takes f32 / f16 /
                             bf16 weights and the f32 / f16 / bf16 KV kinds */
} ember_model_params;

/* Fills p with the defaults described above. */
EMBER_API void ember_model_params_init(ember_model_params *p);

/*
 * Loads a model from a HuggingFace-style directory (config.json,
 * model.safetensors or a sharded index, generation_config.json) or from a
 * GGUF file (llama / qwen2 / qwen3 architectures; F32, F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K tensors).
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
    size_t weight_bytes;    /* weight bytes a decode step reads per token (a MoE's experts:
                               the n_experts_used of n_experts share) */
    ember_isa isa;          /* the ISA in use */
    int n_threads;
    char kv_type[64];       /* the KV kind, described ("q4 (group 64)") */
    size_t kv_bytes_per_token; /* every layer, final kind */
    size_t kv_capacity;     /* bytes of KV blocks the budget allows */
    char device[96];        /* "cpu", or "cuda:0 (NVIDIA H200)" */
    int n_linear_layers;    /* hybrid models: linear-attention (gated DeltaNet) layers; 0 otherwise */
    size_t state_bytes_per_row; /* their recurrent state per sequence, whatever its length */
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

/* ---- the serving engine --------------------------------------------------
 *
 * An engine owns one thread that drives a loaded model: requests are
 * submitted from any thread and never wait for compute; the engine admits
 * them as rows of its running batch when a row is free (continuous
 * batching), prefills prompts in chunks interleaved with decode steps, and
 * reports each request's tokens as events on its stream. While an engine
 * exists, do not call ember_generate / ember_logits on its model.
 */

typedef struct ember_engine ember_engine;
typedef struct ember_stream ember_stream;

/* Speculative decoding's draft source (docs/speculative.md). */
typedef enum ember_spec_mode {
    EMBER_SPEC_NONE = 0,  /* one token per row per step */
    EMBER_SPEC_NGRAM = 1, /* prompt lookup: a row's own prompt and output propose what follows
                             the longest earlier match of its last tokens */
    EMBER_SPEC_DRAFT = 2, /* a draft model (ember_engine_params.draft_model) proposes greedily
                             from its own cache rows */
    EMBER_SPEC_EAGLE3 = 3, /* an EAGLE-3 draft model (ember_engine_params.draft_model, an EAGLE-3
                             directory) proposes greedily from the target's hidden taps */
    EMBER_SPEC_DFLASH = 4, /* a DFlash draft model (ember_engine_params.draft_model, a DFlash
                             directory) proposes a block of tokens per round from the target's taps */
    EMBER_SPEC_MTP = 5     /* the model's own MTP head (Qwen3-Next / Qwen3.5 mtp.* weights; no
                             draft_model) proposes greedily from the model's final hidden state;
                             a model without one is refused by ember_engine_new */
} ember_spec_mode;

#define EMBER_MAX_DRAFT 64 /* the most draft tokens a row verifies in one step */

typedef struct ember_engine_params {
    int max_queue;     /* requests waiting for a row; beyond it submit fails with
                          EMBER_ERR_LIMIT; <= 0: 256 */
    int prefill_chunk; /* prompt tokens per step, over all rows; <= 0: the
                          model's max_batch_tokens */
    const char *prompt_cache_dir; /* non-NULL: the prompt cache's disk tier. Rows
                          that end are written there as files (behind, while
                          the engine idles, and at shutdown); a later request,
                          also after a restart, restores the longest prefix
                          of its prompt from them. Created when missing; files
                          that are damaged or from another model, tokenizer
                          or KV kind are removed (one directory per model) */
    size_t prompt_cache_max;      /* the files' byte cap (least recently used go
                                     first); 0: 4 GiB */
    uint64_t prompt_cache_tag;    /* mixed into the files' fingerprint (the model's
                                     files are already): e.g. a hash of the
                                     tokenizer. A file with another is removed */
    ember_spec_mode spec; /* draft source; EMBER_SPEC_NONE (0) by default. Greedy rows give
                             exactly the tokens they give without it; sampled rows keep
                             their distribution (rejection sampling) */
    int draft_max;     /* most draft tokens a row verifies per step, 1..EMBER_MAX_DRAFT;
                          <= 0: 8 */
    int draft_min;     /* a row speculates in a step only when it can take and the source
                          proposes at least this many; <= 0: 1 */
    int ngram_min, ngram_max; /* EMBER_SPEC_NGRAM: suffix lengths matched, the longest first,
                                 1 <= min <= max <= 16; <= 0: 1 and 3 */
    ember_model *draft_model; /* EMBER_SPEC_DRAFT: a model sharing the target's vocabulary,
                                 loaded with at least its rows and context; the engine uses it
                                 from its thread, the caller frees it after the engine (and,
                                 with EMBER_SPEC_EAGLE3, before the target: it may borrow the
                                 target's embedding). EMBER_SPEC_EAGLE3 / DFLASH: an EAGLE-3 / DFlash draft model
                                 whose config fits the target (hidden size, vocabulary, tap
                                 layers), else ember_engine_new refuses it naming the field */
    float prefill_pace; /* while rows decode, the prompt tokens of a step are capped so that the
                           step takes about this many times a step of decoding alone (estimated
                           from the steps so far), at least 16 tokens: decoding keeps its pace
                           while prompts prefill, at the cost of their first token. 0: 1.5;
                           < 0: no cap (prefill_chunk tokens whenever there are prompts).
                           Values in (0, 1) act as 1 (the floor of 16 tokens) */
} ember_engine_params;

typedef struct ember_logit_bias {
    int32_t token;
    float bias;
} ember_logit_bias;

#define EMBER_MAX_TOP_LOGPROBS 20

typedef struct ember_gen_params {
    const int32_t *prompt; /* copied at submit */
    int n_prompt;
    int max_tokens;        /* >= 1 */
    ember_sampling sampling;
    float presence_penalty;   /* OpenAI semantics, on generated tokens; 0 = off */
    float frequency_penalty;  /* 0 = off */
    float repetition_penalty; /* HF semantics, on prompt and generated; 1 (or 0) = off */
    const ember_logit_bias *logit_bias; /* copied */
    int n_logit_bias;
    int logprobs;          /* nonzero: report each token's log-probability */
    int top_logprobs;      /* 0..EMBER_MAX_TOP_LOGPROBS alternatives per token */
    const int32_t *stop_ids; /* extra token ids that end generation (copied) */
    int n_stop_ids;
    int ignore_eos;
    int no_prompt_cache;   /* nonzero: neither reuse cached prompt blocks nor publish this one's */
    uint64_t cache_salt;   /* mixed into the key of the prompt's first cached block: only requests
                              with the same salt share blocks (0: the common pool) */
    int no_speculation;    /* nonzero: this request never speculates, whatever the engine's spec */
    int draft_max;         /* > 0: at most this many draft tokens per step for this request (the
                              engine's draft_max still bounds it); 0: the engine's */
    /* Optional constraint on the tokens (the server's grammars: tool_choice, response_format).
       On the engine thread, before each token of this request is sampled (drafts verified
       included), constrain_mask(user, logits, n_vocab) sets the logits of the tokens not
       allowed to -INFINITY (after penalties and biases, before the sampler chain);
       constrain_accept(user, token) is then told the token chosen. Other rows never see it.
       On a successful submit the engine owns constrain_user and calls
       constrain_free(constrain_user) (when non-NULL) once the request is over; after a failed
       submit the caller keeps it. */
    int (*constrain_mask)(void *user, float *logits, int n_vocab);
    void (*constrain_accept)(void *user, int32_t token);
    void (*constrain_free)(void *user);
    void *constrain_user;
} ember_gen_params;

typedef enum ember_event_kind { EMBER_EV_TOKEN = 1, EMBER_EV_DONE = 2 } ember_event_kind;

typedef enum ember_finish {
    EMBER_FINISH_NONE = 0,
    EMBER_FINISH_LENGTH = 1,    /* max_tokens or the context filled up */
    EMBER_FINISH_STOP = 2,      /* an EOS or stop id (included as the last token) */
    EMBER_FINISH_CANCELLED = 3, /* ember_stream_cancel, or the engine shut down */
    EMBER_FINISH_ERROR = 4
} ember_finish;

typedef struct ember_event {
    ember_event_kind kind;
    /* EMBER_EV_TOKEN */
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[EMBER_MAX_TOP_LOGPROBS];
    float top_logprobs[EMBER_MAX_TOP_LOGPROBS];
    /* EMBER_EV_DONE (the last event of a stream) */
    ember_finish finish;
    int n_prompt, n_generated, n_cached; /* n_cached: prompt tokens reused from the cache */
    int error_code;
    char error[256];
} ember_event;

typedef struct ember_engine_stats {
    int rows;                 /* rows of the batch (max concurrent requests) */
    int running, waiting;
    size_t kv_bytes_used;     /* bytes of KV blocks running requests hold */
    size_t kv_bytes_held;     /* bytes of KV blocks held in all (running requests
                                 and prompts kept for reuse) */
    size_t kv_bytes_total;    /* the KV budget */
    size_t kv_bytes_touched;  /* bytes of KV blocks ever handed out (the pools' high-water
                                 mark): the cache's resident memory grows with it up to the
                                 budget as the load peaks, and stays */
    int kv_blocks_used;       /* blocks of 16 positions held */
    uint64_t preempted_total; /* requests paused (their KV dropped) for lack of KV memory */
    uint64_t requests_total, prompt_tokens_total, cached_tokens_total, generated_tokens_total;
    uint64_t steps_total;
    /* the prefix cache (full blocks of earlier prompts, shared by reference) */
    int prefix_cache_entries;          /* cached blocks */
    size_t prefix_cache_bytes;         /* bytes of those blocks */
    size_t prefix_cache_bytes_unused;  /* of which no request holds (what eviction can free) */
    uint64_t prefix_cache_hits;        /* requests admitted with reused positions (from the prefix
                                          cache or the row they ran in) */
    uint64_t prefix_cache_misses;      /* requests admitted with none (opted-out ones not counted) */
    uint64_t prefix_cache_evictions;   /* cached blocks evicted */
    /* the disk tier (prompt_cache_dir) */
    int disk_cache_files;              /* files in the directory's index */
    size_t disk_cache_bytes;           /* their size */
    uint64_t disk_cache_restores;      /* requests that started from a file */
    uint64_t disk_cache_tokens_restored; /* positions loaded from files */
    uint64_t disk_cache_writes;        /* files written */
    uint64_t disk_cache_removed;       /* files removed as damaged or foreign */
    uint64_t disk_cache_evictions;     /* files removed to keep the byte cap */
    /* speculative decoding: a row's forward feeds its last token plus d drafts and yields
       1 + (accepted drafts) tokens */
    uint64_t spec_drafted_total;       /* draft tokens verified */
    uint64_t spec_accepted_total;      /* draft tokens accepted (the target produced them) */
    uint64_t spec_forwards_total;      /* row forwards that carried drafts */
    uint64_t decode_forwards_total;    /* row forwards of decoding rows, with or without drafts */
    uint64_t decode_tokens_total;      /* tokens those forwards produced (each request's first token
                                          comes from its prompt's forward and is not counted): tokens
                                          per target forward = decode_tokens / decode_forwards */
    /* step pacing (prefill_pace) */
    float prefill_pace;                /* the pace in effect: the param, 0 resolved to the default;
                                          -1: no cap */
    uint64_t prefill_paced_steps;      /* steps whose prompt tokens the pace cut below prefill_chunk */
    double step_decode_seconds;        /* estimate: a step of the last step's decoding rows alone
                                          (from the cost line fitted to the steps; 0: none yet) */
    double step_prefill_token_seconds; /* estimate: what one token (prompt or decode) adds to a step */
} ember_engine_stats;

/* Starts an engine thread over m (which must outlive the engine). */
EMBER_API int ember_engine_new(ember_model *m, const ember_engine_params *p, ember_engine **out,
                               ember_error *err);
/* Cancels every request and stops the engine thread; afterwards submit
   fails (EMBER_ERR_LIMIT, "shutting down") but stats stay readable. Streams
   stay valid (they end with a CANCELLED event) until ember_stream_free. */
EMBER_API void ember_engine_shutdown(ember_engine *e);
/* Shuts the engine down if needed and frees it. */
EMBER_API void ember_engine_free(ember_engine *e);

/*
 * Queues a request. Errors: EMBER_ERR_INVALID_ARG (bad parameters; a prompt
 * that can never fit the context), EMBER_ERR_LIMIT (the queue is full: try
 * again later). On success *out receives the request's stream (free it with
 * ember_stream_free).
 */
EMBER_API int ember_engine_submit(ember_engine *e, const ember_gen_params *g, ember_stream **out,
                                  ember_error *err);
/* Waits up to timeout_ms (< 0: forever) for the next event. Returns 1 with
   *ev filled, 0 on timeout. After the DONE event it returns 0 at once. */
EMBER_API int ember_stream_next(ember_stream *s, ember_event *ev, int timeout_ms);
/* Asks the engine to stop the request at the next step boundary (thread-safe). */
EMBER_API void ember_stream_cancel(ember_stream *s);
/* Cancels the request if still running and releases the caller's handle. */
EMBER_API void ember_stream_free(ember_stream *s);

EMBER_API void ember_engine_get_stats(ember_engine *e, ember_engine_stats *st);

/* ---- the text API ----------------------------------------------------
 *
 * Text in, text out. An ember_text is a model opened together with its own
 * tokenizer and chat template, and a serving engine over it: the handle an
 * application embeds.
 *
 *     ember_text *t;
 *     ember_error err;
 *     if (ember_text_open("path/to/model", NULL, &t, &err)) { puts(err.msg); ... }
 *     ember_message msgs[] = {{"user", "Hello!"}};
 *     ember_gen_text_params g;
 *     ember_gen_text_params_init(&g);
 *     g.on_text = print_piece;           // streamed as it is decoded
 *     ember_text_result res;
 *     ember_text_result_init(&res);
 *     ember_text_chat(t, msgs, 1, &g, &res, &err);
 *     ...
 *     ember_free(res.text);
 *     ember_text_free(t);
 *
 * Why a handle of its own rather than more fields on ember_model: the
 * token-level calls (ember_generate, ember_logits) and the engine may not
 * run on one model at the same time, and the text handle runs its requests
 * through an engine (so that several threads may generate at once and a
 * conversation's next turn reuses the cached prompt). Keeping the two apart
 * keeps each handle's rules simple; ember_text_model gives read access to
 * the model underneath.
 *
 * Threads: ember_text_tokenize, _detokenize and _render only read the
 * handle and may run on any threads at once. ember_text_generate and its
 * variants may also be called from several threads at once: each blocks
 * its caller until its request ends, up to model n_rows requests run in
 * one batch and the rest wait their turn; callbacks run on the calling
 * thread. ember_text_free must not overlap any other call on the handle.
 *
 * Memory: strings and id arrays the library returns are malloc'd for the
 * caller, who frees them with ember_free. Arguments are borrowed for the
 * call only.
 */

typedef struct ember_text ember_text;

/* Frees memory the library returned (id arrays, rendered or generated
   text). Accepts NULL. Thread-safe. */
EMBER_API void ember_free(void *p);

typedef struct ember_text_params {
    size_t size;                      /* sizeof(ember_text_params): set by ember_text_params_init */
    const ember_model_params *model;  /* how the model loads (threads, context, rows, KV kind,
                                         device, log); NULL: ember_model_params_init's defaults.
                                         n_rows is how many requests generate at once */
    int max_queue;                    /* requests waiting for a row beyond which generate fails
                                         with EMBER_ERR_LIMIT; <= 0: 256 */
} ember_text_params;

/* Fills p with the defaults (and p->size). */
EMBER_API void ember_text_params_init(ember_text_params *p);

/*
 * Opens model: a HuggingFace-style directory (config.json, safetensors,
 * tokenizer.json, the chat template in chat_template.jinja or
 * tokenizer_config.json), a GGUF file (its tokenizer and
 * tokenizer.chat_template), or "org/name" of a model already in the local
 * HuggingFace cache ($HF_HUB_CACHE, $HF_HOME/hub or
 * ~/.cache/huggingface/hub; nothing is downloaded). params may be NULL
 * (defaults). A model without a chat template opens; rendering and chat
 * then fail with EMBER_ERR_UNSUPPORTED. A template that does not compile
 * fails the open. On success *out owns the model, tokenizer, template and an
 * engine thread; free with ember_text_free. On failure nothing is left
 * allocated and *out is NULL.
 */
EMBER_API int ember_text_open(const char *model, const ember_text_params *params, ember_text **out,
                              ember_error *err);
/* Stops the engine (cancelling requests still running: do not call this
   while another thread is inside a call on t) and frees everything t owns.
   Accepts NULL. */
EMBER_API void ember_text_free(ember_text *t);

/* The model underneath (owned by t), for ember_model_get_info. Do not run
   ember_generate / ember_logits / ember_engine_new on it: t's engine owns
   its compute. */
EMBER_API const ember_model *ember_text_model(const ember_text *t);
/* 1 when the model has a chat template, else 0. */
EMBER_API int ember_text_has_template(const ember_text *t);

/*
 * Text to token ids with the model's tokenizer. add_special: nonzero adds
 * what the tokenizer adds around a raw text (e.g. a BOS id); a text
 * rendered by the chat template already holds its special tokens, so
 * tokenize it with 0. Special tokens written in the text ("<|im_end|>")
 * become their ids. On success *ids (free with ember_free; NULL when
 * *n_ids is 0) holds *n_ids ids.
 */
EMBER_API int ember_text_tokenize(const ember_text *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, size_t *n_ids, ember_error *err);
/*
 * Token ids to text. skip_special: nonzero drops special tokens (BOS, EOS,
 * chat markers) as generated text shows them; 0 writes their text. Ids the
 * tokenizer does not know (the padding rows some models' vocabularies
 * have) give no text. On success *text is NUL-terminated (free with
 * ember_free) and *len (may be NULL) its length.
 */
EMBER_API int ember_text_detokenize(const ember_text *t, const int32_t *ids, size_t n_ids, int skip_special,
                                    char **text, size_t *len, ember_error *err);

/* One message of a conversation. Frozen: messages that carry more come as
   a new struct (ember_chat_message, with tool calls and results, below), so
   arrays of this one keep their layout. Both strings are borrowed for the
   call. */
typedef struct ember_message {
    const char *role;    /* "system", "user", "assistant", "tool" (as the template knows them) */
    const char *content; /* UTF-8 text */
} ember_message;

/*
 * Renders a conversation through the model's own chat template, with
 * bos_token and eos_token as the tokenizer has them. add_generation_prompt:
 * nonzero ends the text where the assistant's next reply begins. On success
 * *text (free with ember_free) is NUL-terminated, *len (may be NULL) its
 * length. Errors: EMBER_ERR_UNSUPPORTED (no template), EMBER_ERR_INVALID_ARG
 * (a NULL role or content, or the template's raise_exception: the message
 * says why), EMBER_ERR_FORMAT (a template error, with line and column).
 */
EMBER_API int ember_text_render(const ember_text *t, const ember_message *msgs, int n_msgs,
                                int add_generation_prompt, char **text, size_t *len, ember_error *err);

/* Receives generated text as it is decoded: complete UTF-8 only, stop
   strings never (text that might begin one is held back until it is
   known not to). Runs on the thread that called generate. Return 0 to go
   on, nonzero to stop the request (finish EMBER_FINISH_CANCELLED). */
typedef int (*ember_text_fn)(void *user, const char *text, size_t len);

typedef struct ember_gen_text_params {
    size_t size;              /* sizeof(ember_gen_text_params): set by ember_gen_text_params_init */
    int max_tokens;           /* tokens to generate at most, >= 1; default 256 */
    float temperature;        /* 0 (default): greedy */
    int top_k;                /* <= 0: off (default) */
    float top_p;              /* >= 1: off (default) */
    float min_p;              /* <= 0: off (default) */
    uint64_t seed;            /* same seed, same output; default 0 */
    const char *const *stop;  /* stop strings (non-empty, borrowed for the call): the text ends
                                 right before the first one generated */
    int n_stop;
    int ignore_eos;           /* nonzero: go on past end-of-sequence ids */
    ember_text_fn on_text;    /* may be NULL */
    void *user;               /* passed to on_text */
} ember_gen_text_params;

/* Fills g with the defaults (and g->size). */
EMBER_API void ember_gen_text_params_init(ember_gen_text_params *g);

typedef struct ember_text_result {
    size_t size;          /* sizeof(ember_text_result): set by ember_text_result_init */
    ember_finish finish;  /* LENGTH, STOP (an end-of-sequence id or a stop string) or CANCELLED */
    int stop_index;       /* the stop string that ended the text, or -1 */
    int n_prompt;         /* prompt tokens */
    int n_cached;         /* of which reused from the cache (an earlier turn) */
    int n_generated;      /* tokens generated */
    char *text;           /* the whole generated text (what on_text received, joined);
                             free with ember_free. With tools (ember_text_chat_messages) the
                             text outside tool calls */
    size_t text_len;
    /* since 0.2: the tool calls the model wrote (ember_text_chat_messages with tools on a
       template whose call format ember_text_tool_format names; else NULL / 0) */
    char *tool_calls;     /* JSON text of an OpenAI tool_calls array, [{"id": "call_...", "type":
                             "function", "function": {"name": "...", "arguments": "{...}"}}],
                             arguments being the model's JSON text of the arguments object; NULL
                             when it wrote none. Free with ember_free. Feed it back as the
                             assistant message's tool_calls */
    int n_tool_calls;
} ember_text_result;

/* Sets res->size and clears the rest; call before the first generate. */
EMBER_API void ember_text_result_init(ember_text_result *res);

/*
 * Generates after a raw text prompt (tokenized with add_special, as a
 * completion API does), streaming text to g->on_text. g may be NULL
 * (defaults), res may be NULL; with res, res->text receives the whole text
 * (a previous res->text is not freed: free it first). Blocks until the
 * request ends. Returns EMBER_OK also when the request ended by a stop
 * string, EOS, length or on_text's wish (see res->finish); an error
 * otherwise (a prompt longer than the context: EMBER_ERR_INVALID_ARG; the
 * queue full: EMBER_ERR_LIMIT). Thread-safe (see the section comment).
 */
EMBER_API int ember_text_generate(ember_text *t, const char *prompt, const ember_gen_text_params *g,
                                  ember_text_result *res, ember_error *err);
/* As ember_text_generate after a conversation: rendered with
   add_generation_prompt and tokenized as the template wrote it (what
   `ember generate --prompt` and the server's chat endpoints do). */
EMBER_API int ember_text_chat(ember_text *t, const ember_message *msgs, int n_msgs, const ember_gen_text_params *g,
                              ember_text_result *res, ember_error *err);
/* As ember_text_generate after a prompt of token ids (borrowed). */
EMBER_API int ember_text_generate_ids(ember_text *t, const int32_t *ids, size_t n_ids,
                                      const ember_gen_text_params *g, ember_text_result *res, ember_error *err);

/* ---- conversations with tools ----------------------------------------
 *
 * Agents: the model is told about tools (OpenAI-style function tools, as
 * JSON text), writes calls in its family's own format, and the library
 * parses them out of the text (Hermes / Qwen, Qwen3-Coder, Llama 3 JSON,
 * Mistral, Gemma 4: the format the template's text shows). The program
 * runs the calls and sends the results back as "tool" messages:
 *
 *     ember_chat_params cp;
 *     ember_chat_params_init(&cp);
 *     cp.tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
 *                "\"parameters\": {\"type\": \"object\", \"properties\": "
 *                "{\"city\": {\"type\": \"string\"}}}}}]";
 *     ember_chat_message msgs[3] = {{.role = "user", .content = "Weather in Paris?"}};
 *     ember_text_chat_messages(t, msgs, 1, &cp, &g, &res, &err);
 *     if (res.n_tool_calls) {                // run them, then:
 *         msgs[1] = (ember_chat_message){.role = "assistant", .content = res.text,
 *                                        .tool_calls = res.tool_calls};
 *         msgs[2] = (ember_chat_message){.role = "tool", .content = "18 C, sunny",
 *                                        .tool_call_id = "<the call's id>"};
 *         ember_text_chat_messages(t, msgs, 3, &cp, &g, &res2, &err);
 *     }
 *
 * Threads and memory as in the text API above: these calls only read t
 * (render from any threads at once; chat blocks its caller, several
 * threads may chat at once); every string argument is borrowed for the
 * call, what comes back is the caller's (ember_free).
 */

/* One message of a conversation with tools. Frozen like ember_message
   (arrays of it keep their layout): what later messages carry beyond these
   fields goes in extra. Every string is borrowed for the call; NULL means
   absent. */
typedef struct ember_chat_message {
    const char *role;         /* "system", "user", "assistant" or "tool" */
    const char *content;      /* UTF-8 text; NULL only for an assistant message with tool_calls */
    const char *tool_calls;   /* assistant: JSON text of an OpenAI tool_calls array (as
                                 ember_text_result.tool_calls gives it); each call's arguments
                                 a JSON object or its text. NULL: none */
    const char *tool_call_id; /* tool: the id of the call this message answers */
    const char *name;         /* tool: the function's name (some templates show it) */
    const char *extra;        /* JSON text of an object whose members join the message (e.g.
                                 {"reasoning_content": "..."}); the fields above win */
} ember_chat_message;

typedef struct ember_chat_params {
    size_t size;                 /* sizeof(ember_chat_params): set by ember_chat_params_init */
    const char *tools;           /* JSON text of an array of OpenAI function tools ({"type":
                                    "function", "function": {"name", "description",
                                    "parameters"}}) the template shows the model; NULL or "[]":
                                    none (nothing is parsed out of the text then) */
    const char *template_kwargs; /* JSON text of an object of extra template variables
                                    ({"enable_thinking": false}); NULL: none */
    int add_generation_prompt;   /* render: end where the assistant's reply begins (default 1;
                                    chat always adds it) */
    int parse_tool_calls;        /* chat with tools: nonzero (default) parses calls out of the
                                    text into ember_text_result.tool_calls and keeps them out of
                                    on_text and res.text; 0 leaves the text as written */
} ember_chat_params;

/* Fills p with the defaults (and p->size). */
EMBER_API void ember_chat_params_init(ember_chat_params *p);

/* The tool-call format the model's template shows, as a static string:
   "hermes", "qwen3_coder", "llama3_json", "mistral", "gemma4", or "none"
   (then tools are still rendered, but calls are not parsed). Thread-safe. */
EMBER_API const char *ember_text_tool_format(const ember_text *t);

/*
 * As ember_text_render for messages with tool calls and results, and tools
 * (p may be NULL: no tools, add_generation_prompt 1). The messages and
 * tools go to the template as HF transformers passes them (a call's
 * arguments as an object). Errors as ember_text_render, and
 * EMBER_ERR_INVALID_ARG for JSON text that does not parse or has the wrong
 * shape (the message names the field), a missing role, or a missing
 * content without tool_calls.
 */
EMBER_API int ember_text_render_messages(const ember_text *t, const ember_chat_message *msgs, int n_msgs,
                                         const ember_chat_params *p, char **text, size_t *len, ember_error *err);

/*
 * As ember_text_chat for messages with tool calls and results, and tools
 * (p may be NULL). With tools and a parsed format, the calls the model
 * writes come back in res->tool_calls (ids "call_" + 24 hex digits, or 9
 * letters and digits with Mistral's format, unique within t), and on_text /
 * res->text receive the text outside them (held back while it may be the
 * start of a call). Blocks until the request ends; thread-safe like
 * ember_text_chat.
 */
EMBER_API int ember_text_chat_messages(ember_text *t, const ember_chat_message *msgs, int n_msgs,
                                       const ember_chat_params *p, const ember_gen_text_params *g,
                                       ember_text_result *res, ember_error *err);

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
/* As ember_bench_run after n_depth untimed tokens already in the context
   (llama-bench -d); n_prompt may then be 0 (decode only). */
EMBER_API int ember_bench_run_at(ember_model *m, int n_depth, int n_prompt, int n_gen,
                                 ember_bench_result *res, ember_error *err);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_H */
