/* Model-file parser: syntax, typed accessors and error messages with lines. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/cfg.h"
#include "testutil.h"

/* Parses text expecting failure; checks the status and that the message
 * contains each needle (NULL-terminated list). */
static void expect_parse_error(const char *text, clg_status want, const char *n1, const char *n2)
{
    clg_err err = {0};
    clg_cfg *cfg = (clg_cfg *)0x1;
    clg_status st = clg_cfg_parse(&err, text, "t.cfg", &cfg);
    ck_assert_msg(st == want, "status %s for text <<%s>> (msg: %s)", clg_status_name(st), text, err.msg);
    ck_assert_ptr_null(cfg);
    ck_assert_msg(strstr(err.msg, n1) != NULL, "message '%s' lacks '%s'", err.msg, n1);
    if (n2)
        ck_assert_msg(strstr(err.msg, n2) != NULL, "message '%s' lacks '%s'", err.msg, n2);
}

START_TEST(test_parse_basic)
{
    const char *text = "# a model\r\n"
                       "[net]\r\n"
                       "batch = 64   # comment\n"
                       "\n"
                       "  [Convolutional]  \n"
                       "filters=32\n"
                       "activation = relu ; another comment\n"
                       "size\t=\t3\n";
    clg_err err = {0};
    clg_cfg *cfg = NULL;
    ck_assert_int_eq(clg_cfg_parse(&err, text, "m.cfg", &cfg), CLG_OK);
    ck_assert_str_eq(cfg->source_name, "m.cfg");
    ck_assert_int_eq(cfg->nsec, 2);
    ck_assert_str_eq(cfg->sec[0].name, "net");
    ck_assert_int_eq(cfg->sec[0].line, 2);
    ck_assert_int_eq(cfg->sec[0].nkv, 1);
    ck_assert_str_eq(cfg->sec[0].kv[0].key, "batch");
    ck_assert_str_eq(cfg->sec[0].kv[0].value, "64");
    ck_assert_int_eq(cfg->sec[0].kv[0].line, 3);
    ck_assert_str_eq(cfg->sec[1].name, "convolutional");
    ck_assert_int_eq(cfg->sec[1].line, 5);
    ck_assert_int_eq(cfg->sec[1].nkv, 3);
    ck_assert_str_eq(cfg->sec[1].kv[1].value, "relu");
    ck_assert_int_eq(cfg->sec[1].kv[2].line, 8);
    ck_assert_str_eq(cfg->sec[1].kv[2].key, "size");
    ck_assert_str_eq(cfg->sec[1].kv[2].value, "3");
    long v;
    ck_assert_int_eq(clg_cfg_int(&err, cfg, &cfg->sec[1], "filters", 1, 1, 1024, &v), CLG_OK);
    ck_assert_int_eq(v, 32);
    ck_assert_int_eq(clg_cfg_int(&err, cfg, &cfg->sec[1], "stride", 7, 1, 1024, &v), CLG_OK);
    ck_assert_int_eq(v, 7);
    ck_assert_ptr_nonnull(clg_cfg_find(&cfg->sec[1], "size"));
    ck_assert_ptr_null(clg_cfg_find(&cfg->sec[1], "stride"));
    clg_cfg_free(cfg);
    clg_cfg_free(NULL);
}
END_TEST

START_TEST(test_parse_errors)
{
    expect_parse_error("[net]\nbatch 64\n", CLG_ERR_FORMAT, "t.cfg:2:", "expected 'key = value'");
    expect_parse_error("# c\nbatch = 64\n[net]\n", CLG_ERR_FORMAT, "t.cfg:2:", "before any section");
    expect_parse_error("[net]\nbatch = 1\n\nbatch = 2\n", CLG_ERR_FORMAT, "t.cfg:4:", "duplicate key 'batch'");
    expect_parse_error("[net]\nbatch = 1\n\nbatch = 2\n", CLG_ERR_FORMAT, "line 2", NULL);
    expect_parse_error("[net]\nbatch =   \n", CLG_ERR_FORMAT, "t.cfg:2:", "empty value");
    expect_parse_error("[net]\n\n[conv\n", CLG_ERR_FORMAT, "t.cfg:3:", "closing ']'");
    expect_parse_error("[net] x\n", CLG_ERR_FORMAT, "t.cfg:1:", "after section header");
    expect_parse_error("[ ]\n", CLG_ERR_FORMAT, "t.cfg:1:", "empty section name");
    expect_parse_error("[net]\n= 5\n", CLG_ERR_FORMAT, "t.cfg:2:", "missing key");
    expect_parse_error("[net]\nba tch = 5\n", CLG_ERR_FORMAT, "t.cfg:2:", "invalid character");
    expect_parse_error("# only a comment\n\n", CLG_ERR_FORMAT, "t.cfg", "no sections");
    expect_parse_error("", CLG_ERR_FORMAT, "no sections", NULL);
}
END_TEST

static clg_cfg *parse_ok(const char *text)
{
    clg_err err = {0};
    clg_cfg *cfg = NULL;
    clg_status st = clg_cfg_parse(&err, text, "a.cfg", &cfg);
    ck_assert_msg(st == CLG_OK, "parse failed: %s", err.msg);
    return cfg;
}

START_TEST(test_accessor_errors)
{
    clg_cfg *cfg = parse_ok("[net]\n"            /* 1 */
                            "a = 3x\n"           /* 2 */
                            "b = 100\n"          /* 3 */
                            "c = 1.5e\n"         /* 4 */
                            "d = nan\n"          /* 5 */
                            "e = 2.5\n"          /* 6 */
                            "f = tanh\n"         /* 7 */
                            "g = relu\n"         /* 8 */
                            "h = 12\n"           /* 9 */
                            "typo = 1\n");       /* 10 */
    clg_err err = {0};
    clg_cfg_section *s = &cfg->sec[0];
    long l;
    double d;
    const char *str;
    int idx;
    ck_assert_int_eq(clg_cfg_int(&err, cfg, s, "a", 0, 0, 10, &l), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:2:") && strstr(err.msg, "'a'") && strstr(err.msg, "'3x'"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_int(&err, cfg, s, "b", 0, 0, 10, &l), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:3:") && strstr(err.msg, "[0, 10]"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_float(&err, cfg, s, "c", 0, 0, 10, &d), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:4:") && strstr(err.msg, "'1.5e'"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_float(&err, cfg, s, "d", 0, -1e30, 1e30, &d), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:5:"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_float(&err, cfg, s, "e", 0, 0, 10, &d), CLG_OK);
    ck_assert(d == 2.5);
    ck_assert_int_eq(clg_cfg_float(&err, cfg, s, "e", 0, 0, 1, &d), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:6:") && strstr(err.msg, "outside"), "%s", err.msg);
    static const char *const acts[] = {"linear", "relu", "leaky", NULL};
    ck_assert_int_eq(clg_cfg_enum(&err, cfg, s, "f", "linear", acts, &idx), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:7:") && strstr(err.msg, "'tanh'") && strstr(err.msg, "linear, relu, leaky"),
                  "%s", err.msg);
    ck_assert_int_eq(clg_cfg_enum(&err, cfg, s, "g", "linear", acts, &idx), CLG_OK);
    ck_assert_int_eq(idx, 1);
    ck_assert_int_eq(clg_cfg_enum(&err, cfg, s, "missing", "leaky", acts, &idx), CLG_OK);
    ck_assert_int_eq(idx, 2);
    ck_assert_int_eq(clg_cfg_str(&err, cfg, s, "req", NULL, &str), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:1:") && strstr(err.msg, "required key 'req'"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_str(&err, cfg, s, "opt", "dflt", &str), CLG_OK);
    ck_assert_str_eq(str, "dflt");
    ck_assert_int_eq(clg_cfg_int(&err, cfg, s, "h", 0, 0, 100, &l), CLG_OK);
    ck_assert_int_eq(l, 12);
    ck_assert_int_eq(clg_cfg_check_unused(&err, cfg, s), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "a.cfg:10:") && strstr(err.msg, "unknown key 'typo'"), "%s", err.msg);
    ck_assert_int_eq(clg_cfg_int(&err, cfg, s, "typo", 0, 0, 100, &l), CLG_OK);
    ck_assert_int_eq(clg_cfg_check_unused(&err, cfg, s), CLG_OK);
    clg_cfg_free(cfg);
}
END_TEST

/* Random valid files: every value reads back with the right line. */
START_TEST(test_random_roundtrip)
{
    clg_rng r;
    tu_rng(&r, 11);
    for (int iter = 0; iter < 20; iter++) {
        clg_sbuf b = {0};
        int nsec = 1 + (int)(clg_rng_u32(&r) % 6);
        int nkv[6];
        long vals[6][8];
        int lines[6][8];
        int line = 1;
        for (int s = 0; s < nsec; s++) {
            if (clg_rng_u32(&r) % 2) {
                clg_sbuf_printf(&b, "# comment %u\n", clg_rng_u32(&r));
                line++;
            }
            clg_sbuf_printf(&b, "[sec%d]\n", s);
            line++;
            nkv[s] = (int)(clg_rng_u32(&r) % 8);
            for (int k = 0; k < nkv[s]; k++) {
                vals[s][k] = (long)(clg_rng_u32(&r) % 200001) - 100000;
                const char *sp = (clg_rng_u32(&r) % 2) ? " " : "";
                clg_sbuf_printf(&b, "%sk%d%s=%s%ld%s\n", sp, k, sp, sp, vals[s][k], sp);
                lines[s][k] = line++;
                if (clg_rng_u32(&r) % 3 == 0) {
                    clg_sbuf_printf(&b, "\n");
                    line++;
                }
            }
        }
        ck_assert(!b.oom);
        clg_cfg *cfg = parse_ok(b.data);
        ck_assert_int_eq(cfg->nsec, nsec);
        clg_err err;
        for (int s = 0; s < nsec; s++) {
            ck_assert_int_eq(cfg->sec[s].nkv, nkv[s]);
            for (int k = 0; k < nkv[s]; k++) {
                char key[16];
                snprintf(key, sizeof key, "k%d", k);
                long v;
                ck_assert_int_eq(clg_cfg_int(&err, cfg, &cfg->sec[s], key, 0, -100000, 100000, &v), CLG_OK);
                ck_assert_int_eq(v, vals[s][k]);
                ck_assert_int_eq(clg_cfg_find(&cfg->sec[s], key)->line, lines[s][k]);
            }
            ck_assert_int_eq(clg_cfg_check_unused(&err, cfg, &cfg->sec[s]), CLG_OK);
        }
        clg_cfg_free(cfg);
        clg_sbuf_free(&b);
    }
}
END_TEST

START_TEST(test_load_file)
{
    char dir[] = "/tmp/clgrad-cfg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/m.cfg", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("[net]\nwidth = 28\n[dense]\nunits 10\n", f);
    fclose(f);
    clg_err err = {0};
    clg_cfg *cfg = NULL;
    ck_assert_int_eq(clg_cfg_load(&err, path, &cfg), CLG_ERR_FORMAT);
    char want[300];
    snprintf(want, sizeof want, "%s:4:", path);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    unlink(path);
    ck_assert_int_eq(clg_cfg_load(&err, path, &cfg), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(err.msg, path), "%s", err.msg);
    rmdir(dir);
}
END_TEST

/* Garbage never crashes: it parses or fails with a message naming the line. */
START_TEST(test_fuzz)
{
    clg_rng r;
    tu_rng(&r, 12);
    const char alphabet[] = "[]=#;ab_ -.\n\t\r01\x01\xff";
    char text[200];
    for (int it = 0; it < 3000; it++) {
        int n = (int)(clg_rng_u32(&r) % (sizeof text - 1));
        for (int i = 0; i < n; i++)
            text[i] = alphabet[clg_rng_u32(&r) % (sizeof alphabet - 1)];
        text[n] = 0;
        clg_err err = {0};
        clg_cfg *cfg = NULL;
        clg_status st = clg_cfg_parse(&err, text, "f.cfg", &cfg);
        if (st == CLG_OK) {
            ck_assert(cfg->nsec > 0);
            for (int i = 0; i < cfg->nsec; i++)
                for (int k = 0; k < cfg->sec[i].nkv; k++)
                    ck_assert(cfg->sec[i].kv[k].value[0] != 0 && cfg->sec[i].kv[k].line >= cfg->sec[i].line);
            clg_cfg_free(cfg);
        } else {
            ck_assert_int_eq(st, CLG_ERR_FORMAT);
            ck_assert_ptr_null(cfg);
            ck_assert_msg(strncmp(err.msg, "f.cfg", 5) == 0, "%s", err.msg);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cfg");
    TCase *tc = tcase_create("cfg");
    tcase_add_test(tc, test_parse_basic);
    tcase_add_test(tc, test_parse_errors);
    tcase_add_test(tc, test_accessor_errors);
    tcase_add_test(tc, test_random_roundtrip);
    tcase_add_test(tc, test_load_file);
    tcase_add_test(tc, test_fuzz);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
