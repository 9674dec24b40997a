/*
 * test_gguf.c - the GGUF reader.
 *
 * 1. The real files in ../shared/testdata: metadata and tensors read right
 *    (stories260K's tensors against the llama2.c checkpoint they came from,
 *    its vocabulary against tok512.bin, the tiny Llama-2 vocabulary against
 *    llama.cpp's vocab file, the vocab files' sizes against the README).
 * 2. A small GGUF built here with every value type, read back through every
 *    getter, with type mismatches and out-of-range values refused.
 * 3. Hand-made corrupt variants of that file, each refused with the right
 *    complaint and the file's name; every truncation of it refused; many
 *    random mutations parsed without a crash (run under the sanitizers).
 */
#define _POSIX_C_SOURCE 200809L
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include <float.h>
#include <stdbool.h>
#include <unistd.h>

#include "core/util.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "test.h"

#define NAME "test.gguf"

/* ---- a little GGUF writer ------------------------------------------------------ */

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static void put(gbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put8(gbuf *b, uint8_t v) {
    put(b, &v, 1);
}
static void put16(gbuf *b, uint16_t v) {
    uint8_t t[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(b, t, 2);
}
static void put32(gbuf *b, uint32_t v) {
    uint8_t t[4];
    for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(b, t, 4);
}
static void put64(gbuf *b, uint64_t v) {
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}
static void putstrn(gbuf *b, const char *s, size_t n) {
    put64(b, n);
    put(b, s, n);
}
static void putstr(gbuf *b, const char *s) {
    putstrn(b, s, strlen(s));
}
static void key(gbuf *b, const char *k, uint32_t type) {
    putstr(b, k);
    put32(b, type);
}
static void patch32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void patch64(uint8_t *p, uint64_t v) {
    patch32(p, (uint32_t)v);
    patch32(p + 4, (uint32_t)(v >> 32));
}

/* Where the interesting fields of the base file are. */
typedef struct layout {
    size_t version, n_tensors, n_kv;
    size_t arch_keylen, arch_vallen;
    size_t align_type, align_val;
    size_t bool_val, b_key_last, u8_type;
    size_t strs_count, strs_elem1_len, f32s_count, f32s_elem_type;
    size_t nested_inner_type;
    size_t t_name[3], t_ndims[3], t_dim[3], t_type[3], t_off[3];
    size_t data;
} layout;

#define N_KV 23
/* The base file: every value type, three tensors, the last one ending
   exactly at the end of the file (so that every truncation cuts a tensor). */
static void build_base(gbuf *b, layout *L) {
    memset(b, 0, sizeof *b);
    put(b, "GGUF", 4);
    L->version = b->n;
    put32(b, 3);
    L->n_tensors = b->n;
    put64(b, 3);
    L->n_kv = b->n;
    put64(b, N_KV);
    /* 1 */ L->arch_keylen = b->n;
    key(b, "general.architecture", EMBER_GGUF_STRING);
    L->arch_vallen = b->n;
    putstr(b, "llama");
    /* 2 */ putstr(b, "general.alignment");
    L->align_type = b->n;
    put32(b, EMBER_GGUF_U32);
    L->align_val = b->n;
    put32(b, 32);
    /* 3 */ key(b, "t.u8", EMBER_GGUF_U8);
    L->u8_type = b->n - 4;
    put8(b, 200);
    /* 4 */ key(b, "t.i8", EMBER_GGUF_I8);
    put8(b, (uint8_t)-5);
    /* 5 */ key(b, "t.u16", EMBER_GGUF_U16);
    put16(b, 65535);
    /* 6 */ key(b, "t.i16", EMBER_GGUF_I16);
    put16(b, (uint16_t)-300);
    /* 7 */ key(b, "t.u32", EMBER_GGUF_U32);
    put32(b, 4000000000u);
    /* 8 */ key(b, "t.i32", EMBER_GGUF_I32);
    put32(b, (uint32_t)-2000000000);
    /* 9 */ key(b, "t.f32", EMBER_GGUF_F32);
    put32(b, ember_f32_to_bits(0.1f));
    /* 10 */ key(b, "t.bool", EMBER_GGUF_BOOL);
    L->bool_val = b->n;
    put8(b, 1);
    /* 11 */ key(b, "t.u64", EMBER_GGUF_U64);
    put64(b, 1ull << 40);
    /* 12 */ key(b, "t.i64", EMBER_GGUF_I64);
    put64(b, (uint64_t)INT64_MIN);
    /* 13 */ key(b, "t.f64", EMBER_GGUF_F64);
    double d = 0.1;
    put(b, &d, 8);
    /* 14 */ key(b, "t.strs", EMBER_GGUF_ARRAY);
    put32(b, EMBER_GGUF_STRING);
    L->strs_count = b->n;
    put64(b, 3);
    putstr(b, "a");
    L->strs_elem1_len = b->n;
    putstr(b, "");
    putstrn(b, "h\xc3\xa9llo\0x", 8); /* non-ASCII and an embedded NUL */
    /* 15 */ key(b, "t.f32s", EMBER_GGUF_ARRAY);
    L->f32s_elem_type = b->n;
    put32(b, EMBER_GGUF_F32);
    L->f32s_count = b->n;
    put64(b, 3);
    put32(b, ember_f32_to_bits(1.5f));
    put32(b, ember_f32_to_bits(-2.0f));
    put32(b, ember_f32_to_bits(1e30f));
    /* 16 */ key(b, "t.i32s", EMBER_GGUF_ARRAY);
    put32(b, EMBER_GGUF_I32);
    put64(b, 3);
    put32(b, 1);
    put32(b, (uint32_t)-2);
    put32(b, 2147483647u);
    /* 17 */ key(b, "t.u8s", EMBER_GGUF_ARRAY);
    put32(b, EMBER_GGUF_U8);
    put64(b, 3);
    put8(b, 1), put8(b, 2), put8(b, 255);
    /* 18 */ key(b, "t.nested", EMBER_GGUF_ARRAY); /* [[1, 2], ["x"], []] */
    put32(b, EMBER_GGUF_ARRAY);
    put64(b, 3);
    L->nested_inner_type = b->n;
    put32(b, EMBER_GGUF_U32);
    put64(b, 2);
    put32(b, 1), put32(b, 2);
    put32(b, EMBER_GGUF_STRING);
    put64(b, 1);
    putstr(b, "x");
    put32(b, EMBER_GGUF_BOOL);
    put64(b, 0);
    /* 19 */ key(b, "t.empty", EMBER_GGUF_ARRAY);
    put32(b, EMBER_GGUF_I32);
    put64(b, 0);
    /* 20 */ key(b, "t.a", EMBER_GGUF_U32);
    put32(b, 1);
    /* 21 */ key(b, "t.b", EMBER_GGUF_U32);
    L->b_key_last = b->n - 4 - 1;
    put32(b, 2);
    /* 22 */ key(b, "t.str", EMBER_GGUF_STRING);
    putstrn(b, "a\0b", 3);
    /* 23 */ key(b, "t.u64s", EMBER_GGUF_ARRAY);
    put32(b, EMBER_GGUF_U64);
    put64(b, 2);
    put64(b, 7);
    put64(b, 1ull << 33);
    /* tensors: "tensor.a" f32 ne {4, 3}; "tensor.b" q4_0 ne {64}; "tensor.c" f16 ne {2, 3, 4} */
    static const char *names[3] = {"tensor.a", "tensor.b", "tensor.c"};
    static const uint32_t nd[3] = {2, 1, 3}, type[3] = {0, 2, 1};
    static const uint64_t dims[3][3] = {{4, 3}, {64}, {2, 3, 4}}, off[3] = {0, 64, 128};
    for (int t = 0; t < 3; t++) {
        L->t_name[t] = b->n;
        putstr(b, names[t]);
        L->t_ndims[t] = b->n;
        put32(b, nd[t]);
        L->t_dim[t] = b->n;
        for (uint32_t i = 0; i < nd[t]; i++) put64(b, dims[t][i]);
        L->t_type[t] = b->n;
        put32(b, type[t]);
        L->t_off[t] = b->n;
        put64(b, off[t]);
    }
    while (b->n % 32) put8(b, 0);
    L->data = b->n;
    for (int i = 0; i < 176; i++) put8(b, (uint8_t)(i * 7 + 1)); /* tensor.c ends at 128 + 48 */
}

/* Parses a copy of exactly n bytes (so reading past the end is caught by
   ASan). With out, a parsed file is returned in *out and its buffer in
   *keep (the caller frees both); otherwise both are freed here. */
static int parse_keep(const uint8_t *p, size_t n, ember_gguf **out, uint8_t **keep, ember_error *err) {
    uint8_t *c = malloc(n ? n : 1);
    if (n) memcpy(c, p, n);
    ember_gguf *f = NULL;
    int rc = ember_gguf_parse(NAME, c, n, &f, err);
    if (out && rc == EMBER_OK) {
        *out = f;
        *keep = c;
        return rc;
    }
    ember_gguf_free(f);
    free(c);
    return rc;
}
static int parse_copy(const uint8_t *p, size_t n, ember_error *err) {
    return parse_keep(p, n, NULL, NULL, err);
}

static bool names_file(const ember_error *err) {
    return strncmp(err->msg, NAME ": ", strlen(NAME) + 2) == 0;
}

/* Expects the patched file to be refused with code and a message containing
   want. */
#define EXPECT_FAIL(buf, n, code, want)                                                                           \
    do {                                                                                                          \
        ember_error e_;                                                                                           \
        memset(&e_, 0, sizeof e_);                                                                                \
        int rc_ = parse_copy((buf), (n), &e_);                                                                    \
        CHECKF(rc_ == (code), "expected %d, got %d (%s) for %s", (code), rc_, e_.msg, (want));                    \
        CHECKF(strstr(e_.msg, (want)) != NULL && names_file(&e_), "message '%s' lacks '%s'", e_.msg, (want));     \
    } while (0)

/* ---- the base file, read back ---------------------------------------------------- */

static void test_base(void) {
    gbuf b;
    layout L;
    build_base(&b, &L);
    ember_gguf *f = NULL;
    ember_error err;
    uint8_t *copy = malloc(b.n);
    memcpy(copy, b.p, b.n);
    int rc = ember_gguf_parse(NAME, copy, b.n, &f, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    if (rc) {
        free(copy);
        free(b.p);
        return;
    }
    CHECK(f->version == 3 && f->alignment == 32 && f->n_kv == N_KV && f->n_tensors == 3);
    CHECK(f->data_offset == L.data && f->data_size == 176);

    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    bool bl;
    const char *s;
    size_t len;
    CHECK(ember_gguf_get_u32(f, "t.u8", &u32, &err) == EMBER_OK && u32 == 200);
    CHECK(ember_gguf_get_i32(f, "t.i8", &i32, &err) == EMBER_OK && i32 == -5);
    CHECK(ember_gguf_get_u32(f, "t.u16", &u32, &err) == EMBER_OK && u32 == 65535);
    CHECK(ember_gguf_get_i64(f, "t.i16", &i64, &err) == EMBER_OK && i64 == -300);
    CHECK(ember_gguf_get_u32(f, "t.u32", &u32, &err) == EMBER_OK && u32 == 4000000000u);
    CHECK(ember_gguf_get_u64(f, "t.u32", &u64, &err) == EMBER_OK && u64 == 4000000000u);
    CHECK(ember_gguf_get_i64(f, "t.u32", &i64, &err) == EMBER_OK && i64 == 4000000000);
    CHECK(ember_gguf_get_i32(f, "t.i32", &i32, &err) == EMBER_OK && i32 == -2000000000);
    CHECK(ember_gguf_get_f32(f, "t.f32", &f32, &err) == EMBER_OK && f32 == 0.1f);
    CHECK(ember_gguf_get_f64(f, "t.f32", &f64, &err) == EMBER_OK && f64 == (double)0.1f);
    CHECK(ember_gguf_get_f64(f, "t.f64", &f64, &err) == EMBER_OK && f64 == 0.1);
    CHECK(ember_gguf_get_f32(f, "t.f64", &f32, &err) == EMBER_OK && f32 == 0.1f);
    CHECK(ember_gguf_get_bool(f, "t.bool", &bl, &err) == EMBER_OK && bl);
    CHECK(ember_gguf_get_u64(f, "t.u64", &u64, &err) == EMBER_OK && u64 == 1ull << 40);
    CHECK(ember_gguf_get_i64(f, "t.i64", &i64, &err) == EMBER_OK && i64 == INT64_MIN);
    CHECK(ember_gguf_get_str(f, "general.architecture", &s, &len, &err) == EMBER_OK && strcmp(s, "llama") == 0 &&
          len == 5);
    CHECK(ember_gguf_get_str(f, "t.str", &s, &len, &err) == EMBER_OK && len == 3 && memcmp(s, "a\0b", 4) == 0);

    const char *const *strs;
    const size_t *lens;
    size_t n;
    CHECK(ember_gguf_get_strs(f, "t.strs", &strs, &lens, &n, &err) == EMBER_OK && n == 3);
    if (n == 3) {
        CHECK(strcmp(strs[0], "a") == 0 && lens[0] == 1);
        CHECK(strcmp(strs[1], "") == 0 && lens[1] == 0);
        CHECK(lens[2] == 8 && memcmp(strs[2], "h\xc3\xa9llo\0x", 9) == 0);
    }
    float *fv = NULL;
    CHECK(ember_gguf_get_f32s(f, "t.f32s", &fv, &n, &err) == EMBER_OK && n == 3);
    if (fv) CHECK(fv[0] == 1.5f && fv[1] == -2.0f && fv[2] == 1e30f);
    free(fv);
    int32_t *iv = NULL;
    CHECK(ember_gguf_get_i32s(f, "t.i32s", &iv, &n, &err) == EMBER_OK && n == 3);
    if (iv) CHECK(iv[0] == 1 && iv[1] == -2 && iv[2] == INT32_MAX);
    free(iv);
    iv = NULL;
    CHECK(ember_gguf_get_i32s(f, "t.u8s", &iv, &n, &err) == EMBER_OK && n == 3); /* widened */
    if (iv) CHECK(iv[0] == 1 && iv[1] == 2 && iv[2] == 255);
    free(iv);
    iv = (int32_t *)1;
    CHECK(ember_gguf_get_i32s(f, "t.empty", &iv, &n, &err) == EMBER_OK && n == 0 && iv == NULL);
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, "t.nested");
    CHECK(kv && kv->type == EMBER_GGUF_ARRAY && kv->arr_type == EMBER_GGUF_ARRAY && kv->arr_len == 3);
    CHECK(ember_gguf_find_kv(f, "t.missing") == NULL && ember_gguf_find_kv(f, "") == NULL);
    CHECK(ember_gguf_find_kv(NULL, "t.a") == NULL && ember_gguf_find_kv(f, NULL) == NULL);

    /* mismatches and ranges: errors that name the file and the key, out untouched */
    typedef struct {
        int rc;
        const char *want;
    } outcome;
    outcome bad[32];
    int nb = 0;
    u32 = 12345;
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "general.architecture", &u32, &err), "expected an integer"};
    CHECK(strstr(err.msg, "'general.architecture' is string") != NULL && u32 == 12345);
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "t.i8", &u32, &err), "out of range for u32"};
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "t.u64", &u32, &err), "out of range for u32"};
    bad[nb++] = (outcome){ember_gguf_get_i32(f, "t.u32", &i32, &err), "out of range for i32"};
    bad[nb++] = (outcome){ember_gguf_get_u64(f, "t.i64", &u64, &err), "out of range for u64"};
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "t.f32", &u32, &err), "is f32, expected an integer"};
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "t.bool", &u32, &err), "is bool"};
    bad[nb++] = (outcome){ember_gguf_get_f32(f, "t.u32", &f32, &err), "expected f32 or f64"};
    bad[nb++] = (outcome){ember_gguf_get_bool(f, "t.u8", &bl, &err), "expected bool"};
    bad[nb++] = (outcome){ember_gguf_get_str(f, "t.u32", &s, &len, &err), "expected string"};
    bad[nb++] = (outcome){ember_gguf_get_str(f, "t.strs", &s, &len, &err), "is array of string"};
    bad[nb++] = (outcome){ember_gguf_get_strs(f, "t.f32s", &strs, &lens, &n, &err), "is array of f32"};
    bad[nb++] = (outcome){ember_gguf_get_strs(f, "general.architecture", &strs, &lens, &n, &err),
                          "expected array of string"};
    bad[nb++] = (outcome){ember_gguf_get_f32s(f, "t.strs", &fv, &n, &err), "expected array of f32"};
    bad[nb++] = (outcome){ember_gguf_get_f32s(f, "t.i32s", &fv, &n, &err), "expected array of f32"};
    bad[nb++] = (outcome){ember_gguf_get_i32s(f, "t.f32s", &iv, &n, &err), "expected array of integers"};
    bad[nb++] = (outcome){ember_gguf_get_i32s(f, "t.nested", &iv, &n, &err), "is array of array"};
    bad[nb++] = (outcome){ember_gguf_get_i32s(f, "t.u64s", &iv, &n, &err), "element 1 is 8589934592"};
    bad[nb++] = (outcome){ember_gguf_get_i32s(f, "t.u32", &iv, &n, &err), "is u32"};
    bad[nb++] = (outcome){ember_gguf_get_u32(f, "no.such.key", &u32, &err), "'no.such.key' is missing"};
    bad[nb++] = (outcome){ember_gguf_get_strs(f, "no.such.key", &strs, &lens, &n, &err), "is missing"};
    for (int i = 0; i < nb; i++) CHECKF(bad[i].rc == EMBER_ERR_FORMAT, "case %d: %d", i, bad[i].rc);
    /* re-run each to check its message (err holds only the last) */
    CHECK(ember_gguf_get_u32(f, "t.i8", &u32, &err) &&
          strstr(err.msg, "test.gguf: metadata 't.i8' is -5, out of range for u32"));
    CHECK(ember_gguf_get_i32s(f, "t.u64s", &iv, &n, &err) && strstr(err.msg, "element 1 is 8589934592"));
    CHECK(ember_gguf_get_i32s(f, "t.nested", &iv, &n, &err) && strstr(err.msg, "is array of array"));
    CHECK(ember_gguf_get_u32(f, "no.such.key", &u32, &err) &&
          strcmp(err.msg, "test.gguf: metadata key 'no.such.key' is missing") == 0);
    CHECK(ember_gguf_get_f32(f, "t.u32", &f32, &err) && strstr(err.msg, "expected f32 or f64"));
    CHECK(ember_gguf_get_strs(f, "t.f32s", &strs, &lens, &n, &err) &&
          strstr(err.msg, "'t.f32s' is array of f32, expected array of string"));

    /* tensors: row-major shapes, data where the file says */
    const ember_gguf_tensor *t = ember_gguf_find_tensor(f, "tensor.a");
    CHECK(t && t == &f->tensors[0] && t->dtype == EMBER_F32 && t->ggml_type == 0 && t->ndim == 2);
    if (t) {
        CHECK(t->ne[0] == 4 && t->ne[1] == 3 && t->shape[0] == 3 && t->shape[1] == 4 && t->nelem == 12);
        CHECK(t->nbytes == 48 && t->offset == 0 && t->data == copy + L.data);
    }
    t = ember_gguf_find_tensor(f, "tensor.b");
    CHECK(t && t->dtype == EMBER_Q4_0 && t->ndim == 1 && t->shape[0] == 64 && t->nbytes == 36 &&
          t->data == copy + L.data + 64);
    t = ember_gguf_find_tensor(f, "tensor.c");
    CHECK(t && t->dtype == EMBER_F16 && t->ndim == 3 && t->nbytes == 48 && t->data == copy + L.data + 128);
    if (t) CHECK(t->shape[0] == 4 && t->shape[1] == 3 && t->shape[2] == 2 && t->ne[2] == 4 && t->ne[3] == 1);
    CHECK(ember_gguf_find_tensor(f, "tensor") == NULL && ember_gguf_find_tensor(f, "tensor.d") == NULL);
    CHECK(strcmp(ember_gguf_type_name(2), "Q4_0") == 0 && ember_gguf_type_name(4) == NULL);
    CHECK(strcmp(ember_gguf_vtype_name(EMBER_GGUF_F64), "f64") == 0 &&
          strcmp(ember_gguf_vtype_name(99), "?") == 0);
    ember_gguf_free(f);
    free(copy);

    /* the same bytes from a file (mmap path) */
    char path[512];
    snprintf(path, sizeof path, "%s/gguf_base_%d.gguf", EMBER_TEST_TMP, (int)getpid());
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(b.p, 1, b.n, fp) == b.n);
    if (fp) fclose(fp);
    f = NULL;
    rc = ember_gguf_open(path, &f, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    if (f) {
        CHECK(f->map && f->n_tensors == 3 &&
              ember_gguf_find_tensor(f, "tensor.c")->data[0] == (uint8_t)(128 * 7 + 1));
        CHECK(((uintptr_t)f->tensors[0].data % 32) == 0);
    }
    ember_gguf_free(f);
    unlink(path);
    f = (ember_gguf *)1;
    CHECK(ember_gguf_open(EMBER_TEST_TMP "/no/such.gguf", &f, &err) == EMBER_ERR_IO && f == NULL);
    CHECK(strstr(err.msg, "no/such.gguf") != NULL);
    free(b.p);
}

/* ---- corrupt files ------------------------------------------------------------------- */

static void test_corrupt(void) {
    gbuf b;
    layout L;
    build_base(&b, &L);
    uint8_t *p = malloc(b.n);
    size_t n = b.n;
#define RESET() memcpy(p, b.p, n)
#define FAIL(code, want) EXPECT_FAIL(p, n, code, want)
    RESET();
    CHECK(parse_copy(p, n, NULL) == EMBER_OK);

    RESET();
    p[3] = 'X';
    FAIL(EMBER_ERR_FORMAT, "not a GGUF file");
    EXPECT_FAIL(p, 0, EMBER_ERR_FORMAT, "not a GGUF file");
    EXPECT_FAIL((const uint8_t *)"GGU", 3, EMBER_ERR_FORMAT, "not a GGUF file");
    RESET();
    patch32(p + L.version, 1);
    FAIL(EMBER_ERR_UNSUPPORTED, "version 1 is not supported");
    RESET();
    patch32(p + L.version, 4);
    FAIL(EMBER_ERR_FORMAT, "unknown GGUF version 4");
    RESET();
    patch32(p + L.version, 0);
    FAIL(EMBER_ERR_FORMAT, "unknown GGUF version 0");
    RESET();
    patch32(p + L.version, 0x03000000);
    FAIL(EMBER_ERR_UNSUPPORTED, "big-endian");
    RESET();
    patch32(p + L.version, 2);
    CHECK(parse_copy(p, n, NULL) == EMBER_OK); /* v2: same layout */ /* counts */
    RESET();
    patch64(p + L.n_tensors, 1ull << 60);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch64(p + L.n_tensors, UINT64_MAX);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch64(p + L.n_kv, UINT64_MAX);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch64(p + L.n_kv, (n / 14) + 1);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch64(p + L.n_kv, N_KV + 1);
    FAIL(EMBER_ERR_FORMAT, NAME ": "); /* reads a tensor info as a pair */
    RESET();
    patch64(p + L.n_tensors, 4);
    FAIL(EMBER_ERR_FORMAT, "tensor info 3");

    /* strings */
    RESET();
    patch64(p + L.arch_keylen, 1ull << 62);
    FAIL(EMBER_ERR_FORMAT, "runs past the end of the file");
    RESET();
    patch64(p + L.arch_keylen, UINT64_MAX);
    FAIL(EMBER_ERR_FORMAT, "runs past the end of the file");
    RESET();
    patch64(p + L.arch_keylen, 0);
    FAIL(EMBER_ERR_FORMAT, "key is empty");
    RESET();
    patch64(p + L.arch_vallen, n);
    FAIL(EMBER_ERR_FORMAT, "'general.architecture': string value");
    RESET();
    p[L.arch_keylen + 8 + 3] = 0;
    FAIL(EMBER_ERR_FORMAT, "contains a NUL byte");
    RESET();
    patch64(p + L.strs_elem1_len, 1ull << 40);
    FAIL(EMBER_ERR_FORMAT, "'t.strs': string element");
    RESET();
    patch64(p + L.t_name[1], 0);
    FAIL(EMBER_ERR_FORMAT, "tensor name is empty");
    RESET();
    patch64(p + L.t_name[1], 1ull << 50);
    FAIL(EMBER_ERR_FORMAT, "tensor info 1: tensor name");

    /* arrays and value types */
    RESET();
    patch64(p + L.strs_count, 1ull << 40);
    FAIL(EMBER_ERR_FORMAT, "array of 1099511627776 string values");
    RESET();
    patch64(p + L.strs_count, UINT64_MAX);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch64(p + L.f32s_count, UINT64_MAX / 4 + 2);
    FAIL(EMBER_ERR_FORMAT, "cannot fit"); /* x4 wraps */
    RESET();
    patch64(p + L.f32s_count, 1ull << 61);
    FAIL(EMBER_ERR_FORMAT, "cannot fit");
    RESET();
    patch32(p + L.f32s_elem_type, 13);
    FAIL(EMBER_ERR_FORMAT, "unknown array element type 13");
    RESET();
    patch32(p + L.u8_type, 13);
    FAIL(EMBER_ERR_FORMAT, "'t.u8': unknown value type 13");
    RESET();
    patch32(p + L.u8_type, 0x80000000u);
    FAIL(EMBER_ERR_FORMAT, "unknown value type");
    RESET();
    patch32(p + L.nested_inner_type, 77);
    FAIL(EMBER_ERR_FORMAT, "unknown nested array element type 77");
    RESET();
    p[L.bool_val] = 2;
    FAIL(EMBER_ERR_FORMAT, "bool value is 2");

    /* alignment */
    RESET();
    patch32(p + L.align_val, 0);
    FAIL(EMBER_ERR_FORMAT, "'general.alignment' is 0");
    RESET();
    patch32(p + L.align_val, 24);
    FAIL(EMBER_ERR_FORMAT, "'general.alignment' is 24");
    RESET();
    patch32(p + L.align_val, 1u << 30);
    FAIL(EMBER_ERR_FORMAT, "power of two");
    RESET();
    patch32(p + L.align_val, 0xffffffffu);
    FAIL(EMBER_ERR_FORMAT, "power of two");
    RESET();
    patch32(p + L.align_val, 4);
    FAIL(EMBER_ERR_FORMAT, "power of two");
    RESET();
    patch32(p + L.align_type, EMBER_GGUF_I32);
    FAIL(EMBER_ERR_FORMAT, "'general.alignment' is i32, must be u32");
    RESET();
    patch32(p + L.align_type, EMBER_GGUF_F32);
    FAIL(EMBER_ERR_FORMAT, "is f32, must be u32");
    RESET();
    patch32(p + L.align_val, 64);
    patch64(p + L.t_off[1], 96);
    FAIL(EMBER_ERR_FORMAT, "tensor 'tensor.b': data offset 96 is not a multiple of the alignment 64");

    /* tensor infos */
    RESET();
    patch32(p + L.t_type[1], 99);
    FAIL(EMBER_ERR_FORMAT, "tensor 'tensor.b': unknown type id 99");
    RESET();
    patch32(p + L.t_type[1], 4);
    FAIL(EMBER_ERR_FORMAT, "unknown type id 4"); /* retired Q4_2 */
    RESET();
    patch32(p + L.t_type[1], 0xffffffffu);
    FAIL(EMBER_ERR_FORMAT, "unknown type id 4294967295");
    RESET();
    patch64(p + L.t_dim[1], 0);
    FAIL(EMBER_ERR_FORMAT, "tensor 'tensor.b': dimension 0 is zero");
    RESET();
    patch64(p + L.t_dim[2] + 8, 0);
    FAIL(EMBER_ERR_FORMAT, "dimension 1 is zero");
    RESET();
    patch64(p + L.t_dim[1], 1ull << 63);
    FAIL(EMBER_ERR_FORMAT, "dimension 0 is too large");
    RESET();
    patch64(p + L.t_dim[1], UINT64_MAX);
    FAIL(EMBER_ERR_FORMAT, "too large");
    RESET();
    patch64(p + L.t_dim[0], 1ull << 40);
    patch64(p + L.t_dim[0] + 8, 1ull << 40);
    FAIL(EMBER_ERR_FORMAT, "element count overflows");
    RESET();
    patch64(p + L.t_dim[0], (1ull << 62) + 1);
    FAIL(EMBER_ERR_FORMAT, "tensor 'tensor.a': byte size overflows");
    RESET();
    patch64(p + L.t_dim[0], 1ull << 40);
    FAIL(EMBER_ERR_FORMAT, "runs past the end");
    RESET();
    patch64(p + L.t_dim[1], 33);
    FAIL(EMBER_ERR_FORMAT, "innermost dimension 33 is not a multiple of the Q4_0 block size 32");
    RESET();
    patch32(p + L.t_ndims[1], 0);
    FAIL(EMBER_ERR_FORMAT, "n_dims is 0");
    RESET();
    patch32(p + L.t_ndims[1], 5);
    FAIL(EMBER_ERR_FORMAT, "n_dims is 5");
    RESET();
    patch32(p + L.t_ndims[1], 0xffffffffu);
    FAIL(EMBER_ERR_FORMAT, "n_dims is 4294967295");

    /* offsets */
    RESET();
    patch64(p + L.t_off[2], 160);
    FAIL(EMBER_ERR_FORMAT,
         "tensor 'tensor.c': data at offset 160 (48 bytes) runs past the end of the 176-byte data section");
    RESET();
    patch64(p + L.t_off[2], 1ull << 40);
    FAIL(EMBER_ERR_FORMAT, "runs past the end");
    RESET();
    patch64(p + L.t_off[2], UINT64_MAX - 31);
    FAIL(EMBER_ERR_FORMAT, "runs past the end");
    RESET();
    patch64(p + L.t_off[1], 65);
    FAIL(EMBER_ERR_FORMAT, "tensor 'tensor.b': data offset 65 is not a multiple of the alignment 32");
    RESET();
    patch64(p + L.t_off[1], 48);
    FAIL(EMBER_ERR_FORMAT, "not a multiple of the alignment");
    RESET();
    patch64(p + L.t_off[1], 32);
    FAIL(EMBER_ERR_FORMAT, "tensors 'tensor.a' and 'tensor.b' overlap");
    RESET();
    patch64(p + L.t_off[2], 0);
    FAIL(EMBER_ERR_FORMAT, "overlap");
    RESET();
    patch64(p + L.t_off[0], 128);
    patch64(p + L.t_off[2], 0);
    CHECK(parse_copy(p, n, NULL) == EMBER_OK); /* order is free */ /* duplicates */
    RESET();
    p[L.t_name[1] + 8 + 7] = 'a';
    FAIL(EMBER_ERR_FORMAT, "duplicate tensor name 'tensor.a'");
    RESET();
    p[L.b_key_last] = 'a';
    FAIL(EMBER_ERR_FORMAT, "duplicate metadata key 't.a'");

    /* every truncation is a clean error */
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        ember_error e;
        memset(&e, 0, sizeof e);
        int rc = parse_copy(b.p, len, &e);
        if ((rc != EMBER_ERR_FORMAT || !names_file(&e)) && bad++ < 5)
            fprintf(stderr, "truncated to %zu: rc %d '%s'\n", len, rc, e.msg);
    }
    CHECKF(bad == 0, "%d truncations not refused cleanly", bad);
    free(p);
    free(b.p);
#undef RESET
#undef FAIL
}

/* ---- small files made for one case each ---------------------------------------------- */

static void header(gbuf *b, uint32_t version, uint64_t nt, uint64_t nkv) {
    memset(b, 0, sizeof *b);
    put(b, "GGUF", 4);
    put32(b, version);
    put64(b, nt);
    put64(b, nkv);
}

static void tensor_info(gbuf *b, const char *name, uint64_t ne0, uint32_t type, uint64_t off) {
    putstr(b, name);
    put32(b, 1);
    put64(b, ne0);
    put32(b, type);
    put64(b, off);
}

static void pad_to(gbuf *b, size_t a) {
    while (b->n % a) put8(b, 0);
}

static void test_special_files(void) {
    gbuf b;
    ember_gguf *f = NULL;
    ember_error err;

    /* no tensors, no metadata, no padding */
    header(&b, 3, 0, 0);
    CHECK(parse_copy(b.p, b.n, &err) == EMBER_OK);
    free(b.p);

    /* nested arrays: 8 levels are fine, 9 are refused */
    for (int depth = 8; depth <= 9; depth++) {
        header(&b, 3, 0, 1);
        key(&b, "deep", EMBER_GGUF_ARRAY);
        for (int i = 1; i < depth; i++) {
            put32(&b, EMBER_GGUF_ARRAY);
            put64(&b, 1);
        }
        put32(&b, EMBER_GGUF_U8);
        put64(&b, 1);
        put8(&b, 42);
        if (depth == 8) {
            CHECK(parse_copy(b.p, b.n, &err) == EMBER_OK);
        } else {
            EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "'deep': arrays nested more than 8 deep");
        }
        free(b.p);
    }
    /* a deep nest that claims a huge count at the bottom */
    header(&b, 3, 0, 1);
    key(&b, "deep", EMBER_GGUF_ARRAY);
    put32(&b, EMBER_GGUF_ARRAY);
    put64(&b, 1);
    put32(&b, EMBER_GGUF_STRING);
    put64(&b, 1ull << 59);
    EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "cannot fit");
    free(b.p);

    /* tensor names: 64 bytes fine, 65 refused */
    for (int len = 64; len <= 65; len++) {
        char name[80];
        memset(name, 'n', (size_t)len);
        name[len] = 0;
        header(&b, 3, 1, 0);
        tensor_info(&b, name, 8, 0, 0);
        pad_to(&b, 32);
        for (int i = 0; i < 32; i++) put8(&b, 0);
        if (len == 64)
            CHECK(parse_copy(b.p, b.n, &err) == EMBER_OK);
        else
            EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "tensor name is 65 bytes long (at most 64)");
        free(b.p);
    }
    /* a key of 65536 bytes */
    header(&b, 3, 0, 1);
    char *big = malloc(65536);
    memset(big, 'k', 65536);
    putstrn(&b, big, 65536);
    put32(&b, EMBER_GGUF_U8);
    put8(&b, 0);
    free(big);
    EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "key is 65536 bytes long");
    free(b.p);

    /* alignment 64, absent alignment (default 32), v2 */
    header(&b, 2, 2, 1);
    putstr(&b, "general.alignment");
    put32(&b, EMBER_GGUF_U32);
    put32(&b, 64);
    tensor_info(&b, "x", 16, 0, 0);
    tensor_info(&b, "y", 16, 0, 64);
    pad_to(&b, 64);
    size_t data = b.n;
    for (int i = 0; i < 128; i++) put8(&b, (uint8_t)i);
    uint8_t *keep = NULL;
    CHECK(parse_keep(b.p, b.n, &f, &keep, &err) == EMBER_OK);
    if (f) {
        CHECK(f->version == 2 && f->alignment == 64 && f->data_offset == data && f->data_offset % 64 == 0);
        CHECK(f->tensors[0].data == keep + data && f->tensors[1].data == keep + data + 64);
        CHECK(f->tensors[1].data[0] == 64);
        ember_gguf_free(f);
        free(keep);
        f = NULL;
    }
    free(b.p);
    header(&b, 3, 1, 0);
    tensor_info(&b, "x", 8, 0, 0);
    pad_to(&b, 32);
    data = b.n;
    for (int i = 0; i < 32; i++) put8(&b, 1);
    CHECK(parse_keep(b.p, b.n, &f, &keep, &err) == EMBER_OK);
    if (f) {
        CHECK(f->alignment == 32 && f->data_offset == data);
        free(keep);
        ember_gguf_free(f);
        f = NULL;
    }
    free(b.p);

    /* a tensor whose padding before the data section is cut off */
    header(&b, 3, 1, 0);
    tensor_info(&b, "x", 8, 0, 0);
    EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "past the end of the");
    free(b.p);

    /* every known type id: sizes agree with the dtype table; types Ember lacks
       still parse (dtype invalid) */
    for (uint32_t id = 0; id < 64; id++) {
        const char *tn = ember_gguf_type_name(id);
        if (!tn) {
            header(&b, 3, 1, 0);
            tensor_info(&b, "x", 256, id, 0);
            pad_to(&b, 32);
            for (int i = 0; i < 4096; i++) put8(&b, 0);
            EXPECT_FAIL(b.p, b.n, EMBER_ERR_FORMAT, "unknown type id");
            free(b.p);
            continue;
        }
        header(&b, 3, 1, 0);
        tensor_info(&b, "x", 256 * 2, id, 0);
        pad_to(&b, 32);
        for (int i = 0; i < 8 * 512; i++) put8(&b, 0);
        f = NULL;
        int rc = parse_keep(b.p, b.n, &f, &keep, &err);
        CHECKF(rc == EMBER_OK, "type %u: %s", id, err.msg);
        if (f) {
            ember_dtype dt = ember_dtype_from_gguf(id);
            const ember_gguf_tensor *t = &f->tensors[0];
            CHECK(t->ggml_type == id && t->dtype == dt);
            if (dt != EMBER_DTYPE_INVALID) {
                size_t want;
                CHECK(ember_dtype_nbytes(dt, 512, &want) && want == t->nbytes);
                CHECKF(strcmp(ember_dtype_get(dt)->st_name, tn) == 0, "%s vs %s", ember_dtype_get(dt)->st_name,
                       tn);
            }
            free(keep);
            ember_gguf_free(f);
        }
        free(b.p);
    }
}

/* ---- random mutations: never a crash, errors always name the file ---------------- */


/* Touches everything a parsed file offers. */
static void exercise(const ember_gguf *f) {
    volatile unsigned sink = 0;
    for (size_t i = 0; i < f->n_kv; i++) {
        const ember_gguf_kv *kv = &f->kv[i];
        uint32_t u;
        float x;
        const char *s;
        const char *const *ss;
        size_t n;
        float *fv = NULL;
        int32_t *iv = NULL;
        ember_gguf_get_u32(f, kv->key, &u, NULL);
        ember_gguf_get_f32(f, kv->key, &x, NULL);
        ember_gguf_get_str(f, kv->key, &s, NULL, NULL);
        if (ember_gguf_get_strs(f, kv->key, &ss, NULL, &n, NULL) == EMBER_OK)
            for (size_t j = 0; j < n; j++) sink += (unsigned)strlen(ss[j]);
        if (ember_gguf_get_f32s(f, kv->key, &fv, &n, NULL) == EMBER_OK) free(fv);
        if (ember_gguf_get_i32s(f, kv->key, &iv, &n, NULL) == EMBER_OK) free(iv);
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ember_gguf_tensor *t = &f->tensors[i];
        sink += t->data[0] + t->data[t->nbytes - 1];
        if (ember_gguf_find_tensor(f, t->name) != t) abort();
        if (ember_can_dequantize(t->dtype)) {
            size_t be = ember_dtype_get(t->dtype)->block_elems;
            float tmp[256];
            ember_dequantize(t->dtype, t->data, tmp, be, NULL);
        }
    }
    (void)sink;
}

static void test_mutations(void) {
    gbuf b;
    layout L;
    build_base(&b, &L);
    uint8_t *p = malloc(b.n);
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(p, b.p, b.n);
        int nmut = 1 + (int)(rnd() % 4);
        for (int m = 0; m < nmut; m++) {
            size_t at = rnd() % (rnd() % 4 ? L.data : b.n); /* mostly the header */
            switch (rnd() % 4) {
            case 0: p[at] = (uint8_t)rnd(); break;
            case 1: p[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
            case 2: p[at] = (uint8_t)(rnd() % 2 ? 0xff : 0x00); break;
            default: /* a small integer into a field */ p[at] = (uint8_t)(rnd() % 16); break;
            }
        }
        size_t len = rnd() % 8 ? b.n : rnd() % b.n;
        ember_gguf *f = NULL;
        ember_error e;
        memset(&e, 0, sizeof e);
        uint8_t *c = malloc(len ? len : 1);
        memcpy(c, p, len);
        int rc = ember_gguf_parse(NAME, c, len, &f, &e);
        if (rc == EMBER_OK) {
            ok++;
            exercise(f);
        } else if ((rc != EMBER_ERR_FORMAT && rc != EMBER_ERR_UNSUPPORTED) || !names_file(&e) ||
                   strchr(e.msg, '\n')) {
            if (bad++ < 5) fprintf(stderr, "mutation %d: rc %d '%s'\n", it, rc, e.msg);
        }
        ember_gguf_free(f);
        free(c);
    }
    fprintf(stderr, "  mutations: %d of 20000 still parse\n", ok);
    CHECKF(bad == 0, "%d mutations gave bad errors", bad);
    free(p);
    free(b.p);
}

/* ---- the real files ---------------------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *d = malloc((size_t)sz + 1);
    if (d && fread(d, 1, (size_t)sz, fp) != (size_t)sz) {
        free(d);
        d = NULL;
    }
    fclose(fp);
    *n = (size_t)sz;
    return d;
}

static void check_u32(const ember_gguf *f, const char *k, uint32_t want) {
    uint32_t v = 0;
    ember_error err;
    int rc = ember_gguf_get_u32(f, k, &v, &err);
    CHECKF(rc == EMBER_OK && v == want, "%s: %s = %u (want %u) %s", f->path, k, v, want, rc ? err.msg : "");
}

static void test_stories(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/stories260K.gguf", dir);
    ember_gguf *f;
    ember_error err;
    int rc = ember_gguf_open(path, &f, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    if (rc) return;
    CHECK(f->version == 3 && f->alignment == 32 && f->n_tensors == 48 && f->n_kv == 19);
    const char *s;
    CHECK(ember_gguf_get_str(f, "general.architecture", &s, NULL, &err) == EMBER_OK && strcmp(s, "llama") == 0);
    CHECK(ember_gguf_get_str(f, "tokenizer.ggml.model", &s, NULL, &err) == EMBER_OK && strcmp(s, "llama") == 0);
    check_u32(f, "tokenizer.ggml.bos_token_id", 1);
    check_u32(f, "tokenizer.ggml.eos_token_id", 2);
    check_u32(f, "tokenizer.ggml.unknown_token_id", 0);
    check_u32(f, "llama.context_length", 2048);
    check_u32(f, "llama.rope.dimension_count", 8);
    check_u32(f, "llama.embedding_length", 64);
    check_u32(f, "llama.feed_forward_length", 172);
    check_u32(f, "llama.block_count", 5);
    check_u32(f, "llama.attention.head_count", 8);
    check_u32(f, "llama.attention.head_count_kv", 4);
    float eps = 0;
    CHECK(ember_gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == EMBER_OK && eps == 1e-5f);
    CHECK(ember_gguf_find_kv(f, "llama.rope.freq_base") == NULL); /* optional, absent */

    /* the vocabulary against llama2.c's tok512.bin: int32 max_len, then per
       token f32 score, i32 length, bytes (BOS / EOS are spelled differently) */
    const char *const *tok;
    const size_t *tlen;
    size_t nt = 0, ns = 0, ny = 0;
    float *scores = NULL;
    int32_t *types = NULL;
    CHECK(ember_gguf_get_strs(f, "tokenizer.ggml.tokens", &tok, &tlen, &nt, &err) == EMBER_OK && nt == 512);
    CHECK(ember_gguf_get_f32s(f, "tokenizer.ggml.scores", &scores, &ns, &err) == EMBER_OK && ns == 512);
    CHECK(ember_gguf_get_i32s(f, "tokenizer.ggml.token_type", &types, &ny, &err) == EMBER_OK && ny == 512);
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/tok512.bin", dir);
    size_t tn;
    unsigned char *tb = slurp(path, &tn);
    CHECK(tb != NULL);
    if (tb && nt == 512 && ns == 512 && ny == 512) {
        CHECK(strcmp(tok[0], "<unk>") == 0 && types[0] == 2 && types[1] == 3 && types[2] == 3);
        CHECK(strcmp(tok[3], "<0x00>") == 0 && types[3] == 6 && strcmp(tok[258], "<0xFF>") == 0);
        size_t at = 4;
        int mism = 0;
        for (int i = 0; i < 512 && at + 8 <= tn; i++) {
            float sc;
            int32_t len;
            memcpy(&sc, tb + at, 4);
            memcpy(&len, tb + at + 4, 4);
            at += 8;
            if (len < 0 || at + (size_t)len > tn) break;
            /* llama2.c spells SentencePiece's U+2581 as a space */
            char sp[64];
            size_t sl = 0;
            for (size_t j = 0; j < tlen[i] && sl < sizeof sp; j++) {
                if (j + 2 < tlen[i] && memcmp(tok[i] + j, "\xe2\x96\x81", 3) == 0) {
                    sp[sl++] = ' ';
                    j += 2;
                } else {
                    sp[sl++] = tok[i][j];
                }
            }
            bool same =
                sc == scores[i] && (i == 1 || i == 2 || ((size_t)len == sl && memcmp(sp, tb + at, sl) == 0));
            if (!same && mism++ < 3) fprintf(stderr, "token %d differs from tok512.bin\n", i);
            at += (size_t)len;
        }
        CHECK(mism == 0 && at == tn);
    }
    free(tb);
    free(scores);
    free(types);

    /* every tensor against stories260K.bin (7 int32 header fields, then the
       weights in llama2.c order) */
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/stories260K.bin", dir);
    size_t bn;
    unsigned char *bin = slurp(path, &bn);
    CHECK(bin != NULL);
    if (bin) {
        const int dim = 64, hid = 172, nl = 5, kvd = 32, voc = 512;
        size_t off = 28;
        struct {
            const char *name; /* %d = layer */
            int per_layer, rows, cols;
        } order[] = {
            {"token_embd.weight", 0, voc, dim},      {"blk.%d.attn_norm.weight", 1, 1, dim},
            {"blk.%d.attn_q.weight", 1, dim, dim},   {"blk.%d.attn_k.weight", 1, kvd, dim},
            {"blk.%d.attn_v.weight", 1, kvd, dim},   {"blk.%d.attn_output.weight", 1, dim, dim},
            {"blk.%d.ffn_norm.weight", 1, 1, dim},   {"blk.%d.ffn_gate.weight", 1, hid, dim},
            {"blk.%d.ffn_down.weight", 1, dim, hid}, {"blk.%d.ffn_up.weight", 1, hid, dim},
            {"output_norm.weight", 0, 1, dim},
        };
        int checked = 0;
        for (size_t k = 0; k < EMBER_ARRAY_LEN(order); k++) {
            for (int l = 0; l < (order[k].per_layer ? nl : 1); l++) {
                char name[64];
                snprintf(name, sizeof name, order[k].name, l);
                size_t bytes = (size_t)order[k].rows * order[k].cols * 4;
                const ember_gguf_tensor *t = ember_gguf_find_tensor(f, name);
                CHECKF(t != NULL, "%s missing", name);
                if (!t) continue;
                bool shape_ok = t->dtype == EMBER_F32 && t->nbytes == bytes &&
                                (order[k].rows == 1 ? t->ndim == 1 && t->shape[0] == order[k].cols
                                                    : t->ndim == 2 && t->shape[0] == order[k].rows &&
                                                          t->shape[1] == order[k].cols);
                CHECKF(shape_ok, "%s shape", name);
                CHECKF(off + bytes <= bn && memcmp(t->data, bin + off, bytes) == 0, "%s data", name);
                off += bytes;
                checked++;
            }
        }
        const ember_gguf_tensor *o = ember_gguf_find_tensor(f, "output.weight");
        CHECK(o && o->nbytes == 512 * 64 * 4 && memcmp(o->data, bin + 28, o->nbytes) == 0);
        CHECK(checked == 47);
        free(bin);
    }
    /* tensors lie inside the file, in the mapping */
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ember_gguf_tensor *t = &f->tensors[i];
        CHECK(t->data >= f->map->data + f->data_offset && t->data + t->nbytes <= f->map->data + f->map->size);
    }
    ember_gguf_free(f);
}

static void test_tiny_llama(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/models/llama-2-tiny-random/llama-2-tiny-random.gguf", dir);
    ember_gguf *f, *v = NULL;
    ember_error err;
    int rc = ember_gguf_open(path, &f, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    if (rc) return;
    CHECK(f->version == 3 && f->n_tensors == 12);
    check_u32(f, "llama.context_length", 4096);
    check_u32(f, "llama.embedding_length", 8);
    check_u32(f, "llama.block_count", 1);
    check_u32(f, "llama.feed_forward_length", 32);
    check_u32(f, "llama.attention.head_count", 2);
    check_u32(f, "general.file_type", 1);
    check_u32(f, "tokenizer.ggml.bos_token_id", 1);
    check_u32(f, "tokenizer.ggml.eos_token_id", 2);
    const ember_gguf_tensor *t = ember_gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->dtype == EMBER_F16 && t->ndim == 2 && t->shape[0] == 32000 && t->shape[1] == 8 &&
          t->nbytes == 512000);
    t = ember_gguf_find_tensor(f, "blk.0.ffn_down.weight");
    CHECK(t && t->dtype == EMBER_F16 && t->shape[0] == 8 && t->shape[1] == 32);
    t = ember_gguf_find_tensor(f, "output_norm.weight");
    CHECK(t && t->dtype == EMBER_F32 && t->ndim == 1 && t->shape[0] == 8);
    t = ember_gguf_find_tensor(f, "output.weight");
    CHECK(t && t->dtype == EMBER_F16 && t->data + t->nbytes == f->map->data + f->map->size);
    /* its vocabulary is the Llama-2 one in llama.cpp's llama-spm vocab file */
    snprintf(path, sizeof path, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", dir);
    rc = ember_gguf_open(path, &v, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    if (!rc) {
        const char *const *a, *const *b;
        const size_t *al, *bl;
        size_t na = 0, nb = 0, nsa = 0, nsb = 0;
        float *sa = NULL, *sb = NULL;
        CHECK(ember_gguf_get_strs(f, "tokenizer.ggml.tokens", &a, &al, &na, &err) == EMBER_OK && na == 32000);
        CHECK(ember_gguf_get_strs(v, "tokenizer.ggml.tokens", &b, &bl, &nb, &err) == EMBER_OK && nb == 32000);
        CHECK(ember_gguf_get_f32s(f, "tokenizer.ggml.scores", &sa, &nsa, &err) == EMBER_OK);
        CHECK(ember_gguf_get_f32s(v, "tokenizer.ggml.scores", &sb, &nsb, &err) == EMBER_OK);
        if (na == nb && nsa == nsb && nsa == na) {
            int diff = 0;
            for (size_t i = 0; i < na; i++)
                diff += al[i] != bl[i] || memcmp(a[i], b[i], al[i]) != 0 || sa[i] != sb[i];
            CHECK(diff == 0);
            CHECK(strcmp(a[13], "<0x0A>") == 0 && strcmp(a[29871], "\xe2\x96\x81") == 0);
        }
        free(sa);
        free(sb);
    }
    ember_gguf_free(v);
    ember_gguf_free(f);
}

static void test_vocab_files(const char *dir) {
    static const struct {
        const char *name, *model;
        size_t n_vocab;
        bool merges, scores;
    } vocab[] = {
        {"llama-spm", "llama", 32000, false, true},
        {"phi-3", "llama", 32064, false, true},
        {"bert-bge", "bert", 30522, false, false},
        {"gpt-2", "gpt2", 50257, true, false},
        {"mpt", "gpt2", 50432, true, false},
        {"starcoder", "gpt2", 49152, true, false},
        {"refact", "gpt2", 49216, true, false},
        {"falcon", "gpt2", 65024, true, false},
        {"deepseek-coder", "gpt2", 32256, true, false},
        {"deepseek-llm", "gpt2", 102400, true, false},
    };
    for (size_t i = 0; i < EMBER_ARRAY_LEN(vocab); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-%s.gguf", dir,
                 vocab[i].name);
        ember_gguf *f;
        ember_error err;
        int rc = ember_gguf_open(path, &f, &err);
        CHECKF(rc == EMBER_OK, "%s", err.msg);
        if (rc) continue;
        const char *model;
        const char *const *tok;
        size_t n = 0, m = 0;
        CHECK(f->n_tensors == 0);
        CHECK(ember_gguf_get_str(f, "tokenizer.ggml.model", &model, NULL, &err) == EMBER_OK &&
              strcmp(model, vocab[i].model) == 0);
        CHECKF(ember_gguf_get_strs(f, "tokenizer.ggml.tokens", &tok, NULL, &n, &err) == EMBER_OK &&
                   n == vocab[i].n_vocab,
               "%s: %zu tokens", vocab[i].name, n);
        int32_t *types = NULL;
        CHECK(ember_gguf_get_i32s(f, "tokenizer.ggml.token_type", &types, &m, &err) == EMBER_OK && m == n);
        free(types);
        const char *const *merges;
        CHECK((ember_gguf_get_strs(f, "tokenizer.ggml.merges", &merges, NULL, &m, NULL) == EMBER_OK) ==
              vocab[i].merges);
        if (vocab[i].merges) CHECK(m > 1000 && strchr(merges[0], ' ') != NULL);
        float *sc = NULL;
        CHECK((ember_gguf_get_f32s(f, "tokenizer.ggml.scores", &sc, &m, NULL) == EMBER_OK) == vocab[i].scores);
        if (sc) CHECK(m == n);
        free(sc);
        ember_gguf_free(f);
    }
    /* a few values named in the README / the files */
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-phi-3.gguf", dir);
    ember_gguf *f;
    ember_error err;
    if (ember_gguf_open(path, &f, &err) == EMBER_OK) {
        const char *tmpl;
        size_t len = 0;
        bool add_bos = false;
        float base = 0;
        CHECK(ember_gguf_get_str(f, "tokenizer.chat_template", &tmpl, &len, &err) == EMBER_OK && len > 100 &&
              strstr(tmpl, "messages") != NULL);
        CHECK(ember_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, &err) == EMBER_OK && add_bos);
        CHECK(ember_gguf_get_f32(f, "phi3.rope.freq_base", &base, &err) == EMBER_OK && base == 10000.0f);
        check_u32(f, "tokenizer.ggml.eos_token_id", 32000);
        ember_gguf_free(f);
    }
}

int main(void) {
    test_base();
    test_corrupt();
    test_special_files();
    test_mutations();
    const char *dir = shared_dir();
    shared_require("testdata/models/stories260K");
    shared_require("testdata/models/llama-2-tiny-random");
    shared_require("testdata/tokenizers/llama.cpp-vocab");
    test_stories(dir);
    test_tiny_llama(dir);
    test_vocab_files(dir);
    return test_done();
}
