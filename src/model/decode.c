/* Incremental inference of a token model (see decode.h). */
#include <stdlib.h>
#include <string.h>

#include "model/decode.h"
#include "model/network_impl.h"
#include "ops/convert.h"

struct clg_decoder {
    clg_net *net;     /* the model's layers set up for T = 1 (owned) */
    clg_replica *rep; /* owned, on the source replica's device */
    int context;      /* the source model's positions per sample */
    int vocab;        /* classes per position */
    int logits;       /* index of the layer giving the logits */
    int pos;          /* positions fed so far (in every attention cache) */
    int half;         /* fp16 storage: weights, activations and the key/value caches in half */
    uint64_t cache_bytes; /* the attention layers' key/value caches */
    cl_mem ids;       /* context floats: the network input */
    float *host_ids;
};

/* Per-position layers the decoder runs with their plain forward. */
static int per_position(const clg_layer *l)
{
    static const char *const ok[] = {"embedding", "layernorm", "dense", "activation", "dropout", "add", NULL};
    for (int i = 0; ok[i]; i++)
        if (strcmp(l->ops->type, ok[i]) == 0)
            return 1;
    return 0;
}

static clg_status check_net(clg_err *err, const clg_net *net, int *logits)
{
    if (!net->input_tokens)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "%s: not a token model: generation needs [net] input = tokens and an [embedding]",
                           net->source);
    int last = net->loss_index >= 0 ? net->proto[net->loss_index].inputs[0] : net->nlayers - 1;
    for (int i = 0; i < net->nlayers; i++) {
        const clg_layer *l = &net->proto[i];
        if (i == net->loss_index)
            continue;
        if (!l->out_seq || (!l->ops->forward_step && !per_position(l)))
            return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                               "%s:%d: layer '%s' ([%s]) cannot be decoded position by position (generation takes "
                               "[embedding], [posembed], [layernorm], [attention], [dense], [activation], [dropout] "
                               "and [add] on sequences)",
                               net->source, l->line, l->name, l->ops->type);
    }
    if (last < 0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: the loss layer reads the network input", net->source);
    *logits = last;
    return CLG_OK;
}

/* Copies every parameter value of src into the decoder's replica (same
 * network, so the same parameter order and sizes): into its authoritative
 * copies (fp16: the masters, then rounded to half). */
static clg_status copy_weights(clg_replica *src, clg_replica *dst)
{
    clg_err *err = clg_dev_err(dst->dev);
    clg_param_ref *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    clg_status st = clg_replica_params(src, 0, &a, &na);
    if (st == CLG_OK)
        st = clg_replica_params(dst, 0, &b, &nb);
    if (st == CLG_OK && na != nb)
        st = clg_err_set(err, CLG_ERR_INTERNAL, "decoder: %d parameters, the model has %d", nb, na);
    for (int i = 0; st == CLG_OK && i < na; i++) {
        const clg_param *pa = a[i].param, *pb = b[i].param;
        if (pa->numel != pb->numel)
            st = clg_err_set(err, CLG_ERR_INTERNAL, "decoder: parameter %d holds %zu values, the model's %zu", i,
                             pb->numel, pa->numel);
        else if (pa->value && pb->value && pa->value != pb->value) {
            cl_int e = clEnqueueCopyBuffer(dst->dev->queue, clg_replica_master(src, &a[i]),
                                           clg_replica_master(dst, &b[i]), 0, 0, pa->numel * sizeof(float), 0, NULL,
                                           NULL);
            if (e != CL_SUCCESS)
                st = clg_cl_fail(err, e, "copying weights into the decoder", __FILE__, __LINE__);
        }
    }
    free(a);
    free(b);
    if (st == CLG_OK) {
        cl_int e = clFinish(dst->dev->queue);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "copying weights into the decoder", __FILE__, __LINE__);
    }
    if (st == CLG_OK)
        st = clg_replica_weights_updated(dst);
    return st;
}

/* Every attention layer keeps its cache in half (half) and the cache's bytes. */
static uint64_t setup_caches(clg_decoder *d)
{
    uint64_t bytes = 0;
    for (int i = 0; i <= d->logits; i++) {
        clg_layer *l = &d->rep->layers[i];
        if (strcmp(l->ops->type, "attention") != 0)
            continue;
        l->cache_half = d->half;
        bytes += 2ull * (uint64_t)d->context * (uint64_t)l->out_shape[2] * (d->half ? 2u : 4u);
    }
    return bytes;
}

clg_status clg_decoder_create(clg_replica *src, int half, clg_decoder **out)
{
    *out = NULL;
    clg_err *err = clg_dev_err(src->dev);
    const clg_net *net = src->net;
    int logits = -1;
    CLG_TRY(check_net(err, net, &logits));
    clg_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    d->context = net->in_c * net->in_h * net->in_w;
    d->logits = logits;
    d->vocab = net->proto[logits].out_shape[2];
    d->half = half != 0;
    const int chw[3] = {1, 1, 1};
    clg_status st = clg_net_build_shape(err, net->text, net->source, d->context, chw, &d->net);
    if (st == CLG_OK) {
        d->net->fp16 = d->half; /* the replica stores activations and weights in half */
        st = clg_replica_create(d->net, src->dev, 1, &d->rep);
    }
    if (st == CLG_OK)
        st = copy_weights(src, d->rep);
    if (st == CLG_OK)
        st = clg_buf_alloc(src->dev, (size_t)d->context * sizeof(float), &d->ids);
    if (st == CLG_OK && !(d->host_ids = malloc((size_t)d->context * sizeof(float))))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    if (st != CLG_OK) {
        clg_decoder_free(d);
        return st;
    }
    clg_replica_set_input(d->rep, d->ids, 0);
    d->cache_bytes = setup_caches(d);
    *out = d;
    return CLG_OK;
}

void clg_decoder_free(clg_decoder *d)
{
    if (!d)
        return;
    if (d->rep) {
        clg_buf_release(d->rep->dev, d->ids);
        clg_replica_free(d->rep);
    }
    clg_net_free(d->net);
    free(d->host_ids);
    free(d);
}

int clg_decoder_context(const clg_decoder *d) { return d->context; }
int clg_decoder_vocab(const clg_decoder *d) { return d->vocab; }
uint64_t clg_decoder_cache_bytes(const clg_decoder *d) { return d->cache_bytes; }

/* Layer i's inputs for n positions; fp16: expanded from half into the
 * layer's fp32 working buffers (or the previous layer's fp32 output where
 * the replica chains them), as clg_replica_forward does. */
static clg_status step_inputs(clg_replica *r, int i, int n, clg_tensor *in)
{
    const clg_layer *l = &r->layers[i];
    for (int k = 0; k < l->nin; k++) {
        int src = l->inputs[k];
        in[k] = clg_tensor_with_n(src < 0 ? &r->input : &r->act[src], n);
        if (!r->fp16 || src < 0)
            continue;
        if (src == i - 1 && r->work[src].fchain) {
            in[k].mem = r->work[src].f_out;
            in[k].off = 0;
            continue;
        }
        clg_tensor h = in[k];
        in[k].mem = r->work[i].f_in[k];
        in[k].off = 0;
        CLG_TRY(clg_cvt_f16_to_f32(r->dev, h.mem, h.off, in[k].mem, 0, clg_tensor_numel(&h)));
    }
    return CLG_OK;
}

/* Layer i on n positions from pos0; fp16: computed into its fp32 working
 * output, then rounded to half for storage. *fout: the fp32 output. */
static clg_status step_layer(clg_decoder *d, int i, int n, int pos0, clg_tensor *fout)
{
    clg_replica *r = d->rep;
    clg_layer *l = &r->layers[i];
    clg_tensor in[CLG_MAX_INPUTS];
    CLG_TRY(step_inputs(r, i, n, in));
    clg_tensor o = clg_tensor_with_n(&r->act[i], n), oh = o;
    int half_out = r->fp16 && i != r->nlayers - 1;
    if (half_out) {
        o.mem = r->work[i].f_out;
        o.off = 0;
    }
    clg_status st = l->ops->forward_step ? l->ops->forward_step(l, r->dev, in, l->nin, &o, pos0, d->context)
                                         : l->ops->forward(l, r->dev, in, l->nin, &o, 0);
    if (st != CLG_OK)
        return clg_net_layer_fail(clg_dev_err(r->dev), st, d->net, l, "decode");
    *fout = o;
    if (half_out)
        CLG_TRY((r->work[i].fchain ? clg_cvt_f32_to_f16_keep : clg_cvt_f32_to_f16)(r->dev, o.mem, o.off, oh.mem,
                                                                                oh.off, clg_tensor_numel(&o)));
    return CLG_OK;
}

clg_status clg_decoder_step(clg_decoder *d, const int *ids, int n, int pos0, float *logits)
{
    clg_replica *r = d->rep;
    clg_err *err = clg_dev_err(r->dev);
    if (n < 1 || pos0 < 0 || pos0 + n > d->context)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "decode: positions %d..%d outside the context of %d", pos0,
                           pos0 + n - 1, d->context);
    if (pos0 != 0 && pos0 != d->pos)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "decode: position %d does not follow the %d positions fed", pos0,
                           d->pos);
    d->pos = 0; /* until this step is complete */
    /* host_ids is not touched again before the blocking read below */
    for (int i = 0; i < n; i++)
        d->host_ids[i] = (float)ids[i];
    cl_int e = clEnqueueWriteBuffer(r->dev->queue, d->ids, CL_FALSE, 0, (size_t)n * sizeof(float), d->host_ids, 0,
                                    NULL, NULL);
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "uploading token ids", __FILE__, __LINE__);
    clg_tensor last = {0};
    for (int i = 0; i <= d->logits; i++) {
        if (r->layers[i].fused_into) /* fuse.c: computed by an earlier layer */
            continue;
        CLG_TRY(step_layer(d, i, n, pos0, &last));
    }
    const clg_tensor *t = &last; /* fp32 (fp16: the working output, before it was stored in half) */
    e = clEnqueueReadBuffer(r->dev->queue, t->mem, CL_TRUE, (t->off + (size_t)(n - 1) * d->vocab) * sizeof(float),
                            (size_t)d->vocab * sizeof(float), logits, 0, NULL, NULL);
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "reading the logits", __FILE__, __LINE__);
    d->pos = pos0 + n;
    return CLG_OK;
}
