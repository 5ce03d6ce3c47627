/* Precision conversion launchers (cl/convert.cl); see convert.h. */
#include <stdint.h>

#include "ops/convert.h"

static const char *cvt_opts(const clg_device *dev) { return dev->info.has_fp16 ? "-D HAVE_FP16=1" : ""; }

/* One of the (mem a, int aoff, mem b, int boff, int n) kernels. */
static clg_status cvt(clg_device *dev, const char *kernel, cl_mem a, size_t aoff, cl_mem b, size_t boff, size_t n)
{
    clg_err *err = clg_dev_err(dev);
    if (n == 0)
        return CLG_OK;
    if (n > INT32_MAX || aoff > INT32_MAX || boff > INT32_MAX)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "fp16 conversion of %zu elements: too large for one kernel", n);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "convert", cvt_opts(dev), kernel, &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, a);
    clg_ka_int(&ka, (int)aoff);
    clg_ka_mem(&ka, b);
    clg_ka_int(&ka, (int)boff);
    clg_ka_int(&ka, (int)n);
    CLG_TRY(CLG_KA_DONE(err, &ka, kernel));
    return clg_launch_1d(dev, k, n, 64);
}

clg_status clg_cvt_f32_to_f16(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n)
{
    return cvt(dev, "f32_to_f16", x, xoff, y, yoff, n);
}

clg_status clg_cvt_f32_to_f16_keep(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n)
{
    return cvt(dev, "f32_to_f16_keep", x, xoff, y, yoff, n);
}

clg_status clg_cvt_f16_to_f32(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n)
{
    return cvt(dev, "f16_to_f32", x, xoff, y, yoff, n);
}

clg_status clg_cvt_f32_round_f16(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n)
{
    return cvt(dev, "f32_round_f16", x, xoff, y, yoff, n);
}

clg_status clg_cvt_f16_add_f32(clg_device *dev, cl_mem y, size_t yoff, cl_mem x, size_t xoff, size_t n)
{
    return cvt(dev, "f16_add_f32", y, yoff, x, xoff, n);
}

clg_status clg_cvt_round_weights(clg_device *dev, cl_mem master, cl_mem w16, cl_mem w32, size_t n)
{
    clg_err *err = clg_dev_err(dev);
    if (n > INT32_MAX)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "weight rounding of %zu elements: too large for one kernel", n);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "convert", cvt_opts(dev), "round_weights", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_mem(&ka, master);
    clg_ka_mem(&ka, w16);
    clg_ka_mem(&ka, w32);
    clg_ka_int(&ka, (int)n);
    CLG_TRY(CLG_KA_DONE(err, &ka, "round_weights"));
    return clg_launch_1d(dev, k, n, 64);
}
