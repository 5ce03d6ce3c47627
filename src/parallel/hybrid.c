/* Hybrid layouts: MPI ranks over pipeline / tensor-parallel layouts (see hybrid.h). */
#include "parallel/hybrid.h"

#include <stdio.h>
#include <stdlib.h>

clg_status clg_hybrid_create(clg_err *err, int channels, const char *what, clg_hybrid **out)
{
    *out = NULL;
    if (clg_comm_size() <= 1 || channels <= 0)
        return CLG_OK;
    clg_hybrid *h = calloc(1, sizeof *h);
    if (!h || !(h->op = calloc((size_t)channels, sizeof *h->op))) {
        free(h);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    h->n = channels;
    for (int c = 0; c < channels; c++) {
        char name[96];
        snprintf(name, sizeof name, "%s %d gradient all-reduce", what, c);
        clg_status st = clg_comm_op_create(err, name, &h->op[c]);
        if (st != CLG_OK) {
            clg_hybrid_free(h);
            return st;
        }
    }
    *out = h;
    return CLG_OK;
}

void clg_hybrid_free(clg_hybrid *h)
{
    if (!h)
        return;
    for (int c = 0; c < h->n; c++)
        clg_comm_op_free(h->op[c]);
    free(h->op);
    free(h);
}

clg_status clg_hybrid_reduce(clg_hybrid *h, int ch, clg_err *err, float *g, size_t ng, float *st, size_t ns,
                             int n_local)
{
    if (!h)
        return CLG_OK;
    if (ch < 0 || ch >= h->n)
        return clg_err_set(err, CLG_ERR_INTERNAL, "rank all-reduce: channel %d of %d", ch, h->n);
    if (ng) {
        clg_comm_op_start(h->op[ch], g, ng, NULL);
        CLG_TRY(clg_comm_op_wait(err, h->op[ch]));
    }
    if (st && ns) {
        float w = h->total > 0 ? (float)((double)n_local / h->total) : 0.0f;
        for (size_t k = 0; k < ns; k++)
            st[k] *= w;
        clg_comm_op_start(h->op[ch], st, ns, NULL);
        CLG_TRY(clg_comm_op_wait(err, h->op[ch]));
    }
    return CLG_OK;
}
