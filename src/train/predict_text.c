/* clg_model_predict_text: the next-byte distribution at every position of a
 * text, for a token model (include/clgrad.h). The text is cut into
 * consecutive windows of the model's context, each seen from its first byte
 * as clg_model_evaluate sees the held-out tail, and run through the
 * session's forward (the softmax output of every position). */
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "train/session.h"

static clg_status check_token_model(clg_model *m, int *T, int *V)
{
    clg_err *err = &m->ctx->err;
    if (!m->net->input_tokens)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "predict: model %s takes images ([net] input is not tokens): use clg_model_predict "
                           "(`clgrad predict MODEL --input FILE`)",
                           m->net->source);
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    *T = m->net->in_c * m->net->in_h * m->net->in_w;
    *V = m->net->classes;
    if ((size_t)o->c * o->h * o->w != (size_t)*T * (size_t)*V)
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "predict: the output of model %s is %dx%dx%d per sample, not %d classes at each of its %d "
                           "positions",
                           m->net->source, o->c, o->h, o->w, *V, *T);
    if (*V < 256)
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "predict: model %s predicts %d classes per position: a text's bytes need 256 (a byte-level "
                           "vocabulary)",
                           m->net->source, *V);
    if (clg_comm_size() > 1)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "predict: runs in one process; under mpirun (%d ranks) use rank 0 alone or run it without "
                           "mpirun",
                           clg_comm_size());
    return CLG_OK;
}

/* Windows first .. first + cnt - 1 into the stage: ids and the next byte
 * as each position's label (0 after the text: not read). */
static void stage_windows(clg_model *m, const unsigned char *text, size_t len, size_t first, int cnt, int T)
{
    float *x = m->xhost[0];
    int32_t *y = m->yhost[0];
    for (int s = 0; s < cnt; s++)
        for (int t = 0; t < T; t++) {
            size_t i = (first + (size_t)s) * (size_t)T + (size_t)t;
            x[(size_t)s * T + t] = i < len ? (float)text[i] : 0.0f;
            y[(size_t)s * T + t] = i + 1 < len ? (int32_t)text[i + 1] : 0;
        }
}

clg_status clg_model_predict_text(clg_model *m, const unsigned char *text, size_t len, float **probs)
{
    if (probs)
        *probs = NULL;
    if (!m || !text || !probs || len < 1)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "predict: model, text (at least 1 byte) and probs are required");
    clg_err *err = &m->ctx->err;
    int T = 0, V = 0;
    CLG_TRY(check_token_model(m, &T, &V));
    size_t windows = (len + (size_t)T - 1) / (size_t)T, row = (size_t)T * V;
    if (windows > SIZE_MAX / sizeof(float) / row)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "predict: a text of %zu bytes is too long", len);
    float *out = malloc(row * sizeof(float) * windows);
    if (!out)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "predict: out of host memory for %zu positions of %d classes",
                           windows * T, V);
    clg_status st = CLG_OK;
    int B = m->net->batch;
    for (size_t w = 0; st == CLG_OK && w < windows; w += (size_t)B) {
        int cnt = (int)CLG_MIN((size_t)B, windows - w);
        st = clg_session_stage_wait(m, 0);
        if (st == CLG_OK) {
            stage_windows(m, text, len, w, cnt, T);
            st = clg_session_upload(m, 0, cnt, 1);
        }
        if (st == CLG_OK)
            st = clg_session_forward(m, 0, 1, NULL, out + w * row);
    }
    if (st != CLG_OK) {
        free(out);
        return st;
    }
    *probs = out; /* the padding's rows stay past len * V: the caller reads len rows */
    return CLG_OK;
}
