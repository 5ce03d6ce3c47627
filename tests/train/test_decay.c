/* Weight decay on matrices only ([net] decay_matrices_only = 1, the AdamW
 * recipe of GPT-style models): AdamW, Adam (L2) and SGD steps over the
 * parameter arena (one launch with the decay mask) and per tensor, against
 * a double-precision reference in which only the matrices (convolution and
 * dense weights) decay and vectors (biases, batch-norm scale and shift) do
 * not; the rule for embedding tables; the model-file key. */
#include <math.h>
#include <string.h>

#include "model/optim.h"
#include "testutil.h"

static const char *NET =
    "[net]\n"
    "channels = 2\nheight = 6\nwidth = 6\nclasses = 5\nbatch = 4\n"
    "decay_matrices_only = 1\n"
    "[convolutional]\nname = conv\nfilters = 3\nsize = 3\npad = 1\n"
    "[batchnorm]\nname = bn\n"
    "[dense]\nname = fc\nunits = 5\n"
    "[softmax]\nname = loss\n";

/* One element of the reference update in double; gi already scaled. */
static void ref_update(const clg_hparams *hp, double wd, double gi, double lr, int step, double *w, double *m,
                       double *v)
{
    if (hp->optimizer == CLG_OPT_SGD) {
        gi += wd * *w;
        *m = hp->momentum * *m + gi;
        *w -= lr * *m;
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

/* Which trainable parameters are matrices in NET, by (layer, name). */
static int expect_decay(const clg_param_ref *ref)
{
    return strcmp(ref->param->name, "weight") == 0 && (strcmp(ref->layer->name, "conv") == 0 ||
                                                      strcmp(ref->layer->name, "fc") == 0);
}

static void run_case(clg_ctx *c, int optimizer, int per_tensor, int matrices_only)
{
    clg_err *err = &c->err;
    clg_device *dev = &c->devs[0];
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(err, NET, "decay", 0, &net) == CLG_OK, "%s", err->msg);
    ck_assert_int_eq(net->hp.decay_matrices_only, 1);
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, dev, 5, &r) == CLG_OK, "%s", err->msg);
    clg_hparams hp = net->hp;
    hp.optimizer = optimizer;
    hp.momentum = 0.9;
    hp.beta1 = 0.9;
    hp.beta2 = 0.95;
    hp.weight_decay = 0.5; /* large: a decay on the wrong tensor moves it by ~1e-2 per step, far over the tolerance */
    hp.decay_matrices_only = matrices_only;
    clg_optim *o = NULL;
    ck_assert_msg(clg_optim_create(r, &hp, &o) == CLG_OK, "%s", err->msg);
    ck_assert_msg(o->arena, "no parameter arena");
    o->per_tensor = per_tensor;
    ck_assert_int_eq(o->n, 6); /* conv w b, bn gamma beta, fc w b */
    ck_assert(matrices_only ? o->decay_mask != NULL : o->decay_mask == NULL);
    int n = o->n, ndecay = 0;
    clg_rng rng;
    tu_rng(&rng, 40 + optimizer * 4 + per_tensor * 2 + matrices_only);
    size_t maxn = 0;
    for (int i = 0; i < n; i++)
        maxn = CLG_MAX(maxn, o->refs[i].param->numel);
    float *h = malloc(maxn * sizeof(float));
    double *w[6], *m[6], *v[6];
    for (int i = 0; i < n; i++) {
        size_t N = o->refs[i].param->numel;
        int d = clg_optim_param_decays(&hp, &o->refs[i]);
        ck_assert_msg(d == (matrices_only ? expect_decay(&o->refs[i]) : 1), "%s.%s decays: %d", o->refs[i].layer->name,
                      o->refs[i].param->name, d);
        ndecay += d;
        w[i] = calloc(N, sizeof(double));
        m[i] = calloc(N, sizeof(double));
        v[i] = calloc(N, sizeof(double));
        tu_fill(h, N, -1, 1, &rng); /* fresh weights */
        for (size_t k = 0; k < N; k++)
            w[i][k] = h[k];
        tu_write_full(dev, clg_replica_master(r, &o->refs[i]), h, N);
    }
    ck_assert_int_eq(ndecay, matrices_only ? 2 : 6);
    float gscale = 0.75f;
    for (int step = 1; step <= 3; step++) {
        double lr = 0.02 * step;
        for (int i = 0; i < n; i++) { /* fresh gradients */
            size_t N = o->refs[i].param->numel;
            tu_fill(h, N, -1, 1, &rng);
            tu_write_full(dev, o->refs[i].param->grad, h, N);
            double wd = clg_optim_param_decays(&hp, &o->refs[i]) ? hp.weight_decay : 0;
            for (size_t k = 0; k < N; k++)
                ref_update(&hp, wd, (double)h[k] * gscale, lr, step, &w[i][k], &m[i][k], &v[i][k]);
        }
        long l0 = (long)dev->launches;
        ck_assert_msg(clg_optim_step(o, lr, gscale) == CLG_OK, "%s", err->msg);
        if (!per_tensor)
            ck_assert_int_le((long)dev->launches - l0, 1); /* one launch over the arena, mask and all */
    }
    for (int i = 0; i < n; i++) {
        size_t N = o->refs[i].param->numel;
        tu_poison(h, N);
        tu_download(dev, clg_replica_master(r, &o->refs[i]), h, N);
        double e = tu_max_err(h, w[i], N, 1e-3);
        ck_assert_msg(e < 2e-5, "optimizer %d per_tensor %d: %s.%s max rel err %g", optimizer, per_tensor,
                      o->refs[i].layer->name, o->refs[i].param->name, e);
        free(w[i]);
        free(m[i]);
        free(v[i]);
    }
    free(h);
    clg_optim_free(o);
    clg_replica_free(r);
    clg_net_free(net);
}

START_TEST(decay_masked)
{
    clg_ctx *c = tu_ctx(NULL);
    for (int pt = 0; pt < 2; pt++) {
        run_case(c, CLG_OPT_ADAMW, pt, 1);
        run_case(c, CLG_OPT_ADAM, pt, 1);
        run_case(c, CLG_OPT_SGD, pt, 1);
    }
    run_case(c, CLG_OPT_ADAMW, 0, 0); /* the default: every parameter decays, as before */
    clg_ctx_destroy(c);
}
END_TEST

/* The rule itself: matrices decay unless they are embedding tables; vectors never. */
START_TEST(decay_rule)
{
    clg_hparams hp;
    clg_hparams_defaults(&hp);
    ck_assert_int_eq(hp.decay_matrices_only, 0);
    static const struct {
        const char *type;
        int ndim, want;
    } cases[] = {{"embedding", 2, 0}, {"posembed", 2, 0}, {"dense", 2, 1},     {"dense", 1, 0},
                 {"convolutional", 4, 1}, {"layernorm", 1, 0}, {"attention", 2, 1}, {"attention", 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        clg_layer_ops ops;
        memset(&ops, 0, sizeof ops);
        ops.type = cases[i].type;
        clg_layer l;
        memset(&l, 0, sizeof l);
        l.ops = &ops;
        l.params[0].ndim = cases[i].ndim;
        clg_param_ref ref = {&l, &l.params[0]};
        hp.decay_matrices_only = 0;
        ck_assert_int_eq(clg_optim_param_decays(&hp, &ref), 1);
        hp.decay_matrices_only = 1;
        ck_assert_msg(clg_optim_param_decays(&hp, &ref) == cases[i].want, "%s ndim %d", cases[i].type, cases[i].ndim);
    }
    /* the key: 0 or 1, anything else refused with the line */
    clg_err err = {0};
    clg_net *net = NULL;
    char text[512];
    snprintf(text, sizeof text, "%s", NET);
    char *p = strstr(text, "decay_matrices_only = 1");
    p[strlen("decay_matrices_only = ")] = '2';
    ck_assert_int_ne(clg_net_build(&err, text, "bad.cfg", 0, &net), CLG_OK);
    ck_assert_msg(strstr(err.msg, "bad.cfg:") && strstr(err.msg, "decay_matrices_only"), "%s", err.msg);
    ck_assert_ptr_null(net);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {decay_masked, decay_rule};
    return tu_run_tests("train_decay", 120, tests, 2);
}
