/*
 * clgrad primitives — clgrad's kernels on the caller's OpenCL objects.
 * Included by <clgrad.h> (unless CLG_NO_PRIMITIVES is defined); including
 * <clgrad_prim.h> directly works as well.
 *
 * Overview
 *   GEMM (transposes, alpha/beta, bias and ReLU epilogue), 2-D convolution
 *   forward, backward-data and backward-filter (im2col, direct, Winograd
 *   F(2x2,3x3) and F(4x4,3x3), separate or fused, clFFT; or a measured
 *   automatic choice), pooling, softmax and multi-head attention (fused or
 *   GEMM), on the caller's cl_context, in-order cl_command_queue and cl_mem
 *   buffers, in the style of CLBlast's C API. Every call takes an event wait list and can return an event that
 *   completes when the whole operation (which may be several kernels) has.
 *
 *   A handle (clg_prim) is created once per command queue. It compiles the
 *   kernels it needs on first use, keeps them, caches their binaries on disk
 *   (as clg_ctx does), and reads the tuning database and the measured
 *   convolution-algorithm choices of the device. Scratch memory is
 *   allocated in the queue's context and kept for reuse until
 *   clg_prim_destroy.
 *
 *   Layout: row-major matrices; NCHW tensors of float (fp32). Offsets and
 *   leading dimensions are in elements. Every buffer is checked against its
 *   CL_MEM_SIZE and must belong to the queue's context: a too-small buffer,
 *   a bad shape or a NULL argument returns CLG_ERR_INVALID_ARG or
 *   CLG_ERR_SHAPE with a message naming it (clg_prim_last_error) before
 *   anything is enqueued.
 *
 * Ownership
 *   The queue, its context and the buffers stay the caller's: the handle
 *   retains the queue and its context and releases them once in
 *   clg_prim_destroy. Events returned through `event` are the caller's to
 *   release (clReleaseEvent).
 *
 * Thread safety
 *   A handle is used by one thread at a time (as the queue's kernels are
 *   shared state); separate handles may be used from separate threads.
 *
 * ABI
 *   Every params / descriptor struct starts with `size_t size`, set by its
 *   _init function to the sizeof the caller was compiled with; the library
 *   reads only the fields within that size and uses defaults for later
 *   ones, so fields appended in later versions do not break binaries built
 *   against this header. Always call the _init function first.
 *
 * Example (built and run by the test prim-header-example; examples/primitives.c
 * is a longer program):
 *
 *   #include <clgrad_prim.h>
 *   #include <stdio.h>
 *   int main(void) {
 *       cl_platform_id plat;
 *       cl_device_id dev;
 *       if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
 *           clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS)
 *           return 77;
 *       cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, NULL);
 *       cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, NULL);
 *       clg_prim *h;
 *       if (clg_prim_create(q, NULL, &h) != CLG_OK) {
 *           fprintf(stderr, "%s\n", clg_last_error(NULL));
 *           return 1;
 *       }
 *       // C (2 x 2) = ReLU(A (2 x 3) * B (3 x 2) + bias per column)
 *       float A[] = {1, 2, 3, 4, 5, 6}, B[] = {1, -1, 0, 1, 2, -3}, bias[] = {0.5f, 0}, C[4];
 *       cl_mem a = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof A, A, NULL);
 *       cl_mem b = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof B, B, NULL);
 *       cl_mem bb = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof bias, bias, NULL);
 *       cl_mem c = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof C, NULL, NULL);
 *       clg_prim_gemm_epilogue epi;
 *       clg_prim_gemm_epilogue_init(&epi);
 *       epi.bias = bb;
 *       epi.bias_mode = CLG_PRIM_BIAS_COL;
 *       epi.relu = 1;
 *       cl_event done;
 *       clg_status st = clg_prim_sgemm(h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 2, 2, 3, 1.0f, a, 0, 3, b, 0, 2,
 *                                      0.0f, c, 0, 2, &epi, 0, NULL, &done);
 *       if (st != CLG_OK) {
 *           fprintf(stderr, "%s\n", clg_prim_last_error(h));
 *           return 1;
 *       }
 *       clEnqueueReadBuffer(q, c, CL_TRUE, 0, sizeof C, C, 1, &done, NULL);
 *       printf("%g %g / %g %g\n", C[0], C[1], C[2], C[3]); // 7.5 0 / 16.5 0
 *       clReleaseEvent(done);
 *       clg_prim_destroy(h);
 *       clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(bb), clReleaseMemObject(c);
 *       clReleaseCommandQueue(q);
 *       clReleaseContext(ctx);
 *       return C[0] == 7.5f && C[1] == 0 && C[2] == 16.5f && C[3] == 0 ? 0 : 1;
 *   }
 */
#ifndef CLGRAD_PRIM_H
#define CLGRAD_PRIM_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include "clgrad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- handle ---- */
typedef struct clg_prim clg_prim;

typedef struct clg_prim_params {
    size_t size;            /* sizeof(clg_prim_params), set by clg_prim_params_init */
    /* Program binary cache: 1 on (default), 0 off (CLGRAD_CACHE=0 also turns it off). */
    int use_cache;
    /* Cache directory for program binaries, tuning database and measured
     * algorithm choices (borrowed); NULL: as clg_ctx_params.cache_dir. */
    const char *cache_dir;
    /* .cl sources to use instead of the embedded ones (borrowed); NULL: $CLGRAD_KERNEL_DIR. */
    const char *kernel_dir;
    /* GEMM implementation: "auto" (default, NULL: the faster of clgrad's own
     * kernels and CLBlast per shape class where CLBlast is built in), "own",
     * "clblast". */
    const char *gemm_backend;
    /* 0 quiet, 1 info, 2 debug (to stderr). */
    int verbose;
} clg_prim_params;

CLG_API void clg_prim_params_init_size(clg_prim_params *p, size_t size);
#define clg_prim_params_init(p) clg_prim_params_init_size((p), sizeof *(p))
/* A handle for the in-order command queue `queue` (its context and device).
 * p may be NULL (defaults). An out-of-order queue is refused
 * (CLG_ERR_UNSUPPORTED). On failure *out is NULL and clg_last_error(NULL)
 * tells why. */
CLG_API clg_status clg_prim_create(cl_command_queue queue, const clg_prim_params *p, clg_prim **out);
/* Finishes the queue, frees the handle's kernels and scratch buffers and
 * releases its references to the queue and context. NULL is a no-op. */
CLG_API void clg_prim_destroy(clg_prim *h);
/* Detail of the last failure on h (never NULL). */
CLG_API const char *clg_prim_last_error(const clg_prim *h);

/* ---- GEMM ---- */
typedef enum clg_prim_transpose { CLG_PRIM_NO_TRANS = 0, CLG_PRIM_TRANS = 1 } clg_prim_transpose;

typedef enum clg_prim_bias_mode {
    CLG_PRIM_BIAS_NONE = 0,
    CLG_PRIM_BIAS_ROW = 1, /* bias[i] added to row i of C (m values) */
    CLG_PRIM_BIAS_COL = 2  /* bias[j] added to column j of C (n values) */
} clg_prim_bias_mode;

/* Applied after alpha * op(A) op(B) + beta * C: + bias, then max(0, .). */
typedef struct clg_prim_gemm_epilogue {
    size_t size;                  /* set by clg_prim_gemm_epilogue_init */
    cl_mem bias;                  /* NULL: no bias */
    size_t bias_offset;           /* elements */
    clg_prim_bias_mode bias_mode; /* default CLG_PRIM_BIAS_NONE */
    int relu;                     /* 1: ReLU on the result (default 0) */
} clg_prim_gemm_epilogue;

CLG_API void clg_prim_gemm_epilogue_init_size(clg_prim_gemm_epilogue *e, size_t size);
#define clg_prim_gemm_epilogue_init(e) clg_prim_gemm_epilogue_init_size((e), sizeof *(e))

/* C = epilogue(alpha * op(A) * op(B) + beta * C), row-major:
 * op(A) is m x k (A stored m x k, or k x m with ta = CLG_PRIM_TRANS),
 * op(B) is k x n (B stored k x n, or n x k with tb), C is m x n.
 * lda, ldb, ldc: row pitch of the stored matrices in elements. beta == 0
 * never reads C (it may hold anything, NaN included). epi may be NULL
 * (no bias, no ReLU). m or n == 0 enqueues no kernel. */
CLG_API clg_status clg_prim_sgemm(clg_prim *h, clg_prim_transpose ta, clg_prim_transpose tb, size_t m, size_t n,
                                  size_t k, float alpha, cl_mem a, size_t a_offset, size_t lda, cl_mem b,
                                  size_t b_offset, size_t ldb, float beta, cl_mem c, size_t c_offset, size_t ldc,
                                  const clg_prim_gemm_epilogue *epi, cl_uint num_wait, const cl_event *wait,
                                  cl_event *event);

/* ---- convolution ----
 * Legend: x (n, c, h, w)  w (k, c / groups, r, s)  y (n, k, p, q)  bias (k)
 * with p = (h + 2 pad_h - dil_h (r - 1) - 1) / stride_h + 1, likewise q. */
typedef enum clg_prim_conv_algo {
    CLG_PRIM_CONV_AUTO = 0,            /* measured once per (device, shape, pass), cached on disk */
    CLG_PRIM_CONV_IM2COL = 1,          /* im2col + GEMM: any shape */
    CLG_PRIM_CONV_WINOGRAD = 2,        /* F(2x2,3x3), 3x3 stride 1, dilation 1 */
    CLG_PRIM_CONV_WINOGRAD4 = 3,       /* F(4x4,3x3) */
    CLG_PRIM_CONV_DIRECT = 4,          /* direct loops (depthwise, small problems) */
    CLG_PRIM_CONV_FFT = 5,             /* clFFT (forward only; where built with clFFT) */
    CLG_PRIM_CONV_WINOGRAD_FUSED = 6,  /* F(2x2,3x3) in one launch (forward, backward-data) */
    CLG_PRIM_CONV_WINOGRAD4_FUSED = 7, /* F(4x4,3x3) in one launch (fwd, bwd-data); F(3x3,4x4) wgrad */
    CLG_PRIM_CONV_ALGO_COUNT
} clg_prim_conv_algo;

typedef enum clg_prim_conv_pass {
    CLG_PRIM_CONV_FORWARD = 0,
    CLG_PRIM_CONV_BACKWARD_DATA = 1,
    CLG_PRIM_CONV_BACKWARD_FILTER = 2
} clg_prim_conv_pass;

typedef struct clg_prim_conv_desc {
    size_t size;                 /* set by clg_prim_conv_desc_init */
    int n, c, h, w;              /* input: batch, channels, height, width */
    int k, r, s;                 /* filters: output channels, window height, width */
    int pad_h, pad_w;            /* zero padding (default 0) */
    int stride_h, stride_w;      /* default 1 */
    int dil_h, dil_w;            /* dilation (default 1) */
    int groups;                  /* default 1; c and k divisible by it */
    clg_prim_conv_algo algo;     /* default CLG_PRIM_CONV_AUTO */
} clg_prim_conv_desc;

/* Zero sizes, stride and dilation 1, one group, automatic algorithm. */
CLG_API void clg_prim_conv_desc_init_size(clg_prim_conv_desc *d, size_t size);
#define clg_prim_conv_desc_init(d) clg_prim_conv_desc_init_size((d), sizeof *(d))
/* Output height and width of d (CLG_ERR_SHAPE naming the bad field otherwise). */
CLG_API clg_status clg_prim_conv_output_size(clg_prim *h, const clg_prim_conv_desc *d, int *p, int *q);
/* 1 when algo can run pass on d's shape, else 0. */
CLG_API int clg_prim_conv_algo_supported(const clg_prim_conv_desc *d, clg_prim_conv_algo algo,
                                         clg_prim_conv_pass pass);
/* "auto", "im2col", "winograd", "winograd4", "direct", "fft", "winograd-fused",
 * "winograd4-fused"; NULL for other values. */
CLG_API const char *clg_prim_conv_algo_name(clg_prim_conv_algo algo);
/* The algorithm d->algo resolves to for pass on h's device (AUTO: measured
 * now, on scratch buffers, when not yet known for this shape class).
 * With CLG_PRIM_CONV_AUTO, the first call for a shape class times every
 * eligible algorithm (the choice is then cached in memory and on disk); this
 * runs on h's queue before the call's wait list and finishes the queue, so
 * work already enqueued there must be able to complete. Calling
 * clg_prim_conv_algo_get (or setting a concrete algorithm) beforehand keeps
 * that out of an event chain. */
CLG_API clg_status clg_prim_conv_algo_get(clg_prim *h, const clg_prim_conv_desc *d, clg_prim_conv_pass pass,
                                          clg_prim_conv_algo *out);

/* y = conv(x, w) (+ bias[k] when bias is not NULL), then ReLU when relu = 1. */
CLG_API clg_status clg_prim_conv_forward(clg_prim *h, const clg_prim_conv_desc *d, cl_mem x, size_t x_offset,
                                         cl_mem w, size_t w_offset, cl_mem bias, size_t bias_offset, int relu,
                                         cl_mem y, size_t y_offset, cl_uint num_wait, const cl_event *wait,
                                         cl_event *event);
/* dx = gradient of the forward pass's input from dy (overwrites dx). */
CLG_API clg_status clg_prim_conv_backward_data(clg_prim *h, const clg_prim_conv_desc *d, cl_mem dy,
                                               size_t dy_offset, cl_mem w, size_t w_offset, cl_mem dx,
                                               size_t dx_offset, cl_uint num_wait, const cl_event *wait,
                                               cl_event *event);
/* dw = beta * dw + gradient of the filters; db (may be NULL) = beta * db +
 * sum of dy over n, p, q. beta 0 or 1 (overwrite or accumulate); with
 * beta 0, dw and db are never read. The fused algorithms have no
 * backward-filter pass (CLG_ERR_UNSUPPORTED); AUTO picks among the others. */
CLG_API clg_status clg_prim_conv_backward_filter(clg_prim *h, const clg_prim_conv_desc *d, cl_mem x,
                                                 size_t x_offset, cl_mem dy, size_t dy_offset, float beta, cl_mem dw,
                                                 size_t dw_offset, cl_mem db, size_t db_offset, cl_uint num_wait,
                                                 const cl_event *wait, cl_event *event);

/* ---- pooling ---- */
typedef enum clg_prim_pool_mode {
    CLG_PRIM_POOL_MAX = 0, /* padding never wins; the gradient goes to the first maximum */
    CLG_PRIM_POOL_AVG = 1  /* padding counts in the divisor (PyTorch's default) */
} clg_prim_pool_mode;

typedef struct clg_prim_pool_desc {
    size_t size;                /* set by clg_prim_pool_desc_init */
    clg_prim_pool_mode mode;    /* default CLG_PRIM_POOL_MAX */
    int n, c, h, w;             /* input */
    int win_h, win_w;           /* window (default 2 x 2) */
    int stride_h, stride_w;     /* default 2 */
    int pad_h, pad_w;           /* default 0, at most half the window */
} clg_prim_pool_desc;

CLG_API void clg_prim_pool_desc_init_size(clg_prim_pool_desc *d, size_t size);
#define clg_prim_pool_desc_init(d) clg_prim_pool_desc_init_size((d), sizeof *(d))
/* Output height and width: (h + 2 pad_h - win_h) / stride_h + 1 (floor), likewise. */
CLG_API clg_status clg_prim_pool_output_size(clg_prim *h, const clg_prim_pool_desc *d, int *p, int *q);
/* y (n, c, p, q) = pool(x). */
CLG_API clg_status clg_prim_pool_forward(clg_prim *h, const clg_prim_pool_desc *d, cl_mem x, size_t x_offset,
                                         cl_mem y, size_t y_offset, cl_uint num_wait, const cl_event *wait,
                                         cl_event *event);
/* dx (overwritten) from dy; x, the forward input, is read by max pooling only (may be NULL for average). */
CLG_API clg_status clg_prim_pool_backward(clg_prim *h, const clg_prim_pool_desc *d, cl_mem x, size_t x_offset,
                                          cl_mem dy, size_t dy_offset, cl_mem dx, size_t dx_offset, cl_uint num_wait,
                                          const cl_event *wait, cl_event *event);

/* ---- softmax over the last dimension: rows x cols, row-major, contiguous ---- */
/* y = softmax(x) per row (y may be x). */
CLG_API clg_status clg_prim_softmax_forward(clg_prim *h, size_t rows, size_t cols, cl_mem x, size_t x_offset,
                                            cl_mem y, size_t y_offset, cl_uint num_wait, const cl_event *wait,
                                            cl_event *event);
/* dx = y * (dy - sum(dy * y)) per row, y the forward output (dx may be dy). */
CLG_API clg_status clg_prim_softmax_backward(clg_prim *h, size_t rows, size_t cols, cl_mem y, size_t y_offset,
                                             cl_mem dy, size_t dy_offset, cl_mem dx, size_t dx_offset,
                                             cl_uint num_wait, const cl_event *wait, cl_event *event);

/* ---- layer normalization over the last dimension: rows x cols, row-major, contiguous ---- */
/* y = (x - mean) / sqrt(var + eps) * gamma + beta per row (var biased, as
 * torch.nn.LayerNorm; gamma and beta cols floats each, or both NULL: no
 * affine part); eps > 0. mean and rstd (rows floats each) receive what the
 * backward reads: each row's mean minus the row's first value (kept shifted
 * for precision) and 1 / sqrt(var + eps). */
CLG_API clg_status clg_prim_layernorm_forward(clg_prim *h, size_t rows, size_t cols, float eps, cl_mem x,
                                              size_t x_offset, cl_mem gamma, cl_mem beta, cl_mem y, size_t y_offset,
                                              cl_mem mean, cl_mem rstd, cl_uint num_wait, const cl_event *wait,
                                              cl_event *event);
/* From dy and the forward's x, gamma (NULL without affine), mean and rstd:
 * dx (NULL: skipped; overwritten), dgamma and dbeta (cols floats each,
 * overwritten; both NULL: skipped). */
CLG_API clg_status clg_prim_layernorm_backward(clg_prim *h, size_t rows, size_t cols, cl_mem x, size_t x_offset,
                                               cl_mem dy, size_t dy_offset, cl_mem gamma, cl_mem mean, cl_mem rstd,
                                               cl_mem dx, size_t dx_offset, cl_mem dgamma, cl_mem dbeta,
                                               cl_uint num_wait, const cl_event *wait, cl_event *event);
/* ---- attention: multi-head scaled dot-product attention ----
 * Legend: n batch, t positions, heads, head_dim d, C = heads d.
 * Layout: q, k, v, o and their gradients are sequences (n, t, ld) row-major
 * whose row of position i of sample b holds the heads side by side: head
 * hd's d floats at offset + (b t + i) ld + hd d. A fused QKV projection's
 * output (n, t, 3C) is read in place with ld_q = ld_k = ld_v = 3C and
 * offsets 0, C, 2C; separate (n, t, C) buffers with ld = C (the default).
 * o_i = sum_j softmax_j(scale q_i . k_j) v_j over j <= i when causal.
 * `saved` keeps what backward needs: clg_prim_attention_saved_size floats
 * (fused: the log-sum-exp of each row, n heads t; gemm: the probabilities,
 * n heads t t). */
typedef enum clg_prim_attention_algo {
    CLG_PRIM_ATTENTION_AUTO = 0,  /* fused */
    CLG_PRIM_ATTENTION_FUSED = 1, /* FlashAttention-style kernels: the t x t scores stay in local memory */
    CLG_PRIM_ATTENTION_GEMM = 2   /* batched GEMMs + masked softmax (the reference path) */
} clg_prim_attention_algo;

typedef struct clg_prim_attention_desc {
    size_t size;                  /* set by clg_prim_attention_desc_init */
    int n, t, heads, head_dim;    /* head_dim 1..128 */
    int causal;                   /* default 1: position i attends to j <= i */
    float scale;                  /* default 0: 1 / sqrt(head_dim) */
    size_t ld_q, ld_k, ld_v, ld_o; /* row pitches in elements; 0 (default): heads x head_dim. The
                                      gradients dq, dk, dv use ld_q, ld_k, ld_v; dout uses ld_o */
    clg_prim_attention_algo algo; /* default CLG_PRIM_ATTENTION_AUTO */
} clg_prim_attention_desc;

CLG_API void clg_prim_attention_desc_init_size(clg_prim_attention_desc *d, size_t size);
#define clg_prim_attention_desc_init(d) clg_prim_attention_desc_init_size((d), sizeof *(d))
/* Floats of the `saved` buffer for d (0 when d is invalid). */
CLG_API size_t clg_prim_attention_saved_size(const clg_prim_attention_desc *d);
/* o = attention(q, k, v); saved (overwritten) is kept for backward. Dropout is not supported. */
CLG_API clg_status clg_prim_attention_forward(clg_prim *h, const clg_prim_attention_desc *d, cl_mem q,
                                              size_t q_offset, cl_mem k, size_t k_offset, cl_mem v, size_t v_offset,
                                              cl_mem o, size_t o_offset, cl_mem saved, size_t saved_offset,
                                              cl_uint num_wait, const cl_event *wait, cl_event *event);
/* dq, dk, dv (overwritten) from dout and the forward's q, k, v, o and saved
 * (same desc; o is read by the fused algorithm only and may be NULL for gemm). */
CLG_API clg_status clg_prim_attention_backward(clg_prim *h, const clg_prim_attention_desc *d, cl_mem q,
                                               size_t q_offset, cl_mem k, size_t k_offset, cl_mem v,
                                               size_t v_offset, cl_mem o, size_t o_offset, cl_mem saved,
                                               size_t saved_offset, cl_mem dout, size_t dout_offset, cl_mem dq,
                                               size_t dq_offset, cl_mem dk, size_t dk_offset, cl_mem dv,
                                               size_t dv_offset, cl_uint num_wait, const cl_event *wait,
                                               cl_event *event);

#ifdef __cplusplus
}
#endif
#endif /* CLGRAD_PRIM_H */
