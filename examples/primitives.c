/* primitives: an application using clgrad's kernels on its own OpenCL
 * objects through <clgrad_prim.h>.
 *
 * It creates its own cl_context and in-order queue, uploads a batch of
 * images, and runs a tiny network forward with the primitives, chained by
 * events (each call waits on the previous call's event):
 *   conv 3x3 (8 filters, pad 1, bias, ReLU; Winograd F(2x2,3x3))
 *   -> max pool 2x2 -> dense (GEMM with a bias-per-column + ReLU epilogue)
 *   -> dense (GEMM) -> softmax,
 * then recomputes every stage on the host in double precision and reports
 * the largest difference.
 *
 *   usage: primitives            exit status 0 when every stage agrees to 1e-4 */
#include <clgrad_prim.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 4, C = 3, H = 12, W = 12, K = 8, PH = 6, PW = 6, F = K * PH * PW, HID = 32, CLS = 10 };

static unsigned rng_state = 2024u;
static float frand(void) /* [-0.5, 0.5) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 16777216.0f - 0.5f;
}

static void fill(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = frand();
}

static cl_mem upload(cl_context ctx, const float *host, size_t n)
{
    cl_int e;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), n * sizeof(float),
                              (void *)host, &e);
    return e == CL_SUCCESS ? m : NULL;
}

static double maxdiff(const float *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, isfinite(a[i]) ? fabs(a[i] - b[i]) : INFINITY);
    return m;
}

/* ---- host reference (double) ---- */
static void host_forward(const float *x, const float *w, const float *b, const float *w1, const float *b1,
                         const float *w2, double *y_conv, double *y_pool, double *y_h, double *y_out)
{
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < H; p++)
                for (int q = 0; q < W; q++) {
                    double acc = b[k];
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < 3; r++)
                            for (int s = 0; s < 3; s++) {
                                int hh = p - 1 + r, ww = q - 1 + s;
                                if (hh >= 0 && hh < H && ww >= 0 && ww < W)
                                    acc += (double)x[((n * C + c) * H + hh) * W + ww] * w[((k * C + c) * 3 + r) * 3 + s];
                            }
                    y_conv[((n * K + k) * H + p) * W + q] = acc > 0 ? acc : 0;
                }
    for (int pl = 0; pl < N * K; pl++)
        for (int p = 0; p < PH; p++)
            for (int q = 0; q < PW; q++) {
                double m = -INFINITY;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++)
                        m = fmax(m, y_conv[(pl * H + 2 * p + i) * W + 2 * q + j]);
                y_pool[(pl * PH + p) * PW + q] = m;
            }
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < HID; j++) { /* hidden = relu(pool (N x F) * w1^T (w1: HID x F) + b1) */
            double acc = b1[j];
            for (int f = 0; f < F; f++)
                acc += y_pool[n * F + f] * w1[j * F + f];
            y_h[n * HID + j] = acc > 0 ? acc : 0;
        }
        double logits[CLS], m = -INFINITY, sum = 0;
        for (int c = 0; c < CLS; c++) { /* logits = hidden * w2 (w2: HID x CLS) */
            logits[c] = 0;
            for (int j = 0; j < HID; j++)
                logits[c] += y_h[n * HID + j] * w2[j * CLS + c];
            m = fmax(m, logits[c]);
        }
        for (int c = 0; c < CLS; c++)
            sum += exp(logits[c] - m);
        for (int c = 0; c < CLS; c++)
            y_out[n * CLS + c] = exp(logits[c] - m) / sum;
    }
}

int main(void)
{
    /* ---- the application's own OpenCL objects ---- */
    cl_platform_id plat;
    cl_device_id dev;
    cl_uint np = 0;
    if (clGetPlatformIDs(1, &plat, &np) != CL_SUCCESS || np == 0 ||
        clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
        fprintf(stderr, "primitives: no OpenCL device\n");
        return 77;
    }
    cl_int e;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    cl_command_queue q = e == CL_SUCCESS ? clCreateCommandQueue(ctx, dev, 0, &e) : NULL;
    if (e != CL_SUCCESS) {
        fprintf(stderr, "primitives: cannot create a context and queue (%d)\n", e);
        return 1;
    }

    /* ---- host data ---- */
    static float x[N * C * H * W], w[K * C * 9], b[K], w1[HID * F], b1[HID], w2[HID * CLS];
    fill(x, sizeof x / sizeof *x), fill(w, sizeof w / sizeof *w), fill(b, K), fill(w1, sizeof w1 / sizeof *w1);
    fill(b1, HID), fill(w2, sizeof w2 / sizeof *w2);
    cl_mem dx = upload(ctx, x, sizeof x / sizeof *x), dw = upload(ctx, w, sizeof w / sizeof *w), db = upload(ctx, b, K);
    cl_mem dw1 = upload(ctx, w1, sizeof w1 / sizeof *w1), db1 = upload(ctx, b1, HID);
    cl_mem dw2 = upload(ctx, w2, sizeof w2 / sizeof *w2);
    cl_mem dconv = upload(ctx, NULL, N * K * H * W), dpool = upload(ctx, NULL, N * F);
    cl_mem dh = upload(ctx, NULL, N * HID), dlogits = upload(ctx, NULL, N * CLS), dprob = upload(ctx, NULL, N * CLS);

    /* ---- the primitives ---- */
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    clg_prim *h = NULL;
    if (clg_prim_create(q, &pp, &h) != CLG_OK) {
        fprintf(stderr, "primitives: %s\n", clg_last_error(NULL));
        return 1;
    }
    clg_prim_conv_desc cd;
    clg_prim_conv_desc_init(&cd);
    cd.n = N, cd.c = C, cd.h = H, cd.w = W, cd.k = K, cd.r = 3, cd.s = 3, cd.pad_h = 1, cd.pad_w = 1;
    cd.algo = CLG_PRIM_CONV_WINOGRAD;
    clg_prim_pool_desc pd;
    clg_prim_pool_desc_init(&pd); /* 2x2 max, stride 2 */
    pd.n = N, pd.c = K, pd.h = H, pd.w = W;
    clg_prim_gemm_epilogue epi;
    clg_prim_gemm_epilogue_init(&epi);
    epi.bias = db1;
    epi.bias_mode = CLG_PRIM_BIAS_COL;
    epi.relu = 1;

    cl_event ev[5] = {0};
    clg_status st = clg_prim_conv_forward(h, &cd, dx, 0, dw, 0, db, 0, 1, dconv, 0, 0, NULL, &ev[0]);
    if (st == CLG_OK)
        st = clg_prim_pool_forward(h, &pd, dconv, 0, dpool, 0, 1, &ev[0], &ev[1]);
    if (st == CLG_OK) /* hidden (N x HID) = pool (N x F) * w1^T, w1 stored HID x F */
        st = clg_prim_sgemm(h, CLG_PRIM_NO_TRANS, CLG_PRIM_TRANS, N, HID, F, 1.0f, dpool, 0, F, dw1, 0, F, 0.0f, dh, 0,
                            HID, &epi, 1, &ev[1], &ev[2]);
    if (st == CLG_OK) /* logits (N x CLS) = hidden * w2 */
        st = clg_prim_sgemm(h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, N, CLS, HID, 1.0f, dh, 0, HID, dw2, 0, CLS, 0.0f,
                            dlogits, 0, CLS, NULL, 1, &ev[2], &ev[3]);
    if (st == CLG_OK)
        st = clg_prim_softmax_forward(h, N, CLS, dlogits, 0, dprob, 0, 1, &ev[3], &ev[4]);
    if (st != CLG_OK) {
        fprintf(stderr, "primitives: %s\n", clg_prim_last_error(h));
        return 1;
    }
    clWaitForEvents(1, &ev[4]);

    /* ---- check against the host ---- */
    static float g_conv[N * K * H * W], g_pool[N * F], g_h[N * HID], g_prob[N * CLS];
    static double r_conv[N * K * H * W], r_pool[N * F], r_h[N * HID], r_prob[N * CLS];
    clEnqueueReadBuffer(q, dconv, CL_TRUE, 0, sizeof g_conv, g_conv, 0, NULL, NULL);
    clEnqueueReadBuffer(q, dpool, CL_TRUE, 0, sizeof g_pool, g_pool, 0, NULL, NULL);
    clEnqueueReadBuffer(q, dh, CL_TRUE, 0, sizeof g_h, g_h, 0, NULL, NULL);
    clEnqueueReadBuffer(q, dprob, CL_TRUE, 0, sizeof g_prob, g_prob, 0, NULL, NULL);
    host_forward(x, w, b, w1, b1, w2, r_conv, r_pool, r_h, r_prob);
    double d_conv = maxdiff(g_conv, r_conv, N * K * H * W), d_pool = maxdiff(g_pool, r_pool, N * F);
    double d_h = maxdiff(g_h, r_h, N * HID), d_prob = maxdiff(g_prob, r_prob, N * CLS);
    printf("conv+bias+relu (winograd) max |diff| %.2e\n", d_conv);
    printf("max pool 2x2              max |diff| %.2e\n", d_pool);
    printf("dense + bias + relu       max |diff| %.2e\n", d_h);
    printf("dense + softmax           max |diff| %.2e\n", d_prob);
    for (int n = 0; n < N; n++) {
        int best = 0;
        for (int c = 1; c < CLS; c++)
            best = g_prob[n * CLS + c] > g_prob[n * CLS + best] ? c : best;
        printf("image %d: class %d (p = %.3f)\n", n, best, g_prob[n * CLS + best]);
    }
    int ok = d_conv <= 1e-4 && d_pool <= 1e-4 && d_h <= 1e-4 && d_prob <= 1e-4;

    for (int i = 0; i < 5; i++)
        clReleaseEvent(ev[i]);
    clg_prim_destroy(h);
    cl_mem all[] = {dx, dw, db, dw1, db1, dw2, dconv, dpool, dh, dlogits, dprob};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        clReleaseMemObject(all[i]);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("%s\n", ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
