/* The passes of a replica: forward, backward (fp32, or fp16 storage with
 * fp32 working buffers) and the kernel-compiling precompile pass. */
#include <string.h>

#include "model/network_impl.h"
#include "ops/convert.h"
#include "ops/nn.h"

void clg_replica_set_input(clg_replica *r, cl_mem buf, size_t off)
{
    r->input.mem = buf;
    r->input.off = off;
}

void clg_replica_set_labels(clg_replica *r, cl_mem labels, size_t off, float grad_scale)
{
    if (r->loss_index < 0)
        return;
    clg_layer *l = &r->layers[r->loss_index];
    l->loss.labels = labels;
    l->loss.labels_off = off;
    l->loss.grad_scale = grad_scale;
}

/* Adds the kernel time and launches since the last take to *ms, *n (profiling). */
static void prof_kernels(clg_replica *r, double *ms, long *n)
{
    double k = 0;
    int c = 0;
    clg_kprof_take(r->dev, &k, &c);
    *ms += k;
    *n += c;
}

/* A half tensor expanded into an fp32 working buffer (same shape, off 0). */
static clg_status expand(clg_device *dev, const clg_tensor *h, cl_mem buf, clg_tensor *out)
{
    clg_tensor src = *h; /* out may alias h */
    *out = src;
    out->mem = buf;
    out->off = 0;
    return clg_cvt_f16_to_f32(dev, src.mem, src.off, buf, 0, clg_tensor_numel(&src));
}

/* Whether a layer of the replica's range reads the network input. */
static int reads_input(const clg_replica *r)
{
    for (int i = r->first; i <= r->last; i++)
        for (int k = 0; k < r->layers[i].nin; k++)
            if (r->layers[i].inputs[k] < 0)
                return 1;
    return 0;
}

clg_status clg_replica_forward(clg_replica *r, int n, int training)
{
    clg_err *err = clg_dev_err(r->dev);
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "forward: batch %d outside [1, %d]", n, r->batch);
    if (!r->input.mem && reads_input(r))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "forward: no input set");
    if (r->profile) { /* launches before the forward pass (uploads, fills) are not a layer's */
        clFinish(r->dev->queue);
        clg_kprof_take(r->dev, NULL, NULL);
    }
    for (int i = r->first; i <= r->last; i++) {
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS];
        double t0 = r->profile ? clg_now_sec() : 0;
        if (l->fused_into) { /* computed by the batch norm it was fused into (fuse.c) */
            if (r->after_layer)
                CLG_TRY(r->after_layer(r->after_layer_user, i, 0));
            continue;
        }
        int half_out = r->fp16 && i != r->nlayers - 1;
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = clg_tensor_with_n(src < 0 ? &r->input : &r->act[src], n);
            if (!r->fp16 || src < 0)
                continue;
            if (src == i - 1 && r->work[src].fchain) { /* the previous output, still in fp32 */
                in[k].mem = r->work[src].f_out;
                in[k].off = 0;
            } else { /* stored in half: expand into fp32 */
                CLG_TRY(expand(r->dev, &in[k], r->work[i].f_in[k], &in[k]));
            }
        }
        clg_tensor o = clg_tensor_with_n(&r->act[i], n), oh = o;
        if (half_out) {
            o.mem = r->work[i].f_out;
            o.off = 0;
        }
        clg_status st = l->ops->forward(l, r->dev, in, l->nin, &o, training);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, r->net, l, "forward");
        if (half_out && r->before_round)
            CLG_TRY(r->before_round(r->after_layer_user, i, 0, &o, 1));
        if (half_out) /* round the output to half for storage (and in place when the next layer reads it) */
            CLG_TRY((r->work[i].fchain ? clg_cvt_f32_to_f16_keep : clg_cvt_f32_to_f16)(r->dev, o.mem, o.off, oh.mem,
                                                                                    oh.off, clg_tensor_numel(&o)));
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_fwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_fwd_k[i], &r->prof_fwd_n[i]);
        }
        if (r->after_layer)
            CLG_TRY(r->after_layer(r->after_layer_user, i, 0));
    }
    if (r->profile)
        r->prof_calls++;
    return CLG_OK;
}

/* Backward in fp16 storage: each layer's inputs, output and output gradient
 * are expanded from half into the fp32 working buffers, its input gradients
 * land in fp32 and are rounded into the half gradient tensors (summed there
 * where a tensor feeds several layers). */
static clg_status backward_fp16(clg_replica *r, int n, char *written)
{
    clg_err *err = clg_dev_err(r->dev);
    int L = r->nlayers;
    for (int i = r->last; i >= r->first; i--) { /* a pipeline stage: its own layers */
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        double t0 = r->profile ? clg_now_sec() : 0;
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = clg_tensor_with_n(src < 0 ? &r->input : &r->act[src], n);
            din[k] = in[k];
            if (src < 0) {
                din[k].mem = NULL;
                continue;
            }
            CLG_TRY(expand(r->dev, &in[k], r->work[i].b_in[k], &in[k]));
            din[k].mem = r->work[i].b_din[k];
            din[k].off = 0;
        }
        clg_tensor o = clg_tensor_with_n(&r->act[i], n);
        if (i != L - 1)
            CLG_TRY(expand(r->dev, &o, r->work[i].b_out, &o));
        clg_tensor dout = clg_tensor_with_n(&r->dact[i], n);
        if (r->work[i].bchain) { /* handed over in fp32 by layer i+1 */
            dout.mem = r->work[i + 1].b_din[r->work[i].bchain_k];
            dout.off = 0;
        } else if (dout.mem) {
            CLG_TRY(expand(r->dev, &dout, r->work[i].b_dout, &dout));
        }
        clg_status st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, r->net, l, "backward");
        if (r->before_round)
            CLG_TRY(r->before_round(r->after_layer_user, i, 1, din, l->nin));
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            if (src < 0)
                continue;
            clg_tensor g = clg_tensor_with_n(&r->dact[src], n);
            if (r->work[src].bchain) { /* layer src reads it in fp32: round in place */
                CLG_TRY(clg_cvt_f32_round_f16(r->dev, din[k].mem, din[k].off, din[k].mem, din[k].off,
                                              clg_tensor_numel(&g)));
                continue;
            }
            if (written[src])
                CLG_TRY(clg_cvt_f16_add_f32(r->dev, g.mem, g.off, din[k].mem, din[k].off, clg_tensor_numel(&g)));
            else
                CLG_TRY(clg_cvt_f32_to_f16(r->dev, din[k].mem, din[k].off, g.mem, g.off, clg_tensor_numel(&g)));
            written[src] = 1;
        }
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_bwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_bwd_k[i], &r->prof_bwd_n[i]);
        }
        if (r->after_layer)
            CLG_TRY(r->after_layer(r->after_layer_user, i, 1));
    }
    return CLG_OK;
}

clg_status clg_replica_backward(clg_replica *r, int n) { return clg_replica_backward_range(r, n, NULL); }

clg_status clg_replica_backward_range(clg_replica *r, int n, const char *written_in)
{
    clg_err *err = clg_dev_err(r->dev);
    int L = r->nlayers;
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "backward: batch %d outside [1, %d]", n, r->batch);
    if (r->loss_index < 0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: the model has no loss layer (softmax or mse) to train",
                           r->net->source);
    char *written = calloc((size_t)L, 1);
    if (!written)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (written_in)
        memcpy(written, written_in, (size_t)L);
    if (r->fp16) {
        clg_status st = backward_fp16(r, n, written);
        free(written);
        return st;
    }
    clg_status st = CLG_OK;
    for (int i = r->last; i >= r->first && st == CLG_OK; i--) {
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        if (l->fused_into) { /* fuse.c: no inputs, nothing to compute */
            if (r->after_layer)
                st = r->after_layer(r->after_layer_user, i, 1);
            continue;
        }
        int pending[CLG_MAX_INPUTS]; /* din[k] went to scratch; add into dact[src] after */
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            pending[k] = 0;
            in[k] = clg_tensor_with_n(src < 0 ? &r->input : &r->act[src], n);
            if (src < 0) {
                din[k] = in[k];
                din[k].mem = NULL;
                continue;
            }
            din[k] = clg_tensor_with_n(&r->dact[src], n);
            if (written[src]) {
                size_t bytes = clg_tensor_numel(&r->dact[src]) * sizeof(float);
                if (r->scratch_bytes[k] < bytes) {
                    clg_buf_release(r->dev, r->scratch[k]);
                    r->scratch[k] = NULL;
                    r->scratch_bytes[k] = 0;
                    st = clg_buf_alloc(r->dev, bytes, &r->scratch[k]);
                    if (st != CLG_OK)
                        break;
                    r->scratch_bytes[k] = bytes;
                }
                din[k].mem = r->scratch[k];
                din[k].off = 0;
                pending[k] = 1;
            }
            written[src] = 1;
        }
        if (st != CLG_OK)
            break;
        clg_tensor o = clg_tensor_with_n(&r->act[i], n);
        clg_tensor dout = clg_tensor_with_n(&r->dact[i], n);
        double t0 = r->profile ? clg_now_sec() : 0;
        st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_bwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_bwd_k[i], &r->prof_bwd_n[i]);
        }
        if (st != CLG_OK) {
            st = clg_net_layer_fail(err, st, r->net, l, "backward");
            break;
        }
        for (int k = 0; k < l->nin && st == CLG_OK; k++)
            if (pending[k])
                st = clg_nn_add_acc(r->dev, clg_tensor_numel(&din[k]), r->scratch[k], 0, r->dact[l->inputs[k]].mem,
                                    r->dact[l->inputs[k]].off);
        if (st == CLG_OK && r->after_layer)
            st = r->after_layer(r->after_layer_user, i, 1);
    }
    free(written);
    return st;
}

/* Runs each layer's forward and backward once on zeroed inputs, the layers
 * taken from the last to the first (reverse) or first to last, so a
 * process can compile the kernels a training step launches in another
 * order than the step does (clg_session_precompile). Values are meaningless
 * afterwards (activations, gradients, batch-norm running statistics);
 * weights are not touched. fp16 storage runs the plain forward and backward
 * (its conversions chain across layers). */
clg_status clg_replica_precompile(clg_replica *r, int n, int reverse)
{
    clg_err *err = clg_dev_err(r->dev);
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "precompile: batch %d outside [1, %d]", n, r->batch);
    if (!r->input.mem)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "precompile: no input set");
    if (r->fp16 || r->loss_index < 0) {
        CLG_TRY(clg_replica_forward(r, n, 1));
        return r->loss_index < 0 ? CLG_OK : clg_replica_backward(r, n);
    }
    int L = r->nlayers;
    for (int j = 0; j < L; j++) {
        int i = reverse ? L - 1 - j : j;
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        if (l->fused_into)
            continue;
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = clg_tensor_with_n(src < 0 ? &r->input : &r->act[src], n);
            din[k] = src < 0 ? in[k] : clg_tensor_with_n(&r->dact[src], n);
            if (src < 0)
                din[k].mem = NULL;
            else /* garbage could hold denormals (slow) or NaN: zeros compute like data */
                CLG_TRY(clg_buf_fill(r->dev, in[k].mem, in[k].off, clg_tensor_numel(&in[k]), 0.0f));
        }
        clg_tensor o = clg_tensor_with_n(&r->act[i], n), dout = clg_tensor_with_n(&r->dact[i], n);
        clg_status st = l->ops->forward(l, r->dev, in, l->nin, &o, 1);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, r->net, l, "forward");
        if (dout.mem)
            CLG_TRY(clg_buf_fill(r->dev, dout.mem, dout.off, clg_tensor_numel(&dout), 0.0f));
        st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, r->net, l, "backward");
    }
    return CLG_OK;
}

const clg_tensor *clg_replica_output(const clg_replica *r) { return &r->act[r->nlayers - 1]; }
