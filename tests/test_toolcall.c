/*
 * test_toolcall.c - the tool-call parsers of src/template/toolcall.c, one
 * table per format: well-formed calls, several calls, text around them,
 * malformed calls and calls cut off at the end (both become content). Each
 * case is checked three ways: the text in one piece against the expected
 * events, then split in two at every byte boundary and fed one byte at a
 * time, which must give exactly the one-piece events. Also: format names,
 * detection on the real templates of shared/testdata, the held-back prefix of
 * a marker, and that every call's arguments parse as a JSON object.
 */
#include <jansson.h>

#include "template/toolcall.h"
#include "test.h"

/* Events rendered as one string: content runs as T<text>, calls as
   {name|args}; consecutive content pieces are merged so splits compare. */
typedef struct rec {
    char out[8192];
    size_t n;
    int open_call; /* index of the call being reported, -1 none */
    int bad_args;  /* calls whose arguments are not a JSON object */
    int order;     /* events out of order (ARGS without START, ...) */
    int last_kind;
} rec;

static void put(rec *r, const char *s, size_t n) {
    if (r->n + n >= sizeof r->out) n = sizeof r->out - 1 - r->n;
    memcpy(r->out + r->n, s, n);
    r->n += n;
    r->out[r->n] = 0;
}

static int sink(void *user, const ember_tool_event *ev) {
    rec *r = user;
    static char args[4096];
    static size_t an;
    switch (ev->kind) {
    case EMBER_TOOL_EV_CONTENT:
        if (r->open_call >= 0 || ev->len == 0) r->order++;
        if (r->last_kind != EMBER_TOOL_EV_CONTENT) put(r, "T", 1);
        put(r, ev->text, ev->len);
        break;
    case EMBER_TOOL_EV_CALL_START:
        if (r->open_call >= 0 || !ev->name) r->order++;
        r->open_call = ev->index;
        put(r, "{", 1);
        put(r, ev->name, strlen(ev->name));
        put(r, "|", 1);
        an = 0;
        break;
    case EMBER_TOOL_EV_CALL_ARGS:
        if (r->open_call != ev->index) r->order++;
        put(r, ev->text, ev->len);
        if (an + ev->len < sizeof args) {
            memcpy(args + an, ev->text, ev->len);
            an += ev->len;
        }
        break;
    case EMBER_TOOL_EV_CALL_END: {
        if (r->open_call != ev->index) r->order++;
        r->open_call = -1;
        put(r, "}", 1);
        json_t *j = json_loadb(args, an, 0, NULL);
        if (!json_is_object(j)) r->bad_args++;
        json_decref(j);
        break;
    }
    }
    r->last_kind = ev->kind;
    return 0;
}

static void rec_init(rec *r) {
    memset(r, 0, sizeof *r);
    r->open_call = -1;
}

/* Feeds text in pieces cut at the given offsets (ascending), then finishes. */
static int parse_cuts(ember_tool_format f, const json_t *tools, const char *text, const size_t *cuts, int ncuts,
                      rec *r) {
    rec_init(r);
    ember_tool_parser *p = ember_tool_parser_new(f, tools);
    if (!p) return -1;
    ember_error err = {0};
    size_t at = 0, n = strlen(text);
    int rc = 0;
    for (int i = 0; i <= ncuts && !rc; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        rc = ember_tool_parser_feed(p, text + at, to - at, sink, r, &err);
        at = to;
    }
    if (!rc) rc = ember_tool_parser_finish(p, sink, r, &err);
    ember_tool_parser_free(p);
    return rc;
}

typedef struct tcase {
    const char *text;
    const char *want; /* rendered events */
} tcase;

/* bad: calls of each case whose arguments are not a JSON object (streamed
   calls cut off or broken: 1 in the tables of such cases, else 0). */
static void run_cases(ember_tool_format f, const json_t *tools, const tcase *cs, int n, int bad) {
    for (int c = 0; c < n; c++) {
        const char *text = cs[c].text;
        rec whole;
        CHECK(parse_cuts(f, tools, text, NULL, 0, &whole) == 0);
        CHECKF(!strcmp(whole.out, cs[c].want), "%s case %d:\n got  %s\n want %s", ember_tool_format_name(f), c,
               whole.out, cs[c].want);
        CHECKF(whole.bad_args == bad && whole.order == 0, "%s case %d: args %d order %d",
               ember_tool_format_name(f), c, whole.bad_args, whole.order);
        size_t len = strlen(text);
        int mismatches = 0;
        for (size_t k = 0; k <= len; k++) { /* two pieces, cut at every byte */
            rec r;
            size_t cut = k;
            if (parse_cuts(f, tools, text, &cut, 1, &r) != 0 || strcmp(r.out, whole.out) || r.order) mismatches++;
        }
        CHECKF(mismatches == 0, "%s case %d: %d two-piece splits differ", ember_tool_format_name(f), c, mismatches);
        size_t *cuts = malloc((len + 1) * sizeof *cuts);
        for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
        rec r;
        CHECK(parse_cuts(f, tools, text, cuts, (int)(len ? len - 1 : 0), &r) == 0);
        CHECKF(!strcmp(r.out, whole.out), "%s case %d: byte-at-a-time differs:\n %s", ember_tool_format_name(f), c,
               r.out);
        free(cuts);
    }
}

#define N(a) ((int)(sizeof(a) / sizeof(a)[0]))

static void hermes(void) {
    static const tcase cs[] = {
        /* well formed, arguments kept as written */
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"t\": 1.10}}\n</tool_call>",
         "{get_weather|{\"city\": \"Paris\", \"t\": 1.10}}"},
        /* text around, two calls */
        {"Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
         "\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>\nDone.",
         "TLet me check.\n{a|{}}T\n{b|{\"x\": [1, {\"y\": \"}\"}]}}T\nDone."},
        /* arguments as a JSON string; "parameters" spelling; missing arguments */
        {"<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>", "{f|{\"k\": 2}}"},
        {"<tool_call>{\"parameters\": {\"q\": \"é\"}, \"name\": \"s\"}</tool_call>", "{s|{\"q\": \"é\"}}"},
        {"<tool_call>{\"name\": \"now\"}</tool_call>", "{now|{}}"},
        /* the closing marker missing at the end: a complete call is still a call */
        {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", "{f|{\"a\": 1}}"},
        /* cut off (max_tokens): content, markers included */
        {"Sure <tool_call>\n{\"name\": \"f\", \"argum", "TSure <tool_call>\n{\"name\": \"f\", \"argum"},
        /* malformed: not JSON, bad name, arguments not an object */
        {"<tool_call>not json</tool_call> after", "T<tool_call>not json</tool_call> after"},
        {"<tool_call>{\"name\": \"bad name!\", \"arguments\": {}}</tool_call>",
         "T<tool_call>{\"name\": \"bad name!\", \"arguments\": {}}</tool_call>"},
        {"<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
         "T<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"},
        /* a streamed call ends with its arguments: what follows that is not the closing marker is text */
        {"<tool_call>{\"name\": \"f\", \"arguments\": {}} trailing</tool_call>", "{f|{}}T trailing</tool_call>"},
        /* cut off inside the arguments: the call ends with what was written (not a JSON object) */
        /* the call's own '}' forgotten before the marker; a break inside the arguments */
        {"<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}</tool_call>x", "{f|{\"a\":1}}Tx"},
        /* a malformed call, then a good one */
        {"<tool_call>{oops</tool_call><tool_call>{\"name\":\"g\",\"arguments\":{\"z\":null}}</tool_call>",
         "T<tool_call>{oops</tool_call>{g|{\"z\":null}}"},
        /* something like a marker that is not one; a marker prefix at the end */
        {"a <tool_cal> b <tool_call", "Ta <tool_cal> b <tool_call"},
        {"plain text only", "Tplain text only"},
        {"", ""},
    };
    run_cases(EMBER_TOOLS_HERMES, NULL, cs, N(cs), 0);
    /* streamed calls cut off or broken inside their arguments: they end with what was written */
    static const tcase broken[] = {
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2", "{f|{\"a\": [1, 2}"},
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call>",
         "{f|{\"a\": tru}T}}</tool_call>"},
    };
    run_cases(EMBER_TOOLS_HERMES, NULL, broken, N(broken), 1);
}

static void coder(void) {
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"},"
                               "\"o\":{\"type\":\"object\"},\"m\":{\"type\":[\"number\",\"null\"]}}}}}]",
                               0, NULL);
    CHECK(tools != NULL);
    static const tcase cs[] = {
        {"<tool_call>\n<function=calc>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\n42\n</parameter>\n</function>\n"
         "</tool_call>",
         "{calc|{\"n\":42,\"s\":\"42\"}}"},
        /* object and union types keep their JSON; a value that is not JSON stays a string; unknown tool: strings */
        {"<tool_call><function=calc><parameter=o>{\"a\": [1]}</parameter><parameter=m>null</parameter>"
         "<parameter=n>many</parameter></function></tool_call>",
         "{calc|{\"o\":{\"a\": [1]},\"m\":null,\"n\":\"many\"}}"},
        {"x<tool_call>\n<function=other>\n<parameter=v>\n1\nline two\n</parameter>\n</function>\n</tool_call>y"
         "<tool_call>\n<function=calc>\n</function>\n</tool_call>",
         "Tx{other|{\"v\":\"1\\nline two\"}}Ty{calc|{}}"},
        /* a JSON body inside <tool_call> works too; a bare <function=...> call */
        {"<tool_call>{\"name\": \"calc\", \"arguments\": {\"n\": 1}}</tool_call>", "{calc|{\"n\": 1}}"},
        {"<function=calc><parameter=n>7</parameter></function> ok", "{calc|{\"n\":7}}T ok"},
        {"write <function=f(x)> in C", "Twrite <function=f(x)> in C"},
        /* cut off, and malformed (parameter not closed) */
        {"<tool_call>\n<function=calc>\n<parameter=n>\n4", "T<tool_call>\n<function=calc>\n<parameter=n>\n4"},
        {"<tool_call><function=calc><parameter=n>4</function></tool_call>",
         "T<tool_call><function=calc><parameter=n>4</function></tool_call>"},
        {"<tool_call><function=bad name><parameter=n>4</parameter></function></tool_call>",
         "T<tool_call><function=bad name><parameter=n>4</parameter></function></tool_call>"},
    };
    run_cases(EMBER_TOOLS_QWEN3_CODER, tools, cs, N(cs), 0);
    json_decref(tools);
}

static void llama(void) {
    static const tcase cs[] = {
        {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "{get_weather|{\"city\": \"Oslo\"}}"},
        {"<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "{f|{}}"},
        {"\n\n{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": 2}}\n",
         "{a|{\"x\": 1}}{b|{\"y\": 2}}"},
        /* text after the calls stays content */
        {"{\"name\": \"a\", \"parameters\": {}} and more", "{a|{}}T and more"},
        /* plain answers, JSON that is not a call, cut off, malformed */
        {"The answer is 4.", "TThe answer is 4."},
        {"  {\"answer\": 4}", "T  {\"answer\": 4}"},
        {"{\"parameters\": {\"x\": 1}, \"name\": \"f\"}", "{f|{\"x\": 1}}"},
        {"<|python_tag|>brave_search.call(query=\"x\")", "T<|python_tag|>brave_search.call(query=\"x\")"},
        {"{\"name\": \"a\", \"parameters\": {}}; oops", "{a|{}}T; oops"},
        {"   ", "T   "},
        {"<|pyth", "T<|pyth"},
    };
    run_cases(EMBER_TOOLS_LLAMA3, NULL, cs, N(cs), 0);
    /* streamed calls cut off or broken inside their arguments: they end with what was written */
    static const tcase broken[] = {
        {"{\"name\": \"f\", \"parameters\": {\"x\": ", "{f|{\"x\": }"},
        {"{\"name\": \"f\", \"parameters\": {\"x\" 1}}", "{f|{\"x\" }T1}}"},
    };
    run_cases(EMBER_TOOLS_LLAMA3, NULL, broken, N(broken), 1);
}

static void mistral(void) {
    static const tcase cs[] = {
        /* the JSON list form, one and two calls */
        {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
         "{get_weather|{\"city\": \"Rome\"}}"},
        {"[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"k\": [\"]\"]}, \"id\": "
         "\"abcdefghi\"}]",
         "{a|{}}{b|{\"k\": [\"]\"]}}"},
        /* the NAME[ARGS] form, with and without [CALL_ID], several calls, text before */
        {"Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}",
         "TChecking.{get_weather|{\"city\": \"Rome\"}}{get_time|{}}"},
        /* cut off in each part */
        {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {", "T[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {"},
        {"[TOOL_CALLS]get_wea", "T[TOOL_CALLS]get_wea"},
        {"[TOOL_CALLS]f[AR", "T[TOOL_CALLS]f[AR"},
        /* malformed: a list element that is no call, args not an object, bad JSON */
        {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, 5]", "T[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, 5]"},
        {"[TOOL_CALLS]f[ARGS][1]", "T[TOOL_CALLS]f[ARGS][1]"},
        {"[TOOL_CALLS]hello there", "T[TOOL_CALLS]hello there"},
    };
    run_cases(EMBER_TOOLS_MISTRAL, NULL, cs, N(cs), 0);
    /* streamed calls cut off or broken inside their arguments: they end with what was written */
    static const tcase broken[] = {
        {"[TOOL_CALLS]f[ARGS]{\"a\": \"b", "{f|{\"a\": \"b}"},
        {"[TOOL_CALLS]f[ARGS]{\"a\" 1} x", "{f|{\"a\" }T1} x"},
    };
    run_cases(EMBER_TOOLS_MISTRAL, NULL, broken, N(broken), 1);
}

static void gemma(void) {
    static const tcase cs[] = {
        {"<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3}<tool_call|>",
         "{get_weather|{\"city\":\"Paris, FR\",\"days\":3}}"},
        {"I'll look.<|tool_call>call:a{}<tool_call|><|tool_call>call:b{opts:{deep:[1,true,null,<|\"|>x:y<|\"|>]},"
         "<|\"|>odd key<|\"|>:-2.5e3}<tool_call|>bye",
         "TI'll look.{a|{}}{b|{\"opts\":{\"deep\":[1,true,null,\"x:y\"]},\"odd key\":-2.5e3}}Tbye"},
        /* the end marker missing at the end: still a call */
        {"<|tool_call>call:f{a:1}", "{f|{\"a\":1}}"},
        /* cut off; malformed */
        {"<|tool_call>call:f{a:<|\"|>unfinished", "T<|tool_call>call:f{a:<|\"|>unfinished"},
        {"<|tool_call>call:f{a:}<tool_call|>", "T<|tool_call>call:f{a:}<tool_call|>"},
        {"<|tool_call>cal f{}<tool_call|>", "T<|tool_call>cal f{}<tool_call|>"},
        {"<|tool_call>call:f{a:bare}<tool_call|>", "T<|tool_call>call:f{a:bare}<tool_call|>"},
        {"<|tool_call>call:f{a:1}junk<tool_call|>", "T<|tool_call>call:f{a:1}junk<tool_call|>"},
    };
    run_cases(EMBER_TOOLS_GEMMA4, NULL, cs, N(cs), 0);
}

/* Content before a possible marker is released at once; the rest waits. */
static void holdback(void) {
    ember_tool_parser *p = ember_tool_parser_new(EMBER_TOOLS_HERMES, NULL);
    rec r;
    rec_init(&r);
    ember_error err = {0};
    CHECK(ember_tool_parser_feed(p, "Hello <tool_", 12, sink, &r, &err) == 0);
    CHECKF(!strcmp(r.out, "THello "), "released '%s'", r.out);
    const char *rest = "call>{\"name\":\"f\"}</tool_call>";
    CHECK(ember_tool_parser_feed(p, rest, strlen(rest), sink, &r, &err) == 0);
    CHECKF(!strcmp(r.out, "THello {f|{}}"), "released '%s'", r.out);
    CHECK(ember_tool_parser_calls(p) == 1);
    CHECK(ember_tool_parser_finish(p, sink, &r, &err) == 0);
    CHECK(ember_tool_parser_feed(p, "x", 1, sink, &r, &err) == EMBER_ERR_INVALID_ARG);
    ember_tool_parser_free(p);
    /* a call's arguments stream as they are written: the call starts once its
       arguments object has begun, each accepted byte is reported at once */
    static const struct {
        ember_tool_format f;
        const char *head, *rest, *early, *all;
    } inc[] = {
        {EMBER_TOOLS_HERMES, "Hi <tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Par",
         "is\"}}\n</tool_call>", "THi {get|{\"city\": \"Par", "THi {get|{\"city\": \"Paris\"}}"},
        {EMBER_TOOLS_LLAMA3, "{\"name\": \"get\", \"parameters\": {\"n\": 12", "3}}", "{get|{\"n\": 12",
         "{get|{\"n\": 123}}"},
        {EMBER_TOOLS_MISTRAL, "[TOOL_CALLS]get[ARGS]{\"a\": [tr", "ue]}", "{get|{\"a\": [tr", "{get|{\"a\": [true]}}"},
    };
    for (int i = 0; i < N(inc); i++) {
        p = ember_tool_parser_new(inc[i].f, NULL);
        rec_init(&r);
        CHECK(ember_tool_parser_feed(p, inc[i].head, strlen(inc[i].head), sink, &r, &err) == 0);
        CHECKF(!strcmp(r.out, inc[i].early), "%s: released '%s'", ember_tool_format_name(inc[i].f), r.out);
        CHECK(ember_tool_parser_feed(p, inc[i].rest, strlen(inc[i].rest), sink, &r, &err) == 0);
        CHECK(ember_tool_parser_finish(p, sink, &r, &err) == 0);
        CHECKF(!strcmp(r.out, inc[i].all) && r.bad_args == 0, "%s: got '%s'", ember_tool_format_name(inc[i].f), r.out);
        ember_tool_parser_free(p);
    }
    /* the none format passes everything through */
    p = ember_tool_parser_new(EMBER_TOOLS_NONE, NULL);
    rec_init(&r);
    CHECK(ember_tool_parser_feed(p, "<tool_call>{\"name\":\"f\"}</tool_call>", 35, sink, &r, &err) == 0);
    CHECK(ember_tool_parser_finish(p, sink, &r, &err) == 0);
    CHECK(!strcmp(r.out, "T<tool_call>{\"name\":\"f\"}</tool_call>"));
    ember_tool_parser_free(p);
}

static int stop_sink(void *user, const ember_tool_event *ev) {
    (void)user;
    return ev->kind == EMBER_TOOL_EV_CALL_START;
}

static void names_and_detection(void) {
    for (int f = EMBER_TOOLS_NONE; f <= EMBER_TOOLS_GEMMA4; f++) {
        ember_tool_format g;
        CHECK(ember_tool_format_from_name(ember_tool_format_name((ember_tool_format)f), &g) && (int)g == f);
        CHECK(strstr(ember_tool_format_names(), ember_tool_format_name((ember_tool_format)f)) != NULL);
        CHECK(ember_tool_format_markers((ember_tool_format)f) != NULL);
    }
    ember_tool_format g;
    CHECK(!ember_tool_format_from_name("qwen", &g) && !ember_tool_format_from_name(NULL, &g));
    /* the real templates of shared/testdata */
    static const struct {
        const char *file;
        ember_tool_format want;
    } tpl[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", EMBER_TOOLS_HERMES},
        {"Qwen-Qwen3-0.6B.jinja", EMBER_TOOLS_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", EMBER_TOOLS_HERMES},
        {"Qwen3-Coder.jinja", EMBER_TOOLS_QWEN3_CODER},
        {"Qwen3.5-4B.jinja", EMBER_TOOLS_QWEN3_CODER},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", EMBER_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", EMBER_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.3-70B-Instruct.jinja", EMBER_TOOLS_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", EMBER_TOOLS_MISTRAL},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", EMBER_TOOLS_MISTRAL},
        {"unsloth-mistral-Devstral-Small-2507.jinja", EMBER_TOOLS_MISTRAL},
        {"google-gemma-4-31B-it.jinja", EMBER_TOOLS_GEMMA4},
        {"google-gemma-2-2b-it.jinja", EMBER_TOOLS_NONE},
    };
    int found = 0;
    for (int i = 0; i < N(tpl); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/testdata/chat-templates/llama.cpp/%s", EMBER_SHARED_DIR, tpl[i].file);
        FILE *fp = fopen(path, "rb");
        if (!fp) continue;
        static char text[1 << 20];
        size_t n = fread(text, 1, sizeof text, fp);
        fclose(fp);
        found++;
        ember_tool_format d = ember_tool_format_detect(text, n);
        CHECKF(d == tpl[i].want, "%s detected as %s, want %s", tpl[i].file, ember_tool_format_name(d),
               ember_tool_format_name(tpl[i].want));
    }
    fprintf(stderr, "detection checked on %d real templates\n", found);
    CHECK(ember_tool_format_detect(NULL, 0) == EMBER_TOOLS_NONE);
    /* a sink that stops the parser */
    ember_tool_parser *p = ember_tool_parser_new(EMBER_TOOLS_HERMES, NULL);
    ember_error err = {0};
    CHECK(ember_tool_parser_feed(p, "<tool_call>{\"name\":\"f\"}</tool_call>", 35, stop_sink, NULL, &err) ==
          EMBER_ERR_INTERNAL);
    CHECK(ember_tool_parser_finish(p, stop_sink, NULL, &err) == EMBER_ERR_INVALID_ARG);
    ember_tool_parser_free(p);
}

int main(void) {
    hermes();
    coder();
    llama();
    mistral();
    gemma();
    holdback();
    names_and_detection();
    return test_done();
}
