/* Internals shared by the convolution sources (conv*.c). */
#ifndef CLG_OPS_CONV_IMPL_H
#define CLG_OPS_CONV_IMPL_H

#include <limits.h>

#include "conv.h"
#include "gemm.h"

/* Largest workspace buffer a launcher allocates, in floats. */
/* One measured choice of the conv-algorithm cache, with how far its timing
 * can be trusted: margin = runner-up's time / winner's - 1 (-1: no runner-up),
 * spread = the winner's slowest timed round / its fastest - 1, load = the
 * time this process's threads waited for a CPU per unit of CPU time they ran
 * while timing (Linux schedstat; about 0 on a quiet machine, 0.5 with one
 * other busy thread per core; -1 unknown). conf = 0 marks a choice to
 * re-measure at a later run (measured under load, by a near tie, read from
 * an older file version, or seen running much slower in training); tries
 * counts its re-measurements, rev every change (the higher rev wins when two
 * processes' files merge). */
typedef struct clg_conv_algo_rec {
    clg_conv_algo algo;
    double ms, margin, spread, load;
    int n, conf, tries, rev, slow;
    double gemm; /* clg_tune_gemm_stamp when measured; -1 unknown (an older file) */
} clg_conv_algo_rec;
/* The conv-algorithm cache file's entry lines: format appends one (first:
 * no leading comma); parse calls put for every well-formed entry of
 * devhash in text (modified: split into lines), ignoring the rest, and
 * returns how many it passed on. Entries without the trust fields (file
 * version 2) read as unconfirmed (conf 0, load -1). */
CLG_INTERNAL void clg_conv_algos_format(clg_sbuf *b, int first, uint64_t devhash, const char *key,
                                        const clg_conv_algo_rec *r);
CLG_INTERNAL int clg_conv_algos_parse(char *text, uint64_t devhash,
                                      void (*put)(void *user, uint64_t devhash, const char *key,
                                                  const clg_conv_algo_rec *r),
                                      void *user);
CLG_INTERNAL size_t clg_conv_ws_floats(clg_device *dev);
/* Enqueues k over gws (dims 1..3), local size lws (NULL: runtime's choice)
 * through clg_launch (limits checked, kernel named on failure). */
CLG_INTERNAL clg_status clg_conv_enqueue(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws,
                                         const size_t *lws);

/* Launch geometry for kernels whose dim 0 is a contiguous run of n0 items
 * (vectorised across work-items by CPU runtimes), dim 1 n1 rows and dim 2
 * n2 slices: fills gws (rounded up; kernels check bounds) and lws, within
 * the limits of kernel k on dev. */
CLG_INTERNAL void clg_conv_geom(clg_device *dev, cl_kernel k, int n0, int n1, int n2, size_t gws[3], size_t lws[3]);

/* Appends the bias + ReLU epilogue and output arguments every forward
 * kernel takes: bias (or `dummy` when NULL), offb, has_bias, relu, y, offy. */
CLG_INTERNAL void clg_conv_ka_epilogue(clg_kargs *a, cl_mem bias, size_t offb, cl_mem dummy, int relu, cl_mem y,
                                       size_t offy);

/* Step profiling: with CLGRAD_CONV_PROFILE=1 each call finishes the queue
 * and prints the wall time since the previous call (label NULL: restart). */
CLG_INTERNAL void clg_conv_prof(clg_device *dev, const char *label);

/* Weight-derived filters (Winograd transforms) of bytes bytes built by
 * build(dev, ctx, dst): the layer cache's slot for (algo, flip) when built
 * from the current weights_version (rebuilt there when stale or smaller than
 * bytes); with cache NULL a temporary the caller releases (*tmp = 1). */
typedef clg_status (*clg_conv_filter_fn)(clg_device *dev, void *ctx, cl_mem dst);
CLG_INTERNAL clg_status clg_conv_cached_filters(clg_device *dev, clg_conv_cache *cache, clg_conv_algo algo, int flip,
                                                size_t bytes, clg_conv_filter_fn build, void *ctx, cl_mem *U,
                                                int *tmp);

/* Per-algorithm launchers (shape already checked, algo supported). */
CLG_INTERNAL clg_status clg_conv_wino_fwd(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache,
                                          cl_mem x, size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb,
                                          int relu, cl_mem y, size_t offy);
CLG_INTERNAL clg_status clg_conv_wino_bwd_data(clg_device *dev, const clg_conv_shape *s, int m,
                                               clg_conv_cache *cache, cl_mem dy, size_t offdy, cl_mem w,
                                               size_t offw, cl_mem dx, size_t offdx);
/* Fused Winograd weight gradient F(3x3, m x m) (conv_wgrad.c), m = 2: the
 * backward-filter pass of `winograd-fused`, m = 4: of `winograd4-fused`;
 * with db (not NULL) also the bias gradient (beta applies to both);
 * _ok: 3x3, stride 1, dilation 1, groups 1, C*K <= 512*512. */
CLG_INTERNAL int clg_conv_wgrad_ok(const clg_conv_shape *s);
CLG_INTERNAL clg_status clg_conv_wgrad_bwd_filter(clg_device *dev, const clg_conv_shape *s, int m, cl_mem x,
                                                  size_t offx, cl_mem dy, size_t offdy, float beta, cl_mem dw,
                                                  size_t offdw, cl_mem db, size_t offdb);
CLG_INTERNAL clg_status clg_conv_wino_bwd_filter(clg_device *dev, const clg_conv_shape *s, int m, cl_mem x,
                                                 size_t offx, cl_mem dy, size_t offdy, float beta, cl_mem dw,
                                                 size_t offdw);
/* Fused Winograd (cl/winograd_fused.cl), m = 2 or 4: forward and backward-data. */
CLG_INTERNAL clg_status clg_conv_wfused_fwd(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache,
                                            cl_mem x, size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb,
                                            int relu, cl_mem y, size_t offy);
CLG_INTERNAL clg_status clg_conv_wfused_bwd_data(clg_device *dev, const clg_conv_shape *s, int m,
                                                 clg_conv_cache *cache, cl_mem dy, size_t offdy, cl_mem w,
                                                 size_t offw, cl_mem dx, size_t offdx);
/* FFT forward (only when CLG_HAVE_CLFFT). */
CLG_INTERNAL clg_status clg_conv_fft_fwd(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem x,
                                         size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu,
                                         cl_mem y, size_t offy);
CLG_INTERNAL int clg_conv_fft_available(void);

/* Shape-specialised direct kernels (conv_direct.c; `direct` for groups 1,
 * dilation 1, windows up to 11x11, strides up to 4 (rows) and 2 (columns); backward-filter also
 * needs an output row within 4 vectors). bwd_filter also writes db (may be NULL). */
CLG_INTERNAL int clg_conv_djit_ok(const clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass);
/* A strided 1x1 window without padding: `direct` runs its backward-data as one pass over dx (zeros included). */
CLG_INTERNAL int clg_conv_s1x1(const clg_conv_shape *s);
CLG_INTERNAL clg_status clg_conv_djit_fwd(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem x,
                                          size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu,
                                          cl_mem y, size_t offy);
CLG_INTERNAL clg_status clg_conv_djit_bwd_data(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache,
                                               cl_mem dy, size_t offdy, cl_mem w, size_t offw, cl_mem dx,
                                               size_t offdx);
CLG_INTERNAL clg_status clg_conv_djit_bwd_filter(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx,
                                                 cl_mem dy, size_t offdy, float beta, cl_mem dw, size_t offdw,
                                                 cl_mem db, size_t offdb);

/* Gradient reductions read straight from NCHW dy (conv_bwdf.c). */
#define CLG_BWDF_MAXJ 32 /* most filter taps per output channel for bwdf_small */
CLG_INTERNAL int clg_conv_bwdf_small_ok(const clg_conv_shape *s);
/* Images per partial-sum chunk for N images and K channels. */
CLG_INTERNAL int clg_conv_bwdf_nper(int N, int K);
/* Weight (J = C*R*S taps, from im2col columns col) and bias partials of
 * nimg images into part chunks pch0 .. pch0 + ceil(nimg / nper). */
CLG_INTERNAL clg_status clg_conv_bwdf_small_chunk(clg_device *dev, int J, cl_mem dy, size_t offdy, cl_mem col,
                                                  int ldcol, int nimg, int K, int PQ, int nper, int pch0,
                                                  cl_mem part);
/* out[offo + i*ldo + j] = beta*out + sum over chunks of part[(ch*rows + i)*ps + pc0 + j]. */
CLG_INTERNAL clg_status clg_conv_part_reduce(clg_device *dev, cl_mem part, int chunks, int rows, int cols, int ps,
                                             int pc0, float beta, cl_mem out, size_t offo, int ldo);
/* The weight (columns 0..J-1) and, with db, bias (column J) gradients from
 * partials laid out with J + 1 columns per output channel (bwdf_small,
 * dconv_bwdf): two part_reduce passes. */
CLG_INTERNAL clg_status clg_conv_part_reduce_wb(clg_device *dev, cl_mem part, int chunks, int K, int J, float beta,
                                                cl_mem dw, size_t offdw, cl_mem db, size_t offdb);
/* db (K) = beta*db + sum of dy over images and pixels. */
CLG_INTERNAL clg_status clg_conv_bias_grad(clg_device *dev, const clg_conv_shape *s, cl_mem dy, size_t offdy,
                                           float beta, cl_mem db, size_t offdb);

/* Runs one concrete algorithm for one pass. The buffers not used by the
 * pass may be NULL. */
typedef struct clg_conv_io {
    cl_mem x, w, bias, y, dy, dx, dw, db;
    size_t offx, offw, offb, offy, offdy, offdx, offdw, offdb;
    int relu;
    float beta;
} clg_conv_io;
CLG_INTERNAL clg_status clg_conv_run(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                     clg_conv_pass pass, clg_conv_cache *cache, const clg_conv_io *io);

/* Resolves CLG_CONV_AUTO: looks the (device, shape, pass) up in the
 * measurement cache, measuring the eligible algorithms on a miss, and again
 * (once per process) where the cached choice is unconfirmed; with
 * CLGRAD_CONV_AUTO_MEASURE=0 takes clg_conv_algo_default instead. */
CLG_INTERNAL clg_status clg_conv_auto_pick(clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass,
                                           const clg_conv_io *io, clg_conv_algo *out);
/* What clg_conv_resolve uses: a shape and pass measured before (this process
 * or the cache file) get their measured choice (*final = 1). With
 * CLGRAD_CONV_AUTO_DEFER=N (N > 0; the clgrad program sets 1 unless
 * it is set, bench conv 0) a new one is served by
 * clg_conv_algo_default for its first N uses (*final = 0, so the caller asks
 * again) and measured at the next: a cold start reaches its first step
 * without timing (or compiling) every candidate. Library default 0: measure
 * at the first use, so every step of every model in a process computes with
 * the measured choice. A choice pinned from a checkpoint (clg_conv_auto_pin)
 * comes first; every final choice is recorded for the next checkpoint
 * (clg_conv_auto_state). */
CLG_INTERNAL clg_status clg_conv_auto_choose(clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass,
                                             const clg_conv_io *io, clg_conv_algo *out, int *final);

/* Tests: fn (NULL: the wall clock) gives the time of each candidate the
 * automatic choice measures (the candidates still run), so the choice is
 * known in advance; clg_conv_auto_forget drops this process's choices,
 * loaded files, pending uses and pins, as a new process starts. */
CLG_INTERNAL void clg_conv_auto_set_timer(double (*fn)(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                                       clg_conv_pass pass));
CLG_INTERNAL void clg_conv_auto_forget(void);
/* Tests: fn (NULL: the process's schedstat) gives the load signal of each
 * measurement (clg_conv_algo_rec.load) in place of the machine's, and the
 * algorithm cache file lives in dir (NULL: the context's cache directory,
 * where the compiled programs stay). */
CLG_INTERNAL void clg_conv_auto_set_load(double (*fn)(void), const char *dir);
/* Measures again, on zero-filled operands, every cached choice of dev made
 * under other GEMM parameters than the device's now (clg_tune_gemm_stamp), so
 * the next run finds them current; what the background tuner runs after
 * tuning GEMM classes. stop (may be NULL) is asked before each shape: nonzero
 * ends it. Returns how many were measured. */
CLG_INTERNAL int clg_conv_auto_refresh(clg_device *dev, int (*stop)(void *user), void *user);

/* Untuned choice for a device class (docs/portability.md): depthwise ->
 * direct; on CPUs the shape-specialised direct kernels for strided or 4x4+
 * windows with fewer than 8 reduced channels or not 3x3 stride 1; otherwise fewer than 8 reduced channels or not 3x3 stride 1
 * -> im2col; else Winograd: the fused design on CPUs, the separate design
 * (transforms + tiled GEMM) on GPUs, F(4x4) where the error policy allows
 * (on GPUs only for NVIDIA and AMD). */
CLG_INTERNAL clg_conv_algo clg_conv_algo_default(const clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass);

#endif
