/* Text data (`--data text:PATH`, io/text.c): windows against the file's
 * bytes, seeding by (seed, epoch, position) (what makes --resume exact),
 * the held-out tail, and bad inputs (empty, too short, a directory, a FIFO,
 * unreadable, over the size cap) refused naming the file and the sizes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/dataset.h"
#include "testutil.h"

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clgrad-text-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A file of n random bytes (every value 0..255 possible); returns them. */
static uint8_t *write_random(const char *path, size_t n, clg_rng *r)
{
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(clg_rng_u32(r) >> 24);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    return b;
}

static void poison_i32(int32_t *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = -7;
}

/* Every sample of x / y is the window of T + 1 bytes of `bytes` at some
 * offset within [lo, hi] (inclusive start range); returns the offsets. */
static void check_windows(const float *x, const int32_t *y, int count, int T, const uint8_t *bytes, size_t lo,
                          size_t hi, const size_t *expect, size_t *offs)
{
    for (int i = 0; i < count; i++) {
        size_t off = expect ? expect[i] : (size_t)-1;
        if (!expect) { /* find it: the first offset in range that matches */
            for (size_t o = lo; o <= hi && off == (size_t)-1; o++) {
                int ok = 1;
                for (int t = 0; t < T && ok; t++)
                    ok = x[(size_t)i * T + t] == (float)bytes[o + t];
                if (ok)
                    off = o;
            }
            ck_assert_msg(off != (size_t)-1, "sample %d matches no window in [%zu, %zu]", i, lo, hi);
        }
        ck_assert_msg(off >= lo && off <= hi, "sample %d: window at %zu outside [%zu, %zu]", i, off, lo, hi);
        for (int t = 0; t < T; t++) {
            ck_assert_msg(x[(size_t)i * T + t] == (float)bytes[off + t], "sample %d id %d: %g, byte %u", i, t,
                          x[(size_t)i * T + t], bytes[off + t]);
            ck_assert_msg(y[(size_t)i * T + t] == bytes[off + t + 1], "sample %d target %d: %d, byte %u", i, t,
                          y[(size_t)i * T + t], bytes[off + t + 1]);
        }
        if (offs)
            offs[i] = off;
    }
}

START_TEST(test_windows_and_split)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 1);
    char path[128];
    snprintf(path, sizeof path, "%s/corpus.bin", tmpdir);
    int T = 13 + (int)(clg_rng_u32(&r) % 20); /* odd sizes too */
    size_t len = 20000 + clg_rng_u32(&r) % 5000;
    uint8_t *bytes = write_random(path, len, &r);
    size_t tail = len / 10, head = len - tail;
    clg_err err;
    clg_dataset *tr = NULL, *te = NULL;
    ck_assert_msg(clg_text_open(&err, path, T, CLG_SPLIT_TRAIN, &tr) == CLG_OK, "%s", err.msg);
    ck_assert_msg(clg_dataset_open_for(&err, NULL, "text:x", CLG_SPLIT_TEST, 0, &te) != CLG_OK, "context 0 accepted");
    char spec[160];
    snprintf(spec, sizeof spec, "text:%s", path);
    ck_assert_msg(clg_dataset_open_for(&err, NULL, spec, CLG_SPLIT_TEST, T, &te) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(tr->n, (int)(head / T));
    ck_assert_int_eq(te->n, (int)((tail - 1) / T));
    ck_assert_int_eq(tr->c, 1);
    ck_assert_int_eq(tr->h, T);
    ck_assert_int_eq(tr->w, 1);
    ck_assert_int_eq(tr->nclasses, 256);
    ck_assert_int_eq(clg_dataset_labels_per_sample(tr), T);
    ck_assert_uint_eq(tr->text_len, head);
    ck_assert_uint_eq(te->text_len, tail);

    int B = 7;
    float *x = malloc((size_t)B * T * sizeof(float));
    int32_t *y = malloc((size_t)B * T * sizeof(int32_t));
    /* training windows: inside the head (never reading a held-out byte), the normalization ignored */
    clg_ds_norm nm;
    ck_assert_int_eq(clg_dataset_norm_compute(&err, tr, &nm), CLG_OK);
    nm.mean[0] = 100.0f; /* must not be applied to token ids */
    clg_ds_augment aug = {.flip = 1, .shift = 2, .seed = 42, .epoch = 3};
    int cnt = -1;
    tu_poison(x, (size_t)B * T);
    poison_i32(y, (size_t)B * T);
    ck_assert_msg(clg_dataset_fill_batch_aug(&err, tr, &nm, NULL, 10, B, &aug, x, y, &cnt) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(cnt, B);
    size_t expect[16];
    for (int i = 0; i < B; i++)
        expect[i] = clg_text_window(tr, 42, 3, 10 + i);
    check_windows(x, y, B, T, bytes, 0, head - T - 1, expect, NULL);
    check_windows(x, y, B, T, bytes, 0, head - T - 1, NULL, NULL); /* the bytes themselves, searched */

    /* held-out windows: consecutive from the start of the tail, to its end */
    for (int b0 = 0; b0 < te->n; b0 += B) {
        tu_poison(x, (size_t)B * T);
        poison_i32(y, (size_t)B * T);
        ck_assert_msg(clg_dataset_fill_batch(&err, te, NULL, NULL, b0, B, x, y, &cnt) == CLG_OK, "%s", err.msg);
        ck_assert_int_eq(cnt, CLG_MIN(B, te->n - b0));
        for (int i = 0; i < cnt; i++)
            expect[i] = head + (size_t)(b0 + i) * T;
        check_windows(x, y, cnt, T, bytes, head, len - T - 1, expect, NULL);
    }
    ck_assert_msg(clg_dataset_fill_batch(&err, te, NULL, NULL, te->n, B, x, y, &cnt) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(cnt, 0);

    /* offsets spread over the whole head: the largest and smallest of many draws reach its ends */
    size_t mn = (size_t)-1, mx = 0;
    for (int64_t pos = 0; pos < 4000; pos++) {
        size_t o = clg_text_window(tr, 5, 0, pos);
        ck_assert_uint_le(o + T, head - 1);
        mn = CLG_MIN(mn, o);
        mx = CLG_MAX(mx, o);
    }
    ck_assert_msg(mn < head / 50 && mx > head - T - 1 - head / 50, "offsets span [%zu, %zu] of [0, %zu]", mn, mx,
                  head - T - 1);
    free(x);
    free(y);
    free(bytes);
    clg_dataset_free(tr);
    clg_dataset_free(te);
    rm_rf(tmpdir);
}
END_TEST

/* The windows depend on (seed, epoch, position) only: filling from the
 * middle of an epoch (a resumed run) gives the batches an uninterrupted run
 * gives; another epoch or seed gives other windows. */
START_TEST(test_seeding_resume)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 2);
    char path[128];
    snprintf(path, sizeof path, "%s/c.txt", tmpdir);
    int T = 16;
    uint8_t *bytes = write_random(path, 50000, &r);
    clg_err err;
    clg_dataset *a = NULL, *b = NULL;
    ck_assert_msg(clg_text_open(&err, path, T, CLG_SPLIT_TRAIN, &a) == CLG_OK, "%s", err.msg);
    ck_assert_msg(clg_text_open(&err, path, T, CLG_SPLIT_TRAIN, &b) == CLG_OK, "%s", err.msg);
    int B = 8, nb = 6;
    size_t per = (size_t)B * T;
    float *x1 = malloc(nb * per * sizeof(float)), *x2 = malloc(nb * per * sizeof(float));
    int32_t *y1 = malloc(nb * per * sizeof(int32_t)), *y2 = malloc(nb * per * sizeof(int32_t));
    uint64_t seed = tu_seed() | 1;
    clg_ds_augment aug = {.seed = seed, .epoch = 2};
    int cnt;
    for (int k = 0; k < nb; k++) /* an uninterrupted epoch */
        ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, a, NULL, NULL, k * B, B, &aug, x1 + k * per, y1 + k * per,
                                                    &cnt), CLG_OK);
    tu_poison(x2, nb * per);
    poison_i32(y2, nb * per);
    for (int k = 3; k < nb; k++) /* resumed at batch 3, in another dataset object */
        ck_assert_int_eq(clg_dataset_fill_batch_aug(&err, b, NULL, NULL, k * B, B, &aug, x2 + k * per, y2 + k * per,
                                                    &cnt), CLG_OK);
    ck_assert(memcmp(x1 + 3 * per, x2 + 3 * per, 3 * per * sizeof(float)) == 0);
    ck_assert(memcmp(y1 + 3 * per, y2 + 3 * per, 3 * per * sizeof(int32_t)) == 0);
    /* another epoch, another seed: other windows (at most a chance collision or two among 48) */
    int same_epoch = 0, same_seed = 0;
    for (int64_t pos = 0; pos < nb * B; pos++) {
        size_t o = clg_text_window(a, seed, 2, pos);
        same_epoch += o == clg_text_window(a, seed, 3, pos);
        same_seed += o == clg_text_window(a, seed + 1, 2, pos);
    }
    ck_assert_int_le(same_epoch, 2);
    ck_assert_int_le(same_seed, 2);
    free(x1);
    free(x2);
    free(y1);
    free(y2);
    free(bytes);
    clg_dataset_free(a);
    clg_dataset_free(b);
    rm_rf(tmpdir);
}
END_TEST

/* Opens path for context T and expects a failure whose message holds every
 * string of want (NULL-terminated). */
static void expect_refusal(const char *path, int T, const char *const *want)
{
    clg_err err;
    clg_dataset *ds = (clg_dataset *)0x1;
    clg_status st = clg_text_open(&err, path, T, CLG_SPLIT_TRAIN, &ds);
    ck_assert_msg(st != CLG_OK, "'%s' (context %d) accepted", path, T);
    ck_assert_ptr_null(ds);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(err.msg, want[i]), "message '%s' lacks '%s'", err.msg, want[i]);
}

START_TEST(test_bad_inputs)
{
    make_tmpdir();
    clg_rng r;
    tu_rng(&r, 3);
    char path[160];
    int T = 32;
    /* empty */
    snprintf(path, sizeof path, "%s/empty.txt", tmpdir);
    free(write_random(path, 0, &r));
    expect_refusal(path, T, (const char *const[]){path, "empty", NULL});
    /* one byte short of a window in the head and in the tail: 10 (T + 1) - 1 bytes; the exact minimum opens */
    snprintf(path, sizeof path, "%s/short.txt", tmpdir);
    free(write_random(path, 10 * (T + 1) - 1, &r));
    expect_refusal(path, T, (const char *const[]){path, "329 bytes", "context of 32", "at least 330", NULL});
    free(write_random(path, 10 * (T + 1), &r));
    clg_err err;
    clg_dataset *ds = NULL;
    ck_assert_msg(clg_text_open(&err, path, T, CLG_SPLIT_TRAIN, &ds) == CLG_OK, "%s", err.msg);
    ck_assert_int_ge(ds->n, 1);
    clg_dataset_free(ds);
    ck_assert_msg(clg_text_open(&err, path, T, CLG_SPLIT_TEST, &ds) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(ds->n, 1);
    clg_dataset_free(ds);
    /* a directory, a missing file, a FIFO */
    expect_refusal(tmpdir, T, (const char *const[]){tmpdir, "directory", NULL});
    snprintf(path, sizeof path, "%s/missing.txt", tmpdir);
    expect_refusal(path, T, (const char *const[]){path, "does not exist", NULL});
    snprintf(path, sizeof path, "%s/fifo", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_refusal(path, T, (const char *const[]){path, "FIFO", NULL});
    /* over the cap: a sparse file one byte past 1 GiB, refused before reading */
    snprintf(path, sizeof path, "%s/huge.bin", tmpdir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)CLG_TEXT_MAX_BYTES + 1), 0);
    close(fd);
    expect_refusal(path, T, (const char *const[]){path, "1073741825 bytes", "1 GiB", NULL});
    /* unreadable (root reads anything: then not checked) */
    snprintf(path, sizeof path, "%s/locked.txt", tmpdir);
    free(write_random(path, 4000, &r));
    ck_assert_int_eq(chmod(path, 0), 0);
    if (geteuid() != 0)
        expect_refusal(path, T, (const char *const[]){path, "cannot open", NULL});
    /* bad contexts; text specs outside a model */
    snprintf(path, sizeof path, "%s/short.txt", tmpdir);
    expect_refusal(path, 0, (const char *const[]){path, "context 0", NULL});
    ds = (clg_dataset *)0x1;
    ck_assert_int_ne(clg_dataset_open_in(&err, NULL, "text:/etc/hostname", CLG_SPLIT_TRAIN, &ds), CLG_OK);
    ck_assert_msg(strstr(err.msg, "token ids"), "%s", err.msg);
    ck_assert_ptr_null(ds);
    ck_assert_ptr_null(clg_text_spec_path("fashion-mnist"));
    ck_assert_str_eq(clg_text_spec_path("text:a/b"), "a/b");
    rm_rf(tmpdir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_windows_and_split, test_seeding_resume, test_bad_inputs};
    return tu_run_tests("io_text", 60, tests, 3);
}
