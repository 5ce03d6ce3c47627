/* Host launchers of the attention kernels (see attention.h). */
#include <math.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#include "nn.h"

/* Rows per work-group and per local-memory tile of the fused kernels
 * (halved while the device's limits refuse it, down to ATTN_B_MIN). */
#define ATTN_B 32
#define ATTN_B_MIN 4
/* Reduction group of attn_softmax (AS_WG). */
#define ATTN_SM_WG 64

static const char *const algo_names[] = {"auto", "fused", "gemm", NULL};
const char *const *clg_attn_algo_names(void) { return algo_names; }

// ---- checks ----

clg_status clg_attn_check_rows(clg_device *dev, const clg_attn_desc *a, const char *op, const char *name,
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

/* A sequence of a->N x a->T rows. */
static clg_status check_seq(clg_device *dev, const clg_attn_desc *a, const char *op, const char *name,
                            const clg_attn_seq *s)
{
    return clg_attn_check_rows(dev, a, op, name, s, (double)a->N * a->T);
}

clg_status clg_attn_check(clg_device *dev, const clg_attn_desc *a)
{
    clg_err *err = clg_dev_err(dev);
    if (!a)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "attention: NULL descriptor");
    if (a->N < 1 || a->T < 1 || a->heads < 1)
        return clg_err_set(err, CLG_ERR_SHAPE, "attention: bad shape N=%d T=%d heads=%d (each must be >= 1)", a->N,
                           a->T, a->heads);
    if (a->d < 1 || a->d > CLG_ATTN_MAX_D)
        return clg_err_set(err, CLG_ERR_SHAPE, "attention: head width %d outside 1..%d", a->d, CLG_ATTN_MAX_D);
    if (!isfinite(a->scale))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "attention: scale is not finite");
    if (!(a->dropout >= 0.0f && a->dropout < 1.0f))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "attention: dropout %g outside [0, 1)", (double)a->dropout);
    if ((double)a->N * a->heads * a->T > 4294967295.0 / 16)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "attention: N x heads x T = %.0f is too large",
                           (double)a->N * a->heads * a->T);
    return CLG_OK;
}

size_t clg_attn_saved_floats(const clg_attn_desc *a, clg_attn_algo algo)
{
    size_t rows = (size_t)a->N * a->heads * a->T;
    return algo == CLG_ATTN_GEMM ? rows * a->T * (a->dropout > 0.0f ? 2 : 1) : rows;
}

static clg_status check_saved(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo, const char *op,
                              cl_mem saved, size_t off)
{
    if (!saved)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: NULL buffer 'saved'", op);
    double tt = (double)a->N * a->heads * a->T * a->T * (a->dropout > 0.0f ? 2 : 1);
    if (algo == CLG_ATTN_GEMM && tt > 4294967295.0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "%s: the gemm algorithm's N x heads x T x T = %.0f scores are over the 2^32 limit (use "
                           "fused)",
                           op, tt);
    if ((double)off + clg_attn_saved_floats(a, algo) > 4294967295.0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "%s: 'saved' over the 2^32 limit", op);
    return CLG_OK;
}

// ---- fused path ----

/* The fused kernels' variant for a (see clg_attn_desc.variant): 1 local
 * tiles, 2 direct reads, 3 CPU register tiles (head width a multiple of 8). */
static int fused_variant(const clg_device *dev, const clg_attn_desc *a)
{
    if (a->variant == 3 && a->d % 8 != 0)
        return 2;
    if (a->variant)
        return a->variant;
    if (!(dev->info.type & CLG_DEVICE_CPU))
        return 1;
    return a->d % 8 == 0 ? 3 : 2;
}

static int fused_direct(const clg_device *dev, const clg_attn_desc *a) { return fused_variant(dev, a) >= 2; }

/* Dropout on the probabilities: the gemm algorithm and the fused CPU
 * register-tile kernels (variant 3); not yet the other fused variants. */
static clg_status check_dropout(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo, const char *op)
{
    if (algo == CLG_ATTN_GEMM || a->dropout == 0.0f || fused_variant(dev, a) == 3)
        return CLG_OK;
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                       "%s: dropout on the probabilities with the fused kernels needs the CPU variant (a CPU device, "
                       "head width a multiple of 8); not supported yet by variant %d (use algo = gemm)",
                       op, fused_variant(dev, a));
}

/* Kernel `name` built for head width d with the largest tile B <= ATTN_B
 * whose group and local memory (lmem_floats(B) floats) the device allows. */
static void fused_options(const clg_device *dev, const clg_attn_desc *a, int B, char *buf, size_t len)
{
    snprintf(buf, len, "-DHD=%d -DBQ=%d -DBK=%d -DATTN_DIRECT=%d", a->d, B, B, fused_direct(dev, a));
}

static clg_status fused_kernel(clg_device *dev, const clg_attn_desc *a, const char *name, int extra_rows,
                               cl_kernel *k, int *B)
{
    int d = a->d;
    for (int b = ATTN_B; b >= ATTN_B_MIN; b /= 2) {
        char opt[96];
        fused_options(dev, a, b, opt, sizeof opt);
        CLG_TRY(clg_kernel_get(dev, "attention", opt, name, k));
        clg_wg_limits L;
        CLG_TRY(clg_kernel_limits(dev, *k, &L));
        uint64_t lmem = (uint64_t)sizeof(float) * ((uint64_t)2 * b * d + (uint64_t)extra_rows * b);
        if ((size_t)b <= L.max_total && (size_t)b <= L.max_item[0] && (!L.local_mem || lmem <= L.local_mem)) {
            *B = b;
            return CLG_OK;
        }
    }
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                       "attention: kernel %s with head width %d does not fit the device's work-group or local-memory "
                       "limits even with %d-row tiles",
                       name, d, ATTN_B_MIN);
}

static void ka_seq(clg_kargs *ka, const clg_attn_seq *s)
{
    cl_uint off = (cl_uint)s->off, ld = (cl_uint)s->ld;
    CLG_KA(ka, s->mem);
    CLG_KA(ka, off);
    CLG_KA(ka, ld);
}

/* Common leading arguments: T, H, scale, causal, q, k, v. */
static void ka_head(clg_kargs *ka, const clg_attn_desc *a, const clg_attn_seq *q, const clg_attn_seq *k,
                    const clg_attn_seq *v)
{
    cl_uint T = (cl_uint)a->T, H = (cl_uint)a->heads;
    cl_float sc = a->scale;
    cl_int causal = a->causal ? 1 : 0;
    CLG_KA(ka, T);
    CLG_KA(ka, H);
    CLG_KA(ka, sc);
    CLG_KA(ka, causal);
    ka_seq(ka, q);
    ka_seq(ka, k);
    ka_seq(ka, v);
}

static clg_status run_tiles(clg_device *dev, cl_kernel k, const clg_attn_desc *a, int B)
{
    size_t g[2] = {(size_t)CLG_CEIL_DIV(a->T, B) * B, (size_t)a->N * a->heads};
    size_t l[2] = {(size_t)B, 1};
    return clg_launch(dev, k, 2, g, l, CLG_LAUNCH_FIXED, NULL);
}

static clg_status fused_forward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                                const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse,
                                size_t lse_off)
{
    cl_kernel kr;
    int B;
    CLG_TRY(fused_kernel(dev, a, "attn_fwd", 0, &kr, &B));
    clg_kargs ka = {kr, 0, CL_SUCCESS};
    ka_head(&ka, a, q, k, v);
    ka_seq(&ka, o);
    cl_uint ol = (cl_uint)lse_off;
    CLG_KA(&ka, lse);
    CLG_KA(&ka, ol);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_tiles(dev, kr, a, B);
}

/* A backward tile kernel kr (B rows a tile) of s = {q, k, v, g, out1, out2 or NULL}: the common head, g, the
 * log-sum-exp lse at element ol, the row sums D, then the gradients it writes. */
static clg_status bwd_tiles(clg_device *dev, cl_kernel kr, int B, const clg_attn_desc *a, const clg_attn_seq *const *s,
                            cl_mem lse, cl_uint ol, cl_mem D)
{
    cl_uint zero = 0;
    clg_kargs ka = {kr, 0, CL_SUCCESS};
    ka_head(&ka, a, s[0], s[1], s[2]);
    ka_seq(&ka, s[3]);
    CLG_KA(&ka, lse);
    CLG_KA(&ka, ol);
    CLG_KA(&ka, D);
    CLG_KA(&ka, zero);
    ka_seq(&ka, s[4]);
    if (s[5])
        ka_seq(&ka, s[5]);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    return run_tiles(dev, kr, a, B);
}

static clg_status fused_backward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                                 const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse,
                                 size_t lse_off, const clg_attn_seq *g, const clg_attn_seq *dq,
                                 const clg_attn_seq *dk, const clg_attn_seq *dv)
{
    size_t rows = (size_t)a->N * a->heads * a->T;
    cl_mem D = NULL;
    CLG_TRY(clg_buf_alloc(dev, rows * sizeof(float), &D));
    cl_uint T = (cl_uint)a->T, H = (cl_uint)a->heads, ol = (cl_uint)lse_off, zero = 0;
    cl_kernel kd, kkv, kq;
    int B1, B2;
    /* D = rowsum(dO o O), from the program of the dK/dV kernel (same options) */
    clg_status st = fused_kernel(dev, a, "attn_bwd_dkdv", 2, &kkv, &B1);
    char opt[96];
    fused_options(dev, a, B1, opt, sizeof opt);
    if (st == CLG_OK)
        st = clg_kernel_get(dev, "attention", opt, "attn_bwd_dot", &kd);
    if (st == CLG_OK) {
        clg_kargs ka = {kd, 0, CL_SUCCESS};
        cl_uint NH = (cl_uint)(a->N * a->heads);
        CLG_KA(&ka, T);
        CLG_KA(&ka, H);
        CLG_KA(&ka, NH);
        ka_seq(&ka, o);
        ka_seq(&ka, g);
        CLG_KA(&ka, D);
        CLG_KA(&ka, zero);
        size_t gw[2] = {(size_t)a->T, (size_t)a->N * a->heads};
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
        if (st == CLG_OK)
            st = clg_launch(dev, kd, 2, gw, NULL, CLG_LAUNCH_PAD, NULL);
    }
    if (st == CLG_OK)
        st = bwd_tiles(dev, kkv, B1, a, (const clg_attn_seq *[]){q, k, v, g, dk, dv}, lse, ol, D);
    if (st == CLG_OK && (st = fused_kernel(dev, a, "attn_bwd_dq", 0, &kq, &B2)) == CLG_OK)
        st = bwd_tiles(dev, kq, B2, a, (const clg_attn_seq *[]){q, k, v, g, dq, NULL}, lse, ol, D);
    clg_buf_release(dev, D);
    return st;
}

// ---- fused path, CPU register tiles (variant 3) ----

/* Rows per work-item of the CPU kernels (RQ, RK of cl/attention.cl) unless
 * the descriptor sets them. RQ 8 rather than 4: eight FMAs per key vector
 * loaded in the forward's scores and P V (gpt-mini's attn_fwd_cpu1 about
 * -25% event time, 4 alternating profiled pairs; 16 no better). */
#define ATTN_RQ 8
#define ATTN_RK 8

static int cpu_rq(const clg_attn_desc *a) { return a->rq > 0 ? a->rq : ATTN_RQ; }
static int cpu_rk(const clg_attn_desc *a) { return a->rk > 0 ? a->rk : ATTN_RK; }

static int t_pad(int T) { return CLG_CEIL_DIV(T, 16) * 16; }

static clg_status cpu_kernel(clg_device *dev, const clg_attn_desc *a, const char *name, cl_kernel *k)
{
    char opt[128];
    fused_options(dev, a, ATTN_B, opt, sizeof opt);
    size_t n = strlen(opt);
    snprintf(opt + n, sizeof opt - n, " -DRQ=%d -DRK=%d%s", cpu_rq(a), cpu_rk(a),
             a->dropout > 0.0f ? " -DDROPOUT=1" : "");
    return clg_kernel_get(dev, "attention", opt, name, k);
}

/* dst (N H, d, Tp) = head-wise transpose of s, zero past T. */
static clg_status cpu_transpose(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *s, cl_mem dst)
{
    cl_kernel k;
    CLG_TRY(cpu_kernel(dev, a, "attn_transpose", &k));
    cl_uint T = (cl_uint)a->T, H = (cl_uint)a->heads, NH = (cl_uint)(a->N * a->heads), Tp = (cl_uint)t_pad(a->T);
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, T);
    CLG_KA(&ka, H);
    CLG_KA(&ka, NH);
    CLG_KA(&ka, Tp);
    ka_seq(&ka, s);
    CLG_KA(&ka, dst);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t g[2] = {(size_t)Tp / 8, (size_t)NH * a->d / 8}; /* 8 x 8 blocks: Tp and d are multiples of 8 */
    return clg_launch(dev, k, 2, g, NULL, CLG_LAUNCH_PAD, NULL);
}

static clg_status cpu_blocks(clg_device *dev, cl_kernel k, const clg_attn_desc *a, int rows)
{
    size_t g[2] = {(size_t)CLG_CEIL_DIV(a->T, rows), (size_t)a->N * a->heads};
    size_t l[2] = {1, 1};
    return clg_launch(dev, k, 2, g, l, CLG_LAUNCH_FIXED, NULL);
}

/* With dropout: the trailing arguments of the CPU kernels (DROPOUT_ARGS). */
static void ka_cpu_dropout(clg_kargs *ka, const clg_attn_desc *a)
{
    if (!(a->dropout > 0.0f))
        return;
    cl_float p = a->dropout, inv = 1.0f / (1.0f - a->dropout);
    cl_uint seed = a->seed, step = a->step, base = a->base;
    CLG_KA(ka, p);
    CLG_KA(ka, inv);
    CLG_KA(ka, seed);
    CLG_KA(ka, step);
    CLG_KA(ka, base);
}

/* T, H, Tp, scale, causal: the leading arguments of the CPU kernels. */
static void ka_cpu_head(clg_kargs *ka, const clg_attn_desc *a)
{
    cl_uint T = (cl_uint)a->T, H = (cl_uint)a->heads, Tp = (cl_uint)t_pad(a->T);
    cl_float sc = a->scale;
    cl_int causal = a->causal ? 1 : 0;
    CLG_KA(ka, T);
    CLG_KA(ka, H);
    CLG_KA(ka, Tp);
    CLG_KA(ka, sc);
    CLG_KA(ka, causal);
}

/* clg_attn_desc.per_head resolved: 1 one work-item per head, 0 blocks of rows. */
static int cpu_per_head(const clg_device *dev, const clg_attn_desc *a)
{
    if (a->per_head == 1 || a->per_head == 2)
        return a->per_head == 1;
    unsigned cu = dev->info.compute_units ? dev->info.compute_units : 1;
    return (size_t)a->N * a->heads >= 4 * (size_t)cu;
}

static clg_status cpu_forward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q, const clg_attn_seq *k,
                              const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse, size_t lse_off)
{
    size_t tsz = (size_t)a->N * a->heads * a->d * t_pad(a->T) * sizeof(float);
    cl_mem Kt = NULL;
    cl_kernel kr;
    int one = cpu_per_head(dev, a); /* attn_fwd_cpu1 transposes its head of K itself */
    CLG_TRY(cpu_kernel(dev, a, one ? "attn_fwd_cpu1" : "attn_fwd_cpu", &kr));
    CLG_TRY(clg_buf_alloc(dev, tsz, &Kt));
    clg_status st = one ? CLG_OK : cpu_transpose(dev, a, k, Kt);
    if (st == CLG_OK) {
        clg_kargs ka = {kr, 0, CL_SUCCESS};
        cl_uint ol = (cl_uint)lse_off;
        ka_cpu_head(&ka, a);
        ka_seq(&ka, q);
        if (one)
            ka_seq(&ka, k);
        CLG_KA(&ka, Kt);
        ka_seq(&ka, v);
        ka_seq(&ka, o);
        CLG_KA(&ka, lse);
        CLG_KA(&ka, ol);
        ka_cpu_dropout(&ka, a);
        st = CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments");
        if (st == CLG_OK)
            st = cpu_blocks(dev, kr, a, one ? a->T : cpu_rq(a)); /* per head: one group of all rows */
    }
    clg_buf_release(dev, Kt);
    return st;
}

/* Scratch of the CPU backward: transposed Q, dO (and K, V for the split kernels) and the padded D, lse. */
typedef struct {
    cl_mem Kt, Vt, Qt, Gt, Dp, Lp;
} cpu_bwd_scratch;

static clg_status cpu_bwd_prep(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                               const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse,
                               size_t lse_off, const clg_attn_seq *g, int one, cpu_bwd_scratch *s)
{
    size_t rows = (size_t)a->N * a->heads * t_pad(a->T), tsz = rows * a->d * sizeof(float);
    CLG_TRY(clg_buf_alloc(dev, rows * sizeof(float), &s->Dp));
    CLG_TRY(clg_buf_alloc(dev, rows * sizeof(float), &s->Lp));
    cl_mem *t[4] = {&s->Qt, &s->Gt, &s->Kt, &s->Vt};
    const clg_attn_seq *src[4] = {q, g, k, v};
    for (int i = 0; i < (one ? 2 : 4); i++) { /* the one pass fills Qt, Gt, Dp, Lp itself, reads no Kt, Vt */
        CLG_TRY(clg_buf_alloc(dev, tsz, t[i]));
        if (!one)
            CLG_TRY(cpu_transpose(dev, a, src[i], *t[i]));
    }
    if (one)
        return CLG_OK;
    cl_kernel kd;
    CLG_TRY(cpu_kernel(dev, a, "attn_bwd_dot_cpu", &kd));
    cl_uint T = (cl_uint)a->T, H = (cl_uint)a->heads, NH = (cl_uint)(a->N * a->heads), Tp = (cl_uint)t_pad(a->T);
    cl_uint ol = (cl_uint)lse_off;
    clg_kargs ka = {kd, 0, CL_SUCCESS};
    CLG_KA(&ka, T);
    CLG_KA(&ka, H);
    CLG_KA(&ka, NH);
    CLG_KA(&ka, Tp);
    ka_seq(&ka, o);
    ka_seq(&ka, g);
    CLG_KA(&ka, lse);
    CLG_KA(&ka, ol);
    CLG_KA(&ka, s->Dp);
    CLG_KA(&ka, s->Lp);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t gw[2] = {(size_t)Tp, (size_t)NH};
    return clg_launch(dev, kd, 2, gw, NULL, CLG_LAUNCH_PAD, NULL);
}

static clg_status cpu_bwd_run(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                              const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *g,
                              const cpu_bwd_scratch *s, const clg_attn_seq *dq, const clg_attn_seq *dk,
                              const clg_attn_seq *dv)
{
    cl_kernel kq, kkv;
    CLG_TRY(cpu_kernel(dev, a, "attn_bwd_dq_cpu", &kq));
    CLG_TRY(cpu_kernel(dev, a, "attn_bwd_dkdv_cpu", &kkv));
    clg_kargs ka = {kq, 0, CL_SUCCESS};
    ka_cpu_head(&ka, a);
    ka_seq(&ka, q);
    ka_seq(&ka, k);
    CLG_KA(&ka, s->Kt);
    CLG_KA(&ka, s->Vt);
    ka_seq(&ka, g);
    CLG_KA(&ka, s->Lp);
    CLG_KA(&ka, s->Dp);
    ka_seq(&ka, dq);
    ka_cpu_dropout(&ka, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    CLG_TRY(cpu_blocks(dev, kq, a, cpu_rq(a)));
    clg_kargs kb = {kkv, 0, CL_SUCCESS};
    ka_cpu_head(&kb, a);
    ka_seq(&kb, q);
    ka_seq(&kb, k);
    ka_seq(&kb, v);
    ka_seq(&kb, g);
    CLG_KA(&kb, s->Qt);
    CLG_KA(&kb, s->Gt);
    CLG_KA(&kb, s->Lp);
    CLG_KA(&kb, s->Dp);
    ka_seq(&kb, dk);
    ka_seq(&kb, dv);
    ka_cpu_dropout(&kb, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &kb, "kernel arguments"));
    return cpu_blocks(dev, kkv, a, cpu_rk(a));
}

/* attn_bwd_cpu1: one work-item per head fills its scratch and computes dQ with dK, dV (one launch). */
static clg_status cpu_bwd_run1(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                               const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse,
                               size_t lse_off, const clg_attn_seq *g, const cpu_bwd_scratch *s,
                               const clg_attn_seq *dq, const clg_attn_seq *dk, const clg_attn_seq *dv)
{
    cl_kernel kr;
    CLG_TRY(cpu_kernel(dev, a, "attn_bwd_cpu1", &kr));
    clg_kargs ka = {kr, 0, CL_SUCCESS};
    cl_uint ol = (cl_uint)lse_off;
    ka_cpu_head(&ka, a);
    ka_seq(&ka, q);
    ka_seq(&ka, k);
    ka_seq(&ka, v);
    ka_seq(&ka, o);
    ka_seq(&ka, g);
    CLG_KA(&ka, lse);
    CLG_KA(&ka, ol);
    CLG_KA(&ka, s->Qt);
    CLG_KA(&ka, s->Gt);
    CLG_KA(&ka, s->Lp);
    CLG_KA(&ka, s->Dp);
    ka_seq(&ka, dq);
    ka_seq(&ka, dk);
    ka_seq(&ka, dv);
    ka_cpu_dropout(&ka, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t gw[2] = {1, (size_t)a->N * a->heads}, l[2] = {1, 1};
    return clg_launch(dev, kr, 2, gw, l, CLG_LAUNCH_FIXED, NULL);
}

static clg_status cpu_backward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                               const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem lse,
                               size_t lse_off, const clg_attn_seq *g, const clg_attn_seq *dq,
                               const clg_attn_seq *dk, const clg_attn_seq *dv)
{
    cpu_bwd_scratch s = {NULL, NULL, NULL, NULL, NULL, NULL};
    int one = cpu_per_head(dev, a);
    clg_status st = cpu_bwd_prep(dev, a, q, k, v, o, lse, lse_off, g, one, &s);
    if (st == CLG_OK)
        st = one ? cpu_bwd_run1(dev, a, q, k, v, o, lse, lse_off, g, &s, dq, dk, dv)
                 : cpu_bwd_run(dev, a, q, k, v, g, &s, dq, dk, dv);
    cl_mem m[6] = {s.Kt, s.Vt, s.Qt, s.Gt, s.Dp, s.Lp};
    for (int i = 0; i < 6; i++)
        clg_buf_release(dev, m[i]);
    return st;
}

// ---- GEMM path ----

/* For sample n: C_h = alpha op(A_h) op(B_h) over the heads h (one batched
 * product). Sequence operands advance by d per head, T x T ones by T T. */
typedef struct {
    cl_mem mem;
    size_t off; /* element offset of head 0 of sample n */
    int ld;
    size_t stride;
} head_op;

static head_op seq_op(const clg_attn_desc *a, const clg_attn_seq *s, int n)
{
    head_op h = {s->mem, s->off + (size_t)n * a->T * s->ld, s->ld, (size_t)a->d};
    return h;
}

static head_op tt_op(const clg_attn_desc *a, cl_mem m, size_t off, int n)
{
    size_t tt = (size_t)a->T * a->T;
    head_op h = {m, off + (size_t)n * a->heads * tt, a->T, tt};
    return h;
}

static clg_status head_gemm(clg_device *dev, const clg_attn_desc *a, int ta, int tb, int M, int N, int K,
                            float alpha, head_op A, head_op B, head_op C)
{
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = ta;
    g.tb = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.alpha = alpha;
    g.A = A.mem;
    g.offA = A.off;
    g.lda = A.ld;
    g.strideA = A.stride;
    g.B = B.mem;
    g.offB = B.off;
    g.ldb = B.ld;
    g.strideB = B.stride;
    g.C = C.mem;
    g.offC = C.off;
    g.ldc = C.ld;
    g.strideC = C.stride;
    g.batch = a->heads;
    return clg_gemm(dev, &g, NULL);
}

static clg_status masked_softmax(clg_device *dev, const clg_attn_desc *a, cl_mem S, size_t off)
{
    cl_kernel k;
    size_t wg;
    CLG_TRY(clg_kernel_get_wg(dev, "attention", "attn_softmax", "AS_WG", ATTN_SM_WG, &k, &wg));
    cl_uint T = (cl_uint)a->T, os = (cl_uint)off;
    cl_int causal = a->causal ? 1 : 0;
    clg_kargs ka = {k, 0, CL_SUCCESS};
    CLG_KA(&ka, T);
    CLG_KA(&ka, causal);
    CLG_KA(&ka, S);
    CLG_KA(&ka, os);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "kernel arguments"));
    size_t g = (size_t)a->N * a->heads * a->T * wg;
    return clg_launch(dev, k, 1, &g, &wg, CLG_LAUNCH_FIXED, NULL);
}

static clg_status gemm_forward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                               const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem P,
                               size_t poff)
{
    int T = a->T, d = a->d;
    for (int n = 0; n < a->N; n++) /* S = scale Q K^T */
        CLG_TRY(head_gemm(dev, a, 0, 1, T, T, d, a->scale, seq_op(a, q, n), seq_op(a, k, n), tt_op(a, P, poff, n)));
    CLG_TRY(masked_softmax(dev, a, P, poff));
    size_t all = (size_t)a->N * a->heads * T * T, pdoff = poff;
    if (a->dropout > 0.0f) { /* Pd = dropout(P) after P */
        pdoff = poff + all;
        CLG_TRY(clg_nn_dropout(dev, all, a->dropout, a->seed, a->step, a->base, P, poff, P, pdoff));
    }
    for (int n = 0; n < a->N; n++) /* O = Pd V */
        CLG_TRY(head_gemm(dev, a, 0, 0, T, d, T, 1.0f, tt_op(a, P, pdoff, n), seq_op(a, v, n), seq_op(a, o, n)));
    return CLG_OK;
}

static clg_status gemm_backward_n(clg_device *dev, const clg_attn_desc *a, int n, const clg_attn_seq *q,
                                  const clg_attn_seq *k, const clg_attn_seq *v, cl_mem P, size_t poff, cl_mem dS,
                                  const clg_attn_seq *g, const clg_attn_seq *dq, const clg_attn_seq *dk,
                                  const clg_attn_seq *dv)
{
    int T = a->T, d = a->d;
    size_t rows = (size_t)a->heads * T, tt = rows * T;
    /* dP = dO V^T (through the dropout mask), then dS = P o (dP - rowsum(dP o P)) in place */
    CLG_TRY(head_gemm(dev, a, 0, 1, T, T, d, 1.0f, seq_op(a, g, n), seq_op(a, v, n), tt_op(a, dS, 0, 0)));
    size_t pdoff = poff;
    if (a->dropout > 0.0f) {
        pdoff = poff + (size_t)a->N * tt;
        CLG_TRY(clg_nn_dropout(dev, tt, a->dropout, a->seed, a->step, a->base + (uint32_t)((size_t)n * tt), dS, 0, dS,
                               0));
    }
    CLG_TRY(clg_nn_softmax_backward(dev, (int)rows, T, P, poff + (size_t)n * tt, dS, 0, dS, 0));
    /* dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO */
    CLG_TRY(head_gemm(dev, a, 0, 0, T, d, T, a->scale, tt_op(a, dS, 0, 0), seq_op(a, k, n), seq_op(a, dq, n)));
    CLG_TRY(head_gemm(dev, a, 1, 0, T, d, T, a->scale, tt_op(a, dS, 0, 0), seq_op(a, q, n), seq_op(a, dk, n)));
    return head_gemm(dev, a, 1, 0, T, d, T, 1.0f, tt_op(a, P, pdoff, n), seq_op(a, g, n), seq_op(a, dv, n));
}

static clg_status gemm_backward(clg_device *dev, const clg_attn_desc *a, const clg_attn_seq *q,
                                const clg_attn_seq *k, const clg_attn_seq *v, cl_mem P, size_t poff,
                                const clg_attn_seq *g, const clg_attn_seq *dq, const clg_attn_seq *dk,
                                const clg_attn_seq *dv)
{
    /* dS scratch for one sample at a time (heads x T x T) */
    cl_mem dS = NULL;
    CLG_TRY(clg_buf_alloc(dev, (size_t)a->heads * a->T * a->T * sizeof(float), &dS));
    clg_status st = CLG_OK;
    for (int n = 0; n < a->N && st == CLG_OK; n++)
        st = gemm_backward_n(dev, a, n, q, k, v, P, poff, dS, g, dq, dk, dv);
    clg_buf_release(dev, dS);
    return st;
}

// ---- entry points ----

clg_status clg_attn_forward(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo, const clg_attn_seq *q,
                            const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem saved,
                            size_t saved_off)
{
    const char *op = "attention forward";
    CLG_TRY(clg_attn_check(dev, a));
    CLG_TRY(check_seq(dev, a, op, "q", q));
    CLG_TRY(check_seq(dev, a, op, "k", k));
    CLG_TRY(check_seq(dev, a, op, "v", v));
    CLG_TRY(check_seq(dev, a, op, "o", o));
    CLG_TRY(check_saved(dev, a, algo, op, saved, saved_off));
    CLG_TRY(check_dropout(dev, a, algo, op));
    if (algo == CLG_ATTN_GEMM)
        return gemm_forward(dev, a, q, k, v, o, saved, saved_off);
    if (fused_variant(dev, a) == 3)
        return cpu_forward(dev, a, q, k, v, o, saved, saved_off);
    return fused_forward(dev, a, q, k, v, o, saved, saved_off);
}

clg_status clg_attn_backward(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo, const clg_attn_seq *q,
                             const clg_attn_seq *k, const clg_attn_seq *v, const clg_attn_seq *o, cl_mem saved,
                             size_t saved_off, const clg_attn_seq *do_, const clg_attn_seq *dq,
                             const clg_attn_seq *dk, const clg_attn_seq *dv)
{
    const char *op = "attention backward";
    CLG_TRY(clg_attn_check(dev, a));
    const clg_attn_seq *s[] = {q, k, v, do_, dq, dk, dv};
    const char *names[] = {"q", "k", "v", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < 7; i++)
        CLG_TRY(check_seq(dev, a, op, names[i], s[i]));
    CLG_TRY(check_saved(dev, a, algo, op, saved, saved_off));
    CLG_TRY(check_dropout(dev, a, algo, op));
    if (algo == CLG_ATTN_GEMM)
        return gemm_backward(dev, a, q, k, v, saved, saved_off, do_, dq, dk, dv);
    CLG_TRY(check_seq(dev, a, op, "o", o));
    if (fused_variant(dev, a) == 3)
        return cpu_backward(dev, a, q, k, v, o, saved, saved_off, do_, dq, dk, dv);
    return fused_backward(dev, a, q, k, v, o, saved, saved_off, do_, dq, dk, dv);
}
