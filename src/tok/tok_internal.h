/*
 * tok_internal.h - the tokenizer's internal types, shared by src/tok/tok_*.c.
 *
 * Owner: the tokenizer module (tok_*.c); nothing outside src/tok includes
 * this file (the public surface is tokenizer.h).
 *
 * Threads: an ember_tokenizer is immutable after loading and may be used by
 * any number of threads at once. Everything an encode or a stream mutates
 * lives in a tok_ws workspace (scratch buffers, PCRE2 match data, the BPE
 * cache) or an ember_tok_stream, each used by one thread at a time.
 *
 * Semantics follow the reference implementation the project checks against
 * (the npm package @huggingface/tokenizers, run in node); where that package
 * lacks a feature (Split behaviours other than isolated/removed, single_word
 * added tokens, Metaspace split) the HuggingFace Rust semantics are used.
 * Text is always valid UTF-8 inside the module: input is sanitised first
 * (tok_utf8_sanitize, WHATWG replacement of invalid sequences).
 */
#ifndef EMBER_TOK_INTERNAL_H
#define EMBER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/utf8.h"
#include "core/util.h"
#include "tokenizer.h"

/* ---- limits (everything read from a file is bounded) --------------------- */
#define TOK_MAX_FILE_BYTES (512u * 1024u * 1024u) /* tokenizer.json */
#define TOK_MAX_CONFIG_BYTES (16u * 1024u * 1024u) /* tokenizer_config.json */
#define TOK_MAX_VOCAB (1 << 22)                   /* token ids: 0 .. 4M-1 */
#define TOK_MAX_MERGES (1 << 23)
#define TOK_MAX_ADDED (1 << 20)
#define TOK_MAX_TOKEN_BYTES (1 << 16) /* one token's text */
#define TOK_MAX_PATTERN_BYTES (1 << 16)
#define TOK_MAX_DEPTH 16 /* nested Sequence normalizers / pre-tokenizers / decoders */
#define TOK_MAX_SEQ_ITEMS 256
#define TOK_MAX_TEMPLATE_ITEMS 64
#define TOK_MAX_INPUT_BYTES ((size_t)256 << 20) /* one encode call */
#define TOK_MAX_DECODE_IDS ((size_t)1 << 26)
#define TOK_BPE_CACHE_MAX_KEY 256 /* pieces longer than this are not cached */
#define TOK_BPE_CACHE_SLOTS (1u << 15)
#define TOK_REGEX_MATCH_LIMIT 50000000u

/* ---- small utilities (tok_util.c) ---------------------------------------- */

typedef struct tok_sv {
    const char *p;
    size_t n;
} tok_sv;

/* Growable byte buffer; p is NUL-terminated whenever n > 0 or p != NULL. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_put(tok_buf *b, const void *s, size_t n);
int tok_buf_putc(tok_buf *b, char c);
int tok_buf_put_cp(tok_buf *b, uint32_t cp);
void tok_buf_free(tok_buf *b);

/* Growable int32 vector. */
typedef struct tok_ivec {
    int32_t *v;
    size_t n, cap;
} tok_ivec;

int tok_ivec_push(tok_ivec *v, int32_t x);
int tok_ivec_reserve(tok_ivec *v, size_t extra);
void tok_ivec_free(tok_ivec *v);

/* Bump allocator with stable pointers: chunks are kept across resets. */
typedef struct tok_arena_chunk tok_arena_chunk;
typedef struct tok_arena {
    tok_arena_chunk *head; /* chunk being filled */
    tok_arena_chunk *all;  /* every chunk, for freeing */
} tok_arena;

void *tok_arena_alloc(tok_arena *a, size_t n);
char *tok_arena_strdup(tok_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void tok_arena_reset(tok_arena *a);
void tok_arena_free(tok_arena *a);

/* A list of text pieces (pointers into the input, the arena or the
   tokenizer: never owned). */
typedef struct tok_piece {
    const char *p;
    size_t n;
} tok_piece;
typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
} tok_pieces;
int tok_pieces_push(tok_pieces *l, const char *p, size_t n);
void tok_pieces_free(tok_pieces *l);

/* Hash map from byte strings to int32 values: open addressing, linear
   probing, load at most 1/2. A slot holds the key pointer, its length and
   8 bits of its hash, and the value (16 bytes), so a probe that is not the
   key costs no access outside the table and a hit costs the slot and the
   key's bytes. Keys are not copied: they must outlive the map (the
   tokenizer keeps them in its pool). Keys are shorter than
   TOK_SMAP_MAX_KEY bytes. */
#define TOK_SMAP_MAX_KEY (1u << 24)
typedef struct tok_smap_ent {
    const char *k; /* NULL = empty slot */
    uint32_t nt;   /* key length | hash tag << 24 */
    int32_t v;
} tok_smap_ent;
typedef struct tok_smap {
    tok_smap_ent *slot;
    size_t mask; /* slot count - 1 */
    size_t n;    /* keys held */
} tok_smap;

uint64_t tok_hash(const void *p, size_t n);
/* Inserts or (when replace) overwrites; returns 0, EMBER_ERR_NOMEM, or
   EMBER_ERR_LIMIT for a key of TOK_SMAP_MAX_KEY bytes or more.
   *prev (may be NULL): the key's value before the call, -1 when it was not
   there. */
int tok_smap_put(tok_smap *m, const char *k, size_t n, int32_t v, bool replace, int32_t *prev);
/* The same with h = tok_hash(k, n) computed by the caller. */
int tok_smap_put_h(tok_smap *m, const char *k, size_t n, uint64_t h, int32_t v, bool replace, int32_t *prev);
/* Makes room for n keys in all without rehashing. */
int tok_smap_reserve(tok_smap *m, size_t n);
/* The value for k, or -1. */
int32_t tok_smap_get(const tok_smap *m, const char *k, size_t n);
/* The same with h = tok_hash(k, n) computed by the caller. */
int32_t tok_smap_get_h(const tok_smap *m, const char *k, size_t n, uint64_t h);
/* Loads ahead (a hint, no effect on results): the slot where the key of
   hash h is looked for first; then (once that slot is in cache) the key
   bytes that slot points to. Always inlined: GCC takes a function whose
   only effect is a prefetch for one without effects, and deletes its calls. */
#define TOK_PREFETCH_FN static inline __attribute__((always_inline)) void
TOK_PREFETCH_FN tok_smap_prefetch(const tok_smap *m, uint64_t h) {
    if (m->slot) __builtin_prefetch(&m->slot[(size_t)h & m->mask]);
}
TOK_PREFETCH_FN tok_smap_prefetch_key(const tok_smap *m, uint64_t h) {
    if (m->slot && m->slot[(size_t)h & m->mask].k) __builtin_prefetch(m->slot[(size_t)h & m->mask].k);
}
void tok_smap_free(tok_smap *m);

/* Hash map from uint64 keys to uint64 values (BPE merges). */
typedef struct tok_umap_ent {
    uint64_t key; /* UINT64_MAX = empty */
    uint64_t val;
} tok_umap_ent;
typedef struct tok_umap {
    tok_umap_ent *e; /* key and value side by side: one cache line per probe */
    size_t mask, n;
} tok_umap;
int tok_umap_init(tok_umap *m, size_t expected);
/* Shrinks an oversized table (fewer lookups miss the cache). */
int tok_umap_fit(tok_umap *m);
int tok_umap_put(tok_umap *m, uint64_t k, uint64_t v, bool replace); /* k != UINT64_MAX */
bool tok_umap_get(const tok_umap *m, uint64_t k, uint64_t *v);
/* Loads ahead (a hint): the slot where key k is looked for first. */
TOK_PREFETCH_FN tok_umap_prefetch(const tok_umap *m, uint64_t k) {
    if (m->e) __builtin_prefetch(&m->e[(size_t)ember_mix64(k) & m->mask]);
}
void tok_umap_free(tok_umap *m);

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Decodes one code point of VALID UTF-8 at p (p < end); returns its length. */
static inline size_t tok_utf8_next(const unsigned char *p, const unsigned char *end, uint32_t *cp) {
    unsigned c = p[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0 && p + 1 < end) {
        *cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0 && p + 2 < end) {
        *cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
        return 3;
    }
    if (c >= 0xF0 && p + 3 < end) {
        *cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
        return 4;
    }
    *cp = 0xFFFD; /* truncated: never happens on sanitised text */
    return 1;
}
/* Length of the UTF-8 sequence starting with byte c (1 for invalid leads). */
static inline size_t tok_utf8_len(unsigned char c) {
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
/* Encoding, validating decode, UTF-16 length: core/utf8.h (ember_utf8_*). */

/* WHATWG UTF-8 decoder state (streaming; also used by sanitize). */
typedef struct tok_u8dec {
    uint32_t cp;
    uint8_t need, seen, lo, hi;
} tok_u8dec;
/* Feeds one byte; appends complete characters (and U+FFFD for invalid
   sequences) to out. */
int tok_u8dec_byte(tok_u8dec *d, unsigned char b, tok_buf *out);
/* End of input: a pending incomplete sequence becomes U+FFFD. */
int tok_u8dec_finish(tok_u8dec *d, tok_buf *out);

/* Returns true when s[0..n) is valid UTF-8 (no surrogates, no overlongs). */
bool tok_utf8_valid(const char *s, size_t n);
/* Replaces every invalid sequence with U+FFFD exactly as the WHATWG decoder
   (node's TextDecoder, Buffer#toString) does. *out points to s itself when
   s is valid, else into buf. */
int tok_utf8_sanitize(const char *s, size_t n, tok_buf *buf, tok_sv *out);

/* JS String.prototype.trim whitespace: ember_js_space (core/utf8.h). */
/* Unicode White_Space (what the reference's \s means in tokenizer.json regexes). */
bool tok_uni_space(uint32_t cp);
/* trimStart / trimEnd on valid UTF-8 (returns the trimmed view). */
tok_sv tok_trim_start(tok_sv s);
tok_sv tok_trim_end(tok_sv s);

/* GPT-2 byte <-> unicode mapping. */
extern const uint16_t tok_byte_to_cp[256];
/* The byte for a mapped code point, or -1. */
int tok_cp_to_byte(uint32_t cp);

/* ---- regular expressions (tok_regex.c) ----------------------------------- */

/* A compiled pattern: a literal string or a PCRE2 regex. */
typedef struct tok_pattern {
    bool is_regex;
    char *lit; /* literal (is_regex false) */
    size_t lit_n;
    pcre2_code *re;
    uint32_t n_caps; /* capture groups in re */
} tok_pattern;

/* Translates a tokenizer.json (Oniguruma-flavoured) regex into PCRE2 syntax
   with the reference's meaning (\s = White_Space, (?i:) folds ASCII only,
   '.' excludes only \n, {n,m}+ is a repeated repeat, ...). On success
   *out is malloc'd (caller frees). */
int tok_regex_translate(const char *src, size_t n, char **out, size_t *out_n, ember_error *err,
                        const char *where);
/* Compiles a translated pattern (PCRE2_UTF | PCRE2_UCP, JIT when
   available). *out is owned by the caller (pcre2_code_free). */
int tok_regex_compile_raw(const char *pcre, size_t n, pcre2_code **out, ember_error *err, const char *where);
/* Compiles a tokenizer.json "pattern" object value: {"String": s} or
   {"Regex": r} already extracted into kind/text. */
int tok_pattern_init(tok_pattern *p, bool is_regex, const char *text, size_t n, ember_error *err,
                     const char *where);
void tok_pattern_free(tok_pattern *p);

/* Per-thread regex scratch. */
typedef struct tok_rx {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    uint32_t ovec_pairs;
} tok_rx;
int tok_rx_init(tok_rx *rx, uint32_t max_caps);
void tok_rx_free(tok_rx *rx);

/* Finds the leftmost match of p in s[0..n) at or after byte offset from.
   Returns 1 with *ms and *me set, 0 when there is none, or a negative status
   (err filled) when the regex engine gives up (match limit). */
int tok_pattern_find(const tok_pattern *p, tok_rx *rx, const char *s, size_t n, size_t from, size_t *ms,
                     size_t *me, ember_error *err);
/* After a successful regex find: capture group g (1-based) bounds, false
   when the group did not participate. */
bool tok_rx_group(const tok_rx *rx, uint32_t g, size_t *gs, size_t *ge);

/* JS String.prototype.replaceAll(pattern, content) with the pattern global:
   content's $$, $&, $1.. are expanded for regex patterns. Appends to out. */
int tok_pattern_replace_all(const tok_pattern *p, tok_rx *rx, const char *s, size_t n, const char *content,
                            size_t content_n, tok_buf *out, ember_error *err);

/* ---- workspace ------------------------------------------------------------ */

typedef struct tok_cache_ent {
    uint64_t h;
    uint32_t key_off, key_n; /* into cache_keys */
    uint32_t ids_off, ids_n; /* into cache_ids */
} tok_cache_ent;

struct ember_tok_ws {
    const struct ember_tokenizer *tok; /* the tokenizer it was made for */
    tok_rx rx;
    tok_arena arena;      /* per-call strings */
    tok_pieces pa, pb;    /* pre-tokenizer ping-pong */
    tok_pieces sections, subs;
    tok_buf tmp, tmp2;
    /* BPE scratch */
    int32_t *sym_id;
    uint32_t *sym_off, *sym_len;
    int32_t *sym_prev, *sym_next;
    uint64_t *heap;
    size_t heap_n, sym_cap, heap_cap;
    tok_ivec model_out;
    /* BPE cache: open addressing on the piece bytes, cleared when full */
    tok_cache_ent *cache;
    size_t cache_used;
    tok_buf cache_keys;
    tok_ivec cache_ids;
    /* Split segments */
    struct tok_seg {
        size_t s, e;
        bool m;
    } *segs;
    size_t segs_cap;
    /* NFC quick check: 2 bits per code point below 0x30000 (0 unknown,
       1 stable starter, 2 not), filled lazily */
    uint8_t *nfc_state;
    /* Unigram / WordPiece scratch */
    double *dbl;
    int32_t *i32a, *i32b;
    size_t dbl_cap, i32_cap;
};

/* ---- normalizers (tok_normalize.c) ---------------------------------------- */

typedef enum tok_norm_type {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_STRIP,
    TOK_NORM_STRIP_ACCENTS,
    TOK_NORM_BERT,
    TOK_NORM_PRECOMPILED,
    TOK_NORM_SEQUENCE
} tok_norm_type;

typedef struct tok_norm {
    tok_norm_type type;
    tok_pattern pat; /* REPLACE */
    char *str;       /* REPLACE content, PREPEND text */
    size_t str_n;
    bool left, right;                                        /* STRIP */
    bool clean_text, chinese_chars, lowercase, strip_accents; /* BERT (strip_accents: -1 handled at load) */
    int strip_accents_mode;                                  /* BERT: -1 = follow lowercase, 0, 1 */
    struct tok_norm *kids;                                   /* SEQUENCE */
    size_t n_kids;
} tok_norm;

/* Normalizes s into a new string (arena), *out. */
int tok_normalize(const tok_norm *nm, struct ember_tok_ws *ws, tok_sv s, tok_sv *out, ember_error *err);
void tok_norm_free(tok_norm *nm);

/* ---- pre-tokenizers (tok_pretok.c) ---------------------------------------- */

typedef enum tok_pre_type {
    TOK_PRE_BYTELEVEL,
    TOK_PRE_SPLIT,
    TOK_PRE_METASPACE,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_BERT,
    TOK_PRE_PUNCTUATION,
    TOK_PRE_DIGITS,
    TOK_PRE_REPLACE,
    TOK_PRE_FIXED_LENGTH,
    TOK_PRE_SEQUENCE
} tok_pre_type;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend;

typedef struct tok_pretok {
    tok_pre_type type;
    tok_pattern pat;      /* SPLIT, REPLACE, and the built-in regex of BYTELEVEL/others */
    bool has_pat;
    tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* BYTELEVEL */
    bool use_regex;        /* BYTELEVEL */
    bool map_bytes;        /* BYTELEVEL: really map bytes to chars (false when the
                              model consumes raw bytes: it is the last stage) */
    char *repl;            /* METASPACE replacement (UTF-8), REPLACE content */
    size_t repl_n;
    tok_prepend prepend;   /* METASPACE */
    bool split;            /* METASPACE */
    bool individual_digits;
    size_t length;         /* FIXED_LENGTH */
    struct tok_pretok *kids;
    size_t n_kids;
} tok_pretok;

/* Pre-tokenizes `in` (section index si, for Metaspace "first") into pieces
   appended to *out. */
int tok_pretokenize(const tok_pretok *pt, struct ember_tok_ws *ws, const tok_pieces *in, size_t si,
                    tok_pieces *out, ember_error *err);
void tok_pretok_free(tok_pretok *pt);
/* A ByteLevel pre-tokenizer (the GPT-2 regex with JavaScript's \s when use_regex). */
int tok_pre_bytelevel_init(tok_pretok *pt, bool add_prefix_space, bool use_regex, ember_error *err, const char *name);
/* Byte-level mode when ByteLevel is the last pre-tokenizer of a BPE model. */
void tok_choose_byte_mode(struct ember_tokenizer *t);
/* Class bodies: JavaScript's \s, Unicode White_Space. */
extern const char tok_js_space_class[];
extern const char tok_uni_space_class[];

/* ---- models (tok_bpe.c, tok_wordpiece.c, tok_unigram.c) -------------------- */

typedef enum tok_model_type { TOK_MODEL_BPE, TOK_MODEL_WORDPIECE, TOK_MODEL_UNIGRAM } tok_model_type;

typedef struct tok_model {
    tok_model_type type;
    /* BPE */
    tok_umap merges;     /* (left id << 32 | right id) -> (rank << 32 | merged id) */
    bool byte_mode;      /* pieces are raw bytes; symbols via byte_sym */
    int32_t byte_sym[256];
    int32_t ascii_sym[128]; /* char mode: the id of each ASCII character (-1 none) */
    tok_smap raw_map;    /* byte_mode: raw bytes -> id (for ignore_merges) */
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t byte_tok[256]; /* <0xXX> token ids, -1 if absent */
    char *eow_suffix;      /* end_of_word_suffix ("" = none) */
    size_t eow_n;
    char *cont_suffix;     /* continuing_subword_suffix */
    size_t cont_n;
    char *cont_prefix;     /* WordPiece continuing_subword_prefix */
    size_t cont_prefix_n;
    char *word_prefix;     /* WordPiece (GGUF): prefix of word-initial pieces */
    size_t word_prefix_n;
    size_t max_chars;      /* WordPiece max_input_chars_per_word */
    int32_t unk_id;        /* -1 when none */
    char *unk_str;         /* unk token text (NULL when none) */
    size_t unk_n;
    /* Unigram */
    double *scores;        /* per vocabulary id (the first n_scores ids) */
    size_t n_scores;
    double unk_score;
    size_t max_piece_chars;
    struct tok_trie *pieces; /* Unigram: vocabulary pieces -> id (prefix search) */
    /* SPM-style scores (GGUF llama): merges generated from scores */
} tok_model;

/* Runs the model over pieces (one call = one "model(section_tokens)" of the
   reference: fuse_unk works across its pieces); appends ids to out. */
int tok_model_encode(const struct ember_tokenizer *t, struct ember_tok_ws *ws, const tok_pieces *pieces,
                     tok_ivec *out, ember_error *err);
int tok_bpe_word(const struct ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n,
                 tok_ivec *out, ember_error *err);
int tok_wordpiece_word(const struct ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n,
                       tok_ivec *out, ember_error *err);
int tok_unigram_word(const struct ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n,
                     tok_ivec *out, ember_error *err);
void tok_model_free(tok_model *m);

/* ---- added tokens (tok_added.c) ------------------------------------------- */

typedef struct tok_added {
    int32_t id;
    char *content; /* in the tokenizer pool */
    size_t n;
    char *norm; /* normalized content (normalized && normalizer), else NULL */
    size_t norm_n;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Byte trie for leftmost-longest dictionary splitting. */
typedef struct tok_trie {
    tok_umap edges;   /* (node << 8 | byte) -> child */
    int32_t *term;    /* node -> added index + 1, 0 = none */
    size_t n_nodes, cap;
    uint8_t first[32]; /* bitmap of first bytes */
} tok_trie;
int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t value);
void tok_trie_free(tok_trie *tr);
/* Splits s like the reference's DictionarySplitter (leftmost, longest
   match); pushes the pieces (matches and the text between) to out. */
int tok_trie_split(const ember_tokenizer *t, const tok_trie *tr, tok_sv s, tok_pieces *out);
/* The added token whose content (or normalized content) is s, or NULL;
   special ones only when parse_special. */
const tok_added *tok_added_lookup(const ember_tokenizer *t, const char *s, size_t n, bool parse_special);

/* ---- post-processors ------------------------------------------------------ */

typedef enum tok_post_type { TOK_POST_TEMPLATE, TOK_POST_BERT } tok_post_type;
/* One post-processor step (a Sequence is a list of steps; ByteLevel does
   nothing and is not stored). Bert and Roberta are the same for one text. */
typedef struct tok_post {
    tok_post_type type;
    /* TEMPLATE single: items; id >= 0 special token, TOK_POST_SEQ_A = sequence A */
    int32_t *single;
    size_t n_single;
    int32_t cls_id, sep_id;
} tok_post;
#define TOK_POST_SEQ_A (-2)
#define TOK_POST_SKIP (-3) /* a special token the reference could not map */

/* ---- decoders (tok_decode.c) ----------------------------------------------- */

typedef enum tok_dec_type {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_WORDPIECE,
    TOK_DEC_METASPACE,
    TOK_DEC_BPE,
    TOK_DEC_CTC,
    TOK_DEC_REPLACE,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_SEQUENCE
} tok_dec_type;

typedef struct tok_dec {
    tok_dec_type type;
    tok_pattern pat; /* REPLACE */
    bool has_pat;
    char *str; /* REPLACE content, METASPACE replacement, WORDPIECE prefix, BPE suffix, CTC pad */
    size_t str_n;
    char *str2; /* CTC word delimiter */
    size_t str2_n;
    bool cleanup; /* WORDPIECE / CTC */
    uint32_t strip_cp; /* STRIP content (single BMP code point), 0x110000 = never matches */
    size_t start, stop;
    struct tok_dec *kids;
    size_t n_kids;
} tok_dec;
void tok_dec_free(tok_dec *d);

/* Streaming plan compiled from the decoder chain (see tok_decode.c). */
typedef enum tok_sop_type { TOK_SOP_REPLACE, TOK_SOP_METASPACE, TOK_SOP_WORDPIECE, TOK_SOP_STRIP, TOK_SOP_JOIN } tok_sop_type;
typedef struct tok_sop {
    tok_sop_type type;
    const tok_dec *d; /* the decoder it came from (JOIN: NULL) */
} tok_sop;
typedef struct tok_splan {
    bool ok;
    tok_sop ops[TOK_MAX_SEQ_ITEMS];
    size_t n_ops;
    int bytes; /* 0 none, 1 ByteLevel, 2 ByteFallback */
    bool strip_whole;
    uint32_t strip_cp;
    size_t strip_start, strip_stop;
} tok_splan;

/* ---- the tokenizer ---------------------------------------------------------- */

enum {
    TOK_F_ADDED = 1,   /* the id's text equals an added token's content */
    TOK_F_SPECIAL = 2, /* the id's text is a special token (skip_special_tokens) */
    TOK_F_PHANTOM = 4, /* internal: a merge part/result absent from the vocabulary */
    TOK_F_SHADOWED = 8 /* internal (loading): a later id has the same text, the map names that one */
};

struct ember_tokenizer {
    char *name; /* file named in messages */
    ember_tok_kind kind;
    tok_arena pool; /* every string the tokenizer owns */
    int32_t n_ids;  /* id space: 0 .. n_ids-1 (vocab + added) */
    int32_t n_all;  /* n_ids + phantom ids */
    int64_t merge_off; /* loading: merged id - rank of the last merge added */
    size_t id_cap;  /* allocated entries of text / flags */
    tok_sv *text;   /* id -> text as in the file (NULL p = no token), size n_all */
    uint8_t *flags; /* size n_all */
    tok_smap map;   /* text -> id (vocab, added contents override, phantoms) */
    int32_t *remap; /* NULL or n_all: final id for a model id (added normalized contents) */
    tok_model model;
    tok_norm *norm;
    tok_pretok *pre;
    bool pre_ends_bytelevel; /* model runs on raw bytes */
    tok_post *posts;
    size_t n_posts;
    tok_dec *dec;
    bool dec_regex; /* the decoder chain has a regex Replace */
    tok_splan plan;
    tok_added *added;
    size_t n_added;
    tok_smap added_map; /* content and normalized content -> added index */
    tok_trie trie_raw, trie_norm;
    bool has_trie_raw, has_trie_norm;
    tok_trie trie_raw_ns, trie_norm_ns; /* without special tokens (EMBER_TOK_NO_PARSE_SPECIAL) */
    bool has_trie_raw_ns, has_trie_norm_ns;
    tok_smap special_set; /* contents counted as special by skip_special_tokens */
    /* tokenizer_config.json */
    bool cleanup;
    bool remove_space;
    bool lower_remove_accent;
    int32_t bos_id, eos_id, pad_id, unk_cfg_id;
    bool add_bos, add_eos; /* informational (what the post-processor does) */
    uint32_t max_caps;
};

/* Builders used by the loaders (tok_json.c, tok_gguf.c). */
int tok_new(const char *name, ember_tokenizer **out, ember_error *err);
/* Sets id's text (copied into the pool), growing the id space. */
int tok_set_text(ember_tokenizer *t, int32_t id, const char *s, size_t n, ember_error *err);
/* The same with h = tok_hash(s, n) computed by the caller. */
int tok_set_text_h(ember_tokenizer *t, int32_t id, const char *s, size_t n, uint64_t h, ember_error *err);
/* Finishes loading: maps, tries, byte tables, the streaming plan. */
int tok_finish(ember_tokenizer *t, ember_error *err);
/* Registers an added token (content copied). */
int tok_add_added(ember_tokenizer *t, int32_t id, const char *s, size_t n, bool special, bool lstrip,
                  bool rstrip, bool normalized, bool single_word, ember_error *err);
/* An id for text s, creating a phantom id when absent (merges). */
int tok_id_or_phantom(ember_tokenizer *t, const char *s, size_t n, int32_t *id, ember_error *err);
/* The same with h = tok_hash(s, n) computed by the caller. */
int tok_id_or_phantom_h(ember_tokenizer *t, const char *s, size_t n, uint64_t h, int32_t *id, ember_error *err);
/* Adds a BPE merge left+right (by id) with the given rank. The merged
   text's id is first guessed as rank + the offset the previous merge had
   (vocabularies list merge results in merge order) and checked against
   the texts, so most merges skip a map lookup. */
int tok_add_merge(ember_tokenizer *t, int32_t left, int32_t right, uint32_t rank, ember_error *err);
/* tok_add_merge without the last step: the merge table's key and value
   for the merge (creating the merged text's phantom id when needed), for a
   caller that puts them into t->model.merges itself, in rank order. */
int tok_merge_entry(ember_tokenizer *t, int32_t left, int32_t right, uint32_t rank, uint64_t *key, uint64_t *val,
                    ember_error *err);

/* Final id of a model-produced id (added-token remapping). */
static inline int32_t tok_final_id(const struct ember_tokenizer *t, int32_t id) {
    return t->remap ? t->remap[id] : id;
}

/* Fast path for model.vocab / model.merges (tok_jfast.c). locate: 1 when
   both spans were found in a plain layout (merges may be absent), with the
   number of JSON strings in each (which sizes the tables). compact:
   a NUL-terminated ember_malloc'd copy of json[0..n) where the vocab span
   is "{}" and the merges span (when found) "[]", its length in *out_n; NULL
   when out of memory. Line numbers in it differ from the file's: jansson's
   messages about it are never shown (a parse failure loads the file again
   without the fast path). vocab / merges: 1 done, 0 not applicable (load
   again without the fast path), -1 error. */
int tok_jfast_locate(const char *json, size_t n, tok_sv *vocab, tok_sv *merges, size_t *vocab_strings,
                     size_t *merges_strings);
char *tok_jfast_compact(const char *json, size_t n, const tok_sv *vocab, const tok_sv *merges, size_t *out_n);
int tok_jfast_vocab(struct ember_tokenizer *t, tok_sv span, size_t strings, ember_error *err);
int tok_jfast_merges(struct ember_tokenizer *t, tok_sv span, size_t strings, ember_error *err);

/* Loader entry points. */
int tok_load_json_text(const char *name, const char *json, size_t n, const char *cfg_name, const char *cfg_json,
                       size_t cfg_n, ember_tokenizer **out, ember_error *err);

/* Decoding helpers (tok_decode.c). */
int tok_decode_full(const ember_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, tok_buf *out,
                    ember_error *err);
void tok_plan_compile(ember_tokenizer *t);
/* JS clean_up_tokenization on s, appended to out. */
int tok_cleanup_append(const char *s, size_t n, tok_buf *out);

#endif
