/* core: status table, hashing, CRC, atomic files, RNG, JSON string builder. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static const clg_status all_codes[] = {
#define X(name, code, msg) CLG_##name,
    CLG_STATUS_MAP(X)
#undef X
};

START_TEST(status_table)
{
    for (size_t i = 0; i < CLG_ARRAY_LEN(all_codes); i++) {
        ck_assert_str_ne(clg_status_string(all_codes[i]), "unknown status");
        ck_assert_str_ne(clg_status_name(all_codes[i]), "UNKNOWN");
        if (all_codes[i] != CLG_OK)
            ck_assert_int_lt(all_codes[i], 0);
        for (size_t j = 0; j < i; j++)
            ck_assert_int_ne(all_codes[i], all_codes[j]);
    }
    ck_assert_str_eq(clg_status_string((clg_status)12345), "unknown status");
    ck_assert_str_eq(clg_status_name(CLG_ERR_IO), "ERR_IO");
}
END_TEST

START_TEST(version)
{
    ck_assert_uint_eq(clg_version(), CLG_VERSION_HEX);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", CLG_VERSION_MAJOR, CLG_VERSION_MINOR, CLG_VERSION_PATCH);
    ck_assert_str_eq(clg_version_string(), buf);
}
END_TEST

START_TEST(error_buffers)
{
    clg_err e;
    ck_assert_int_eq(clg_err_set(&e, CLG_ERR_FORMAT, "line %d: %s", 7, "bad"), CLG_ERR_FORMAT);
    ck_assert_str_eq(e.msg, "line 7: bad");
    ck_assert_int_eq(clg_err_set(NULL, CLG_ERR_IO, "thread-local %d", 1), CLG_ERR_IO);
    ck_assert_str_eq(clg_last_error(NULL), "thread-local 1");
    /* a message built from its own buffer must survive */
    clg_err_set(&e, CLG_ERR_IO, "outer: %s", e.msg);
    ck_assert_str_eq(e.msg, "outer: line 7: bad");
}
END_TEST

START_TEST(hash_and_crc)
{
    ck_assert_uint_ne(clg_hash_str("ab", clg_hash_str("c", CLG_HASH_SEED)),
                      clg_hash_str("a", clg_hash_str("bc", CLG_HASH_SEED)));
    ck_assert_uint_eq(clg_hash_str("gemm", CLG_HASH_SEED), clg_hash_str("gemm", CLG_HASH_SEED));
    /* CRC-32/ISO-HDLC check value */
    ck_assert_uint_eq(clg_crc32(0, "123456789", 9), 0xCBF43926u);
    /* incremental == one shot, on fresh random bytes */
    clg_rng r;
    tu_rng(&r, 1);
    unsigned char buf[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)clg_rng_u32(&r);
    uint32_t one = clg_crc32(0, buf, sizeof buf);
    uint32_t two = clg_crc32(clg_crc32(0, buf, 333), buf + 333, sizeof buf - 333);
    ck_assert_uint_eq(one, two);
    buf[500] ^= 1;
    ck_assert_uint_ne(one, clg_crc32(0, buf, sizeof buf));
}
END_TEST

START_TEST(atomic_write)
{
    char dir[] = "/tmp/clg_core_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    clg_err e;
    ck_assert_int_eq(clg_file_write_atomic(&e, path, "first", 5), CLG_OK);
    ck_assert_int_eq(clg_file_write_atomic(&e, path, "second!", 7), CLG_OK);
    char *data = NULL;
    size_t len = 0;
    ck_assert_int_eq(clg_file_read(&e, path, &data, &len), CLG_OK);
    ck_assert_uint_eq(len, 7);
    ck_assert_str_eq(data, "second!");
    free(data);
    /* a write that cannot happen leaves nothing behind and says why */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/f.bin/child", dir);
    ck_assert_int_eq(clg_file_write_atomic(&e, bad, "x", 1), CLG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "child"));
    ck_assert_int_eq(clg_file_read(&e, path, &data, &len), CLG_OK);
    ck_assert_str_eq(data, "second!");
    free(data);
    ck_assert_int_eq(clg_file_read(&e, "/nonexistent/zzz", &data, &len), CLG_ERR_NOT_FOUND);
    ck_assert_ptr_null(data);
    /* mkdirs: nested, idempotent, fails on a file */
    char nested[300];
    snprintf(nested, sizeof nested, "%s/a/b/c", dir);
    ck_assert_int_eq(clg_mkdirs(&e, nested), CLG_OK);
    ck_assert_int_eq(clg_mkdirs(&e, nested), CLG_OK);
    ck_assert_int_eq(clg_mkdirs(&e, bad), CLG_ERR_IO);
    unlink(path);
    rmdir(nested);
    snprintf(nested, sizeof nested, "%s/a/b", dir);
    rmdir(nested);
    snprintf(nested, sizeof nested, "%s/a", dir);
    rmdir(nested);
    rmdir(dir);
}
END_TEST

START_TEST(rng_stats)
{
    clg_rng r;
    tu_rng(&r, 2);
    const int n = 200000;
    double s = 0, s2 = 0, u = 0;
    float umin = 1, umax = 0;
    for (int i = 0; i < n; i++) {
        double x = clg_rng_normal(&r);
        s += x;
        s2 += x * x;
        float v = clg_rng_uniform(&r);
        u += v;
        umin = fminf(umin, v);
        umax = fmaxf(umax, v);
    }
    ck_assert_double_lt(fabs(s / n), 0.02);
    ck_assert_double_lt(fabs(s2 / n - 1.0), 0.03);
    ck_assert_double_lt(fabs(u / n - 0.5), 0.01);
    ck_assert(umin >= 0.0f && umax < 1.0f);
    /* same seed and stream -> same sequence; other stream -> different */
    clg_rng a, b, c;
    clg_rng_seed(&a, 99, 1);
    clg_rng_seed(&b, 99, 1);
    clg_rng_seed(&c, 99, 2);
    int differ = 0;
    for (int i = 0; i < 16; i++) {
        uint32_t x = clg_rng_u32(&a);
        ck_assert_uint_eq(x, clg_rng_u32(&b));
        differ |= x != clg_rng_u32(&c);
    }
    ck_assert(differ);
}
END_TEST

START_TEST(sbuf_json)
{
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "{\"k\":");
    clg_sbuf_json_str(&b, "a\"b\\c\n");
    for (int i = 0; i < 1000; i++)
        clg_sbuf_printf(&b, ",%d", i);
    clg_sbuf_printf(&b, "}");
    ck_assert(!b.oom);
    ck_assert(strncmp(b.data, "{\"k\":\"a\\\"b\\\\c\\u000a\",0,1,2", 26) == 0);
    ck_assert_uint_eq(strlen(b.data), b.len);
    clg_sbuf_free(&b);
}
END_TEST

/* A directory, a FIFO (without a writer) and a text file with a NUL are
 * refused with messages that say what they are; none blocks. */
START_TEST(file_read_refuses)
{
    char dir[] = "/tmp/clg_core_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    clg_err e;
    char *data = NULL;
    size_t len = 0;
    ck_assert_int_eq(clg_file_read(&e, dir, &data, &len), CLG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "a directory"));
    ck_assert_ptr_null(strstr(e.msg, "no memory"));
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(clg_file_read(&e, fifo, &data, &len), CLG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "FIFO"));
    /* NUL at a random offset: reported with that offset */
    char txt[300];
    snprintf(txt, sizeof txt, "%s/m.cfg", dir);
    char body[64];
    memset(body, 'a', sizeof body);
    size_t at = (size_t)(rand() % 60) + 1;
    body[at] = 0;
    ck_assert_int_eq(clg_file_write_atomic(&e, txt, body, sizeof body), CLG_OK);
    ck_assert_int_eq(clg_file_read(&e, txt, &data, &len), CLG_OK);
    ck_assert_uint_eq(len, sizeof body);
    free(data);
    ck_assert_int_eq(clg_file_read_text(&e, txt, &data, &len), CLG_ERR_FORMAT);
    ck_assert_ptr_null(data);
    char want[340];
    snprintf(want, sizeof want, "%s:offset %zu", txt, at);
    ck_assert_msg(strstr(e.msg, want), "'%s' lacks '%s'", e.msg, want);
    unlink(txt);
    unlink(fifo);
    rmdir(dir);
}
END_TEST

static void touch_old(const char *path, const char *body)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(body, f);
    fclose(f);
    struct timespec t[2] = {{1000000000, 0}, {1000000000, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* Temporary files left by a killed writer of NAME are removed by the next
 * write of NAME; look-alikes of other names or patterns are kept. */
START_TEST(atomic_write_sweeps_stale_temps)
{
    char dir[] = "/tmp/clg_core_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const char *stale[] = {"ck.bin.tmp.aB3xY9", "ck.bin.tmp.000000"};
    const char *keep[] = {"ck.bin.tmp.abc", "ck.bin.tmp.abcdefg", "xck.bin.tmp.abcdef", "other.tmp.abcdef",
                          "ck.bin.tmp.ab-def"};
    char p[400];
    for (size_t i = 0; i < CLG_ARRAY_LEN(stale); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, stale[i]);
        touch_old(p, "old");
    }
    for (size_t i = 0; i < CLG_ARRAY_LEN(keep); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, keep[i]);
        touch_old(p, "keep");
    }
    clg_err e;
    snprintf(p, sizeof p, "%s/ck.bin", dir);
    ck_assert_int_eq(clg_file_write_atomic(&e, p, "new", 3), CLG_OK);
    for (size_t i = 0; i < CLG_ARRAY_LEN(stale); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, stale[i]);
        ck_assert_msg(access(p, F_OK) != 0, "%s was not removed", stale[i]);
    }
    for (size_t i = 0; i < CLG_ARRAY_LEN(keep); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, keep[i]);
        ck_assert_msg(access(p, F_OK) == 0, "%s was removed", keep[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/ck.bin", dir);
    unlink(p);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, status_table);
    tcase_add_test(tc, version);
    tcase_add_test(tc, error_buffers);
    tcase_add_test(tc, hash_and_crc);
    tcase_add_test(tc, atomic_write);
    tcase_add_test(tc, file_read_refuses);
    tcase_add_test(tc, atomic_write_sweeps_stale_temps);
    tcase_add_test(tc, rng_stats);
    tcase_add_test(tc, sbuf_json);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
