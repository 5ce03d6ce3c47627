/* GEMM auto-tuner: searches the own kernels' parameter space per device and
 * shape class, records the winners (and own-vs-CLBlast) in the tuning db. */
#ifndef CLG_OPS_TUNE_GEMM_H
#define CLG_OPS_TUNE_GEMM_H

#include "gemm.h"

/* Every parameter set the tuner may emit for dev (quick: the reduced
 * space). Writes up to max sets; returns how many exist. */
CLG_INTERNAL int clg_gemm_candidates(clg_device *dev, int quick, clg_gemm_params *out, int max);

typedef struct clg_gemm_tune_opts {
    int quick;           /* reduced space and repetitions */
    int clblast;         /* also time CLBlast and record the auto choice (-1: only for the
                            classes whose choice is stored: it follows the new parameters) */
    double max_gflop;    /* shapes above this many GFLOP are shrunk along N (0: 2) */
    const int (*shapes)[3]; /* M, N, K of the shapes to tune (NULL: built-in list) */
    int nshapes;
    void (*progress)(void *user, const char *line); /* may be NULL */
    void *user;
} clg_gemm_tune_opts;

/* Tunes dev over the shapes' classes and saves the database. */
CLG_INTERNAL clg_status clg_gemm_tune(clg_device *dev, const clg_gemm_tune_opts *o);

/* GEMM shapes of the VGG-S and LeNet-5 layers (see tools/bench_gemm.c):
 * fills up to max rows {M, N, K, ta, tb, batch} with labels; returns the count. */
typedef struct clg_gemm_shape {
    const char *label;
    int M, N, K, ta, tb, batch;
} clg_gemm_shape;
CLG_INTERNAL int clg_gemm_dl_shapes(int batch, clg_gemm_shape *out, int max);

#endif
