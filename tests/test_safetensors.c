/*
 * test_safetensors.c - the safetensors reader accepts what the writer
 * makes and rejects every malformed header with an error naming the file,
 * including every truncation of a valid file. Also the sharded weight store.
 */
#include <unistd.h>

#include "core/mapfile.h"
#include "formats/safetensors.h"
#include "formats/weights.h"
#include "test.h"

/* Builds a safetensors image from a header and data size (zero data). */
static unsigned char *image(const char *hdr, size_t data, size_t *size) {
    size_t h = strlen(hdr);
    *size = 8 + h + data;
    unsigned char *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    return b;
}

static void expect_bad(const char *hdr, size_t data, const char *needle) {
    size_t size;
    unsigned char *b = image(hdr, data, &size);
    ember_st_file *f = NULL;
    ember_error err = {0};
    int rc = ember_st_parse("bad.safetensors", b, size, &f, &err);
    CHECKF(rc == EMBER_ERR_FORMAT, "accepted: %s", hdr);
    CHECKF(strstr(err.msg, "bad.safetensors") != NULL, "message does not name the file: %s", err.msg);
    CHECKF(!needle || strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    CHECK(f == NULL);
    free(b);
}

static int fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)user;
    (void)err;
    for (size_t i = 0; i < n; i++) ((float *)dst)[i] = (float)(index * 1000 + (int)(first + i));
    return EMBER_OK;
}

int main(void) {
    /* a good header */
    {
        size_t size;
        unsigned char *b = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[32,32]},"
                                 "\"__metadata__\":{\"format\":\"pt\"}}",
                                 32, &size);
        ember_st_file *f;
        ember_error err = {0};
        CHECKF(ember_st_parse("ok.safetensors", b, size, &f, &err) == EMBER_OK, "%s", err.msg);
        CHECK(f->n_tensors == 3);
        const ember_st_tensor *t = ember_st_find(f, "b");
        CHECK(t && t->dtype == EMBER_BF16 && t->nbytes == 8 && t->shape[0] == 4);
        CHECK(ember_st_find(f, "zz") == NULL);
        ember_st_free(f);
        /* every truncation is a clean error */
        for (size_t cut = 0; cut < size; cut++) {
            f = NULL;
            int rc = ember_st_parse("cut.safetensors", b, cut, &f, &err);
            CHECKF(rc != EMBER_OK && f == NULL, "truncated to %zu accepted", cut);
        }
        free(b);
    }
    { /* an empty tensor table is valid */
        size_t size;
        unsigned char *b = image("{}", 0, &size);
        ember_st_file *f = NULL;
        ember_error err = {0};
        CHECK(ember_st_parse("empty.safetensors", b, size, &f, &err) == EMBER_OK && f->n_tensors == 0);
        ember_st_free(f);
        free(b);
    }
    expect_bad("[1,2]", 0, "not a JSON object");
    expect_bad("{\"a\":", 0, "not valid JSON");
    expect_bad("{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "needs 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,400]}}", 4, "outside");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 8, "invalid data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "two integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "not valid JSON"); /* duplicate key */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
               "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions");
    expect_bad("{\"__metadata__\":{\"x\":1}}", 0, "not a string");
    expect_bad("{\"a\":7}", 0, "not a JSON object");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    /* header length field larger than the file, and absurd */
    {
        unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
        ember_st_file *f;
        ember_error err = {0};
        CHECK(ember_st_parse("x", b, sizeof b, &f, &err) == EMBER_ERR_FORMAT);
        unsigned char c[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        CHECK(ember_st_parse("x", c, sizeof c, &f, &err) == EMBER_ERR_FORMAT && strstr(err.msg, "out of range"));
    }
    /* writer -> reader round trip on disk, and a sharded store */
    {
        char dir[512], p1[600], p2[600], idx[600];
        snprintf(dir, sizeof dir, "%s/st_shards", EMBER_TEST_TMP);
        mkdir(dir, 0777);
        snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
        snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
        ember_st_out a[2] = {{"w.a", EMBER_F32, 2, {3, 5}}, {"w.b", EMBER_F32, 1, {7}}};
        ember_st_out b[1] = {{"w.c", EMBER_F32, 1, {2}}};
        ember_error err = {0};
        CHECK(ember_st_write(p1, a, 2, fill, NULL, &err) == EMBER_OK);
        CHECK(ember_st_write(p2, b, 1, fill, NULL, &err) == EMBER_OK);
        FILE *fp = fopen(idx, "w");
        fprintf(fp, "{\"metadata\":{},\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                    "\"w.b\":\"model-00001-of-00002.safetensors\",\"w.c\":\"model-00002-of-00002.safetensors\"}}");
        fclose(fp);
        ember_weights *w;
        CHECKF(ember_weights_open(dir, &w, &err) == EMBER_OK, "%s", err.msg);
        const char *file;
        const ember_st_tensor *t = ember_weights_find(w, "w.c", &file);
        CHECK(t && strstr(file, "00002") && t->nbytes == 8);
        float v;
        memcpy(&v, t->data + 4, 4);
        CHECK(v == 1.0f);
        t = ember_weights_find(w, "w.a", NULL);
        memcpy(&v, t->data + 4 * 14, 4);
        CHECK(v == 14.0f);
        ember_weights_free(w);
        /* index naming a tensor its shard lacks, and a path outside the directory */
        fp = fopen(idx, "w");
        fprintf(fp, "{\"weight_map\":{\"w.z\":\"model-00001-of-00002.safetensors\"}}");
        fclose(fp);
        CHECK(ember_weights_open(dir, &w, &err) == EMBER_ERR_FORMAT && strstr(err.msg, "w.z"));
        fp = fopen(idx, "w");
        fprintf(fp, "{\"weight_map\":{\"w.a\":\"../../etc/passwd\"}}");
        fclose(fp);
        CHECK(ember_weights_open(dir, &w, &err) == EMBER_ERR_FORMAT);
        fp = fopen(idx, "w");
        fprintf(fp, "{\"weight_map\":{\"w.a\":\"missing.safetensors\"}}");
        fclose(fp);
        CHECK(ember_weights_open(dir, &w, &err) == EMBER_ERR_IO && strstr(err.msg, "missing.safetensors"));
        unlink(idx);
        unlink(p1);
        unlink(p2);
        CHECK(ember_weights_open(dir, &w, &err) == EMBER_ERR_IO && strstr(err.msg, "no model.safetensors"));
    }
    return test_done();
}
