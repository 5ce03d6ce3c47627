/* Models reading token ids ([net] input = tokens): a target per position
 * through the host staging and every lane's label buffer. The global batch
 * is split over the devices (an uneven split), and each lane must hold the
 * ids and the T targets of exactly its samples; an image model keeps one
 * label per sample; the [net] key is checked. */
#include <string.h>

#include "testutil.h"
#include "train/session.h"

static const char *TOK =
    "[net]\n"
    "channels = 1\nheight = 13\nwidth = 1\ninput = tokens\nclasses = 256\nbatch = 11\n"
    "[embedding]\nvocab = 256\ndim = 8\n"
    "[dense]\nunits = 256\n"
    "[softmax]\n";

static const char *IMG =
    "[net]\n"
    "channels = 1\nheight = 13\nwidth = 1\nclasses = 4\nbatch = 11\n"
    "[dense]\nunits = 4\n"
    "[softmax]\n";

/* Uploads a staged batch of n samples and checks every lane's slice of ids and labels. */
static void check_upload(clg_model *m, int n, int lps, clg_rng *r)
{
    int T = m->net->in_c * m->net->in_h * m->net->in_w;
    for (int i = 0; i < n * T; i++)
        m->xhost[0][i] = (float)(clg_rng_u32(r) % 256u);
    for (int i = 0; i < n * lps; i++)
        m->yhost[0][i] = (int32_t)(clg_rng_u32(r) % 256u);
    ck_assert_msg(clg_session_upload(m, 0, n, 1) == CLG_OK, "%s", m->ctx->err.msg);
    int seen = 0;
    for (int l = 0; l < m->dp->n; l++) {
        clg_lane *ln = &m->dp->lanes[l];
        ck_assert_int_eq(clFinish(ln->upq), CL_SUCCESS);
        int off = ln->off[0], cnt = ln->cnt[0];
        ck_assert_int_eq(off, seen);
        seen += cnt;
        if (cnt == 0)
            continue;
        int32_t *y = malloc((size_t)cnt * lps * sizeof(int32_t));
        float *x = malloc((size_t)cnt * T * sizeof(float));
        for (int i = 0; i < cnt * lps; i++)
            y[i] = -5;
        tu_poison(x, (size_t)cnt * T);
        ck_assert_int_eq(clEnqueueReadBuffer(ln->dev->queue, ln->ybuf[0], CL_TRUE, 0, (size_t)cnt * lps * sizeof(int32_t),
                                             y, 0, NULL, NULL),
                         CL_SUCCESS);
        ck_assert_int_eq(clEnqueueReadBuffer(ln->dev->queue, ln->xbuf[0], CL_TRUE, 0, (size_t)cnt * T * sizeof(float), x,
                                             0, NULL, NULL),
                         CL_SUCCESS);
        ck_assert_msg(memcmp(y, m->yhost[0] + (size_t)off * lps, (size_t)cnt * lps * sizeof(int32_t)) == 0,
                      "lane %d (samples %d..%d): labels differ from the staged ones", l, off, off + cnt);
        ck_assert_msg(memcmp(x, m->xhost[0] + (size_t)off * T, (size_t)cnt * T * sizeof(float)) == 0,
                      "lane %d: ids differ", l);
        free(y);
        free(x);
    }
    ck_assert_int_eq(seen, n);
}

START_TEST(token_labels_per_lane)
{
    clg_ctx *c = tu_ctx(NULL);
    clg_rng r;
    tu_rng(&r, 7);
    for (int k = 0; k < 2; k++) {
        clg_model *m = NULL;
        clg_dp_params dpp = {.split = k == 0 ? NULL : "7,3"};
        const char *split = c->ndev > 1 ? dpp.split : NULL;
        dpp.split = split;
        ck_assert_msg(clg_session_create(c, "all", 0, TOK, "tok", 0, 3, 0, &dpp, &m) == CLG_OK, "%s", c->err.msg);
        ck_assert_int_eq(clg_net_labels_per_sample(m->net), 13);
        check_upload(m, 11, 13, &r);
        check_upload(m, 5, 13, &r); /* a smaller last batch */
        clg_session_free(m);
    }
    clg_model *m = NULL; /* an image model: one label per sample */
    ck_assert_msg(clg_session_create(c, "all", 0, IMG, "img", 0, 3, 0, NULL, &m) == CLG_OK, "%s", c->err.msg);
    ck_assert_int_eq(clg_net_labels_per_sample(m->net), 1);
    check_upload(m, 11, 1, &r);
    clg_session_free(m);
    clg_ctx_destroy(c);
}
END_TEST

START_TEST(token_key)
{
    clg_err err = {0};
    clg_net *net = NULL;
    char text[512];
    snprintf(text, sizeof text, "%s", TOK);
    memcpy(strstr(text, "input = tokens"), "input = tokenz", 14);
    ck_assert_int_ne(clg_net_build(&err, text, "bad.cfg", 0, &net), CLG_OK);
    ck_assert_msg(strstr(err.msg, "bad.cfg:5") && strstr(err.msg, "tokenz"), "%s", err.msg);
    ck_assert_msg(clg_net_build(&err, IMG, "img.cfg", 0, &net) == CLG_OK, "%s", err.msg);
    ck_assert_int_eq(net->input_tokens, 0);
    clg_net_free(net);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {token_labels_per_lane, token_key};
    return tu_run_tests("train_tokens", 120, tests, 2);
}
