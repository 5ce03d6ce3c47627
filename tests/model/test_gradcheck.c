/* Finite-difference gradient checks on tiny shapes. The scalar is
 * L = sum(out * r) with a fresh random r (for loss layers L = the loss sum),
 * computed in double on the host from fp32 device forwards. Every element of
 * every input and every trainable parameter is perturbed by +-eps (eps =
 * 1e-2, central differences) and compared with the analytic gradient from
 * backward (dout = r):  |num - ana| <= 1e-2 * |ana| + 3e-3.
 * Kinks are kept out of reach: relu/leaky inputs satisfy |x| >= 0.1, max-pool
 * inputs are distinct multiples of 0.05 (so +-eps never reorders them);
 * dense/conv use smooth activations here (their relu path is covered by the
 * double references in test_layers). */
#include "layer_harness.h"
#include "ops/nn.h"

#define EPS 1e-2f
#define RTOL 1e-2
#define ATOL_FD 3e-3

static double scalar_loss(lh_case *c, const float *r, int training)
{
    lh_forward(c, training);
    if (c->l.is_loss) {
        float res[2];
        tu_download(c->dev, c->l.loss.result, res, 2);
        return res[0];
    }
    double L = 0;
    for (size_t i = 0; i < c->ny; i++)
        L += (double)c->y[i] * r[i];
    return L;
}

/* Perturbs host value v (uploaded via upload()) and compares. */
static void check_var(lh_case *c, const char *what, float *v, size_t n, const float *ana, const float *r,
                      void (*upload)(lh_case *, int), int which)
{
    double worst = -INFINITY;
    size_t worst_i = 0;
    double worst_num = 0;
    for (size_t i = 0; i < n; i++) {
        float orig = v[i];
        v[i] = orig + EPS;
        upload(c, which);
        double lp = scalar_loss(c, r, 1);
        v[i] = orig - EPS;
        upload(c, which);
        double lm = scalar_loss(c, r, 1);
        v[i] = orig;
        double num = (lp - lm) / (2.0 * (double)EPS);
        double excess = fabs(num - ana[i]) - (RTOL * fabs(ana[i]) + ATOL_FD);
        if (isnan(excess) || excess > worst) {
            worst = isnan(excess) ? INFINITY : excess;
            worst_i = i;
            worst_num = num;
        }
    }
    upload(c, which);
    ck_assert_msg(worst <= 0, "%s[%zu]: finite difference %.6g vs analytic %.6g", what, worst_i, worst_num,
                  (double)ana[worst_i]);
}

static void up_input(lh_case *c, int k)
{
    ck_assert_int_eq(clEnqueueWriteBuffer(c->dev->queue, c->xm[k], CL_TRUE, 0, c->nx[k] * sizeof(float), c->x[k], 0,
                                          NULL, NULL),
                     CL_SUCCESS);
}

static void up_param(lh_case *c, int j)
{
    ck_assert_int_eq(clg_layer_param_upload(c->dev, &c->l.params[j], c->p[j]), CLG_OK);
    if (c->l.ops->params_changed)
        c->l.ops->params_changed(&c->l);
}

/* Runs the whole check for an already made case (inputs/params set). */
static void gradcheck(lh_case *c, uint64_t stream)
{
    clg_rng rr;
    tu_rng(&rr, stream);
    float *r = lh_alloc(c->ny);
    tu_fill(r, c->ny, -1, 1, &rr);
    c->l.loss.grad_scale = 1.0f;
    scalar_loss(c, r, 1);
    lh_backward(c, r, 0);
    /* copy analytic results: lh_backward buffers are reused below */
    for (int k = 0; k < c->nin; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s d(input %d)", c->l.ops->type, k);
        float *ana = lh_alloc(c->nx[k]);
        memcpy(ana, c->dx[k], c->nx[k] * sizeof(float));
        check_var(c, what, c->x[k], c->nx[k], ana, r, up_input, k);
        free(ana);
    }
    for (int j = 0; j < c->l.nparams; j++) {
        if (!c->l.params[j].trainable)
            continue;
        char what[64];
        snprintf(what, sizeof what, "%s d(%s)", c->l.ops->type, c->l.params[j].name);
        float *ana = lh_alloc(c->l.params[j].numel);
        memcpy(ana, c->g[j], c->l.params[j].numel * sizeof(float));
        check_var(c, what, c->p[j], c->l.params[j].numel, ana, r, up_param, j);
        free(ana);
    }
    free(r);
}

/* Randomises every trainable param (so bias/gamma/beta are not trivial). */
static void random_params(lh_case *c, uint64_t stream)
{
    clg_rng r;
    tu_rng(&r, stream);
    for (int j = 0; j < c->l.nparams; j++)
        if (c->l.params[j].trainable)
            tu_fill(c->p[j], c->l.params[j].numel, -0.8f, 0.8f, &r);
    lh_set_params(c);
}

static void away_from_zero(lh_case *c)
{
    for (int k = 0; k < c->nin; k++)
        for (size_t i = 0; i < c->nx[k]; i++)
            if (fabsf(c->x[k][i]) < 0.1f)
                c->x[k][i] = c->x[k][i] < 0 ? c->x[k][i] - 0.1f : c->x[k][i] + 0.1f;
    lh_reupload(c);
}

START_TEST(fd_activation)
{
    static const char *const types[] = {"relu", "leaky", "sigmoid", "tanh", "gelu", "gelu_tanh"};
    lh_case c;
    lh_ctx(&c, NULL);
    char keys[64];
    snprintf(keys, sizeof keys, "type=%s alpha=0.2", types[_i]);
    const int shp[1][4] = {{2, 3, 2, 3}};
    lh_make(&c, "activation", keys, 1, shp, 2, -2, 2, 2000 + (uint64_t)_i);
    away_from_zero(&c);
    gradcheck(&c, 2100);
    lh_free(&c);
}
END_TEST

START_TEST(fd_dense)
{
    static const char *const keys[] = {"units=5 activation=gelu", "units=4 activation=tanh bias=0",
                                       "units=3 activation=sigmoid"};
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{3, 2, 2, 2}};
    lh_make(&c, "dense", keys[_i], 1, shp, 3, -1, 1, 2200 + (uint64_t)_i);
    random_params(&c, 2201);
    gradcheck(&c, 2202);
    lh_free(&c);
}
END_TEST

START_TEST(fd_conv)
{
    static const char *const keys[] = {
        "filters=3 size=3 pad=1 activation=tanh",
        "filters=4 size=3 stride=2 pad=1 groups=2 activation=gelu",
        "filters=2 size_h=2 size_w=3 dilation=2 activation=sigmoid",
        "filters=3 size=3 pad=1 algo=winograd",
    };
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{2, 2, 5, 5}};
    lh_make(&c, "conv", keys[_i], 1, shp, 2, -1, 1, 2300 + (uint64_t)_i);
    random_params(&c, 2301);
    gradcheck(&c, 2302);
    lh_free(&c);
}
END_TEST

START_TEST(fd_pool)
{
    static const char *const types[] = {"maxpool", "maxpool", "avgpool", "avgpool", "maxpool"};
    static const char *const keys[] = {"size=2", "size=3 stride=2 pad=1", "size=2", "size=3 stride=2 pad=1",
                                       "size=2"};
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[2][4] = {{2, 2, 5, 6}, {2, 2, 4, 8}}; /* the last case: the float4 2x2 kernels */
    lh_make(&c, types[_i], keys[_i], 1, &shp[_i == 4], 2, -1, 1, 2400 + (uint64_t)_i);
    if (_i < 2 || _i == 4) { /* distinct values 0.05 apart, random order */
        clg_rng r;
        tu_rng(&r, 2401);
        size_t n = c.nx[0];
        for (size_t i = 0; i < n; i++)
            c.x[0][i] = 0.05f * (float)i - 1.0f;
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = clg_rng_u32(&r) % (i + 1);
            float t = c.x[0][i];
            c.x[0][i] = c.x[0][j];
            c.x[0][j] = t;
        }
        lh_reupload(&c);
    }
    gradcheck(&c, 2402);
    lh_free(&c);
}
END_TEST

START_TEST(fd_gap_flatten_dropout)
{
    static const char *const types[] = {"gap", "flatten", "dropout"};
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{2, 3, 3, 2}};
    lh_make(&c, types[_i], _i == 2 ? "p=0.4" : "", 1, shp, 2, -1, 1, 2500 + (uint64_t)_i);
    clg_layer_set_rng(&c.l, 1234, 7, 0);
    gradcheck(&c, 2501);
    lh_free(&c);
}
END_TEST

START_TEST(fd_batchnorm)
{
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[3][4] = {{3, 2, 2, 3}, {5, 3, 1, 1}, {2, 2, 2, 4}}; /* scalar, 1-D, float8 partial sums */
    lh_make(&c, "batchnorm", "", 1, &shp[_i], shp[_i][0], -1, 2, 2600 + (uint64_t)_i);
    random_params(&c, 2601);
    gradcheck(&c, 2602);
    lh_free(&c);
}
END_TEST

START_TEST(fd_add_concat)
{
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp_add[3][4] = {{2, 2, 2, 3}, {2, 2, 2, 3}, {2, 2, 2, 3}};
    const int shp_cat[3][4] = {{2, 1, 2, 3}, {2, 3, 2, 3}, {2, 2, 2, 3}};
    lh_make(&c, _i == 0 ? "add" : "concat", "", 3, _i == 0 ? shp_add : shp_cat, 2, -1, 1, 2700 + (uint64_t)_i);
    gradcheck(&c, 2701);
    lh_free(&c);
}
END_TEST

START_TEST(fd_softmax)
{
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{4, 6, 1, 1}};
    lh_make(&c, "softmax", "", 1, shp, 4, -2, 2, 2800);
    int lab[4];
    clg_rng r;
    tu_rng(&r, 2801);
    for (int i = 0; i < 4; i++)
        lab[i] = (int)(clg_rng_u32(&r) % 6);
    ck_assert_int_eq(clg_buf_alloc(c.dev, sizeof lab, &c.labels), CLG_OK);
    clEnqueueWriteBuffer(c.dev->queue, c.labels, CL_TRUE, 0, sizeof lab, lab, 0, NULL, NULL);
    c.l.loss.labels = c.labels;
    gradcheck(&c, 2802);
    lh_free(&c);
}
END_TEST

/* Sequence layers (issue 23): layernorm over C at each position, learned
 * positions, the token loss with label smoothing, gelu_tanh, dense per
 * position. */
START_TEST(fd_seq)
{
    static const char *const types[] = {"layernorm", "posembed", "softmax", "activation", "dense"};
    static const char *const keys[] = {"eps=1e-5", "context=4", "label_smoothing=0.1", "type=gelu_tanh",
                                       "units=3 activation=gelu_tanh"};
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{2, 3, 5, 1}}; /* N 2, T 3, C 5 */
    lh_make_seq(&c, types[_i], keys[_i], 1, shp, 1, 2, -2, 2, 2900 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, 1);
    random_params(&c, 2901);
    if (c.l.is_loss) {
        int lab[6];
        clg_rng r;
        tu_rng(&r, 2902);
        for (int i = 0; i < 6; i++)
            lab[i] = (int)(clg_rng_u32(&r) % 5);
        ck_assert_int_eq(clg_buf_alloc(c.dev, sizeof lab, &c.labels), CLG_OK);
        clEnqueueWriteBuffer(c.dev->queue, c.labels, CL_TRUE, 0, sizeof lab, lab, 0, NULL, NULL);
        c.l.loss.labels = c.labels;
    }
    gradcheck(&c, 2903);
    lh_free(&c);
}
END_TEST

START_TEST(fd_mse)
{
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{3, 2, 2, 1}};
    lh_make(&c, "mse", "", 1, shp, 3, -2, 2, 2900);
    clg_rng r;
    tu_rng(&r, 2901);
    float t[12];
    tu_fill(t, 12, -2, 2, &r);
    c.labels = tu_upload(c.dev, t, 12);
    c.l.loss.labels = c.labels;
    gradcheck(&c, 2902);
    lh_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gradcheck");
    TCase *tc = tcase_create("gradcheck");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, fd_activation, 0, 6);
    tcase_add_loop_test(tc, fd_dense, 0, 3);
    tcase_add_loop_test(tc, fd_conv, 0, 4);
    tcase_add_loop_test(tc, fd_pool, 0, 5);
    tcase_add_loop_test(tc, fd_gap_flatten_dropout, 0, 3);
    tcase_add_loop_test(tc, fd_batchnorm, 0, 3);
    tcase_add_loop_test(tc, fd_add_concat, 0, 2);
    tcase_add_test(tc, fd_softmax);
    tcase_add_test(tc, fd_mse);
    tcase_add_loop_test(tc, fd_seq, 0, 5);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
