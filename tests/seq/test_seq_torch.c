/* A transformer-style block against PyTorch (float64), issue 23:
 *   [embedding] tok + [posembed] + [layernorm] ln1 + [dense] fc1 (gelu) +
 *   [dense] fc2 + [add] (residual) + [layernorm] ln2 + [dense] head tie = tok
 *   + [softmax] token loss (mean over N*T)
 * with random parameters (every one, gammas around 1), fresh random ids and
 * targets, T odd and T = 1. Compared: the loss and every gradient at the
 * start, then the loss and every parameter after each of two AdamW steps
 * (lr 1e-2, betas 0.9/0.95, epsilon 1e-4, weight decay 0.1). The reference is
 * tests/seq/torch_block.py run by /usr/bin/python3 (Debian's torch); the
 * test skips (77) when that has no torch.
 * Tolerances: loss 1e-5 relative; gradients max |got - ref| <= 2e-3 (|ref| +
 * 1e-3 max |ref|); parameters |got - ref| <= 1e-4 (|ref| + 1): about 1% of a
 * step of lr 1e-2.
 * Usage: test_seq_torch SCRIPT.py */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/layer_harness.h"
#include "model/network.h"
#include "model/optim.h"

static const char *g_script;

#define LR 1e-2
#define B1 0.9
#define B2 0.95
/* Adam's epsilon 1e-4, not 1e-8: the first step moves each weight by about
 * lr * g / (|g| + eps), whose slope lr / eps would turn a float rounding of a
 * gradient near 0 into a difference of up to 2 lr. */
#define EPS 1e-4
#define WD 0.1
#define LN_EPS 1e-5

static const char *model =
    "[net]\nchannels=1\nheight=%d\nwidth=1\ninput=tokens\nbatch=%d\n"
    "[embedding]\nname=tok\nvocab=%d\ndim=%d\n"
    "[posembed]\nname=pos\ncontext=%d\n"
    "[layernorm]\nname=ln1\n"
    "[dense]\nname=fc1\nunits=%d\nactivation=gelu\n"
    "[dense]\nname=fc2\nunits=%d\n"
    "[add]\nname=res\ninput=ln1,fc2\n"
    "[layernorm]\nname=ln2\n"
    "[dense]\nname=head\ntie=tok\n"
    "[softmax]\nname=loss\n";

typedef struct {
    clg_ctx *ctx;
    clg_device *dev;
    clg_net *net;
    clg_replica *r;
    clg_optim *opt;
    clg_param_ref *refs;
    int np, B, T, V, D, H, CTX;
    float *ids;
    int *lab;
    cl_mem xm, lm;
} blk;

static void wr(FILE *f, const void *p, size_t n) { ck_assert_uint_eq(fwrite(p, 1, n, f), n); }

static void pname(const blk *b, int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", b->refs[i].layer->name, b->refs[i].param->name);
}

static float *read_param(blk *b, int i, int grad)
{
    size_t n = b->refs[i].param->numel;
    float *h = lh_alloc(n);
    tu_download(b->dev, grad ? b->refs[i].param->grad : clg_replica_master(b->r, &b->refs[i]), h, n);
    return h;
}

static void setup_block(blk *b, int B, int T, uint64_t stream)
{
    memset(b, 0, sizeof *b);
    b->B = B, b->T = T, b->V = T > 1 ? 29 : 32, b->D = 16, b->H = 40, b->CTX = 12; /* 32: the 8-wide loss kernel */
    b->ctx = tu_ctx("0");
    b->dev = &b->ctx->devs[0];
    char text[2048];
    snprintf(text, sizeof text, model, T, B, b->V, b->D, b->CTX, b->H, b->D);
    ck_assert_msg(clg_net_build(&b->ctx->err, text, "block.cfg", 0, &b->net) == CLG_OK, "%s", b->ctx->err.msg);
    ck_assert_msg(clg_replica_create(b->net, b->dev, 5, &b->r) == CLG_OK, "%s", clg_last_error(b->ctx));
    ck_assert_int_eq(clg_replica_params(b->r, 1, &b->refs, &b->np), CLG_OK);
    clg_rng rng;
    tu_rng(&rng, stream);
    for (int i = 0; i < b->np; i++) { /* every parameter random: gammas around 1, the rest around 0 */
        const clg_param *p = b->refs[i].param;
        float *h = lh_alloc(p->numel);
        int gamma = strcmp(p->name, "gamma") == 0;
        tu_fill(h, p->numel, gamma ? 0.7f : -0.3f, gamma ? 1.3f : 0.3f, &rng);
        ck_assert_int_eq(clEnqueueWriteBuffer(b->dev->queue, clg_replica_master(b->r, &b->refs[i]), CL_TRUE, 0,
                                              p->numel * sizeof(float), h, 0, NULL, NULL),
                         CL_SUCCESS);
        free(h);
    }
    ck_assert_int_eq(clg_replica_weights_updated(b->r), CLG_OK);
    size_t nt = (size_t)B * T;
    b->ids = lh_alloc(nt);
    b->lab = malloc(nt * sizeof(int));
    for (size_t i = 0; i < nt; i++) {
        b->ids[i] = (float)(clg_rng_u32(&rng) % (uint32_t)b->V);
        b->lab[i] = (int)(clg_rng_u32(&rng) % (uint32_t)b->V);
    }
    b->xm = tu_upload(b->dev, b->ids, nt);
    ck_assert_int_eq(clg_buf_alloc(b->dev, nt * sizeof(int), &b->lm), CLG_OK);
    ck_assert_int_eq(clEnqueueWriteBuffer(b->dev->queue, b->lm, CL_TRUE, 0, nt * sizeof(int), b->lab, 0, NULL, NULL),
                     CL_SUCCESS);
    clg_replica_set_input(b->r, b->xm, 0);
    clg_replica_set_labels(b->r, b->lm, 0, 1.0f / B);
    clg_hparams hp = b->net->hp;
    hp.optimizer = CLG_OPT_ADAMW;
    hp.beta1 = B1;
    hp.beta2 = B2;
    hp.epsilon = EPS;
    hp.weight_decay = WD;
    ck_assert_msg(clg_optim_create(b->r, &hp, &b->opt) == CLG_OK, "%s", clg_last_error(b->ctx));
}

/* Writes the inputs of torch_block.py. */
static void write_inputs(blk *b, const char *path)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    int hdr[7] = {b->B, b->T, b->V, b->D, b->H, b->CTX, b->np};
    double hp[6] = {LR, B1, B2, EPS, WD, LN_EPS};
    wr(f, hdr, sizeof hdr);
    wr(f, hp, sizeof hp);
    wr(f, b->ids, (size_t)b->B * b->T * sizeof(float));
    wr(f, b->lab, (size_t)b->B * b->T * sizeof(int));
    for (int i = 0; i < b->np; i++) {
        char name[160];
        pname(b, i, name, sizeof name);
        int len = (int)strlen(name), numel = (int)b->refs[i].param->numel;
        float *v = read_param(b, i, 0);
        wr(f, &len, sizeof len);
        wr(f, name, (size_t)len);
        wr(f, &numel, sizeof numel);
        wr(f, v, (size_t)numel * sizeof(float));
        free(v);
    }
    ck_assert_int_eq(fclose(f), 0);
}

/* Forward + backward; returns the mean loss over N*T. */
static double step_loss(blk *b)
{
    ck_assert_msg(clg_replica_forward(b->r, b->B, 1) == CLG_OK, "%s", clg_last_error(b->ctx));
    ck_assert_msg(clg_replica_backward(b->r, b->B) == CLG_OK, "%s", clg_last_error(b->ctx));
    float res[2];
    tu_download(b->dev, b->r->layers[b->r->nlayers - 1].loss.result, res, 2);
    return res[0] / b->B;
}

static double *read_doubles(FILE *f, size_t n)
{
    double *d = lh_dalloc(n);
    ck_assert_uint_eq(fread(d, sizeof(double), n, f), n);
    return d;
}

static void check_loss(double got, double ref, const char *what)
{
    ck_assert_msg(fabs(got - ref) <= 1e-5 * fabs(ref), "%s: clgrad %.8g, PyTorch %.8g", what, got, ref);
}

static void run_case(int B, int T, uint64_t stream)
{
    blk b;
    setup_block(&b, B, T, stream);
    char in[] = "/tmp/clg_seq_torch_in_XXXXXX", out[] = "/tmp/clg_seq_torch_out_XXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    ck_assert(fi >= 0 && fo >= 0);
    close(fi);
    close(fo);
    write_inputs(&b, in);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", g_script, in, out);
    int rc = system(cmd);
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
        unlink(in);
        unlink(out);
        fprintf(stderr, "no torch under /usr/bin/python3: skipped\n");
        exit(77);
    }
    ck_assert_msg(rc == 0, "'%s' failed (%d)", cmd, rc);
    FILE *f = fopen(out, "rb");
    ck_assert_ptr_nonnull(f);
    double *ref = read_doubles(f, 1);
    check_loss(step_loss(&b), ref[0], "loss at the start");
    free(ref);
    for (int i = 0; i < b.np; i++) {
        size_t n = b.refs[i].param->numel;
        float *g = read_param(&b, i, 1);
        ref = read_doubles(f, n);
        double mx = 0;
        for (size_t k = 0; k < n; k++)
            mx = fmax(mx, fabs(ref[k]));
        char what[200];
        pname(&b, i, what, sizeof what);
        strncat(what, " gradient", sizeof what - strlen(what) - 1);
        LH_CLOSE(g, ref, n, 1e-3 * mx + 1e-12, 2e-3, what);
        free(g);
        free(ref);
    }
    for (int s = 1; s <= 2; s++) {
        ck_assert_msg(clg_optim_step(b.opt, LR, 1.0f) == CLG_OK, "%s", clg_last_error(b.ctx));
        ck_assert_int_eq(clg_replica_weights_updated(b.r), CLG_OK);
        double l = step_loss(&b);
        ref = read_doubles(f, 1);
        check_loss(l, ref[0], s == 1 ? "loss after one AdamW step" : "loss after two AdamW steps");
        free(ref);
        for (int i = 0; i < b.np; i++) {
            size_t n = b.refs[i].param->numel;
            float *v = read_param(&b, i, 0);
            ref = read_doubles(f, n);
            char what[200];
            pname(&b, i, what, sizeof what);
            strncat(what, s == 1 ? " after one step" : " after two steps", sizeof what - strlen(what) - 1);
            LH_CLOSE(v, ref, n, 1.0, 1e-4, what);
            free(v);
            free(ref);
        }
    }
    fclose(f);
    unlink(in);
    unlink(out);
    clg_optim_free(b.opt);
    free(b.refs);
    clg_buf_release(b.dev, b.xm);
    clg_buf_release(b.dev, b.lm);
    clg_replica_free(b.r);
    clg_net_free(b.net);
    free(b.ids);
    free(b.lab);
    clg_ctx_destroy(b.ctx);
}

START_TEST(block_vs_torch)
{
    if (_i == 0)
        run_case(4, 9, 1200);
    else
        run_case(3, 1, 1210);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s tests/seq/torch_block.py\n", argv[0]);
        return 2;
    }
    g_script = argv[1];
    if (access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "no /usr/bin/python3: skipped\n");
        return 77;
    }
    Suite *s = suite_create("seq_torch");
    TCase *tc = tcase_create("seq_torch");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, block_vs_torch, 0, 2);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
