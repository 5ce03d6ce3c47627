/* GEMM: C = act(alpha * op(A) * op(B) + beta * C + bias), row-major.
 * A: op(A) is M x K (A stored M x K, or K x M when ta), leading dim lda;
 * B: op(B) is K x N (B stored K x N, or N x K when tb), leading dim ldb;
 * C: M x N, leading dim ldc. Offsets and strides are in elements.
 * Batched: `batch` independent products, operand i at off + i * stride. */
#ifndef CLG_OPS_GEMM_H
#define CLG_OPS_GEMM_H

#include "device/device.h"

typedef enum clg_gemm_backend {
    CLG_GEMM_AUTO = 0,
    CLG_GEMM_OWN = 1,
    CLG_GEMM_CLBLAST = 2,
    CLG_GEMM_REF = 3 /* the slow reference kernel (tests, debugging) */
} clg_gemm_backend;

typedef enum clg_bias_mode {
    CLG_BIAS_NONE = 0,
    CLG_BIAS_ROW = 1, /* bias[m] added to row m (length M) */
    CLG_BIAS_COL = 2  /* bias[n] added to column n (length N) */
} clg_bias_mode;

typedef struct clg_gemm_args {
    int ta, tb;
    int M, N, K;
    float alpha, beta;
    cl_mem A;
    size_t offA;
    int lda;
    cl_mem B;
    size_t offB;
    int ldb;
    cl_mem C;
    size_t offC;
    int ldc;
    int batch; /* 0 or 1: single product */
    size_t strideA, strideB, strideC;
    cl_mem bias; /* optional epilogue */
    size_t offBias;
    clg_bias_mode bias_mode;
    int relu;
    /* GELU at the end of the epilogue (after bias and relu): 0 none, 1 erf
     * form, 2 tanh form (as clg_nn_act_forward's CLG_ACT_GELU, _GELU_TANH);
     * 3, 4 the same forms with pre receiving the GELU's derivative at that
     * value (clg_nn_dmul_colsum's d) instead of the value itself.
     * pre (required with it) receives the value before the GELU, at C's
     * index without offC. Needs batch 1 and ldc = N. Applied inside the own
     * CPU-family kernel's epilogue (no extra pass); any other path runs the
     * product into pre and then the activation pass. */
    int gelu;
    cl_mem pre;
    clg_gemm_backend backend;
} clg_gemm_args;

/* Kernel parameters of the own backend (one compiled variant each). */
typedef enum clg_gemm_family {
    CLG_GEMM_FAM_REF = 0,   /* gemm_ref */
    CLG_GEMM_FAM_CPU = 1,   /* gemm_cpu: packed panels, register tile, no barriers */
    CLG_GEMM_FAM_TILED = 2  /* gemm_tiled: local-memory work-group tile */
} clg_gemm_family;

typedef struct clg_gemm_params {
    int family;
    /* CPU family: MR rows x NV*VW columns per work-item, WGS work-items per
     * work-group, KS split-K factor (0: chosen per shape). */
    int MR, NV, VW, WGS, KS;
    /* tiled family */
    int MWG, NWG, KWG, MDIMC, NDIMC, VWM, VWN, PADA, PADB;
} clg_gemm_params;

/* Fills defaults: alpha 1, beta 0, batch 1, backend auto. */
CLG_INTERNAL void clg_gemm_args_init(clg_gemm_args *a);
/* Enqueues the GEMM on dev's queue. ev (may be NULL) receives an event for
 * the last kernel of the product, to release by the caller. */
CLG_INTERNAL clg_status clg_gemm(clg_device *dev, const clg_gemm_args *a, cl_event *ev);

/* Same as clg_gemm with an explicit backend (AUTO resolves as in clg_gemm)
 * and, for the own backend, explicit parameters (NULL: tuned or default).
 * first/last (may be NULL) receive events bracketing the device work (for
 * timing; release both; first may equal last with its own reference). */
CLG_INTERNAL clg_status clg_gemm_run(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend backend,
                                     const clg_gemm_params *p, cl_event *first, cl_event *last);

/* Shipped defaults for the device (by type and vendor). */
CLG_INTERNAL void clg_gemm_params_default(const clg_device *dev, clg_gemm_params *p);
/* Whether a CPU device has 16-float vector registers (AVX-512), from its name. */
CLG_INTERNAL int clg_gemm_cpu_wide(const clg_device *dev);
/* Parameters for a shape: tuned entry of the shape class, else the nearest
 * tuned class of the device, else the defaults. */
/* Where a parameter set came from (clg_gemm_params_src). */
enum { CLG_GEMM_SRC_DEFAULT = 0, CLG_GEMM_SRC_FAMILY = 1, CLG_GEMM_SRC_OWN = 2 };
CLG_INTERNAL int clg_gemm_params_src(clg_device *dev, int M, int N, int K, clg_gemm_params *p);
CLG_INTERNAL void clg_gemm_params_for(clg_device *dev, int M, int N, int K, clg_gemm_params *p);
/* CLG_OK when p can be built and run on dev (else the reason on dev's err). */
CLG_INTERNAL clg_status clg_gemm_params_check(clg_device *dev, const clg_gemm_params *p);
/* Build options of a parameter set ("" for the reference family). */
CLG_INTERNAL void clg_gemm_params_options(const clg_gemm_params *p, char *buf, size_t len);
/* Human-readable one-line description. */
CLG_INTERNAL void clg_gemm_params_str(const clg_gemm_params *p, char *buf, size_t len);
/* What the own backend runs for a (shape and transposes) when the caller
 * leaves the parameters to it: "unpacked rows ..." / "unpacked dot ..."
 * (small and long-thin products on the CPU family, see unpacked_kind in
 * gemm.c) or the parameter set of the packed kernel. */
CLG_INTERNAL void clg_gemm_own_describe(clg_device *dev, const clg_gemm_args *a, char *buf, size_t len);
/* Conversion to/from tuning-database entries. */
struct clg_tune_entry;
CLG_INTERNAL void clg_gemm_params_to_entry(const clg_gemm_params *p, struct clg_tune_entry *e);
CLG_INTERNAL int clg_gemm_params_from_entry(const struct clg_tune_entry *e, clg_gemm_params *p);

/* ---- products on operands already in panel layout ----
 * The own backend's kernels (gemm_cpu, gemm_tiled) read op(A) and op(B) as
 * panels (what gemm_pack in cl/gemm.cl writes):
 *   A: Mt = ceil(M/PA) panels of PA rows x Kp, element (m, k) at
 *      ((m / PA) * Kp + k) * PA + m % PA;
 *   B: Nt = ceil(N/PB) panels of PB columns x Kp, element (k, n) at
 *      ((n / PB) * Kp + k) * PB + n % PB.
 * Rows m >= M of A and columns n >= N of B only reach outputs that are never
 * stored (keep them finite, zero is best); depth k in [K, Kp) must be zero
 * in both operands (Kp > K only for the tiled family). A producer that
 * writes its output in this layout (e.g. a Winograd transform) saves the two
 * packing passes clg_gemm makes on every call. */
typedef struct clg_gemm_layout {
    clg_gemm_params p; /* own-backend parameters the layout belongs to (CPU or tiled family) */
    int PA, PB;        /* rows per A panel (MR or MWG), columns per B panel (NV*VW or NWG) */
    int kalign;        /* Kp = K rounded up to a multiple of kalign (1 for the CPU family) */
} clg_gemm_layout;

/* Layout the own backend uses for an (M, N, K) product with parameters p
 * (NULL: the parameters clg_gemm would choose for the shape). The layout
 * depends on (M, N, K) only through that choice. CLG_ERR_UNSUPPORTED for
 * the reference family (it reads unpacked operands). */
CLG_INTERNAL clg_status clg_gemm_pack_layout(clg_device *dev, int M, int N, int K, const clg_gemm_params *p,
                                             clg_gemm_layout *L);
/* Packed depth of K under L, and the floats of one packed operand. */
CLG_INTERNAL int clg_gemm_layout_kp(const clg_gemm_layout *L, int K);
CLG_INTERNAL size_t clg_gemm_layout_floats_a(const clg_gemm_layout *L, int M, int K);
CLG_INTERNAL size_t clg_gemm_layout_floats_b(const clg_gemm_layout *L, int N, int K);

/* C = act(alpha * op(A) * op(B) + beta * C + bias) with op(A), op(B) packed
 * in L's layout: Ap holds the `batch` packed A operands apStride floats
 * apart (0: one operand shared by all), starting at element 0; Bp likewise.
 * From a: M, N, K, alpha, beta, C, offC, ldc, strideC, batch, bias, offBias,
 * bias_mode, relu as in clg_gemm; A, B, ta, tb, lda, ldb, offA, offB,
 * strideA, strideB and backend are ignored (always the own kernels with
 * L->p, split-K as clg_gemm would). ev as in clg_gemm. */
CLG_INTERNAL clg_status clg_gemm_packed(clg_device *dev, const clg_gemm_layout *L, const clg_gemm_args *a, cl_mem Ap,
                                        size_t apStride, cl_mem Bp, size_t bpStride, cl_event *ev);

/* C = act(alpha * A * B^T + beta * C + bias) for A (M x K) and B (N x K)
 * row-major with K contiguous (a->ta = 0 and a->tb = 1 required) as dot
 * products along K, reading the operands in place (no packing): for long,
 * thin products (K several times M and N, K >= 64) where packing both
 * operands costs about as much as the product. Otherwise the contract of
 * clg_gemm (offsets, strides, batch, epilogue); a->backend is ignored. */
CLG_INTERNAL clg_status clg_gemm_dot(clg_device *dev, const clg_gemm_args *a, cl_event *ev);

/* C = act(alpha * op(A) * B + beta * C + bias) with B not transposed
 * (a->tb = 0 required; a->ta either), reading the operands in place in one
 * launch: each work-item computes 8 rows x 16 columns from rows of B. For
 * small products (the dense layers' gradients), where the two packing
 * passes of clg_gemm cost more than the product. Otherwise the contract of
 * clg_gemm; a->backend is ignored. */
CLG_INTERNAL clg_status clg_gemm_rows(clg_device *dev, const clg_gemm_args *a, cl_event *ev);

/* Kernel arguments of the GEMM kernels (cl/gemm.cl, cl/gemm_splitk.cl):
 * clg_gemm_ka_inputs sets the unpacked operands A, offA, lda, strideA, then
 * the same for B; clg_gemm_ka_output the output and epilogue every GEMM
 * kernel ends with: C, offC, ldc, strideC, bias (C when none), offBias,
 * bias_mode, relu. */
CLG_INTERNAL void clg_gemm_ka_inputs(clg_kargs *g, const clg_gemm_args *a);
CLG_INTERNAL void clg_gemm_ka_output(clg_kargs *g, const clg_gemm_args *a);

/* Shape class of a product ("M3N4K2": log4-sized buckets 0..5 per dim). */
CLG_INTERNAL void clg_gemm_class(int M, int N, int K, char *buf, size_t len);

/* Context-wide backend used when args->backend is AUTO (default AUTO:
 * the faster of own/CLBlast per shape class when CLBlast is built in, as
 * recorded by `clgrad tune` or measured once at run time for products of
 * 1 to 200 GFLOP, and stored in the tuning database; own otherwise).
 * CLGRAD_GEMM_BACKEND (own|clblast|auto|ref) sets the initial value and
 * CLGRAD_GEMM_AUTO_MEASURE=0 turns the run-time measurement off.
 * The CLI's --gemm-backend maps onto clg_gemm_set_backend(). */
CLG_INTERNAL clg_status clg_gemm_set_backend(clg_ctx *ctx, clg_gemm_backend b);
CLG_INTERNAL clg_gemm_backend clg_gemm_get_backend(clg_ctx *ctx);
/* "own", "clblast", "auto", "ref" -> backend; -1 when unknown. */
CLG_INTERNAL int clg_gemm_backend_parse(const char *s);
CLG_INTERNAL const char *clg_gemm_backend_name(clg_gemm_backend b);
/* 1 when the CLBlast backend is compiled in. */
CLG_INTERNAL int clg_gemm_have_clblast(void);
/* Times backend b on this shape (scratch operands, median of reps runs
 * after a warm-up) in ms; own uses p (NULL: chosen). */
CLG_INTERNAL clg_status clg_gemm_time(clg_device *dev, const clg_gemm_args *shape, clg_gemm_backend b,
                                      const clg_gemm_params *p, int reps, double *ms);

#endif
