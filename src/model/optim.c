/* Optimizers, gradient clipping and LR schedules (launches: ops/optim_kernels.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/optim.h"
#include "ops/optim_kernels.h"

#define SUMSQ_MAX_GROUPS 16
#define ARENA_GROUPS 64 /* partial sums of the one-launch norm over the arena */

static const char *const opt_names[] = {"sgd", "adam", "adamw"};
static const char *const sched_names[] = {"none", "step", "cosine"};

const char *clg_optim_name(int optimizer)
{
    return optimizer >= 0 && optimizer < 3 ? opt_names[optimizer] : "?";
}

int clg_optim_parse(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, opt_names[i]) == 0)
            return i;
    return -1;
}

const char *clg_sched_name(int schedule)
{
    return schedule >= 0 && schedule < 3 ? sched_names[schedule] : "?";
}

int clg_sched_parse(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, sched_names[i]) == 0)
            return i;
    return -1;
}

double clg_sched_lr(const clg_hparams *hp, int64_t step, int64_t steps_per_epoch, int64_t total_steps)
{
    double lr = hp->learning_rate;
    if (steps_per_epoch < 1)
        steps_per_epoch = 1;
    switch (hp->schedule) {
    case CLG_SCHED_STEP: {
        double epoch = (double)(step / steps_per_epoch);
        lr *= pow(hp->gamma, floor(epoch / hp->step_size));
        break;
    }
    case CLG_SCHED_COSINE: {
        int64_t w = hp->warmup;
        int64_t span = total_steps - w;
        if (span > 0 && step >= w) {
            double p = (double)(step - w) / (double)span;
            if (p > 1)
                p = 1;
            lr *= 0.5 * (1.0 + cos(M_PI * p));
        }
        break;
    }
    default:
        break;
    }
    if (hp->warmup > 0 && step < hp->warmup)
        lr *= (double)(step + 1) / (double)hp->warmup;
    return lr;
}

int clg_optim_nstate(const clg_optim *o)
{
    if (o->hp.optimizer == CLG_OPT_SGD)
        return o->hp.momentum != 0 ? 1 : 0;
    return 2;
}

static clg_status zero_buf(clg_device *dev, cl_mem m, size_t bytes)
{
    return clg_buf_fill(dev, m, 0, bytes / sizeof(float), 0.0f);
}

/* Whether rep's parameters and gradients are the sub-buffers of its arenas
 * (clg_replica_arena) in refs order, so one launch can cover them all. */
static int arena_usable(clg_optim *o)
{
    clg_replica *r = o->rep;
    if (!r->parena || !r->garena || r->narena != o->n || r->arena_bytes / sizeof(float) > INT32_MAX)
        return 0;
    for (int i = 0; i < o->n; i++)
        if (o->refs[i].param->numel > 0 &&
            (o->refs[i].param->grad != r->gsub[i] || clg_replica_master(r, &o->refs[i]) != r->psub[i]))
            return 0;
    return 1;
}

int clg_optim_param_decays(const clg_hparams *hp, const clg_param_ref *ref)
{
    if (!hp->decay_matrices_only)
        return 1;
    const char *type = ref->layer->ops ? ref->layer->ops->type : "";
    return ref->param->ndim >= 2 && strcmp(type, "embedding") != 0 && strcmp(type, "posembed") != 0;
}

/* hp.decay_matrices_only over the arena: a byte per float, 1 where the parameter decays. */
static clg_status decay_mask(clg_optim *o)
{
    clg_replica *r = o->rep;
    clg_device *dev = r->dev;
    size_t n = r->arena_bytes / sizeof(float);
    uint8_t *h = calloc(n ? n : 1, 1);
    if (!h)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "out of memory (decay mask)");
    for (int i = 0; i < o->n; i++)
        if (clg_optim_param_decays(&o->hp, &o->refs[i]))
            memset(h + r->arena_off[i] / sizeof(float), 1, o->refs[i].param->numel);
    clg_status st = clg_buf_alloc(dev, n ? n : 1, &o->decay_mask);
    cl_int e = st == CLG_OK ? clEnqueueWriteBuffer(dev->queue, o->decay_mask, CL_TRUE, 0, n ? n : 1, h, 0, NULL, NULL)
                            : CL_SUCCESS;
    free(h);
    if (e != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(dev), e, "clEnqueueWriteBuffer (decay mask)", __FILE__, __LINE__);
    return st;
}

/* A zeroed state arena laid out like the parameters, a sub-buffer per parameter in sub[]. */
static clg_status state_arena(clg_optim *o, cl_mem *arena, cl_mem *sub)
{
    clg_replica *r = o->rep;
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    cl_int e = CL_SUCCESS;
    CLG_TRY(clg_mem_charge(dev, r->arena_bytes, "optimizer state"));
    *arena = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, r->arena_bytes, NULL, &e);
    if (e != CL_SUCCESS) {
        clg_mem_uncharge(dev, r->arena_bytes);
        return clg_cl_fail(err, e, "clCreateBuffer (optimizer state arena)", __FILE__, __LINE__);
    }
    for (int i = 0; i < o->n; i++) {
        size_t nb = o->refs[i].param->numel * sizeof(float);
        if (nb == 0)
            continue;
        cl_buffer_region reg = {r->arena_off[i], nb};
        sub[i] = clCreateSubBuffer(*arena, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
        if (e != CL_SUCCESS)
            return clg_cl_fail(err, e, "clCreateSubBuffer (optimizer state arena)", __FILE__, __LINE__);
    }
    /* zeroed after the sub-buffers exist: oclgrind forgets the initialised
     * state of a region when a sub-buffer over it is created */
    return zero_buf(dev, *arena, r->arena_bytes);
}

/* The state arenas of a shard: (k1 - k0) floats each, zeroed; no per-tensor sub-buffers. */
static clg_status shard_arenas(clg_optim *o, int ns)
{
    clg_replica *r = o->rep;
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    size_t bytes = (o->k1 - o->k0) * sizeof(float);
    if (bytes == 0)
        return CLG_OK;
    cl_int e = CL_SUCCESS;
    cl_buffer_region reg = {o->k0 * sizeof(float), bytes};
    o->psh = clCreateSubBuffer(r->parena, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
    if (e == CL_SUCCESS)
        o->gsh = clCreateSubBuffer(r->garena, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "clCreateSubBuffer (optimizer shard)", __FILE__, __LINE__);
    cl_mem *arenas[2] = {&o->marena, &o->varena};
    for (int a = 0; a < ns && a < 2; a++) {
        CLG_TRY(clg_mem_charge(dev, bytes, "optimizer state"));
        *arenas[a] = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (e != CL_SUCCESS) {
            clg_mem_uncharge(dev, bytes);
            return clg_cl_fail(err, e, "clCreateBuffer (optimizer state shard)", __FILE__, __LINE__);
        }
        CLG_TRY(zero_buf(dev, *arenas[a], bytes));
    }
    return CLG_OK;
}

static clg_status create(clg_replica *rep, const clg_hparams *hp, int shard, size_t k0, size_t k1, clg_optim **out)
{
    *out = NULL;
    clg_device *dev = rep->dev;
    clg_err *err = clg_dev_err(dev);
    clg_optim *o = calloc(1, sizeof *o);
    if (!o)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    o->hp = *hp;
    o->rep = rep;
    o->shard = shard;
    o->k0 = k0;
    o->k1 = k1;
    clg_status st = clg_replica_params(rep, 1, &o->refs, &o->n);
    if (st == CLG_OK) {
        o->m = calloc((size_t)CLG_MAX(o->n, 1), sizeof(cl_mem));
        o->v = calloc((size_t)CLG_MAX(o->n, 1), sizeof(cl_mem));
        if (!o->m || !o->v)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    int ns = clg_optim_nstate(o);
    if (st == CLG_OK)
        o->arena = arena_usable(o);
    o->per_tensor = !o->arena || dev->ctx->opts.optim_per_tensor;
    if (st == CLG_OK && shard && (o->per_tensor || k0 > k1 || k1 * sizeof(float) > rep->arena_bytes))
        st = clg_err_set(err, CLG_ERR_UNSUPPORTED,
                         "sharded optimizer state needs the one-launch parameter arena (not per-tensor updates, "
                         "optim_per_tensor) and a slice inside it");
    if (st == CLG_OK && shard)
        st = shard_arenas(o, ns);
    if (o->arena && !shard) {
        if (ns >= 1 && st == CLG_OK)
            st = state_arena(o, &o->marena, o->m);
        if (ns >= 2 && st == CLG_OK)
            st = state_arena(o, &o->varena, o->v);
        if (hp->decay_matrices_only && hp->weight_decay != 0 && st == CLG_OK)
            st = decay_mask(o);
    }
    for (int i = 0; i < o->n && st == CLG_OK && !o->arena; i++) {
        size_t bytes = o->refs[i].param->numel * sizeof(float);
        if (ns >= 1) {
            st = clg_buf_alloc(dev, bytes, &o->m[i]);
            if (st == CLG_OK)
                st = zero_buf(dev, o->m[i], bytes);
        }
        if (ns >= 2 && st == CLG_OK) {
            st = clg_buf_alloc(dev, bytes, &o->v[i]);
            if (st == CLG_OK)
                st = zero_buf(dev, o->v[i], bytes);
        }
    }
    o->groups = SUMSQ_MAX_GROUPS;
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, CLG_MAX((size_t)CLG_MAX(o->n, 1) * o->groups, (size_t)ARENA_GROUPS) * sizeof(float),
                           &o->partial);
    if (st != CLG_OK) {
        clg_optim_free(o);
        return st;
    }
    *out = o;
    return CLG_OK;
}

clg_status clg_optim_create(clg_replica *rep, const clg_hparams *hp, clg_optim **out)
{
    return create(rep, hp, 0, 0, 0, out);
}

clg_status clg_optim_create_shard(clg_replica *rep, const clg_hparams *hp, size_t k0, size_t k1, clg_optim **out)
{
    return create(rep, hp, 1, k0, k1, out);
}

uint64_t clg_optim_state_bytes(const clg_optim *o)
{
    if (!o)
        return 0;
    int ns = clg_optim_nstate(o);
    if (o->shard)
        return (uint64_t)ns * (o->k1 - o->k0) * sizeof(float);
    if (o->arena)
        return (uint64_t)ns * o->rep->arena_bytes;
    uint64_t b = 0;
    for (int i = 0; i < o->n; i++)
        b += (uint64_t)ns * clg_pool_class(o->refs[i].param->numel * sizeof(float));
    return b;
}

void clg_optim_free(clg_optim *o)
{
    if (!o)
        return;
    clg_device *dev = o->rep->dev;
    for (int i = 0; i < o->n; i++) {
        cl_mem b[2] = {o->m ? o->m[i] : NULL, o->v ? o->v[i] : NULL};
        for (int k = 0; k < 2; k++) {
            if (b[k] && o->arena)
                clReleaseMemObject(b[k]); /* a sub-buffer */
            else
                clg_buf_release(dev, b[k]);
        }
    }
    size_t sbytes = o->shard ? (o->k1 - o->k0) * sizeof(float) : o->rep->arena_bytes;
    if (o->marena) {
        clReleaseMemObject(o->marena);
        clg_mem_uncharge(dev, sbytes);
    }
    if (o->varena) {
        clReleaseMemObject(o->varena);
        clg_mem_uncharge(dev, sbytes);
    }
    if (o->psh)
        clReleaseMemObject(o->psh);
    if (o->gsh)
        clReleaseMemObject(o->gsh);
    clg_buf_release(dev, o->partial);
    clg_buf_release(dev, o->flag);
    clg_buf_release(dev, o->decay_mask);
    free(o->m);
    free(o->v);
    free(o->refs);
    free(o);
}

clg_status clg_optim_grad_norm(clg_optim *o, float gscale, double *norm)
{
    clg_device *dev = o->rep->dev;
    clg_err *err = clg_dev_err(dev);
    *norm = 0;
    if (o->n == 0)
        return CLG_OK;
    size_t total = (size_t)o->n * o->groups;
    if (!o->per_tensor) { /* one launch over the gradient arena (its padding is zero) */
        int groups = 0;
        CLG_TRY(clg_optk_sumsq_partial(dev, o->rep->garena, (int)(o->rep->arena_bytes / sizeof(float)), o->partial, 0,
                                       ARENA_GROUPS, &groups));
        total = (size_t)groups;
    }
    for (int i = 0; i < o->n && o->per_tensor; i++) {
        clg_param *p = o->refs[i].param;
        int off = i * o->groups, groups = 0;
        CLG_TRY(clg_optk_sumsq_partial(dev, p->grad, (int)p->numel, o->partial, off, o->groups, &groups));
        /* unused group slots must read as zero */
        if (groups < o->groups)
            CLG_TRY(clg_buf_fill(dev, o->partial, (size_t)(off + groups), (size_t)(o->groups - groups), 0.0f));
    }
    float *host = malloc(total * sizeof(float));
    if (!host)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    cl_int e = clEnqueueReadBuffer(dev->queue, o->partial, CL_TRUE, 0, total * sizeof(float), host, 0, NULL, NULL);
    if (e != CL_SUCCESS) {
        free(host);
        return clg_cl_fail(err, e, "read gradient norm partials", __FILE__, __LINE__);
    }
    double s = 0;
    for (size_t i = 0; i < total; i++)
        s += host[i];
    free(host);
    *norm = sqrt(s) * fabs((double)gscale);
    return CLG_OK;
}

clg_status clg_optim_unscale_check(clg_optim *o, float inv_scale, int *overflow)
{
    clg_device *dev = o->rep->dev;
    clg_err *err = clg_dev_err(dev);
    *overflow = 0;
    if (!o->flag)
        CLG_TRY(clg_buf_alloc(dev, sizeof(cl_int), &o->flag));
    cl_int flag = 0;
    CLG_TRY(clg_buf_fill(dev, o->flag, 0, 1, 0.0f)); /* int 0 has the bits of float 0 */
    for (int i = 0; i < (o->per_tensor ? o->n : 1); i++) { /* arena: one launch over all gradients */
        clg_param *p = o->refs[i].param;
        int n = o->per_tensor ? (int)p->numel : (int)(o->rep->arena_bytes / sizeof(float));
        cl_mem g = o->per_tensor ? p->grad : o->rep->garena;
        CLG_TRY(clg_optk_unscale_check(dev, g, n, inv_scale, o->flag));
    }
    CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, o->flag, CL_TRUE, 0, sizeof flag, &flag, 0, NULL, NULL));
    *overflow = flag != 0;
    return CLG_OK;
}

/* Parameter i's (or, i == -1, the whole arena's) weights, gradient and state. */
static int optim_bufs(clg_optim *o, int i, cl_mem *w, cl_mem *g, cl_mem *m, cl_mem *v)
{
    if (i < 0 && o->shard) {
        *w = o->psh, *g = o->gsh, *m = o->marena, *v = o->varena;
        return (int)(o->k1 - o->k0);
    }
    if (i < 0) {
        *w = o->rep->parena, *g = o->rep->garena, *m = o->marena, *v = o->varena;
        return (int)(o->rep->arena_bytes / sizeof(float));
    }
    *w = clg_replica_master(o->rep, &o->refs[i]), *g = o->refs[i].param->grad, *m = o->m[i], *v = o->v[i];
    return (int)o->refs[i].param->numel;
}

clg_status clg_optim_step(clg_optim *o, double lr, float gscale)
{
    clg_device *dev = o->rep->dev;
    o->t++;
    const clg_hparams *h = &o->hp;
    float flr = (float)lr, wd = (float)h->weight_decay;
    clg_sgd_step_args sa = {.lr = flr, .momentum = (float)h->momentum, .weight_decay = wd, .nesterov = h->nesterov,
                            .gscale = gscale};
    clg_adam_step_args aa = {.lr = flr,
                             .beta1 = (float)h->beta1,
                             .beta2 = (float)h->beta2,
                             .omb1 = (float)(1.0 - h->beta1),
                             .omb2 = (float)(1.0 - h->beta2),
                             .eps = (float)h->epsilon,
                             .weight_decay = wd,
                             .decoupled = h->optimizer == CLG_OPT_ADAMW,
                             .bc1 = (float)(1.0 - pow(h->beta1, (double)o->t)),
                             .bc2 = (float)(1.0 - pow(h->beta2, (double)o->t)),
                             .gscale = gscale};
    for (int i = 0; i < (o->per_tensor ? o->n : 1); i++) { /* arena: one launch over all parameters */
        cl_mem w, g, m, v;
        int n = optim_bufs(o, o->per_tensor ? i : -1, &w, &g, &m, &v);
        /* decay on matrices only: per tensor, its weight decay or none; over the arena, the mask */
        float wdi = o->per_tensor && !clg_optim_param_decays(h, &o->refs[i]) ? 0.0f : wd;
        sa.weight_decay = aa.weight_decay = wdi;
        sa.decay_mask = aa.decay_mask = o->per_tensor ? NULL : o->decay_mask;
        if (h->optimizer == CLG_OPT_SGD) {
            sa.w = w, sa.g = g, sa.m = m ? m : g, sa.n = n; /* m unused when momentum == 0 */
            CLG_TRY(clg_optk_sgd_step(dev, &sa));
        } else {
            aa.w = w, aa.g = g, aa.m = m, aa.v = v, aa.n = n;
            CLG_TRY(clg_optk_adam_step(dev, &aa));
        }
    }
    if (o->shard) /* the other slices arrive by the caller's gather, which then updates the copies */
        return CLG_OK;
    /* fp16: half copies of the new master weights */
    return clg_replica_weights_updated(o->rep);
}
