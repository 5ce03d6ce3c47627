/* The pipeline's measured costs remembered across runs: see pipe_cost.h. */
#include "parallel/pipe_cost.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/tune.h"

#define PER_ENTRY 24 /* costs per database entry (CLG_TUNE_MAXP) */

/* A fingerprint of what a layer cost depends on besides the device: the layers (names, shapes, inputs, FLOPs),
 * the micro-batch and whether dense weight products were left out. */
static uint64_t net_key(const clg_net *net, int mb, int wdefer)
{
    uint64_t h = clg_hash64(&mb, sizeof mb, CLG_HASH_SEED);
    h = clg_hash64(&wdefer, sizeof wdefer, h);
    h = clg_hash64(&net->nlayers, sizeof net->nlayers, h);
    for (int i = 0; i < net->nlayers; i++) {
        const clg_layer *l = &net->proto[i];
        h = clg_hash_str(l->name, h);
        h = clg_hash64(l->out_shape, sizeof l->out_shape, h);
        h = clg_hash64(&l->nin, sizeof l->nin, h);
        h = clg_hash64(l->inputs, sizeof(int) * (size_t)l->nin, h);
        h = clg_hash64(&l->flops, sizeof l->flops, h);
    }
    return h;
}

static int remembering(const clg_device *dev) { return dev->ctx->use_cache && dev->ctx->opts.pipe_cost_memory; }

/* Puts e (where given) and writes the device's entries; a cache that cannot
 * be written keeps this run's figures (logged as "what not remembered") and
 * leaves the device's error as it was. */
static void keep(clg_device *dev, const clg_tune_entry *e, const char *what)
{
    clg_err saved = dev->err;
    if ((e && clg_tune_put(dev, e) != CLG_OK) || clg_tune_save(dev) != CLG_OK)
        clg_log(1, "%s not remembered: %s", what, dev->err.msg);
    dev->err = saved;
}

/* Replaces each value by the least of it and the remembered one, and remembers the result (entries key/0,
 * key/1, .., PER_ENTRY values each, named v0..). Returns how many values a remembered one lowered. */
static int least_of(clg_device *dev, const char *key, double *v, int n)
{
    int lowered = 0;
    for (int c = 0; c * PER_ENTRY < n; c++) {
        clg_tune_entry e = {0};
        snprintf(e.key, sizeof e.key, "%.48s/%d", key, c); /* keys are at most 30 characters */
        const clg_tune_entry *old = clg_tune_find(dev, e.key);
        for (int i = c * PER_ENTRY; i < n && i < (c + 1) * PER_ENTRY; i++) {
            char name[12];
            snprintf(name, sizeof name, "v%d", i - c * PER_ENTRY);
            double r = clg_tune_param(old, name, -1.0);
            if (r > 0 && r < v[i]) {
                v[i] = r;
                lowered++;
            }
            clg_tune_set(&e, name, v[i]);
        }
        if (clg_tune_put(dev, &e) != CLG_OK)
            return lowered;
    }
    keep(dev, NULL, "pipeline costs");
    return lowered;
}

void clg_pipe_cost_remember(clg_device *dev, const clg_net *net, int mb, int wdefer, double *cost)
{
    if (!remembering(dev))
        return;
    char key[64];
    snprintf(key, sizeof key, "pipe-cost/%016llx", (unsigned long long)net_key(net, mb, wdefer));
    int lowered = least_of(dev, key, cost, net->nlayers);
    clg_log(2, "pipeline: layer costs %s: %d of %d lowered to the least measured before", key, lowered,
            net->nlayers);
}

void clg_pipe_xfer_remember(clg_device *dev, size_t bytes, double *t_dev, double *t_host)
{
    if (!remembering(dev))
        return;
    char key[64];
    double t[2] = {*t_dev, *t_host};
    snprintf(key, sizeof key, "pipe-xfer/%zu", bytes);
    least_of(dev, key, t, 2);
    *t_dev = t[0];
    *t_host = t[1];
}

static void bias_key(const clg_net *net, int mb, int wdefer, char key[64])
{
    snprintf(key, 64, "pipe-bias/%016llx", (unsigned long long)net_key(net, mb, wdefer));
}

double clg_pipe_bias_get(clg_device *dev, const clg_net *net, int mb, int wdefer, int *cut)
{
    *cut = 0;
    if (!remembering(dev))
        return 0;
    char key[64];
    bias_key(net, mb, wdefer, key);
    const clg_tune_entry *e = clg_tune_find(dev, key);
    *cut = (int)clg_tune_param(e, "cut", 0.0);
    return clg_tune_param(e, "ms", 0.0);
}

void clg_pipe_bias_put(clg_device *dev, const clg_net *net, int mb, int wdefer, double ms, int cut)
{
    if (!remembering(dev) || !isfinite(ms))
        return;
    clg_tune_entry e = {0};
    bias_key(net, mb, wdefer, e.key);
    const clg_tune_entry *old = clg_tune_find(dev, e.key);
    double was = clg_tune_param(old, "ms", 0.0);
    int n = (int)clg_tune_param(old, "n", 0.0);
    clg_tune_set(&e, "ms", n ? 0.5 * (was + ms) : ms); /* the runs' figures averaged, the latest weighing most */
    clg_tune_set(&e, "n", n + 1);
    clg_tune_set(&e, "cut", cut);
    keep(dev, &e, "pipeline balance");
    clg_log(1, "pipeline: stage 1 measured %+.3f ms per micro-batch beyond the layer costs (remembered %+.3f)", ms,
            n ? 0.5 * (was + ms) : ms);
}
