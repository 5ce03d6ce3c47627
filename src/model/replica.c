/* Replica lifecycle: one instance of a network on a device (layers,
 * parameters, planned activations, parameter arena), its parameter lists,
 * and the per-layer profile (option profile, CLGRAD_PROFILE). */
#include <stdlib.h>
#include <string.h>

#include "model/network_impl.h"

clg_status clg_replica_create(clg_net *net, clg_device *dev, uint64_t seed, clg_replica **out)
{
    return clg_replica_create_range(net, dev, seed, 0, net->nlayers - 1, 0, out);
}

/* A stage: a layer outside [first, last] has no parameters (its init only
 * drew their random numbers, draw_only, so the stage's own match a whole
 * replica's). */
static void drop_outside(clg_replica *r, int i)
{
    clg_layer *l = &r->layers[i];
    if (i >= r->first && i <= r->last)
        return;
    for (int p = 0; p < l->nparams; p++) {
        clg_buf_release(r->dev, l->params[p].value);
        clg_buf_release(r->dev, l->params[p].grad);
        l->params[p].value = l->params[p].grad = NULL;
    }
    l->nparams = 0;
}

clg_status clg_replica_create_range(clg_net *net, clg_device *dev, uint64_t seed, int first, int last, int batch,
                                    clg_replica **out)
{
    *out = NULL;
    if (first < 0 || last >= net->nlayers || first > last)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "replica of layers [%d, %d] of %d", first, last,
                           net->nlayers);
    clg_err *err = clg_dev_err(dev);
    clg_replica *r = calloc(1, sizeof *r);
    if (!r)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory creating a replica");
    r->net = net;
    r->dev = dev;
    r->nlayers = net->nlayers;
    r->first = first;
    r->last = last;
    r->batch = batch > 0 ? batch : net->batch;
    r->loss_index = net->loss_index;
    r->layers = calloc((size_t)net->nlayers, sizeof *r->layers);
    r->act = calloc((size_t)net->nlayers, sizeof *r->act);
    r->dact = calloc((size_t)net->nlayers, sizeof *r->dact);
    clg_status st = (r->layers && r->act && r->dact) ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = clg_net_instantiate(err, net, r->layers, r->batch, 0);
    clg_rng rng;
    clg_rng_seed(&rng, seed, 0x6e6574ULL);
    for (int i = 0; i < r->nlayers && st == CLG_OK; i++) {
        clg_layer *l = &r->layers[i];
        l->draw_only = i < first || i > last; /* another stage's: the same draws, no device memory */
        st = l->ops->init(l, dev, &rng);
        l->draw_only = 0;
        if (st != CLG_OK)
            st = clg_net_layer_fail(err, st, net, l, "init");
        else
            drop_outside(r, i);
    }
    r->fp16 = net->fp16;
    if (st == CLG_OK)
        clg_replica_fuse(r);
    if (st == CLG_OK && r->fp16 && !(r->work = calloc((size_t)r->nlayers, sizeof *r->work)))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = clg_replica_plan_memory(r, 0, !r->fp16, 0, &r->fp32_bytes);
    r->planned_bytes = r->fp32_bytes;
    if (st == CLG_OK && r->fp16) {
        /* NVIDIA's OpenCL driver (580.159) crashes releasing some activation
         * sub-buffers of an fp16 arena (no double release, parent alive:
         * docs/benchmarks.md, the H100 section): separate buffers there */
        int mode = (int)dev->ctx->opts.act_arena - 1; /* auto,0,1 -> -1,0,1 */
        int arena = mode >= 0 ? mode : clg_device_vendor(dev) != CLG_VENDOR_NVIDIA;
        st = clg_replica_plan_memory(r, 0, 0, 1, &r->fp32_offset_bytes);
        if (st == CLG_OK)
            st = clg_replica_plan_memory(r, 1, 1, arena, &r->planned_bytes);
    }
    if (st == CLG_OK)
        clg_replica_fuse_alias(r);
    if (st == CLG_OK && r->fp16)
        st = clg_replica_setup_fp16(r);
    if (st == CLG_OK)
        st = clg_replica_arena(r, NULL, 0);
    if (st == CLG_OK && dev->ctx->opts.profile) {
        r->profile = 1;
        r->prof_fwd = calloc((size_t)r->nlayers, sizeof(double));
        r->prof_bwd = calloc((size_t)r->nlayers, sizeof(double));
        r->prof_fwd_k = calloc((size_t)r->nlayers, sizeof(double));
        r->prof_bwd_k = calloc((size_t)r->nlayers, sizeof(double));
        r->prof_fwd_n = calloc((size_t)r->nlayers, sizeof(long));
        r->prof_bwd_n = calloc((size_t)r->nlayers, sizeof(long));
        if (!r->prof_fwd || !r->prof_bwd || !r->prof_fwd_k || !r->prof_bwd_k || !r->prof_fwd_n || !r->prof_bwd_n)
            r->profile = 0;
        dev->kprof = r->profile;
    }
    r->input.n = r->batch;
    r->input.c = net->in_c;
    r->input.h = net->in_h;
    r->input.w = net->in_w;
    if (st != CLG_OK) {
        clg_replica_free(r);
        return st;
    }
    clg_log(2, "replica on device %d: activations %.2f MiB planned vs %.2f MiB naive (%d buffers)%s", dev->index,
            r->planned_bytes / 1048576.0, r->naive_bytes / 1048576.0, r->nslots, r->fp16 ? ", fp16 storage" : "");
    *out = r;
    return CLG_OK;
}

void clg_replica_free(clg_replica *r)
{
    if (!r)
        return;
    if (r->dev)
        clFinish(r->dev->queue);
    clg_replica_arena_free(r);
    clg_net_destroy_layers(r->layers, r->nlayers, r->dev);
    free(r->layers);
    for (int i = 0; i < r->nsubs; i++) /* before their arena */
        clReleaseMemObject(r->subs[i]);
    free(r->subs);
    for (int s = 0; s < r->nslots; s++)
        clg_buf_release(r->dev, r->slots[s]);
    for (int k = 0; k < CLG_MAX_INPUTS; k++)
        clg_buf_release(r->dev, r->scratch[k]);
    free(r->work); /* slots of the plan, released above */
    for (int i = 0; i < r->nlayers * CLG_MAX_PARAMS; i++) {
        if (r->master)
            clg_buf_release(r->dev, r->master[i]);
        if (r->w16)
            clg_buf_release(r->dev, r->w16[i]);
    }
    free(r->master);
    free(r->w16);
    free(r->slots);
    free(r->slot_bytes);
    free(r->act);
    free(r->dact);
    free(r->prof_fwd);
    free(r->prof_bwd);
    free(r->prof_fwd_k);
    free(r->prof_bwd_k);
    free(r->prof_fwd_n);
    free(r->prof_bwd_n);
    free(r);
}

// ---- parameters ----

clg_status clg_replica_params(clg_replica *r, int trainable_only, clg_param_ref **refs, int *n)
{
    int cnt = 0;
    for (int i = 0; i < r->nlayers; i++)
        for (int p = 0; p < r->layers[i].nparams; p++)
            if (!trainable_only || r->layers[i].params[p].trainable)
                cnt++;
    *refs = calloc((size_t)CLG_MAX(cnt, 1), sizeof **refs);
    if (!*refs)
        return clg_err_set(clg_dev_err(r->dev), CLG_ERR_HOST_OOM, "out of memory");
    *n = 0;
    for (int i = 0; i < r->nlayers; i++)
        for (int p = 0; p < r->layers[i].nparams; p++)
            if (!trainable_only || r->layers[i].params[p].trainable)
                (*refs)[(*n)++] = (clg_param_ref){&r->layers[i], &r->layers[i].params[p]};
    return CLG_OK;
}

void clg_replica_params_changed(clg_replica *r)
{
    for (int i = 0; i < r->nlayers; i++)
        if (r->layers[i].ops->params_changed)
            r->layers[i].ops->params_changed(&r->layers[i]);
}

// ---- profiling ----

void clg_replica_profile_reset(clg_replica *r)
{
    if (!r || !r->profile)
        return;
    for (int i = 0; i < r->nlayers; i++) {
        r->prof_fwd[i] = r->prof_bwd[i] = r->prof_fwd_k[i] = r->prof_bwd_k[i] = 0;
        r->prof_fwd_n[i] = r->prof_bwd_n[i] = 0;
    }
    r->prof_calls = 0;
}

void clg_replica_profile_feedback(clg_replica *r)
{
    if (!r || !r->profile || r->prof_calls == 0)
        return;
    for (int i = 0; i < r->nlayers; i++)
        if (r->layers[i].ops->profiled)
            r->layers[i].ops->profiled(&r->layers[i], r->dev, r->prof_fwd_k[i] / r->prof_calls,
                                       r->prof_bwd_k[i] / r->prof_calls, r->prof_calls);
}

void clg_replica_print_profile(const clg_replica *r, FILE *f)
{
    if (!r->profile || r->prof_calls == 0)
        return;
    double tf = 0, tb = 0, kf = 0, kb = 0;
    long nf = 0, nb = 0;
    for (int i = 0; i < r->nlayers; i++) {
        tf += r->prof_fwd[i];
        tb += r->prof_bwd[i];
        kf += r->prof_fwd_k[i];
        kb += r->prof_bwd_k[i];
        nf += r->prof_fwd_n[i];
        nb += r->prof_bwd_n[i];
    }
    double c = r->prof_calls;
    fprintf(f, "per-layer profile over %d steps (ms per step; each layer finished before the next; kernel = sum of\n"
               "its launches' OpenCL event times, gap = wall - kernel: launch overhead and waiting)\n", r->prof_calls);
    fprintf(f, "%-3s %-14s %-12s %8s %8s %8s %6s %8s %8s %8s %6s %7s\n", "#", "name", "type", "fwd", "kernel", "gap",
            "launch", "bwd", "kernel", "gap", "launch", "share");
    for (int i = 0; i < r->nlayers; i++)
        fprintf(f, "%-3d %-14.14s %-12.12s %8.3f %8.3f %8.3f %6.1f %8.3f %8.3f %8.3f %6.1f %6.1f%%\n", i,
                r->layers[i].name, r->layers[i].ops->type, r->prof_fwd[i] / c, r->prof_fwd_k[i] / c,
                (r->prof_fwd[i] - r->prof_fwd_k[i]) / c, r->prof_fwd_n[i] / c, r->prof_bwd[i] / c,
                r->prof_bwd_k[i] / c, (r->prof_bwd[i] - r->prof_bwd_k[i]) / c, r->prof_bwd_n[i] / c,
                100 * (r->prof_fwd[i] + r->prof_bwd[i]) / (tf + tb > 0 ? tf + tb : 1));
    fprintf(f, "total: forward %.3f ms (kernels %.3f, gaps %.3f, %.1f launches), backward %.3f ms (kernels %.3f, "
               "gaps %.3f, %.1f launches) per step\n",
            tf / c, kf / c, (tf - kf) / c, nf / c, tb / c, kb / c, (tb - kb) / c, nb / c);
}
