/* [activation]: type=relu|leaky|sigmoid|tanh|gelu|gelu_tanh, alpha=0.01 (leaky);
 * sequences (N, T, C) pass through as sequences. */
#include <stdlib.h>

#include "model/layers.h"

typedef struct {
    clg_act act;
    float alpha;
} act_priv;

static clg_status act_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(act_priv)));
    act_priv *p = l->priv;
    return clg_layer_read_act(err, cfg, sec, "type", NULL, 0, &p->act, &p->alpha);
}

static clg_status act_setup(clg_layer *l, clg_err *err) { return clg_layer_setup_pointwise(l, err); }

static clg_status act_init(clg_layer *l, clg_device *dev, clg_rng *rng) { return CLG_OK; }

static clg_status act_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                              int training)
{
    act_priv *p = l->priv;
    return clg_nn_act_forward(dev, p->act, p->alpha, clg_tensor_numel(&in[0]), in[0].mem, in[0].off, out->mem,
                              out->off);
}

static clg_status act_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                               const clg_tensor *dout, clg_tensor *din)
{
    act_priv *p = l->priv;
    if (!din[0].mem)
        return CLG_OK;
    return clg_nn_act_backward(dev, p->act, p->alpha, clg_tensor_numel(&in[0]), in[0].mem, in[0].off, out->mem,
                               out->off, dout->mem, dout->off, din[0].mem, din[0].off);
}

int clg_layer_activation_is_relu(const clg_layer *l)
{
    return l->ops == &clg_layer_activation_ops && l->priv && ((const act_priv *)l->priv)->act == CLG_ACT_RELU;
}

const clg_layer_ops clg_layer_activation_ops = {
    .type = "activation",
    .configure = act_configure,
    .setup = act_setup,
    .init = act_init,
    .forward = act_forward,
    .backward = act_backward,
};
