/*
 * jinja_internal.h - what the pieces of the Jinja interpreter share (not for
 * use outside src/template/jinja*.c): the arena, the string builder, UTF-8 /
 * JavaScript string helpers, tokens and the syntax tree.
 *
 * Ownership: a jinja_template owns one arena holding its tokens and syntax
 * tree (and the preprocessed source they point into); a jinja_ctx owns
 * another for values. jsb (string builder) buffers are malloc'd and owned by
 * whoever declared the jsb; jsb_free releases them.
 */
#ifndef EMBER_TEMPLATE_JINJA_INTERNAL_H
#define EMBER_TEMPLATE_JINJA_INTERNAL_H

#include "core/utf8.h"
#include "template/jinja.h"

/* ---- arena ---- */
typedef struct ja_chunk ja_chunk;
typedef struct jarena {
    ja_chunk *head;
    void *last;    /* the newest allocation (ja_grow extends it in place) */
    size_t total;  /* bytes obtained from malloc */
    size_t limit;  /* 0: unlimited */
    int failed;    /* 0, or the EMBER_ERR_* code of the first failure */
} jarena;

void ja_init(jarena *a, size_t limit);
void ja_release(jarena *a);
/* n bytes, 16-aligned, zeroed; NULL (and a->failed set) on limit or OOM. */
void *ja_alloc(jarena *a, size_t n);
/* Resizes p (old bytes, from this arena) to n bytes; extends in place when p
   is the newest allocation. NULL on failure (p stays valid). */
void *ja_grow(jarena *a, void *p, size_t old, size_t n);
char *ja_strdup(jarena *a, const char *s, size_t n);

/* ---- string builder (malloc'd) ---- */
typedef struct jsb {
    char *p;
    size_t len, cap;
    size_t limit; /* 0: unlimited */
    int failed;   /* 0, EMBER_ERR_NOMEM or EMBER_ERR_LIMIT */
} jsb;

void jsb_init(jsb *b, size_t limit);
void jsb_free(jsb *b);
bool jsb_add(jsb *b, const char *s, size_t n);
bool jsb_addc(jsb *b, char c);
bool jsb_adds(jsb *b, const char *s);

/* ---- UTF-8 and JavaScript string semantics ---- */
/* Decoding, encoding, UTF-16 length and JavaScript's whitespace are the
   shared helpers of core/utf8.h (ember_utf8_decode, ember_utf8_put,
   ember_utf16_len, ember_js_space). */
/* Byte length of the JS whitespace character at s (0 if none). */
size_t ju_space_len(const char *s, size_t n);
/* Case mapping as JavaScript's toUpperCase / toLowerCase do it, one code
   point at a time (jinja_case.c, generated): the 1:1 mapping, and the UTF-8
   of a multi-code-point result (U+00DF -> "SS") or NULL. */
uint32_t ju_upper(uint32_t cp);
uint32_t ju_lower(uint32_t cp);
const char *ju_upper_special(uint32_t cp);
const char *ju_lower_special(uint32_t cp);
/* JavaScript Number.prototype.toString (shortest round trip). buf >= 32. */
void js_num_str(double x, char *buf);

/* ---- tokens ---- */
typedef enum jtok_type {
    T_TEXT,
    T_OPEN_STMT,  /* {% */
    T_CLOSE_STMT, /* %} */
    T_OPEN_EXPR,  /* {{ */
    T_CLOSE_EXPR, /* }} */
    T_OPEN_PAREN,
    T_CLOSE_PAREN,
    T_OPEN_CURLY,
    T_CLOSE_CURLY,
    T_OPEN_SQUARE,
    T_CLOSE_SQUARE,
    T_COMMA,
    T_DOT,
    T_COLON,
    T_PIPE,
    T_CMP,    /* <= >= == != < > */
    T_ADD,    /* + - ~ */
    T_POW,    /* ** */
    T_MUL,    /* * // / % */
    T_EQUALS, /* = */
    T_UNARY,  /* - or + before an operand */
    T_STRING,
    T_NUMBER,
    T_IDENT,
    T_COMMENT,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    const char *s; /* value (arena or preprocessed source) */
    size_t n;
    size_t pos;    /* byte offset in the original source */
} jtok;

/* ---- syntax tree ---- */
typedef enum jnode_kind {
    N_TEXT, /* also string literals */
    N_INT,
    N_FLOAT,
    N_ARRAY,
    N_TUPLE,
    N_OBJECT,
    N_IDENT,
    N_MEMBER,
    N_CALL,
    N_UNARY,
    N_BINARY,
    N_FILTER,
    N_TEST,
    N_SELECT,  /* x if cond (no else) */
    N_TERNARY,
    N_SLICE,
    N_KWARG,   /* name=value inside an argument list */
    N_SPREAD,  /* *x */
    N_KWSPREAD, /* **x */
    N_COMMENT,
    N_IF,
    N_FOR,
    N_SET,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
} jnode_kind;

typedef enum jop {
    OP_NONE,
    OP_AND, OP_OR, OP_NOT,
    OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
    OP_IN, OP_NOT_IN,
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
} jop;

typedef struct jnode jnode;
typedef struct jnodes {
    jnode **v;
    size_t n;
} jnodes;

struct jnode {
    jnode_kind kind;
    size_t pos;        /* original source offset, for errors */
    jop op;
    bool negate;       /* N_TEST: "is not"; N_MEMBER: computed ([...]) */
    const char *s;     /* N_TEXT, N_IDENT, N_TEST (test name), N_KWARG (name) */
    size_t n;
    double num;        /* N_INT, N_FLOAT */
    jnode *a, *b, *c;  /* operands: member (object, property), binary (l, r),
                          ternary (cond, yes, no), select (lhs, test),
                          slice (start, stop, step), filter (operand, filter),
                          call (callee), for (target, iterable), set (target,
                          value), if (test), kwarg (-, value), macro (name),
                          callblock (call expr), filterblock (filter) */
    jnodes list;       /* array/tuple items, call args, object keys */
    jnodes list2;      /* object values, macro/caller params */
    jnodes body;       /* if/for/set/macro/callblock/filterblock body */
    jnodes alt;        /* if: else branch; for: else block */
    bool uses_kwargs, uses_varargs; /* macro / call block */
};

struct jinja_template {
    jarena arena;
    char *source; /* copy of the original source (for line/column) */
    size_t source_len;
    jnodes body;
    bool loop_escapes; /* `loop` is used other than as loop.attr somewhere */
};

/* Lexer: preprocesses and tokenizes src into the template's arena. */
int jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, size_t *ntoks, ember_error *err,
              const char *orig, size_t orig_len);
/* Parser: builds t->body from the tokens. */
int jinja_parse(jinja_template *t, const jtok *toks, size_t ntoks, int max_nesting, ember_error *err);
/* "template:LINE:COL: " error with the position of pos in src. */
int jinja_err_at(ember_error *err, int code, const char *src, size_t src_len, size_t pos, const char *fmt, ...)
    EMBER_PRINTF(6, 7);

#endif
