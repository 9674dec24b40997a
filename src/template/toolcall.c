/*
 * toolcall.c - parsing tool calls out of generated text; see toolcall.h.
 *
 * Design: the parser keeps the text it has not decided yet in one buffer.
 * Each feed runs a small state machine over it:
 *   TEXT        look for the format's start markers; text before one is
 *               content; a suffix that may be the start of a marker is held;
 *   at a marker the format's own function (hermes_call, mistral_call, ...)
 *               looks at the text from the marker on and answers NEED (not
 *               decided yet: hold it), CALL (complete and well formed: the
 *               calls are reported, the bytes consumed) or BAD (malformed:
 *               the marker becomes content and the scan goes on after it).
 *   Calls whose head ({"name": "f", "arguments": { or NAME[ARGS]{) comes
 *   first stream instead (ST_ARGS: the arguments through an incremental JSON
 *   check, each accepted byte reported at once; ST_TAIL: the call's closing
 *   '}' and marker); see "streamed calls" below.
 *   Llama 3 has no marker in front of a call: a call is only recognized at
 *   the very start of the text (LLAMA_START), calls may follow each other
 *   separated by ';' (LLAMA_AFTER), and the first thing that is not a call
 *   turns the rest of the text into content (PLAIN).
 * Every decision depends only on bytes already seen (more text never turns a
 * CALL into a BAD or back), and at the end NEED is never answered, so the
 * events do not depend on how the text was split.
 *
 * Ownership: the parser owns its buffer; events point into it or into
 * temporaries that live during the sink call only. Errors are returned,
 * never printed.
 */
#define _GNU_SOURCE
#include "template/toolcall.h"
#include "core/alloc.h"
#include "core/util.h"
#include "tok/tokenizer.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

#define MAX_NAME 256  /* bytes of a function or parameter name */
#define MAX_DEPTH 128 /* nesting of argument values */

enum { ST_TEXT, ST_LLAMA_START, ST_LLAMA_CALL, ST_LLAMA_AFTER, ST_PLAIN, ST_ARGS, ST_TAIL };
enum { R_NEED, R_CALL, R_BAD };
enum { TAIL_NONE, TAIL_HERMES, TAIL_LLAMA };

/* The incremental JSON checker of a streamed call's arguments. */
typedef struct jscan {
    char stack[MAX_DEPTH]; /* the closing bracket of each open level */
    int depth, st, num, hex, lit_pos;
    const char *lit;
    bool key, done;
} jscan;

struct ember_tool_parser {
    ember_tool_format f;
    const json_t *tools;
    char *buf;
    size_t len, cap;
    int state;
    int n_calls;
    bool finished, failed;
    /* a streamed call (ST_ARGS, then ST_TAIL) */
    jscan js;
    int call_idx, tail, resume; /* resume: the state after the call */
    ember_tool_sink sink;
    void *user;
};

/* ---- names and detection ------------------------------------------------------------ */

static const char *const k_names[] = {"none", "hermes", "qwen3_coder", "llama3_json", "mistral", "gemma4"};

const char *ember_tool_format_name(ember_tool_format f) {
    return (unsigned)f < sizeof k_names / sizeof k_names[0] ? k_names[f] : "none";
}

bool ember_tool_format_from_name(const char *name, ember_tool_format *out) {
    for (size_t i = 0; name && i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i])) {
            *out = (ember_tool_format)i;
            return true;
        }
    return false;
}

const char *ember_tool_format_names(void) {
    return "none, hermes, qwen3_coder, llama3_json, mistral, gemma4";
}

static bool has(const char *t, size_t n, const char *needle) {
    return t && memmem(t, n, needle, strlen(needle)) != NULL;
}

ember_tool_format ember_tool_format_detect(const char *t, size_t n) {
    if (!t) return EMBER_TOOLS_NONE;
    if (has(t, n, "<|tool_call>")) return EMBER_TOOLS_GEMMA4;
    if (has(t, n, "<function=") && has(t, n, "<parameter=")) return EMBER_TOOLS_QWEN3_CODER;
    if (has(t, n, "<tool_call>")) return EMBER_TOOLS_HERMES;
    if (has(t, n, "[TOOL_CALLS]")) return EMBER_TOOLS_MISTRAL;
    if (has(t, n, "<|python_tag|>") || (has(t, n, "<|start_header_id|>") && has(t, n, "\"parameters\"")))
        return EMBER_TOOLS_LLAMA3;
    return EMBER_TOOLS_NONE;
}

static const char *const k_mark_none[] = {NULL};
static const char *const k_mark_hermes[] = {"<tool_call>", "</tool_call>", NULL};
static const char *const k_mark_coder[] = {"<tool_call>", "</tool_call>", NULL};
static const char *const k_mark_llama[] = {"<|python_tag|>", NULL};
static const char *const k_mark_mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", NULL};
static const char *const k_mark_gemma[] = {"<|tool_call>", "<tool_call|>", "<|\"|>", NULL};

const char *const *ember_tool_format_markers(ember_tool_format f) {
    switch (f) {
    case EMBER_TOOLS_HERMES: return k_mark_hermes;
    case EMBER_TOOLS_QWEN3_CODER: return k_mark_coder;
    case EMBER_TOOLS_LLAMA3: return k_mark_llama;
    case EMBER_TOOLS_MISTRAL: return k_mark_mistral;
    case EMBER_TOOLS_GEMMA4: return k_mark_gemma;
    default: return k_mark_none;
    }
}

int ember_tool_format_marker_ids(ember_tool_format f, const ember_tokenizer *tok, int32_t *ids, int max) {
    int n = 0;
    for (const char *const *mk = ember_tool_format_markers(f); *mk && n < max; mk++) {
        int32_t id = ember_tok_text_id(tok, *mk, strlen(*mk));
        if (id >= 0 && ember_tok_is_special(tok, id)) ids[n++] = id;
    }
    return n;
}

void ember_tool_call_id(ember_tool_format f, const char *prefix, uint64_t k, uint64_t salt, uint64_t salt9, char *out,
                        size_t n) {
    if (f == EMBER_TOOLS_MISTRAL && n > 9) {
        static const char al[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        const uint64_t space = 13537086546263552ull; /* 62^9 */
        uint64_t x = (k % space + ember_mix64(salt9) % space) % space;
        for (int i = 0; i < 9; i++, x /= 62) out[i] = al[x % 62];
        out[9] = 0;
        return;
    }
    snprintf(out, n, "%s%016llx%08lx", prefix, (unsigned long long)ember_mix64(k ^ salt), (unsigned long)(k & 0xffffffffUL));
}

/* The markers that start a call in the TEXT state. */
static const char *const k_start_hermes[] = {"<tool_call>", NULL};
static const char *const k_start_coder[] = {"<tool_call>", "<function=", NULL};
static const char *const k_start_mistral[] = {"[TOOL_CALLS]", NULL};
static const char *const k_start_gemma[] = {"<|tool_call>", NULL};

static const char *const *start_markers(ember_tool_format f) {
    switch (f) {
    case EMBER_TOOLS_HERMES: return k_start_hermes;
    case EMBER_TOOLS_QWEN3_CODER: return k_start_coder;
    case EMBER_TOOLS_MISTRAL: return k_start_mistral;
    case EMBER_TOOLS_GEMMA4: return k_start_gemma;
    default: return k_mark_none;
    }
}

/* ---- small text helpers ---------------------------------------------------------------- */

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* Whether s[at..n) starts with lit: 1 yes, 0 not known yet (s[at..n) is a
   proper prefix of lit), -1 no. */
static int expect(const char *s, size_t n, size_t at, const char *lit) {
    size_t l = strlen(lit), have = n - at;
    if (have >= l) return memcmp(s + at, lit, l) == 0 ? 1 : -1;
    return memcmp(s + at, lit, have) == 0 ? 0 : -1;
}

static const char *find(const char *s, size_t n, const char *lit) {
    return memmem(s, n, lit, strlen(lit));
}

/* Characters of a function name (OpenAI's ^[a-zA-Z0-9_-]{1,64}$ plus '.',
   which some models use in namespaced names). */
static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

static bool valid_name(const char *s, size_t n) {
    if (n == 0 || n > MAX_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i])) return false;
    return true;
}

/* The extent of the JSON value starting at s[0] (no leading white space):
   1 complete (*end just past it), 0 not complete yet, -1 not JSON (wrong
   bracket, too deep, a character no value starts with). Objects, arrays and
   strings are delimited exactly; numbers and literals extend over the
   characters they may hold (the caller validates the span with jansson). */
static int json_span(const char *s, size_t n, size_t *end) {
    if (n == 0) return 0;
    char stack[MAX_DEPTH];
    int depth = 0;
    size_t i = 0;
    if (s[0] != '{' && s[0] != '[' && s[0] != '"') {
        while (i < n && (name_char(s[i]) || s[i] == '+')) i++;
        if (i == 0) return -1;
        if (i == n) return 0;
        *end = i;
        return 1;
    }
    bool in_str = false;
    for (; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"') {
                in_str = false;
                if (depth == 0) {
                    *end = i + 1;
                    return 1;
                }
            }
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH) return -1;
            stack[depth++] = c == '{' ? '}' : ']';
        } else if (c == '}' || c == ']') {
            if (depth == 0 || stack[depth - 1] != c) return -1;
            if (--depth == 0) {
                *end = i + 1;
                return 1;
            }
        }
    }
    return 0;
}

/* The raw text of member key of the JSON object text s[0..n) (already
   validated by jansson): sets *b and *e (the last such member, as jansson
   keeps the last of duplicates). Returns false when absent. */
static bool member_span(const char *s, size_t n, const char *key, size_t *b, size_t *e) {
    size_t i = skip_ws(s, n, 0);
    bool found = false;
    if (i >= n || s[i] != '{') return false;
    i++;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] == '}') return found;
        size_t ke;
        if (json_span(s + i, n - i, &ke) != 1) return found;
        json_t *k = json_loadb(s + i, ke, JSON_DECODE_ANY, NULL);
        bool match = json_is_string(k) && json_string_length(k) == strlen(key) && !strcmp(json_string_value(k), key);
        json_decref(k);
        i = skip_ws(s, n, i + ke);
        if (i >= n || s[i] != ':') return found;
        i = skip_ws(s, n, i + 1);
        size_t ve;
        if (json_span(s + i, n - i, &ve) != 1) return found;
        if (match) {
            *b = i;
            *e = i + ve;
            found = true;
        }
        i = skip_ws(s, n, i + ve);
        if (i < n && s[i] == ',') i++;
    }
}

/* ---- growable text (for converted arguments) ---------------------------------------------- */

typedef struct tbuf {
    char *d;
    size_t n, cap;
    bool oom;
} tbuf;

static void tb_add(tbuf *t, const char *s, size_t n) {
    if (t->oom || n == 0) return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->n + n + 1) cap *= 2;
        char *d = ember_realloc(t->d, cap);
        if (!d) {
            t->oom = true;
            return;
        }
        t->d = d;
        t->cap = cap;
    }
    memcpy(t->d + t->n, s, n);
    t->n += n;
    t->d[t->n] = 0;
}

static void tb_str(tbuf *t, const char *s) {
    tb_add(t, s, strlen(s));
}

/* Appends s[0..n) as a JSON string; false when it is not valid UTF-8. */
static bool tb_json_string(tbuf *t, const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (!j) return false;
    char *d = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    if (!d) {
        t->oom = true;
        return true;
    }
    tb_str(t, d);
    free(d);
    return true;
}

/* ---- reporting --------------------------------------------------------------------------- */

static void emit(ember_tool_parser *p, const ember_tool_event *ev) {
    if (p->failed) return;
    if (p->sink(p->user, ev) != 0) p->failed = true;
}

static void emit_content(ember_tool_parser *p, const char *s, size_t n) {
    if (n == 0) return;
    ember_tool_event ev = {EMBER_TOOL_EV_CONTENT, 0, NULL, s, n};
    emit(p, &ev);
}

static void emit_call(ember_tool_parser *p, const char *name, const char *args, size_t alen) {
    int idx = p->n_calls++;
    ember_tool_event ev = {EMBER_TOOL_EV_CALL_START, idx, name, NULL, 0};
    emit(p, &ev);
    ev = (ember_tool_event){EMBER_TOOL_EV_CALL_ARGS, idx, NULL, args, alen};
    emit(p, &ev);
    ev = (ember_tool_event){EMBER_TOOL_EV_CALL_END, idx, NULL, NULL, 0};
    emit(p, &ev);
}

/* A parsed call waiting to be reported (several for a Mistral list). */
typedef struct pcall {
    char name[MAX_NAME + 1];
    char *args; /* malloc'd JSON object text */
    size_t alen;
} pcall;

/* The call of one JSON object {"name": .., "arguments"|"parameters": ..}
   (text s[0..n), exactly the object). Returns false when it is not one;
   out->args is malloc'd on success. oom is set when memory ran out. */
static bool json_call(const char *s, size_t n, pcall *out, bool *oom) {
    json_t *o = json_loadb(s, n, 0, NULL);
    const json_t *name = json_object_get(o, "name");
    if (!json_is_object(o) || !json_is_string(name) || !valid_name(json_string_value(name), json_string_length(name))) {
        json_decref(o);
        return false;
    }
    memcpy(out->name, json_string_value(name), json_string_length(name) + 1);
    const char *key = json_object_get(o, "arguments") ? "arguments" : "parameters";
    const json_t *a = json_object_get(o, key);
    const char *src = "{}";
    size_t b = 0, e = 2;
    json_t *inner = NULL;
    bool ok = true;
    if (json_is_object(a)) {
        src = s;
        ok = member_span(s, n, key, &b, &e);
    } else if (json_is_string(a)) { /* arguments given as JSON text inside a string */
        inner = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
        src = json_string_value(a);
        b = skip_ws(src, json_string_length(a), 0);
        e = json_string_length(a);
        while (e > b && is_ws(src[e - 1])) e--;
        ok = json_is_object(inner);
    } else if (a && !json_is_null(a)) {
        ok = false;
    }
    if (ok) {
        out->args = ember_malloc(e - b + 1);
        if (!out->args) {
            *oom = true;
            ok = false;
        } else {
            memcpy(out->args, src + b, e - b);
            out->args[e - b] = 0;
            out->alen = e - b;
        }
    }
    json_decref(inner);
    json_decref(o);
    return ok;
}

/* ---- streamed calls: an incremental JSON checker -------------------------------------------------
 *
 * A call whose head is complete and whose arguments object has begun
 * ({"name": "f", "arguments": { ... for Hermes and Llama 3, NAME[ARGS]{ for
 * Mistral) is committed: it is reported at once and its arguments are
 * reported as they arrive, each byte once the checker below has accepted it
 * as a possible prefix of a JSON object. A committed call that breaks (a
 * byte that cannot continue the JSON) ends there, with the arguments written
 * so far, and the rest is text again; one cut off by the end of the text ends
 * with what it has. Either way the events depend only on the bytes seen. */

enum { J_VALUE, J_ARR_FIRST, J_KEY_OR_END, J_KEY, J_COLON, J_AFTER, J_STR, J_ESC, J_HEX, J_NUM, J_LIT };
enum { N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static void js_init(jscan *j) {
    memset(j, 0, sizeof *j);
    j->st = J_VALUE;
}

static void js_end_value(jscan *j) {
    j->st = J_AFTER;
    if (j->depth == 0) j->done = true;
}

static int js_start(jscan *j, char c) {
    switch (c) {
    case '{':
    case '[':
        if (j->depth == MAX_DEPTH) return -1;
        j->stack[j->depth++] = c == '{' ? '}' : ']';
        j->st = c == '{' ? J_KEY_OR_END : J_ARR_FIRST;
        return 1;
    case '"':
        j->st = J_STR;
        j->key = false;
        return 1;
    case 't': j->lit = "true"; break;
    case 'f': j->lit = "false"; break;
    case 'n': j->lit = "null"; break;
    case '-':
        j->st = J_NUM;
        j->num = N_SIGN;
        return 1;
    default:
        if (c < '0' || c > '9') return -1;
        j->st = J_NUM;
        j->num = c == '0' ? N_ZERO : N_INT;
        return 1;
    }
    j->st = J_LIT;
    j->lit_pos = 1;
    return 1;
}

/* Feeds one byte: 1 accepted, -1 it cannot continue the value. */
static int js_feed(jscan *j, char c) {
    if (j->done) return -1;
    bool ws = is_ws(c), digit = c >= '0' && c <= '9';
    switch (j->st) {
    case J_VALUE: return ws ? 1 : js_start(j, c);
    case J_ARR_FIRST:
        if (ws) return 1;
        if (c == ']') {
            j->depth--;
            js_end_value(j);
            return 1;
        }
        return js_start(j, c);
    case J_KEY_OR_END:
        if (c == '}') {
            j->depth--;
            js_end_value(j);
            return 1;
        }
        /* fall through */
    case J_KEY:
        if (ws) return 1;
        if (c != '"') return -1;
        j->st = J_STR;
        j->key = true;
        return 1;
    case J_COLON:
        if (ws) return 1;
        if (c != ':') return -1;
        j->st = J_VALUE;
        return 1;
    case J_AFTER:
        if (ws) return 1;
        if (c == ',') {
            j->st = j->stack[j->depth - 1] == '}' ? J_KEY : J_VALUE;
            return 1;
        }
        if (c != j->stack[j->depth - 1]) return -1;
        j->depth--;
        js_end_value(j);
        return 1;
    case J_STR:
        if (c == '"') {
            if (j->key)
                j->st = J_COLON;
            else
                js_end_value(j);
        } else if (c == '\\') {
            j->st = J_ESC;
        } else if ((unsigned char)c < 0x20) {
            return -1;
        }
        return 1;
    case J_ESC:
        if (c == 'u') {
            j->hex = 4;
            j->st = J_HEX;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        j->st = J_STR;
        return 1;
    case J_HEX:
        if (!digit && !((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
        if (--j->hex == 0) j->st = J_STR;
        return 1;
    case J_LIT:
        if (c != j->lit[j->lit_pos]) return -1;
        if (!j->lit[++j->lit_pos]) js_end_value(j);
        return 1;
    case J_NUM: {
        int nx = -1;
        switch (j->num) {
        case N_SIGN: nx = digit ? (c == '0' ? N_ZERO : N_INT) : -1; break;
        case N_ZERO: nx = c == '.' ? N_DOT : (c == 'e' || c == 'E') ? N_E : -1; break;
        case N_INT: nx = digit ? N_INT : c == '.' ? N_DOT : (c == 'e' || c == 'E') ? N_E : -1; break;
        case N_DOT: nx = digit ? N_FRAC : -1; break;
        case N_FRAC: nx = digit ? N_FRAC : (c == 'e' || c == 'E') ? N_E : -1; break;
        case N_E: nx = digit ? N_EXP : (c == '+' || c == '-') ? N_ESIGN : -1; break;
        case N_ESIGN: nx = digit ? N_EXP : -1; break;
        case N_EXP: nx = digit ? N_EXP : -1; break;
        }
        if (nx >= 0) {
            j->num = nx;
            return 1;
        }
        if (j->num == N_SIGN || j->num == N_DOT || j->num == N_E || j->num == N_ESIGN) return -1;
        js_end_value(j); /* the number ended: the byte belongs to what follows */
        return js_feed(j, c);
    }
    }
    return -1;
}

/* {"name": "NAME", "arguments": { (or "parameters"), white space allowed
   between the parts, from s[i]: 1 matched (*args at the arguments' '{', the
   name copied), 0 not decided yet, -1 another shape. */
static int call_head(const char *s, size_t n, size_t i, char *name, size_t *args) {
    i = skip_ws(s, n, i);
    if (i == n) return 0;
    if (s[i] != '{') return -1;
    i = skip_ws(s, n, i + 1);
    int r = expect(s, n, i, "\"name\"");
    if (r <= 0) return r;
    i = skip_ws(s, n, i + 6);
    if (i == n) return 0;
    if (s[i] != ':') return -1;
    i = skip_ws(s, n, i + 1);
    if (i == n) return 0;
    if (s[i] != '"') return -1;
    size_t nb = ++i;
    while (i < n && name_char(s[i]) && i - nb <= MAX_NAME) i++;
    if (i == n) return 0;
    if (s[i] != '"' || !valid_name(s + nb, i - nb)) return -1;
    memcpy(name, s + nb, i - nb);
    name[i - nb] = 0;
    i = skip_ws(s, n, i + 1);
    if (i == n) return 0;
    if (s[i] != ',') return -1;
    i = skip_ws(s, n, i + 1);
    int a = expect(s, n, i, "\"arguments\""), p = expect(s, n, i, "\"parameters\"");
    if (a < 0 && p < 0) return -1;
    if (a < 1 && p < 1) return 0;
    i = skip_ws(s, n, i + (a == 1 ? 11 : 12));
    if (i == n) return 0;
    if (s[i] != ':') return -1;
    i = skip_ws(s, n, i + 1);
    if (i == n) return 0;
    if (s[i] != '{') return -1;
    *args = i;
    return 1;
}

/* Mistral's NAME[ARGS]{ or NAME[CALL_ID]id[ARGS]{ after [TOOL_CALLS] (s[i]
   just past the marker): as call_head. */
static int mistral_head(const char *s, size_t n, size_t i, char *name, size_t *args) {
    size_t j = skip_ws(s, n, i), k = j;
    while (k < n && name_char(s[k]) && k - j <= MAX_NAME) k++;
    if (k == n) return 0;
    if (s[k] != '[' || !valid_name(s + j, k - j)) return -1;
    memcpy(name, s + j, k - j);
    name[k - j] = 0;
    int r = expect(s, n, k, "[CALL_ID]");
    if (r == 0) return 0;
    if (r == 1) {
        k += strlen("[CALL_ID]");
        while (k < n && name_char(s[k])) k++;
        if (k == n) return 0;
    }
    r = expect(s, n, k, "[ARGS]");
    if (r <= 0) return r;
    k = skip_ws(s, n, k + strlen("[ARGS]"));
    if (k == n) return 0;
    if (s[k] != '{') return -1;
    *args = k;
    return 1;
}

/* What follows a streamed call's arguments: white space, the '}' closing the
   call's object (optional before Hermes' marker), white space, and the
   closing marker (NULL: none, the '}' is required). 1: all there (*end past
   it); 0: not decided yet; -1: something else. *kept: the bytes that belong
   to the call in any case (up to the '}'). */
static int tail_scan(const char *s, size_t n, const char *marker, size_t *end, size_t *kept) {
    size_t i = 0;
    bool brace = false;
    *kept = 0;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i == n) return 0;
        if (!brace && s[i] == '}') {
            brace = true;
            *kept = ++i;
            if (!marker) {
                *end = i;
                return 1;
            }
            continue;
        }
        if (!marker) return -1;
        int r = expect(s, n, i, marker);
        if (r == 1) *end = i + strlen(marker);
        return r;
    }
}

static void start_stream(ember_tool_parser *p, const char *name, int tail, int resume) {
    p->call_idx = p->n_calls++;
    ember_tool_event ev = {EMBER_TOOL_EV_CALL_START, p->call_idx, name, NULL, 0};
    emit(p, &ev);
    js_init(&p->js);
    p->tail = tail;
    p->resume = resume;
    p->state = ST_ARGS;
}

static void stream_args(ember_tool_parser *p, const char *s, size_t n) {
    if (n == 0) return;
    ember_tool_event ev = {EMBER_TOOL_EV_CALL_ARGS, p->call_idx, NULL, s, n};
    emit(p, &ev);
}

static void stream_end(ember_tool_parser *p) {
    ember_tool_event ev = {EMBER_TOOL_EV_CALL_END, p->call_idx, NULL, NULL, 0};
    emit(p, &ev);
}

/* ---- Hermes / Qwen3-Coder ---------------------------------------------------------------------- */

/* The declared JSON schema type of parameter param of function fn in the
   request's tools: true when it is (or may be) a string, or unknown. */
static bool param_is_string(const json_t *tools, const char *fn, const char *param) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *nm = json_object_get(f, "name");
        if (!json_is_string(nm) || strcmp(json_string_value(nm), fn)) continue;
        const json_t *ty = json_object_get(json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"),
                                                           param),
                                           "type");
        if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
        if (json_is_array(ty)) {
            size_t k;
            const json_t *x;
            json_array_foreach(ty, k, x) if (json_is_string(x) && !strcmp(json_string_value(x), "string")) return true;
            return false;
        }
        return true;
    }
    return true;
}

/* <function=NAME> (<parameter=P>\nvalue\n</parameter>)* </function>, the
   whole of s[0..n) (white space around allowed). */
static bool xml_call(const ember_tool_parser *p, const char *s, size_t n, pcall *out, bool *oom) {
    size_t i = skip_ws(s, n, 0);
    if (expect(s, n, i, "<function=") != 1) return false;
    i += 10;
    const char *gt = memchr(s + i, '>', n - i);
    if (!gt || !valid_name(s + i, (size_t)(gt - (s + i)))) return false;
    memcpy(out->name, s + i, (size_t)(gt - (s + i)));
    out->name[gt - (s + i)] = 0;
    i = (size_t)(gt - s) + 1;
    tbuf t = {0};
    tb_str(&t, "{");
    bool first = true, ok = false;
    for (;;) {
        i = skip_ws(s, n, i);
        if (expect(s, n, i, "</function>") == 1) {
            ok = skip_ws(s, n, i + 11) == n;
            break;
        }
        if (expect(s, n, i, "<parameter=") != 1) break;
        i += 11;
        const char *pg = memchr(s + i, '>', n - i);
        if (!pg || !valid_name(s + i, (size_t)(pg - (s + i)))) break;
        char pname[MAX_NAME + 1];
        memcpy(pname, s + i, (size_t)(pg - (s + i)));
        pname[pg - (s + i)] = 0;
        i = (size_t)(pg - s) + 1;
        const char *close = find(s + i, n - i, "</parameter>");
        if (!close) break;
        size_t vb = i, ve = (size_t)(close - s);
        if (vb < ve && s[vb] == '\n') vb++; /* the template's own line breaks around the value */
        if (ve > vb && s[ve - 1] == '\n') ve--;
        i = (size_t)(close - s) + 12;
        if (!first) tb_str(&t, ",");
        first = false;
        if (!tb_json_string(&t, pname, strlen(pname))) break;
        tb_str(&t, ":");
        bool raw = false;
        if (!param_is_string(p->tools, out->name, pname)) { /* a number, object, ...: keep its JSON text */
            json_t *v = json_loadb(s + vb, ve - vb, JSON_DECODE_ANY, NULL);
            raw = v != NULL;
            json_decref(v);
        }
        if (raw) {
            size_t a = skip_ws(s, ve, vb), z = ve;
            while (z > a && is_ws(s[z - 1])) z--;
            tb_add(&t, s + a, z - a);
        } else if (!tb_json_string(&t, s + vb, ve - vb)) {
            break;
        }
    }
    tb_str(&t, "}");
    if (t.oom) *oom = true;
    if (!ok || t.oom) {
        free(t.d);
        return false;
    }
    out->args = t.d;
    out->alen = t.n;
    return true;
}

static int hermes_call(ember_tool_parser *p, const char *s, size_t n, bool final, size_t *used, pcall *c, bool *oom) {
    bool coder = p->f == EMBER_TOOLS_QWEN3_CODER;
    if (coder && expect(s, n, 0, "<function=") == 1) { /* a bare call, without <tool_call> around it */
        size_t k = strlen("<function=");
        while (k < n && name_char(s[k])) k++;
        if (k < n && s[k] != '>') return R_BAD; /* prose that mentions <function=...: decided early */
        const char *end = find(s, n, "</function>");
        if (!end) return final ? R_BAD : R_NEED;
        *used = (size_t)(end - s) + 11;
        return xml_call(p, s, *used, c, oom) ? R_CALL : R_BAD;
    }
    size_t m = strlen("<tool_call>");
    const char *end = find(s + m, n - m, "</tool_call>");
    size_t body_end = end ? (size_t)(end - s) : n;
    size_t j = skip_ws(s, body_end, m);
    if (j < body_end && s[j] != '{' && !(coder && s[j] == '<')) return R_BAD; /* not a call: decided early */
    if (!end && !final) return R_NEED;
    *used = end ? body_end + strlen("</tool_call>") : n;
    size_t e = body_end;
    while (e > j && is_ws(s[e - 1])) e--;
    if (j < e && s[j] == '{') return json_call(s + j, e - j, c, oom) ? R_CALL : R_BAD;
    if (coder && j < e) return xml_call(p, s + j, e - j, c, oom) ? R_CALL : R_BAD;
    return R_BAD;
}

/* ---- Mistral ---------------------------------------------------------------------------------- */

static void free_calls(pcall *c, int n) {
    for (int i = 0; i < n; i++) free(c[i].args);
    free(c);
}

/* [TOOL_CALLS] then a JSON list of calls, or NAME[CALL_ID]id[ARGS]{..}. */
static int mistral_call(ember_tool_parser *p, const char *s, size_t n, bool final, size_t *used, bool *oom) {
    size_t j = skip_ws(s, n, strlen("[TOOL_CALLS]"));
    if (j == n) return final ? R_BAD : R_NEED;
    if (s[j] == '[') {
        size_t e;
        int r = json_span(s + j, n - j, &e);
        if (r < 0) return R_BAD;
        if (r == 0) return final ? R_BAD : R_NEED;
        json_t *arr = json_loadb(s + j, e, 0, NULL);
        size_t k = json_array_size(arr);
        if (!json_is_array(arr) || k == 0 || k > 1024) {
            json_decref(arr);
            return R_BAD;
        }
        json_decref(arr);
        pcall *calls = ember_calloc(k, sizeof *calls);
        if (!calls) {
            *oom = true;
            return R_BAD;
        }
        /* each element's own text, then the call it holds */
        size_t i = j + 1;
        int got = 0;
        bool ok = true;
        for (size_t x = 0; x < k && ok; x++) {
            i = skip_ws(s, j + e, i);
            size_t oe;
            ok = i < j + e && s[i] == '{' && json_span(s + i, j + e - i, &oe) == 1 && json_call(s + i, oe, &calls[x], oom);
            if (ok) {
                got++;
                i = skip_ws(s, j + e, i + oe);
                if (i < j + e && s[i] == ',') i++;
            }
        }
        if (ok)
            for (int x = 0; x < got; x++) emit_call(p, calls[x].name, calls[x].args, calls[x].alen);
        free_calls(calls, got);
        if (!ok) return R_BAD;
        *used = j + e;
        return R_CALL;
    }
    size_t k = j;
    while (k < n && name_char(s[k])) k++;
    if (k == n) return final ? R_BAD : R_NEED;
    if (s[k] != '[' || !valid_name(s + j, k - j)) return R_BAD;
    pcall c = {{0}, NULL, 0};
    memcpy(c.name, s + j, k - j);
    int r = expect(s, n, k, "[CALL_ID]");
    if (r == 0) return final ? R_BAD : R_NEED;
    if (r == 1) { /* an id the model made up: ours replace it */
        k += strlen("[CALL_ID]");
        while (k < n && name_char(s[k])) k++;
        if (k == n) return final ? R_BAD : R_NEED;
    }
    r = expect(s, n, k, "[ARGS]");
    if (r < 0) return R_BAD;
    if (r == 0) return final ? R_BAD : R_NEED;
    k = skip_ws(s, n, k + strlen("[ARGS]"));
    if (k == n) return final ? R_BAD : R_NEED;
    if (s[k] != '{') return R_BAD;
    size_t e;
    r = json_span(s + k, n - k, &e);
    if (r < 0) return R_BAD;
    if (r == 0) return final ? R_BAD : R_NEED;
    json_t *o = json_loadb(s + k, e, 0, NULL);
    bool ok = json_is_object(o);
    json_decref(o);
    if (!ok) return R_BAD;
    emit_call(p, c.name, s + k, e);
    *used = k + e;
    return R_CALL;
}

/* ---- Llama 3 ------------------------------------------------------------------------------------ */

/* [<|python_tag|>] {"name": .., "parameters": ..} at s[0..n), after white
   space (and, for a call that follows another, ';' separators). */
static int llama_call(ember_tool_parser *p, const char *s, size_t n, bool after, bool final, size_t *used, bool *oom) {
    size_t j = skip_ws(s, n, 0);
    while (after && j < n && (s[j] == ';' || is_ws(s[j]))) j++;
    if (j == n) return final ? R_BAD : R_NEED;
    int r = expect(s, n, j, "<|python_tag|>");
    if (r == 0) return final ? R_BAD : R_NEED;
    if (r == 1) j = skip_ws(s, n, j + strlen("<|python_tag|>"));
    if (j == n) return final ? R_BAD : R_NEED;
    if (s[j] != '{') return R_BAD;
    size_t e;
    r = json_span(s + j, n - j, &e);
    if (r < 0) return R_BAD;
    if (r == 0) return final ? R_BAD : R_NEED;
    pcall c = {{0}, NULL, 0};
    if (!json_call(s + j, e, &c, oom)) return R_BAD;
    emit_call(p, c.name, c.args, c.alen);
    free(c.args);
    *used = j + e;
    return R_CALL;
}

/* ---- Gemma 4 ------------------------------------------------------------------------------------- */

#define GQ "<|\"|>" /* Gemma 4's string quote */

/* One value of Gemma 4's argument syntax at s[*i..n) appended to t as JSON:
   {key:value,..} (keys bare or quoted), [value,..], <|"|>string<|"|>,
   numbers, true, false, null. */
static bool gemma_value(const char *s, size_t n, size_t *i, tbuf *t, int depth) {
    if (depth > MAX_DEPTH) return false;
    size_t k = skip_ws(s, n, *i);
    if (k >= n) return false;
    if (s[k] == '{' || s[k] == '[') {
        bool obj = s[k] == '{';
        char close = obj ? '}' : ']';
        tb_add(t, &s[k], 1);
        k = skip_ws(s, n, k + 1);
        if (k < n && s[k] == close) {
            tb_add(t, &close, 1);
            *i = k + 1;
            return true;
        }
        for (bool first = true;; first = false) {
            if (!first) tb_str(t, ",");
            k = skip_ws(s, n, k);
            if (obj) {
                size_t kb, ke;
                if (expect(s, n, k, GQ) == 1) {
                    kb = k + 5;
                    const char *q = find(s + kb, n - kb, GQ);
                    if (!q) return false;
                    ke = (size_t)(q - s);
                    k = ke + 5;
                } else {
                    kb = k;
                    while (k < n && name_char(s[k])) k++;
                    ke = k;
                    if (ke == kb) return false;
                }
                if (!tb_json_string(t, s + kb, ke - kb)) return false;
                k = skip_ws(s, n, k);
                if (k >= n || s[k] != ':') return false;
                tb_str(t, ":");
                k++;
            }
            if (!gemma_value(s, n, &k, t, depth + 1)) return false;
            k = skip_ws(s, n, k);
            if (k < n && s[k] == ',') {
                k++;
                continue;
            }
            if (k < n && s[k] == close) {
                tb_add(t, &close, 1);
                *i = k + 1;
                return true;
            }
            return false;
        }
    }
    if (expect(s, n, k, GQ) == 1) {
        const char *q = find(s + k + 5, n - k - 5, GQ);
        if (!q || !tb_json_string(t, s + k + 5, (size_t)(q - (s + k + 5)))) return false;
        *i = (size_t)(q - s) + 5;
        return true;
    }
    size_t e = k;
    while (e < n && (name_char(s[e]) || s[e] == '+')) e++;
    if (e == k) return false;
    json_t *v = json_loadb(s + k, e - k, JSON_DECODE_ANY, NULL);
    bool ok = v && !json_is_string(v) && !json_is_object(v) && !json_is_array(v);
    json_decref(v);
    if (!ok) return false;
    tb_add(t, s + k, e - k);
    *i = e;
    return true;
}

static int gemma_call(ember_tool_parser *p, const char *s, size_t n, bool final, size_t *used, bool *oom) {
    size_t m = strlen("<|tool_call>");
    int r = expect(s, n, m, "call:");
    if (r < 0) return R_BAD;
    const char *end = find(s + m, n - m, "<tool_call|>");
    if (!end && !final) return R_NEED;
    if (r == 0) return R_BAD;
    size_t body_end = end ? (size_t)(end - s) : n;
    *used = end ? body_end + strlen("<tool_call|>") : n;
    size_t k = m + 5, nb = k;
    while (k < body_end && name_char(s[k])) k++;
    if (k == body_end || s[k] != '{' || !valid_name(s + nb, k - nb)) return R_BAD;
    pcall c = {{0}, NULL, 0};
    memcpy(c.name, s + nb, k - nb);
    tbuf t = {0};
    bool ok = gemma_value(s, body_end, &k, &t, 0) && skip_ws(s, body_end, k) == body_end && !t.oom;
    if (t.oom) *oom = true;
    if (ok) emit_call(p, c.name, t.d, t.n);
    free(t.d);
    return ok ? R_CALL : R_BAD;
}

/* ---- the state machine ---------------------------------------------------------------------- */

/* Length of the longest suffix of s[0..n) that is a proper prefix of a marker. */
static size_t partial_marker(const char *const *marks, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; marks[i]; i++) {
        size_t l = strlen(marks[i]);
        for (size_t k = (l - 1 < n ? l - 1 : n); k > best; k--)
            if (!memcmp(s + n - k, marks[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Runs the machine over the buffer; returns the bytes decided. */
static size_t run(ember_tool_parser *p, bool final, bool *oom) {
    const char *s = p->buf;
    size_t n = p->len, pos = 0;
    const char *const *marks = start_markers(p->f);
    while (pos < n && !p->failed && !*oom) {
        if (p->state == ST_ARGS) {
            size_t i = pos;
            int r = 1;
            for (; i < n; i++) {
                r = js_feed(&p->js, s[i]);
                if (r < 0) break;
                if (p->js.done) {
                    i++;
                    break;
                }
            }
            stream_args(p, s + pos, i - pos);
            pos = i;
            if (!p->js.done && r > 0) break; /* more to come */
            stream_end(p);
            p->state = p->js.done && p->tail != TAIL_NONE ? ST_TAIL : p->resume;
            continue;
        }
        if (p->state == ST_TAIL) {
            size_t end = 0, kept = 0;
            int r = tail_scan(s + pos, n - pos, p->tail == TAIL_HERMES ? "</tool_call>" : NULL, &end, &kept);
            if (r == 0 && !final) break;
            if (r == 0 && skip_ws(s, n, pos + kept) == n) kept = n - pos; /* blanks at the end go with the call */
            pos += r == 1 ? end : kept;
            p->state = p->resume;
            continue;
        }
        if (p->state == ST_PLAIN) {
            emit_content(p, s + pos, n - pos);
            pos = n;
            break;
        }
        if (p->state == ST_TEXT) {
            size_t at = n, ml = 0;
            for (int i = 0; marks[i]; i++) {
                const char *h = find(s + pos, n - pos, marks[i]);
                if (h && (size_t)(h - s) < at) {
                    at = (size_t)(h - s);
                    ml = strlen(marks[i]);
                }
            }
            if (at == n) {
                size_t keep = final ? 0 : partial_marker(marks, s + pos, n - pos);
                emit_content(p, s + pos, n - pos - keep);
                pos = n - keep;
                break;
            }
            emit_content(p, s + pos, at - pos);
            pos = at;
            if (p->f != EMBER_TOOLS_GEMMA4 && p->f != EMBER_TOOLS_QWEN3_CODER) { /* a call that can stream? */
                char name[MAX_NAME + 1];
                size_t args = 0;
                int h = p->f == EMBER_TOOLS_MISTRAL ? mistral_head(s + pos, n - pos, ml, name, &args)
                                                    : call_head(s + pos, n - pos, ml, name, &args);
                if (h == 0 && !final) break;
                if (h == 1) {
                    start_stream(p, name, p->f == EMBER_TOOLS_MISTRAL ? TAIL_NONE : TAIL_HERMES, ST_TEXT);
                    pos += args;
                    continue;
                }
            }
            size_t used = 0;
            pcall c = {{0}, NULL, 0};
            int r;
            if (p->f == EMBER_TOOLS_MISTRAL)
                r = mistral_call(p, s + pos, n - pos, final, &used, oom);
            else if (p->f == EMBER_TOOLS_GEMMA4)
                r = gemma_call(p, s + pos, n - pos, final, &used, oom);
            else {
                r = hermes_call(p, s + pos, n - pos, final, &used, &c, oom);
                if (r == R_CALL) emit_call(p, c.name, c.args, c.alen);
                free(c.args);
            }
            if (r == R_NEED) break;
            if (r == R_CALL) {
                pos += used;
            } else {
                emit_content(p, s + pos, ml);
                pos += ml;
            }
            continue;
        }
        size_t j = skip_ws(s, n, pos);
        if (p->state == ST_LLAMA_AFTER)
            while (j < n && (s[j] == ';' || is_ws(s[j]))) j++;
        if (j == n) { /* only white space (and separators) so far */
            if (final) {
                if (p->state == ST_LLAMA_START) emit_content(p, s + pos, n - pos); /* text that is all blank */
                pos = n; /* blanks after calls are dropped */
            }
            break;
        }
        if (p->state == ST_LLAMA_START || p->state == ST_LLAMA_AFTER) {
            bool call = s[j] == '{' || expect(s, n, j, "<|python_tag|>") >= 0;
            if (call && expect(s, n, j, "<|python_tag|>") == 0 && !final) break;
            p->state = call ? ST_LLAMA_CALL : ST_PLAIN;
            continue;
        }
        /* ST_LLAMA_CALL */
        {
            size_t k = skip_ws(s, n, pos), args = 0;
            while (p->n_calls > 0 && k < n && (s[k] == ';' || is_ws(s[k]))) k++;
            int r = expect(s, n, k, "<|python_tag|>");
            if (r == 1) k += strlen("<|python_tag|>");
            char name[MAX_NAME + 1];
            int h = r == 0 ? 0 : call_head(s + pos, n - pos, k - pos, name, &args);
            if (h == 0 && !final) break;
            if (h == 1) {
                start_stream(p, name, TAIL_LLAMA, ST_LLAMA_AFTER);
                pos += args;
                continue;
            }
        }
        size_t used = 0;
        int r = llama_call(p, s + pos, n - pos, p->n_calls > 0, final, &used, oom);
        if (r == R_NEED) break;
        if (r == R_BAD) {
            p->state = ST_PLAIN;
            continue;
        }
        pos += used;
        p->state = ST_LLAMA_AFTER;
    }
    if (final && p->state == ST_ARGS && !p->failed && !*oom) { /* cut off: the call ends with what it has */
        stream_end(p);
        p->state = p->resume;
    }
    return pos;
}

static int step(ember_tool_parser *p, bool final, ember_tool_sink sink, void *user, ember_error *err) {
    p->sink = sink;
    p->user = user;
    bool oom = false;
    size_t done = run(p, final, &oom);
    if (oom) {
        p->failed = true;
        return ember_err(err, EMBER_ERR_NOMEM, "tool calls: out of memory");
    }
    if (p->failed) return ember_err(err, EMBER_ERR_INTERNAL, "tool calls: stopped by the sink");
    if (done) {
        memmove(p->buf, p->buf + done, p->len - done);
        p->len -= done;
    }
    if (final && p->len) { /* cannot happen: the end decides everything; kept as content all the same */
        emit_content(p, p->buf, p->len);
        p->len = 0;
    }
    return EMBER_OK;
}

ember_tool_parser *ember_tool_parser_new(ember_tool_format f, const json_t *tools) {
    ember_tool_parser *p = ember_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->f = f;
    p->tools = tools;
    p->state = f == EMBER_TOOLS_LLAMA3 ? ST_LLAMA_START : f == EMBER_TOOLS_NONE ? ST_PLAIN : ST_TEXT;
    return p;
}

void ember_tool_parser_free(ember_tool_parser *p) {
    if (!p) return;
    free(p->buf);
    free(p);
}

int ember_tool_parser_feed(ember_tool_parser *p, const char *text, size_t len, ember_tool_sink sink, void *user,
                           ember_error *err) {
    if (!p || !sink || (len && !text)) return ember_err(err, EMBER_ERR_INVALID_ARG, "tool calls: bad arguments");
    if (p->finished || p->failed) return ember_err(err, EMBER_ERR_INVALID_ARG, "tool calls: the parser has ended");
    if (len == 0) return EMBER_OK;
    if (p->len + len + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->len + len + 1) {
            if (cap > ((size_t)-1) / 4) return ember_err(err, EMBER_ERR_NOMEM, "tool calls: out of memory");
            cap *= 2;
        }
        char *b = ember_realloc(p->buf, cap);
        if (!b) return ember_err(err, EMBER_ERR_NOMEM, "tool calls: out of memory");
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, text, len);
    p->len += len;
    return step(p, false, sink, user, err);
}

int ember_tool_parser_finish(ember_tool_parser *p, ember_tool_sink sink, void *user, ember_error *err) {
    if (!p || !sink) return ember_err(err, EMBER_ERR_INVALID_ARG, "tool calls: bad arguments");
    if (p->finished || p->failed) return ember_err(err, EMBER_ERR_INVALID_ARG, "tool calls: the parser has ended");
    p->finished = true;
    return step(p, true, sink, user, err);
}

int ember_tool_parser_calls(const ember_tool_parser *p) {
    return p ? p->n_calls : 0;
}
