/* Shared harness for the layer tests: build a layer from "key=value" text,
 * run forward/backward on device with poisoned outputs, download results.
 * Header-only (static functions) so each test binary stays self-contained. */
#ifndef CLG_TEST_LAYER_HARNESS_H
#define CLG_TEST_LAYER_HARNESS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "testutil.h"

typedef struct lh_case {
    clg_ctx *ctx;
    clg_device *dev;
    clg_layer l;
    int nin;
    int n; /* batch run (<= planned in_shape N) */
    int shp[CLG_MAX_INPUTS][4];
    size_t nx[CLG_MAX_INPUTS];
    float *x[CLG_MAX_INPUTS];
    cl_mem xm[CLG_MAX_INPUTS];
    size_t ny;
    float *y;
    cl_mem ym;
    float *p[CLG_MAX_PARAMS]; /* downloaded param values */
    /* backward results */
    float *dx[CLG_MAX_INPUTS];
    float *g[CLG_MAX_PARAMS];
    cl_mem labels;
} lh_case;

#define LH_OK(c, expr)                                                                                    \
    do {                                                                                                  \
        clg_status s_ = (expr);                                                                           \
        ck_assert_msg(s_ == CLG_OK, "%s failed: %s: %s", #expr, clg_status_name(s_), clg_last_error((c)->ctx)); \
    } while (0)

static inline size_t lh_numel4(const int *s) { return (size_t)s[0] * s[1] * s[2] * s[3]; }

static inline float *lh_alloc(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

static inline double *lh_dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Context on device `devsel` ("0" default). */
static inline void lh_ctx(lh_case *c, const char *devsel)
{
    memset(c, 0, sizeof *c);
    c->ctx = tu_ctx(devsel ? devsel : "0");
    c->dev = &c->ctx->devs[0];
}

/* Creates + inits the layer; run batch n (<= shapes' N). Inputs random in
 * [lo, hi) from stream; input i is a sequence (N, T, C) = {N, T, C, 1}
 * where bit i of seq_mask is set. */
static inline void lh_make_seq(lh_case *c, const char *type, const char *keys, int nin, const int (*shp)[4],
                               unsigned seq_mask, int n, float lo, float hi, uint64_t stream)
{
    clg_err *err = &c->ctx->err;
    clg_status st = clg_layer_create_for_test_seq(err, type, keys, nin, shp, seq_mask, &c->l);
    ck_assert_msg(st == CLG_OK, "create %s '%s': %s", type, keys, err->msg);
    clg_rng rng;
    tu_rng(&rng, stream);
    LH_OK(c, c->l.ops->init(&c->l, c->dev, &rng));
    c->nin = nin;
    c->n = n;
    for (int i = 0; i < nin; i++) {
        memcpy(c->shp[i], shp[i], sizeof c->shp[i]);
        c->shp[i][0] = n;
        c->nx[i] = lh_numel4(c->shp[i]);
        c->x[i] = lh_alloc(c->nx[i]);
        tu_fill(c->x[i], c->nx[i], lo, hi, &rng);
        c->xm[i] = tu_upload(c->dev, c->x[i], c->nx[i]);
    }
    int os[4] = {n, c->l.out_shape[1], c->l.out_shape[2], c->l.out_shape[3]};
    c->ny = lh_numel4(os);
    c->y = lh_alloc(c->ny);
    c->ym = tu_upload(c->dev, NULL, c->ny);
    for (int i = 0; i < c->l.nparams; i++) {
        c->p[i] = lh_alloc(c->l.params[i].numel);
        tu_download(c->dev, c->l.params[i].value, c->p[i], c->l.params[i].numel);
    }
}

/* Re-uploads host inputs (after the test changed them). */
static inline void lh_make(lh_case *c, const char *type, const char *keys, int nin, const int (*shp)[4], int n,
                           float lo, float hi, uint64_t stream)
{
    lh_make_seq(c, type, keys, nin, shp, 0, n, lo, hi, stream);
}

static inline void lh_reupload(lh_case *c)
{
    for (int i = 0; i < c->nin; i++)
        ck_assert_int_eq(clEnqueueWriteBuffer(c->dev->queue, c->xm[i], CL_TRUE, 0, c->nx[i] * sizeof(float),
                                              c->x[i], 0, NULL, NULL),
                         CL_SUCCESS);
}

/* Uploads host params p[] to the device. */
static inline void lh_set_params(lh_case *c)
{
    for (int i = 0; i < c->l.nparams; i++)
        LH_OK(c, clg_layer_param_upload(c->dev, &c->l.params[i], c->p[i]));
    if (c->l.ops->params_changed)
        c->l.ops->params_changed(&c->l);
}

static inline clg_tensor lh_tensor(cl_mem m, const int *s, int n)
{
    clg_tensor t = {m, 0, n, s[1], s[2], s[3]};
    return t;
}

static inline void lh_forward(lh_case *c, int training)
{
    clg_tensor in[CLG_MAX_INPUTS];
    for (int i = 0; i < c->nin; i++)
        in[i] = lh_tensor(c->xm[i], c->shp[i], c->n);
    int os[4] = {c->n, c->l.out_shape[1], c->l.out_shape[2], c->l.out_shape[3]};
    clg_tensor out = lh_tensor(c->ym, os, c->n);
    /* poison the output */
    float *nanv = lh_alloc(c->ny);
    tu_poison(nanv, c->ny);
    ck_assert_int_eq(
        clEnqueueWriteBuffer(c->dev->queue, c->ym, CL_TRUE, 0, c->ny * sizeof(float), nanv, 0, NULL, NULL),
        CL_SUCCESS);
    free(nanv);
    LH_OK(c, c->l.ops->forward(&c->l, c->dev, in, c->nin, &out, training));
    tu_download(c->dev, c->ym, c->y, c->ny);
}

/* Backward with dout dy (ny floats); din for every input unless skip_din
 * has bit i set. Param grads and din are poisoned first. */
static inline void lh_backward(lh_case *c, const float *dy, unsigned skip_din)
{
    clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
    cl_mem dxm[CLG_MAX_INPUTS] = {0};
    for (int i = 0; i < c->nin; i++) {
        in[i] = lh_tensor(c->xm[i], c->shp[i], c->n);
        dxm[i] = (skip_din >> i) & 1 ? NULL : tu_upload(c->dev, NULL, c->nx[i]);
        din[i] = lh_tensor(dxm[i], c->shp[i], c->n);
    }
    for (int i = 0; i < c->l.nparams; i++)
        if (c->l.params[i].trainable) {
            float *nanv = lh_alloc(c->l.params[i].numel);
            tu_poison(nanv, c->l.params[i].numel);
            ck_assert_int_eq(clEnqueueWriteBuffer(c->dev->queue, c->l.params[i].grad, CL_TRUE, 0,
                                                  c->l.params[i].numel * sizeof(float), nanv, 0, NULL, NULL),
                             CL_SUCCESS);
            free(nanv);
        }
    int os[4] = {c->n, c->l.out_shape[1], c->l.out_shape[2], c->l.out_shape[3]};
    clg_tensor out = lh_tensor(c->ym, os, c->n);
    cl_mem dym = tu_upload(c->dev, dy, c->ny);
    clg_tensor dout = lh_tensor(dym, os, c->n);
    LH_OK(c, c->l.ops->backward(&c->l, c->dev, in, c->nin, &out, &dout, din));
    for (int i = 0; i < c->nin; i++) {
        free(c->dx[i]);
        c->dx[i] = NULL;
        if (dxm[i]) {
            c->dx[i] = lh_alloc(c->nx[i]);
            tu_download(c->dev, dxm[i], c->dx[i], c->nx[i]);
            clg_buf_release(c->dev, dxm[i]);
        }
    }
    for (int i = 0; i < c->l.nparams; i++) {
        free(c->g[i]);
        c->g[i] = NULL;
        if (c->l.params[i].trainable) {
            c->g[i] = lh_alloc(c->l.params[i].numel);
            tu_download(c->dev, c->l.params[i].grad, c->g[i], c->l.params[i].numel);
        }
    }
    clg_buf_release(c->dev, dym);
}

static inline void lh_free(lh_case *c)
{
    for (int i = 0; i < c->nin; i++) {
        free(c->x[i]);
        free(c->dx[i]);
        clg_buf_release(c->dev, c->xm[i]);
    }
    for (int i = 0; i < CLG_MAX_PARAMS; i++) {
        free(c->p[i]);
        free(c->g[i]);
    }
    free(c->y);
    clg_buf_release(c->dev, c->ym);
    clg_buf_release(c->dev, c->labels);
    clg_layer_free(&c->l, c->dev);
    clg_ctx_destroy(c->ctx);
}

/* LH_CLOSE for sums: element i may also be off by ulps * 2^-24 * mag[i]
 * (mag: the sum of the absolute terms behind it, through any slope applied
 * after), the fp32 rounding a sum of mixed signs near zero can't avoid
 * (there tol (|ref| + atol) alone can ask for less than one ulp of the
 * terms). The largest error in those units goes to *ulps_seen if non-NULL. */
static inline void lh_close_mag(const float *got, const double *ref, const double *mag, size_t n, double atol,
                                double tol, double ulps, double *ulps_seen, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]), unit = ldexp(1.0, -24) * mag[i];
        if (ulps_seen && unit > 0)
            *ulps_seen = fmax(*ulps_seen, e / unit);
        ck_assert_msg(isfinite(got[i]) && e <= tol * (fabs(ref[i]) + atol) + ulps * unit,
                      "%s [%zu]: %.9g, reference %.9g: error %.3g > %.3g (|ref| + %.3g) + %.3g ulps of %.3g", what, i,
                      (double)got[i], ref[i], e, tol, atol, ulps, mag[i]);
    }
}

/* Asserts max relative error (tu_max_err with atol) <= tol. */
#define LH_CLOSE(got, ref, n, atol, tol, what)                                                        \
    do {                                                                                              \
        double e_ = tu_max_err((got), (ref), (n), (atol));                                            \
        ck_assert_msg(e_ <= (tol), "%s: max error %.3g > tolerance %.3g", (what), e_, (double)(tol)); \
    } while (0)

#endif
