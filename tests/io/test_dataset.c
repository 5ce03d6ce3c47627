/* Datasets: IDX (plain + gz) and CIFAR-10 round trips on generated files,
 * truncation / bad magic errors, PGM, shuffling, normalization, batches. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/dataset.h"
#include "testutil.h"

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clgrad-ds-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void tpath(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmpdir, name); }

static uint8_t *rand_bytes(size_t n, clg_rng *r, unsigned mod)
{
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(clg_rng_u32(r) % mod);
    return b;
}

static void write_raw(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static uint8_t *read_raw(const char *path, size_t *n)
{
    char *b;
    clg_err err;
    ck_assert_int_eq(clg_file_read(&err, path, &b, n), CLG_OK);
    return (uint8_t *)b;
}

/* Writes a random IDX images + labels pair; returns the pixel/label data. */
static void write_pair(const char *img, const char *lab, int gz, int n, int c, int h, int w, clg_rng *r,
                       uint8_t **px, uint8_t **lb)
{
    clg_err err;
    *px = rand_bytes((size_t)n * c * h * w, r, 256);
    *lb = rand_bytes((size_t)n, r, 10);
    int d4[4] = {n, c, h, w}, d3[3] = {n, h, w};
    if (c == 1)
        ck_assert_int_eq(clg_idx_write_u8(&err, img, gz, d3, 3, *px), CLG_OK);
    else
        ck_assert_int_eq(clg_idx_write_u8(&err, img, gz, d4, 4, *px), CLG_OK);
    ck_assert_int_eq(clg_idx_write_u8(&err, lab, gz, &n, 1, *lb), CLG_OK);
}

START_TEST(test_idx_roundtrip)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 21);
    for (int gz = 0; gz < 2; gz++) {
        for (int c = 1; c <= 3; c += 2) {
            int n = 1 + (int)(clg_rng_u32(&r) % 40), h = 1 + (int)(clg_rng_u32(&r) % 30),
                w = 1 + (int)(clg_rng_u32(&r) % 30);
            char img[128], lab[128];
            tpath(img, sizeof img, gz ? "i.idx.gz" : "i.idx");
            tpath(lab, sizeof lab, gz ? "l.idx.gz" : "l.idx");
            uint8_t *px, *lb;
            write_pair(img, lab, gz, n, c, h, w, &r, &px, &lb);
            if (gz) { /* really compressed: gzip magic */
                size_t len;
                uint8_t *raw = read_raw(img, &len);
                ck_assert(raw[0] == 0x1f && raw[1] == 0x8b);
                free(raw);
            }
            clg_err err = {0};
            clg_dataset *ds = NULL;
            ck_assert_msg(clg_dataset_load_idx(&err, img, lab, &ds) == CLG_OK, "%s", err.msg);
            ck_assert_int_eq(ds->n, n);
            ck_assert_int_eq(ds->c, c);
            ck_assert_int_eq(ds->h, h);
            ck_assert_int_eq(ds->w, w);
            ck_assert_int_eq(ds->dtype, CLG_DS_U8);
            ck_assert_int_eq(ds->nclasses, 10);
            ck_assert(memcmp(ds->u8, px, (size_t)n * c * h * w) == 0);
            for (int i = 0; i < n; i++)
                ck_assert_int_eq(ds->labels[i], lb[i]);
            clg_dataset_free(ds);
            /* images only */
            ck_assert_int_eq(clg_dataset_load_idx(&err, img, NULL, &ds), CLG_OK);
            ck_assert_int_eq(ds->nclasses, 0);
            ck_assert_int_eq(ds->labels[0], -1);
            clg_dataset_free(ds);
            free(px);
            free(lb);
        }
    }
    rm_rf(tmpdir);
}
END_TEST

static void expect_load_error(const char *img, const char *lab, clg_status want, const char *needle)
{
    clg_err err = {0};
    clg_dataset *ds = (clg_dataset *)0x1;
    clg_status st = clg_dataset_load_idx(&err, img, lab, &ds);
    ck_assert_msg(st == want, "got %s (%s), want %s", clg_status_name(st), err.msg, clg_status_name(want));
    ck_assert_ptr_null(ds);
    ck_assert_msg(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
}

START_TEST(test_idx_errors)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 22);
    char img[128], lab[128], bad[128];
    tpath(img, sizeof img, "img.idx");
    tpath(lab, sizeof lab, "lab.idx");
    tpath(bad, sizeof bad, "bad.idx");
    int n = 5 + (int)(clg_rng_u32(&r) % 20);
    uint8_t *px, *lb;
    write_pair(img, lab, 0, n, 1, 7, 9, &r, &px, &lb);
    size_t len;
    uint8_t *raw = read_raw(img, &len);
    ck_assert_uint_eq(len, 16 + (size_t)n * 63);

    /* truncation anywhere: in the magic, the dims, the data */
    size_t cuts[4] = {2, 4 + (clg_rng_u32(&r) % 12), 16 + (clg_rng_u32(&r) % ((size_t)n * 63)), len - 1};
    for (int i = 0; i < 4; i++) {
        write_raw(bad, raw, cuts[i]);
        expect_load_error(bad, lab, CLG_ERR_FORMAT, "truncated");
        expect_load_error(bad, lab, CLG_ERR_FORMAT, bad);
    }
    /* truncated gzip file */
    char badgz[128], imgz[128];
    tpath(imgz, sizeof imgz, "img.idx.gz");
    tpath(badgz, sizeof badgz, "bad.idx.gz");
    int dims[3] = {n, 7, 9};
    clg_err err;
    ck_assert_int_eq(clg_idx_write_u8(&err, imgz, 1, dims, 3, px), CLG_OK);
    size_t glen;
    uint8_t *graw = read_raw(imgz, &glen);
    write_raw(badgz, graw, glen / 2);
    {
        clg_dataset *ds = NULL;
        clg_status st = clg_dataset_load_idx(&err, badgz, lab, &ds);
        ck_assert_int_eq(st, CLG_ERR_FORMAT);
        ck_assert_msg(strstr(err.msg, "truncated") || strstr(err.msg, "corrupt"), "%s", err.msg);
    }
    /* Only the 8-byte trailer (CRC-32, length) cut, with a random bit of
     * the deflate data flipped or not: the data may still inflate, but the
     * stream is incomplete. */
    for (int flip = 0; flip < 2; flip++) {
        uint8_t *g = malloc(glen);
        memcpy(g, graw, glen);
        if (flip)
            g[10 + (size_t)rand() % (glen - 18)] ^= (uint8_t)(1u << (rand() % 8));
        write_raw(badgz, g, glen - 8);
        expect_load_error(badgz, lab, CLG_ERR_FORMAT, "corrupt gzip");
        /* complete stream with a wrong CRC-32 in the trailer */
        memcpy(g, graw, glen);
        g[glen - 8 + (size_t)rand() % 4] ^= (uint8_t)(1u << (rand() % 8));
        write_raw(badgz, g, glen);
        expect_load_error(badgz, lab, CLG_ERR_FORMAT, "corrupt gzip");
        free(g);
    }
    /* trailing garbage after the stream: refused; a second member: read */
    {
        size_t extra = 1 + (size_t)rand() % 40;
        uint8_t *g = malloc(glen * 2 + extra);
        memcpy(g, graw, glen);
        for (size_t i = 0; i < extra; i++)
            g[glen + i] = (uint8_t)(0x20 + rand() % 90);
        write_raw(badgz, g, glen + extra);
        expect_load_error(badgz, lab, CLG_ERR_FORMAT, "trailing garbage");
        /* "gzip -c a >> f" twice: two members whose data concatenate; the
         * IDX then has data beyond its header, which is the IDX check */
        memcpy(g + glen, graw, glen);
        write_raw(badgz, g, glen * 2);
        expect_load_error(badgz, lab, CLG_ERR_FORMAT, "beyond");
        free(g);
    }
    /* bad magic */
    uint8_t *m = malloc(len);
    memcpy(m, raw, len);
    m[0] = 0x12;
    write_raw(bad, m, len);
    expect_load_error(bad, lab, CLG_ERR_FORMAT, "bad magic");
    /* unsupported element type (int16) */
    memcpy(m, raw, len);
    m[2] = 0x0B;
    write_raw(bad, m, len);
    expect_load_error(bad, lab, CLG_ERR_UNSUPPORTED, "element type 0x0b");
    /* float32 (0x0D) type code on byte-sized data: 4 bytes per element are missing */
    m[2] = 0x0D;
    write_raw(bad, m, len);
    expect_load_error(bad, lab, CLG_ERR_FORMAT, "truncated");
    /* a labels file given as images (1 dim) */
    expect_load_error(lab, lab, CLG_ERR_FORMAT, "dimensions");
    /* trailing garbage */
    uint8_t *m2 = malloc(len + 3);
    memcpy(m2, raw, len);
    m2[len] = m2[len + 1] = m2[len + 2] = 7;
    write_raw(bad, m2, len + 3);
    expect_load_error(bad, lab, CLG_ERR_FORMAT, "beyond");
    /* huge dims: header says more than the cap */
    memcpy(m, raw, len);
    m[4] = m[5] = m[6] = m[7] = 0xff;
    m[8] = m[9] = m[10] = m[11] = 0xff;
    write_raw(bad, m, len);
    expect_load_error(bad, lab, CLG_ERR_FORMAT, "more than");
    /* label count mismatch */
    char lab2[128];
    tpath(lab2, sizeof lab2, "lab2.idx");
    int n2 = n + 1;
    uint8_t *lb2 = rand_bytes((size_t)n2, &r, 10);
    ck_assert_int_eq(clg_idx_write_u8(&err, lab2, 0, &n2, 1, lb2), CLG_OK);
    expect_load_error(img, lab2, CLG_ERR_FORMAT, "labels");
    /* missing files name the file */
    char nothere[128];
    tpath(nothere, sizeof nothere, "nothere.idx");
    expect_load_error(nothere, lab, CLG_ERR_NOT_FOUND, nothere);
    expect_load_error(img, nothere, CLG_ERR_NOT_FOUND, nothere);
    free(m);
    free(m2);
    free(raw);
    free(graw);
    free(px);
    free(lb);
    free(lb2);
    rm_rf(tmpdir);
}
END_TEST

/* IDX float32 (type 0x0D, big-endian): values read exactly as written (no
 * 1/255 scale), through the dataset loader and the predict reader; a
 * non-finite value and a float labels file are refused. */
static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

START_TEST(test_idx_float32)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 27);
    int n = 1 + (int)(clg_rng_u32(&r) % 9), c = 1 + (int)(clg_rng_u32(&r) % 3), h = 1 + (int)(clg_rng_u32(&r) % 9),
        w = 1 + (int)(clg_rng_u32(&r) % 9);
    size_t cnt = (size_t)n * c * h * w, len = 4 + 16 + 4 * cnt;
    float *want = malloc(cnt * sizeof(float));
    uint8_t *b = malloc(len);
    b[0] = b[1] = 0;
    b[2] = 0x0D;
    b[3] = 4;
    put_be32(b + 4, (uint32_t)n);
    put_be32(b + 8, (uint32_t)c);
    put_be32(b + 12, (uint32_t)h);
    put_be32(b + 16, (uint32_t)w);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = clg_rng_normal(&r) * 1e3f; /* any finite float, not pixels */
        uint32_t u;
        memcpy(&u, &want[i], 4);
        put_be32(b + 20 + 4 * i, u);
    }
    char img[128], lab[128];
    tpath(img, sizeof img, "f32-images.idx");
    tpath(lab, sizeof lab, "f32-labels.idx");
    write_raw(img, b, len);
    uint8_t *lb = rand_bytes((size_t)n, &r, 10);
    clg_err err = {0};
    ck_assert_int_eq(clg_idx_write_u8(&err, lab, 0, &n, 1, lb), CLG_OK);
    for (int pass = 0; pass < 2; pass++) {
        clg_dataset *ds = NULL;
        if (pass == 0)
            ck_assert_msg(clg_dataset_load_idx(&err, img, lab, &ds) == CLG_OK, "%s", err.msg);
        else
            ck_assert_msg(clg_dataset_load_image(&err, img, &ds) == CLG_OK, "%s", err.msg);
        ck_assert_int_eq(ds->dtype, CLG_DS_F32);
        ck_assert(ds->n == n && ds->c == c && ds->h == h && ds->w == w);
        float *x = malloc(cnt * sizeof(float));
        for (size_t i = 0; i < cnt; i++)
            x[i] = NAN; /* poisoned: the fill must write every value */
        int got = 0;
        ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, NULL, NULL, 0, n, x, NULL, &got), CLG_OK);
        ck_assert_int_eq(got, n);
        ck_assert(memcmp(x, want, cnt * sizeof(float)) == 0);
        if (pass == 0)
            for (int i = 0; i < n; i++)
                ck_assert_int_eq(ds->labels[i], lb[i]);
        free(x);
        clg_dataset_free(ds);
    }
    /* a labels file holding floats */
    expect_load_error(img, img, CLG_ERR_FORMAT, "holds floats");
    /* a non-finite value */
    size_t k = clg_rng_u32(&r) % cnt;
    put_be32(b + 20 + 4 * k, 0x7fc00000u);
    write_raw(img, b, len);
    expect_load_error(img, lab, CLG_ERR_FORMAT, "not finite");
    free(want);
    free(b);
    free(lb);
    rm_rf(tmpdir);
}
END_TEST

START_TEST(test_open_named_and_dir)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 23);
    char sub[128];
    tpath(sub, sizeof sub, "fashion-mnist");
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    const char *pre[2] = {"train", "t10k"};
    int ns[2];
    uint8_t *px[2], *lb[2];
    for (int s = 0; s < 2; s++) {
        char img[256], lab[256];
        snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte%s", sub, pre[s], s ? "" : ".gz");
        snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte%s", sub, pre[s], s ? "" : ".gz");
        ns[s] = 3 + (int)(clg_rng_u32(&r) % 30);
        write_pair(img, lab, !s, ns[s], 1, 28, 28, &r, &px[s], &lb[s]);
    }
    setenv("CLGRAD_DATA_DIR", tmpdir, 1);
    clg_err err = {0};
    for (int s = 0; s < 2; s++) {
        clg_dataset *ds = NULL;
        ck_assert_msg(clg_dataset_open(&err, "fashion-mnist", s ? CLG_SPLIT_TEST : CLG_SPLIT_TRAIN, &ds) == CLG_OK,
                      "%s", err.msg);
        ck_assert_int_eq(ds->n, ns[s]);
        ck_assert_str_eq(ds->name, "fashion-mnist");
        ck_assert(memcmp(ds->u8, px[s], (size_t)ns[s] * 784) == 0);
        for (int i = 0; i < ns[s]; i++)
            ck_assert_int_eq(ds->labels[i], lb[s][i]);
        clg_dataset_free(ds);
        /* the same through the directory path */
        ck_assert_int_eq(clg_dataset_open(&err, sub, s ? CLG_SPLIT_TEST : CLG_SPLIT_TRAIN, &ds), CLG_OK);
        ck_assert_int_eq(ds->n, ns[s]);
        clg_dataset_free(ds);
    }
    /* an images file path finds its labels */
    char img[256];
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte", sub);
    clg_dataset *ds = NULL;
    ck_assert_int_eq(clg_dataset_open(&err, img, CLG_SPLIT_TRAIN, &ds), CLG_OK);
    ck_assert_int_eq(ds->n, ns[1]);
    ck_assert_int_eq(ds->labels[ns[1] - 1], lb[1][ns[1] - 1]);
    clg_dataset_free(ds);
    /* a missing labels file is named */
    char lab[256];
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte", sub);
    unlink(lab);
    ck_assert_int_eq(clg_dataset_open(&err, sub, CLG_SPLIT_TEST, &ds), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "t10k-labels-idx1-ubyte"), "%s", err.msg);
    /* unknown name / missing path */
    ck_assert_int_eq(clg_dataset_open(&err, "/nonexistent/xyz", CLG_SPLIT_TRAIN, &ds), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "/nonexistent/xyz"), "%s", err.msg);
    setenv("CLGRAD_DATA_DIR", "/nonexistent-dir", 1);
    ck_assert_int_eq(clg_dataset_open(&err, "mnist", CLG_SPLIT_TRAIN, &ds), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "mnist") && strstr(err.msg, "CLGRAD_DATA_DIR"), "%s", err.msg);
    unsetenv("CLGRAD_DATA_DIR");
    for (int s = 0; s < 2; s++) {
        free(px[s]);
        free(lb[s]);
    }
    rm_rf(tmpdir);
}
END_TEST

START_TEST(test_cifar)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 24);
    int counts[6];
    uint8_t *recs[6];
    char paths[6][128];
    const char *names[6] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                            "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
    for (int b = 0; b < 6; b++) {
        counts[b] = 1 + (int)(clg_rng_u32(&r) % 6);
        recs[b] = rand_bytes((size_t)counts[b] * 3073, &r, 256);
        for (int i = 0; i < counts[b]; i++)
            recs[b][(size_t)i * 3073] = (uint8_t)(clg_rng_u32(&r) % 10);
        tpath(paths[b], sizeof paths[b], names[b]);
        write_raw(paths[b], recs[b], (size_t)counts[b] * 3073);
    }
    clg_err err = {0};
    clg_dataset *ds = NULL;
    ck_assert_msg(clg_dataset_open(&err, tmpdir, CLG_SPLIT_TRAIN, &ds) == CLG_OK, "%s", err.msg);
    int total = 0;
    for (int b = 0; b < 5; b++)
        total += counts[b];
    ck_assert_int_eq(ds->n, total);
    ck_assert_int_eq(ds->c, 3);
    ck_assert_int_eq(ds->h, 32);
    ck_assert_int_eq(ds->w, 32);
    ck_assert_int_eq(ds->nclasses, 10);
    int k = 0;
    for (int b = 0; b < 5; b++)
        for (int i = 0; i < counts[b]; i++, k++) {
            ck_assert_int_eq(ds->labels[k], recs[b][(size_t)i * 3073]);
            ck_assert(memcmp(ds->u8 + (size_t)k * 3072, recs[b] + (size_t)i * 3073 + 1, 3072) == 0);
        }
    clg_dataset_free(ds);
    ck_assert_int_eq(clg_dataset_open(&err, tmpdir, CLG_SPLIT_TEST, &ds), CLG_OK);
    ck_assert_int_eq(ds->n, counts[5]);
    ck_assert(memcmp(ds->u8, recs[5] + 1, 3072) == 0);
    clg_dataset_free(ds);
    /* truncated batch */
    write_raw(paths[5], recs[5], (size_t)counts[5] * 3073 - 1 - clg_rng_u32(&r) % 3000);
    ck_assert_int_eq(clg_dataset_open(&err, tmpdir, CLG_SPLIT_TEST, &ds), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "test_batch.bin") && strstr(err.msg, "3073"), "%s", err.msg);
    /* bad label */
    recs[5][0] = 10 + (uint8_t)(clg_rng_u32(&r) % 200);
    write_raw(paths[5], recs[5], (size_t)counts[5] * 3073);
    ck_assert_int_eq(clg_dataset_open(&err, tmpdir, CLG_SPLIT_TEST, &ds), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "record 0") && strstr(err.msg, "label"), "%s", err.msg);
    /* missing batch */
    unlink(paths[2]);
    ck_assert_int_eq(clg_dataset_open(&err, tmpdir, CLG_SPLIT_TRAIN, &ds), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, "data_batch_3.bin"), "%s", err.msg);
    for (int b = 0; b < 6; b++)
        free(recs[b]);
    rm_rf(tmpdir);
}
END_TEST

START_TEST(test_images)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 25);
    int h = 1 + (int)(clg_rng_u32(&r) % 40), w = 1 + (int)(clg_rng_u32(&r) % 40);
    uint8_t *px = rand_bytes((size_t)h * w, &r, 256);
    char p5[128], p2[128], p16[128], idx[128];
    tpath(p5, sizeof p5, "a.pgm");
    tpath(p2, sizeof p2, "b.pgm");
    tpath(p16, sizeof p16, "c.pgm");
    tpath(idx, sizeof idx, "d.idx");
    FILE *f = fopen(p5, "wb");
    fprintf(f, "P5\n# made by a test\n%d %d\n255\n", w, h);
    fwrite(px, 1, (size_t)h * w, f);
    fclose(f);
    f = fopen(p2, "w");
    fprintf(f, "P2\n%d %d\n15\n", w, h);
    for (int i = 0; i < h * w; i++)
        fprintf(f, "%d%c", px[i] % 16, i % 17 == 16 ? '\n' : ' ');
    fclose(f);
    f = fopen(p16, "wb");
    fprintf(f, "P5 %d %d 1000\n", w, h);
    for (int i = 0; i < h * w; i++) {
        int v = (int)(clg_rng_u32(&r) % 1001);
        fputc(v >> 8, f);
        fputc(v & 255, f);
        px[i] = (uint8_t)((v * 255 + 500) / 1000); /* reuse px for the expected values below */
    }
    fclose(f);
    clg_err err = {0};
    clg_dataset *ds = NULL;
    ck_assert_int_eq(clg_dataset_load_image(&err, p16, &ds), CLG_OK);
    ck_assert_int_eq(ds->h, h);
    ck_assert_int_eq(ds->w, w);
    ck_assert(memcmp(ds->u8, px, (size_t)h * w) == 0);
    clg_dataset_free(ds);
    /* P5 and P2 from a fresh pixel set */
    free(px);
    px = rand_bytes((size_t)h * w, &r, 256);
    f = fopen(p5, "wb");
    fprintf(f, "P5\n# made by a test\n%d %d\n255\n", w, h);
    fwrite(px, 1, (size_t)h * w, f);
    fclose(f);
    f = fopen(p2, "w");
    fprintf(f, "P2\n%d %d\n15\n", w, h);
    for (int i = 0; i < h * w; i++)
        fprintf(f, "%d%c", px[i] % 16, i % 17 == 16 ? '\n' : ' ');
    fclose(f);
    ck_assert_msg(clg_dataset_load_image(&err, p5, &ds) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(ds->n, 1);
    ck_assert_int_eq(ds->c, 1);
    ck_assert(memcmp(ds->u8, px, (size_t)h * w) == 0);
    ck_assert_int_eq(ds->labels[0], -1);
    clg_dataset_free(ds);
    ck_assert_msg(clg_dataset_load_image(&err, p2, &ds) == CLG_OK, "%s", err.msg);
    for (int i = 0; i < h * w; i++)
        ck_assert_int_eq(ds->u8[i], ((px[i] % 16) * 255 + 7) / 15);
    clg_dataset_free(ds);
    /* IDX with several images */
    int dims[3] = {3, h, w};
    uint8_t *px3 = rand_bytes((size_t)3 * h * w, &r, 256);
    ck_assert_int_eq(clg_idx_write_u8(&err, idx, 0, dims, 3, px3), CLG_OK);
    ck_assert_int_eq(clg_dataset_load_image(&err, idx, &ds), CLG_OK);
    ck_assert_int_eq(ds->n, 3);
    ck_assert(memcmp(ds->u8, px3, (size_t)3 * h * w) == 0);
    clg_dataset_free(ds);
    /* truncated P5 and garbage */
    f = fopen(p5, "wb");
    fprintf(f, "P5\n%d %d\n255\n", w, h);
    fwrite(px, 1, (size_t)h * w - 1, f);
    fclose(f);
    ck_assert_int_eq(clg_dataset_load_image(&err, p5, &ds), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "truncated"), "%s", err.msg);
    write_raw(p5, "hello world", 11);
    ck_assert_int_eq(clg_dataset_load_image(&err, p5, &ds), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "neither"), "%s", err.msg);
    free(px);
    free(px3);
    rm_rf(tmpdir);
}
END_TEST

static void check_perm(const int32_t *p, int n)
{
    char *seen = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        ck_assert(p[i] >= 0 && p[i] < n);
        ck_assert(!seen[p[i]]);
        seen[p[i]] = 1;
    }
    free(seen);
}

START_TEST(test_shuffle)
{
    clg_rng r;
    tu_rng(&r, 26);
    int n = 100 + (int)(clg_rng_u32(&r) % 1000);
    int32_t *a = malloc(sizeof(int32_t) * (size_t)n), *b = malloc(sizeof(int32_t) * (size_t)n);
    clg_dataset_perm_identity(a, n);
    clg_rng saved = r;
    clg_dataset_shuffle(a, n, &r);
    check_perm(a, n);
    /* restoring the rng state restores the order */
    clg_dataset_perm_identity(b, n);
    clg_dataset_shuffle(b, n, &saved);
    ck_assert(memcmp(a, b, sizeof(int32_t) * (size_t)n) == 0);
    ck_assert(saved.state == r.state);
    int fixed = 0;
    for (int i = 0; i < n; i++)
        fixed += a[i] == i;
    ck_assert_int_lt(fixed, 10); /* expected ~1 */
    /* epoch permutations: reproducible, different per epoch */
    uint64_t seed = clg_rng_u32(&r);
    clg_dataset_epoch_perm(a, n, seed, 3);
    clg_dataset_epoch_perm(b, n, seed, 3);
    check_perm(a, n);
    ck_assert(memcmp(a, b, sizeof(int32_t) * (size_t)n) == 0);
    clg_dataset_epoch_perm(b, n, seed, 4);
    ck_assert(memcmp(a, b, sizeof(int32_t) * (size_t)n) != 0);
    free(a);
    free(b);
    /* uniformity: all 24 orders of 4 elements about equally often */
    int counts[256] = {0};
    const int trials = 48000;
    for (int t = 0; t < trials; t++) {
        int32_t p[4];
        clg_dataset_perm_identity(p, 4);
        clg_dataset_shuffle(p, 4, &r);
        counts[p[0] * 64 + p[1] * 16 + p[2] * 4 + p[3]]++;
    }
    int distinct = 0;
    for (int i = 0; i < 256; i++) {
        if (!counts[i])
            continue;
        distinct++;
        ck_assert_msg(counts[i] > 1700 && counts[i] < 2300, "order %d seen %d times of %d", i, counts[i], trials);
    }
    ck_assert_int_eq(distinct, 24);
}
END_TEST

START_TEST(test_norm_and_batches)
{
    clg_rng r;
    tu_rng(&r, 27);
    for (int dt = 0; dt < 2; dt++) {
        int n = 10 + (int)(clg_rng_u32(&r) % 40), c = 1 + (int)(clg_rng_u32(&r) % 3), h = 2 + (int)(clg_rng_u32(&r) % 9),
            w = 2 + (int)(clg_rng_u32(&r) % 9);
        clg_err err = {0};
        clg_dataset *ds = NULL;
        ck_assert_int_eq(clg_dataset_create(&err, n, c, h, w, 10, dt ? CLG_DS_F32 : CLG_DS_U8, &ds), CLG_OK);
        size_t tot = (size_t)n * c * h * w, plane = (size_t)h * w, per = (size_t)c * plane;
        double *val = malloc(sizeof(double) * tot);
        for (size_t i = 0; i < tot; i++) {
            if (dt) {
                ds->f32[i] = 3.0f * clg_rng_normal(&r) + 0.5f * (float)((i / plane) % (size_t)c);
                val[i] = ds->f32[i];
            } else {
                ds->u8[i] = (uint8_t)(clg_rng_u32(&r) % (64 + 64 * ((i / plane) % (size_t)c)));
                val[i] = ds->u8[i] / 255.0;
            }
        }
        for (int i = 0; i < n; i++)
            ds->labels[i] = (int32_t)(clg_rng_u32(&r) % 10);
        /* reference mean/std per channel, two-pass in double */
        double mean[3] = {0}, sd[3] = {0};
        for (int ch = 0; ch < c; ch++) {
            for (int i = 0; i < n; i++)
                for (size_t k = 0; k < plane; k++)
                    mean[ch] += val[(size_t)i * per + (size_t)ch * plane + k];
            mean[ch] /= (double)n * (double)plane;
            for (int i = 0; i < n; i++)
                for (size_t k = 0; k < plane; k++) {
                    double d = val[(size_t)i * per + (size_t)ch * plane + k] - mean[ch];
                    sd[ch] += d * d;
                }
            sd[ch] = sqrt(sd[ch] / ((double)n * (double)plane));
        }
        clg_ds_norm nm;
        ck_assert_int_eq(clg_dataset_norm_compute(&err, ds, &nm), CLG_OK);
        ck_assert_int_eq(nm.c, c);
        for (int ch = 0; ch < c; ch++) {
            ck_assert_msg(fabs(nm.mean[ch] - mean[ch]) <= 1e-5 * (fabs(mean[ch]) + 1), "mean %g vs %g", nm.mean[ch],
                          mean[ch]);
            ck_assert_msg(fabs(nm.std[ch] - sd[ch]) <= 1e-5 * (sd[ch] + 1e-3), "std %g vs %g", nm.std[ch], sd[ch]);
        }
        /* batches over a shuffled permutation, including the short last one */
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)n);
        clg_dataset_epoch_perm(perm, n, clg_rng_u32(&r), 0);
        int B = 1 + (int)(clg_rng_u32(&r) % 16);
        float *x = malloc(sizeof(float) * per * (size_t)(B + 1));
        int32_t *lab = malloc(sizeof(int32_t) * (size_t)(B + 1));
        double *ref = malloc(sizeof(double) * per * (size_t)B);
        int seen = 0;
        for (int start = 0; start < n; start += B) {
            tu_poison(x, per * (size_t)(B + 1));
            int cnt = -1;
            ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, &nm, perm, start, B, x, lab, &cnt), CLG_OK);
            ck_assert_int_eq(cnt, CLG_MIN(B, n - start));
            for (int i = 0; i < cnt; i++) {
                int idx = perm[start + i];
                ck_assert_int_eq(lab[i], ds->labels[idx]);
                for (int ch = 0; ch < c; ch++)
                    for (size_t k = 0; k < plane; k++)
                        ref[(size_t)i * per + (size_t)ch * plane + k] =
                            (val[(size_t)idx * per + (size_t)ch * plane + k] - mean[ch]) / sd[ch];
            }
            /* normalized values are O(1): |got - ref| <= 1e-5 (|ref| + 1) */
            double e = tu_max_err(x, ref, per * (size_t)cnt, 1.0);
            ck_assert_msg(e < 1e-5, "batch at %d: max err %g", start, e);
            ck_assert(isnan(x[per * (size_t)cnt])); /* nothing written past count */
            seen += cnt;
        }
        ck_assert_int_eq(seen, n);
        int cnt = -1;
        ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, &nm, perm, n, B, x, lab, &cnt), CLG_OK);
        ck_assert_int_eq(cnt, 0);
        /* no normalization: just the dtype scale; identity perm */
        ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, NULL, NULL, 0, 1, x, NULL, &cnt), CLG_OK);
        for (size_t k = 0; k < per; k++)
            ck_assert(fabs(x[k] - val[k]) <= 1e-6 * (fabs(val[k]) + 1));
        /* a corrupt permutation is an error, not a crash */
        perm[0] = n + 5;
        ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, &nm, perm, 0, B, x, lab, &cnt), CLG_ERR_INVALID_ARG);
        free(perm);
        free(x);
        free(lab);
        free(ref);
        free(val);
        clg_dataset_free(ds);
    }
}
END_TEST

/* Augmentation: every augmented sample must be the plain normalized sample
 * mirrored and/or shifted by one (flip, dy, dx) in range, border filled with
 * the normalized zero pixel; choices reproducible from (seed, epoch). */
static int aug_matches(const float *got, const float *plain, const float *fill, int c, int h, int w, int flip, int dy,
                       int dx)
{
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int sy = y - dy, sx = x - dx;
                if (flip)
                    sx = w - 1 - sx;
                float want = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? plain[((size_t)ch * h + sy) * w + sx] : fill[ch];
                if (!(fabsf(got[((size_t)ch * h + y) * w + x] - want) <= 1e-6f * (fabsf(want) + 1)))
                    return 0;
            }
    return 1;
}

START_TEST(test_augment)
{
    clg_rng r;
    tu_rng(&r, 28);
    int n = 240, c = 1 + (int)(clg_rng_u32(&r) % 2), h = 5 + (int)(clg_rng_u32(&r) % 6), w = 5 + (int)(clg_rng_u32(&r) % 6);
    clg_err err = {0};
    clg_dataset *ds = NULL;
    ck_assert_int_eq(clg_dataset_create(&err, n, c, h, w, 10, CLG_DS_F32, &ds), CLG_OK);
    size_t per = (size_t)c * h * w;
    for (size_t i = 0; i < (size_t)n * per; i++)
        ds->f32[i] = clg_rng_normal(&r) + 0.25f; /* distinct values: one transform matches */
    for (int i = 0; i < n; i++)
        ds->labels[i] = (int32_t)(clg_rng_u32(&r) % 10);
    clg_ds_norm nm;
    ck_assert_int_eq(clg_dataset_norm_compute(&err, ds, &nm), CLG_OK);
    float fill[CLG_DS_MAX_CHANNELS];
    for (int ch = 0; ch < c; ch++)
        fill[ch] = -nm.mean[ch] / nm.std[ch];
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n);
    clg_dataset_epoch_perm(perm, n, 5, 0);
    float *plain = malloc(sizeof(float) * per * (size_t)n), *x = malloc(sizeof(float) * per * (size_t)n),
          *x2 = malloc(sizeof(float) * per * (size_t)n);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    int cnt = -1;
    ck_assert_int_eq(clg_dataset_fill_batch(&err, ds, &nm, perm, 0, n, plain, NULL, &cnt), CLG_OK);
    enum { S = 2 };
    clg_ds_augment aug = {1, S, clg_rng_u32(&r), 3};
    tu_poison(x, per * (size_t)n);
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, 0, n, &aug, x, lab, &cnt), CLG_OK);
    ck_assert_int_eq(cnt, n);
    int flips = 0, dys[2 * S + 1] = {0}, dxs[2 * S + 1] = {0};
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(lab[i], ds->labels[perm[i]]);
        int found = 0;
        for (int f = 0; f < 2 && !found; f++)
            for (int dy = -S; dy <= S && !found; dy++)
                for (int dx = -S; dx <= S && !found; dx++)
                    if (aug_matches(x + (size_t)i * per, plain + (size_t)i * per, fill, c, h, w, f, dy, dx)) {
                        found = 1;
                        flips += f;
                        dys[dy + S]++;
                        dxs[dx + S]++;
                    }
        ck_assert_msg(found, "sample %d is no flip/shift of its source", i);
    }
    /* 240 fair coin flips: 120 +- 45 is > 5 sigma; each of 5 shifts about 48 times */
    ck_assert_msg(flips > 75 && flips < 165, "%d of %d mirrored", flips, n);
    for (int k = 0; k <= 2 * S; k++)
        ck_assert_msg(dys[k] > 15 && dxs[k] > 15, "shift %d seen %d/%d times", k - S, dys[k], dxs[k]);
    /* same (seed, epoch, position) -> same images, also when filled in two batches */
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, 0, n / 2, &aug, x2, NULL, &cnt), CLG_OK);
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, n / 2, n, &aug, x2 + per * (size_t)(n / 2), NULL,
                                                &cnt),
                     CLG_OK);
    ck_assert(memcmp(x, x2, sizeof(float) * per * (size_t)n) == 0);
    /* another epoch: other choices */
    aug.epoch = 4;
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, 0, n, &aug, x2, NULL, &cnt), CLG_OK);
    ck_assert(memcmp(x, x2, sizeof(float) * per * (size_t)n) != 0);
    /* all off = no augmentation */
    clg_ds_augment off = {0, 0, 1, 0};
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, 0, n, &off, x2, NULL, &cnt), CLG_OK);
    ck_assert(memcmp(plain, x2, sizeof(float) * per * (size_t)n) == 0);
    /* out-of-range shift: a clear error */
    clg_ds_augment bad = {0, CLG_DS_MAX_SHIFT + 1, 1, 0};
    ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, ds, &nm, perm, 0, n, &bad, x2, NULL, &cnt), CLG_ERR_INVALID_ARG);
    ck_assert(strstr(err.msg, "shift") != NULL);
    free(perm);
    free(plain);
    free(x);
    free(x2);
    free(lab);
    clg_dataset_free(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dataset");
    TCase *tc = tcase_create("dataset");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_idx_roundtrip);
    tcase_add_test(tc, test_idx_errors);
    tcase_add_test(tc, test_idx_float32);
    tcase_add_test(tc, test_open_named_and_dir);
    tcase_add_test(tc, test_cifar);
    tcase_add_test(tc, test_images);
    tcase_add_test(tc, test_shuffle);
    tcase_add_test(tc, test_norm_and_batches);
    tcase_add_test(tc, test_augment);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
