/* Structural layers.
 * [flatten]: (N, C, H, W) -> (N, C*H*W, 1, 1) (a copy).
 * [add]: residual sum of >= 2 inputs of equal shapes; backward hands dout
 *   to every input.
 * [concat]: channel concatenation of >= 2 inputs with equal N, H, W, in the
 *   order of `input`; backward slices dout back. */
#include <stdlib.h>

#include "model/layers.h"

static clg_status none_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    return CLG_OK;
}

static clg_status none_init(clg_layer *l, clg_device *dev, clg_rng *rng) { return CLG_OK; }

/* ---- flatten ---- */

static clg_status flatten_setup(clg_layer *l, clg_err *err)
{
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    long long f = (long long)s[1] * s[2] * s[3];
    if (f > (1LL << 30))
        return clg_err_set(err, CLG_ERR_SHAPE, "flatten: %lld features is too many", f);
    l->out_shape[0] = s[0];
    l->out_shape[1] = (int)f;
    l->out_shape[2] = l->out_shape[3] = 1;
    l->nparams = 0;
    l->flops = 0;
    return CLG_OK;
}

static clg_status flatten_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                  int training)
{
    return clg_nn_copy(dev, clg_tensor_numel(&in[0]), in[0].mem, in[0].off, out->mem, out->off);
}

static clg_status flatten_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin,
                                   const clg_tensor *out, const clg_tensor *dout, clg_tensor *din)
{
    if (!din[0].mem)
        return CLG_OK;
    return clg_nn_copy(dev, clg_tensor_numel(&in[0]), dout->mem, dout->off, din[0].mem, din[0].off);
}

const clg_layer_ops clg_layer_flatten_ops = {
    .type = "flatten",
    .configure = none_configure,
    .setup = flatten_setup,
    .init = none_init,
    .forward = flatten_forward,
    .backward = flatten_backward,
};

/* ---- add ---- */

static clg_status add_setup(clg_layer *l, clg_err *err)
{
    CLG_TRY(clg_layer_check_nin(l, err, 2, CLG_MAX_INPUTS));
    for (int i = 1; i < l->nin; i++)
        for (int d = 0; d < 4; d++)
            if (l->in_shape[i][d] != l->in_shape[0][d])
                return clg_err_set(err, CLG_ERR_SHAPE,
                                   "add needs equal input shapes: input 0 is %dx%dx%dx%d, input %d is %dx%dx%dx%d",
                                   l->in_shape[0][0], l->in_shape[0][1], l->in_shape[0][2], l->in_shape[0][3], i,
                                   l->in_shape[i][0], l->in_shape[i][1], l->in_shape[i][2], l->in_shape[i][3]);
    for (int i = 1; i < l->nin; i++)
        if (l->in_seq[i] != l->in_seq[0])
            return clg_err_set(err, CLG_ERR_SHAPE, "add mixes a sequence (N, T, C) with a non-sequence input (%d and 0)",
                               i);
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = l->in_shape[0][d];
    l->out_seq = l->in_seq[0];
    l->nparams = 0;
    const int *s = l->in_shape[0];
    l->flops = (double)(l->nin - 1) * s[0] * s[1] * s[2] * s[3];
    return CLG_OK;
}

static clg_status add_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                              int training)
{
    size_t n = clg_tensor_numel(&in[0]);
    CLG_TRY(clg_nn_add(dev, n, in[0].mem, in[0].off, in[1].mem, in[1].off, out->mem, out->off));
    for (int i = 2; i < nin; i++)
        CLG_TRY(clg_nn_add_acc(dev, n, in[i].mem, in[i].off, out->mem, out->off));
    return CLG_OK;
}

static clg_status add_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                               const clg_tensor *dout, clg_tensor *din)
{
    size_t n = clg_tensor_numel(&in[0]);
    for (int i = 0; i < nin; i++)
        if (din[i].mem)
            CLG_TRY(clg_nn_copy(dev, n, dout->mem, dout->off, din[i].mem, din[i].off));
    return CLG_OK;
}

const clg_layer_ops clg_layer_add_ops = {
    .type = "add",
    .configure = none_configure,
    .setup = add_setup,
    .init = none_init,
    .forward = add_forward,
    .backward = add_backward,
};

/* ---- concat ---- */

static clg_status concat_setup(clg_layer *l, clg_err *err)
{
    CLG_TRY(clg_layer_check_nin(l, err, 2, CLG_MAX_INPUTS));
    long long c = 0;
    for (int i = 0; i < l->nin; i++) {
        const int *s = l->in_shape[i];
        if (s[0] != l->in_shape[0][0] || s[2] != l->in_shape[0][2] || s[3] != l->in_shape[0][3])
            return clg_err_set(err, CLG_ERR_SHAPE,
                               "concat needs equal N, H, W: input 0 is %dx%dx%dx%d, input %d is %dx%dx%dx%d",
                               l->in_shape[0][0], l->in_shape[0][1], l->in_shape[0][2], l->in_shape[0][3], i, s[0],
                               s[1], s[2], s[3]);
        c += s[1];
    }
    if (c > (1LL << 30))
        return clg_err_set(err, CLG_ERR_SHAPE, "concat: %lld channels is too many", c);
    l->out_shape[0] = l->in_shape[0][0];
    l->out_shape[1] = (int)c;
    l->out_shape[2] = l->in_shape[0][2];
    l->out_shape[3] = l->in_shape[0][3];
    l->nparams = 0;
    l->flops = 0;
    return CLG_OK;
}

static clg_status concat_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                 int training)
{
    size_t hw = (size_t)out->h * out->w, ctot = 0;
    for (int i = 0; i < nin; i++)
        ctot += (size_t)in[i].c;
    size_t coff = 0;
    for (int i = 0; i < nin; i++) {
        size_t len = (size_t)in[i].c * hw;
        if (!(l->in_place >> i & 1u))
            CLG_TRY(clg_nn_copy_rows(dev, len, (size_t)in[i].n, in[i].mem, in[i].off, len, out->mem,
                                     out->off + coff * hw, ctot * hw));
        coff += (size_t)in[i].c;
    }
    return CLG_OK;
}

static clg_status concat_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin,
                                  const clg_tensor *out, const clg_tensor *dout, clg_tensor *din)
{
    size_t hw = (size_t)out->h * out->w, ctot = 0;
    for (int i = 0; i < nin; i++)
        ctot += (size_t)in[i].c;
    size_t coff = 0;
    for (int i = 0; i < nin; i++) {
        size_t len = (size_t)in[i].c * hw;
        if (din[i].mem && !(l->in_place >> i & 1u))
            CLG_TRY(clg_nn_copy_rows(dev, len, (size_t)in[i].n, dout->mem, dout->off + coff * hw, ctot * hw,
                                     din[i].mem, din[i].off, len));
        coff += (size_t)in[i].c;
    }
    return CLG_OK;
}

const clg_layer_ops clg_layer_concat_ops = {
    .type = "concat",
    .configure = none_configure,
    .setup = concat_setup,
    .init = none_init,
    .forward = concat_forward,
    .backward = concat_backward,
};
