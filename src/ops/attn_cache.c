/* The half key/value cache of generation (attn_cache.h, cl/decode.cl). */
#include <stdio.h>

#include "ops/attn_cache.h"

/* seq holds rows rows of a->heads * a->d values at pitch ld from off, within 32-bit offsets. */
static clg_status check_rows(clg_device *dev, const clg_attn_desc *a, const char *op, const char *name,
                             const clg_attn_seq *s, double rows)
{
    clg_err *err = clg_dev_err(dev);
    if (!s || !s->mem)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: NULL buffer '%s'", op, name);
    if (s->ld < a->heads * a->d)
        return clg_err_set(err, CLG_ERR_SHAPE, "%s: '%s' row pitch %d is below heads x d = %d", op, name, s->ld,
                           a->heads * a->d);
    double end = (double)s->off + rows * s->ld;
    if (end > 4294967295.0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: '%s' spans %.0f elements, over the 2^32 limit", op, name,
                           end);
    return CLG_OK;
}

static clg_status check_cache(clg_device *dev, const clg_attn_desc *a, const char *op, int Tc, int past,
                              const clg_attn_seq *kc, const clg_attn_seq *vc)
{
    CLG_TRY(clg_attn_check(dev, a));
    if (Tc < 1 || past < 0 || past > Tc - a->T)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE,
                           "%s: %d cached + %d new positions do not fit a cache of %d positions", op, past, a->T, Tc);
    CLG_TRY(check_rows(dev, a, op, "k cache", kc, (double)a->N * Tc));
    return check_rows(dev, a, op, "v cache", vc, (double)a->N * Tc);
}

static void ka_seq(clg_kargs *ka, const clg_attn_seq *s)
{
    cl_uint off = (cl_uint)s->off, ld = (cl_uint)s->ld;
    CLG_KA(ka, s->mem);
    CLG_KA(ka, off);
    CLG_KA(ka, ld);
}

static clg_status append_one(clg_device *dev, const clg_attn_desc *a, int Tc, int past, const clg_attn_seq *x,
                             const clg_attn_seq *cache)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "decode", "", "kv_append_half", &k));
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

clg_status clg_attn_cache_append_half(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                      const clg_attn_seq *k_new, const clg_attn_seq *v_new, const clg_attn_seq *kc,
                                      const clg_attn_seq *vc)
{
    const char *op = "attention cache append (half)";
    CLG_TRY(check_cache(dev, a, op, Tc, past, kc, vc));
    CLG_TRY(check_rows(dev, a, op, "k", k_new, (double)a->N * a->T));
    CLG_TRY(check_rows(dev, a, op, "v", v_new, (double)a->N * a->T));
    CLG_TRY(append_one(dev, a, Tc, past, k_new, kc));
    return append_one(dev, a, Tc, past, v_new, vc);
}

clg_status clg_attn_forward_cached_half(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                        const clg_attn_seq *q, const clg_attn_seq *kc, const clg_attn_seq *vc,
                                        const clg_attn_seq *o)
{
    const char *op = "attention forward (cached, half)";
    CLG_TRY(check_cache(dev, a, op, Tc, past, kc, vc));
    CLG_TRY(check_rows(dev, a, op, "q", q, (double)a->N * a->T));
    CLG_TRY(check_rows(dev, a, op, "o", o, (double)a->N * a->T));
    char opt[32];
    snprintf(opt, sizeof opt, "-DHD=%d", a->d);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "decode", opt, "attn_fwd_cached_half", &k));
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
