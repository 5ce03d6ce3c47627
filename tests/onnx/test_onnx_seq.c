/* ONNX export and import of the transformer layers (issue 23 item 6).
 * Two small GPT-like networks with random parameters (every one, gammas
 * around 1) and fresh random token ids:
 *   gpt:   [embedding] + [posembed] (T < context: a slice of the table) +
 *          a pre-layer-norm block ([layernorm], causal [attention] 2 heads,
 *          [add], [layernorm], [dense] gelu (erf), [dense], [add]) +
 *          [layernorm] + [dense] tie = the embedding + token [softmax];
 *   other: [layernorm] affine = 0, non-causal [attention] 4 heads,
 *          [activation] gelu_tanh, an untied [dense] head with a bias.
 * Checked:
 *   - round trip: clgrad's export imported back (clg_onnx_import) builds a
 *     network whose forward gives the same probabilities (|diff| <= 1e-5,
 *     outputs poisoned first);
 *   - the exported file against PyTorch (a float64 twin built from its
 *     initializers) and onnxruntime: tests/onnx/seq_check.py under
 *     /usr/bin/python3 (|diff| <= 1e-4 on probabilities). onnxruntime comes
 *     from ort_setup.sh's venv; without it (or without torch) the script
 *     exits 77 after the rest passed, and so does this test.
 * Usage: test_onnx_seq SCRIPT.py ORT_VENV_DIR */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/layer_harness.h"
#include "model/network.h"
#include "onnx/export.h"
#include "onnx/onnx.h"

#define RT_TOL 1e-5

static const char *g_script, *g_venv;
static int g_skipped;

static const char *gpt_model =
    "[net]\nchannels=1\nheight=%d\nwidth=1\ninput=tokens\nbatch=%d\n"
    "[embedding]\nname=tok\nvocab=37\ndim=32\n"
    "[posembed]\nname=pos\ncontext=12\n"
    "[layernorm]\nname=ln1\neps=1e-5\n"
    "[attention]\nname=attn\nheads=2\ncausal=1\n"
    "[add]\nname=res1\ninput=pos,attn\n"
    "[layernorm]\nname=ln2\n"
    "[dense]\nname=fc\nunits=48\nactivation=gelu\n"
    "[dense]\nname=proj\nunits=32\n"
    "[add]\nname=res2\ninput=res1,proj\n"
    "[layernorm]\nname=ln_f\n"
    "[dense]\nname=head\ntie=tok\nbias=0\n"
    "[softmax]\nname=loss\n";

static const char *other_model =
    "[net]\nchannels=1\nheight=%d\nwidth=1\ninput=tokens\nbatch=%d\n"
    "[embedding]\nname=emb\nvocab=20\ndim=16\n"
    "[posembed]\nname=pe\ncontext=%d\n"
    "[layernorm]\nname=ln\naffine=0\neps=1e-3\n"
    "[attention]\nname=sa\nheads=4\ncausal=0\n"
    "[activation]\nname=act\ntype=gelu_tanh\n"
    "[dense]\nname=out\nunits=11\n"
    "[softmax]\nname=probs\n";

typedef struct {
    clg_net *net;
    clg_replica *r;
    cl_mem xm, lm;
} built;

static void build(clg_ctx *ctx, const char *text, const char *src, built *b)
{
    memset(b, 0, sizeof *b);
    ck_assert_msg(clg_net_build(&ctx->err, text, src, 0, &b->net) == CLG_OK, "%s", ctx->err.msg);
    ck_assert_msg(clg_replica_create(b->net, &ctx->devs[0], 7, &b->r) == CLG_OK, "%s", clg_last_error(ctx));
}

static void unbuild(built *b)
{
    clReleaseMemObject(b->xm);
    clReleaseMemObject(b->lm);
    clg_replica_free(b->r);
    clg_net_free(b->net);
}

/* Forward on the ids (B x T); returns the output (malloc'd), poisoned first. */
static float *forward(clg_ctx *ctx, built *b, const float *ids, int B, int T, size_t *nout)
{
    clg_device *dev = &ctx->devs[0];
    size_t nt = (size_t)B * T;
    b->xm = tu_upload(dev, ids, nt);
    ck_assert_int_eq(clg_buf_alloc(dev, nt * sizeof(int), &b->lm), CLG_OK);
    int *lab = calloc(nt, sizeof(int));
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, b->lm, CL_TRUE, 0, nt * sizeof(int), lab, 0, NULL, NULL),
                     CL_SUCCESS);
    free(lab);
    clg_replica_set_input(b->r, b->xm, 0);
    clg_replica_set_labels(b->r, b->lm, 0, 1.0f / B);
    const clg_tensor *o = clg_replica_output(b->r);
    *nout = (size_t)B * o->c * o->h * o->w;
    float *p = lh_alloc(*nout);
    tu_poison(p, *nout);
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, o->mem, CL_TRUE, o->off * sizeof(float), *nout * sizeof(float),
                                          p, 0, NULL, NULL),
                     CL_SUCCESS);
    ck_assert_msg(clg_replica_forward(b->r, B, 0) == CLG_OK, "%s", clg_last_error(ctx));
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, o->mem, CL_TRUE, o->off * sizeof(float), *nout * sizeof(float), p,
                                         0, NULL, NULL),
                     CL_SUCCESS);
    for (size_t i = 0; i < *nout; i++)
        ck_assert_msg(isfinite(p[i]), "output %zu is not finite (%g)", i, (double)p[i]);
    return p;
}

static void randomize(clg_ctx *ctx, built *b, uint64_t stream)
{
    clg_param_ref *refs = NULL;
    int np = 0;
    ck_assert_int_eq(clg_replica_params(b->r, 1, &refs, &np), CLG_OK);
    clg_rng rng;
    tu_rng(&rng, stream);
    for (int i = 0; i < np; i++) {
        const clg_param *p = refs[i].param;
        float *h = lh_alloc(p->numel);
        int gamma = strcmp(p->name, "gamma") == 0;
        tu_fill(h, p->numel, gamma ? 0.7f : -0.5f, gamma ? 1.3f : 0.5f, &rng);
        ck_assert_int_eq(clEnqueueWriteBuffer(ctx->devs[0].queue, clg_replica_master(b->r, &refs[i]), CL_TRUE, 0,
                                              p->numel * sizeof(float), h, 0, NULL, NULL),
                         CL_SUCCESS);
        free(h);
    }
    free(refs);
    ck_assert_int_eq(clg_replica_weights_updated(b->r), CLG_OK);
}

/* The imported weights into b's parameters, by name. */
static void load_ckpt(clg_ctx *ctx, built *b, const clg_ckpt *ck)
{
    clg_param_ref *refs = NULL;
    int np = 0;
    ck_assert_int_eq(clg_replica_params(b->r, 0, &refs, &np), CLG_OK);
    for (int i = 0; i < np; i++) {
        const clg_param *p = refs[i].param;
        char name[160];
        snprintf(name, sizeof name, "%s.%s", refs[i].layer->name, p->name);
        float *h = lh_alloc(p->numel);
        ck_assert_msg(clg_ckpt_get_f32(&ctx->err, ck, name, 0, NULL, p->numel, h) == CLG_OK, "%s", ctx->err.msg);
        ck_assert_int_eq(clEnqueueWriteBuffer(ctx->devs[0].queue, clg_replica_master(b->r, &refs[i]), CL_TRUE, 0,
                                              p->numel * sizeof(float), h, 0, NULL, NULL),
                         CL_SUCCESS);
        free(h);
    }
    free(refs);
    ck_assert_int_eq(clg_replica_weights_updated(b->r), CLG_OK);
}

static void write_f32(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(x, sizeof(float), n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* The imported model text holds every line of want (NULL-terminated). */
static void check_text(const char *text, const char *const *want)
{
    for (int k = 0; want[k]; k++)
        ck_assert_msg(strstr(text, want[k]) != NULL, "the imported model has no '%s':\n%s", want[k], text);
}

static void run_case(const char *fmt, int T, int ctxlen, int B, uint64_t stream, int vocab, const char *const *want_text)
{
    clg_ctx *ctx = tu_ctx("0");
    char text[2048];
    if (ctxlen)
        snprintf(text, sizeof text, fmt, T, B, ctxlen);
    else
        snprintf(text, sizeof text, fmt, T, B);
    built a;
    build(ctx, text, "seq.cfg", &a);
    randomize(ctx, &a, stream);
    clg_rng rng;
    tu_rng(&rng, stream + 100);
    size_t nt = (size_t)B * T, nout = 0, nout2 = 0;
    float *ids = lh_alloc(nt);
    for (size_t i = 0; i < nt; i++)
        ids[i] = (float)(clg_rng_u32(&rng) % (uint32_t)vocab);
    float *want = forward(ctx, &a, ids, B, T, &nout);

    char dir[] = "/tmp/clg_onnx_seq_XXXXXX", path[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.onnx", dir);
    ck_assert_msg(clg_onnx_export(&ctx->err, a.net, a.r, NULL, path) == CLG_OK, "%s", ctx->err.msg);

    /* round trip */
    char *buf = NULL, *itext = NULL;
    size_t len = 0;
    clg_ckpt *ck = NULL;
    ck_assert_int_eq(clg_file_read(&ctx->err, path, &buf, &len), CLG_OK);
    ck_assert_msg(clg_onnx_import(&ctx->err, buf, len, path, &itext, &ck) == CLG_OK, "%s", ctx->err.msg);
    check_text(itext, want_text);
    built b;
    build(ctx, itext, path, &b);
    load_ckpt(ctx, &b, ck);
    float *got = forward(ctx, &b, ids, B, T, &nout2);
    ck_assert_uint_eq(nout2, nout);
    double md = 0;
    for (size_t i = 0; i < nout; i++)
        md = fmax(md, fabs((double)got[i] - want[i]));
    fprintf(stderr, "T %d B %d: export -> import max |diff| %.2e (tolerance %g)\n", T, B, md, RT_TOL);
    ck_assert_msg(md <= RT_TOL, "round trip: max |diff| %g over %g\nimported model:\n%s", md, RT_TOL, itext);

    /* PyTorch and onnxruntime on the exported file */
    char ip[300], op[300], cmd[1400];
    snprintf(ip, sizeof ip, "%s/ids.f32", dir);
    snprintf(op, sizeof op, "%s/want.f32", dir);
    write_f32(ip, ids, nt);
    write_f32(op, want, nout);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s' '%s' %d %d '%s'", g_script, path, ip, op, B, T, g_venv);
    int rc = system(cmd);
    ck_assert_msg(rc != -1 && WIFEXITED(rc) && (WEXITSTATUS(rc) == 0 || WEXITSTATUS(rc) == 77), "'%s' failed (%d)",
                  cmd, rc);
    g_skipped |= WEXITSTATUS(rc) == 77;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    free(buf);
    free(itext);
    clg_ckpt_free(ck);
    free(ids);
    free(want);
    free(got);
    unbuild(&b);
    unbuild(&a);
    clg_ctx_destroy(ctx);
}

/* T 9 of context 12 (the position table sliced), 3 samples */
static const char *const gpt_text[] = {"input = tokens\n", "[embedding]\nname = tok\n", "vocab = 37\n",
                                       "[posembed]\n", "context = 12\n", "[attention]\n", "heads = 2\n",
                                       "causal = 1\n", "activation = gelu\n", "tie = tok\n", "bias = 0\n",
                                       "affine = 1\n", "input = res1, proj\n", "[softmax]\n", NULL};
static const char *const other_text[] = {"affine = 0\n", "eps = 0.001", "heads = 4\n", "causal = 0\n",
                                         "type = gelu_tanh\n", "units = 11\n", NULL};

START_TEST(gpt_like) { run_case(gpt_model, 9, 0, 3, 1, 37, gpt_text); }
END_TEST

/* T = context = 7, T = 1 */
START_TEST(other_layers)
{
    run_case(other_model, 7, 7, 2, 2, 20, other_text);
    run_case(other_model, 1, 5, 4, 3, 20, other_text);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_onnx_seq SCRIPT.py ORT_VENV_DIR\n");
        return 2;
    }
    g_script = argv[1];
    g_venv = argv[2];
    Suite *s = suite_create("onnx_seq");
    TCase *tc = tcase_create("onnx_seq");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gpt_like);
    tcase_add_test(tc, other_layers);
    suite_add_tcase(s, tc);
    int rc = tu_run(s);
    return rc == 0 && g_skipped ? 77 : rc;
}
