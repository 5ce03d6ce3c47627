/* Non-finite diagnosis: after a failed step, the batch again with a
 * blocking check after each layer, naming the first layer whose output or
 * gradient is non-finite (clg_replica_explain_nonfinite). */
#include <math.h>
#include <stdlib.h>

#include "model/network_impl.h"

typedef struct nf_diag {
    clg_replica *r;
    int n;
    char *buf;
    size_t cap;
    int found;
    float *host;
    size_t host_cap;
} nf_diag;

/* Index of the first non-finite float of mem[off .. off + n) (blocking read
 * behind everything enqueued so far), -1 when all are finite, -2 when the
 * read failed. *v receives the value. */
static long nf_first(nf_diag *d, cl_mem mem, size_t off, size_t n, float *v)
{
    if (!mem || n == 0)
        return -1;
    if (d->host_cap < n) {
        float *h = realloc(d->host, n * sizeof(float));
        if (!h)
            return -2;
        d->host = h;
        d->host_cap = n;
    }
    if (clEnqueueReadBuffer(d->r->dev->queue, mem, CL_TRUE, off * sizeof(float), n * sizeof(float), d->host, 0, NULL,
                            NULL) != CL_SUCCESS)
        return -2;
    for (size_t k = 0; k < n; k++)
        if (!isfinite(d->host[k])) {
            *v = d->host[k];
            return (long)k;
        }
    return -1;
}

/* ", its parameters are finite" or ", its parameter 'weight' is non-finite already". */
static void nf_params(nf_diag *d, const clg_layer *l, char *out, size_t cap)
{
    snprintf(out, cap, "%s", l->nparams ? "; its parameters are finite (the overflow happens in this layer)" : "");
    for (int p = 0; p < l->nparams; p++) { /* trainable only: the check's own forward updates running statistics */
        float v;
        if (l->params[p].trainable && nf_first(d, l->params[p].value, 0, l->params[p].numel, &v) >= 0) {
            snprintf(out, cap, "; its parameter '%s' is non-finite already (a previous update overflowed)",
                     l->params[p].name);
            return;
        }
    }
}

static clg_status nf_hook(void *user, int i, int backward)
{
    nf_diag *d = user;
    clg_replica *r = d->r;
    clg_layer *l = &r->layers[i];
    float v = 0;
    long k = -1;
    char what[96] = "", extra[160] = "";
    if (!backward) {
        clg_tensor o = clg_tensor_with_n(&r->act[i], d->n);
        if (r->fp16 && i != r->nlayers - 1) { /* the fp32 output before rounding to half */
            o.mem = r->work[i].f_out;
            o.off = 0;
        }
        k = nf_first(d, o.mem, o.off, clg_tensor_numel(&o), &v);
        if (k >= 0) {
            snprintf(what, sizeof what, "output");
            nf_params(d, l, extra, sizeof extra);
        } else if (l->is_loss && (k = nf_first(d, l->loss.result, 0, 1, &v)) >= 0) {
            snprintf(what, sizeof what, "loss");
        }
    } else {
        for (int p = 0; p < l->nparams && k < 0; p++)
            if (l->params[p].trainable && (k = nf_first(d, l->params[p].grad, 0, l->params[p].numel, &v)) >= 0)
                snprintf(what, sizeof what, "gradient of its parameter '%s'", l->params[p].name);
        for (int j = 0; j < l->nin && k < 0; j++) {
            int src = l->inputs[j];
            if (src < 0)
                continue;
            clg_tensor g = clg_tensor_with_n(&r->dact[src], d->n);
            if (r->fp16) {
                g.mem = r->work[i].b_din[j];
                g.off = 0;
            }
            if ((k = nf_first(d, g.mem, g.off, clg_tensor_numel(&g), &v)) >= 0)
                snprintf(what, sizeof what, "gradient of its input %d", j);
        }
    }
    if (backward && k >= 0)
        nf_params(d, l, extra, sizeof extra);
    if (k == -2) {
        snprintf(d->buf, d->cap, "the check of layer '%s' could not read its buffers", l->name);
        d->found = 1;
    } else if (k >= 0) {
        snprintf(d->buf, d->cap, "first non-finite value in %s: layer '%s' (%s, %s:%d), %s (%g at element %ld)%s",
                 backward ? "backward" : "forward", l->name, l->ops->type, r->net->source, l->line, what, v, k, extra);
        d->found = 1;
    }
    return d->found ? CLG_ERR_INTERNAL : CLG_OK; /* stop at the first finding */
}

void clg_replica_explain_nonfinite(clg_replica *r, int n, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = 0;
    if (!r || n <= 0 || n > r->batch || !r->input.mem) {
        snprintf(buf, cap, "no staged batch to check");
        return;
    }
    nf_diag d = {.r = r, .n = n, .buf = buf, .cap = cap};
    clg_err saved;
    clg_err_copy(&saved, clg_dev_err(r->dev)); /* the caller's failure stays the device's last error */
    clFinish(r->dev->queue);
    clg_tensor x = clg_tensor_with_n(&r->input, n);
    float v = 0;
    long k = nf_first(&d, x.mem, x.off, clg_tensor_numel(&x), &v);
    if (k >= 0) {
        snprintf(buf, cap, "the input batch holds a non-finite value (%g at element %ld)", v, k);
    } else {
        clg_status (*hook)(void *, int, int) = r->after_layer;
        void *user = r->after_layer_user;
        const clg_layer_sync **sync = calloc((size_t)r->nlayers, sizeof *sync);
        if (!sync) {
            snprintf(buf, cap, "no memory for the check");
            clg_err_copy(clg_dev_err(r->dev), &saved);
            return;
        }
        for (int i = 0; i < r->nlayers; i++) { /* alone: the other replicas are not running this step */
            sync[i] = r->layers[i].sync;
            r->layers[i].sync = NULL;
        }
        r->after_layer = nf_hook;
        r->after_layer_user = &d;
        clg_status st = clg_replica_forward(r, n, 1);
        if (st == CLG_OK && !d.found)
            st = clg_replica_backward(r, n);
        r->after_layer = hook;
        r->after_layer_user = user;
        for (int i = 0; i < r->nlayers; i++)
            r->layers[i].sync = sync[i];
        free(sync);
        for (int i = 0; i < r->nlayers && !d.found && st == CLG_OK; i++) /* NaN weights behind a ReLU (max(NaN, 0) = 0) */
            for (int p = 0; p < r->layers[i].nparams && !d.found; p++)
                if ((k = nf_first(&d, r->layers[i].params[p].value, 0, r->layers[i].params[p].numel, &v)) >= 0) {
                    snprintf(buf, cap,
                             "every output and gradient is finite when the batch is run again, but layer '%s' (%s, "
                             "%s:%d) holds a non-finite parameter '%s' (%g at element %ld)",
                             r->layers[i].name, r->layers[i].ops->type, r->net->source, r->layers[i].line,
                             r->layers[i].params[p].name, v, k);
                    d.found = 1;
                }
        if (!d.found)
            snprintf(buf, cap, st == CLG_OK ? "every layer's output, gradient and parameter is finite when the batch is "
                                              "run again"
                                            : "the check could not run the batch again");
    }
    clFinish(r->dev->queue);
    clg_err_copy(clg_dev_err(r->dev), &saved);
    free(d.host);
}
