/* Soak (issue #11, deliverable 5): many LeNet-5 training steps through the
 * public API, with a prediction and a weights save every 100 steps, printing
 * the process RSS and the buffer pool's statistics (clg_pool_stats_get) of
 * every device in use every EVERY steps, then judging "flat after warm-up":
 *   - the pool neither grows (bytes in use + cached) nor creates buffers
 *     (misses) after the warm-up: every allocation is served from the cache;
 *   - RSS grows by at most RSS_BOUND_MIB after the warm-up.
 * The warm-up is the first fifth of the steps (at least 50): kernel builds,
 * the algorithm choice and the first prediction and save allocate there.
 *
 *   usage: soak STEPS EVERY MODEL [DEVICES] [RSS_BOUND_MIB]
 *     DEVICES: "0" (default) or a list "0,1" (data parallel)
 *     RSS_BOUND_MIB: default 8
 *   exit 0 flat, 1 grew (or a step failed), 2 usage / setup error. */
#include <clgrad.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BATCH 32
#define SIDE 28
#define MAX_DEV 16

static double rss_mib(void)
{
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%ld %ld", &pages, &res) == 2;
    fclose(f);
    return ok ? (double)res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0) : -1;
}

static unsigned rng_state = 7u;
static float frand(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 16777216.0f;
}

/* class k: a bright horizontal band at row 2k+4 on noise (learnable) */
static void make_batch(float *x, int32_t *y)
{
    for (int i = 0; i < BATCH; i++) {
        int k = (int)(frand() * 10) % 10;
        y[i] = k;
        for (int p = 0; p < SIDE * SIDE; p++)
            x[i * SIDE * SIDE + p] = 0.3f * frand() + (p / SIDE == 2 * k + 4 ? 0.7f : 0.0f);
    }
}

typedef struct sample {
    int step;
    double rss;
    clg_pool_stats pool; /* summed over the devices in use */
} sample;

static void pool_sum(clg_ctx *ctx, const int *devs, int ndev, clg_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ndev; i++) {
        clg_pool_stats s;
        if (clg_pool_stats_get(ctx, devs[i], &s) != CLG_OK)
            continue;
        out->bytes_in_use += s.bytes_in_use;
        out->bytes_cached += s.bytes_cached;
        out->peak_bytes += s.peak_bytes;
        out->hits += s.hits;
        out->misses += s.misses;
        out->failures += s.failures;
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: soak STEPS EVERY MODEL [DEVICES] [RSS_BOUND_MIB]\n");
        return 2;
    }
    int steps = atoi(argv[1]), every = atoi(argv[2]);
    const char *model = argv[3], *devices = argc > 4 ? argv[4] : "0";
    double bound = argc > 5 ? atof(argv[5]) : 8.0;
    if (steps < 10 || every < 1) {
        fprintf(stderr, "soak: STEPS >= 10 and EVERY >= 1 please\n");
        return 2;
    }
    int warm = steps / 5 > 50 ? steps / 5 : 50;
    if (warm >= steps)
        warm = steps / 2;
    int devs[MAX_DEV], ndev = 0;
    for (const char *p = devices; *p && ndev < MAX_DEV;) {
        devs[ndev++] = atoi(p);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    clg_ctx *ctx = NULL;
    if (clg_ctx_create(&cp, &ctx) != CLG_OK) {
        fprintf(stderr, "soak: %s\n", clg_last_error(NULL));
        return 2;
    }
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = BATCH;
    mp.devices = devices;
    mp.learning_rate = 0.02;
    mp.split = "even"; /* a re-balanced split brings new slice shapes, and with them new buffers (see docs/reliability.md) */
    clg_model *m = NULL;
    float *x = malloc(sizeof(float) * BATCH * SIDE * SIDE), *probs = malloc(sizeof(float) * BATCH * 10);
    int32_t *y = malloc(sizeof(int32_t) * BATCH);
    char wpath[] = "/tmp/clgrad-soak-XXXXXX";
    int wfd = mkstemp(wpath);
    int nsamp = steps / every + 2;
    sample *sm = calloc((size_t)nsamp, sizeof *sm);
    int ns = 0, rc = 0;
    if (!x || !probs || !y || wfd < 0 || !sm || clg_model_create_file(ctx, model, &mp, &m) != CLG_OK) {
        fprintf(stderr, "soak: setup failed: %s\n", clg_last_error(ctx));
        rc = 2;
        goto out;
    }
    close(wfd);
    printf("# soak: %d steps of %s, batch %d, devices %s; warm-up %d steps\n", steps, model, BATCH, devices, warm);
    printf("%6s %9s %12s %12s %12s %9s %7s %7s\n", "step", "rss_mib", "pool_in_use", "pool_cached", "pool_peak",
           "hits", "misses", "loss");
    fflush(stdout);
    double t0 = 0;
    for (int s = 1; s <= steps && rc == 0; s++) {
        make_batch(x, y);
        if (clg_model_train_step(m, x, y, BATCH) != CLG_OK) {
            fprintf(stderr, "soak: step %d failed: %s\n", s, clg_last_error(ctx));
            rc = 1;
            break;
        }
        if (s % 100 == 0 && (clg_model_predict(m, x, BATCH, probs) != CLG_OK ||
                             clg_model_save_weights(m, wpath) != CLG_OK)) {
            fprintf(stderr, "soak: predict/save at step %d failed: %s\n", s, clg_last_error(ctx));
            rc = 1;
            break;
        }
        if (s % every == 0 || s == warm || s == steps) {
            clg_metrics mt;
            clg_model_metrics(m, &mt);
            sample *c = &sm[ns < nsamp ? ns++ : nsamp - 1];
            c->step = s;
            c->rss = rss_mib();
            pool_sum(ctx, devs, ndev, &c->pool);
            printf("%6d %9.1f %12llu %12llu %12llu %9llu %7llu %7.4f\n", s, c->rss,
                   (unsigned long long)c->pool.bytes_in_use, (unsigned long long)c->pool.bytes_cached,
                   (unsigned long long)c->pool.peak_bytes, (unsigned long long)c->pool.hits,
                   (unsigned long long)c->pool.misses, mt.loss);
            fflush(stdout);
            if (s == warm)
                t0 = 1;
        }
    }
    if (rc == 0) {
        const sample *w = NULL, *e = &sm[ns - 1];
        for (int i = 0; i < ns; i++)
            if (sm[i].step == warm)
                w = &sm[i];
        double rss_max = w->rss;
        for (int i = 0; i < ns; i++)
            if (sm[i].step >= warm && sm[i].rss > rss_max)
                rss_max = sm[i].rss;
        long long dpool = (long long)(e->pool.bytes_in_use + e->pool.bytes_cached) -
                          (long long)(w->pool.bytes_in_use + w->pool.bytes_cached);
        long long dmiss = (long long)(e->pool.misses - w->pool.misses);
        double drss = rss_max - w->rss;
        printf("# after warm-up (steps %d..%d): RSS %.1f -> %.1f MiB (max %+.1f MiB, bound %.1f), pool bytes %+lld, "
               "new buffers %lld, allocations served from the cache %llu\n",
               warm, steps, w->rss, e->rss, drss, bound, dpool, dmiss,
               (unsigned long long)(e->pool.hits - w->pool.hits));
        int flat = drss <= bound && dpool <= 0 && dmiss == 0;
        printf("# %s\n", flat ? "flat after warm-up" : "GREW after warm-up");
        rc = flat ? 0 : 1;
    }
    (void)t0;
out:
    unlink(wpath);
    free(x);
    free(probs);
    free(y);
    free(sm);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return rc;
}
