/* Resume on a cold convolution-algorithm cache: a small convolutional
 * model trains N steps in one run, and k steps, then the rest resumed from
 * the checkpoint "in a new process" (the process's algorithm tables
 * dropped, clg_conv_auto_forget), each run starting on an empty cache
 * directory, with the automatic choice measuring and deferring as the
 * clgrad program does (conv_auto_defer = 1: a new shape runs the default
 * at its first use and is measured at its second). The weights must agree
 * bitwise:
 *  - stopped after step 1, while every shape still waits for its
 *    measurement (the resumed run must measure at the same use);
 *  - stopped after step 3 and resumed on a cache file that names other
 *    algorithms than those measured (the checkpoint's choices win).
 * The measurement's timer is replaced by a fixed ranking (the default
 * algorithm slowest), so every run measures the same winners and they
 * differ from the defaults. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "ops/conv_impl.h"
#include "testutil.h"

static const char *MODEL = "[net]\n"
                           "channels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 16\n"
                           "learning_rate = 0.05\nmomentum = 0.9\n"
                           "[convolutional]\nname = c1\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                           "[convolutional]\nname = c2\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                           "[dense]\nname = fc\nunits = 4\n"
                           "[softmax]\nname = loss\n";

static char g_dir[256];
static int g_timed; /* candidates timed by the fake timer */

/* The default slowest, then by algorithm id: the winner is never the default where another can run. */
static double fake_ms(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass)
{
    g_timed++;
    return algo == clg_conv_algo_default(dev, s, pass) ? 100.0 : 1.0 + (double)algo;
}

static void write_dataset(const char *dir, int n)
{
    clg_rng rng;
    tu_rng(&rng, 7);
    uint8_t *img = malloc((size_t)n * 64), *lab = malloc((size_t)n);
    ck_assert(img && lab);
    for (int i = 0; i < n; i++) {
        int cls = (int)(clg_rng_u32(&rng) % 4);
        lab[i] = (uint8_t)cls;
        for (int j = 0; j < 64; j++) /* the class's quadrant brighter */
            img[i * 64 + j] = (uint8_t)((clg_rng_u32(&rng) % 96) + (((j / 8) / 4) * 2 + (j % 8) / 4 == cls ? 128 : 0));
    }
    clg_err err = {0};
    int dims[3] = {n, 8, 8};
    const char *split[2] = {"train", "t10k"};
    char p[600];
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, split[s]);
        ck_assert_msg(clg_idx_write_u8(&err, p, 0, dims, 3, img) == CLG_OK, "%s", err.msg);
        snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, split[s]);
        ck_assert_msg(clg_idx_write_u8(&err, p, 0, dims, 1, lab) == CLG_OK, "%s", err.msg);
    }
    free(img);
    free(lab);
}

/* A context on device 0 with the cache directory dir/cache-NAME, measuring
 * and deferring like the clgrad program, the GEMM backend not timed. */
static clg_ctx *ctx_on(const char *name)
{
    char cache[400];
    snprintf(cache, sizeof cache, "%s/cache-%s", g_dir, name);
    clg_options *o = NULL;
    ck_assert(clg_options_create(&o) == CLG_OK);
    ck_assert(clg_options_set(o, "conv_auto_measure", "1") == CLG_OK);
    ck_assert(clg_options_set(o, "conv_auto_defer", "1") == CLG_OK);
    ck_assert(clg_options_set(o, "gemm_auto_measure", "0") == CLG_OK);
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = "0";
    p.cache_dir = cache;
    p.options = o;
    clg_ctx *c = NULL;
    clg_status st = clg_ctx_create(&p, &c);
    clg_options_destroy(o);
    if (st == CLG_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: %s\n", clg_last_error(NULL));
        exit(TU_SKIP);
    }
    ck_assert_msg(st == CLG_OK, "%s", clg_last_error(NULL));
    return c;
}

/* One run "in a new process": the algorithm tables dropped first. */
static void run(const char *cache, const char *ckdir, int64_t steps, int resume, const char *save)
{
    clg_conv_auto_forget();
    clg_ctx *c = ctx_on(cache);
    char model[300], data[300], ck[300], w[300];
    snprintf(model, sizeof model, "%s/conv.cfg", g_dir);
    snprintf(data, sizeof data, "%s/data", g_dir);
    snprintf(ck, sizeof ck, "%s/%s", g_dir, ckdir);
    snprintf(w, sizeof w, "%s/%s", g_dir, save ? save : "");
    clg_train_params p;
    clg_train_params_init(&p);
    p.model = model;
    p.data = data;
    p.devices = "all";
    p.epochs = 3;
    p.seed = 11;
    p.limit_test = 16;
    p.max_steps = steps;
    p.checkpoint_dir = ck;
    p.resume = resume;
    p.save_weights = save ? w : NULL;
    clg_train_report rep;
    ck_assert_msg(clg_train_run(c, &p, &rep) == CLG_OK, "%s", clg_last_error(c));
    ck_assert_int_eq(rep.steps, steps);
    clg_ctx_destroy(c);
}

static void compare_weights(const char *a, const char *b)
{
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/%s", g_dir, a);
    snprintf(pb, sizeof pb, "%s/%s", g_dir, b);
    clg_err err = {0};
    clg_ckpt *ca = NULL, *cb = NULL;
    ck_assert_msg(clg_ckpt_load(&err, pa, &ca) == CLG_OK, "%s", err.msg);
    ck_assert_msg(clg_ckpt_load(&err, pb, &cb) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(ca->nt, cb->nt);
    ck_assert_int_gt(ca->nt, 0);
    for (int i = 0; i < ca->nt; i++) {
        const clg_ckpt_tensor *tb = clg_ckpt_find(cb, ca->t[i].name);
        ck_assert_ptr_nonnull(tb);
        ck_assert_uint_eq(ca->t[i].nbytes, tb->nbytes);
        ck_assert_msg(memcmp(ca->t[i].data, tb->data, tb->nbytes) == 0, "%s and %s: tensor %s differs", a, b,
                      ca->t[i].name);
    }
    clg_ckpt_free(ca);
    clg_ckpt_free(cb);
}

/* Rewrites every "algo" of the cache directory's algorithm file to "direct"
 * (the fake timer never makes it the winner: its id is above im2col's and
 * winograd's); returns the entries rewritten. */
static int falsify_cache(const char *cache)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd,
             "f=$(ls %s/cache-%s/conv-algos-*.json) && sed -i 's/\"algo\": \"[a-z0-9-]*\"/\"algo\": \"direct\"/' "
             "\"$f\" && grep -c '\"algo\": \"direct\"' \"$f\"",
             g_dir, cache);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0;
    if (fscanf(f, "%d", &n) != 1)
        n = 0;
    pclose(f);
    return n;
}

START_TEST(cold_cache_resume)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/clgrad-conv-resume-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    char p[400];
    snprintf(p, sizeof p, "%s/data", g_dir);
    clg_err err = {0};
    ck_assert(clg_mkdirs(&err, p) == CLG_OK);
    write_dataset(p, 64); /* batch 16: 4 steps an epoch */
    snprintf(p, sizeof p, "%s/conv.cfg", g_dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(MODEL, f);
    fclose(f);
    clg_conv_auto_set_timer(fake_ms);

    run("a", "ck-a", 7, 0, "a.safetensors"); /* uninterrupted, cold */
    ck_assert_msg(g_timed > 0, "nothing was measured: the test is blind");
    /* the checkpoint carries the choices */
    snprintf(p, sizeof p, "%s/ck-a/last.safetensors", g_dir);
    clg_ckpt *ck = NULL;
    ck_assert_msg(clg_ckpt_load(&err, p, &ck) == CLG_OK, "%s", err.msg);
    const char *algos = clg_ckpt_get_meta(ck, "conv.algos");
    ck_assert_msg(algos && strstr(algos, "v5:fwd:") && strstr(algos, "v10:bwd-filter:"),
                  "conv.algos lacks the model's shapes: '%s'", algos ? algos : "(none)");
    clg_ckpt_free(ck);

    /* stopped after step 1: nothing measured yet */
    run("b", "ck-b", 1, 0, NULL);
    run("b", "ck-b", 7, 1, "b.safetensors");
    compare_weights("a.safetensors", "b.safetensors");

    /* stopped after step 3, the cache file then naming other algorithms */
    run("c", "ck-c", 3, 0, NULL);
    ck_assert_int_gt(falsify_cache("c"), 0);
    run("c", "ck-c", 7, 1, "c.safetensors");
    compare_weights("a.safetensors", "c.safetensors");

    /* a malformed entry is refused, naming the key */
    clg_conv_auto_forget();
    clg_ctx *c = ctx_on("d");
    ck_assert_int_eq(clg_conv_auto_pin(c, &err, "0123456789abcdef v5:fwd:x winograd;nonsense", "ck"), CLG_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "ck: entry 2"), "%s", err.msg);
    clg_ctx_destroy(c);
    clg_conv_auto_set_timer(NULL);
    clg_conv_auto_forget();
    snprintf(p, sizeof p, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(p), 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {cold_cache_resume};
    return tu_run_tests("conv-resume", 300, tests, 1);
}
