/* Launchers of the optimizer kernels (see optim_kernels.h). */
#include <stdlib.h>
#include <string.h>

#include "optim_kernels.h"

/* Work-group size of the reductions sumsq_partial and lane_add (their WG
 * macro): the device's largest power of two up to it. */
#define RED_WG 256
/* Work-group size of the element-wise updates. */
#define STEP_WG CLG_OPTK_STEP_WG

clg_status clg_optk_sgd_step(clg_device *dev, const clg_sgd_step_args *a)
{
    if (a->n <= 0)
        return CLG_OK;
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "optim", "", "sgd_step", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, a->w);
    clg_ka_mem(&ka, a->g);
    clg_ka_mem(&ka, a->m);
    clg_ka_int(&ka, a->n);
    clg_ka_float(&ka, a->lr);
    clg_ka_float(&ka, a->momentum);
    clg_ka_float(&ka, a->weight_decay);
    clg_ka_int(&ka, a->nesterov);
    clg_ka_float(&ka, a->gscale);
    clg_ka_mem(&ka, a->decay_mask ? a->decay_mask : a->g); /* not read without a mask */
    clg_ka_int(&ka, a->decay_mask != NULL);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "arguments of sgd_step"));
    return clg_launch_1d(dev, k, (size_t)a->n, STEP_WG);
}

clg_status clg_optk_adam_step(clg_device *dev, const clg_adam_step_args *a)
{
    if (a->n <= 0)
        return CLG_OK;
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "optim", "", "adam_step", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, a->w);
    clg_ka_mem(&ka, a->g);
    clg_ka_mem(&ka, a->m);
    clg_ka_mem(&ka, a->v);
    clg_ka_int(&ka, a->n);
    clg_ka_float(&ka, a->lr);
    clg_ka_float(&ka, a->beta1);
    clg_ka_float(&ka, a->beta2);
    clg_ka_float(&ka, a->omb1);
    clg_ka_float(&ka, a->omb2);
    clg_ka_float(&ka, a->eps);
    clg_ka_float(&ka, a->weight_decay);
    clg_ka_int(&ka, a->decoupled);
    clg_ka_float(&ka, a->bc1);
    clg_ka_float(&ka, a->bc2);
    clg_ka_float(&ka, a->gscale);
    clg_ka_mem(&ka, a->decay_mask ? a->decay_mask : a->g); /* not read without a mask */
    clg_ka_int(&ka, a->decay_mask != NULL);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "arguments of adam_step"));
    return clg_launch_1d(dev, k, (size_t)a->n, STEP_WG);
}

clg_status clg_optk_sumsq_partial(clg_device *dev, cl_mem x, int n, cl_mem partial, int off, int max_groups,
                                  int *groups)
{
    cl_kernel k;
    size_t wg = RED_WG; /* a reduction's fixed group */
    CLG_TRY(clg_kernel_get_wg(dev, "optim", "sumsq_partial", "WG", RED_WG, &k, &wg));
    size_t want = CLG_CEIL_DIV((size_t)(n > 0 ? n : 0), wg);
    *groups = (int)CLG_MAX((size_t)1, CLG_MIN((size_t)max_groups, want));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, x);
    clg_ka_int(&ka, n);
    clg_ka_mem(&ka, partial);
    clg_ka_int(&ka, off);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "arguments of sumsq_partial"));
    size_t global = (size_t)*groups * wg;
    return clg_launch(dev, k, 1, &global, &wg, CLG_LAUNCH_FIXED, NULL);
}

clg_status clg_optk_unscale_check(clg_device *dev, cl_mem g, int n, float inv_scale, cl_mem flag)
{
    if (n <= 0)
        return CLG_OK;
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "convert", dev->info.has_fp16 ? "-D HAVE_FP16=1" : "", "unscale_check", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, g);
    clg_ka_int(&ka, n);
    clg_ka_float(&ka, inv_scale);
    clg_ka_mem(&ka, flag);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "arguments of unscale_check"));
    return clg_launch_1d(dev, k, (size_t)n, STEP_WG);
}

clg_status clg_optk_red_wg(clg_device *dev, int *wg)
{
    cl_kernel k;
    size_t w = RED_WG;
    CLG_TRY(clg_kernel_get_wg(dev, "optim", "lane_add", "WG", RED_WG, &k, &w));
    *wg = (int)w;
    return CLG_OK;
}

size_t clg_optk_sumsq_grid(size_t n, int *wg, int max_groups)
{
    *wg = CLG_MAX(1, CLG_MIN(*wg, RED_WG));
    size_t groups = CLG_MIN((size_t)CLG_MAX(max_groups, 1), CLG_MAX((size_t)1, CLG_CEIL_DIV(n, (size_t)*wg)));
    return groups * (size_t)*wg;
}

/* clg_optk_sum_sq_part, the sum stored into y (NULL: not) and, with back, into every back[l] too (back then
 * aliases src: each element is read before it is written, by the one caller that owns its work-item). */
static void sum_sq(float *y, const float *const *src, float *const *back, int m, size_t n, size_t global, size_t t0,
                   size_t t1, float *acc)
{
    for (size_t t = t0; t < t1; t++)
        acc[t] = 0.0f;
    for (size_t base = 0; base < n; base += global) {
        size_t e = CLG_MIN(t1, n - base); /* this period's work-items t0 .. e */
        float *yb = y ? y + base : NULL;
        const float *a = m > 0 ? src[0] + base : NULL, *b = m > 1 ? src[1] + base : NULL;
        if (m == 2 && back) { /* two lanes summed into both: one vectorisable pass */
            float *wa = back[0] + base, *wb = back[1] + base;
            for (size_t t = t0; t < e; t++) {
                float v = a[t] + b[t];
                float p = v * v; /* two statements: never contracted to an fma */
                wa[t] = v;
                wb[t] = v;
                acc[t] += p;
            }
            continue;
        }
        if (m == 2 && yb) { /* two lanes: one vectorisable pass */
            for (size_t t = t0; t < e; t++) {
                float v = a[t] + b[t];
                float p = v * v;
                yb[t] = v;
                acc[t] += p;
            }
            continue;
        }
        for (size_t t = t0; t < e; t++) {
            float v = m > 0 ? a[t] : 0.0f;
            for (int l = 1; l < m; l++)
                v += src[l][base + t];
            float p = v * v;
            if (yb)
                yb[t] = v;
            for (int l = 0; back && l < m; l++)
                back[l][base + t] = v;
            acc[t] += p;
        }
    }
}

void clg_optk_sum_sq_part(float *y, const float *const *src, int m, size_t n, size_t global, size_t t0, size_t t1,
                          float *acc)
{
    sum_sq(y, src, NULL, m, n, global, t0, t1, acc);
}

void clg_optk_sum_sq_back(float *const *buf, int m, size_t n, size_t global, size_t t0, size_t t1, float *acc)
{
    sum_sq(NULL, (const float *const *)buf, buf, m, n, global, t0, t1, acc);
}

double clg_optk_sumsq_tree(const float *items, int wg, size_t groups)
{
    float acc[RED_WG];
    double sq = 0;
    for (size_t g = 0; g < groups; g++) {
        memcpy(acc, items + g * (size_t)wg, (size_t)wg * sizeof *acc);
        for (int st = wg / 2; st > 0; st >>= 1) /* group_sum_store's tree */
            for (int t = 0; t < st; t++)
                acc[t] += acc[t + st];
        sq += acc[0];
    }
    return sq;
}

double clg_optk_sumsq_host(const float *x, size_t n, int wg, int max_groups)
{
    size_t global = clg_optk_sumsq_grid(n, &wg, max_groups);
    float *all = malloc(global * sizeof *all);
    if (all) {
        clg_optk_sum_sq_part(NULL, &x, 1, n, global, 0, global, all);
        double sq = clg_optk_sumsq_tree(all, wg, global / (size_t)wg);
        free(all);
        return sq;
    }
    float acc[RED_WG]; /* no memory for all: the same sums, strided (slower) */
    double sq = 0;
    for (size_t g = 0; g < global / (size_t)wg; g++) {
        for (int t = 0; t < wg; t++) { /* work-item g * wg + t */
            float s = 0.0f;
            for (size_t i = g * (size_t)wg + (size_t)t; i < n; i += global) {
                float p = x[i] * x[i];
                s += p;
            }
            acc[t] = s;
        }
        sq += clg_optk_sumsq_tree(acc, wg, 1);
    }
    return sq;
}

clg_status clg_optk_lane_add(clg_device *dev, cl_mem dst, cl_mem a, cl_mem b, size_t k0, size_t n, int sq,
                             cl_mem partial, int off, int max_groups, cl_event *ev)
{
    if (ev)
        *ev = NULL;
    cl_kernel k;
    size_t wg = RED_WG;
    CLG_TRY(clg_kernel_get_wg(dev, "optim", "lane_add", "WG", RED_WG, &k, &wg));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, dst);
    clg_ka_mem(&ka, a);
    clg_ka_mem(&ka, b ? b : a);
    clg_ka_int(&ka, b != NULL);
    clg_ka_int(&ka, (int)k0);
    clg_ka_int(&ka, (int)n);
    clg_ka_int(&ka, sq);
    clg_ka_mem(&ka, partial);
    clg_ka_int(&ka, off);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "lane_add arguments"));
    size_t groups = CLG_MIN((size_t)max_groups, CLG_MAX((size_t)1, CLG_CEIL_DIV(n, wg)));
    size_t global = groups * wg;
    if (sq && groups < (size_t)max_groups) /* unused partial slots read as zero */
        CLG_TRY(clg_buf_fill(dev, partial, (size_t)off + groups, (size_t)max_groups - groups, 0.0f));
    return clg_launch(dev, k, 1, &global, &wg, CLG_LAUNCH_FIXED, ev);
}
