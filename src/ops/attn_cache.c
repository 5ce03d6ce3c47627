/* Generation's key/value cache in fp32 or half (attn_cache.h, attention.h;
 * kernels in cl/decode.cl, the half variants built with -DKV_HALF). */
#include <stdio.h>

#include "ops/attn_cache.h"

/* The descriptor, a->T new rows of x and y (N samples each) and the caches of Tc rows per sample. */
static clg_status check_all(clg_device *dev, const clg_attn_desc *a, const char *op, int Tc, int past,
                            const char *xn, const clg_attn_seq *x, const char *yn, const clg_attn_seq *y,
                            const clg_attn_seq *kc, const clg_attn_seq *vc)
{
    CLG_TRY(clg_attn_check(dev, a));
    CLG_TRY(clg_attn_check_rows(dev, a, op, xn, x, (double)a->N * a->T));
    CLG_TRY(clg_attn_check_rows(dev, a, op, yn, y, (double)a->N * a->T));
    if (Tc < 1 || past < 0 || past > Tc - a->T)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE,
                           "%s: %d cached + %d new positions do not fit a cache of %d positions", op, past, a->T, Tc);
    CLG_TRY(clg_attn_check_rows(dev, a, op, "k cache", kc, (double)a->N * Tc));
    return clg_attn_check_rows(dev, a, op, "v cache", vc, (double)a->N * Tc);
}

static void ka_seq(clg_kargs *ka, const clg_attn_seq *s)
{
    cl_uint off = (cl_uint)s->off, ld = (cl_uint)s->ld;
    CLG_KA(ka, s->mem);
    CLG_KA(ka, off);
    CLG_KA(ka, ld);
}

static clg_status kernel(clg_device *dev, const clg_attn_desc *a, int half, const char *name, cl_kernel *k)
{
    char opt[48];
    snprintf(opt, sizeof opt, "-DHD=%d%s", a->d, half ? " -DKV_HALF" : "");
    return clg_kernel_get(dev, "decode", opt, name, k);
}

/* Rows past .. of each sample's cache = the a->T new rows of x. */
static clg_status append_one(clg_device *dev, const clg_attn_desc *a, int half, int Tc, int past,
                             const clg_attn_seq *x, const clg_attn_seq *cache)
{
    cl_kernel k;
    CLG_TRY(kernel(dev, a, half, "kv_append", &k));
    cl_uint C = (cl_uint)(a->heads * a->d), Tq = (cl_uint)a->T, utc = (cl_uint)Tc, upast = (cl_uint)past;
    cl_uint N = (cl_uint)a->N;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, C);
    CLG_KA(&ka, Tq);
    CLG_KA(&ka, utc);
    CLG_KA(&ka, upast);
    CLG_KA(&ka, N);
    ka_seq(&ka, x);
    ka_seq(&ka, cache);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t g[2] = {(size_t)C, (size_t)a->N * a->T};
    return clg_launch(dev, k, 2, g, NULL, CLG_LAUNCH_PAD, NULL);
}

clg_status clg_attn_cache_append_prec(clg_device *dev, const clg_attn_desc *a, int half, int Tc, int past,
                                      const clg_attn_seq *k_new, const clg_attn_seq *v_new, const clg_attn_seq *kc,
                                      const clg_attn_seq *vc)
{
    const char *op = half ? "attention cache append (half)" : "attention cache append";
    CLG_TRY(check_all(dev, a, op, Tc, past, "k", k_new, "v", v_new, kc, vc));
    CLG_TRY(append_one(dev, a, half, Tc, past, k_new, kc));
    return append_one(dev, a, half, Tc, past, v_new, vc);
}

clg_status clg_attn_forward_cached_prec(clg_device *dev, const clg_attn_desc *a, int half, int Tc, int past,
                                        const clg_attn_seq *q, const clg_attn_seq *kc, const clg_attn_seq *vc,
                                        const clg_attn_seq *o)
{
    const char *op = half ? "attention forward (cached, half)" : "attention forward (cached)";
    CLG_TRY(check_all(dev, a, op, Tc, past, "q", q, "o", o, kc, vc));
    cl_kernel k;
    CLG_TRY(kernel(dev, a, half, "attn_fwd_cached", &k));
    cl_uint Tq = (cl_uint)a->T, utc = (cl_uint)Tc, upast = (cl_uint)past, H = (cl_uint)a->heads;
    cl_uint NH = (cl_uint)(a->N * a->heads);
    cl_float sc = a->scale;
    cl_int causal = a->causal ? 1 : 0;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, Tq);
    CLG_KA(&ka, utc);
    CLG_KA(&ka, upast);
    CLG_KA(&ka, H);
    CLG_KA(&ka, NH);
    CLG_KA(&ka, sc);
    CLG_KA(&ka, causal);
    ka_seq(&ka, q);
    ka_seq(&ka, kc);
    ka_seq(&ka, vc);
    ka_seq(&ka, o);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t g[2] = {(size_t)a->T, (size_t)NH};
    return clg_launch(dev, k, 2, g, NULL, CLG_LAUNCH_PAD, NULL);
}

clg_status clg_attn_cache_append(clg_device *dev, const clg_attn_desc *a, int Tc, int past, const clg_attn_seq *k_new,
                                 const clg_attn_seq *v_new, const clg_attn_seq *kc, const clg_attn_seq *vc)
{
    return clg_attn_cache_append_prec(dev, a, 0, Tc, past, k_new, v_new, kc, vc);
}

clg_status clg_attn_forward_cached(clg_device *dev, const clg_attn_desc *a, int Tc, int past, const clg_attn_seq *q,
                                   const clg_attn_seq *kc, const clg_attn_seq *vc, const clg_attn_seq *o)
{
    return clg_attn_forward_cached_prec(dev, a, 0, Tc, past, q, kc, vc, o);
}
