/* The conv algorithm cache (<cache_dir>/conv-algos-<devhash>.json) shared by
 * processes running at once (sweep trials, parallel test runs): NPROC
 * processes each measure NSHAPE new shapes (CLG_CONV_AUTO, measured at first
 * use), so each saves the file NSHAPE times while the others read and write
 * it. Afterwards no process has logged a JSON error about the file, the file
 * is one valid JSON value, and it holds every process's entries (saves merge
 * under the file's lock; last-writer-wins would drop most of them). Each
 * choice's output is checked against the double-precision reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/json.h"
#include "ops/conv.h"
#include "conv_ref.h"
#include "testutil.h"

enum { NPROC = 4, NSHAPE = 2 };

static clg_conv_shape shape_of(int w)
{
    clg_conv_shape s = {.N = 1, .C = 1, .H = 3, .W = w, .K = 2, .R = 3, .S = 3, .pad_h = 1, .pad_w = 1,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    return s;
}

static int g_id, g_w0;

/* One process: measure its shapes (each measurement saves the file). */
static int child_work(int id, int w0)
{
    clg_log_level = 2; /* every error set, parse errors included, is logged */
    clg_ctx *ctx = tu_ctx(NULL);
    clg_device *dev = &ctx->devs[0];
    if (clg_ctx_option_set(ctx, "conv_auto_defer", "0") != CLG_OK)
        return 3;
    clg_rng r;
    tu_rng(&r, 40 + (uint64_t)id);
    for (int j = 0; j < NSHAPE; j++) {
        clg_conv_shape s = shape_of(w0 + id * NSHAPE + j);
        size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
        float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw), *y = malloc(sizeof(float) * ny);
        double *ref = malloc(sizeof(double) * ny);
        tu_fill(x, nx, -1, 1, &r);
        tu_fill(w, nw, -1, 1, &r);
        cl_mem mx = tu_upload(dev, x, nx), mw = tu_upload(dev, w, nw), my = tu_upload(dev, NULL, ny);
        tu_write_full(dev, my, NULL, ny); /* poisoned */
        clg_status st = clg_conv_forward(dev, &s, CLG_CONV_AUTO, NULL, mx, 0, mw, 0, NULL, 0, 1, my, 0);
        if (st != CLG_OK) {
            fprintf(stderr, "conv_forward: %s\n", clg_last_error(ctx));
            return 4;
        }
        tu_download(dev, my, y, ny);
        cr_fwd(&s, x, w, NULL, 1, ref);
        double err = tu_max_err(y, ref, ny, 1.0);
        if (!(err < 1e-4)) {
            fprintf(stderr, "conv output error %g\n", err);
            return 5;
        }
        clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my);
        free(x), free(w), free(y), free(ref);
    }
    clg_ctx_destroy(ctx);
    return 0;
}

START_TEST(child_test) { ck_assert_int_eq(child_work(g_id, g_w0), 0); }
END_TEST

/* A child runs its work as a Check test (the test helpers assert) */
static int child(int id, int w0, const char *log)
{
    if (!freopen(log, "w", stderr))
        return 2;
    g_id = id, g_w0 = w0;
    const TTest *t[] = {child_test};
    return tu_run_tests("conv-cache-child", 240, t, 1);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *t = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            char *nt = realloc(t, cap);
            if (!nt)
                break;
            t = nt;
        }
        size_t got = fread(t + n, 1, 4096, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    if (t)
        t[n] = 0;
    *len = n;
    return t;
}

int main(void)
{
    const char *dir = getenv("CLGRAD_CACHE_DIR");
    if (!dir || !*dir) {
        fprintf(stderr, "skip: CLGRAD_CACHE_DIR unset (the shared test cache holds the compiled programs)\n");
        return 77;
    }
    clg_rng r;
    tu_rng(&r, 1);
    /* widths new to the (persistent) cache most runs, small: each process
     * times every candidate algorithm on each */
    int w0 = 8 + (int)(clg_rng_u32(&r) % 200u) * NPROC * NSHAPE;
    char logs[NPROC][64];
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        snprintf(logs[i], sizeof logs[i], "/tmp/clgrad-convcache-%d-%d.log", (int)getpid(), i);
        pids[i] = fork();
        if (pids[i] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[i] == 0)
            _exit(child(i, w0, logs[i]));
    }
    int fails = 0;
    for (int i = 0; i < NPROC; i++) {
        int ws = 0;
        waitpid(pids[i], &ws, 0);
        size_t len = 0;
        char *log = slurp(logs[i], &len);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "process %d: exit %d\n%s\n", i, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, log ? log : "");
            fails++;
        } else if (log && strstr(log, "conv algorithm cache") && strstr(log, "JSON error")) {
            fprintf(stderr, "process %d logged a JSON error on the conv algorithm cache:\n%s\n", i, log);
            fails++;
        }
        free(log);
        unlink(logs[i]);
    }
    if (fails)
        return 1;
    /* the file(s) of this device: whole valid JSON, every process's entries */
    char cmd[1200], path[1100];
    snprintf(cmd, sizeof cmd, "ls %s/conv-algos-*.json 2>/dev/null", dir);
    FILE *ls = popen(cmd, "r");
    int found[NPROC * NSHAPE] = {0}, files = 0;
    while (ls && fgets(path, sizeof path, ls)) {
        path[strcspn(path, "\n")] = 0;
        size_t len = 0;
        char *text = slurp(path, &len);
        if (!text)
            continue;
        files++;
        clg_err err;
        clg_json *j = NULL;
        if (clg_json_parse(&err, text, len, path, &j) != CLG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            fails++;
        }
        clg_json_free(j);
        for (int k = 0; k < NPROC * NSHAPE; k++) {
            char pat[64];
            snprintf(pat, sizeof pat, "fwd:n1,c1,h3,w%d,k2,r3,s3,", w0 + k);
            found[k] |= strstr(text, pat) != NULL;
        }
        free(text);
    }
    if (ls)
        pclose(ls);
    for (int k = 0; k < NPROC * NSHAPE; k++)
        if (!found[k]) {
            fprintf(stderr, "the entry of width %d (process %d) is missing from the cache file\n", w0 + k, k / NSHAPE);
            fails++;
        }
    printf("conv cache: %d processes x %d shapes, %d file(s), %d problem(s)\n", NPROC, NSHAPE, files, fails);
    return fails ? 1 : 0;
}
