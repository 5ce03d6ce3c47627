/* Deferred weight gradients in a pipeline stage: see pipe_wdefer.h. */
#include "parallel/pipe_wdefer.h"

#include <stdlib.h>

#include "model/layers.h"
#include "ops/nn.h"

int clg_pipe_wdefer_mode(const clg_ctx *ctx, const clg_pipe_params *pp, int T)
{
    if (T > 1)
        return 0;
    if (pp->wdefer)
        return CLG_MAX(pp->wdefer, 0);
    return ctx->opts.pipe_wdefer >= 2 ? (int)ctx->opts.pipe_wdefer - 1 : 0; /* auto,0,1,step -> 0, 0, 1, 2 */
}

typedef struct span {
    size_t off, n;
} span;

static int by_off(const void *a, const void *b)
{
    size_t x = ((const span *)a)->off, y = ((const span *)b)->off;
    return x < y ? -1 : x > y;
}

/* The arena ranges outside the weights written straight into the gradient sum (the deferred ones and the late
 * dense ones): [acc_lo[i], acc_hi[i]) floats. */
static clg_status acc_ranges(clg_err *err, clg_pipe_stage *st)
{
    size_t total = st->rep->arena_bytes / sizeof(float), at = 0;
    int nx = 0;
    free(st->acc_lo);
    free(st->acc_hi);
    st->acc_lo = malloc(sizeof(size_t) * (size_t)(st->nwd + st->nwl + 1));
    st->acc_hi = malloc(sizeof(size_t) * (size_t)(st->nwd + st->nwl + 1));
    span *x = malloc(sizeof(span) * (size_t)(st->nwd + st->nwl + 1));
    if (!st->acc_lo || !st->acc_hi || !x) {
        free(x);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    for (int i = 0; i < st->nwd; i++)
        x[nx++] = (span){st->wd[i].woff, st->wd[i].wn};
    for (int i = 0; i < st->nwl; i++)
        if (st->wl[i].dense)
            x[nx++] = (span){st->wl[i].woff, st->wl[i].wn};
    qsort(x, (size_t)nx, sizeof *x, by_off);
    st->nacc = 0;
    for (int i = 0; i <= nx; i++) {
        size_t end = i < nx ? x[i].off : total;
        if (end > at) {
            st->acc_lo[st->nacc] = at;
            st->acc_hi[st->nacc++] = end;
        }
        if (i < nx)
            at = x[i].off + x[i].n;
    }
    free(x);
    return CLG_OK;
}

/* The arena offset (floats) of layer i's weight gradient in r; 0 with *found 0 when absent. */
static size_t weight_off(const clg_replica *r, const clg_param_ref *refs, int n, int i, int *found)
{
    *found = 0;
    for (int k = 0; k < n; k++)
        if (refs[k].layer->index == i && refs[k].param == &r->layers[i].params[0]) {
            *found = 1;
            return r->arena_off[k] / sizeof(float);
        }
    return 0;
}

clg_status clg_pipe_wdefer_init(clg_pipe *p, clg_pipe_stage *st)
{
    clg_err *err = &p->ctx->err;
    clg_replica *r = st->rep;
    st->nwd = 0;
    if (!r->arena_bytes)
        return CLG_OK;
    if (!p->wdefer || p->fp16 || p->T > 1)
        return acc_ranges(err, st);
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(r, 1, &refs, &n));
    st->wd = calloc((size_t)(st->last - st->first + 1), sizeof *st->wd);
    clg_status rc = st->wd ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    size_t rows = (size_t)p->mb * (size_t)p->M; /* a replica's samples at most */
    for (int i = st->first; i <= st->last && rc == CLG_OK; i++) {
        clg_pipe_wd w = {.layer = i};
        int found = 0;
        if (!clg_dense_dims(&r->layers[i], &w.per, &w.in, &w.units) || r->layers[i].fused_into)
            continue;
        w.woff = weight_off(r, refs, n, i, &found);
        w.wn = (size_t)w.in * (size_t)w.units;
        if (!found)
            continue;
        rc = clg_buf_alloc(st->dev, rows * (size_t)w.per * (size_t)w.in * sizeof(float), &w.x);
        if (rc == CLG_OK)
            rc = clg_buf_alloc(st->dev, rows * (size_t)w.per * (size_t)w.units * sizeof(float), &w.dz);
        st->wd[st->nwd++] = w;
        st->mib += (double)rows * w.per * (w.in + w.units) * sizeof(float) / 1048576.0; /* the table's plan */
    }
    free(refs);
    return rc == CLG_OK ? acc_ranges(err, st) : rc;
}

int clg_pipe_wlate_mode(const clg_ctx *ctx, const clg_pipe_params *pp, int T, int fp16)
{
    if (T > 1 || fp16)
        return 0;
    if (pp->wlate)
        return pp->wlate > 0;
    return ctx->opts.pipe_wlate != 1; /* auto,0,1 -> on, off, on */
}

static int deferred(const clg_pipe_stage *st, int layer)
{
    for (int i = 0; i < st->nwd; i++)
        if (st->wd[i].layer == layer)
            return 1;
    return 0;
}

/* Layer i of st as a late layer (its kept operands' floats per sample in *in, *out); 0: not one. */
static int late_layer(clg_pipe_stage *st, const clg_param_ref *refs, int nrefs, int i, clg_pipe_wl *w, size_t *in,
                      size_t *out)
{
    clg_layer *l = &st->rep->layers[i];
    int in_f, units, found = 1;
    *w = (clg_pipe_wl){.layer = i};
    if (l->fused_into || !l->nparams || deferred(st, i))
        return 0;
    if (clg_dense_dims(l, &w->per, &in_f, &units)) { /* its weight gradient straight into the sum */
        w->dense = 1;
        *in = (size_t)w->per * (size_t)in_f;
        *out = (size_t)w->per * (size_t)units;
        w->woff = weight_off(st->rep, refs, nrefs, i, &found);
        w->wn = (size_t)in_f * (size_t)units;
        return found;
    }
    return clg_conv_defer_dims(l, in, out);
}

clg_status clg_pipe_wlate_init(clg_pipe *p, clg_pipe_stage *st)
{
    int sends = 0;
    for (int q = 0; q < p->nedges; q++)
        sends |= p->edges[q].to == st->index;
    st->nwl = 0;
    if (!p->wlate || !sends || !st->rep->arena_bytes)
        return CLG_OK;
    clg_param_ref *refs = NULL;
    int nrefs = 0;
    CLG_TRY(clg_replica_params(st->rep, 1, &refs, &nrefs));
    clg_status rc = (st->wl = calloc((size_t)(st->last - st->first + 1), sizeof *st->wl))
                        ? CLG_OK
                        : clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = st->first; i <= st->last && rc == CLG_OK; i++) {
        clg_pipe_wl w;
        size_t in, out;
        if (!late_layer(st, refs, nrefs, i, &w, &in, &out))
            continue;
        st->wl[st->nwl++] = w; /* released with the stage when an allocation fails */
        rc = clg_buf_alloc(st->dev, (size_t)p->mb * in * sizeof(float), &st->wl[st->nwl - 1].x);
        if (rc == CLG_OK)
            rc = clg_buf_alloc(st->dev, (size_t)p->mb * out * sizeof(float), &st->wl[st->nwl - 1].dz);
        st->mib += (double)p->mb * (double)(in + out) * sizeof(float) / 1048576.0;
    }
    free(refs);
    return rc == CLG_OK ? acc_ranges(&p->ctx->err, st) : rc;
}

void clg_pipe_wlate_arm(clg_pipe_stage *st, clg_replica *r, int on)
{
    for (int i = 0; i < st->nwl; i++) {
        const clg_pipe_wl *w = &st->wl[i];
        if (w->dense)
            clg_dense_defer(&r->layers[w->layer], on ? w->x : NULL, w->dz, 0);
        else
            clg_conv_defer(&r->layers[w->layer], on ? w->x : NULL, w->dz);
    }
}

clg_status clg_pipe_wlate_run(clg_pipe_stage *st, clg_replica *r, int n, int first)
{
    for (int i = 0; i < st->nwl; i++) {
        const clg_pipe_wl *w = &st->wl[i];
        clg_layer *l = &r->layers[w->layer];
        if (w->dense) /* added to the sum by the GEMM's epilogue (C + product, rounded once: as the accumulation) */
            CLG_TRY(clg_dense_wgrad(l, st->dev, n * w->per, w->dz, 0, w->x, 0, st->gacc, w->woff, !first));
        else
            CLG_TRY(clg_conv_wgrad(l, st->dev, w->x, w->dz));
    }
    return CLG_OK;
}

void clg_pipe_wdefer_print(const clg_pipe *p, FILE *f)
{
    size_t rows = (size_t)p->mb * (size_t)p->M;
    for (int s = 0; s < p->K; s++) {
        const clg_pipe_stage *st = &p->st[s];
        if (st->nwl) {
            size_t bytes = 0;
            fprintf(f, "  weight gradients after the sends on stage %d:", s);
            for (int i = 0; i < st->nwl; i++) {
                size_t a = 0, b = 0;
                clGetMemObjectInfo(st->wl[i].x, CL_MEM_SIZE, sizeof a, &a, NULL);
                clGetMemObjectInfo(st->wl[i].dz, CL_MEM_SIZE, sizeof b, &b, NULL);
                bytes += a + b;
                fprintf(f, " %s", p->net->proto[st->wl[i].layer].name);
            }
            fprintf(f, " (%.2f MiB)\n", (double)bytes / 1048576.0);
        }
        if (!st->nwd)
            continue;
        fprintf(f, "  weight gradients after the schedule on stage %d (%s):", s,
                p->wdefer == 2 ? "one product per step" : "a product per micro-batch");
        for (int i = 0; i < st->nwd; i++)
            fprintf(f, " %s (%.2f MiB)", p->net->proto[st->wd[i].layer].name,
                    (double)rows * st->wd[i].per * (st->wd[i].in + st->wd[i].units) * sizeof(float) / 1048576.0);
        fprintf(f, "\n");
    }
}

void clg_pipe_wdefer_free(clg_pipe_stage *st)
{
    for (int i = 0; i < st->nwd; i++) {
        clg_buf_release(st->dev, st->wd[i].x);
        clg_buf_release(st->dev, st->wd[i].dz);
    }
    for (int i = 0; i < st->nwl; i++) {
        clg_buf_release(st->dev, st->wl[i].x);
        clg_buf_release(st->dev, st->wl[i].dz);
    }
    free(st->wl);
    st->wl = NULL;
    st->nwl = 0;
    free(st->wd);
    free(st->acc_lo);
    free(st->acc_hi);
    st->wd = NULL;
    st->acc_lo = st->acc_hi = NULL;
    st->nwd = st->nacc = 0;
}

void clg_pipe_wdefer_arm(const clg_pipe *p, clg_pipe_stage *st, clg_replica *r, int m, int on)
{
    size_t row = (size_t)(p->off[st->d][m] - p->off[st->d][0]);
    for (int i = 0; i < st->nwd; i++) {
        const clg_pipe_wd *w = &st->wd[i];
        clg_dense_defer(&r->layers[w->layer], on ? w->x : NULL, w->dz, row * (size_t)w->per);
    }
}

clg_status clg_pipe_wdefer_acc(clg_pipe_stage *st, clg_replica *r, int first)
{
    clg_err *err = clg_dev_err(st->dev);
    for (int i = 0; i < st->nacc; i++) {
        size_t lo = st->acc_lo[i], n = st->acc_hi[i] - lo;
        if (first)
            CLG_CL_CHECK(err, clEnqueueCopyBuffer(st->dev->queue, r->garena, st->gacc, lo * sizeof(float),
                                                  lo * sizeof(float), n * sizeof(float), 0, NULL, NULL));
        else
            CLG_TRY(clg_nn_add_acc(st->dev, n, r->garena, lo, st->gacc, lo));
    }
    return CLG_OK;
}

clg_status clg_pipe_wdefer_finish(const clg_pipe *p, clg_pipe_stage *st)
{
    int d = st->d;
    for (int i = 0; i < st->nwd; i++) {
        clg_pipe_wd *w = &st->wd[i];
        clg_layer *l = &st->rep->layers[w->layer];
        if (p->wdefer == 2) { /* one product over the replica's samples */
            CLG_TRY(clg_dense_wgrad(l, st->dev, p->rcnt[d] * w->per, w->dz, 0, w->x, 0, st->gacc, w->woff, 0));
            continue;
        }
        for (int m = 0; m < p->nm; m++) { /* per micro-batch, added in order: the accumulated bits */
            size_t row = (size_t)(p->off[d][m] - p->off[d][0]) * (size_t)w->per;
            CLG_TRY(clg_dense_wgrad(l, st->dev, p->cnt[d][m] * w->per, w->dz, row * (size_t)w->units, w->x,
                                    row * (size_t)w->in, st->gacc, w->woff, m > 0));
        }
    }
    return CLG_OK;
}

clg_status clg_pipe_wdefer_measure(clg_replica *r, int mb, cl_mem **keep)
{
    if (!(*keep = calloc((size_t)r->nlayers * 2, sizeof(cl_mem))))
        return clg_err_set(clg_dev_err(r->dev), CLG_ERR_HOST_OOM, "out of memory");
    for (int i = r->first; i <= r->last; i++) {
        int per, in, units;
        if (!clg_dense_dims(&r->layers[i], &per, &in, &units) || r->layers[i].fused_into)
            continue;
        size_t rows = (size_t)mb * (size_t)per;
        CLG_TRY(clg_buf_alloc(r->dev, rows * (size_t)in * sizeof(float), &(*keep)[2 * i]));
        CLG_TRY(clg_buf_alloc(r->dev, rows * (size_t)units * sizeof(float), &(*keep)[2 * i + 1]));
        clg_dense_defer(&r->layers[i], (*keep)[2 * i], (*keep)[2 * i + 1], 0);
    }
    return CLG_OK;
}

void clg_pipe_wdefer_unmeasure(clg_replica *r, cl_mem *keep)
{
    for (int i = 0; keep && i < r->nlayers; i++) {
        if (keep[2 * i])
            clg_dense_defer(&r->layers[i], NULL, NULL, 0);
        clg_buf_release(r->dev, keep[2 * i]);
        clg_buf_release(r->dev, keep[2 * i + 1]);
    }
    free(keep);
}
