/* Shared by the parallel-training tests (see train_testutil.h). */
#include "train_testutil.h"

#include "parallel/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tt_devices(const char *prog, int need)
{
    clg_ctx *probe = tu_ctx(NULL);
    int ndev = clg_device_count(probe);
    clg_ctx_destroy(probe);
    if (ndev >= need)
        return ndev;
    char list[128] = "";
    for (int i = 0; i < need && strlen(list) + 8 < sizeof list; i++)
        strcat(list, i ? " pthread" : "pthread");
    fprintf(stderr, "%s: needs %d OpenCL devices (POCL_DEVICES=\"%s\")\n", prog, need, list);
    return 0;
}

int tt_two_devices(const char *prog) { return tt_devices(prog, 2) != 0; }

int tt_four_devices(clg_ctx *ctx, const char *what, const char *test)
{
    if (clg_device_count(ctx) >= 4)
        return 1;
    fprintf(stderr, "%s: skipped (needs four devices; test %s has them)\n", what, test);
    return 0;
}

static clg_ctx *g_ctx;

clg_ctx *tt_ctx(int fixed)
{
    if (!g_ctx)
        g_ctx = fixed ? tu_ctx_fixed(0) : tu_ctx(NULL);
    return g_ctx;
}

int tt_run_suite(Suite *s)
{
    int rc = tu_run(s);
    if (g_ctx)
        clg_ctx_destroy(g_ctx);
    g_ctx = NULL;
    return rc;
}

char *tt_read_model(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", CLG_SOURCE_DIR, name);
    char *text = NULL;
    size_t len = 0;
    clg_err err = {0};
    ck_assert_msg(clg_file_read(&err, path, &text, &len) == CLG_OK, "%s", err.msg);
    return text;
}

const char *tt_mlp_text(int adam)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "[net]\nchannels = 1\nheight = 28\nwidth = 28\nclasses = 10\nbatch = 32\n"
             "optimizer = %s\nlearning_rate = 0.02\nmomentum = 0.9\nweight_decay = 0.0005\n"
             "[dense]\nname = fc1\nunits = 256\n[activation]\nname = relu1\ntype = relu\n"
             "[dropout]\nname = drop1\np = 0.25\n"
             "[dense]\nname = fc2\nunits = 256\n[activation]\nname = relu2\ntype = relu\n"
             "[dense]\nname = fc3\nunits = 10\n[softmax]\nname = loss\n",
             adam ? "adam" : "sgd");
    return buf;
}

const char *const tt_cnn_text =
    "[net]\nchannels = 1\nheight = 28\nwidth = 28\nclasses = 10\nbatch = 32\n"
    "optimizer = sgd\nlearning_rate = 0.02\nmomentum = 0.9\nweight_decay = 0.0005\n"
    "[convolutional]\nname = conv1\nfilters = 8\nsize = 3\npad = 1\n[activation]\ntype = relu\n"
    "[maxpool]\nsize = 2\n[dropout]\np = 0.2\n"
    "[convolutional]\nname = conv2\nfilters = 8\nsize = 3\npad = 1\n[activation]\ntype = relu\n"
    "[maxpool]\nsize = 2\n"
    "[convolutional]\nname = conv3\nfilters = 8\nsize = 3\nactivation = relu\n[flatten]\n"
    "[dense]\nname = fc\nunits = 10\n[softmax]\nname = loss\n";

void tt_synth_bands(clg_rng *rng, float *x, int32_t *y, int n, size_t sample)
{
    for (int i = 0; i < n; i++) {
        int k = (int)(clg_rng_u32(rng) % 10);
        y[i] = k;
        for (size_t p = 0; p < sample; p++)
            x[(size_t)i * sample + p] = clg_rng_uniform(rng) + ((p * 10 / sample) == (size_t)k ? 0.5f : 0.0f);
    }
}

void tt_synth_quadrants(clg_rng *rng, float *x, int32_t *y, int n, int c, int h, int w)
{
    for (int i = 0; i < n; i++) {
        int k = (int)(clg_rng_u32(rng) % 4);
        y[i] = k;
        for (int p = 0; p < c * h * w; p++) {
            int yy = (p / w) % h, xx = p % w;
            int q = (yy >= h / 2) * 2 + (xx >= w / 2);
            x[(size_t)i * c * h * w + p] = clg_rng_uniform(rng) + (q == k ? 0.5f : 0.0f);
        }
    }
}

void tt_train(clg_model *m, clg_rng *rng, int steps, int batch, double lr, double *loss, double *scale)
{
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    for (int s = 0; s < steps; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_bands(rng, m->xhost[0], m->yhost[0], batch, sample);
        ck_assert(clg_session_upload(m, 0, batch, 1) == CLG_OK);
        float res[2] = {NAN, NAN};
        ck_assert_msg(clg_session_train_step(m, 0, lr, res) == CLG_OK, "%s", clg_last_error(m->ctx));
        if (loss)
            loss[s] = res[0];
        if (scale)
            scale[s] = m->loss_scale;
    }
    ck_assert(clg_dp_finish(m->dp) == CLG_OK);
}

void tt_weights_free(tt_weights *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->v[i]);
    w->n = 0;
}

float *tt_fetch(clg_device *dev, cl_mem mem, size_t n)
{
    float *h = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(h);
    tu_poison(h, n);
    tu_download(dev, mem, h, n);
    return h;
}

void tt_grab_replica(const clg_replica *r, tt_weights *w)
{
    for (int i = 0; i < r->nlayers; i++)
        for (int p = 0; p < r->layers[i].nparams; p++) {
            clg_param_ref ref = {&r->layers[i], &r->layers[i].params[p]};
            ck_assert(w->n < TT_MAX_TENSORS);
            snprintf(w->name[w->n], sizeof w->name[0], "%s.%s", r->layers[i].name, ref.param->name);
            w->v[w->n] = tt_fetch(r->dev, clg_replica_master(r, &ref), ref.param->numel);
            w->numel[w->n++] = ref.param->numel;
        }
}

void tt_grab_session(clg_model *m, tt_weights *w)
{
    ck_assert_msg(clg_session_pipe_gather(m, 0) == CLG_OK, "%s", clg_last_error(m->ctx));
    tt_grab_replica(clg_session_rep(m), w);
}

int tt_check_lanes(const clg_replica *a, const clg_replica *b, const int *role, int first, int last)
{
    int repl = 0;
    for (int i = first; i <= last; i++)
        for (int k = 0; k < a->layers[i].nparams; k++) {
            const clg_param *qa = &a->layers[i].params[k], *qb = &b->layers[i].params[k];
            int row_bias = role[i] == CLG_TP_ROW && !strcmp(qa->name, "bias");
            if (role[i] != CLG_TP_REPL && !row_bias)
                continue;
            float *ha = tt_fetch(a->dev, qa->value, qa->numel), *hb = tt_fetch(b->dev, qb->value, qb->numel);
            for (size_t e = 0; e < qa->numel; e++) {
                if (row_bias)
                    ck_assert_msg(hb[e] == 0.0f, "%s.bias on device %d: %g (must stay 0)", a->layers[i].name,
                                  b->dev->index, hb[e]);
                else
                    ck_assert_msg(memcmp(&ha[e], &hb[e], sizeof(float)) == 0,
                                  "replicated %s.%s differs between the lanes at %zu: %g vs %g", a->layers[i].name,
                                  qa->name, e, ha[e], hb[e]);
            }
            repl += !row_bias;
            free(ha);
            free(hb);
        }
    return repl;
}

double tt_rel_l2(const float *a, const float *b, size_t n)
{
    double d2 = 0, r2 = 0;
    for (size_t k = 0; k < n; k++) {
        double d = (double)a[k] - b[k];
        d2 += isfinite(d) ? d * d : INFINITY;
        r2 += (double)b[k] * b[k];
    }
    return sqrt(d2) / (sqrt(r2) + 1e-30);
}

double tt_compare(const tt_weights *a, const tt_weights *b, double tol, const char *what)
{
    ck_assert_int_eq(a->n, b->n);
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        ck_assert(a->numel[i] == b->numel[i]);
        if (tol < 0)
            ck_assert_msg(memcmp(a->v[i], b->v[i], a->numel[i] * sizeof(float)) == 0, "%s: %s not bitwise equal",
                          what, a->name[i]);
        double rel = tt_rel_l2(a->v[i], b->v[i], a->numel[i]);
        ck_assert_msg(tol < 0 || rel <= tol, "%s: %s differs by %g (> %g)", what, a->name[i], rel, tol);
        if (!(rel <= worst))
            worst = rel;
    }
    fprintf(stderr, "%s: max relative difference %.3g over %d tensors\n", what, worst, a->n);
    return worst;
}

void tt_refused(clg_ctx *ctx, clg_status st, clg_status want, const char *what, const char *msg)
{
    ck_assert_msg(st == want, "%s: status %d, expected %d (%s)", what, st, want, clg_last_error(ctx));
    ck_assert_msg(strstr(clg_last_error(ctx), msg), "%s: '%s' lacks '%s'", what, clg_last_error(ctx), msg);
    fprintf(stderr, "refused %s: %s\n", what, clg_last_error(ctx));
}

void tt_compare_loss(const double *a, const double *b, int n, double rel, const char *what)
{
    for (int s = 0; s < n; s++)
        ck_assert_msg(fabs(a[s] - b[s]) <= rel * fabs(b[s]) + 1e-5, "%s: step %d loss %g vs %g", what, s, a[s], b[s]);
}
