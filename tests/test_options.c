/* The options table (src/core/options.h): every option set through
 * clg_options, through its environment variable at context creation and
 * through the clgrad program's --set gives the same value; refusals name the
 * option and what it accepts; the environment is read only when a context
 * is created. usage: test_options PATH/TO/clgrad */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "device/device.h"
#include "testutil.h"

static const char *g_clgrad;

static void clear_env(void)
{
    for (int i = 0; i < CLG_OPT_COUNT; i++)
        unsetenv(clg_opt_desc_of(i)->env);
}

/* The i-th choice of a comma-separated list into buf. */
static void nth_choice(const char *choices, int k, char *buf, size_t n)
{
    const char *c = choices;
    for (int i = 0; i < k; i++)
        c = strchr(c, ',') + 1;
    size_t l = strchr(c, ',') ? (size_t)(strchr(c, ',') - c) : strlen(c);
    snprintf(buf, n, "%.*s", (int)l, c);
}

/* A valid value other than the default, as the option formats it. */
static void other_value(int id, char *buf, size_t n)
{
    const clg_opt_desc *d = clg_opt_desc_of(id);
    static const struct {
        const char *name, *value;
    } str[] = {{"devices", "0"}, {"cache_dir", "/tmp/clg-opt-test"}, {"kernel_dir", "/tmp/clg-opt-kernels"},
               {"data_dir", "/tmp/clg-opt-data"}, {"model_dir", "/tmp/clg-opt-models"},
               {"wfused_xopts", "-DCLG_OPT_TEST=1"}, {"test_slow_lane", "1:2.5"}};
    switch (d->type) {
    case CLG_OPT_BOOL:
        snprintf(buf, n, "%d", strcmp(d->def, "1") != 0);
        break;
    case CLG_OPT_INT:
        snprintf(buf, n, "%.0f", atof(d->def) == d->hi ? d->lo : d->hi);
        break;
    case CLG_OPT_DOUBLE:
        snprintf(buf, n, "%g", atof(d->def) == d->hi ? d->lo : d->hi);
        break;
    case CLG_OPT_CHOICE: {
        char first[64];
        nth_choice(d->choices, 0, first, sizeof first);
        nth_choice(d->choices, strcmp(first, d->def) == 0 ? 1 : 0, buf, n);
        break;
    }
    case CLG_OPT_STR:
        buf[0] = 0;
        for (size_t i = 0; i < CLG_ARRAY_LEN(str); i++)
            if (strcmp(str[i].name, d->name) == 0)
                snprintf(buf, n, "%s", str[i].value);
        ck_assert_msg(buf[0], "test_options: no test value for string option %s", d->name);
        break;
    }
}

static clg_ctx *create(const clg_options *o)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.options = o;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&p, &ctx);
    if (st == CLG_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: %s\n", clg_last_error(NULL));
        exit(TU_SKIP);
    }
    ck_assert_msg(st == CLG_OK, "clg_ctx_create: %s", clg_last_error(NULL));
    return ctx;
}

static void value_of(const clg_options *o, int id, char *buf, size_t n, clg_option_source *src)
{
    clg_option_info in;
    memset(&in, 0x5a, sizeof in);
    ck_assert_int_eq(clg_option_info_get(o, id, &in), CLG_OK);
    ck_assert_str_eq(in.name, clg_opt_desc_of(id)->name);
    snprintf(buf, n, "%s", in.value);
    if (src)
        *src = in.source;
}

/* What the option changes in a context, beyond its stored value, where that
 * is visible at creation. */
static void check_effect(const clg_ctx *ctx, int id, const char *v)
{
    const char *name = clg_opt_desc_of(id)->name;
    if (strcmp(name, "devices") == 0)
        ck_assert_int_eq(ctx->ndev, 1);
    if (strcmp(name, "cache") == 0)
        ck_assert_int_eq(ctx->use_cache, strcmp(v, "0") != 0);
    if (strcmp(name, "cache_dir") == 0)
        ck_assert_str_eq(ctx->cache_dir, v);
    if (strcmp(name, "kernel_dir") == 0)
        ck_assert_str_eq(ctx->kernel_dir, v);
    if (strcmp(name, "shared_context") == 0 && ctx->ndev > 1 && ctx->devs[0].platform == ctx->devs[1].platform)
        ck_assert_int_eq(ctx->devs[0].cl == ctx->devs[1].cl, v[0] == '1');
    if (strcmp(name, "fp16") == 0 && strcmp(v, "auto") != 0)
        for (int i = 0; i < ctx->ndev; i++)
            ck_assert_int_eq(ctx->devs[i].info.has_fp16, v[0] == '1');
}

/* The value and source `clgrad options` prints for option name, run with
 * the given prefix (environment assignments) and --set arguments. */
static void cli_value(const char *prefix, const char *args, const char *name, char *val, char *src)
{
    char cmd[4096], line[4096];
    snprintf(cmd, sizeof cmd, "%s '%s' options %s", prefix, g_clgrad, args);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    val[0] = src[0] = 0;
    while (fgets(line, sizeof line, f)) {
        char n[128], v[1100], s[64];
        if (line[0] != ' ' && !src[0] && sscanf(line, "%127s %1099s %63s", n, v, s) == 3 && strcmp(n, name) == 0) {
            snprintf(val, 1100, "%s", strcmp(v, "\"\"") == 0 ? "" : v);
            snprintf(src, 64, "%s", s);
        }
    }
    ck_assert_int_eq(pclose(f), 0);
}

START_TEST(every_option_three_ways)
{
    clear_env();
    for (int id = 0; id < CLG_OPT_COUNT; id++) {
        const clg_opt_desc *d = clg_opt_desc_of(id);
        char v[1100], got[1100];
        clg_option_source src;
        other_value(id, v, sizeof v);
        /* the table's default parses, and is what a fresh set holds */
        clg_options *o = NULL;
        ck_assert_int_eq(clg_options_create(&o), CLG_OK);
        value_of(o, id, got, sizeof got, &src);
        ck_assert_str_eq(got, d->def);
        ck_assert_int_eq(src, CLG_OPTION_DEFAULT);
        /* 1. through the struct */
        ck_assert_msg(clg_options_set(o, d->name, v) == CLG_OK, "%s=%s: %s", d->name, v, clg_last_error(NULL));
        clg_ctx *ctx = create(o);
        value_of(clg_ctx_options(ctx), id, got, sizeof got, &src);
        ck_assert_msg(strcmp(got, v) == 0, "%s: set %s, context has %s", d->name, v, got);
        ck_assert_int_eq(src, CLG_OPTION_SET);
        check_effect(ctx, id, v);
        clg_ctx_destroy(ctx);
        clg_options_destroy(o);
        /* 2. through the environment, at creation (test aids: never) */
        setenv(d->env, v, 1);
        ctx = create(NULL);
        value_of(clg_ctx_options(ctx), id, got, sizeof got, &src);
        if (d->kind == CLG_OPT_TEST) {
            ck_assert_str_eq(got, d->def);
            ck_assert_int_eq(src, CLG_OPTION_DEFAULT);
        } else {
            ck_assert_msg(strcmp(got, v) == 0, "%s=%s: context has %s", d->env, v, got);
            ck_assert_int_eq(src, CLG_OPTION_ENV);
            check_effect(ctx, id, v);
        }
        clg_ctx_destroy(ctx);
        unsetenv(d->env);
        /* 3. through the program's --set, and its environment */
        char args[1200], cv[1100], cs[64], prefix[1200];
        snprintf(args, sizeof args, "--set '%s=%s'", d->name, v);
        cli_value("", args, d->name, cv, cs);
        ck_assert_msg(strcmp(cv, v) == 0, "clgrad --set %s=%s shows %s", d->name, v, cv);
        ck_assert_str_eq(cs, "flag");
        snprintf(prefix, sizeof prefix, "%s='%s'", d->env, v);
        cli_value(prefix, "", d->name, cv, cs);
        ck_assert_str_eq(cv, d->kind == CLG_OPT_TEST ? d->def : v);
        ck_assert_str_eq(cs, d->kind == CLG_OPT_TEST ? "default" : "environment");
    }
}
END_TEST

/* A refused value leaves the option as it was; the message names the option
 * and, for a choice, the choices. */
static void refused(clg_options *o, int id, const char *bad, const char *want)
{
    const clg_opt_desc *d = clg_opt_desc_of(id);
    char before[1100], after[1100];
    value_of(o, id, before, sizeof before, NULL);
    ck_assert_msg(clg_options_set(o, d->name, bad) == CLG_ERR_INVALID_ARG, "%s accepted '%s'", d->name, bad);
    char head[200];
    snprintf(head, sizeof head, "option %s: '%s'", d->name, bad);
    ck_assert_msg(strstr(clg_last_error(NULL), head), "message '%s' lacks '%s'", clg_last_error(NULL), head);
    ck_assert_msg(strstr(clg_last_error(NULL), want), "message '%s' lacks '%s'", clg_last_error(NULL), want);
    value_of(o, id, after, sizeof after, NULL);
    ck_assert_str_eq(before, after);
}

START_TEST(bad_values_refused)
{
    clg_options *o = NULL;
    ck_assert_int_eq(clg_options_create(&o), CLG_OK);
    ck_assert_int_eq(clg_options_set(o, "no_such_option", "1"), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(NULL), "no_such_option"));
    ck_assert_int_eq(clg_options_set(o, "gemm_backend", NULL), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_options_set(NULL, "gemm_backend", "own"), CLG_ERR_INVALID_ARG);
    refused(o, CLG_OPT_ID_gemm_backend, "foo", "is not one of auto, own, clblast, ref");
    char big[CLG_OPT_STR_MAX + 8];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    for (int id = 0; id < CLG_OPT_COUNT; id++) {
        const clg_opt_desc *d = clg_opt_desc_of(id);
        char v[64], list[256];
        switch (d->type) {
        case CLG_OPT_BOOL:
            refused(o, id, "maybe", "not a boolean");
            refused(o, id, "", "not a boolean");
            break;
        case CLG_OPT_INT:
            refused(o, id, "12x", "not an integer");
            refused(o, id, "", "not an integer");
            snprintf(v, sizeof v, "%.0f", d->lo - 1);
            refused(o, id, v, "out of range");
            snprintf(v, sizeof v, "%.0f", d->hi + 1);
            refused(o, id, v, "out of range");
            break;
        case CLG_OPT_DOUBLE:
            refused(o, id, "x", "not a number");
            refused(o, id, "nan", "not a number");
            snprintf(v, sizeof v, "%g", d->hi * 2 + 1);
            refused(o, id, v, "out of range");
            snprintf(v, sizeof v, "%g", d->lo - 1);
            refused(o, id, v, "out of range");
            break;
        case CLG_OPT_CHOICE:
            snprintf(list, sizeof list, "is not one of ");
            for (const char *c = d->choices; *c; c++) {
                size_t l = strlen(list);
                if (*c == ',')
                    snprintf(list + l, sizeof list - l, ", ");
                else
                    snprintf(list + l, sizeof list - l, "%c", *c);
            }
            refused(o, id, "bogus", list);
            break;
        case CLG_OPT_STR:
            refused(o, id, big, "longer than");
            break;
        }
    }
    clg_options_destroy(o);
    /* a bad environment value fails the context, naming the variable and the option */
    clear_env();
    setenv("CLGRAD_WFUSED_NT", "9", 1);
    clg_ctx *ctx = NULL;
    ck_assert_int_eq(clg_ctx_create(NULL, &ctx), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clg_last_error(NULL), "CLGRAD_WFUSED_NT"));
    ck_assert_ptr_nonnull(strstr(clg_last_error(NULL), "option wfused_nt: '9' is out of range 1..4"));
    unsetenv("CLGRAD_WFUSED_NT");
    /* ... and the program's --set is a usage error naming it */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' --set wfused_nt=9 options 2>&1 | grep -q \"option wfused_nt: '9'\"", g_clgrad);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' options --set nope=1 >/dev/null 2>&1", g_clgrad);
    int rc = system(cmd);
    ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
}
END_TEST

START_TEST(environment_read_at_creation_only)
{
    clear_env();
    setenv("CLGRAD_CONV_AUTO_DEFER", "7", 1);
    clg_options *o = NULL;
    ck_assert_int_eq(clg_options_create(&o), CLG_OK);
    ck_assert_int_eq(clg_options_set(o, "gemm_unpacked", "0"), CLG_OK);
    setenv("CLGRAD_GEMM_UNPACKED", "1", 1); /* set explicitly: the variable loses */
    clg_ctx *ctx = create(o);
    clg_options_destroy(o); /* the context keeps its own copy */
    ck_assert_int_eq(ctx->opts.conv_auto_defer, 7);
    ck_assert_int_eq(ctx->opts.gemm_unpacked, 1); /* auto,0,1: "0" */
    setenv("CLGRAD_CONV_AUTO_DEFER", "9", 1);
    setenv("CLGRAD_CONV_LEGACY", "1", 1);
    ck_assert_int_eq(ctx->opts.conv_auto_defer, 7);
    ck_assert_int_eq(ctx->opts.conv_legacy, 0);
    char v[64];
    value_of(clg_ctx_options(ctx), CLG_OPT_ID_conv_auto_defer, v, sizeof v, NULL);
    ck_assert_str_eq(v, "7");
    /* the internal setter changes a live context */
    ck_assert_int_eq(clg_ctx_option_set(ctx, "conv_legacy", "1"), CLG_OK);
    ck_assert_int_eq(ctx->opts.conv_legacy, 1);
    ck_assert_int_eq(clg_ctx_option_set(ctx, "conv_legacy", "2"), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "option conv_legacy"));
    clg_ctx_destroy(ctx);
    clear_env();
}
END_TEST

START_TEST(info_sized_and_bounded)
{
    ck_assert_int_eq(clg_options_count(), CLG_OPT_COUNT);
    clg_option_info in;
    ck_assert_int_eq(clg_option_info_get(NULL, -1, &in), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_option_info_get(NULL, CLG_OPT_COUNT, &in), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_option_info_get_size(NULL, 0, NULL, sizeof in), CLG_ERR_INVALID_ARG);
    /* an older, shorter struct: nothing is written past its size */
    unsigned char buf[sizeof in];
    memset(buf, 0xa5, sizeof buf);
    size_t small = offsetof(clg_option_info, env);
    ck_assert_int_eq(clg_option_info_get_size(NULL, 0, (clg_option_info *)(void *)buf, small), CLG_OK);
    for (size_t i = small; i < sizeof buf; i++)
        ck_assert_int_eq(buf[i], 0xa5);
    ck_assert_str_eq(((clg_option_info *)(void *)buf)->name, clg_opt_desc_of(0)->name);
    /* names are unique, variables are CLGRAD_ + the name in capitals */
    for (int i = 0; i < CLG_OPT_COUNT; i++) {
        const clg_opt_desc *d = clg_opt_desc_of(i);
        ck_assert_int_eq(clg_opt_find(d->name), i);
        char env[128] = "CLGRAD_";
        for (size_t k = 0; d->name[k]; k++)
            env[7 + k] = (char)(d->name[k] >= 'a' && d->name[k] <= 'z' ? d->name[k] - 32 : d->name[k]);
        ck_assert_str_eq(d->env, env);
        ck_assert(d->doc[0]);
    }
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_options PATH/TO/clgrad\n");
        return 1;
    }
    g_clgrad = argv[1];
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, info_sized_and_bounded);
    tcase_add_test(tc, bad_values_refused);
    tcase_add_test(tc, environment_read_at_creation_only);
    tcase_add_test(tc, every_option_three_ways);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
