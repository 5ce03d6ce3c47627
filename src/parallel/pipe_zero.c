/* Sharded optimizer state with a pipeline (see pipe_zero.h). */
#include <stdlib.h>
#include <string.h>

#include "ops/optim_kernels.h"
#include "parallel/pipe_zero.h"

clg_status clg_pipe_zero_setup(clg_pipe *p)
{
    if (p->D < 2 || p->zero)
        return CLG_OK;
    if (p->split_layer >= 0)
        return clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED, "sharded optimizer state with a cut inside a layer "
                                                             "is not supported yet: cut after whole layers (--stages)");
    for (int s = 0; s < p->L; s++)
        if (p->st[s].opt)
            return clg_err_set(&p->ctx->err, CLG_ERR_INTERNAL, "pipeline: the optimizer state is sharded before "
                                                               "the first step only");
    clg_pipe_zero *z = calloc(1, sizeof *z);
    if (!z)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    size_t align = 128; /* each part a sub-buffer of the arenas on every device, in whole update work-groups */
    for (int l = 0; l < p->L; l++) {
        cl_uint bits = 0;
        if (clGetDeviceInfo(p->st[l].dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) ==
                CL_SUCCESS &&
            bits / 8 > align)
            align = bits / 8;
    }
    size_t ub = CLG_MAX(align, (size_t)CLG_OPTK_STEP_WG * sizeof(float)), unit = ub / sizeof(float);
    p->zero = z;
    for (int s = 0; s < p->K; s++) {
        size_t A = p->st[s].rep->arena_bytes / sizeof(float), units = A * sizeof(float) / ub;
        for (int d = 0; d < p->D; d++) {
            z->k0[s][d] = units * (size_t)d / (size_t)p->D * unit;
            z->k1[s][d] = d == p->D - 1 ? A : units * (size_t)(d + 1) / (size_t)p->D * unit;
        }
        if (!(z->host[s] = malloc(CLG_MAX(A, 1) * sizeof(float))))
            return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory for the parameter gather");
    }
    return CLG_OK;
}

void clg_pipe_zero_free(clg_pipe *p)
{
    if (!p || !p->zero)
        return;
    for (int s = 0; s < CLG_PIPE_MAX_STAGES; s++)
        free(p->zero->host[s]);
    free(p->zero);
    p->zero = NULL;
}

clg_status clg_pipe_zero_optim(clg_pipe *p, int s, const clg_hparams *hp)
{
    clg_pipe_stage *st = &p->st[s];
    if (!p->zero)
        return clg_optim_create(st->rep, hp, &st->opt);
    return clg_optim_create_shard(st->rep, hp, p->zero->k0[st->s][st->d], p->zero->k1[st->s][st->d], &st->opt);
}

/* The D replicas of stage s wait for each other; *bad: whether one of them arrived failed. */
static void stage_barrier(clg_pipe *p, int s, int failed, int *bad)
{
    clg_pipe_zero *z = p->zero;
    pthread_mutex_lock(&p->mu);
    int64_t gen = z->gen[s];
    z->bad[s] |= failed;
    if (++z->arrived[s] == p->D) {
        z->arrived[s] = 0;
        z->bad_now[s] = z->bad[s];
        z->bad[s] = 0;
        z->gen[s]++;
        pthread_cond_broadcast(&p->cv);
    }
    while (gen == z->gen[s])
        pthread_cond_wait(&p->cv, &p->mu);
    *bad = z->bad_now[s];
    pthread_mutex_unlock(&p->mu);
}

clg_status clg_pipe_zero_gather(clg_pipe *p, clg_pipe_stage *st, clg_status rc)
{
    clg_pipe_zero *z = p->zero;
    clg_err *err = clg_dev_err(st->dev);
    size_t A = st->rep->arena_bytes / sizeof(float), k0 = z->k0[st->s][st->d], k1 = z->k1[st->s][st->d];
    float *h = z->host[st->s];
    cl_mem pa = st->rep->parena;
    if (rc == CLG_OK && k1 > k0 &&
        clEnqueueReadBuffer(st->dev->queue, pa, CL_TRUE, k0 * sizeof(float), (k1 - k0) * sizeof(float), h + k0, 0,
                            NULL, NULL) != CL_SUCCESS)
        rc = clg_err_set(err, CLG_ERR_OPENCL, "reading the updated part of the parameters failed");
    int bad = 0;
    stage_barrier(p, st->s, rc != CLG_OK, &bad);
    if (rc != CLG_OK)
        return rc;
    if (bad)
        return clg_err_set(err, CLG_ERR_INTERNAL, "pipeline: the parameter gather abandoned: another replica of "
                                                  "stage %d failed its update", st->s);
    if (k0 > 0)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(st->dev->queue, pa, CL_TRUE, 0, k0 * sizeof(float), h, 0, NULL, NULL));
    if (k1 < A)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(st->dev->queue, pa, CL_TRUE, k1 * sizeof(float),
                                               (A - k1) * sizeof(float), h + k1, 0, NULL, NULL));
    return clg_replica_weights_updated(st->rep); /* fp16: the half copies of the gathered masters */
}

static int optim_index(const clg_optim *o, int layer, int slot)
{
    for (int i = 0; o && i < o->n; i++)
        if (o->refs[i].layer->index == layer && o->refs[i].param - o->refs[i].layer->params == slot)
            return i;
    return -1;
}

/* State k (0 first, 1 second) of layer li's parameter slot between tmp (the whole tensor, n floats) and the parts
 * of stage s: from every replica's (to_tmp) or into replica d's. */
static clg_status parts(clg_pipe *p, int s, int li, int slot, int k, size_t n, int to_tmp, int d, float *tmp)
{
    for (int e = to_tmp ? 0 : d; e < (to_tmp ? p->D : d + 1); e++) {
        clg_pipe_stage *st = &p->st[e * p->K + s];
        clg_optim *o = st->opt;
        int si = optim_index(o, li, slot);
        cl_mem buf = si < 0 ? NULL : k == 0 ? o->marena : o->varena;
        size_t a = buf ? st->rep->arena_off[si] / sizeof(float) : 0;
        size_t x0 = buf ? CLG_MAX(a, o->k0) : 0, x1 = buf ? CLG_MIN(a + n, o->k1) : 0;
        if (x1 <= x0)
            continue;
        clg_err *err = clg_dev_err(st->dev);
        if (to_tmp)
            CLG_CL_CHECK(err, clEnqueueReadBuffer(st->dev->queue, buf, CL_TRUE, (x0 - o->k0) * sizeof(float),
                                                  (x1 - x0) * sizeof(float), tmp + (x0 - a), 0, NULL, NULL));
        else
            CLG_CL_CHECK(err, clEnqueueWriteBuffer(st->dev->queue, buf, CL_TRUE, (x0 - o->k0) * sizeof(float),
                                                   (x1 - x0) * sizeof(float), tmp + (x0 - a), 0, NULL, NULL));
    }
    return CLG_OK;
}

clg_status clg_pipe_zero_state(clg_pipe *p, clg_optim *fo, int fi, int li, int slot, int to_full, int d, float *tmp)
{
    size_t n = fo->refs[fi].param->numel;
    clg_device *fdev = fo->rep->dev;
    clg_err *ferr = clg_dev_err(fdev);
    for (int k = 0; k < clg_optim_nstate(fo); k++) {
        cl_mem fm = k == 0 ? fo->m[fi] : fo->v[fi];
        if (!fm)
            continue;
        if (!to_full)
            CLG_CL_CHECK(ferr, clEnqueueReadBuffer(fdev->queue, fm, CL_TRUE, 0, n * sizeof(float), tmp, 0, NULL, NULL));
        CLG_TRY(parts(p, p->stage_of[li], li, slot, k, n, to_full, d, tmp));
        if (to_full)
            CLG_CL_CHECK(ferr, clEnqueueWriteBuffer(fdev->queue, fm, CL_TRUE, 0, n * sizeof(float), tmp, 0, NULL,
                                                    NULL));
    }
    return CLG_OK;
}

clg_status clg_pipe_zero_buf(clg_pipe *p, int l, int i, int k, cl_mem buf, int to_buf)
{
    clg_pipe_stage *st = &p->st[l];
    const clg_param_ref *ref = &st->opt->refs[i];
    size_t n = ref->param->numel;
    clg_err *err = clg_dev_err(st->dev);
    float *tmp = malloc(CLG_MAX(n, 1) * sizeof(float));
    if (!tmp)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status rc = CLG_OK;
    if (!to_buf && clEnqueueReadBuffer(st->dev->queue, buf, CL_TRUE, 0, n * sizeof(float), tmp, 0, NULL, NULL))
        rc = clg_err_set(err, CLG_ERR_OPENCL, "reading a checkpoint tensor back failed");
    if (rc == CLG_OK)
        rc = parts(p, st->s, ref->layer->index, (int)(ref->param - ref->layer->params), k, n, to_buf, st->d, tmp);
    if (rc == CLG_OK && to_buf &&
        clEnqueueWriteBuffer(st->dev->queue, buf, CL_TRUE, 0, n * sizeof(float), tmp, 0, NULL, NULL))
        rc = clg_err_set(err, CLG_ERR_OPENCL, "writing the gathered optimizer state failed");
    free(tmp);
    return rc;
}
