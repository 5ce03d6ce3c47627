/* The [net] section of a model file: input shape, classes, batch and the
 * training defaults (clg_hparams); see network.h for the keys. */
#include <limits.h>
#include <string.h>

#include "model/network_impl.h"
#include "model/optim.h" /* the optimizer and schedule name tables */

void clg_hparams_defaults(clg_hparams *h)
{
    memset(h, 0, sizeof *h);
    h->learning_rate = 0.01;
    h->momentum = 0.9;
    h->weight_decay = 0;
    h->nesterov = 0;
    h->optimizer = CLG_OPT_SGD;
    h->beta1 = 0.9;
    h->beta2 = 0.999;
    h->epsilon = 1e-8;
    h->schedule = CLG_SCHED_NONE;
    h->step_size = 1;
    h->gamma = 0.1;
    h->warmup = 0;
    h->epochs = 10;
    h->clip_norm = 0;
}

/* An enum key whose choices are the names name_of(0), name_of(1), ... up to
 * the first "?" (the optimizer's tables: the names are kept once). */
static clg_status cfg_named(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, const char *def,
                            const char *(*name_of)(int), int *out)
{
    const char *names[9];
    int n = 0;
    while (n < 8 && strcmp(name_of(n), "?") != 0) {
        names[n] = name_of(n);
        n++;
    }
    names[n] = NULL;
    return clg_cfg_enum(err, cfg, s, key, def, names, out);
}

clg_status clg_net_parse_config(clg_err *err, clg_net *net, clg_cfg_section *s)
{
    const clg_cfg *cfg = net->cfg;
    long v;
    double d;
    int e;
    CLG_TRY(clg_cfg_int(err, cfg, s, "channels", -1, 1, 65536, &v));
    net->in_c = (int)v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "height", -1, 1, 1 << 20, &v));
    net->in_h = (int)v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "width", -1, 1, 1 << 20, &v));
    net->in_w = (int)v;
    if (net->in_c < 0 || net->in_h < 0 || net->in_w < 0)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [net] needs channels, height and width (the input shape)",
                           net->source, s->line);
    static const char *const inputs[] = {"images", "tokens", NULL};
    CLG_TRY(clg_cfg_enum(err, cfg, s, "input", "images", inputs, &e));
    net->input_tokens = e == 1;
    CLG_TRY(clg_cfg_int(err, cfg, s, "classes", 0, 0, 1 << 24, &v));
    net->classes = (int)v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "batch", 64, 1, 1 << 20, &v));
    net->batch = (int)v;
    clg_hparams *h = &net->hp;
    clg_hparams_defaults(h);
    CLG_TRY(clg_cfg_float(err, cfg, s, "learning_rate", h->learning_rate, 0, 1e3, &h->learning_rate));
    CLG_TRY(clg_cfg_float(err, cfg, s, "momentum", h->momentum, 0, 0.999999, &h->momentum));
    CLG_TRY(clg_cfg_int(err, cfg, s, "nesterov", 0, 0, 1, &v));
    h->nesterov = (int)v;
    CLG_TRY(clg_cfg_float(err, cfg, s, "weight_decay", 0, 0, 1, &h->weight_decay));
    CLG_TRY(cfg_named(err, cfg, s, "optimizer", "sgd", clg_optim_name, &e));
    h->optimizer = e;
    CLG_TRY(clg_cfg_float(err, cfg, s, "beta1", h->beta1, 0, 0.999999, &h->beta1));
    CLG_TRY(clg_cfg_float(err, cfg, s, "beta2", h->beta2, 0, 0.99999999, &h->beta2));
    CLG_TRY(clg_cfg_float(err, cfg, s, "epsilon", h->epsilon, 0, 1, &h->epsilon));
    CLG_TRY(cfg_named(err, cfg, s, "schedule", "none", clg_sched_name, &e));
    h->schedule = e;
    CLG_TRY(clg_cfg_float(err, cfg, s, "step_size", h->step_size, 1e-9, 1e9, &h->step_size));
    CLG_TRY(clg_cfg_float(err, cfg, s, "gamma", h->gamma, 0, 1, &h->gamma));
    CLG_TRY(clg_cfg_int(err, cfg, s, "warmup", 0, 0, LONG_MAX, &v));
    h->warmup = v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "epochs", h->epochs, 1, 1000000, &v));
    h->epochs = (int)v;
    CLG_TRY(clg_cfg_float(err, cfg, s, "clip_norm", 0, 0, 1e9, &d));
    h->clip_norm = d;
    CLG_TRY(clg_cfg_int(err, cfg, s, "augment_flip", 0, 0, 1, &v));
    h->augment_flip = (int)v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "augment_shift", 0, 0, CLG_HP_MAX_SHIFT, &v));
    h->augment_shift = (int)v;
    CLG_TRY(clg_cfg_int(err, cfg, s, "decay_matrices_only", 0, 0, 1, &v));
    h->decay_matrices_only = (int)v;
    return clg_cfg_check_unused(err, cfg, s);
}
