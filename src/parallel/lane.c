/* Lanes (see lane.h). */
#include <stdlib.h>
#include <string.h>

#include "parallel/lane.h"

void clg_release_event(cl_event *e)
{
    if (*e) {
        clReleaseEvent(*e);
        *e = NULL;
    }
}

clg_status clg_lane_init(clg_lane *l, int index, clg_net *net, clg_device *dev, uint64_t seed, int batch,
                         int stub)
{
    memset(l, 0, sizeof *l);
    l->index = index;
    l->dev = dev;
    clg_err *err = clg_dev_err(dev);
    if (stub)
        CLG_TRY(clg_replica_create_range(net, dev, seed, net->nlayers - 1, net->nlayers - 1, batch, &l->rep));
    else
        CLG_TRY(clg_replica_create(net, dev, seed, &l->rep));
    cl_int e = CL_SUCCESS;
    l->upq = clCreateCommandQueue(dev->cl, dev->id, CL_QUEUE_PROFILING_ENABLE, &e);
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "clCreateCommandQueue (transfer queue)", __FILE__, __LINE__);
    size_t sample = (size_t)net->in_c * net->in_h * net->in_w;
    size_t B = (size_t)CLG_MAX(batch, 1);
    size_t Y = B * (size_t)clg_net_labels_per_sample(net); /* token models: a target per position */
    for (int s = 0; s < CLG_STAGES; s++) {
        CLG_TRY(clg_buf_alloc(dev, B * sample * sizeof(float), &l->xbuf[s]));
        CLG_TRY(clg_buf_alloc(dev, Y * sizeof(int32_t), &l->ybuf[s]));
    }
    if (!(l->ready = calloc(B + 1, 1)))
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    CLG_TRY(clg_buf_alloc(dev, Y * sizeof(int32_t), &l->dummy_labels));
    return clg_buf_fill(dev, l->dummy_labels, 0, Y, 0.0f); /* int32 0 has the bits of float 0 */
}

void clg_lane_release(clg_lane *l)
{
    if (!l->dev)
        return;
    clFinish(l->dev->queue);
    if (l->upq) {
        clFinish(l->upq);
        clReleaseCommandQueue(l->upq);
    }
    for (int s = 0; s < CLG_STAGES; s++) {
        clg_release_event(&l->up_ev[s]);
        clg_release_event(&l->done_ev[s]);
        clg_buf_release(l->dev, l->xbuf[s]);
        clg_buf_release(l->dev, l->ybuf[s]);
    }
    clg_release_event(&l->wev);
    clg_release_event(&l->res_ev);
    clg_release_event(&l->mark);
    clg_buf_release(l->dev, l->dummy_labels);
    clg_buf_release(l->dev, l->dummy_x);
    clg_optim_free(l->opt);
    clg_replica_free(l->rep); /* with its arenas */
    free(l->ghost);
    free(l->shost);
    free(l->bev);
    free(l->ready);
    memset(l, 0, sizeof *l);
}

clg_status clg_lane_grad_arena(clg_lane *l, const clg_grad_layout *lay)
{
    clg_replica *r = l->rep;
    int n = 0;
    for (int i = 0; i < r->nlayers; i++)
        for (int p = 0; p < r->layers[i].nparams; p++)
            n += r->layers[i].params[p].trainable != 0;
    if (n != lay->n)
        return clg_err_set(clg_dev_err(l->dev), CLG_ERR_INTERNAL, "gradient layout mismatch");
    /* the replica's parameter and gradient arenas, laid out as every lane's */
    CLG_TRY(clg_replica_arena(r, lay->off, lay->bytes));
    l->arena = r->garena;
    return CLG_OK;
}

clg_status clg_lane_stage_wait(clg_lane *l, int s)
{
    if (l->up_ev[s]) {
        CLG_CL_CHECK(clg_dev_err(l->dev), clWaitForEvents(1, &l->up_ev[s]));
        clg_release_event(&l->up_ev[s]);
    }
    return CLG_OK;
}

clg_status clg_lane_upload(clg_lane *l, int s, const float *x, const int32_t *y, size_t sample, int off, int n)
{
    clg_err *err = clg_dev_err(l->dev);
    l->cnt[s] = n;
    l->off[s] = off;
    clg_release_event(&l->up_ev[s]);
    if (n <= 0)
        return CLG_OK;
    cl_event wait = l->done_ev[s];
    cl_event ev = NULL;
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(l->upq, l->xbuf[s], CL_FALSE, 0, (size_t)n * sample * sizeof(float),
                                           x + (size_t)off * sample, wait ? 1 : 0, wait ? &wait : NULL,
                                           y ? NULL : &ev));
    size_t lps = (size_t)clg_net_labels_per_sample(l->rep->net);
    if (y) /* the transfer queue is in order: the last write's event covers both */
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(l->upq, l->ybuf[s], CL_FALSE, 0, (size_t)n * lps * sizeof(int32_t),
                                               y + (size_t)off * lps, wait ? 1 : 0, wait ? &wait : NULL, &ev));
    l->up_ev[s] = ev;
    CLG_CL_CHECK(err, clFlush(l->upq));
    return CLG_OK;
}

clg_status clg_lane_use_stage(clg_lane *l, int s, int training, float grad_scale)
{
    if (l->up_ev[s])
        CLG_CL_CHECK(clg_dev_err(l->dev), clEnqueueBarrierWithWaitList(l->dev->queue, 1, &l->up_ev[s], NULL));
    clg_replica_set_input(l->rep, l->xbuf[s], 0);
    clg_replica_set_labels(l->rep, training >= 0 ? l->ybuf[s] : l->dummy_labels, 0, grad_scale);
    return CLG_OK;
}

clg_status clg_lane_stage_release(clg_lane *l, int s)
{
    clg_err *err = clg_dev_err(l->dev);
    clg_release_event(&l->done_ev[s]);
    CLG_CL_CHECK(err, clEnqueueMarkerWithWaitList(l->dev->queue, 0, NULL, &l->done_ev[s]));
    CLG_CL_CHECK(err, clFlush(l->dev->queue));
    return CLG_OK;
}
