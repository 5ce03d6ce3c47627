/* Trainer suite: network building (errors with lines, shapes, memory plan),
 * optimizer kernels against double references, gradient summation through
 * a branching network (finite differences), a 200-step training run,
 * bitwise resume, and (case "numerics", CK_RUN_CASE=numerics alone) dense ->
 * batch norm at batch 3 with Adam against double precision. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "testutil.h"
#include "model/optim.h"
#include "train/session.h"

static clg_ctx *g_ctx;

static clg_ctx *ctx(void)
{
    if (!g_ctx)
        g_ctx = tu_ctx("0");
    return g_ctx;
}

static const char *MLP =
    "[net]\n"
    "channels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 32\n"
    "learning_rate = 0.1\nmomentum = 0.9\n"
    "[dense]\nname = fc1\nunits = 32\nactivation = relu\n"
    "[dense]\nname = fc2\nunits = 4\n"
    "[softmax]\nname = loss\n";

// ---- build errors name the line ----

static void expect_build_error(const char *text, const char *needle)
{
    clg_err err = {0};
    clg_net *net = NULL;
    clg_status st = clg_net_build(&err, text, "t.cfg", 0, &net);
    ck_assert_msg(st != CLG_OK, "expected failure containing '%s'", needle);
    ck_assert_ptr_null(net);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
}

START_TEST(build_errors)
{
    /* unknown section: line 5, lists known types */
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[bogus]\nx=1\n", "t.cfg:5: unknown section type [bogus]");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[bogus]\n", "dense");
    /* bad input reference names the line of the key */
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[dense]\nunits=4\n[dense]\nunits=4\ninput=nope\n",
                       "t.cfg:9: layer 'dense1' reads unknown input 'nope'");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[dense]\nunits=4\ninput=-3\n", "t.cfg:7:");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[dense]\nunits=4\ninput=0\n", "not an earlier layer");
    /* missing [net] / input shape */
    expect_build_error("[dense]\nunits=4\n", "t.cfg:1: the first section must be [net]");
    expect_build_error("[net]\nchannels=1\nheight=8\n[dense]\nunits=4\n", "channels, height and width");
    /* shape mismatch: add of 4 and 5 features */
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[dense]\nname=a\nunits=4\n[dense]\nname=b\nunits=5\ninput=data\n"
                       "[add]\ninput=a,b\n",
                       "t.cfg:12:");
    /* duplicate name, unknown key in [net], loss in the middle */
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[dense]\nname=a\nunits=4\n[dense]\nname=a\nunits=4\n",
                       "t.cfg:8: layer name 'a' is already used by line 5");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\nlearning_rat=0.1\n[dense]\nunits=4\n", "learning_rat");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n[softmax]\n[dense]\nunits=4\n", "must be the last layer");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\nclasses=3\n[dense]\nunits=4\n[softmax]\n",
                       "classes = 3");
    expect_build_error("[net]\nchannels=1\nheight=8\nwidth=8\n", "no layers");
}
END_TEST

// ---- shapes and the layer table ----

START_TEST(shape_table)
{
    char *text = NULL;
    size_t len = 0;
    clg_err err = {0};
    ck_assert_int_eq(clg_file_read(&err, CLG_SOURCE_DIR "/models/lenet5.cfg", &text, &len), CLG_OK);
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(&err, text, "lenet5.cfg", 16, &net) == CLG_OK, "%s", err.msg);
    free(text);
    /* expected shapes computed from the architecture: conv5x5 pad2 -> 28, pool -> 14, conv5x5 -> 10, pool -> 5 */
    int exp_c[] = {6, 6, 16, 16, 120, 84, 10, 10}, exp_h[] = {28, 14, 10, 5, 1, 1, 1, 1};
    ck_assert_int_eq(net->nlayers, 8);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(net->proto[i].out_shape[0], 16);
        ck_assert_int_eq(net->proto[i].out_shape[1], exp_c[i]);
        ck_assert_int_eq(net->proto[i].out_shape[2], exp_h[i]);
        ck_assert_int_eq(net->proto[i].out_shape[3], exp_h[i]);
    }
    uint64_t params = (6 * 25 + 6) + (16 * 6 * 25 + 16) + (120 * 400 + 120) + (84 * 120 + 84) + (10 * 84 + 10);
    ck_assert_uint_eq(net->nparams, params);
    ck_assert_int_eq(net->classes, 10);
    /* the table names every layer and the totals */
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    clg_net_print(net, f);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "conv2"));
    ck_assert_ptr_nonnull(strstr(buf, "16x10x10"));
    ck_assert_ptr_nonnull(strstr(buf, "61.7k trainable parameters"));
    free(buf);
    clg_net_free(net);

    /* every shipped model builds */
    const char *models[] = {"vgg-s.cfg", "resnet-mini.cfg"};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/models/%s", CLG_SOURCE_DIR, models[i]);
        ck_assert_msg(clg_net_load(&err, path, 0, &net) == CLG_OK, "%s: %s", path, err.msg);
        ck_assert_int_eq(net->classes, 10);
        ck_assert(net->loss_index == net->nlayers - 1);
        clg_net_free(net);
    }
}
END_TEST

// ---- memory plan: tensors sharing a buffer never live at the same time ----

typedef struct live_buf {
    cl_mem mem;
    size_t bytes;
    int start, end;
    char what[48];
} live_buf;

/* Buffers (or sub-buffers of one arena) whose bytes overlap must never be live at the same time. */
static void check_sharing(const live_buf *b, int n)
{
    cl_mem *parent = calloc((size_t)n, sizeof *parent);
    size_t *off = calloc((size_t)n, sizeof *off), *sz = calloc((size_t)n, sizeof *sz);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(b[i].mem != NULL, "%s has no buffer", b[i].what);
        ck_assert_int_eq(clGetMemObjectInfo(b[i].mem, CL_MEM_SIZE, sizeof sz[i], &sz[i], NULL), CL_SUCCESS);
        ck_assert_int_eq(clGetMemObjectInfo(b[i].mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent[i], &parent[i], NULL),
                         CL_SUCCESS);
        ck_assert_int_eq(clGetMemObjectInfo(b[i].mem, CL_MEM_OFFSET, sizeof off[i], &off[i], NULL), CL_SUCCESS);
        if (!parent[i])
            parent[i] = b[i].mem;
        ck_assert_msg(sz[i] >= b[i].bytes, "%s: %zu bytes in a %zu-byte buffer", b[i].what, b[i].bytes, sz[i]);
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (parent[i] == parent[j] && off[i] < off[j] + b[j].bytes && off[j] < off[i] + b[i].bytes)
                ck_assert_msg(b[i].end < b[j].start || b[j].end < b[i].start,
                              "%s [%d,%d] and %s [%d,%d] share memory while both live", b[i].what, b[i].start,
                              b[i].end, b[j].what, b[j].start, b[j].end);
    free(parent);
    free(off);
    free(sz);
}

START_TEST(memory_plan)
{
    clg_ctx *c = ctx();
    char path[512];
    snprintf(path, sizeof path, "%s/models/resnet-mini.cfg", CLG_SOURCE_DIR);
    clg_net *net = NULL;
    ck_assert_msg(clg_net_load(&c->err, path, 4, &net) == CLG_OK, "%s", c->err.msg);
    for (int fp16 = 0; fp16 < 2; fp16++) {
        net->fp16 = fp16;
        clg_replica *r = NULL;
        ck_assert_msg(clg_replica_create(net, &c->devs[0], 1, &r) == CLG_OK, "%s", c->err.msg);
        int L = r->nlayers;
        ck_assert(r->planned_bytes < r->naive_bytes);
        ck_assert(r->nslots > 0);
        int *last = malloc(sizeof(int) * L);
        for (int i = 0; i < L; i++)
            last[i] = -1;
        for (int j = 0; j < L; j++)
            for (int k = 0; k < r->layers[j].nin; k++)
                if (r->layers[j].inputs[k] >= 0 && j > last[r->layers[j].inputs[k]])
                    last[r->layers[j].inputs[k]] = j;
        live_buf *b = calloc((size_t)L * (5 + 3 * CLG_MAX_INPUTS), sizeof *b);
        int n = 0;
        if (!fp16) {
            /* steps: forward i = i, backward i = 2L-1-i; an output lives until its backward, its gradient
             * from its last consumer's backward to its own backward */
            for (int i = 0; i < L; i++) {
                size_t bytes = clg_tensor_numel(&r->act[i]) * sizeof(float);
                if (r->layers[i].fused_into) { /* the fusion pass: its output is the batch norm's */
                    const clg_tensor *into = &r->act[r->layers[i].fused_into - 1];
                    ck_assert(r->act[i].mem == into->mem && r->act[i].off == into->off);
                    continue;
                }
                b[n++] = (live_buf){r->act[i].mem, bytes, i, 2 * L - 1 - i, ""};
                snprintf(b[n - 1].what, sizeof b[n - 1].what, "act %d", i);
                if (last[i] >= 0 && !r->layers[i].is_loss) {
                    b[n++] = (live_buf){r->dact[i].mem, bytes, 2 * L - 1 - last[i], 2 * L - 1 - i, ""};
                    snprintf(b[n - 1].what, sizeof b[n - 1].what, "dact %d", i);
                }
            }
        } else {
            /* three sub-steps per step (expand half -> fp32, compute, store fp32 -> half) */
#define F(i, p) (3 * (i) + (p))
#define B(i, p) (3 * L + 3 * (L - 1 - (i)) + (p))
#define ADD(m, by, s, e, ...)                                                      \
    do {                                                                           \
        b[n] = (live_buf){(m), (by), (s), (e), ""};                                \
        snprintf(b[n].what, sizeof b[n].what, __VA_ARGS__);                        \
        n++;                                                                       \
    } while (0)
            ck_assert(r->fp16);
            for (int i = 0; i < L; i++) {
                size_t numel = clg_tensor_numel(&r->act[i]);
                const struct clg_layer_work *w = &r->work[i];
                /* chains: layer i+1 reads layer i's fp32 output directly; a gradient whose only use is
                 * layer i+1 goes from its b_din straight to layer i in fp32 */
                int next_reads = 0, uses = 0;
                for (int j = i + 1; j < L; j++)
                    for (int k = 0; k < r->layers[j].nin; k++)
                        if (r->layers[j].inputs[k] == i) {
                            uses++;
                            next_reads |= j == i + 1;
                        }
                int has_grad = last[i] >= 0 && !r->layers[i].is_loss;
                ck_assert_int_eq(w->fchain, i != L - 1 && next_reads);
                ck_assert_int_eq(w->bchain, has_grad && uses == 1 && last[i] == i + 1);
                if (i == L - 1)
                    ADD(r->act[i].mem, numel * 4, F(i, 1), B(i, 1), "act %d (fp32)", i);
                else {
                    ADD(r->act[i].mem, numel * 2, F(i, 2), B(i, 0), "act %d (half)", i);
                    ADD(w->f_out, numel * 4, F(i, 1), w->fchain ? F(i + 1, 1) : F(i, 2), "fwd out %d", i);
                    ADD(w->b_out, numel * 4, B(i, 0), B(i, 1), "bwd out %d", i);
                }
                if (has_grad && !w->bchain) {
                    ADD(r->dact[i].mem, numel * 2, B(last[i], 2), B(i, 0), "dact %d (half)", i);
                    ADD(w->b_dout, numel * 4, B(i, 0), B(i, 1), "bwd dout %d", i);
                }
                for (int k = 0; k < r->layers[i].nin; k++) {
                    int src = r->layers[i].inputs[k];
                    if (src < 0)
                        continue;
                    size_t by = clg_tensor_numel(&r->act[src]) * 4;
                    if (!(src == i - 1 && r->work[src].fchain))
                        ADD(w->f_in[k], by, F(i, 0), F(i, 1), "fwd in %d.%d", i, k);
                    ADD(w->b_in[k], by, B(i, 0), B(i, 1), "bwd in %d.%d", i, k);
                    ADD(w->b_din[k], by, B(i, 1), r->work[src].bchain ? B(src, 1) : B(i, 2), "bwd din %d.%d", i, k);
                }
            }
#undef F
#undef B
#undef ADD
            fprintf(stderr,
                    "resnet-mini batch 4: fp32 plan %.0f KiB (%.0f KiB with the arena planner), fp16 plan %.0f KiB\n",
                    r->fp32_bytes / 1024.0, r->fp32_offset_bytes / 1024.0, r->planned_bytes / 1024.0);
            /* stated target for this residual net: fp16 storage plans at most 85% of the fp32 bytes */
            ck_assert_msg(r->planned_bytes < 0.85 * r->fp32_bytes, "fp16 plan %llu vs fp32 %llu bytes",
                          (unsigned long long)r->planned_bytes, (unsigned long long)r->fp32_bytes);
        }
        check_sharing(b, n);
        free(b);
        free(last);
        clg_replica_free(r); /* not attached to net: freed separately, first */
    }
    clg_net_free(net);
}
END_TEST

// ---- optimizer kernels against double references ----

/* The update rules in double precision: one element, gradient gi (already
 * scaled), weight w, state m (momentum / first moment) and v. */
static void ref_update(const clg_hparams *hp, double gi, double lr, int step, double *w, double *m, double *v)
{
    double wd = hp->weight_decay;
    if (hp->optimizer == CLG_OPT_SGD) {
        gi += wd * *w;
        if (hp->momentum != 0) {
            *m = hp->momentum * *m + gi;
            gi = hp->nesterov ? gi + hp->momentum * *m : *m;
        }
        *w -= lr * gi;
        return;
    }
    if (hp->optimizer == CLG_OPT_ADAMW)
        *w -= lr * wd * *w;
    else
        gi += wd * *w;
    *m = hp->beta1 * *m + (1 - hp->beta1) * gi;
    *v = hp->beta2 * *v + (1 - hp->beta2) * gi * gi;
    double mh = *m / (1 - pow(hp->beta1, step)), vh = *v / (1 - pow(hp->beta2, step));
    *w -= lr * mh / (sqrt(vh) + hp->epsilon);
}

static void run_optim_case(int optimizer, double momentum, int nesterov, double wd)
{
    clg_ctx *c = ctx();
    clg_err *err = &c->err;
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(err, MLP, "mlp", 8, &net) == CLG_OK, "%s", err->msg);
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, &c->devs[0], 3, &r) == CLG_OK, "%s", err->msg);
    clg_hparams hp = net->hp;
    hp.optimizer = optimizer;
    hp.momentum = momentum;
    hp.nesterov = nesterov;
    hp.weight_decay = wd;
    hp.learning_rate = 0.05;
    clg_optim *o = NULL;
    ck_assert_msg(clg_optim_create(r, &hp, &o) == CLG_OK, "%s", err->msg);
    clg_rng rng;
    tu_rng(&rng, 100 + optimizer * 10 + nesterov);
    int n = o->n;
    double **w = calloc(n, sizeof *w), **m = calloc(n, sizeof *m), **v = calloc(n, sizeof *v);
    float *hostf = NULL;
    for (int i = 0; i < n; i++) {
        size_t N = o->refs[i].param->numel;
        w[i] = calloc(N, sizeof(double));
        m[i] = calloc(N, sizeof(double));
        v[i] = calloc(N, sizeof(double));
        hostf = realloc(hostf, N * sizeof(float));
        tu_download(&c->devs[0], o->refs[i].param->value, hostf, N);
        for (size_t k = 0; k < N; k++)
            w[i][k] = hostf[k];
    }
    float gscale = 0.75f;
    for (int step = 1; step <= 4; step++) {
        /* fresh random gradients */
        float **g = calloc(n, sizeof *g);
        for (int i = 0; i < n; i++) {
            size_t N = o->refs[i].param->numel;
            g[i] = malloc(N * sizeof(float));
            tu_fill(g[i], N, -1, 1, &rng);
            ck_assert_int_eq(clEnqueueWriteBuffer(c->devs[0].queue, o->refs[i].param->grad, CL_TRUE, 0,
                                                  N * sizeof(float), g[i], 0, NULL, NULL),
                             CL_SUCCESS);
        }
        double lr = 0.05 * step;
        ck_assert_msg(clg_optim_step(o, lr, gscale) == CLG_OK, "%s", err->msg);
        for (int i = 0; i < n; i++) {
            size_t N = o->refs[i].param->numel;
            for (size_t k = 0; k < N; k++)
                ref_update(&hp, (double)g[i][k] * gscale, lr, step, &w[i][k], &m[i][k], &v[i][k]);
            free(g[i]);
        }
        free(g);
    }
    for (int i = 0; i < n; i++) {
        size_t N = o->refs[i].param->numel;
        hostf = realloc(hostf, N * sizeof(float));
        tu_poison(hostf, N);
        tu_download(&c->devs[0], o->refs[i].param->value, hostf, N);
        double e = tu_max_err(hostf, w[i], N, 1e-3);
        ck_assert_msg(e < 1e-4, "optimizer %d param %d: max rel err %g", optimizer, i, e);
        free(w[i]);
        free(m[i]);
        free(v[i]);
    }
    free(hostf);
    free(w);
    free(m);
    free(v);
    clg_optim_free(o);
    clg_replica_free(r);
    clg_net_free(net);
}

START_TEST(optim_sgd)
{
    run_optim_case(CLG_OPT_SGD, 0.0, 0, 0.0);
    run_optim_case(CLG_OPT_SGD, 0.9, 0, 1e-3);
    run_optim_case(CLG_OPT_SGD, 0.9, 1, 5e-4);
}
END_TEST

START_TEST(optim_adam)
{
    run_optim_case(CLG_OPT_ADAM, 0, 0, 1e-3);
    run_optim_case(CLG_OPT_ADAMW, 0, 0, 1e-2);
}
END_TEST

// ---- the one-launch optimizer over the parameter arena against the per-tensor path ----

static const char *ARENA_NET =
    "[net]\n"
    "channels = 1\nheight = 8\nwidth = 8\nclasses = 5\nbatch = 8\n"
    "[dense]\nname = fc1\nunits = 37\nactivation = relu\n"
    "[batchnorm]\nname = bn\n"
    "[dense]\nname = fc2\nunits = 5\n"
    "[softmax]\nname = loss\n";

/* Trainable parameter i's authoritative value (the fp32 master in fp16 mode), poisoned first. */
static void read_value(clg_replica *r, const clg_param_ref *ref, float *h)
{
    tu_poison(h, ref->param->numel);
    tu_download(r->dev, clg_replica_master(r, ref), h, ref->param->numel);
}

/* Every float of buf outside the parameters' regions of r's arena layout is 0. */
static void check_padding(clg_replica *r, cl_mem buf, const clg_param_ref *refs, int n, const char *what)
{
    size_t nf = r->arena_bytes / sizeof(float);
    float *h = malloc(nf * sizeof(float));
    char *used = calloc(nf, 1);
    tu_poison(h, nf);
    tu_download(r->dev, buf, h, nf);
    for (int i = 0; i < n; i++)
        memset(used + r->arena_off[i] / sizeof(float), 1, refs[i].param->numel);
    size_t pad = 0;
    for (size_t k = 0; k < nf; k++)
        if (!used[k]) {
            ck_assert_msg(h[k] == 0.0f, "%s arena padding float %zu is %g", what, k, h[k]);
            pad++;
        }
    ck_assert_msg(pad > 0, "the arena has no padding to check (%s)", what);
    free(h);
    free(used);
}

/* f rounded to the nearest binary16 value (ties to even), in double: for
 * finite |f| below 65504; subnormal halves below 2^-14. */
static double round_half(float f)
{
    double a = fabs((double)f);
    if (a == 0)
        return f;
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int E = CLG_MAX(e - 1, -14);
    return copysign(ldexp(nearbyint(ldexp(a, 10 - E)), E - 10), (double)f);
}

static void run_arena_case(int optimizer, double momentum, int nesterov, double wd, int fp16)
{
    clg_ctx *c = ctx();
    clg_err *err = &c->err;
    clg_device *dev = &c->devs[0];
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(err, ARENA_NET, "arena", 8, &net) == CLG_OK, "%s", err->msg);
    net->fp16 = fp16;
    clg_replica *ra = NULL, *rb = NULL;
    ck_assert_msg(clg_replica_create(net, dev, 3, &ra) == CLG_OK, "%s", err->msg);
    ck_assert_msg(clg_replica_create(net, dev, 3, &rb) == CLG_OK, "%s", err->msg);
    clg_hparams hp = net->hp;
    hp.optimizer = optimizer;
    hp.momentum = momentum;
    hp.nesterov = nesterov;
    hp.weight_decay = wd;
    clg_optim *oa = NULL, *ob = NULL;
    ck_assert_msg(clg_optim_create(ra, &hp, &oa) == CLG_OK, "%s", err->msg);
    ck_assert_msg(clg_optim_create(rb, &hp, &ob) == CLG_OK, "%s", err->msg);
    ck_assert_msg(oa->arena && !oa->per_tensor, "the optimizer does not run over the parameter arena");
    ob->per_tensor = 1; /* the reference path: one launch per tensor (sub-buffers of the same arenas) */
    ck_assert_int_eq(oa->n, 6); /* fc1 w b, bn gamma beta, fc2 w b: running statistics stay out */
    clg_rng rng;
    tu_rng(&rng, 300 + optimizer * 10 + nesterov + 5 * fp16);
    int n = oa->n;
    size_t maxn = 0;
    for (int i = 0; i < n; i++)
        maxn = CLG_MAX(maxn, oa->refs[i].param->numel);
    float *h = malloc(maxn * sizeof(float)), *hb = malloc(maxn * sizeof(float));
    double **w = calloc((size_t)CLG_MAX(n, 1), sizeof *w), **m = calloc((size_t)CLG_MAX(n, 1), sizeof *m), **v = calloc((size_t)CLG_MAX(n, 1), sizeof *v);
    /* fresh random weights, the same in both replicas */
    for (int i = 0; i < n; i++) {
        size_t N = oa->refs[i].param->numel;
        w[i] = calloc(N, sizeof(double));
        m[i] = calloc(N, sizeof(double));
        v[i] = calloc(N, sizeof(double));
        tu_fill(h, N, -1, 1, &rng);
        for (size_t k = 0; k < N; k++)
            w[i][k] = h[k];
        tu_write_full(dev, clg_replica_master(ra, &oa->refs[i]), h, N);
        tu_write_full(dev, clg_replica_master(rb, &ob->refs[i]), h, N);
    }
    float gscale = 0.625f;
    for (int step = 1; step <= 3; step++) {
        double lr = 0.03 * step;
        for (int i = 0; i < n; i++) {
            size_t N = oa->refs[i].param->numel;
            tu_fill(h, N, -1, 1, &rng);
            tu_write_full(dev, oa->refs[i].param->grad, h, N);
            tu_write_full(dev, ob->refs[i].param->grad, h, N);
            for (size_t k = 0; k < N; k++)
                ref_update(&hp, (double)h[k] * gscale, lr, step, &w[i][k], &m[i][k], &v[i][k]);
        }
        long l0 = (long)dev->launches;
        ck_assert_msg(clg_optim_step(oa, lr, gscale) == CLG_OK, "%s", err->msg);
        long la = (long)dev->launches - l0;
        ck_assert_msg(clg_optim_step(ob, lr, gscale) == CLG_OK, "%s", err->msg);
        long lb = (long)dev->launches - l0 - la;
        /* one update launch against one per tensor (fp16: both plus one launch for the half copies) */
        ck_assert_msg(lb - la == n - 1, "arena step %ld launches, per-tensor %ld (%d tensors)", la, lb, n);
    }
    for (int i = 0; i < n; i++) {
        size_t N = oa->refs[i].param->numel;
        read_value(ra, &oa->refs[i], h);
        read_value(rb, &ob->refs[i], hb);
        double *bd = malloc(N * sizeof(double));
        for (size_t k = 0; k < N; k++)
            bd[k] = hb[k];
        double e_ab = tu_max_err(h, bd, N, 1e-6), e_ref = tu_max_err(h, w[i], N, 1e-3);
        ck_assert_msg(e_ab <= 1e-6, "optimizer %d fp16 %d param %d: arena vs per-tensor rel err %g", optimizer, fp16,
                      i, e_ab);
        ck_assert_msg(e_ref < 1e-4, "optimizer %d fp16 %d param %d: vs double reference rel err %g", optimizer, fp16,
                      i, e_ref);
        free(bd);
        free(w[i]);
        free(m[i]);
        free(v[i]);
    }
    if (fp16) { /* the layers' fp32 views: the new masters rounded to half, by one launch over the arena */
        ck_assert_ptr_nonnull(ra->varena);
        for (int i = 0; i < n; i++) {
            size_t N = oa->refs[i].param->numel;
            read_value(ra, &oa->refs[i], h);
            tu_poison(hb, N);
            tu_download(dev, oa->refs[i].param->value, hb, N);
            for (size_t k = 0; k < N; k++)
                ck_assert_msg((double)hb[k] == round_half(h[k]), "param %d [%zu]: view %.9g, master %.9g -> %.9g", i,
                              k, hb[k], h[k], round_half(h[k]));
        }
        check_padding(ra, ra->varena, oa->refs, n, "fp32 view");
    }
    check_padding(ra, ra->parena, oa->refs, n, "parameter");
    check_padding(ra, ra->garena, oa->refs, n, "gradient");
    if (oa->marena)
        check_padding(ra, oa->marena, oa->refs, n, "first state");
    if (oa->varena)
        check_padding(ra, oa->varena, oa->refs, n, "second state");

    /* global norm and the fp16 unscale/overflow check: one launch each, the per-tensor results */
    double ref = 0;
    for (int i = 0; i < n; i++) {
        size_t N = oa->refs[i].param->numel;
        tu_fill(h, N, -2, 2, &rng);
        for (size_t k = 0; k < N; k++)
            ref += (double)h[k] * h[k];
        tu_write_full(dev, oa->refs[i].param->grad, h, N);
        tu_write_full(dev, ob->refs[i].param->grad, h, N);
    }
    double na = -1, nb = -1;
    long l0 = (long)dev->launches;
    ck_assert_msg(clg_optim_grad_norm(oa, 0.5f, &na) == CLG_OK, "%s", err->msg);
    ck_assert_int_eq((long)dev->launches - l0, 1);
    ck_assert_msg(clg_optim_grad_norm(ob, 0.5f, &nb) == CLG_OK, "%s", err->msg);
    ck_assert_msg(fabs(na - 0.5 * sqrt(ref)) <= 1e-5 * sqrt(ref), "arena norm %.9g vs %.9g", na, 0.5 * sqrt(ref));
    ck_assert_msg(fabs(nb - 0.5 * sqrt(ref)) <= 1e-5 * sqrt(ref), "per-tensor norm %.9g vs %.9g", nb, 0.5 * sqrt(ref));
    for (int pass = 0; pass < 2; pass++) { /* pass 1: an inf in the last gradient */
        if (pass == 1) {
            float inf = INFINITY;
            clg_param *pl = oa->refs[n - 1].param;
            ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, pl->grad, CL_TRUE, (pl->numel - 1) * sizeof(float),
                                                  sizeof inf, &inf, 0, NULL, NULL),
                             CL_SUCCESS);
        }
        int ova = -1, ovb = -1;
        l0 = (long)dev->launches;
        ck_assert_msg(clg_optim_unscale_check(oa, 0.5f, &ova) == CLG_OK, "%s", err->msg);
        ck_assert_msg((long)dev->launches - l0 <= 2, "unscale check: %ld launches", (long)dev->launches - l0); /* flag fill + 1 */
        ck_assert_msg(clg_optim_unscale_check(ob, 0.5f, &ovb) == CLG_OK, "%s", err->msg);
        ck_assert_int_eq(ova, pass);
        ck_assert_int_eq(ovb, 0);
    }
    for (int i = 0; i < n - 1; i++) { /* g * 0.25 exactly, in both */
        size_t N = oa->refs[i].param->numel;
        tu_poison(h, N);
        tu_poison(hb, N);
        tu_download(dev, oa->refs[i].param->grad, h, N);
        tu_download(dev, ob->refs[i].param->grad, hb, N);
        ck_assert_msg(memcmp(h, hb, N * sizeof(float)) == 0, "unscaled gradient %d differs", i);
    }
    check_padding(ra, ra->garena, oa->refs, n, "unscaled gradient");
    free(h);
    free(hb);
    free(w);
    free(m);
    free(v);
    clg_optim_free(oa);
    clg_optim_free(ob);
    clg_replica_free(ra);
    clg_replica_free(rb);
    clg_net_free(net);
}

START_TEST(optim_arena)
{
    run_arena_case(CLG_OPT_SGD, 0.0, 0, 0.0, 0);
    run_arena_case(CLG_OPT_SGD, 0.9, 0, 1e-3, 0);
    run_arena_case(CLG_OPT_SGD, 0.9, 1, 5e-4, 0);
    run_arena_case(CLG_OPT_ADAM, 0, 0, 1e-3, 0);
    run_arena_case(CLG_OPT_ADAMW, 0, 0, 1e-2, 0);
    run_arena_case(CLG_OPT_SGD, 0.9, 1, 5e-4, 1); /* fp16: the master copies are the arena */
    run_arena_case(CLG_OPT_ADAMW, 0, 0, 1e-2, 1);
}
END_TEST

// ---- dense -> batch norm at tiny batch with Adam, against a double-precision reference ----

/* The network of bn_adam_batch3 in double: x (N x F) -> dense (U units, W1
 * U x F, bias b1) -> batch norm (gamma, beta, eps) -> dense (C classes, W2
 * C x U, b2) -> softmax cross-entropy, mean over the batch. p[0..5] = W1,
 * b1, gamma, beta, W2, b2; writes the gradients into g[0..5]. Two-pass
 * statistics, the textbook backward. With f32 set, the same in float
 * arithmetic the way PyTorch's CPU kernels do it (every operation rounded
 * to float; batch-norm sums accumulated in double; the forward as
 * x * (invstd * gamma) + (beta - mean * invstd * gamma)): what float32 can
 * be expected to reach, the scale of the test's tolerance. */
typedef struct {
    int N, F, U, C, f32;
    double eps;
} bnref_shape;

static size_t bnref_size(const bnref_shape *s, int k)
{
    return k == 0 ? (size_t)s->U * s->F : k == 4 ? (size_t)s->C * s->U : k == 5 ? (size_t)s->C : (size_t)s->U;
}

static void bnref_grad(const bnref_shape *s, const float *x, const int32_t *y, double *const *p, double *const *g)
{
#define R(e) (s->f32 ? (double)(float)(e) : (e))
    int N = s->N, F = s->F, U = s->U, C = s->C;
    size_t nu = (size_t)N * U;
    double *h = calloc(nu, sizeof(double)), *xh = calloc(nu, sizeof(double)), *z = calloc(nu, sizeof(double));
    double *dz = calloc(nu, sizeof(double)), *is = calloc((size_t)U, sizeof(double));
    double *mu = calloc((size_t)U, sizeof(double)), *o = calloc((size_t)C, sizeof(double));
    for (int k = 0; k < 6; k++)
        memset(g[k], 0, bnref_size(s, k) * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int u = 0; u < U; u++) {
            double a = 0;
            for (int f = 0; f < F; f++)
                a = R(a + R((double)x[n * F + f] * p[0][u * F + f]));
            h[n * U + u] = R(a + p[1][u]);
        }
    for (int u = 0; u < U; u++) {
        double m = 0, var = 0;
        for (int n = 0; n < N; n++)
            m += h[n * U + u];
        m /= N;
        for (int n = 0; n < N; n++)
            var += (h[n * U + u] - m) * (h[n * U + u] - m);
        mu[u] = R(m);
        is[u] = R(1 / sqrt(var / N + s->eps));
        double al = R(is[u] * p[2][u]), be = R(p[3][u] - R(mu[u] * al));
        for (int n = 0; n < N; n++) {
            xh[n * U + u] = (h[n * U + u] - m) / sqrt(var / N + s->eps);
            z[n * U + u] = s->f32 ? R(R(h[n * U + u] * al) + be) : p[2][u] * xh[n * U + u] + p[3][u];
        }
    }
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, se = 0;
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int u = 0; u < U; u++)
                a = R(a + R(z[n * U + u] * p[4][c * U + u]));
            o[c] = R(a + p[5][c]);
            mx = fmax(mx, o[c]);
        }
        for (int c = 0; c < C; c++)
            se = R(se + R(exp(R(o[c] - mx))));
        for (int c = 0; c < C; c++) {
            double d = R(R(R(R(exp(R(o[c] - mx))) / se) - (c == y[n])) / N);
            g[5][c] = R(g[5][c] + d);
            for (int u = 0; u < U; u++) {
                g[4][c * U + u] = R(g[4][c * U + u] + R(d * z[n * U + u]));
                dz[n * U + u] = R(dz[n * U + u] + R(d * p[4][c * U + u]));
            }
        }
    }
    for (int u = 0; u < U; u++) {
        double sb = 0, sg = 0; /* sg: sum dz * (h - mean) */
        for (int n = 0; n < N; n++) {
            sb += dz[n * U + u];
            sg += dz[n * U + u] * (s->f32 ? h[n * U + u] - mu[u] : xh[n * U + u] / is[u]);
        }
        g[3][u] = R(sb);
        double k = sg * is[u] * is[u] / N, gm = sb / N;
        g[2][u] = R(sg * is[u]);
        for (int n = 0; n < N; n++) {
            double dh = s->f32 ? R(R(R(R(dz[n * U + u] - R(gm)) - R(R(h[n * U + u] - mu[u]) * R(k))) * is[u]) * p[2][u])
                               : p[2][u] * is[u] * (dz[n * U + u] - gm - xh[n * U + u] * sg * is[u] / N);
            g[1][u] = R(g[1][u] + dh);
            for (int f = 0; f < F; f++)
                g[0][u * F + f] = R(g[0][u * F + f] + R(dh * x[n * F + f]));
        }
    }
    free(h);
    free(xh);
    free(z);
    free(dz);
    free(is);
    free(mu);
    free(o);
#undef R
}

/* ref_update's Adam(W) the way PyTorch 1.13's float32 Adam rounds it. */
static void adam_f32(const clg_hparams *hp, double gi, double lr, int step, double *w, double *m, double *v)
{
#define R(e) ((double)(float)(e))
    double wd = hp->weight_decay;
    if (hp->optimizer == CLG_OPT_ADAMW)
        *w = R(*w * R(1 - lr * wd));
    else
        gi = R(gi + R(wd * *w));
    *m = R(R(*m * R(hp->beta1)) + R(gi * R(1 - hp->beta1)));
    *v = R(R(*v * R(hp->beta2)) + R(R(gi * gi) * R(1 - hp->beta2)));
    double step_size = R(lr / (1 - pow(hp->beta1, step))), bc2s = R(sqrt(1 - pow(hp->beta2, step)));
    double denom = R(R(R(sqrt(*v)) / bc2s) + R(hp->epsilon));
    *w = R(*w - R(step_size * R(*m / denom)));
#undef R
}

/* `steps` Adam(W) steps at batch N (a fresh batch each, inputs offset by
 * xoff: a mean far from zero against the spread) of the network above on
 * the device, in double and in PyTorch's float32 rounding. Asserts every
 * step's gradients and, after the last step, the weight deltas against the
 * double reference: each error relative to the tensor's largest gradient or
 * delta, within gtol / wtol or within 4 times the float32 model's own error
 * where a batch is ill-conditioned (a channel with a tiny spread). fc1's bias is the
 * exception: batch norm removes any shift of its input, so its gradient is
 * zero analytically and round-off in any precision (PyTorch's float32
 * too); Adam turns it into a step of up to about lr where the double
 * reference barely moves. Its gradient must stay round-off small and its
 * step bounded. *worst (2 doubles): the largest gradient and weight error
 * relative to tol's scale, the float32 model's. */
static void bn_adam_case(int optimizer, int N, int steps, double xoff, double gtol, double wtol, uint64_t stream,
                         double *worst)
{
    clg_ctx *c = ctx();
    clg_err *err = &c->err;
    clg_device *dev = &c->devs[0];
    bnref_shape s = {.N = N, .F = 6, .U = 5, .C = 3, .eps = 1e-5}, s32 = s;
    s32.f32 = 1;
    char text[512];
    snprintf(text, sizeof text,
             "[net]\nchannels = 1\nheight = 2\nwidth = 3\nclasses = 3\nbatch = %d\n"
             "[dense]\nname = fc1\nunits = 5\n"
             "[batchnorm]\nname = bn\n"
             "[dense]\nname = fc2\nunits = 3\n"
             "[softmax]\nname = loss\n",
             N);
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(err, text, "bnadam", 0, &net) == CLG_OK, "%s", err->msg);
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, dev, tu_seed(), &r) == CLG_OK, "%s", err->msg);
    clg_hparams hp = net->hp;
    hp.optimizer = optimizer;
    hp.weight_decay = optimizer == CLG_OPT_ADAMW ? 1e-2 : 0;
    clg_optim *o = NULL;
    ck_assert_msg(clg_optim_create(r, &hp, &o) == CLG_OK, "%s", err->msg);
    ck_assert_int_eq(o->n, 6); /* fc1 w b, bn gamma beta, fc2 w b */
    /* [0]: double, [1]: float32 model */
    double *p[2][6], *g[2][6], *m[2][6], *v[2][6], *p0[6];
    float *h = malloc(64 * sizeof(float)), *x = malloc((size_t)N * s.F * sizeof(float));
    int32_t *y = malloc((size_t)N * sizeof(int32_t));
    clg_rng rng;
    tu_rng(&rng, stream);
    /* random values for every parameter, gamma in [0.5, 2.5]: no gradient is special but fc1's bias */
    for (int k = 0; k < 6; k++) {
        size_t n = bnref_size(&s, k);
        ck_assert_uint_eq(o->refs[k].param->numel, n);
        p0[k] = calloc(n, sizeof(double));
        for (int j = 0; j < 2; j++) {
            p[j][k] = calloc(n, sizeof(double));
            g[j][k] = calloc(n, sizeof(double));
            m[j][k] = calloc(n, sizeof(double));
            v[j][k] = calloc(n, sizeof(double));
        }
        tu_fill(h, n, k == 2 ? 0.5f : -1.0f, k == 2 ? 2.5f : 1.0f, &rng);
        tu_write_full(dev, clg_replica_master(r, &o->refs[k]), h, n);
        for (size_t e = 0; e < n; e++)
            p[0][k][e] = p[1][k][e] = p0[k][e] = h[e];
    }
    ck_assert(clg_replica_weights_updated(r) == CLG_OK);
    cl_mem xb = NULL, yb = NULL;
    ck_assert(clg_buf_alloc(dev, (size_t)N * s.F * sizeof(float), &xb) == CLG_OK);
    ck_assert(clg_buf_alloc(dev, (size_t)N * sizeof(int32_t), &yb) == CLG_OK);
    const double lr = 1e-2;
    worst[0] = worst[1] = 0;
    for (int step = 1; step <= steps; step++) {
        tu_fill(x, (size_t)N * s.F, -2, 2, &rng);
        for (int e = 0; e < N * s.F; e++)
            x[e] += (float)xoff;
        for (int n = 0; n < N; n++)
            y[n] = (int32_t)(clg_rng_u32(&rng) % 3);
        tu_write_full(dev, xb, x, (size_t)N * s.F);
        ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, yb, CL_TRUE, 0, (size_t)N * sizeof(int32_t), y, 0, NULL,
                                              NULL),
                         CL_SUCCESS);
        clg_replica_set_input(r, xb, 0);
        clg_replica_set_labels(r, yb, 0, 1.0f / (float)N); /* PyTorch's mean reduction */
        ck_assert_msg(clg_replica_forward(r, N, 1) == CLG_OK, "%s", err->msg);
        ck_assert_msg(clg_replica_backward(r, N) == CLG_OK, "%s", err->msg);
        bnref_grad(&s, x, y, p[0], g[0]);
        bnref_grad(&s32, x, y, p[1], g[1]);
        double g0max = 0; /* fc1's weight gradient: the scale of fc1's bias gradient's round-off */
        for (size_t e = 0; e < bnref_size(&s, 0); e++)
            g0max = fmax(g0max, fabs(g[0][0][e]));
        for (int k = 0; k < 6; k++) {
            size_t n = bnref_size(&s, k);
            tu_poison(h, n);
            tu_download(dev, o->refs[k].param->grad, h, n);
            double gmax = k == 1 ? g0max : 0, gerr = 0, gerr32 = 0;
            for (size_t e = 0; e < n; e++) {
                gmax = fmax(gmax, fabs(g[0][k][e]));
                gerr = isfinite(h[e]) ? fmax(gerr, fabs(h[e] - g[0][k][e])) : INFINITY;
                gerr32 = fmax(gerr32, fabs(g[1][k][e] - g[0][k][e]));
            }
            double lim = fmax(gtol * gmax, 4 * gerr32);
            worst[0] = fmax(worst[0], gerr / lim);
            ck_assert_msg(gerr <= lim,
                          "opt %d batch %d step %d tensor %d: gradient error %.3g of %.3g (float32 model %.3g)",
                          optimizer, N, step, k, gerr / gmax, gmax, gerr32 / gmax);
        }
        ck_assert_msg(clg_optim_step(o, lr, 1.0f) == CLG_OK, "%s", err->msg);
        for (int k = 0; k < 6; k++)
            for (size_t e = 0; e < bnref_size(&s, k); e++) {
                ref_update(&hp, g[0][k][e], lr, step, &p[0][k][e], &m[0][k][e], &v[0][k][e]);
                adam_f32(&hp, g[1][k][e], lr, step, &p[1][k][e], &m[1][k][e], &v[1][k][e]);
            }
    }
    for (int k = 0; k < 6; k++) {
        size_t n = bnref_size(&s, k);
        read_value(r, &o->refs[k], h);
        double dmax = 0, werr = 0, dgot = 0, werr32 = 0;
        for (size_t e = 0; e < n; e++) {
            dmax = fmax(dmax, fabs(p[0][k][e] - p0[k][e]));
            dgot = isfinite(h[e]) ? fmax(dgot, fabs(h[e] - p0[k][e])) : INFINITY;
            werr = isfinite(h[e]) ? fmax(werr, fabs(h[e] - p[0][k][e])) : INFINITY;
            werr32 = fmax(werr32, fabs(p[1][k][e] - p[0][k][e]));
        }
        if (k == 1) { /* round-off driven: bounded by Adam's largest step */
            ck_assert_msg(dgot <= 1.5 * lr * steps, "opt %d batch %d: fc1 bias moved %.3g", optimizer, N, dgot);
            continue;
        }
        ck_assert_msg(dmax > 0, "opt %d batch %d tensor %d did not move", optimizer, N, k);
        double lim = fmax(wtol * dmax, 4 * werr32);
        worst[1] = fmax(worst[1], werr / lim);
        ck_assert_msg(werr <= lim,
                      "opt %d batch %d tensor %d after %d steps: weight delta error %.3g (float32 model %.3g)",
                      optimizer, N, k, steps, werr / dmax, werr32 / dmax);
    }
    for (int k = 0; k < 6; k++) {
        free(p0[k]);
        for (int j = 0; j < 2; j++) {
            free(p[j][k]);
            free(g[j][k]);
            free(m[j][k]);
            free(v[j][k]);
        }
    }
    free(h);
    free(x);
    free(y);
    clg_buf_release(dev, xb);
    clg_buf_release(dev, yb);
    clg_optim_free(o);
    clg_replica_free(r);
    clg_net_free(net);
}

/* Issue 26 item 9: batch 3, two Adam and AdamW steps, inputs around 0 and
 * around 24 (a channel mean far from zero against its spread), within
 * PyTorch's float32 agreement: 2e-4 on the weight deltas, 5e-5 on the
 * gradients, or 4 times the float32 model's error where that is larger (an
 * ill-conditioned batch). It fails for a one-pass variance without the
 * shift (gradient error 1e-4 and more) and for Adam's epsilon inside the
 * square root. BN_ADAM_SWEEP=1 also runs batches 3-13, 1-3 steps. */
START_TEST(bn_adam_batch3)
{
    double w[2];
    for (int opt = CLG_OPT_ADAM; opt <= CLG_OPT_ADAMW; opt++)
        for (int xoff = 0; xoff <= 24; xoff += 24) {
            bn_adam_case(opt, 3, 2, xoff, 5e-5, 2e-4, 900 + 10 * opt + xoff, w);
            fprintf(stderr, "bn_adam_batch3: opt %d offset %d: gradient %.3g, weights %.3g of the tolerance\n", opt,
                    xoff, w[0], w[1]);
        }
    if (getenv("BN_ADAM_SWEEP"))
        for (int opt = CLG_OPT_ADAM; opt <= CLG_OPT_ADAMW; opt++)
            for (int N = 3; N <= 13; N++)
                for (int steps = 1; steps <= 3; steps++) {
                    bn_adam_case(opt, N, steps, 8, 2e-5, 2e-4, 1000 + N, w);
                    fprintf(stderr, "sweep opt %d batch %d steps %d: %.3g %.3g\n", opt, N, steps, w[0], w[1]);
                }
}
END_TEST

START_TEST(grad_norm_and_schedules)
{
    clg_ctx *c = ctx();
    clg_err *err = &c->err;
    clg_net *net = NULL;
    ck_assert(clg_net_build(err, MLP, "mlp", 8, &net) == CLG_OK);
    clg_replica *r = NULL;
    ck_assert(clg_replica_create(net, &c->devs[0], 3, &r) == CLG_OK);
    clg_optim *o = NULL;
    ck_assert(clg_optim_create(r, &net->hp, &o) == CLG_OK);
    clg_rng rng;
    tu_rng(&rng, 7);
    double ref = 0;
    for (int i = 0; i < o->n; i++) {
        size_t N = o->refs[i].param->numel;
        float *g = malloc(N * sizeof(float));
        tu_fill(g, N, -2, 2, &rng);
        for (size_t k = 0; k < N; k++)
            ref += (double)g[k] * g[k];
        clEnqueueWriteBuffer(c->devs[0].queue, o->refs[i].param->grad, CL_TRUE, 0, N * sizeof(float), g, 0, NULL,
                             NULL);
        free(g);
    }
    double norm = -1;
    ck_assert(clg_optim_grad_norm(o, 0.5f, &norm) == CLG_OK);
    ck_assert_msg(fabs(norm - 0.5 * sqrt(ref)) < 1e-4 * sqrt(ref), "norm %g vs %g", norm, 0.5 * sqrt(ref));
    clg_optim_free(o);
    clg_replica_free(r);
    clg_net_free(net);

    /* schedules, against closed forms */
    clg_hparams h;
    clg_hparams_defaults(&h);
    h.learning_rate = 0.2;
    h.schedule = CLG_SCHED_STEP;
    h.step_size = 2;
    h.gamma = 0.5;
    ck_assert(fabs(clg_sched_lr(&h, 0, 10, 100) - 0.2) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 19, 10, 100) - 0.2) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 20, 10, 100) - 0.1) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 45, 10, 100) - 0.05) < 1e-12);
    h.schedule = CLG_SCHED_COSINE;
    h.warmup = 10;
    ck_assert(fabs(clg_sched_lr(&h, 0, 10, 110) - 0.2 * 1 / 10.0) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 4, 10, 110) - 0.2 * 5 / 10.0) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 10, 10, 110) - 0.2) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 60, 10, 110) - 0.1) < 1e-12);
    ck_assert(fabs(clg_sched_lr(&h, 110, 10, 110)) < 1e-12);
}
END_TEST

// ---- gradients through a branching network (sums at fan-out) ----

static const char *BRANCH =
    "[net]\nchannels = 1\nheight = 2\nwidth = 3\nclasses = 3\nbatch = 4\n"
    "[dense]\nname = h\nunits = 5\nactivation = tanh\n"
    "[dense]\nname = a\nunits = 5\nactivation = tanh\ninput = h\n"
    "[dense]\nname = b\nunits = 5\ninput = h\n"
    "[add]\nname = s\ninput = a, b, h\n"
    "[dense]\nname = out\nunits = 3\n"
    "[softmax]\nname = loss\n";

static double net_loss(clg_replica *r, int n)
{
    ck_assert(clg_replica_forward(r, n, 1) == CLG_OK);
    float res[2];
    clEnqueueReadBuffer(r->dev->queue, r->layers[r->loss_index].loss.result, CL_TRUE, 0, sizeof res, res, 0, NULL,
                        NULL);
    return res[0];
}

START_TEST(branch_gradients)
{
    clg_ctx *c = ctx();
    clg_err *err = &c->err;
    clg_device *dev = &c->devs[0];
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(err, BRANCH, "branch", 0, &net) == CLG_OK, "%s", err->msg);
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, dev, tu_seed(), &r) == CLG_OK, "%s", err->msg);
    int n = 4;
    clg_rng rng;
    tu_rng(&rng, 11);
    float x[24];
    tu_fill(x, 24, -1, 1, &rng);
    int32_t y[4];
    for (int i = 0; i < 4; i++)
        y[i] = (int32_t)(clg_rng_u32(&rng) % 3);
    cl_mem xb = tu_upload(dev, x, 24), yb = NULL;
    ck_assert(clg_buf_alloc(dev, sizeof y, &yb) == CLG_OK);
    clEnqueueWriteBuffer(dev->queue, yb, CL_TRUE, 0, sizeof y, y, 0, NULL, NULL);
    clg_replica_set_input(r, xb, 0);
    clg_replica_set_labels(r, yb, 0, 1.0f); /* gradient of the loss sum */
    net_loss(r, n);
    ck_assert_msg(clg_replica_backward(r, n) == CLG_OK, "%s", err->msg);
    /* finite differences on the weights of h (whose output feeds three layers) */
    clg_param *p = &r->layers[0].params[0];
    size_t N = p->numel;
    float *w = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    tu_poison(g, N);
    tu_download(dev, p->grad, g, N);
    tu_download(dev, p->value, w, N);
    double *num = malloc(N * sizeof(double));
    const float hstep = 1e-2f;
    for (size_t k = 0; k < N; k++) {
        float keep = w[k];
        w[k] = keep + hstep;
        clEnqueueWriteBuffer(dev->queue, p->value, CL_TRUE, 0, N * sizeof(float), w, 0, NULL, NULL);
        double lp = net_loss(r, n);
        w[k] = keep - hstep;
        clEnqueueWriteBuffer(dev->queue, p->value, CL_TRUE, 0, N * sizeof(float), w, 0, NULL, NULL);
        double lm = net_loss(r, n);
        w[k] = keep;
        num[k] = (lp - lm) / (2.0 * hstep);
    }
    double e = tu_max_err(g, num, N, 5e-2);
    ck_assert_msg(e < 3e-2, "branch gradient max rel err %g", e);
    free(w);
    free(g);
    free(num);
    clg_buf_release(dev, xb);
    clg_buf_release(dev, yb);
    clg_replica_free(r);
    clg_net_free(net);
}
END_TEST

// ---- a 200-step training run through the public API ----

/* 8x8 images: class k has a bright quadrant k on noise. */
static void synth(clg_rng *rng, float *x, int32_t *y, int n)
{
    for (int i = 0; i < n; i++) {
        int k = (int)(clg_rng_u32(rng) % 4);
        y[i] = k;
        for (int p = 0; p < 64; p++) {
            int q = (p / 8 >= 4) * 2 + (p % 8 >= 4);
            x[i * 64 + p] = 0.3f * clg_rng_uniform(rng) + (q == k ? 0.6f : 0.0f);
        }
    }
}

START_TEST(train_200_steps)
{
    clg_ctx *c = ctx();
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.seed = tu_seed();
    clg_model *m = NULL;
    ck_assert_msg(clg_model_create_string(c, MLP, "mlp", &mp, &m) == CLG_OK, "%s", clg_last_error(c));
    clg_rng rng;
    tu_rng(&rng, 200);
    float x[32 * 64];
    int32_t y[32];
    double first = 0, last20 = 0;
    for (int s = 0; s < 200; s++) {
        synth(&rng, x, y, 32);
        ck_assert_msg(clg_model_train_step(m, x, y, 32) == CLG_OK, "%s", clg_last_error(c));
        clg_metrics mt;
        ck_assert(clg_model_metrics(m, &mt) == CLG_OK);
        ck_assert(isfinite(mt.loss));
        if (s == 0)
            first = mt.loss;
        if (s >= 180)
            last20 += mt.loss / 20;
        ck_assert_int_eq(mt.step, s + 1);
    }
    /* stated target: mean loss of the last 20 steps below 0.1 (chance is ln 4 = 1.39) */
    ck_assert_msg(last20 < 0.1, "loss did not fall: first %.4f, last-20 mean %.4f", first, last20);
    /* held-out accuracy with predict */
    float probs[32 * 4];
    synth(&rng, x, y, 32);
    ck_assert(clg_model_predict(m, x, 32, probs) == CLG_OK);
    int correct = 0;
    for (int i = 0; i < 32; i++) {
        int best = 0;
        double sum = 0;
        for (int k = 0; k < 4; k++) {
            sum += probs[i * 4 + k];
            if (probs[i * 4 + k] > probs[i * 4 + best])
                best = k;
        }
        ck_assert(fabs(sum - 1) < 1e-4);
        correct += best == y[i];
    }
    ck_assert_msg(correct >= 30, "held-out accuracy %d/32", correct);
    clg_model_destroy(m);
}
END_TEST

// ---- resume: N steps == k + (N - k) steps, bitwise ----

static char g_dir[256];

static void write_dataset(const char *dir, int n, uint64_t seed) /* dir: < 512 chars */
{
    clg_rng rng;
    clg_rng_seed(&rng, seed, 5);
    float *x = malloc((size_t)n * 64 * sizeof(float));
    int32_t *y = malloc((size_t)n * sizeof(int32_t));
    synth(&rng, x, y, n);
    uint8_t *img = malloc((size_t)n * 64), *lab = malloc((size_t)n);
    for (int i = 0; i < n * 64; i++)
        img[i] = (uint8_t)(x[i] * 255);
    for (int i = 0; i < n; i++)
        lab[i] = (uint8_t)y[i];
    char p[600];
    clg_err err = {0};
    int dims[3] = {n, 8, 8};
    const char *split[2] = {"train", "t10k"};
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, split[s]);
        ck_assert_msg(clg_idx_write_u8(&err, p, 0, dims, 3, img) == CLG_OK, "%s", err.msg);
        snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, split[s]);
        ck_assert_msg(clg_idx_write_u8(&err, p, 0, dims, 1, lab) == CLG_OK, "%s", err.msg);
    }
    free(x);
    free(y);
    free(img);
    free(lab);
}

static void compare_weights(const char *a, const char *b)
{
    clg_err err = {0};
    clg_ckpt *ca = NULL, *cb = NULL;
    ck_assert_msg(clg_ckpt_load(&err, a, &ca) == CLG_OK, "%s", err.msg);
    ck_assert_msg(clg_ckpt_load(&err, b, &cb) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(ca->nt, cb->nt);
    ck_assert_int_gt(ca->nt, 0);
    for (int i = 0; i < ca->nt; i++) {
        const clg_ckpt_tensor *tb = clg_ckpt_find(cb, ca->t[i].name);
        ck_assert_ptr_nonnull(tb);
        ck_assert_uint_eq(ca->t[i].nbytes, tb->nbytes);
        ck_assert_msg(memcmp(ca->t[i].data, tb->data, tb->nbytes) == 0, "tensor %s differs", ca->t[i].name);
    }
    clg_ckpt_free(ca);
    clg_ckpt_free(cb);
}

static void resume_case(const char *optimizer, const char *schedule, const char *precision)
{
    clg_ctx *c = ctx();
    char model[512], full[512], part[512], wa[512], wb[512], dsdir[512];
    snprintf(dsdir, sizeof dsdir, "%s/data", g_dir);
    snprintf(model, sizeof model, "%s/mlp.cfg", g_dir);
    snprintf(full, sizeof full, "%s/full-%s-%s", g_dir, optimizer, precision);
    snprintf(part, sizeof part, "%s/part-%s-%s", g_dir, optimizer, precision);
    snprintf(wa, sizeof wa, "%s/a-%s-%s.safetensors", g_dir, optimizer, precision);
    snprintf(wb, sizeof wb, "%s/b-%s-%s.safetensors", g_dir, optimizer, precision);
    clg_train_params p;
    clg_train_params_init(&p);
    p.precision = precision;
    p.model = model;
    p.data = dsdir;
    p.epochs = 3;
    p.optimizer = optimizer;
    p.schedule = schedule;
    p.learning_rate = strcmp(optimizer, "sgd") == 0 ? 0.05 : 0.005;
    p.weight_decay = 1e-3;
    p.seed = tu_seed();
    p.limit_test = 64;
    p.max_steps = 17; /* 200 samples / batch 32 = 7 steps per epoch (last one partial) */
    if (strcmp(optimizer, "adamw") == 0)
        p.augment = "flip,shift:2"; /* augmentation choices are reproduced on resume too */
    p.checkpoint_dir = full;
    p.save_weights = wa;
    clg_train_report rep;
    ck_assert_msg(clg_train_run(c, &p, &rep) == CLG_OK, "%s", clg_last_error(c));
    ck_assert_int_eq(rep.steps, 17);
    /* k = 9 steps, then resume for the rest */
    p.checkpoint_dir = part;
    p.save_weights = NULL;
    p.max_steps = 9;
    ck_assert_msg(clg_train_run(c, &p, &rep) == CLG_OK, "%s", clg_last_error(c));
    ck_assert_int_eq(rep.steps, 9);
    p.resume = 1;
    p.max_steps = 17;
    p.save_weights = wb;
    ck_assert_msg(clg_train_run(c, &p, &rep) == CLG_OK, "%s", clg_last_error(c));
    ck_assert_int_eq(rep.steps, 17);
    compare_weights(wa, wb);
    /* the optimizer state in the checkpoints agrees too */
    char ca[600], cb[600];
    snprintf(ca, sizeof ca, "%s/last.safetensors", full);
    snprintf(cb, sizeof cb, "%s/last.safetensors", part);
    compare_weights(ca, cb);
    if (strcmp(precision, "fp16") == 0) { /* the loss-scaling state went through the checkpoint */
        clg_err err = {0};
        clg_ckpt *ka = NULL, *kb = NULL;
        ck_assert(clg_ckpt_load(&err, ca, &ka) == CLG_OK && clg_ckpt_load(&err, cb, &kb) == CLG_OK);
        const char *keys[] = {"fp16.loss_scale", "fp16.good_steps", "fp16.skipped", "precision"};
        for (int i = 0; i < 4; i++) {
            ck_assert_ptr_nonnull(clg_ckpt_get_meta(ka, keys[i]));
            ck_assert_ptr_nonnull(clg_ckpt_get_meta(kb, keys[i]));
            ck_assert_str_eq(clg_ckpt_get_meta(ka, keys[i]), clg_ckpt_get_meta(kb, keys[i]));
        }
        double ls = 0;
        ck_assert(clg_ckpt_get_meta_f64(&err, ka, "fp16.loss_scale", &ls) == CLG_OK);
        fprintf(stderr, "fp16 resume (%s): loss scale %g after 17 steps (interval 4)\n", optimizer, ls);
        ck_assert_msg(ls > CLG_LS_INIT, "the loss scale never grew (%g)", ls);
        clg_ckpt_free(ka);
        clg_ckpt_free(kb);
    }
}

START_TEST(resume_exact)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/clgrad-train-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    char p[512];
    snprintf(p, sizeof p, "%s/data", g_dir);
    clg_err err = {0};
    ck_assert(clg_mkdirs(&err, p) == CLG_OK);
    write_dataset(p, 200, tu_seed());
    snprintf(p, sizeof p, "%s/mlp.cfg", g_dir);
    FILE *f = fopen(p, "w");
    fputs(MLP, f);
    fclose(f);
    resume_case("sgd", "cosine", "fp32");
    resume_case("adamw", "step", "fp32");
    /* fp16: master weights, optimizer state, loss scale and its counter are restored exactly */
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "fp16_scale_interval", "4"), CLG_OK); /* S changes within the 17 steps */
    resume_case("sgd", "cosine", "fp16");
    resume_case("adam", "none", "fp16");
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "fp16_scale_interval", "0"), CLG_OK);
    /* a checkpoint of another model is rejected with a clear message */
    clg_ctx *c = ctx();
    clg_model *m = NULL;
    const char *other = "[net]\nchannels=1\nheight=8\nwidth=8\nclasses=4\n[dense]\nname=fc1\nunits=16\n"
                        "[dense]\nname=fc2\nunits=4\n[softmax]\n";
    ck_assert_msg(clg_model_create_string(c, other, "other", NULL, &m) == CLG_OK, "%s", clg_last_error(c));
    snprintf(p, sizeof p, "%s/a-sgd-fp32.safetensors", g_dir);
    ck_assert(clg_model_load_weights(m, p) != CLG_OK);
    ck_assert_msg(strstr(clg_last_error(c), "fc1.weight") != NULL, "%s", clg_last_error(c));
    clg_model_destroy(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, build_errors);
    tcase_add_test(tc, shape_table);
    tcase_add_test(tc, memory_plan);
    tcase_add_test(tc, optim_sgd);
    tcase_add_test(tc, optim_adam);
    tcase_add_test(tc, optim_arena);
    tcase_add_test(tc, grad_norm_and_schedules);
    tcase_add_test(tc, branch_gradients);
    tcase_add_test(tc, train_200_steps);
    tcase_add_test(tc, resume_exact);
    suite_add_tcase(s, tc);
    TCase *tn = tcase_create("numerics"); /* CK_RUN_CASE=numerics runs it alone */
    tcase_set_timeout(tn, 60);
    tcase_add_test(tn, bn_adam_batch3);
    suite_add_tcase(s, tn);
    int rc = tu_run(s);
    clg_ctx_destroy(g_ctx);
    return rc;
}
