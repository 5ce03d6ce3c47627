/* Host launchers for the network ops (see nn.h). */
#include <math.h>
#include <string.h>

#include "nn.h"

/* Work-group size for 1-D element-wise kernels (global size rounded up). */
#define EW_WG 256
/* Defaults of SM_WG (softmax.cl), PS_WG (eltwise.cl): reduction groups of a
 * fixed size, lowered by build option where the device allows fewer. */
#define SM_WG 64
#define PS_WG 64

static const char *const act_names[] = {"linear", "relu", "leaky", "sigmoid", "tanh", "gelu", "gelu_tanh", NULL};
const char *const *clg_act_names(void) { return act_names; }

/* ---- helpers ---- */

/* Every count/offset handed to a kernel must fit a uint. */
static clg_status u32(clg_device *dev, const char *what, size_t v, cl_uint *out)
{
    if (v > 0xffffffffu)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "%s: %zu elements exceed the 2^32 limit of the element-wise kernels", what, v);
    *out = (cl_uint)v;
    return CLG_OK;
}

static clg_status kget(clg_device *dev, const char *prog, const char *name, cl_kernel *k)
{
    return clg_kernel_get(dev, prog, "", name, k);
}

/* The element-wise launchers below bound-check every index: their groups may
 * shrink to the kernel's limits (CLG_LAUNCH_FIT). */
static clg_status run2(clg_device *dev, cl_kernel k, size_t n0, size_t n1, size_t wg0)
{
    size_t g[2] = {CLG_CEIL_DIV(n0, wg0) * wg0, n1};
    size_t l[2] = {wg0, 1};
    return clg_launch(dev, k, 2, g, l, CLG_LAUNCH_FIT, NULL);
}

/* Work-groups of wg (the kernel's reqd_work_group_size), ngroups of them. */
static clg_status run_groups(clg_device *dev, cl_kernel k, size_t ngroups, size_t wg)
{
    size_t g = ngroups * wg;
    return clg_launch(dev, k, 1, &g, &wg, CLG_LAUNCH_FIXED, NULL);
}

static clg_status check_mem(clg_device *dev, const char *op, cl_mem m, const char *which)
{
    if (!m)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: NULL buffer '%s'", op, which);
    return CLG_OK;
}

/* check_mem for each of n buffers mems[i] named names[i]. */
static clg_status check_mems(clg_device *dev, const char *op, int n, const cl_mem *mems, const char *const *names)
{
    for (int i = 0; i < n; i++)
        CLG_TRY(check_mem(dev, op, mems[i], names[i]));
    return CLG_OK;
}

/* Kernel k's arguments: u0, u1, then per buffer m[i] its uint element offset o[i] (nb of them). */
static clg_status ka_uu_bufs(clg_device *dev, cl_kernel k, cl_uint u0, cl_uint u1, int nb, const cl_mem *m,
                             const cl_uint *o)
{
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, u0);
    CLG_KA(&ka, u1);
    for (int i = 0; i < nb; i++) {
        CLG_KA(&ka, m[i]);
        CLG_KA(&ka, o[i]);
    }
    return CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
}

/* Argument `at` of k: the relu flag of the 2x2 max-pooling backward kernels. */
static clg_status ka_relu(clg_device *dev, cl_kernel k, cl_uint at, int relu)
{
    clg_kargs ka = {k, at, CL_SUCCESS};
    clg_ka_uint(&ka, relu ? 1u : 0u);
    return CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
}

/* Checks that n elements from off fit in 32 bits. */
static clg_status range(clg_device *dev, const char *op, size_t off, size_t n, cl_uint *o)
{
    cl_uint dummy;
    CLG_TRY(u32(dev, op, off + n, &dummy));
    *o = (cl_uint)off;
    return CLG_OK;
}

/* ---- activations ---- */

/* The element-wise kernel kname of eltwise.cl over n elements, arguments (uint n, [float *alpha], then per buffer
 * m[i] its uint offset o[i]): every buffer non-NULL (names[i] in the message), n and each o[i] + n within 32 bits. */
static clg_status ew_run(clg_device *dev, const char *op, const char *kname, size_t n, const float *alpha, int nb,
                         const cl_mem *m, const size_t *o, const char *const *names)
{
    CLG_TRY(check_mems(dev, op, nb, m, names));
    cl_uint un, uo[4];
    CLG_TRY(u32(dev, op, n, &un));
    for (int i = 0; i < nb; i++)
        CLG_TRY(range(dev, op, o[i], n, &uo[i]));
    cl_kernel k;
    CLG_TRY(kget(dev, "eltwise", kname, &k));
    cl_float a = alpha ? *alpha : 0.0f;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, un);
    if (alpha)
        CLG_KA(&ka, a);
    for (int i = 0; i < nb; i++) {
        CLG_KA(&ka, m[i]);
        CLG_KA(&ka, uo[i]);
    }
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return clg_launch_1d(dev, k, n, EW_WG);
}

clg_status clg_nn_act_forward(clg_device *dev, clg_act act, float alpha, size_t n, cl_mem x, size_t ox, cl_mem y,
                              size_t oy)
{
    if (act < 0 || act >= CLG_ACT_COUNT)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "activation: unknown type %d", (int)act);
    CLG_TRY(check_mem(dev, "activation", x, "x"));
    CLG_TRY(check_mem(dev, "activation", y, "y"));
    if (act == CLG_ACT_LINEAR)
        return (x == y && ox == oy) ? CLG_OK : clg_nn_copy(dev, n, x, ox, y, oy);
    char name[32];
    snprintf(name, sizeof name, "act_%s_fwd", act_names[act]);
    static const char *const names[] = {"x", "y"};
    return ew_run(dev, "activation", name, n, &alpha, 2, (cl_mem[]){x, y}, (size_t[]){ox, oy}, names);
}

clg_status clg_nn_act_backward(clg_device *dev, clg_act act, float alpha, size_t n, cl_mem x, size_t ox, cl_mem y,
                               size_t oy, cl_mem dy, size_t ody, cl_mem dx, size_t odx)
{
    if (act < 0 || act >= CLG_ACT_COUNT)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "activation: unknown type %d", (int)act);
    CLG_TRY(check_mem(dev, "activation backward", dy, "dy"));
    CLG_TRY(check_mem(dev, "activation backward", dx, "dx"));
    if (act == CLG_ACT_LINEAR)
        return (dx == dy && odx == ody) ? CLG_OK : clg_nn_copy(dev, n, dy, ody, dx, odx);
    if (clg_act_needs_x(act))
        CLG_TRY(check_mem(dev, "gelu backward", x, "x (forward input)"));
    else
        CLG_TRY(check_mem(dev, "activation backward", y, "y (forward output)"));
    if (!x) {
        x = y;
        ox = oy;
    }
    if (!y) {
        y = x;
        oy = ox;
    }
    char name[32];
    snprintf(name, sizeof name, "act_%s_bwd", act_names[act]);
    static const char *const names[] = {"x", "y", "dy", "dx"};
    return ew_run(dev, "activation backward", name, n, &alpha, 4, (cl_mem[]){x, y, dy, dx},
                  (size_t[]){ox, oy, ody, odx}, names);
}

/* ---- add, copies, dropout, sums ---- */

clg_status clg_nn_add(clg_device *dev, size_t n, cl_mem a, size_t oa, cl_mem b, size_t ob, cl_mem y, size_t oy)
{
    static const char *const names[] = {"a", "b", "y"};
    return ew_run(dev, "add", "add2", n, NULL, 3, (cl_mem[]){a, b, y}, (size_t[]){oa, ob, oy}, names);
}

clg_status clg_nn_add_acc(clg_device *dev, size_t n, cl_mem a, size_t oa, cl_mem y, size_t oy)
{
    static const char *const names[] = {"a", "y"};
    return ew_run(dev, "add", "add_acc", n, NULL, 2, (cl_mem[]){a, y}, (size_t[]){oa, oy}, names);
}

clg_status clg_nn_copy(clg_device *dev, size_t n, cl_mem src, size_t os, cl_mem dst, size_t od)
{
    CLG_TRY(check_mem(dev, "copy", src, "src"));
    CLG_TRY(check_mem(dev, "copy", dst, "dst"));
    if (n == 0 || (src == dst && os == od))
        return CLG_OK;
    /* a kernel, not clEnqueueCopyBuffer: see cl/eltwise.cl `copy` */
    static const char *const names[] = {"src", "dst"};
    return ew_run(dev, "copy", "copy", n, NULL, 2, (cl_mem[]){src, dst}, (size_t[]){os, od}, names);
}

clg_status clg_nn_copy_rows(clg_device *dev, size_t len, size_t rows, cl_mem src, size_t os, size_t ss, cl_mem dst,
                            size_t od, size_t sd)
{
    CLG_TRY(check_mem(dev, "copy rows", src, "src"));
    CLG_TRY(check_mem(dev, "copy rows", dst, "dst"));
    if (len == 0 || rows == 0)
        return CLG_OK;
    cl_uint ul, ur, uos, uss, uod, usd;
    CLG_TRY(u32(dev, "copy rows", len, &ul));
    CLG_TRY(u32(dev, "copy rows", rows, &ur));
    CLG_TRY(range(dev, "copy rows", os, (rows - 1) * ss + len, &uos));
    CLG_TRY(range(dev, "copy rows", od, (rows - 1) * sd + len, &uod));
    CLG_TRY(u32(dev, "copy rows", ss, &uss));
    CLG_TRY(u32(dev, "copy rows", sd, &usd));
    cl_kernel k;
    CLG_TRY(kget(dev, "eltwise", "copy_rows", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, ul);
    CLG_KA(&ka, ur);
    CLG_KA(&ka, src);
    CLG_KA(&ka, uos);
    CLG_KA(&ka, uss);
    CLG_KA(&ka, dst);
    CLG_KA(&ka, uod);
    CLG_KA(&ka, usd);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run2(dev, k, len, rows, EW_WG);
}

static uint32_t mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

float clg_nn_dropout_scale_host(uint32_t seed, uint32_t step, uint32_t idx, float p)
{
    uint32_t h = mix32(idx ^ mix32(seed ^ mix32(step + 0x9e3779b9u)));
    float u = (float)(h >> 8) * (1.0f / 16777216.0f);
    return u >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* The dropout kernels: "dropout" (element base + i) or, with len > 0,
 * "dropout_rows" (rows of len elements of a layer stride wide). */
static clg_status dropout_launch(clg_device *dev, size_t n, float p, uint32_t seed, uint32_t step, uint32_t base,
                                 size_t len, size_t stride, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    CLG_TRY(check_mem(dev, "dropout", x, "x"));
    CLG_TRY(check_mem(dev, "dropout", y, "y"));
    cl_uint un, uox, uoy, ul = 0, us = 0;
    CLG_TRY(u32(dev, "dropout", n, &un));
    if (len) {
        CLG_TRY(u32(dev, "dropout", len, &ul));
        CLG_TRY(u32(dev, "dropout", stride, &us));
    }
    CLG_TRY(range(dev, "dropout", ox, n, &uox));
    CLG_TRY(range(dev, "dropout", oy, n, &uoy));
    cl_kernel k;
    CLG_TRY(kget(dev, "eltwise", len ? "dropout_rows" : "dropout", &k));
    cl_uint s = seed, st = step, b = base;
    cl_float fp = p, inv = 1.0f / (1.0f - p);
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, un);
    CLG_KA(&ka, s);
    CLG_KA(&ka, st);
    CLG_KA(&ka, b);
    CLG_KA(&ka, fp);
    CLG_KA(&ka, inv);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    if (len) {
        CLG_KA(&ka, ul);
        CLG_KA(&ka, us);
    }
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return clg_launch_1d(dev, k, n, EW_WG);
}

clg_status clg_nn_dropout(clg_device *dev, size_t n, float p, uint32_t seed, uint32_t step, uint32_t base, cl_mem x,
                          size_t ox, cl_mem y, size_t oy)
{
    if (!(p >= 0.0f && p < 1.0f))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "dropout: p=%g outside [0, 1)", (double)p);
    return dropout_launch(dev, n, p, seed, step, base, 0, 0, x, ox, y, oy);
}

clg_status clg_nn_dropout_rows(clg_device *dev, size_t n, float p, uint32_t seed, uint32_t step, uint32_t base,
                               size_t len, size_t stride, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    if (!(p >= 0.0f && p < 1.0f) || len == 0 || len > stride || n % len)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "dropout: p=%g, rows of %zu in %zu, %zu elements",
                           (double)p, len, stride, n);
    return dropout_launch(dev, n, p, seed, step, base, len, stride, x, ox, y, oy);
}

/* Rows per chunk of the two-stage column sums (colsum_part, colsum_fin),
 * and the row count from which clg_nn_colsum takes them. */
#define COLSUM_R 64
#define COLSUM_TALL 512

/* Column sums of rows x cols in chunks of COLSUM_R rows (see colsum_part in
 * cl/eltwise.cl): kname's partial sums into a pool temporary, then
 * colsum_fin into db. x, dz may be NULL for the plain sum. Offsets checked
 * by the caller. */
static clg_status colsum_chunked(clg_device *dev, const char *kname, cl_uint ur, cl_uint uc, cl_mem x, cl_uint uox,
                                 cl_mem dy, cl_uint uody, cl_mem dz, cl_uint uodz, cl_mem db, cl_uint uodb)
{
    int vec8 = strstr(kname, "part8") != NULL; /* 8 columns per work-item */
    cl_uint chunks = (ur + COLSUM_R - 1) / COLSUM_R, R = COLSUM_R;
    if (ur == 0 || uc == 0) /* sums of no rows are 0 */
        return uc ? clg_buf_fill(dev, db, uodb, uc, 0.0f) : CLG_OK;
    cl_mem part = NULL;
    CLG_TRY(clg_buf_alloc(dev, (size_t)chunks * uc * sizeof(float), &part));
    cl_kernel k = NULL;
    cl_mem xx = x ? x : dy, zz = dz ? dz : part;
    clg_status st = kget(dev, "eltwise", kname, &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, ur);
        CLG_KA(&ka, uc);
        CLG_KA(&ka, R);
        CLG_KA(&ka, xx);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, dy);
        CLG_KA(&ka, uody);
        CLG_KA(&ka, zz);
        CLG_KA(&ka, uodz);
        CLG_KA(&ka, part);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    cl_uint n0 = vec8 ? uc / 8 : uc; /* work-items along the columns */
    if (st == CLG_OK)
        st = run2(dev, k, n0, chunks, n0 >= 64 ? 64 : 16);
    if (st == CLG_OK)
        st = kget(dev, "eltwise", "colsum_fin", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uc);
        CLG_KA(&ka, chunks);
        CLG_KA(&ka, part);
        CLG_KA(&ka, db);
        CLG_KA(&ka, uodb);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = clg_launch_1d(dev, k, uc, EW_WG);
    clg_buf_release(dev, part); /* in-order queue: reused only by later commands */
    return st;
}

clg_status clg_nn_act_forward_d(clg_device *dev, clg_act act, size_t n, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    if (act != CLG_ACT_GELU && act != CLG_ACT_GELU_TANH)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "activation with derivative: activation %d is not a GELU form", (int)act);
    static const char *const names[] = {"x", "y"};
    return ew_run(dev, "activation with derivative", act == CLG_ACT_GELU ? "act_gelu_fwd_d" : "act_gelu_tanh_fwd_d",
                  n, NULL, 2, (cl_mem[]){x, y}, (size_t[]){ox, oy}, names);
}

/* dz = dy * (the kernel's factor), db = colsum(dz): act_*_bwd_colsum_part, dmul_colsum_part. */
static clg_status bwd_colsum(clg_device *dev, const char *o, const char *kbase, size_t rows, size_t cols, cl_mem x,
                             size_t ox, cl_mem dy, size_t ody, cl_mem dz, size_t odz, cl_mem db, size_t odb)
{
    CLG_TRY(check_mems(dev, o, 4, (const cl_mem[]){x, dy, dz, db}, (const char *const[]){"x", "dy", "dz", "db"}));
    cl_uint ur = 0, uc = 0, uox = 0, uody = 0, uodz = 0, uodb = 0;
    CLG_TRY(u32(dev, o, rows, &ur));
    CLG_TRY(u32(dev, o, cols, &uc));
    CLG_TRY(u32(dev, o, rows * cols, &uody)); /* the element count must fit too */
    CLG_TRY(range(dev, o, ox, rows * cols, &uox));
    CLG_TRY(range(dev, o, ody, rows * cols, &uody));
    CLG_TRY(range(dev, o, odz, rows * cols, &uodz));
    CLG_TRY(range(dev, o, odb, cols, &uodb));
    char kname[48];
    snprintf(kname, sizeof kname, "%s%s", kbase, cols % 8 == 0 ? "8" : "");
    return colsum_chunked(dev, kname, ur, uc, x, uox, dy, uody, dz, uodz, db, uodb);
}

clg_status clg_nn_act_bwd_colsum(clg_device *dev, clg_act act, size_t rows, size_t cols, cl_mem x, size_t ox,
                                 cl_mem dy, size_t ody, cl_mem dz, size_t odz, cl_mem db, size_t odb)
{
    const char *o = "activation backward + column sum";
    if (act != CLG_ACT_GELU && act != CLG_ACT_GELU_TANH)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "%s: activation %d is not a GELU form", o,
                           (int)act);
    return bwd_colsum(dev, o, act == CLG_ACT_GELU ? "act_gelu_bwd_colsum_part" : "act_gelu_tanh_bwd_colsum_part",
                      rows, cols, x, ox, dy, ody, dz, odz, db, odb);
}

clg_status clg_nn_dmul_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem d, size_t od, cl_mem dy, size_t ody,
                              cl_mem dz, size_t odz, cl_mem db, size_t odb)
{
    return bwd_colsum(dev, "derivative product + column sum", "dmul_colsum_part", rows, cols, d, od, dy, ody, dz,
                      odz, db, odb);
}

clg_status clg_nn_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    CLG_TRY(check_mem(dev, "column sum", x, "x"));
    CLG_TRY(check_mem(dev, "column sum", y, "y"));
    cl_uint ur = 0, uc = 0, uox = 0, uoy = 0;
    CLG_TRY(u32(dev, "column sum", rows, &ur));
    CLG_TRY(u32(dev, "column sum", cols, &uc));
    CLG_TRY(range(dev, "column sum", ox, rows * cols, &uox));
    CLG_TRY(range(dev, "column sum", oy, cols, &uoy));
    if (rows >= COLSUM_TALL)
        return colsum_chunked(dev, uc % 8 == 0 ? "colsum_part8" : "colsum_part", ur, uc, NULL, 0, x, uox, NULL, 0, y,
                              uoy);
    cl_kernel k;
    CLG_TRY(kget(dev, "eltwise", "colsum", &k));
    CLG_TRY(ka_uu_bufs(dev, k, ur, uc, 2, (const cl_mem[]){x, y}, (const cl_uint[]){uox, uoy}));
    return clg_launch_1d(dev, k, cols, EW_WG);
}

clg_status clg_nn_relu_bwd_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem y, size_t oy, cl_mem dy,
                                  size_t ody, cl_mem dz, size_t odz, cl_mem db, size_t odb)
{
    const char *o = "relu backward + column sum";
    CLG_TRY(check_mems(dev, o, 4, (const cl_mem[]){y, dy, dz, db}, (const char *const[]){"y", "dy", "dz", "db"}));
    cl_uint ur = 0, uc = 0, uoy = 0, uody = 0, uodz = 0, uodb = 0;
    CLG_TRY(u32(dev, o, rows, &ur));
    CLG_TRY(u32(dev, o, cols, &uc));
    CLG_TRY(u32(dev, o, rows * cols, &uody)); /* the element count must fit too */
    CLG_TRY(range(dev, o, oy, rows * cols, &uoy));
    CLG_TRY(range(dev, o, ody, rows * cols, &uody));
    CLG_TRY(range(dev, o, odz, rows * cols, &uodz));
    CLG_TRY(range(dev, o, odb, cols, &uodb));
    cl_kernel k;
    CLG_TRY(kget(dev, "eltwise", "relu_bwd_colsum", &k));
    CLG_TRY(ka_uu_bufs(dev, k, ur, uc, 4, (const cl_mem[]){y, dy, dz, db}, (const cl_uint[]){uoy, uody, uodz, uodb}));
    return clg_launch_1d(dev, k, cols, EW_WG);
}

clg_status clg_nn_plane_sum(clg_device *dev, int N, int C, size_t hw, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    CLG_TRY(check_mem(dev, "plane sum", x, "x"));
    CLG_TRY(check_mem(dev, "plane sum", y, "y"));
    if (N < 0 || C < 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "plane sum: negative shape N=%d C=%d", N, C);
    cl_uint un = (cl_uint)N, uc = (cl_uint)C, uhw, uox, uoy;
    CLG_TRY(u32(dev, "plane sum", hw, &uhw));
    CLG_TRY(range(dev, "plane sum", ox, (size_t)N * C * hw, &uox));
    CLG_TRY(range(dev, "plane sum", oy, (size_t)C, &uoy));
    cl_kernel k;
    size_t wg;
    CLG_TRY(clg_kernel_get_wg(dev, "eltwise", "plane_sum", "PS_WG", PS_WG, &k, &wg));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, un);
    CLG_KA(&ka, uc);
    CLG_KA(&ka, uhw);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_groups(dev, k, (size_t)C, wg);
}

/* ---- pooling ---- */

int clg_pool_out_h(const clg_pool_shape *s)
{
    if (s->kh <= 0 || s->sh <= 0 || s->ph < 0)
        return 0;
    int span = s->H + 2 * s->ph - s->kh;
    return span < 0 ? 0 : span / s->sh + 1;
}

int clg_pool_out_w(const clg_pool_shape *s)
{
    if (s->kw <= 0 || s->sw <= 0 || s->pw < 0)
        return 0;
    int span = s->W + 2 * s->pw - s->kw;
    return span < 0 ? 0 : span / s->sw + 1;
}

/* Local size for a 2-/3-D range whose dim 0 has n0 items: l0 = power of two
 * >= n0 (8..64), l1 fills the group up to ~256 items (power of two <= n1
 * rounded up). Global sizes are rounded up; kernels check every bound. */
static clg_status run3(clg_device *dev, cl_kernel k, size_t n0, size_t n1, size_t n2)
{
    size_t l0 = 8;
    while (l0 < n0 && l0 < 64)
        l0 *= 2;
    size_t l1 = 1;
    while (l1 * l0 < 256 && l1 < n1)
        l1 *= 2;
    size_t g[3] = {CLG_CEIL_DIV(n0, l0) * l0, CLG_CEIL_DIV(n1, l1) * l1, n2};
    size_t l[3] = {l0, l1, 1};
    return clg_launch(dev, k, 3, g, l, CLG_LAUNCH_FIT, NULL);
}

/* Largest divisor of n that is <= cap (>= 1). */
static size_t divisor_le(size_t n, size_t cap)
{
    for (size_t d = CLG_MIN(n, cap); d > 1; d--)
        if (n % d == 0)
            return d;
    return 1;
}

/* Exact 2-D range (n0, n1) for kernels without bounds checks: local sizes
 * divide the global ones, ~256 work-items per group. */
static clg_status run2_exact(clg_device *dev, cl_kernel k, size_t n0, size_t n1)
{
    size_t l0 = divisor_le(n0, 256);
    size_t l1 = divisor_le(n1, CLG_MAX(256 / CLG_MAX(l0, 1), 1));
    size_t g[2] = {n0, n1}, l[2] = {l0, l1};
    return clg_launch(dev, k, 2, g, l, CLG_LAUNCH_FIT, NULL); /* shrinking keeps l dividing g */
}

/* The 11 shape arguments every general pooling kernel starts with. */
static void pool_args(clg_kargs *a, const clg_pool_shape *s, cl_uint planes)
{
    int P = clg_pool_out_h(s), Q = clg_pool_out_w(s);
    cl_uint v[11] = {planes,        (cl_uint)s->H,  (cl_uint)s->W,  (cl_uint)P,     (cl_uint)Q,    (cl_uint)s->kh,
                     (cl_uint)s->kw, (cl_uint)s->sh, (cl_uint)s->sw, (cl_uint)s->ph, (cl_uint)s->pw};
    for (int i = 0; i < 11; i++)
        clg_ka_uint(a, v[i]);
}

static clg_status pool_check(clg_device *dev, const clg_pool_shape *s, cl_uint *planes)
{
    if (s->N < 0 || s->C <= 0 || s->H <= 0 || s->W <= 0 || clg_pool_out_h(s) <= 0 || clg_pool_out_w(s) <= 0 ||
        s->ph * 2 > s->kh || s->pw * 2 > s->kw)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE,
                           "pool: window %dx%d stride %dx%d pad %dx%d does not fit input %dx%dx%d (padding must be "
                           "at most half the window)",
                           s->kh, s->kw, s->sh, s->sw, s->ph, s->pw, s->C, s->H, s->W);
    CLG_TRY(u32(dev, "pool", (size_t)s->N * s->C * s->H * s->W, planes));
    return u32(dev, "pool", (size_t)s->N * s->C, planes);
}

/* 2x2 stride 2, no padding, even H and W: the vectorized kernels. */
static int pool_is_2x2(const clg_pool_shape *s)
{
    return s->kh == 2 && s->kw == 2 && s->sh == 2 && s->sw == 2 && s->ph == 0 && s->pw == 0 && s->H % 2 == 0 &&
           s->W % 2 == 0;
}

clg_status clg_nn_pool_forward(clg_device *dev, int is_max, const clg_pool_shape *s, cl_mem x, size_t ox, cl_mem y,
                               size_t oy)
{
    CLG_TRY(check_mem(dev, "pool", x, "x"));
    CLG_TRY(check_mem(dev, "pool", y, "y"));
    cl_uint planes = 0, uox, uoy;
    CLG_TRY(pool_check(dev, s, &planes));
    int P = clg_pool_out_h(s), Q = clg_pool_out_w(s);
    size_t nout = (size_t)planes * P * Q;
    CLG_TRY(range(dev, "pool", ox, (size_t)planes * s->H * s->W, &uox));
    CLG_TRY(range(dev, "pool", oy, nout, &uoy));
    cl_kernel k;
    if (is_max && pool_is_2x2(s) && Q % 2 == 0) {
        cl_uint rows = planes * (cl_uint)P, uq2 = (cl_uint)Q / 2;
        CLG_TRY(kget(dev, "pool", "maxpool2_fwd4", &k));
        CLG_TRY(ka_uu_bufs(dev, k, rows, uq2, 2, (const cl_mem[]){x, y}, (const cl_uint[]){uox, uoy}));
        return run2_exact(dev, k, (size_t)uq2, rows);
    }
    if (pool_is_2x2(s)) {
        cl_uint rows = planes * (cl_uint)P, uq = (cl_uint)Q;
        CLG_TRY(kget(dev, "pool", is_max ? "maxpool2_fwd" : "avgpool2_fwd", &k));
        CLG_TRY(ka_uu_bufs(dev, k, rows, uq, 2, (const cl_mem[]){x, y}, (const cl_uint[]){uox, uoy}));
        return run3(dev, k, (size_t)Q, rows, 1);
    }
    CLG_TRY(kget(dev, "pool", is_max ? "maxpool_fwd" : "avgpool_fwd", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    pool_args(&ka, s, planes);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run3(dev, k, (size_t)Q, (size_t)P, planes);
}

/* Max-pooling backward with overlapping windows: the argmax of each window,
 * then every input element gathers the gradients of the windows it won. */
static clg_status maxpool_bwd_gather(clg_device *dev, const clg_pool_shape *s, cl_uint planes, cl_mem x, cl_uint uox,
                                     cl_mem dy, cl_uint uody, cl_mem dx, cl_uint uodx)
{
    int P = clg_pool_out_h(s), Q = clg_pool_out_w(s);
    size_t nout = (size_t)planes * P * Q;
    cl_kernel k;
    cl_mem am;
    CLG_TRY(clg_buf_alloc(dev, nout * sizeof(cl_int), &am));
    clg_status st = kget(dev, "pool", "maxpool_argmax", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        pool_args(&ka, s, planes);
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, am);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = run3(dev, k, (size_t)Q, (size_t)P, planes);
    if (st == CLG_OK)
        st = kget(dev, "pool", "maxpool_bwd", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        pool_args(&ka, s, planes);
        CLG_KA(&ka, am);
        CLG_KA(&ka, dy);
        CLG_KA(&ka, uody);
        CLG_KA(&ka, dx);
        CLG_KA(&ka, uodx);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = run3(dev, k, (size_t)s->W, (size_t)s->H, planes);
    clg_buf_release(dev, am);
    return st;
}

int clg_nn_pool_relu_foldable(int is_max, const clg_pool_shape *s) { return is_max && pool_is_2x2(s); }

clg_status clg_nn_pool_backward(clg_device *dev, int is_max, const clg_pool_shape *s, cl_mem x, size_t ox, cl_mem dy,
                                size_t ody, cl_mem dx, size_t odx, int relu)
{
    if (relu && !clg_nn_pool_relu_foldable(is_max, s))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "pool backward: the relu's derivative folds into 2x2 stride-2 max pooling only");
    if (is_max)
        CLG_TRY(check_mem(dev, "maxpool backward", x, "x"));
    CLG_TRY(check_mem(dev, "pool backward", dy, "dy"));
    CLG_TRY(check_mem(dev, "pool backward", dx, "dx"));
    cl_uint planes = 0, uox = 0, uody, uodx;
    CLG_TRY(pool_check(dev, s, &planes));
    int P = clg_pool_out_h(s), Q = clg_pool_out_w(s);
    size_t nin = (size_t)planes * s->H * s->W;
    size_t nout = (size_t)planes * P * Q;
    if (is_max)
        CLG_TRY(range(dev, "pool backward", ox, nin, &uox));
    CLG_TRY(range(dev, "pool backward", ody, nout, &uody));
    CLG_TRY(range(dev, "pool backward", odx, nin, &uodx));
    cl_kernel k;
    if (is_max && pool_is_2x2(s) && Q % 2 == 0) {
        cl_uint rows = planes * (cl_uint)P, uq2 = (cl_uint)Q / 2;
        CLG_TRY(kget(dev, "pool", "maxpool2_bwd4", &k));
        CLG_TRY(ka_uu_bufs(dev, k, rows, uq2, 3, (const cl_mem[]){x, dy, dx}, (const cl_uint[]){uox, uody, uodx}));
        CLG_TRY(ka_relu(dev, k, 8, relu));
        return run2_exact(dev, k, (size_t)uq2, rows);
    }
    if (pool_is_2x2(s)) {
        cl_uint rows = planes * (cl_uint)P, uq = (cl_uint)Q;
        CLG_TRY(kget(dev, "pool", is_max ? "maxpool2_bwd" : "avgpool2_bwd", &k));
        if (is_max) {
            CLG_TRY(ka_uu_bufs(dev, k, rows, uq, 3, (const cl_mem[]){x, dy, dx}, (const cl_uint[]){uox, uody, uodx}));
            CLG_TRY(ka_relu(dev, k, 8, relu));
        } else {
            CLG_TRY(ka_uu_bufs(dev, k, rows, uq, 2, (const cl_mem[]){dy, dx}, (const cl_uint[]){uody, uodx}));
        }
        return run3(dev, k, (size_t)Q, rows, 1);
    }
    int scatter = s->sh >= s->kh && s->sw >= s->kw;
    if (scatter) {
        /* windows do not overlap; elements outside every window get 0 */
        int covered = s->ph == 0 && s->pw == 0 && s->sh == s->kh && s->sw == s->kw && P * s->sh == s->H &&
                      Q * s->sw == s->W;
        if (!covered)
            CLG_TRY(clg_buf_fill(dev, dx, odx, nin, 0.0f));
        CLG_TRY(kget(dev, "pool", is_max ? "maxpool_bwd_scatter" : "avgpool_bwd_scatter", &k));
    } else if (is_max) {
        /* overlapping max windows: argmax per window, then gather */
        return maxpool_bwd_gather(dev, s, planes, x, uox, dy, uody, dx, uodx);
    } else {
        CLG_TRY(kget(dev, "pool", "avgpool_bwd", &k));
    }
    clg_kargs ka = {k, 0, CL_SUCCESS};
    pool_args(&ka, s, planes);
    if (is_max) {
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
    }
    CLG_KA(&ka, dy);
    CLG_KA(&ka, uody);
    CLG_KA(&ka, dx);
    CLG_KA(&ka, uodx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    if (scatter)
        return run3(dev, k, (size_t)Q, (size_t)P, planes);
    return run3(dev, k, (size_t)s->W, (size_t)s->H, planes);
}

/* Global average pooling, forward (a = x, b = y) or backward (a = dy, b = dx): planes planes of hw elements on the
 * side of x and dx, one per plane on the side of y and dy. */
static clg_status gap_run(clg_device *dev, int bwd, size_t planes, size_t hw, cl_mem a, size_t oa, cl_mem b, size_t ob)
{
    const char *o = bwd ? "global avgpool backward" : "global avgpool";
    CLG_TRY(check_mem(dev, o, a, bwd ? "dy" : "x"));
    CLG_TRY(check_mem(dev, o, b, bwd ? "dx" : "y"));
    cl_uint up = 0, uhw = 0, uoa = 0, uob = 0;
    CLG_TRY(u32(dev, o, planes, &up));
    CLG_TRY(u32(dev, o, hw, &uhw));
    CLG_TRY(range(dev, o, oa, bwd ? planes : planes * hw, &uoa));
    CLG_TRY(range(dev, o, ob, bwd ? planes * hw : planes, &uob));
    cl_kernel k;
    CLG_TRY(kget(dev, "pool", bwd ? "gap_bwd" : "gap_fwd", &k));
    CLG_TRY(ka_uu_bufs(dev, k, up, uhw, 2, (const cl_mem[]){a, b}, (const cl_uint[]){uoa, uob}));
    if (!bwd)
        return clg_launch_1d(dev, k, planes, EW_WG);
    size_t gws[2] = {hw, planes};
    return clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
}

clg_status clg_nn_gap_forward(clg_device *dev, size_t planes, size_t hw, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    return gap_run(dev, 0, planes, hw, x, ox, y, oy);
}

clg_status clg_nn_gap_backward(clg_device *dev, size_t planes, size_t hw, cl_mem dy, size_t ody, cl_mem dx,
                               size_t odx)
{
    return gap_run(dev, 1, planes, hw, dy, ody, dx, odx);
}

/* ---- losses ---- */

/* Softmax cross-entropy forward of N rows of C: per row (a = loss, b = correct) or, reduce, the whole batch in one
 * work-group (a = result, b unused). */
static clg_status xent_forward(clg_device *dev, int reduce, int N, int C, cl_mem x, size_t ox, cl_mem p, size_t op,
                               cl_mem labels, size_t ol, cl_mem a, cl_mem b)
{
    const char *o = reduce ? "softmax cross-entropy (one launch)" : "softmax cross-entropy";
    CLG_TRY(check_mems(dev, o, reduce ? 4 : 5, (const cl_mem[]){x, p, labels, a, b},
                       reduce ? (const char *const[]){"x", "p", "labels", "result", ""}
                              : (const char *const[]){"x", "p", "labels", "loss", "correct"}));
    if (N < 0 || C <= 0 || (reduce && (size_t)N * C > CLG_SM_FUSED_MAX))
        return reduce ? clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE,
                                    "%s: bad shape N=%d classes=%d (N * classes at most %d)", o, N, C,
                                    CLG_SM_FUSED_MAX)
                      : clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "%s: bad shape N=%d classes=%d", o, N, C);
    cl_uint un = (cl_uint)N, uc = (cl_uint)C, uox, uop, uol;
    CLG_TRY(range(dev, o, ox, (size_t)N * C, &uox));
    CLG_TRY(range(dev, o, op, (size_t)N * C, &uop));
    CLG_TRY(range(dev, o, ol, (size_t)N, &uol));
    cl_kernel k;
    size_t wg;
    CLG_TRY(clg_kernel_get_wg(dev, "softmax", reduce ? "softmax_xent_fwd_reduce" : "softmax_xent_fwd", "SM_WG", SM_WG,
                              &k, &wg));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    if (reduce)
        CLG_KA(&ka, un);
    CLG_KA(&ka, uc);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, p);
    CLG_KA(&ka, uop);
    CLG_KA(&ka, labels);
    CLG_KA(&ka, uol);
    CLG_KA(&ka, a);
    if (!reduce)
        CLG_KA(&ka, b);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_groups(dev, k, reduce ? 1 : (size_t)N, wg);
}

clg_status clg_nn_softmax_xent_forward(clg_device *dev, int N, int C, cl_mem x, size_t ox, cl_mem p, size_t op,
                                       cl_mem labels, size_t ol, cl_mem loss, cl_mem correct)
{
    return xent_forward(dev, 0, N, C, x, ox, p, op, labels, ol, loss, correct);
}

clg_status clg_nn_softmax_xent_forward_reduce(clg_device *dev, int N, int C, cl_mem x, size_t ox, cl_mem p,
                                              size_t op, cl_mem labels, size_t ol, cl_mem result)
{
    return xent_forward(dev, 1, N, C, x, ox, p, op, labels, ol, result, NULL);
}

/* A row-wise softmax kernel kname of N rows of C: arguments (uint C, then per buffer m[i] its uint offset o[i]),
 * each buffer N x C from o[i]; a work-group a row. */
static clg_status sm_rows(clg_device *dev, const char *op, const char *kname, int N, int C, int nb, const cl_mem *m,
                          const size_t *o, const char *const *names)
{
    CLG_TRY(check_mems(dev, op, nb, m, names));
    if (N < 0 || C <= 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "%s: bad shape rows=%d columns=%d", op, N, C);
    cl_uint uc = (cl_uint)C, uo[3];
    for (int i = 0; i < nb; i++)
        CLG_TRY(range(dev, op, o[i], (size_t)N * C, &uo[i]));
    cl_kernel k;
    size_t wg;
    CLG_TRY(clg_kernel_get_wg(dev, "softmax", kname, "SM_WG", SM_WG, &k, &wg));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uc);
    for (int i = 0; i < nb; i++) {
        CLG_KA(&ka, m[i]);
        CLG_KA(&ka, uo[i]);
    }
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_groups(dev, k, (size_t)N, wg);
}

clg_status clg_nn_softmax_forward(clg_device *dev, int N, int C, cl_mem x, size_t ox, cl_mem y, size_t oy)
{
    return sm_rows(dev, "softmax", "softmax_fwd", N, C, 2, (const cl_mem[]){x, y}, (const size_t[]){ox, oy},
                   (const char *const[]){"x", "y"});
}

clg_status clg_nn_softmax_backward(clg_device *dev, int N, int C, cl_mem y, size_t oy, cl_mem dy, size_t ody,
                                   cl_mem dx, size_t odx)
{
    return sm_rows(dev, "softmax backward", "softmax_bwd", N, C, 3, (const cl_mem[]){y, dy, dx},
                   (const size_t[]){oy, ody, odx}, (const char *const[]){"y", "dy", "dx"});
}

clg_status clg_nn_softmax_xent_backward(clg_device *dev, int N, int C, float scale, cl_mem p, size_t op,
                                        cl_mem labels, size_t ol, cl_mem dx, size_t odx)
{
    const char *o = "softmax cross-entropy backward";
    CLG_TRY(check_mems(dev, o, 3, (const cl_mem[]){p, labels, dx},
                       (const char *const[]){"p", "labels", "dx"}));
    if (N < 0 || C <= 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "%s: bad shape N=%d classes=%d", o, N, C);
    cl_uint uc = (cl_uint)C, un = (cl_uint)N, uop, uol, uodx;
    CLG_TRY(range(dev, o, op, (size_t)N * C, &uop));
    CLG_TRY(range(dev, o, ol, (size_t)N, &uol));
    CLG_TRY(range(dev, o, odx, (size_t)N * C, &uodx));
    cl_kernel k;
    CLG_TRY(kget(dev, "softmax", "softmax_xent_bwd", &k));
    cl_float s = scale;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uc);
    CLG_KA(&ka, un);
    CLG_KA(&ka, s);
    CLG_KA(&ka, p);
    CLG_KA(&ka, uop);
    CLG_KA(&ka, labels);
    CLG_KA(&ka, uol);
    CLG_KA(&ka, dx);
    CLG_KA(&ka, uodx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run2(dev, k, (size_t)C, (size_t)N, C >= 64 ? 64 : (C >= 16 ? 16 : 1));
}

clg_status clg_nn_mse_forward(clg_device *dev, int N, int F, cl_mem x, size_t ox, cl_mem t, size_t ot, cl_mem y,
                              size_t oy, cl_mem loss, cl_mem correct)
{
    const char *o = "mse";
    CLG_TRY(check_mems(dev, o, 5, (const cl_mem[]){x, t, y, loss, correct},
                       (const char *const[]){"x", "targets", "y", "loss", "correct"}));
    if (N < 0 || F <= 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "%s: bad shape N=%d features=%d", o, N, F);
    cl_uint uf = (cl_uint)F, un = (cl_uint)N, uox, uot, uoy;
    CLG_TRY(range(dev, o, ox, (size_t)N * F, &uox));
    CLG_TRY(range(dev, o, ot, (size_t)N * F, &uot));
    CLG_TRY(range(dev, o, oy, (size_t)N * F, &uoy));
    cl_kernel k;
    CLG_TRY(kget(dev, "softmax", "mse_fwd", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uf);
    CLG_KA(&ka, un);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, t);
    CLG_KA(&ka, uot);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    CLG_KA(&ka, loss);
    CLG_KA(&ka, correct);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return clg_launch_1d(dev, k, (size_t)N, 16);
}

clg_status clg_nn_mse_backward(clg_device *dev, int N, int F, float scale, cl_mem x, size_t ox, cl_mem t, size_t ot,
                               cl_mem dx, size_t odx)
{
    const char *o = "mse backward";
    CLG_TRY(check_mems(dev, o, 3, (const cl_mem[]){x, t, dx},
                       (const char *const[]){"x", "targets", "dx"}));
    if (N < 0 || F <= 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "%s: bad shape N=%d features=%d", o, N, F);
    size_t n = (size_t)N * F;
    cl_uint un, uox, uot, uodx;
    CLG_TRY(u32(dev, o, n, &un));
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, ot, n, &uot));
    CLG_TRY(range(dev, o, odx, n, &uodx));
    cl_kernel k;
    CLG_TRY(kget(dev, "softmax", "mse_bwd", &k));
    cl_float s2 = 2.0f * scale / (float)F;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, un);
    CLG_KA(&ka, s2);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, t);
    CLG_KA(&ka, uot);
    CLG_KA(&ka, dx);
    CLG_KA(&ka, uodx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return clg_launch_1d(dev, k, n, EW_WG);
}

clg_status clg_nn_loss_reduce(clg_device *dev, int N, cl_mem loss, cl_mem correct, cl_mem result)
{
    CLG_TRY(check_mem(dev, "loss reduce", loss, "loss"));
    CLG_TRY(check_mem(dev, "loss reduce", correct, "correct"));
    CLG_TRY(check_mem(dev, "loss reduce", result, "result"));
    cl_uint un = (cl_uint)(N < 0 ? 0 : N);
    cl_kernel k;
    size_t wg;
    CLG_TRY(clg_kernel_get_wg(dev, "softmax", "loss_reduce", "SM_WG", SM_WG, &k, &wg));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, un);
    CLG_KA(&ka, loss);
    CLG_KA(&ka, correct);
    CLG_KA(&ka, result);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_groups(dev, k, 1, wg);
}

/* ---- batch normalization ---- */

static clg_status bn_check(clg_device *dev, int N, int C, size_t HW, size_t *n)
{
    if (N <= 0 || C <= 0 || HW == 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE, "batchnorm: bad shape N=%d C=%d HW=%zu", N, C, HW);
    *n = (size_t)N * C * HW;
    cl_uint d;
    return u32(dev, "batchnorm", *n, &d);
}

/* Vector width of the partial-sum kernels: 8, 4 or 1 (HW % width == 0). */
static size_t bn_vec(size_t HW) { return HW % 8 == 0 ? 8 : HW % 4 == 0 ? 4 : 1; }
static const char *bn_vsuf(size_t HW) { return bn_vec(HW) == 8 ? "8" : bn_vec(HW) == 4 ? "4" : ""; }

/* The row forms of norm.cl (one work-item per (n, c) row; option bn_rows:
 * auto on CPU devices). */
static int bn_rows(const clg_device *dev)
{
    int mode = (int)dev->ctx->opts.bn_rows - 1; /* auto,0,1 -> -1,0,1 */
    return mode >= 0 ? mode : (dev->info.type & CLG_DEVICE_CPU) != 0;
}

/* Partial sums per channel the reductions leave: N (row forms) or HW. */
static size_t bn_nparts(const clg_device *dev, cl_uint uN, size_t HW) { return bn_rows(dev) ? uN : HW; }

/* Launch of a row form: N*C rows (exact range, no bounds checks). */
static clg_status bn_run_rows(clg_device *dev, cl_kernel k, cl_uint uN, int C)
{
    size_t rows = (size_t)uN * (size_t)C, l = divisor_le(rows, 64);
    return clg_launch(dev, k, 1, &rows, &l, CLG_LAUNCH_FIT, NULL);
}

/* Two scratch vectors of C*P floats for the partial sums (pool buffers,
 * released right after enqueueing: the in-order queue orders later reuse). */
static clg_status bn_parts(clg_device *dev, int C, size_t P, cl_mem *a, cl_mem *b)
{
    size_t bytes = (size_t)C * P * sizeof(float);
    CLG_TRY(clg_buf_alloc(dev, bytes, a));
    clg_status st = clg_buf_alloc(dev, bytes, b);
    if (st != CLG_OK) {
        clg_buf_release(dev, *a);
        *a = NULL;
    }
    return st;
}

/* Per-(c, i) partial sums of the forward statistics into fresh pa, pb
 * (released by the caller after its last use is enqueued). */
static clg_status bn_stats_partials(clg_device *dev, cl_uint uN, int C, size_t HW, cl_mem x, cl_uint uox, cl_mem *pa,
                                    cl_mem *pb)
{
    int rows = bn_rows(dev);
    CLG_TRY(bn_parts(dev, C, bn_nparts(dev, uN, HW), pa, pb));
    cl_uint uC = (cl_uint)C, uHW = (cl_uint)HW;
    cl_kernel k;
    char kn[32];
    snprintf(kn, sizeof kn, "%s%s", rows ? "bn_row_stats" : "bn_stats_partial", bn_vsuf(HW));
    clg_status st = kget(dev, "norm", kn, &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uN);
        CLG_KA(&ka, uC);
        CLG_KA(&ka, uHW);
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, *pa);
        CLG_KA(&ka, *pb);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = rows ? bn_run_rows(dev, k, uN, C) : run2_exact(dev, k, HW / bn_vec(HW), (size_t)C);
    if (st != CLG_OK) {
        clg_buf_release(dev, *pa);
        clg_buf_release(dev, *pb);
    }
    return st;
}

/* The fused epilogue of bn_apply (NULL: none): relu, after adding r at
 * r_off when r is set. */
typedef struct bn_epi {
    cl_mem r;
    cl_uint r_off;
} bn_epi;

/* y = (x - mean) * invstd * gamma + beta with the statistics in mean/invstd
 * (epi: then + r, relu). */
static clg_status bn_apply(clg_device *dev, cl_uint uN, int C, size_t HW, cl_mem x, cl_uint uox, cl_mem y,
                           cl_uint uoy, cl_mem mean, cl_mem invstd, cl_mem gamma, cl_mem beta, const bn_epi *epi)
{
    cl_uint uC = (cl_uint)C, uHW = (cl_uint)HW;
    cl_kernel k;
    int rows = bn_rows(dev);
    size_t vw = bn_vec(HW); /* vector forms (W elements per work-item) where HW allows */
    char kn[40];
    snprintf(kn, sizeof kn, "%s%s%s", rows ? "bn_row" : "bn",
             !epi ? "_apply" : epi->r ? "_apply_add_relu" : "_apply_relu", bn_vsuf(HW));
    CLG_TRY(kget(dev, "norm", kn, &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uN);
    CLG_KA(&ka, uC);
    CLG_KA(&ka, uHW);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    CLG_KA(&ka, mean);
    CLG_KA(&ka, invstd);
    CLG_KA(&ka, gamma);
    CLG_KA(&ka, beta);
    if (epi || vw > 1 || rows) {
        cl_mem r = epi && epi->r ? epi->r : y; /* not read without a residual */
        cl_uint ro = epi ? epi->r_off : 0;
        CLG_KA(&ka, r);
        CLG_KA(&ka, ro);
    }
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return rows ? bn_run_rows(dev, k, uN, C) : run2_exact(dev, k, HW / vw, (size_t)C * uN);
}

static clg_status bn_forward_train(clg_device *dev, int N, int C, size_t HW, float eps, float momentum,
                                   int update_running, cl_mem x, size_t ox, cl_mem y, size_t oy, cl_mem gamma,
                                   cl_mem beta, cl_mem rmean, cl_mem rvar, cl_mem mean, cl_mem invstd,
                                   const bn_epi *epi)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm";
    CLG_TRY(check_mems(dev, o, 8, (const cl_mem[]){x, y, gamma, beta, rmean, rvar, mean, invstd},
                       (const char *const[]){"x", "y", "gamma", "beta", "running_mean", "running_var", "mean", "invstd"}));
    cl_uint uN = (cl_uint)N, uC = (cl_uint)C, uHW = (cl_uint)HW, uox, uoy;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, oy, n, &uoy));
    cl_float fm = momentum, fe = eps;
    cl_int upd = update_running ? 1 : 0;
    cl_mem pa, pb;
    CLG_TRY(bn_stats_partials(dev, uN, C, HW, x, uox, &pa, &pb));
    cl_kernel k;
    cl_uint uP = (cl_uint)bn_nparts(dev, uN, HW);
    clg_status st = kget(dev, "norm", "bn_stats_finish", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uN);
        CLG_KA(&ka, uC);
        CLG_KA(&ka, uHW);
        CLG_KA(&ka, uP);
        CLG_KA(&ka, fm);
        CLG_KA(&ka, fe);
        CLG_KA(&ka, upd);
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, pa);
        CLG_KA(&ka, pb);
        CLG_KA(&ka, mean);
        CLG_KA(&ka, invstd);
        CLG_KA(&ka, rmean);
        CLG_KA(&ka, rvar);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = clg_launch_1d(dev, k, (size_t)C, 64);
    clg_buf_release(dev, pa);
    clg_buf_release(dev, pb);
    CLG_TRY(st);
    return bn_apply(dev, uN, C, HW, x, uox, y, uoy, mean, invstd, gamma, beta, epi);
}

clg_status clg_nn_bn_forward_train(clg_device *dev, int N, int C, size_t HW, float eps, float momentum,
                                   int update_running, cl_mem x, size_t ox, cl_mem y, size_t oy, cl_mem gamma,
                                   cl_mem beta, cl_mem rmean, cl_mem rvar, cl_mem mean, cl_mem invstd)
{
    return bn_forward_train(dev, N, C, HW, eps, momentum, update_running, x, ox, y, oy, gamma, beta, rmean, rvar,
                            mean, invstd, NULL);
}

clg_status clg_nn_bn_stats_local(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem st3)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm (synchronized)";
    CLG_TRY(check_mems(dev, o, 2, (const cl_mem[]){x, st3}, (const char *const[]){"x", "stats"}));
    cl_uint uN = (cl_uint)N, uC = (cl_uint)C, uHW = (cl_uint)HW, uox;
    CLG_TRY(range(dev, o, ox, n, &uox));
    cl_mem pa, pb;
    CLG_TRY(bn_stats_partials(dev, uN, C, HW, x, uox, &pa, &pb));
    cl_kernel k;
    cl_uint uP = (cl_uint)bn_nparts(dev, uN, HW);
    clg_status st = kget(dev, "norm", "bn_stats_sums", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uC);
        CLG_KA(&ka, uHW);
        CLG_KA(&ka, uP);
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, pa);
        CLG_KA(&ka, pb);
        CLG_KA(&ka, st3);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = clg_launch_1d(dev, k, (size_t)C, 64);
    clg_buf_release(dev, pa);
    clg_buf_release(dev, pb);
    return st;
}

clg_status clg_nn_bn_sync_apply(clg_device *dev, int N, int C, size_t HW, float momentum, int update_running,
                                cl_mem g4, cl_mem x, size_t ox, cl_mem y, size_t oy, cl_mem gamma, cl_mem beta,
                                cl_mem rmean, cl_mem rvar, cl_mem mean, cl_mem invstd)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm (synchronized)";
    CLG_TRY(check_mems(dev, o, 9, (const cl_mem[]){g4, x, y, gamma, beta, rmean, rvar, mean, invstd},
                       (const char *const[]){"statistics", "x", "y", "gamma", "beta", "running_mean", "running_var",
                                             "mean", "invstd"}));
    cl_uint uN = (cl_uint)N, uC = (cl_uint)C, uox, uoy;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, oy, n, &uoy));
    cl_float fm = momentum;
    cl_int upd = update_running ? 1 : 0;
    cl_kernel k;
    CLG_TRY(kget(dev, "norm", "bn_sync_set", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uC);
    CLG_KA(&ka, fm);
    CLG_KA(&ka, upd);
    CLG_KA(&ka, g4);
    CLG_KA(&ka, mean);
    CLG_KA(&ka, invstd);
    CLG_KA(&ka, rmean);
    CLG_KA(&ka, rvar);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    CLG_TRY(clg_launch_1d(dev, k, (size_t)C, 64));
    return bn_apply(dev, uN, C, HW, x, uox, y, uoy, mean, invstd, gamma, beta, NULL);
}

static clg_status bn_forward_infer(clg_device *dev, int N, int C, size_t HW, float eps, cl_mem x, size_t ox,
                                   cl_mem y, size_t oy, cl_mem gamma, cl_mem beta, cl_mem rmean, cl_mem rvar,
                                   const bn_epi *epi)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm";
    CLG_TRY(check_mems(dev, o, 6, (const cl_mem[]){x, y, gamma, beta, rmean, rvar},
                       (const char *const[]){"x", "y", "gamma", "beta", "running_mean", "running_var"}));
    cl_uint uN = (cl_uint)N, uC = (cl_uint)C, uHW = (cl_uint)HW, uox, uoy;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, oy, n, &uoy));
    cl_float fe = eps;
    cl_kernel k;
    int rows = bn_rows(dev);
    char kn[40];
    snprintf(kn, sizeof kn, "%s%s%s", rows ? "bn_row_infer" : "bn_apply_infer",
             !epi ? "" : epi->r ? "_add_relu" : "_relu", rows ? bn_vsuf(HW) : "");
    CLG_TRY(kget(dev, "norm", kn, &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uN);
    CLG_KA(&ka, uC);
    CLG_KA(&ka, uHW);
    CLG_KA(&ka, fe);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, y);
    CLG_KA(&ka, uoy);
    CLG_KA(&ka, rmean);
    CLG_KA(&ka, rvar);
    CLG_KA(&ka, gamma);
    CLG_KA(&ka, beta);
    if (epi || rows) {
        cl_mem r = epi && epi->r ? epi->r : y; /* not read without a residual */
        cl_uint ro = epi ? epi->r_off : 0;
        CLG_KA(&ka, r);
        CLG_KA(&ka, ro);
    }
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return rows ? bn_run_rows(dev, k, uN, C) : run2_exact(dev, k, HW, (size_t)C * (size_t)N);
}

clg_status clg_nn_bn_forward_infer(clg_device *dev, int N, int C, size_t HW, float eps, cl_mem x, size_t ox,
                                   cl_mem y, size_t oy, cl_mem gamma, cl_mem beta, cl_mem rmean, cl_mem rvar)
{
    return bn_forward_infer(dev, N, C, HW, eps, x, ox, y, oy, gamma, beta, rmean, rvar, NULL);
}

clg_status clg_nn_bn_forward_relu(clg_device *dev, int N, int C, size_t HW, float eps, float momentum, int training,
                                  cl_mem x, size_t ox, cl_mem r, size_t orr, cl_mem y, size_t oy, cl_mem gamma,
                                  cl_mem beta, cl_mem rmean, cl_mem rvar, cl_mem mean, cl_mem invstd)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    bn_epi epi = {r, 0};
    if (r)
        CLG_TRY(range(dev, "batchnorm + add + relu", orr, n, &epi.r_off));
    if (training)
        return bn_forward_train(dev, N, C, HW, eps, momentum, 1, x, ox, y, oy, gamma, beta, rmean, rvar, mean, invstd,
                                &epi);
    return bn_forward_infer(dev, N, C, HW, eps, x, ox, y, oy, gamma, beta, rmean, rvar, &epi);
}

/* The fused epilogue's backward (NULL: none): dy is masked by y > 0 (the
 * stored relu output); dr (may be NULL) receives the masked dy. The row
 * forms take the mask from x, gamma and beta instead of y where beta is
 * set (relu(bn(x)): no residual) and dr is not. */
typedef struct bn_bepi {
    cl_mem y, dr;
    cl_uint y_off, dr_off;
    cl_mem gamma, beta;
} bn_bepi;

/* The arguments after (N, C, HW, x, ox, dy, ody) of the backward row
 * reduction: y, oy, mean, invstd, gamma, beta (placeholders where the mode
 * reads none). */
static void bn_row_bwd_args(clg_kargs *ka, cl_mem mean, cl_mem invstd, const bn_bepi *be)
{
    cl_mem ym = be ? be->y : mean;
    cl_uint yo = be ? be->y_off : 0;
    cl_mem g = be ? be->gamma : mean, b = be && be->beta ? be->beta : mean;
    CLG_KA(ka, ym);
    CLG_KA(ka, yo);
    CLG_KA(ka, mean);
    CLG_KA(ka, invstd);
    CLG_KA(ka, g);
    CLG_KA(ka, b);
}

/* Per-(c, i) partial sums of the backward statistics into fresh pa, pb. */
static clg_status bn_bwd_partials(clg_device *dev, cl_uint uN, int C, size_t HW, cl_mem x, cl_uint uox, cl_mem dy,
                                  cl_uint uody, cl_mem mean, cl_mem invstd, const bn_bepi *be, cl_mem *pa,
                                  cl_mem *pb)
{
    int rows = bn_rows(dev);
    CLG_TRY(bn_parts(dev, C, bn_nparts(dev, uN, HW), pa, pb));
    cl_uint uC = (cl_uint)C, uHW = (cl_uint)HW;
    cl_kernel k;
    char kn[40];
    snprintf(kn, sizeof kn, "%s%s%s", rows ? "bn_row_bwd" : "bn_bwd_partial",
             !be ? "" : be->dr ? "_add_relu" : rows && !be->beta ? "_relu_y" : "_relu", bn_vsuf(HW));
    clg_status st = kget(dev, "norm", kn, &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uN);
        CLG_KA(&ka, uC);
        CLG_KA(&ka, uHW);
        CLG_KA(&ka, x);
        CLG_KA(&ka, uox);
        CLG_KA(&ka, dy);
        CLG_KA(&ka, uody);
        if (rows) {
            bn_row_bwd_args(&ka, mean, invstd, be);
        } else {
            if (be) {
                CLG_KA(&ka, be->y);
                CLG_KA(&ka, be->y_off);
            }
            CLG_KA(&ka, mean);
        }
        CLG_KA(&ka, *pa);
        CLG_KA(&ka, *pb);
        if (be || rows) {
            cl_mem dr = be && be->dr ? be->dr : *pa; /* not written without a residual */
            cl_uint dro = be ? be->dr_off : 0;
            CLG_KA(&ka, dr);
            CLG_KA(&ka, dro);
        }
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = rows ? bn_run_rows(dev, k, uN, C) : run2_exact(dev, k, HW / bn_vec(HW), (size_t)C);
    if (st != CLG_OK) {
        clg_buf_release(dev, *pa);
        clg_buf_release(dev, *pb);
    }
    return st;
}

/* dgamma, dbeta of this batch (partials, then per-channel sums); st2
 * (may be NULL) also receives {sum dy, sum dy (x - mean)} per channel. */
static clg_status bn_bwd_params(clg_device *dev, cl_uint uN, int C, size_t HW, cl_mem x, cl_uint uox, cl_mem dy,
                                cl_uint uody, cl_mem mean, cl_mem invstd, cl_mem dgamma, cl_mem dbeta, cl_mem st2,
                                const bn_bepi *be)
{
    cl_uint uC = (cl_uint)C, uP = (cl_uint)bn_nparts(dev, uN, HW);
    cl_int keep = st2 != NULL;
    cl_mem stbuf = st2 ? st2 : dbeta; /* not written when keep is 0 */
    cl_mem pa, pb;
    CLG_TRY(bn_bwd_partials(dev, uN, C, HW, x, uox, dy, uody, mean, invstd, be, &pa, &pb));
    cl_kernel k;
    clg_status st = kget(dev, "norm", "bn_bwd_finish", &k);
    if (st == CLG_OK) {
        clg_kargs ka = {k, 0, CL_SUCCESS};
        CLG_KA(&ka, uC);
        CLG_KA(&ka, uP);
        CLG_KA(&ka, pa);
        CLG_KA(&ka, pb);
        CLG_KA(&ka, invstd);
        CLG_KA(&ka, dgamma);
        CLG_KA(&ka, dbeta);
        CLG_KA(&ka, keep);
        CLG_KA(&ka, stbuf);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
    }
    if (st == CLG_OK)
        st = clg_launch_1d(dev, k, (size_t)C, 64);
    clg_buf_release(dev, pa);
    clg_buf_release(dev, pb);
    return st;
}

/* dx from the (global) dgamma / dbeta sums over M values per channel. */
static clg_status bn_bwd_dx(clg_device *dev, cl_uint uN, int C, size_t HW, double M, cl_mem x, cl_uint uox,
                            cl_mem dy, cl_uint uody, cl_mem mean, cl_mem invstd, cl_mem gamma, cl_mem dgamma,
                            cl_mem dbeta, cl_mem dx, cl_uint uodx, const bn_bepi *be)
{
    cl_uint uC = (cl_uint)C, uHW = (cl_uint)HW;
    cl_float invM = 1.0f / (float)M;
    cl_kernel k;
    int rows = bn_rows(dev);
    size_t vw = bn_vec(HW); /* vector forms (W elements per work-item) where HW allows */
    char kn[40];
    snprintf(kn, sizeof kn, "%s%s%s", rows ? "bn_row_dx" : "bn_bwd_data",
             !be ? "" : rows && !be->beta ? "_relu_y" : "_relu", bn_vsuf(HW));
    CLG_TRY(kget(dev, "norm", kn, &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uN);
    CLG_KA(&ka, uC);
    CLG_KA(&ka, uHW);
    CLG_KA(&ka, invM);
    CLG_KA(&ka, x);
    CLG_KA(&ka, uox);
    CLG_KA(&ka, dy);
    CLG_KA(&ka, uody);
    if (be || vw > 1 || rows) {
        cl_mem ym = be ? be->y : dy; /* not read without the relu mask */
        cl_uint yo = be ? be->y_off : 0;
        CLG_KA(&ka, ym);
        CLG_KA(&ka, yo);
    }
    CLG_KA(&ka, mean);
    CLG_KA(&ka, invstd);
    CLG_KA(&ka, gamma);
    if (rows) {
        cl_mem b = be && be->beta ? be->beta : gamma; /* not read without the mask from x */
        CLG_KA(&ka, b);
    }
    CLG_KA(&ka, dgamma);
    CLG_KA(&ka, dbeta);
    CLG_KA(&ka, dx);
    CLG_KA(&ka, uodx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return rows ? bn_run_rows(dev, k, uN, C) : run2_exact(dev, k, HW / vw, (size_t)C * uN);
}

clg_status clg_nn_bn_backward(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem dy, size_t ody,
                              cl_mem mean, cl_mem invstd, cl_mem gamma, cl_mem dgamma, cl_mem dbeta, cl_mem dx,
                              size_t odx)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm backward";
    CLG_TRY(check_mems(dev, o, 7, (const cl_mem[]){x, dy, mean, invstd, gamma, dgamma, dbeta},
                       (const char *const[]){"x", "dy", "mean", "invstd", "gamma", "dgamma", "dbeta"}));
    cl_uint uN = (cl_uint)N, uox, uody, uodx = 0;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, ody, n, &uody));
    if (dx)
        CLG_TRY(range(dev, o, odx, n, &uodx));
    CLG_TRY(bn_bwd_params(dev, uN, C, HW, x, uox, dy, uody, mean, invstd, dgamma, dbeta, NULL, NULL));
    if (!dx)
        return CLG_OK;
    return bn_bwd_dx(dev, uN, C, HW, (double)N * HW, x, uox, dy, uody, mean, invstd, gamma, dgamma, dbeta, dx, uodx,
                     NULL);
}

clg_status clg_nn_bn_backward_relu(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem y, size_t oy,
                                   cl_mem dy, size_t ody, cl_mem mean, cl_mem invstd, cl_mem gamma, cl_mem beta,
                                   cl_mem dgamma, cl_mem dbeta, cl_mem dx, size_t odx, cl_mem dr, size_t odr)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm + relu backward";
    CLG_TRY(check_mems(dev, o, 8, (const cl_mem[]){x, y, dy, mean, invstd, gamma, dgamma, dbeta},
                       (const char *const[]){"x", "y", "dy", "mean", "invstd", "gamma", "dgamma", "dbeta"}));
    cl_uint uN = (cl_uint)N, uox, uody, uodx = 0;
    bn_bepi be = {y, dr, 0, 0, gamma, beta};
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, oy, n, &be.y_off));
    CLG_TRY(range(dev, o, ody, n, &uody));
    if (dx)
        CLG_TRY(range(dev, o, odx, n, &uodx));
    if (dr)
        CLG_TRY(range(dev, o, odr, n, &be.dr_off));
    CLG_TRY(bn_bwd_params(dev, uN, C, HW, x, uox, dy, uody, mean, invstd, dgamma, dbeta, NULL, &be));
    if (!dx)
        return CLG_OK;
    if (dr) /* the partial pass wrote the masked gradient there: one read in place of dy and y */
        return bn_bwd_dx(dev, uN, C, HW, (double)N * HW, x, uox, dr, be.dr_off, mean, invstd, gamma, dgamma, dbeta,
                         dx, uodx, NULL);
    return bn_bwd_dx(dev, uN, C, HW, (double)N * HW, x, uox, dy, uody, mean, invstd, gamma, dgamma, dbeta, dx, uodx,
                     &be);
}

clg_status clg_nn_bn_bwd_local(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem dy, size_t ody,
                               cl_mem mean, cl_mem invstd, cl_mem dgamma, cl_mem dbeta, cl_mem st2)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm backward (synchronized)";
    CLG_TRY(check_mems(dev, o, 7, (const cl_mem[]){x, dy, mean, invstd, dgamma, dbeta, st2},
                       (const char *const[]){"x", "dy", "mean", "invstd", "dgamma", "dbeta", "sums"}));
    cl_uint uN = (cl_uint)N, uox, uody;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, ody, n, &uody));
    return bn_bwd_params(dev, uN, C, HW, x, uox, dy, uody, mean, invstd, dgamma, dbeta, st2, NULL);
}

clg_status clg_nn_bn_bwd_data_sync(clg_device *dev, int N, int C, size_t HW, double M, cl_mem g2, cl_mem x,
                                   size_t ox, cl_mem dy, size_t ody, cl_mem mean, cl_mem invstd, cl_mem gamma,
                                   cl_mem gdg, cl_mem gdb, cl_mem dx, size_t odx)
{
    size_t n = 0;
    CLG_TRY(bn_check(dev, N, C, HW, &n));
    const char *o = "batchnorm backward (synchronized)";
    CLG_TRY(check_mems(dev, o, 9, (const cl_mem[]){g2, x, dy, mean, invstd, gamma, gdg, gdb, dx},
                       (const char *const[]){"sums", "x", "dy", "mean", "invstd", "gamma", "dgamma", "dbeta", "dx"}));
    if (!(M >= (double)N * HW))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: %g values over the devices, fewer than this "
                           "device's %zu", o, M, (size_t)N * HW);
    cl_uint uN = (cl_uint)N, uC = (cl_uint)C, uox, uody, uodx;
    CLG_TRY(range(dev, o, ox, n, &uox));
    CLG_TRY(range(dev, o, ody, n, &uody));
    CLG_TRY(range(dev, o, odx, n, &uodx));
    cl_kernel k;
    CLG_TRY(kget(dev, "norm", "bn_bwd_global", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, uC);
    CLG_KA(&ka, g2);
    CLG_KA(&ka, invstd);
    CLG_KA(&ka, gdg);
    CLG_KA(&ka, gdb);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    CLG_TRY(clg_launch_1d(dev, k, (size_t)C, 64));
    return bn_bwd_dx(dev, uN, C, HW, M, x, uox, dy, uody, mean, invstd, gamma, gdg, gdb, dx, uodx, NULL);
}
