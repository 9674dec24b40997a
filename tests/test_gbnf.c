/*
 * test_gbnf.c - GBNF grammars and regular expressions as constraints
 * (src/sample/gbnf.c through grammar.h):
 *   - well-formed grammars (a JSON grammar, an arithmetic grammar, one using
 *     every piece of the notation, a bounded one): random walks that take
 *     the best allowed token under random logits, with a token budget, must
 *     end within it in text that an independent checker accepts (jansson
 *     for JSON, a recursive-descent parser of this file for arithmetic,
 *     POSIX regexec for the regular ones); the mask must allow exactly the
 *     tokens a fresh matcher takes; chosen strings accepted and refused;
 *   - every error class of the parser, each named (with line and column
 *     where it has one), and the limits;
 *   - regular expressions (the guided_regex field) walked and checked with
 *     POSIX regexec; unsupported features refused by name.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <regex.h>

#include "core/util.h"
#include "sample/grammar.h"
#include "test.h"

/* ---- a vocabulary: every byte, some multi-byte pieces, an end id ---- */

static const char *const k_pieces[] = {"{\"", "\":", "\": ", "\", \"", "true", "false", "null", "12", "0.5", "-1", "e+3",
                                       "ab", "Paris", " the", "\\n", "\\u00e9", "\xc3\xa9", "\xe2\x82\xac", "(1",
                                       "+2)", "*3", " - ", "hi ", "Abc", "@ex", ".com", "555-", NULL};

typedef struct vocab {
    int n, end;
    char *bytes[400];
    size_t lens[400];
    bool is_end[400];
} vocab;

static void vocab_init(vocab *v) {
    memset(v, 0, sizeof *v);
    for (int b = 1; b < 256; b++) {
        v->bytes[v->n] = malloc(1);
        v->bytes[v->n][0] = (char)b;
        v->lens[v->n++] = 1;
    }
    for (int i = 0; k_pieces[i]; i++) {
        v->bytes[v->n] = strdup(k_pieces[i]);
        v->lens[v->n++] = strlen(k_pieces[i]);
    }
    v->end = v->n;
    v->is_end[v->n++] = true;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}

/* ---- independent checkers ---- */

/* arithmetic: expr := term (('+'|'-') term)*, term := factor (('*'|'/') factor)*,
   factor := digits(1..4) | '(' ' '? expr ' '? ')' | '-' factor */
static bool ar_expr(const char **p);
static bool ar_factor(const char **p) {
    if (**p == '-') {
        (*p)++;
        return ar_factor(p);
    }
    if (**p == '(') {
        (*p)++;
        if (**p == ' ') (*p)++;
        if (!ar_expr(p)) return false;
        if (**p == ' ') (*p)++;
        if (**p != ')') return false;
        (*p)++;
        return true;
    }
    int n = 0;
    while (**p >= '0' && **p <= '9' && n < 5) {
        (*p)++;
        n++;
    }
    return n >= 1 && n <= 4;
}
static bool ar_term(const char **p) {
    if (!ar_factor(p)) return false;
    while (**p == '*' || **p == '/') {
        (*p)++;
        if (!ar_factor(p)) return false;
    }
    return true;
}
static bool ar_expr(const char **p) {
    if (!ar_term(p)) return false;
    while (**p == '+' || **p == '-') {
        (*p)++;
        if (!ar_term(p)) return false;
    }
    return true;
}
static bool check_arith(const char *s) {
    const char *p = s;
    return ar_expr(&p) && *p == '\0';
}

static bool check_json(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    json_decref(j);
    return j != NULL;
}

/* POSIX ERE, anchored; NULL text never matches. */
static bool check_posix(const char *ere, const char *s) {
    char full[512];
    snprintf(full, sizeof full, "^(%s)$", ere);
    regex_t re;
    if (regcomp(&re, full, REG_EXTENDED | REG_NOSUB)) return false;
    bool ok = regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* ---- walks ---- */

static bool takes(const ember_grammar *g, const ember_gvocab *gv, const char *text, size_t n, int t) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    if (ember_gmatch_new(g, gv, &m, &err)) return false;
    bool ok = ember_gmatch_feed(m, text, n) && ember_gmatch_accept(m, t);
    ember_gmatch_free(m);
    return ok;
}

/* One walk under budget tokens: returns the text (malloc'd); *ended when
   the end id was chosen; mask / accept disagreements counted. check: the
   mask without a budget, compared with what a fresh matcher takes. */
static char *walk(const ember_grammar *g, const ember_gvocab *gv, const vocab *v, int budget, bool *ended,
                  int *disagree, bool check) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    CHECK(ember_gmatch_new(g, gv, &m, &err) == 0);
    char *out = calloc(1, 8192);
    size_t n = 0;
    float lg[400];
    *ended = false;
    for (int s = 0; m && s < budget && !*ended; s++) {
        for (int i = 0; i < v->n; i++) lg[i] = (float)urand();
        lg[v->end] += 0.3f;
        CHECK((check ? ember_gmatch_mask(m, lg, v->n) : ember_gmatch_mask_left(m, lg, v->n, budget - s)) > 0);
        if (check && s % 3 == 0)
            for (int i = 0; i < v->n; i++)
                if (i != v->end && (lg[i] != -INFINITY) != takes(g, gv, out, n, i)) (*disagree)++;
        int best = -1;
        for (int i = 0; i < v->n; i++)
            if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
        if (best == v->end) {
            *ended = true;
            CHECK(ember_gmatch_complete(m));
            break;
        }
        if (!ember_gmatch_accept(m, best)) (*disagree)++;
        if (n + v->lens[best] < 8000) {
            memcpy(out + n, v->bytes[best], v->lens[best]);
            n += v->lens[best];
        }
    }
    ember_gmatch_free(m);
    return out;
}

static ember_grammar *gbnf(const char *text, ember_error *err) {
    ember_grammar *g = ember_grammar_new();
    if (ember_grammar_gbnf(g, text, strlen(text), err)) {
        ember_grammar_free(g);
        return NULL;
    }
    return g;
}

/* Whether a fresh matcher takes s whole and may end there. */
static bool full_match(const ember_grammar *g, const ember_gvocab *gv, const char *s) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    if (ember_gmatch_new(g, gv, &m, &err)) return false;
    bool ok = ember_gmatch_feed(m, s, strlen(s)) && ember_gmatch_complete(m);
    ember_gmatch_free(m);
    return ok;
}

static const char k_json[] =
    "# JSON (RFC 8259), white space bounded, \\u escapes below U+8000 (no lone surrogates)\n"
    "root   ::= value\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
    "member ::= string ws \":\" ws value ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "    value ws\n"
    "    (\",\" ws value ws)*\n"
    "  )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-7] [0-9a-fA-F]{3} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "ws     ::= [ \\t\\n]{0,8}\n";

static const char k_arith[] = "root   ::= expr\n"
                              "expr   ::= term ([-+] term)*\n"
                              "term   ::= factor ([*/] factor)*\n"
                              "factor ::= [0-9]{1,4}\n"
                              "         | \"(\" ws expr ws \")\"\n"
                              "         | \"-\" factor\n"
                              "ws     ::= \" \"?\n";

/* Every piece of the notation; checked by the strings it takes and refuses. */
static const char k_features[] = "# a greeting\n"
                                 "root  ::= greet \" \" name{1,3} end   # trailing comment\n"
                                 "greet ::= \"hi\" | \"h\\u00e9llo\"\n"
                                 "  | \"\\x48ey\"\n"
                                 "name  ::= [A-Z] [a-z\\u00e0-\\u00ff]{1,6} \" \"?\n"
                                 "end   ::= ([.!?] | [^\\x00-\\x7f])+ (\"\\n\" | \"\\t\\\"\" | \"\\\\\")?\n"
                                 "unused ::= (\"x\"* \"y\"+ . [\\[\\]\\-])\n";

static void walks(const char *what, const ember_grammar *g, const ember_gvocab *gv, const vocab *v,
                  bool (*ok)(const char *, const void *), const void *arg, int n) {
    int disagree = 0, bad = 0, unended = 0;
    for (int w = 0; w < n; w++) {
        bool ended;
        int budget = 8 + (int)(urand() * 56);
        char *s = walk(g, gv, v, budget, &ended, &disagree, w < 6);
        if (!ended && w >= 6) unended++;
        if (ended && !ok(s, arg)) {
            bad++;
            if (bad < 4) fprintf(stderr, "%s: the walk wrote '%s', which the checker refuses\n", what, s);
        }
        free(s);
    }
    CHECKF(disagree == 0, "%s: the mask and accept disagree %d times", what, disagree);
    CHECKF(bad == 0, "%s: %d of %d walks wrote text outside the grammar", what, bad, n);
    CHECKF(unended == 0, "%s: %d of %d walks did not end within their budget", what, unended, n);
}

static bool ok_json(const char *s, const void *a) {
    (void)a;
    return check_json(s);
}
static bool ok_arith(const char *s, const void *a) {
    (void)a;
    return check_arith(s);
}
static bool ok_posix(const char *s, const void *a) {
    return check_posix(a, s);
}

static void well_formed(const ember_gvocab *gv, const vocab *v) {
    ember_error err = {0};
    ember_grammar *g = gbnf(k_json, &err);
    CHECKF(g != NULL, "json grammar: %s", err.msg);
    if (g) {
        walks("json", g, gv, v, ok_json, NULL, 60);
        const char *yes[] = {"{}", "[1, 2.5e-3, \"a\\u00e9\\n\", {\"k\": [true, null]}]", "-0.5", "\"\xe2\x82\xac\"", NULL};
        const char *no[] = {"{", "[1,]", "01", "\"a", "{\"a\" 1}", "tru", "\"\\ud800\"", NULL};
        for (int i = 0; yes[i]; i++) CHECKF(full_match(g, gv, yes[i]), "json grammar refuses %s", yes[i]);
        for (int i = 0; no[i]; i++) CHECKF(!full_match(g, gv, no[i]), "json grammar takes %s", no[i]);
        CHECK(ember_grammar_min_bytes(g) == 1);
        ember_grammar_free(g);
    }
    g = gbnf(k_arith, &err);
    CHECKF(g != NULL, "arithmetic grammar: %s", err.msg);
    if (g) {
        walks("arithmetic", g, gv, v, ok_arith, NULL, 60);
        const char *yes[] = {"1", "(1+2)*3", "-(12-4)/7", "( 1 )", "((((1))))", NULL};
        const char *no[] = {"1+", "(1", "1 + 2", "12345", "1++2", "", NULL};
        for (int i = 0; yes[i]; i++) CHECKF(full_match(g, gv, yes[i]), "arithmetic refuses %s", yes[i]);
        for (int i = 0; no[i]; i++) CHECKF(!full_match(g, gv, no[i]), "arithmetic takes %s", no[i]);
        ember_grammar_free(g);
    }
    g = gbnf(k_features, &err);
    CHECKF(g != NULL, "features grammar: %s", err.msg);
    if (g) {
        const char *yes[] = {"hi Abc.", "h\xc3\xa9llo Ab Cd Efg!?", "Hey Ab\xc3\xa0\xe2\x82\xac\n", "hi Zz .\t\"",
                             "hi Ab!\\", NULL};
        const char *no[] = {"hi abc.", "hi Abc", "hey Abc.", "hi Ab Cd Ef Gh.", "hi Abcdefgh.", "hi A.", "hi Ab.x",
                            NULL};
        for (int i = 0; yes[i]; i++) CHECKF(full_match(g, gv, yes[i]), "features refuses '%s'", yes[i]);
        for (int i = 0; no[i]; i++) CHECKF(!full_match(g, gv, no[i]), "features takes '%s'", no[i]);
        ember_grammar_free(g);
    }
    /* bounded and regular: checked by a POSIX ERE of the same language */
    static const char *const pairs[][2] = {
        {"root ::= [a-c]{2,4} (\"-\" [0-9]+)? \"!\"", "[a-c]{2,4}(-[0-9]+)?!"},
        {"root ::= (\"ab\" | \"a\" \"c\"*) \"b\"{3}", "(ab|ac*)b{3}"},
        {"root ::= x x\nx ::= \"0\" | \"1\" x", "(1*0)(1*0)"},
        {"root ::= [^a-y\\x7f-\\U0010FFFF\\x00-\\x1f]{1,5}", "[z -`{-~]{1,5}"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        g = gbnf(pairs[i][0], &err);
        CHECKF(g != NULL, "%s: %s", pairs[i][0], err.msg);
        if (g) walks(pairs[i][0], g, gv, v, ok_posix, pairs[i][1], 40);
        ember_grammar_free(g);
    }
}

typedef struct bad_grammar {
    const char *text, *needle, *where; /* where: "line L, column C" or NULL */
} bad_grammar;

static void errors(void) {
    static char deep[400], many[64], big[128];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 70; i++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i < 70; i++) strcat(deep, ")");
    snprintf(many, sizeof many, "root ::= \"a\"{%d}", 1001);
    snprintf(big, sizeof big, "root ::= ((\"ab\"{1000}){1000}){1000}");
    const bad_grammar cases[] = {
        {"", "empty", NULL},
        {"# only a comment\n\n", "empty", NULL},
        {"root ::= foo", "undefined rule 'foo'", "line 1, column 10"},
        {"root ::= \"a\" x ::= \"b\"", "'::=' inside a rule", "line 1, column 16"},
        {"root ::= \"abc", "unterminated string", "line 1, column 10"},
        {"root ::= [a-", "class", "line 1, column 10"},
        {"root ::= [z-a]", "range", NULL},
        {"root ::= []", "empty character class", NULL},
        {"root ::= [^\\x00-\\U0010FFFF]", "matches no character", NULL},
        {"root ::= (\"a\" | \"b\"", "'(' without its ')'", "line 1, column 10"},
        {"root ::= \"a\" )", "')' without its '('", "line 1, column 14"},
        {"root ::= \"a\" @", "unexpected '@'", "line 1, column 14"},
        {"root = \"a\"", "expected '::='", "line 1, column 6"},
        {"::= \"a\"", "expected a rule name", "line 1, column 1"},
        {"root ::= \"\\q\"", "unknown escape", "line 1, column 11"},
        {"root ::= \"\\x4\"", "hexadecimal", NULL},
        {"root ::= \"\\uD800\"", "names no character", NULL},
        {"root ::= \"a\"{3,2}", "m is over n", NULL},
        {"root ::= \"a\"{2", "'}'", NULL},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice", "line 2, column 1"},
        {"a ::= \"x\"", "no 'root'", NULL},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "left recursion", NULL},
        {"root ::= a\na ::= b? \"x\" | \"y\"\nb ::= a \"z\"", "left recursion", NULL},
        {"root ::= (\"a\"?)*", "repetition of something that can match the empty string", "line 1, column 16"},
        {"root ::= \"\"*", "empty string", NULL},
        {"root ::= \"a\" root", "never finish", NULL},
        {"root ::= \"\xff\"", "UTF-8", NULL},
        {many, "limit of 1000", NULL},
        {deep, "nest deeper than 64", NULL},
        {big, NULL, NULL}, /* 3,000 rules, strings of 6e9 bytes: accepted (lengths saturate, not 'never') */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ember_error err = {0};
        ember_grammar *g = gbnf(cases[i].text, &err);
        if (!cases[i].needle) {
            CHECKF(g != NULL, "case %zu: refused: %s", i, err.msg);
            if (g) CHECK(ember_grammar_min_bytes(g) > 1000000);
            ember_grammar_free(g);
            continue;
        }
        CHECKF(g == NULL && strstr(err.msg, cases[i].needle), "case %zu (%s): '%s' lacks '%s'", i, cases[i].text,
               err.msg, cases[i].needle);
        if (cases[i].where) CHECKF(strstr(err.msg, cases[i].where), "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].where);
        ember_grammar_free(g);
    }
    /* limits on the whole: rules, elements, text */
    size_t n = 9000 * 16 + 64;
    char *t = malloc(n), *p = t;
    p += sprintf(p, "root ::= r0\n");
    for (int i = 0; i < 9000; i++) p += sprintf(p, "r%d ::= \"a\"\n", i);
    ember_error err = {0};
    ember_grammar *g = gbnf(t, &err);
    CHECKF(!g && strstr(err.msg, "too many rules"), "9000 rules: %s", err.msg);
    ember_grammar_free(g);
    p = t;
    p += sprintf(p, "root ::= ");
    for (int i = 0; i < 300; i++) p += sprintf(p, "\"abcdefghij\"{1000} ");
    g = gbnf(t, &err);
    CHECKF(!g && strstr(err.msg, "too large"), "300,000 elements: %s", err.msg);
    ember_grammar_free(g);
    free(t);
    t = calloc(1, (1 << 20) + 16);
    memset(t, ' ', (1 << 20) + 8);
    g = gbnf(t, &err);
    CHECKF(!g && strstr(err.msg, "limit"), "a text over 1 MiB: %s", err.msg);
    ember_grammar_free(g);
    free(t);
}

static void regexes(const ember_gvocab *gv, const vocab *v) {
    static const char *const pairs[][2] = {
        {"[a-z]+@[a-z]+\\.(com|org)", "[a-z]+@[a-z]+\\.(com|org)"},
        {"^\\d{3}-\\d{4}$", "[0-9]{3}-[0-9]{4}"},
        {"(?:yes|no|maybe)!?", "(yes|no|maybe)!?"},
        {"\"[^\"\\n]{0,80}\"", "\"[^\"\n]{0,80}\""}, /* quotes, and more positions than the schema patterns' 63 */
        {"[A-Z][a-z]{1,100}( [A-Z][a-z]{1,100})*", "[A-Z][a-z]{1,100}( [A-Z][a-z]{1,100})*"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        ember_grammar *g = ember_grammar_new();
        ember_error err = {0};
        int rc = ember_grammar_regex(g, pairs[i][0], "guided_regex", &err);
        CHECKF(rc == 0, "%s: %s", pairs[i][0], err.msg);
        if (!rc) walks(pairs[i][0], g, gv, v, ok_posix, pairs[i][1], 40);
        ember_grammar_free(g);
    }
    static const char *const refused[][2] = {
        {"a(?=b)", "lookaround"}, {"(a)\\1", "backreferences"}, {"\\bword", "word boundaries"},
        {"caf\xc3\xa9", "beyond ASCII"}, {"a{2000}", "over 1000"}, {"(a", "'('"}, {"(a?)*", "empty string"},
        {"[\\x01]", "nothing the grammar writes"},
        {"a{3,x}", "a bad {m,n}"}, /* fuzz_gbnf found it: the message was missing */
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ember_grammar *g = ember_grammar_new();
        ember_error err = {0};
        int rc = ember_grammar_regex(g, refused[i][0], "guided_regex", &err);
        CHECKF(rc != 0 && strstr(err.msg, refused[i][1]) && strstr(err.msg, "guided_regex"), "%s: '%s' lacks '%s'",
               refused[i][0], err.msg, refused[i][1]);
        ember_grammar_free(g);
    }
}

/* A grammar built to be ambiguous (every byte of every token a new state
   of many stacks) over a vocabulary of 100,000 random printable strings: one mask must
   stay within the walk's work budget (well under a second), allow some
   tokens, and what it allows the matcher takes. */
static void hostile_runtime(void) {
    enum { N = 100000 };
    char **bytes = calloc(N + 1, sizeof *bytes);
    size_t *lens = calloc(N + 1, sizeof *lens);
    bool *end = calloc(N + 1, sizeof *end);
    for (int i = 0; i < N; i++) {
        int len = i < 95 ? 1 : 2 + (int)(urand() * 11);
        bytes[i] = malloc((size_t)len);
        for (int k = 0; k < len; k++) bytes[i][k] = (char)(i < 95 ? ' ' + i : ' ' + (int)(urand() * 95));
        lens[i] = (size_t)len;
    }
    end[N] = true;
    ember_gvocab *gv = NULL;
    ember_error err = {0};
    CHECKF(ember_gvocab_new(N + 1, (const char *const *)bytes, lens, end, &gv, &err) == 0, "%s", err.msg);
    ember_grammar *g = gbnf("root ::= (a | a a | a a a | a a a a){0,200}\na ::= [^x] | [^y] [^z]?\n", &err);
    CHECKF(g != NULL, "%s", err.msg);
    ember_gmatch *m = NULL;
    if (g && gv && ember_gmatch_new(g, gv, &m, &err) == 0) {
        float *lg = calloc(N + 1, sizeof *lg);
        double t0 = ember_now();
        int allowed = ember_gmatch_mask_left(m, lg, N + 1, 64);
        double dt = ember_now() - t0;
        if (getenv("SHOW")) fprintf(stderr, "hostile mask %.4f s, %d allowed\n", dt, allowed);
        /* a guard against a blow-up (an exponential walk takes minutes), not a
           speed check: 0.09 s here in a release build, and a loaded 2-core
           machine once took 1.28 s, so the bound is far above both */
        CHECKF(dt < 10.0 && allowed >= 26, "an ambiguous grammar's mask: %.3f s, %d allowed", dt, allowed);
        int bad = 0;
        for (int i = 0; i < N && bad < 3; i++)
            if (lg[i] != -INFINITY && !takes(g, gv, "", 0, i)) bad++;
        CHECKF(bad == 0, "the mask allows tokens the matcher refuses");
        free(lg);
        ember_gmatch_free(m);
    }
    ember_grammar_free(g);
    ember_gvocab_free(gv);
    for (int i = 0; i < N; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(end);
}

int main(void) {
    vocab v;
    vocab_init(&v);
    ember_gvocab *gv = NULL;
    ember_error err = {0};
    if (ember_gvocab_new(v.n, (const char *const *)v.bytes, v.lens, v.is_end, &gv, &err)) {
        fprintf(stderr, "vocab: %s\n", err.msg);
        return 1;
    }
    well_formed(gv, &v);
    errors();
    regexes(gv, &v);
    hostile_runtime();
    ember_gvocab_free(gv);
    for (int i = 0; i < v.n; i++) free(v.bytes[i]);
    return test_done();
}
