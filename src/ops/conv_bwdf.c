/* Weight and bias gradients as reductions read straight from dy in NCHW
 * layout (cl/conv_bwdf.cl): per-(channel, image-chunk) partial sums and one
 * reduction pass, instead of transposing dy for a GEMM. Used for the bias
 * gradient of every convolution and, with im2col, for the weight gradient
 * of filters with few taps (C*R*S <= CLG_BWDF_MAXJ, groups 1: first layers),
 * where the GEMM would be only C*R*S columns wide. */
#include "conv_impl.h"

int clg_conv_bwdf_small_ok(const clg_conv_shape *s)
{
    return s->groups == 1 && s->C * s->R * s->S <= CLG_BWDF_MAXJ;
}

int clg_conv_bwdf_nper(int N, int K)
{
    /* about 256 work-items or more: enough chunks for every core, chunks
     * long enough that the partials stay small */
    long n = (long)N * K / 256;
    return (int)CLG_MAX(1L, CLG_MIN((long)N, n));
}

clg_status clg_conv_bwdf_small_chunk(clg_device *dev, int J, cl_mem dy, size_t offdy, cl_mem col, int ldcol, int nimg,
                                     int K, int PQ, int nper, int pch0, cl_mem part)
{
    char opts[32];
    snprintf(opts, sizeof opts, "-D BFJ=%d", J);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_bwdf", opts, "bwdf_small", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, dy);
    clg_ka_int(&a, (int)offdy);
    clg_ka_mem(&a, col);
    clg_ka_int(&a, ldcol);
    clg_ka_int(&a, nimg);
    clg_ka_int(&a, K);
    clg_ka_int(&a, PQ);
    clg_ka_int(&a, nper);
    clg_ka_int(&a, pch0);
    clg_ka_mem(&a, part);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "bwdf_small args"));
    size_t gws[2] = {(size_t)K, (size_t)CLG_CEIL_DIV(nimg, nper)};
    return clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
}

clg_status clg_conv_part_reduce(clg_device *dev, cl_mem part, int chunks, int rows, int cols, int ps, int pc0,
                                float beta, cl_mem out, size_t offo, int ldo)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_bwdf", "", "part_reduce", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, part);
    clg_ka_int(&a, chunks);
    clg_ka_int(&a, rows);
    clg_ka_int(&a, cols);
    clg_ka_int(&a, ps);
    clg_ka_int(&a, pc0);
    clg_ka_float(&a, beta);
    clg_ka_mem(&a, out);
    clg_ka_int(&a, (int)offo);
    clg_ka_int(&a, ldo);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "part_reduce args"));
    size_t gws[2] = {(size_t)rows, (size_t)cols};
    return clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
}

clg_status clg_conv_part_reduce_wb(clg_device *dev, cl_mem part, int chunks, int K, int J, float beta, cl_mem dw,
                                   size_t offdw, cl_mem db, size_t offdb)
{
    CLG_TRY(clg_conv_part_reduce(dev, part, chunks, K, J, J + 1, 0, beta, dw, offdw, J));
    return db ? clg_conv_part_reduce(dev, part, chunks, K, 1, J + 1, J, beta, db, offdb, 1) : CLG_OK;
}

clg_status clg_conv_bias_grad(clg_device *dev, const clg_conv_shape *s, cl_mem dy, size_t offdy, float beta, cl_mem db,
                              size_t offdb)
{
    int PQ = clg_conv_out_h(s) * clg_conv_out_w(s);
    int nper = clg_conv_bwdf_nper(s->N, s->K), chunks = CLG_CEIL_DIV(s->N, nper);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_bwdf", "", "bias_part", &k));
    cl_mem part = NULL;
    CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)chunks * s->K, &part));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, dy);
    clg_ka_int(&a, (int)offdy);
    clg_ka_int(&a, s->N);
    clg_ka_int(&a, s->K);
    clg_ka_int(&a, PQ);
    clg_ka_int(&a, nper);
    clg_ka_mem(&a, part);
    clg_status st = CLG_KA_DONE(clg_dev_err(dev), &a, "bias_part args");
    if (st == CLG_OK) {
        size_t gws[2] = {(size_t)s->K, (size_t)chunks};
        st = clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
    }
    if (st == CLG_OK)
        st = clg_conv_part_reduce(dev, part, chunks, s->K, 1, 1, 0, beta, db, offdb, 1);
    clg_buf_release(dev, part);
    return st;
}
