/* One fault-injection run (issue #11): a short training run resumed from a
 * checkpoint (train steps, evaluation, checkpoint save) under the OpenCL
 * fault shim linked into this program (fault_shim.c; CLG_FAULT picks the
 * call to fail), then the checks every run must pass, whatever failed:
 *
 *   usage: fault_run prepare|run DIR MODEL [DEVICES]
 *     prepare  writes a small IDX dataset into DIR/data and trains epoch 1
 *              with checkpoints in DIR/ck (no fault; fills the caches)
 *     run      resumes DIR/ck for epoch 2 (2 steps of 8 images, evaluation
 *              of 8, checkpoint save), destroys the context, then checks
 *   exit status:
 *     0  the run succeeded (the fault, if any, was absorbed)
 *     1  the run failed with a status and a message (printed) -- clean
 *     3  the checkpoint in DIR/ck no longer loads or predicts non-finite values
 *     4  OpenCL objects were left alive after clg_ctx_destroy (leak)
 *     5  a temporary checkpoint file was left in DIR/ck
 *     2  usage / setup error
 * A crash, abort, sanitizer report or hang is the caller's to see (the
 * walker, tests/fault/walk.py, runs this under a timeout). */
#include <clgrad.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fault_shim.h"

#define SIDE 28
#define NTRAIN 16
#define NTEST 8

static unsigned rng_state = 2024u;
static unsigned rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}

static int write_idx(const char *path, int images, int n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    unsigned char h[16] = {0, 0, 8, (unsigned char)(images ? 3 : 1)};
    int hl = images ? 16 : 8;
    h[4] = (unsigned char)(n >> 24), h[5] = (unsigned char)(n >> 16), h[6] = (unsigned char)(n >> 8);
    h[7] = (unsigned char)n;
    if (images)
        h[11] = SIDE, h[15] = SIDE;
    fwrite(h, 1, (size_t)hl, f);
    for (int i = 0; i < n * (images ? SIDE * SIDE : 1); i++)
        fputc(images ? (int)(rnd() % 256) : (int)(rnd() % 10), f);
    return fclose(f);
}

static int prepare_data(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/data", dir);
    mkdir(p, 0755);
    const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                            "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/data/%s", dir, names[i]);
        rng_state = 2024u + (unsigned)(i / 2); /* images and labels of a split from one stream each */
        if (write_idx(p, i % 2 == 0, i < 2 ? NTRAIN : NTEST))
            return -1;
    }
    return 0;
}

static int stale_tmp(const char *ck)
{
    DIR *d = opendir(ck);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp"))
            found = 1;
    closedir(d);
    return found;
}

/* The checkpoint loads into a fresh context and predicts finite values. */
static int verify(const char *model, const char *ckfile, const char *devices)
{
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    cp.devices = devices;
    clg_ctx *ctx = NULL;
    if (clg_ctx_create(&cp, &ctx) != CLG_OK) {
        fprintf(stderr, "fault_run: verify: no context: %s\n", clg_last_error(NULL));
        return 3;
    }
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = NTEST;
    clg_model *m = NULL;
    float *x = calloc((size_t)NTEST * SIDE * SIDE, sizeof(float)), *probs = calloc((size_t)NTEST * 10, sizeof(float));
    int rc = 0;
    if (!x || !probs)
        rc = 2;
    else if (clg_model_create_file(ctx, model, &mp, &m) != CLG_OK || clg_model_load_weights(m, ckfile) != CLG_OK ||
             clg_model_predict(m, x, NTEST, probs) != CLG_OK) {
        fprintf(stderr, "fault_run: the checkpoint %s no longer loads: %s\n", ckfile, clg_last_error(ctx));
        rc = 3;
    } else {
        for (int i = 0; i < NTEST * 10; i++)
            if (!isfinite(probs[i])) {
                fprintf(stderr, "fault_run: the checkpoint %s predicts non-finite values\n", ckfile);
                rc = 3;
                break;
            }
    }
    free(x);
    free(probs);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "prepare") && strcmp(argv[1], "run"))) {
        fprintf(stderr, "usage: fault_run prepare|run DIR MODEL [DEVICES]\n");
        return 2;
    }
    int prepare = strcmp(argv[1], "prepare") == 0;
    const char *dir = argv[2], *model = argv[3], *devices = argc > 4 ? argv[4] : "0";
    char data[4096], ck[4096], ckfile[4200];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ckfile, sizeof ckfile, "%s/last.safetensors", ck);
    if (prepare) {
        clg_fault_disarm();
        if (prepare_data(dir)) {
            fprintf(stderr, "fault_run: cannot write the dataset under %s\n", dir);
            return 2;
        }
    }
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    cp.devices = devices;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&cp, &ctx);
    const char *msg = st == CLG_OK ? "" : clg_last_error(NULL);
    if (st == CLG_OK) {
        clg_train_params tp;
        clg_train_params_init(&tp);
        tp.model = model;
        tp.data = data;
        tp.devices = devices;
        tp.batch = 8;
        tp.epochs = prepare ? 1 : 2;
        tp.limit_train = NTRAIN;
        tp.limit_test = NTEST;
        tp.checkpoint_dir = ck;
        tp.resume = !prepare;
        tp.learning_rate = 0.01;
        clg_train_report rep;
        st = clg_train_run(ctx, &tp, &rep);
        msg = clg_last_error(ctx);
    }
    if (st == CLG_OK)
        printf("fault_run: %s: ok\n", argv[1]);
    else
        printf("fault_run: %s failed: %s (%s): %s\n", argv[1], clg_status_name(st), clg_status_string(st), msg);
    fflush(stdout);
    clg_ctx_destroy(ctx);
    long live = clg_fault_live();
    clg_fault_disarm();
    clg_fault_report();
    if (prepare)
        return st == CLG_OK ? 0 : 2;
    int rc = st == CLG_OK ? 0 : 1;
    if (live != 0) {
        fprintf(stderr, "fault_run: %ld OpenCL objects left alive after clg_ctx_destroy (see CLG_FAULT_REPORT)\n",
                live);
        rc = 4;
    }
    if (stale_tmp(ck)) {
        fprintf(stderr, "fault_run: a temporary checkpoint file was left in %s\n", ck);
        rc = 5;
    }
    int v = verify(model, ckfile, devices);
    return v ? v : rc;
}
