/* clgrad bench attention: the fused attention kernels against the GEMM path
 * (batched GEMMs + masked softmax), forward + backward, through the
 * primitives API (clgrad_prim.h) on one OpenCL device's queue. Causal,
 * N = 8, 4 heads of width 32, T = 128 and 512. Each sample is wall clock
 * around a finished queue; the two algorithms alternate within every round
 * (the order flips each round) so a change in machine load hits both;
 * medians. Also prints how far the two algorithms' outputs and gradients
 * are apart (max |fused - gemm| / (|gemm| + 1e-2)) and fails over 1e-3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct attn_opts {
    cli_common c;
    long rounds, device;
    int quick;
} attn_opts;

static const cli_opt opts[] = {
    CLI_INT_OPT("--rounds", attn_opts, rounds, 1, 1000, "N", "samples per algorithm and case (default 5)"),
    CLI_FLAG_OPT("--quick", attn_opts, quick, 1, "one small case (N 2, T 64), 2 rounds unless --rounds"),
    CLI_INT_OPT("--device", attn_opts, device, 0, 63, "I",
                "OpenCL device index, counting the devices of every platform in order (default 0)"),
    CLI_OPT_JSON,
    CLI_END,
};

const cli_spec cli_spec_bench_attention = {
    .name = "bench attention",
    .synopsis = "[--rounds N] [--quick] [--device I] [--json]",
    .about = "Times causal multi-head attention forward + backward (N 8, 4 heads of width 32,\n"
             "T 128 and 512) with the fused kernels and with the GEMM path through the primitives\n"
             "API, alternating (the order flips every round), and prints the medians, gemm/fused\n"
             "and how far the two algorithms' results are apart (exit 1 over 1e-3).",
    .opts = opts,
};

typedef struct bufs {
    cl_mem qkv, o, saved, g, dqkv;
} bufs;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Opens device `index` (over every platform) with an in-order queue. */
static int open_device(long index, cl_context *ctx, cl_command_queue *q, char *name, size_t len)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS)
        return cli_fail("bench attention: no OpenCL platform");
    long seen = 0;
    for (cl_uint p = 0; p < np; p++) {
        cl_device_id devs[64];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS)
            continue;
        if (index >= seen + (long)nd) {
            seen += nd;
            continue;
        }
        cl_device_id d = devs[index - seen];
        clGetDeviceInfo(d, CL_DEVICE_NAME, len, name, NULL);
        cl_int e;
        *ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
        if (e != CL_SUCCESS)
            return cli_fail("bench attention: clCreateContext failed (%d)", e);
        *q = clCreateCommandQueue(*ctx, d, 0, &e);
        if (e != CL_SUCCESS) {
            clReleaseContext(*ctx);
            return cli_fail("bench attention: clCreateCommandQueue failed (%d)", e);
        }
        return CLI_OK;
    }
    return cli_fail("bench attention: no OpenCL device %ld (%ld found)", index, seen);
}

static cl_mem make_buf(cl_context ctx, size_t n, const float *host)
{
    cl_int e;
    cl_mem m = clCreateBuffer(ctx, host ? CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR : CL_MEM_READ_WRITE,
                              (n ? n : 1) * sizeof(float), (void *)host, &e);
    return e == CL_SUCCESS ? m : NULL;
}

static void free_bufs(bufs *b)
{
    cl_mem *m[] = {&b->qkv, &b->o, &b->saved, &b->g, &b->dqkv};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (*m[i])
            clReleaseMemObject(*m[i]), *m[i] = NULL;
}

/* One forward + backward of d on b (q, k, v and their gradients strided in (N, T, 3C)). */
static clg_status fwd_bwd(clg_prim *h, const clg_prim_attention_desc *d, const bufs *b)
{
    size_t C = (size_t)d->heads * d->head_dim;
    clg_status st = clg_prim_attention_forward(h, d, b->qkv, 0, b->qkv, C, b->qkv, 2 * C, b->o, 0, b->saved, 0, 0,
                                               NULL, NULL);
    if (st == CLG_OK)
        st = clg_prim_attention_backward(h, d, b->qkv, 0, b->qkv, C, b->qkv, 2 * C, b->o, 0, b->saved, 0, b->g, 0,
                                         b->dqkv, 0, b->dqkv, C, b->dqkv, 2 * C, 0, NULL, NULL);
    return st;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-2);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

typedef struct acase {
    int N, T, heads, d;
} acase;

/* Times both algorithms on one case and prints a line. */
static int run_case(clg_prim *h, cl_context ctx, cl_command_queue q, const acase *c, int rounds, int json)
{
    size_t C = (size_t)c->heads * c->d, nseq = (size_t)c->N * c->T * C;
    float *host = malloc(sizeof(float) * 3 * nseq), *res[2][2] = {{NULL}};
    unsigned s = 12345;
    for (size_t i = 0; i < 3 * nseq; i++)
        host[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f * 2.0f - 1.0f;
    clg_prim_attention_desc d[2];
    bufs b[2];
    memset(b, 0, sizeof b);
    int rc = CLI_OK;
    for (int a = 0; a < 2; a++) {
        clg_prim_attention_desc_init(&d[a]);
        d[a].n = c->N, d[a].t = c->T, d[a].heads = c->heads, d[a].head_dim = c->d;
        d[a].ld_q = d[a].ld_k = d[a].ld_v = 3 * C;
        d[a].algo = a ? CLG_PRIM_ATTENTION_GEMM : CLG_PRIM_ATTENTION_FUSED;
        b[a].qkv = make_buf(ctx, 3 * nseq, host), b[a].g = make_buf(ctx, nseq, host);
        b[a].o = make_buf(ctx, nseq, NULL), b[a].dqkv = make_buf(ctx, 3 * nseq, NULL);
        b[a].saved = make_buf(ctx, clg_prim_attention_saved_size(&d[a]), NULL);
        if (!b[a].qkv || !b[a].g || !b[a].o || !b[a].dqkv || !b[a].saved)
            rc = cli_fail("bench attention: out of device memory");
    }
    double *ms = malloc(sizeof(double) * 2 * (rounds + 1));
    /* round 0 warms up (kernel builds) and is not counted */
    for (int r = 0; r <= rounds && rc == CLI_OK; r++)
        for (int k = 0; k < 2 && rc == CLI_OK; k++) {
            int a = (r + k) % 2;
            double t0 = now_ms();
            if (fwd_bwd(h, &d[a], &b[a]) != CLG_OK || clFinish(q) != CL_SUCCESS)
                rc = cli_fail("bench attention: %s", clg_prim_last_error(h));
            ms[a * (rounds + 1) + r] = now_ms() - t0;
        }
    for (int a = 0; a < 2 && rc == CLI_OK; a++) {
        res[a][0] = malloc(sizeof(float) * nseq), res[a][1] = malloc(sizeof(float) * 3 * nseq);
        clEnqueueReadBuffer(q, b[a].o, CL_TRUE, 0, sizeof(float) * nseq, res[a][0], 0, NULL, NULL);
        clEnqueueReadBuffer(q, b[a].dqkv, CL_TRUE, 0, sizeof(float) * 3 * nseq, res[a][1], 0, NULL, NULL);
    }
    if (rc == CLI_OK) {
        double med[2];
        for (int a = 0; a < 2; a++) {
            qsort(ms + a * (rounds + 1) + 1, (size_t)rounds, sizeof(double), cmp_double);
            med[a] = ms[a * (rounds + 1) + 1 + rounds / 2];
        }
        double eo = max_diff(res[0][0], res[1][0], nseq), eg = max_diff(res[0][1], res[1][1], 3 * nseq);
        if (json)
            printf("{\"op\": \"attention\", \"N\": %d, \"T\": %d, \"heads\": %d, \"head_dim\": %d, \"causal\": 1, "
                   "\"fused_ms\": %.3f, \"gemm_ms\": %.3f, \"gemm_over_fused\": %.3f, \"diff_out\": %.3g, "
                   "\"diff_grad\": %.3g}\n",
                   c->N, c->T, c->heads, c->d, med[0], med[1], med[1] / med[0], eo, eg);
        else
            printf("%2d %5d %5d %4d %12.2f %12.2f %10.2fx %10.2g %10.2g\n", c->N, c->T, c->heads, c->d, med[0], med[1],
                   med[1] / med[0], eo, eg);
        fflush(stdout);
        if (!(eo <= 1e-3 && eg <= 1e-3))
            rc = cli_fail("bench attention: the fused and GEMM results differ by %.3g (output) / %.3g (gradients), "
                          "over 1e-3",
                          eo, eg);
    }
    for (int a = 0; a < 2; a++) {
        free_bufs(&b[a]);
        free(res[a][0]), free(res[a][1]);
    }
    free(ms);
    free(host);
    return rc;
}

int bench_attention(int argc, char **argv)
{
    attn_opts o = {.rounds = 0};
    CLI_PARSE(&cli_spec_bench_attention, argc, argv, &o);
    int rounds = (int)(o.rounds ? o.rounds : o.quick ? 2 : 5);
    cl_context ctx = NULL;
    cl_command_queue q = NULL;
    char name[256] = "";
    int rc = open_device(o.device, &ctx, &q, name, sizeof name);
    if (rc != CLI_OK)
        return rc;
    clg_prim *h = NULL;
    if (clg_prim_create(q, NULL, &h) != CLG_OK) {
        rc = cli_fail("bench attention: %s", clg_last_error(NULL));
    } else {
        static const acase cases[] = {{8, 128, 4, 32}, {8, 512, 4, 32}};
        static const acase quick_case = {2, 64, 4, 32};
        if (!o.c.json) {
            printf("device %s; causal, forward + backward; %d rounds, medians (ms per call)\n", name, rounds);
            printf("%2s %5s %5s %4s %12s %12s %11s %10s %10s\n", "N", "T", "heads", "d", "fused", "gemm", "gemm/fused",
                   "diff o", "diff grad");
        }
        int nc = o.quick ? 1 : 2;
        for (int i = 0; i < nc && rc == CLI_OK; i++)
            rc = run_case(h, ctx, q, o.quick ? &quick_case : &cases[i], rounds, o.c.json);
    }
    clg_prim_destroy(h);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return rc;
}
