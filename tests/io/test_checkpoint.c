/* Checkpoints: bitwise round trip, layout, every corruption case, atomic
 * save that never clobbers an earlier file; the JSON reader underneath. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/json.h"
#include "testutil.h"

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clgrad-ck-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A random checkpoint: every dtype, scalar and empty tensors, awkward
 * metadata strings. */
static clg_ckpt *random_ckpt(clg_rng *r, int ntensors)
{
    clg_err err = {0};
    clg_ckpt *ck = NULL;
    ck_assert_int_eq(clg_ckpt_create(&err, &ck), CLG_OK);
    for (int i = 0; i < ntensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "layer%d.%s", i, (i % 3 == 0) ? "weight" : (i % 3 == 1) ? "bias" : "m \"q\"");
        clg_ckpt_dtype dt = (clg_ckpt_dtype)(i % 5);
        int ndim = (int)(clg_rng_u32(r) % 5);
        int64_t shape[8];
        for (int d = 0; d < ndim; d++)
            shape[d] = 1 + clg_rng_u32(r) % 6;
        if (i == 3 && ndim > 0)
            shape[0] = 0; /* an empty tensor */
        void *p = NULL;
        ck_assert_int_eq(clg_ckpt_add(&err, ck, name, dt, ndim, shape, NULL, &p), CLG_OK);
        const clg_ckpt_tensor *t = &ck->t[ck->nt - 1];
        uint8_t *b = p;
        for (size_t k = 0; k < t->nbytes; k++)
            b[k] = (uint8_t)clg_rng_u32(r);
        if (dt == CLG_CKPT_F32) /* real floats, incl. denormals/negatives */
            for (size_t k = 0; k < t->numel; k++)
                ((float *)p)[k] = clg_rng_normal(r) * ldexpf(1.0f, (int)(clg_rng_u32(r) % 200) - 140);
    }
    ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, CLG_CKPT_KEY_MODEL,
                                       "[net]\nwidth = 28 # \"quoted\" \\ back\\slash\n\t\x01 caf\xc3\xa9\n"),
                     CLG_OK);
    ck_assert_int_eq(clg_ckpt_set_meta_i64(&err, ck, CLG_CKPT_KEY_STEP, (int64_t)(clg_rng_u32(r)) << 20), CLG_OK);
    ck_assert_int_eq(clg_ckpt_set_meta_i64(&err, ck, CLG_CKPT_KEY_EPOCH, -(int64_t)(clg_rng_u32(r) % 100)), CLG_OK);
    ck_assert_int_eq(clg_ckpt_set_meta_f64(&err, ck, "optimizer.lr", clg_rng_uniform(r) * 1e-3 / 3.0), CLG_OK);
    clg_rng st = *r;
    clg_rng_u32(&st);
    ck_assert_int_eq(clg_ckpt_set_rng(&err, ck, CLG_CKPT_KEY_RNG, &st), CLG_OK);
    ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, CLG_CKPT_KEY_OPTIMIZER, "adam"), CLG_OK);
    return ck;
}

static void assert_same(const clg_ckpt *a, const clg_ckpt *b)
{
    ck_assert_int_eq(a->nt, b->nt);
    for (int i = 0; i < a->nt; i++) {
        const clg_ckpt_tensor *x = &a->t[i], *y = clg_ckpt_find(b, a->t[i].name);
        ck_assert_msg(y != NULL, "tensor '%s' lost", x->name);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++)
            ck_assert(x->shape[d] == y->shape[d]);
        ck_assert_uint_eq(x->nbytes, y->nbytes);
        ck_assert_msg(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0, "tensor '%s' differs", x->name);
    }
    for (int i = 0; i < a->nmeta; i++) {
        const char *v = clg_ckpt_get_meta(b, a->meta[i].key);
        ck_assert_msg(v && strcmp(v, a->meta[i].value) == 0, "metadata '%s' differs", a->meta[i].key);
    }
    ck_assert_int_eq(a->nmeta, b->nmeta);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    char *b;
    clg_err err;
    ck_assert_int_eq(clg_file_read(&err, path, &b, len), CLG_OK);
    return (uint8_t *)b;
}

START_TEST(test_roundtrip)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 31);
    clg_ckpt *ck = random_ckpt(&r, 5 + (int)(clg_rng_u32(&r) % 10));
    char path[128];
    snprintf(path, sizeof path, "%s/a.safetensors", tmpdir);
    clg_err err = {0};
    ck_assert_int_eq(clg_ckpt_save(&err, ck, path), CLG_OK);
    clg_ckpt *in = NULL;
    ck_assert_msg(clg_ckpt_load(&err, path, &in) == CLG_OK, "%s", err.msg);
    assert_same(ck, in);
    /* typed metadata reads back exactly */
    int64_t step, epoch;
    double lr0, lr1;
    clg_rng r0, r1;
    ck_assert_int_eq(clg_ckpt_get_meta_i64(&err, in, CLG_CKPT_KEY_STEP, &step), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_i64(&err, in, CLG_CKPT_KEY_EPOCH, &epoch), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_f64(&err, ck, "optimizer.lr", &lr0), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_f64(&err, in, "optimizer.lr", &lr1), CLG_OK);
    ck_assert(memcmp(&lr0, &lr1, sizeof lr0) == 0);
    ck_assert_int_eq(clg_ckpt_get_rng(&err, ck, CLG_CKPT_KEY_RNG, &r0), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_rng(&err, in, CLG_CKPT_KEY_RNG, &r1), CLG_OK);
    ck_assert(r0.state == r1.state && r0.inc == r1.inc);
    ck_assert_uint_eq(clg_rng_u32(&r0), clg_rng_u32(&r1));
    ck_assert_str_eq(clg_ckpt_get_meta(in, CLG_CKPT_KEY_FORMAT), CLG_CKPT_FORMAT);
    /* saving what was loaded reproduces the file byte for byte */
    size_t l1, l2;
    uint8_t *f1 = slurp(path, &l1);
    char path2[128];
    snprintf(path2, sizeof path2, "%s/b.safetensors", tmpdir);
    ck_assert_int_eq(clg_ckpt_save(&err, in, path2), CLG_OK);
    uint8_t *f2 = slurp(path2, &l2);
    ck_assert_uint_eq(l1, l2);
    ck_assert(memcmp(f1, f2, l1) == 0);
    /* layout: u64 LE header length, 8-aligned JSON, offsets relative to the data */
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)f1[i] << (8 * i);
    ck_assert(hl % 8 == 0 && hl + 8 <= l1 && f1[8] == '{');
    clg_json *j = NULL;
    ck_assert_int_eq(clg_json_parse(&err, (const char *)f1 + 8, hl, "hdr", &j), CLG_OK);
    size_t data_total = 0;
    for (int i = 0; i < ck->nt; i++) {
        const clg_json *e = clg_json_get(j, ck->t[i].name);
        ck_assert_ptr_nonnull(e);
        uint64_t b, en;
        const clg_json *o = clg_json_get(e, "data_offsets");
        ck_assert(clg_json_u64(&o->items[0], &b) && clg_json_u64(&o->items[1], &en));
        ck_assert(en - b == ck->t[i].nbytes);
        ck_assert(ck->t[i].nbytes == 0 || memcmp(f1 + 8 + hl + b, ck->t[i].data, ck->t[i].nbytes) == 0);
        ck_assert_str_eq(clg_json_get(e, "dtype")->str, clg_ckpt_dtype_name(ck->t[i].dtype));
        data_total += ck->t[i].nbytes;
    }
    ck_assert_uint_eq(8 + hl + data_total, l1);
    /* typed f32 read: shape checks name the tensor and both shapes */
    clg_ckpt *c2 = NULL;
    ck_assert_int_eq(clg_ckpt_create(&err, &c2), CLG_OK);
    int shp[4] = {2 + (int)(clg_rng_u32(&r) % 4), 3, 1, 2};
    size_t ne = (size_t)shp[0] * 6;
    float *w = malloc(sizeof(float) * ne), *w2 = malloc(sizeof(float) * ne);
    tu_fill(w, ne, -1, 1, &r);
    ck_assert_int_eq(clg_ckpt_add_f32(&err, c2, "conv1.weight", 4, shp, w), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_f32(&err, c2, "conv1.weight", 4, shp, ne, w2), CLG_OK);
    ck_assert(memcmp(w, w2, sizeof(float) * ne) == 0);
    int other[4] = {shp[0], 1, 3, 2};
    ck_assert_int_eq(clg_ckpt_get_f32(&err, c2, "conv1.weight", 4, other, ne, w2), CLG_ERR_SHAPE);
    ck_assert_msg(strstr(err.msg, "'conv1.weight'") && strstr(err.msg, ",3,1,2]") && strstr(err.msg, ",1,3,2]"),
                  "%s", err.msg);
    ck_assert_int_eq(clg_ckpt_get_f32(&err, c2, "conv1.weight", 0, NULL, ne + 1, w2), CLG_ERR_SHAPE);
    ck_assert_int_eq(clg_ckpt_get_f32(&err, c2, "conv2.weight", 0, NULL, ne, w2), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "'conv2.weight'"), "%s", err.msg);
    ck_assert_int_eq(clg_ckpt_add_f32(&err, c2, "conv1.weight", 4, shp, w), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_ckpt_get_meta_i64(&err, c2, "step", &step), CLG_ERR_FORMAT);
    ck_assert_int_eq(clg_ckpt_set_meta(&err, c2, "step", "12x"), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_i64(&err, c2, "step", &step), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "'12x'"), "%s", err.msg);
    ck_assert_int_eq(clg_ckpt_set_meta(&err, c2, "rng", "0123:zz"), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_rng(&err, c2, "rng", &r1), CLG_ERR_FORMAT);
    free(w);
    free(w2);
    clg_ckpt_free(c2);
    clg_json_free(j);
    free(f1);
    free(f2);
    clg_ckpt_free(ck);
    clg_ckpt_free(in);
    rm_rf(tmpdir);
}
END_TEST

static void expect_bad(const void *buf, size_t len, clg_status want, const char *n1, const char *n2)
{
    clg_err err = {0};
    clg_ckpt *ck = (clg_ckpt *)0x1;
    clg_status st = clg_ckpt_parse(&err, buf, len, "x.safetensors", &ck);
    ck_assert_msg(st == want, "got %s (%s), want %s", clg_status_name(st), err.msg, clg_status_name(want));
    ck_assert_ptr_null(ck);
    ck_assert_msg(strstr(err.msg, "x.safetensors"), "message '%s' does not name the file", err.msg);
    ck_assert_msg(strstr(err.msg, n1), "message '%s' lacks '%s'", err.msg, n1);
    if (n2)
        ck_assert_msg(strstr(err.msg, n2), "message '%s' lacks '%s'", err.msg, n2);
}

/* File from a header text and data bytes (header length as given). */
static uint8_t *craft(const char *hdr, const void *data, size_t dlen, size_t *len)
{
    size_t hl = strlen(hdr);
    uint8_t *b = malloc(8 + hl + dlen + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    if (dlen)
        memcpy(b + 8 + hl, data, dlen);
    *len = 8 + hl + dlen;
    return b;
}

static void expect_bad_hdr(const char *hdr, size_t dlen, clg_status want, const char *n1, const char *n2)
{
    uint8_t data[64] = {0};
    size_t len;
    uint8_t *b = craft(hdr, data, dlen, &len);
    expect_bad(b, len, want, n1, n2);
    free(b);
}

START_TEST(test_corruption)
{
    clg_rng r;
    tu_rng(&r, 32);
    clg_ckpt *ck = random_ckpt(&r, 6);
    clg_err err = {0};
    void *vbuf;
    size_t len;
    ck_assert_int_eq(clg_ckpt_serialize(&err, ck, &vbuf, &len), CLG_OK);
    uint8_t *buf = vbuf;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)buf[i] << (8 * i);
    uint8_t *m = malloc(len);

    /* flip one random bit in each non-empty tensor: CRC error naming it */
    size_t off = 8 + hl;
    for (int i = 0; i < ck->nt; i++) {
        const clg_ckpt_tensor *t = &ck->t[i];
        if (t->nbytes) {
            memcpy(m, buf, len);
            m[off + clg_rng_u32(&r) % t->nbytes] ^= (uint8_t)(1u << (clg_rng_u32(&r) % 8));
            char needle[96];
            snprintf(needle, sizeof needle, "tensor '%s'", t->name);
            expect_bad(m, len, CLG_ERR_CHECKSUM, needle, "CRC");
        }
        off += t->nbytes;
    }
    /* truncation: before the length, inside the header, inside the data */
    expect_bad(buf, clg_rng_u32(&r) % 8, CLG_ERR_FORMAT, "truncated", NULL);
    expect_bad(buf, 8 + clg_rng_u32(&r) % hl, CLG_ERR_FORMAT, "truncated", NULL);
    if (len > 8 + hl)
        expect_bad(buf, 8 + hl + clg_rng_u32(&r) % (len - 8 - hl), CLG_ERR_FORMAT, "out of range", NULL);
    /* header length huge / beyond the file */
    memcpy(m, buf, len);
    m[5] = 0x10; /* 2^44 + hl */
    expect_bad(m, len, CLG_ERR_FORMAT, "limit", NULL);
    memcpy(m, buf, len);
    m[3] = 0x01; /* 16 MiB + hl: under the cap, beyond the file */
    expect_bad(m, len, CLG_ERR_FORMAT, "truncated", NULL);
    memset(m, 0xff, 8);
    expect_bad(m, len, CLG_ERR_FORMAT, "limit", NULL);
    /* garbage in the header's JSON */
    memcpy(m, buf, len);
    m[9] = (uint8_t)"}],:"[clg_rng_u32(&r) % 4];
    expect_bad(m, len, CLG_ERR_FORMAT, "JSON", NULL);

    /* crafted headers */
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1000]}}", 8, CLG_ERR_FORMAT,
                   "tensor 'a'", "out of range");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, CLG_ERR_FORMAT, "overlaps", "'b'");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                   20, CLG_ERR_FORMAT, "gap", "'b'");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, CLG_ERR_FORMAT,
                   "after the last tensor", NULL);
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}", 8,
                   CLG_ERR_FORMAT, "tensor 'a'", "overflow");
    /* element count fits in 64 bits, the byte count does not */
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                   CLG_ERR_FORMAT, "tensor 'a'", "overflow");
    expect_bad_hdr("{\"a\":{\"dtype\":\"I64\",\"shape\":[2147483648,2147483648,2],\"data_offsets\":[0,0]}}", 0,
                   CLG_ERR_FORMAT, "tensor 'a'", "overflow");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
                   CLG_ERR_FORMAT, "tensor 'a'", "shape entry 0");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8, CLG_ERR_FORMAT,
                   "tensor 'a'", "shape entry 0");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, CLG_ERR_FORMAT,
                   "tensor 'a'", "needs 12");
    expect_bad_hdr("{\"a\":{\"dtype\":\"Q8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3, CLG_ERR_FORMAT,
                   "tensor 'a'", "dtype 'Q8'");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, CLG_ERR_FORMAT,
                   "tensor 'a'", "out of range");
    expect_bad_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, CLG_ERR_FORMAT, "tensor 'a'", "data_offsets");
    expect_bad_hdr("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, CLG_ERR_FORMAT, "tensor 'a'", "dtype");
    expect_bad_hdr("{\"a\":[1,2]}", 0, CLG_ERR_FORMAT, "tensor 'a'", "object");
    expect_bad_hdr("[1,2]", 0, CLG_ERR_FORMAT, "array", NULL);
    expect_bad_hdr("{\"a\":", 0, CLG_ERR_FORMAT, "JSON error at byte", NULL);
    expect_bad_hdr("{\"__metadata__\":{\"k\":1}}", 0, CLG_ERR_FORMAT, "metadata 'k'", NULL);
    expect_bad_hdr("{\"__metadata__\":{\"format\":\"clgrad-ckpt-1\"},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                   2, CLG_ERR_FORMAT, "tensor 'a'", "no CRC");
    expect_bad_hdr("{\"__metadata__\":{\"crc32.zz\":\"00000000\"}}", 0, CLG_ERR_FORMAT, "crc32.zz", NULL);
    expect_bad_hdr("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                   4, CLG_ERR_FORMAT, "'a' twice", NULL);
    /* a file without the format key (plain safetensors, or a clgrad file
     * whose key was deleted) is refused: CRCs would not be enforced */
    expect_bad_hdr("{\"x\":{\"dtype\":\"U8\",\"shape\":[2,3],\"data_offsets\":[0,6]}}", 6, CLG_ERR_FORMAT,
                   "no 'format'", NULL);
    /* an old-format (clgrad-ckpt-1) file with its tensor CRCs still loads */
    {
        size_t l2;
        uint8_t d[6];
        for (int i = 0; i < 6; i++)
            d[i] = (uint8_t)clg_rng_u32(&r);
        char hdr[256];
        snprintf(hdr, sizeof hdr,
                 "{\"__metadata__\":{\"format\":\"clgrad-ckpt-1\",\"crc32.x\":\"%08x\"},"
                 "\"x\":{\"dtype\":\"U8\",\"shape\":[2,3],\"data_offsets\":[0,6]}}",
                 (unsigned)clg_crc32(0, d, 6));
        uint8_t *b = craft(hdr, d, 6, &l2);
        clg_ckpt *c = NULL;
        ck_assert_msg(clg_ckpt_parse(&err, b, l2, "v1", &c) == CLG_OK, "%s", err.msg);
        ck_assert(memcmp(clg_ckpt_find(c, "x")->data, d, 6) == 0);
        clg_ckpt_free(c);
        free(b);
    }
    /* random byte damage anywhere never crashes and is always caught */
    for (int it = 0; it < 300; it++) {
        memcpy(m, buf, len);
        size_t pos = clg_rng_u32(&r) % len;
        uint8_t old = m[pos];
        m[pos] = (uint8_t)clg_rng_u32(&r);
        size_t cut = (clg_rng_u32(&r) % 4 == 0) ? clg_rng_u32(&r) % len : len;
        clg_ckpt *c = NULL;
        clg_status st = clg_ckpt_parse(&err, m, cut, "fuzz", &c);
        if (st == CLG_OK) {
            /* only a byte replaced by itself may pass: the header checksum
             * covers every header byte, padding included */
            ck_assert_msg(cut == len && m[pos] == old,
                          "damage at %zu (cut %zu) accepted", pos, cut);
            clg_ckpt_free(c);
        } else {
            ck_assert_ptr_null(c);
        }
    }
    free(m);
    free(buf);
    clg_ckpt_free(ck);
}
END_TEST

/* Replaces the first `from` in the header of buf with `to` (same length). */
static void patch(uint8_t *buf, size_t len, const char *from, const char *to)
{
    size_t n = strlen(from);
    ck_assert_uint_eq(n, strlen(to));
    for (size_t i = 8; i + n <= len; i++)
        if (memcmp(buf + i, from, n) == 0) {
            memcpy(buf + i, to, n);
            return;
        }
    ck_abort_msg("'%s' not in the file", from);
}

/* Editing any metadata value, deleting the format key or the header
 * checksum, or an unknown format is caught. */
/* Each field check of a tensor entry (and of the metadata) reports its
 * own message, word for word: the table of field checks in clg_ckpt_parse
 * keeps the messages it replaced. */
START_TEST(test_field_messages)
{
    static const struct {
        const char *hdr;
        size_t dlen;
        const char *msg;
    } cases[] = {
        {"{\"a\":{\"dtype\":3,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "checkpoint 'x.safetensors': tensor 'a': missing or non-string \"dtype\""},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
         "checkpoint 'x.safetensors': tensor 'a': unsupported dtype 'F64' (F32, F16, I32, I64, U8)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,8]}}", 8,
         "checkpoint 'x.safetensors': tensor 'a': missing or non-array \"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
         "checkpoint 'x.safetensors': tensor 'a': missing or non-array \"shape\""},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         "checkpoint 'x.safetensors': tensor 'a': 9 dimensions (at most 8)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,2.5],\"data_offsets\":[0,2]}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': shape entry 1 is not a non-negative 64-bit integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,2]}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': shape entry 0 is not a non-negative 64-bit integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': \"data_offsets\" must be [begin, end] of non-negative integers"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":\"0,2\"}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': \"data_offsets\" must be [begin, end] of non-negative integers"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,-2]}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': \"data_offsets\" must be [begin, end] of non-negative integers"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,4]}}", 2,
         "checkpoint 'x.safetensors': tensor 'a': data_offsets [1, 4] out of range (data section is 2 bytes)"},
        {"{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
         "checkpoint 'x.safetensors': tensor 'a': data_offsets span 4 bytes but shape x I32 needs 8"},
        {"{\"a\":true}", 0, "checkpoint 'x.safetensors': tensor 'a': entry is a boolean, expected an object"},
        {"{\"__metadata__\":[]}", 0, "checkpoint 'x.safetensors': __metadata__ is a array, expected an object"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
         "checkpoint 'x.safetensors': metadata key 'k' appears twice"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0,
         "checkpoint 'x.safetensors': header has key '__metadata__' twice"},
        {"{\"__metadata__\":{\"format\":\"clgrad-ckpt-9\"}}", 0,
         "checkpoint 'x.safetensors' has format 'clgrad-ckpt-9'; this clgrad reads clgrad-ckpt-2 and clgrad-ckpt-1"},
    };
    for (size_t i = 0; i < CLG_ARRAY_LEN(cases); i++) {
        uint8_t data[16] = {0};
        size_t len;
        uint8_t *b = craft(cases[i].hdr, data, cases[i].dlen, &len);
        clg_err err = {0};
        clg_ckpt *ck = NULL;
        clg_status st = clg_ckpt_parse(&err, b, len, "x.safetensors", &ck);
        ck_assert_msg(st != CLG_OK && ck == NULL, "accepted %s", cases[i].hdr);
        ck_assert_msg(strcmp(err.msg, cases[i].msg) == 0, "%s:\n got  %s\n want %s", cases[i].hdr, err.msg,
                      cases[i].msg);
        free(b);
    }
}
END_TEST

START_TEST(test_header_protection)
{
    clg_rng r;
    tu_rng(&r, 34);
    clg_ckpt *ck = random_ckpt(&r, 3);
    clg_err err = {0};
    char std[32];
    snprintf(std, sizeof std, "0.%06u", 100000 + clg_rng_u32(&r) % 800000);
    ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, "norm.std.0", std), CLG_OK);
    void *vbuf;
    size_t len;
    ck_assert_int_eq(clg_ckpt_serialize(&err, ck, &vbuf, &len), CLG_OK);
    uint8_t *buf = vbuf, *m = malloc(len);
    char from[64], to[64];
    /* a value edited in place (same length): header checksum error */
    memcpy(m, buf, len);
    snprintf(from, sizeof from, "\"norm.std.0\":\"%s\"", std);
    snprintf(to, sizeof to, "\"norm.std.0\":\"%s\"", "0.000000");
    patch(m, len, from, to);
    expect_bad(m, len, CLG_ERR_CHECKSUM, "header", "edited");
    /* the format key blanked out (still valid JSON): refused */
    memcpy(m, buf, len);
    patch(m, len, ",\"format\":\"" CLG_CKPT_FORMAT "\"", "                         ");
    expect_bad(m, len, CLG_ERR_FORMAT, "no 'format'", NULL);
    /* unknown format */
    memcpy(m, buf, len);
    patch(m, len, CLG_CKPT_FORMAT, "clgrad-ckpt-9");
    expect_bad(m, len, CLG_ERR_UNSUPPORTED, "clgrad-ckpt-9", NULL);
    /* edited down to the old format: the checksum is still there and checked */
    memcpy(m, buf, len);
    patch(m, len, CLG_CKPT_FORMAT, CLG_CKPT_FORMAT_V1);
    expect_bad(m, len, CLG_ERR_CHECKSUM, "header", NULL);
    /* header checksum renamed away in the current format: refused */
    memcpy(m, buf, len);
    patch(m, len, "\"header.crc32\"", "\"header.crc33\"");
    expect_bad(m, len, CLG_ERR_FORMAT, "header.crc32", NULL);
    /* the unedited file loads */
    clg_ckpt *in = NULL;
    ck_assert_msg(clg_ckpt_parse(&err, buf, len, "ok", &in) == CLG_OK, "%s", err.msg);
    ck_assert_str_eq(clg_ckpt_get_meta(in, "norm.std.0"), std);
    clg_ckpt_free(in);
    free(m);
    free(buf);
    clg_ckpt_free(ck);
}
END_TEST

/* Range-checked getters: inside the range, at its ends, just outside,
 * non-finite and malformed values. */
START_TEST(test_meta_ranges)
{
    clg_rng r;
    tu_rng(&r, 35);
    clg_ckpt *ck = NULL;
    clg_err err = {0};
    ck_assert_int_eq(clg_ckpt_create(&err, &ck), CLG_OK);
    int64_t lo = -(int64_t)(clg_rng_u32(&r) % 1000), hi = lo + 1 + (int64_t)(clg_rng_u32(&r) % 100000), v = 0;
    int64_t ok_vals[] = {lo, hi, lo + (hi - lo) / 2};
    for (size_t i = 0; i < CLG_ARRAY_LEN(ok_vals); i++) {
        ck_assert_int_eq(clg_ckpt_set_meta_i64(&err, ck, "k", ok_vals[i]), CLG_OK);
        ck_assert_msg(clg_ckpt_get_meta_i64_range(&err, ck, "k", lo, hi, &v) == CLG_OK, "%s", err.msg);
        ck_assert(v == ok_vals[i]);
    }
    int64_t bad_vals[] = {lo - 1, hi + 1, INT64_MIN, INT64_MAX};
    for (size_t i = 0; i < CLG_ARRAY_LEN(bad_vals); i++) {
        ck_assert_int_eq(clg_ckpt_set_meta_i64(&err, ck, "k", bad_vals[i]), CLG_OK);
        v = 12345;
        ck_assert_int_eq(clg_ckpt_get_meta_i64_range(&err, ck, "k", lo, hi, &v), CLG_ERR_FORMAT);
        ck_assert(v == 12345);
        ck_assert_msg(strstr(err.msg, "'k'") && strstr(err.msg, "outside"), "%s", err.msg);
    }
    /* 2^32 + 1 must not wrap into a small epoch */
    ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, "epoch", "4294967297"), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_i64_range(&err, ck, "epoch", 0, INT32_MAX, &v), CLG_ERR_FORMAT);
    ck_assert_int_eq(clg_ckpt_get_meta_i64_range(&err, ck, "missing", 0, 1, &v), CLG_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing"));
    double d = 0, x = 0.5 + clg_rng_uniform(&r);
    ck_assert_int_eq(clg_ckpt_set_meta_f64(&err, ck, "f", x), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_f64_range(&err, ck, "f", 0.5, 1.5, &d), CLG_OK);
    ck_assert(d == x);
    const char *bad_f[] = {"nan", "NaN", "inf", "-inf", "0", "-1", "1e6", "1.5000001", "x", ""};
    for (size_t i = 0; i < CLG_ARRAY_LEN(bad_f); i++) {
        ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, "f", bad_f[i]), CLG_OK);
        d = 7;
        ck_assert_msg(clg_ckpt_get_meta_f64_range(&err, ck, "f", 0.5, 1.5, &d) == CLG_ERR_FORMAT, "'%s' accepted",
                      bad_f[i]);
        ck_assert(d == 7);
        ck_assert_ptr_nonnull(strstr(err.msg, "'f'"));
    }
    /* strictly positive: lo = DBL_MIN refuses 0 */
    ck_assert_int_eq(clg_ckpt_set_meta(&err, ck, "std", "0"), CLG_OK);
    ck_assert_int_eq(clg_ckpt_get_meta_f64_range(&err, ck, "std", DBL_MIN, 1e3, &d), CLG_ERR_FORMAT);
    clg_ckpt_free(ck);
}
END_TEST

/* Header with n tensor entries (or n metadata keys), all zero-sized, no
 * format: the parser must walk all of it before refusing. */
static uint8_t *many_entries(int n, int as_meta, size_t *len)
{
    clg_sbuf h = {0};
    clg_sbuf_printf(&h, "{\"__metadata__\":{");
    for (int i = 0; as_meta && i < n; i++)
        clg_sbuf_printf(&h, "%s\"key.%d\":\"%d\"", i ? "," : "", i, i);
    clg_sbuf_printf(&h, "}");
    for (int i = 0; !as_meta && i < n; i++)
        clg_sbuf_printf(&h, ",\"tensor.%d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}", i);
    clg_sbuf_printf(&h, "}");
    ck_assert(!h.oom);
    uint8_t *b = craft(h.data, NULL, 0, len);
    clg_sbuf_free(&h);
    return b;
}

/* Large headers are parsed in linear time and the counts are capped. */
START_TEST(test_header_scaling)
{
    struct {
        int n, as_meta;
        const char *why;
    } cases[] = {
        {CLG_CKPT_MAX_TENSORS - 1 - (int)(rand() % 100), 0, "no 'format'"},
        {CLG_CKPT_MAX_TENSORS + 1 + (int)(rand() % 100000), 0, "tensors allowed"},
        {CLG_CKPT_MAX_META - 1 - (int)(rand() % 100), 1, "no 'format'"},
        {CLG_CKPT_MAX_META + 1 + (int)(rand() % 100000), 1, "metadata entries"},
    };
    for (size_t i = 0; i < CLG_ARRAY_LEN(cases); i++) {
        size_t len;
        uint8_t *b = many_entries(cases[i].n, cases[i].as_meta, &len);
        double t0 = clg_now_sec();
        expect_bad(b, len, CLG_ERR_FORMAT, cases[i].why, NULL);
        double dt = clg_now_sec() - t0;
        /* linear: ~0.1 s here; the quadratic parser took > 8 s for 40k entries */
        ck_assert_msg(dt < 3.0, "%d %s took %.1f s", cases[i].n, cases[i].as_meta ? "metadata keys" : "tensors", dt);
        free(b);
    }
}
END_TEST

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

START_TEST(test_failed_save_keeps_old)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 33);
    clg_ckpt *old = random_ckpt(&r, 4);
    char path[128];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmpdir);
    clg_err err = {0};
    ck_assert_int_eq(clg_ckpt_save(&err, old, path), CLG_OK);
    size_t l0;
    uint8_t *before = slurp(path, &l0);
    /* a bigger checkpoint that cannot be written */
    clg_ckpt *big = random_ckpt(&r, 6);
    int64_t shape[1] = {1 << 16};
    ck_assert_int_eq(clg_ckpt_add(&err, big, "big", CLG_CKPT_F32, 1, shape, NULL, NULL), CLG_OK);
    if (geteuid() != 0) {
        /* read-only directory: no temp file can be created */
        ck_assert_int_eq(chmod(tmpdir, 0555), 0);
        ck_assert_int_eq(clg_ckpt_save(&err, big, path), CLG_ERR_IO);
        ck_assert_msg(strstr(err.msg, path), "%s", err.msg);
        ck_assert_int_eq(chmod(tmpdir, 0755), 0);
    }
    /* file size limit: the write itself fails half way (works as root too) */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    struct rlimit small = {(rlim_t)(l0 + 100), rl.rlim_max};
    /* no ck_assert while the limit holds: Check writes its own records to a file */
    int lim = setrlimit(RLIMIT_FSIZE, &small);
    clg_status st = clg_ckpt_save(&err, big, path);
    setrlimit(RLIMIT_FSIZE, &rl);
    ck_assert_int_eq(lim, 0);
    ck_assert_int_eq(st, CLG_ERR_IO);
    ck_assert_msg(strstr(err.msg, path), "%s", err.msg);
    /* the earlier checkpoint is intact and loads; no temp file is left */
    size_t l1;
    uint8_t *after = slurp(path, &l1);
    ck_assert_uint_eq(l0, l1);
    ck_assert(memcmp(before, after, l0) == 0);
    clg_ckpt *in = NULL;
    ck_assert_int_eq(clg_ckpt_load(&err, path, &in), CLG_OK);
    assert_same(old, in);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    clg_ckpt_free(in);
    in = NULL;
    /* a save into a missing directory fails cleanly */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/nodir/ck.safetensors", tmpdir);
    ck_assert_int_eq(clg_ckpt_save(&err, old, bad), CLG_ERR_IO);
    ck_assert_int_eq(clg_ckpt_load(&err, bad, &in), CLG_ERR_NOT_FOUND);
    free(before);
    free(after);
    clg_ckpt_free(in);
    clg_ckpt_free(old);
    clg_ckpt_free(big);
    rm_rf(tmpdir);
}
END_TEST

/* ---- JSON reader ---- */

static void gen_json(clg_sbuf *b, clg_rng *r, int depth)
{
    unsigned k = clg_rng_u32(r) % (depth > 3 ? 4 : 6);
    switch (k) {
    case 0: clg_sbuf_printf(b, "null"); break;
    case 1: clg_sbuf_printf(b, "%s", clg_rng_u32(r) % 2 ? "true" : "false"); break;
    case 2: clg_sbuf_printf(b, "%.17g", (double)clg_rng_normal(r) * 1e6); break;
    case 3: {
        char s[16];
        int n = (int)(clg_rng_u32(r) % 15);
        for (int i = 0; i < n; i++)
            s[i] = (char)(1 + clg_rng_u32(r) % 126);
        s[n] = 0;
        clg_sbuf_json_str(b, s);
        break;
    }
    case 4: {
        int n = (int)(clg_rng_u32(r) % 4);
        clg_sbuf_printf(b, "[ ");
        for (int i = 0; i < n; i++) {
            if (i)
                clg_sbuf_printf(b, " ,\n");
            gen_json(b, r, depth + 1);
        }
        clg_sbuf_printf(b, "]");
        break;
    }
    default: {
        int n = (int)(clg_rng_u32(r) % 4);
        clg_sbuf_printf(b, "{");
        for (int i = 0; i < n; i++)
            clg_sbuf_printf(b, "%s\"k%d\" : ", i ? "," : "", i), gen_json(b, r, depth + 1);
        clg_sbuf_printf(b, "}");
    }
    }
}

/* Re-serializes a parsed tree the same way gen_json writes it (modulo
 * whitespace) to compare structure and values. */
static void dump_json(clg_sbuf *b, const clg_json *v)
{
    switch (v->type) {
    case CLG_JSON_NULL: clg_sbuf_printf(b, "null"); break;
    case CLG_JSON_BOOL: clg_sbuf_printf(b, v->boolean ? "true" : "false"); break;
    case CLG_JSON_NUM: clg_sbuf_printf(b, "%.17g", v->num); break;
    case CLG_JSON_STR: clg_sbuf_json_str(b, v->str); break;
    case CLG_JSON_ARR:
        clg_sbuf_printf(b, "[");
        for (int i = 0; i < v->n; i++) {
            if (i)
                clg_sbuf_printf(b, ",");
            dump_json(b, &v->items[i]);
        }
        clg_sbuf_printf(b, "]");
        break;
    case CLG_JSON_OBJ:
        clg_sbuf_printf(b, "{");
        for (int i = 0; i < v->n; i++) {
            clg_sbuf_printf(b, "%s", i ? "," : "");
            clg_sbuf_json_str(b, v->keys[i]);
            clg_sbuf_printf(b, ":");
            dump_json(b, &v->items[i]);
        }
        clg_sbuf_printf(b, "}");
        break;
    }
}

static void strip_ws(char *s)
{
    /* removes whitespace outside strings */
    char *d = s;
    int in = 0;
    for (char *p = s; *p; p++) {
        if (in) {
            *d++ = *p;
            if (*p == '\\' && p[1])
                *d++ = *++p;
            else if (*p == '"')
                in = 0;
        } else if (*p == '"') {
            in = 1;
            *d++ = *p;
        } else if (*p != ' ' && *p != '\n') {
            *d++ = *p;
        }
    }
    *d = 0;
}

START_TEST(test_json)
{
    clg_rng r;
    tu_rng(&r, 34);
    clg_err err = {0};
    for (int it = 0; it < 200; it++) {
        clg_sbuf a = {0}, b = {0};
        gen_json(&a, &r, 0);
        clg_json *j = NULL;
        ck_assert_msg(clg_json_parse(&err, a.data, a.len, "gen", &j) == CLG_OK, "%s: %s", a.data, err.msg);
        dump_json(&b, j);
        strip_ws(a.data);
        ck_assert_str_eq(a.data, b.data);
        clg_json_free(j);
        clg_sbuf_free(&a);
        clg_sbuf_free(&b);
    }
    /* escapes, surrogate pairs, exact 64-bit integers */
    const char *t = "{\"s\":\"a\\\"b\\\\c\\/\\n\\u00e9\\ud83d\\ude00\",\"n\":18446744073709551615,\"m\":-0.5e2,"
                    "\"o\":18446744073709551616}";
    clg_json *j = NULL;
    ck_assert_int_eq(clg_json_parse(&err, t, strlen(t), "t", &j), CLG_OK);
    ck_assert_str_eq(clg_json_get(j, "s")->str, "a\"b\\c/\n\xc3\xa9\xf0\x9f\x98\x80");
    uint64_t u;
    ck_assert(clg_json_u64(clg_json_get(j, "n"), &u) && u == UINT64_MAX);
    ck_assert(!clg_json_u64(clg_json_get(j, "o"), &u));
    ck_assert(!clg_json_u64(clg_json_get(j, "m"), &u));
    ck_assert(clg_json_get(j, "m")->num == -50.0);
    ck_assert_ptr_null(clg_json_get(j, "zz"));
    clg_json_free(j);
    /* errors with byte positions; deep nesting is refused, not a stack overflow */
    const char *bad[] = {"", "{", "{\"a\" 1}", "[1,]", "01", "1.", "\"\\x\"", "\"\\ud800\"", "tru", "{} x",
                         "\"a\nb\"", "[1 2]", "{1:2}", "-", "\"abc"};
    for (size_t i = 0; i < CLG_ARRAY_LEN(bad); i++) {
        ck_assert_msg(clg_json_parse(&err, bad[i], strlen(bad[i]), "bad", &j) == CLG_ERR_FORMAT, "accepted '%s'",
                      bad[i]);
        ck_assert_ptr_null(j);
        ck_assert_msg(strstr(err.msg, "bad: JSON error at byte"), "%s", err.msg);
    }
    char deep[400];
    memset(deep, '[', 300);
    deep[300] = 0;
    ck_assert_int_eq(clg_json_parse(&err, deep, 300, "deep", &j), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "too deep"), "%s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_corruption);
    tcase_add_test(tc, test_field_messages);
    tcase_add_test(tc, test_header_protection);
    tcase_add_test(tc, test_meta_ranges);
    tcase_add_test(tc, test_header_scaling);
    tcase_add_test(tc, test_failed_save_keeps_old);
    tcase_add_test(tc, test_json);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
