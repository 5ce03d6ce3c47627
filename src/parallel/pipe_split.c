/* Pipeline: a cut inside a layer (fractional cut, see pipe.h).
 *
 * A [convolutional] (groups 1) or [dense] layer L of C output channels is
 * cut after its first c channels by rewriting the network the stages run:
 *   L@0  the same layer with filters/units = c      (the stage before the cut)
 *   L@1  the same layer with C - c, the same input   (the stage after it)
 *   L    [concat] of L@0, L@1: the whole output under L's name
 * The stage after the cut then receives L's input (an edge like a residual
 * one) and L@0's output; in backward it sends back the gradient of L@0's
 * output and its part of the gradient of L's input, which the stage before
 * adds to its own (the pipeline's several-readers sum). Every later layer
 * reads the concat, so batch norm or pooling after L sees the whole channel
 * set. The parameters of L@0 / L@1 are the leading / trailing rows of L's
 * (weight (C, ...) and bias (C) are output-channel major): checkpoints and
 * clg_pipe_sync gather and scatter the two slices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/cfg.h"
#include "model/layers.h"
#include "parallel/pipe.h"

/* The key holding a splittable layer's output channels; NULL (why: reason)
 * when l cannot be split by output channels. */
static const char *split_key(const clg_net *net, const clg_layer *l, const char **why)
{
    const clg_cfg_section *sec = &net->cfg->sec[l->index + 1];
    const char *key = NULL;
    if (l->ops == &clg_layer_conv_ops)
        key = "filters";
    else if (l->ops == &clg_layer_dense_ops)
        key = "units";
    *why = "only a convolution or a dense layer can be split by output channels";
    if (!key)
        return NULL;
    const clg_cfg_kv *g = clg_cfg_find(sec, "groups");
    if (g && strtol(g->value, NULL, 10) != 1) {
        *why = "a grouped convolution cannot be split by output channels";
        return NULL;
    }
    if (clg_cfg_find(sec, "tie")) {
        *why = "a dense layer tied to an embedding cannot be split";
        return NULL;
    }
    if (l->out_seq || l->index >= net->nlayers - 1) {
        *why = l->out_seq ? "a dense layer on a sequence cannot be split" : "the last layer cannot be split";
        return NULL;
    }
    return key;
}

int clg_pipe_split_channels(const clg_net *net, int layer)
{
    const char *why = NULL;
    return layer >= 0 && layer < net->nlayers && split_key(net, &net->proto[layer], &why)
               ? net->proto[layer].out_shape[1]
               : 0;
}

clg_status clg_pipe_split_spec(clg_err *err, const clg_net *net, const char *cuts, int *layer, int *c, char *rest,
                               size_t cap)
{
    *layer = -1;
    *c = 0;
    size_t o = 0;
    rest[0] = 0;
    for (const char *s = cuts; s && *s;) {
        const char *e = strchr(s, ','), *colon = strchr(s, ':');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char name[64 + 2]; /* a layer name and "@0" */
        size_t nlen = colon && colon < s + len ? (size_t)(colon - s) : len;
        if (nlen == 0 || nlen >= 64)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': empty or overlong layer name", cuts);
        memcpy(name, s, nlen);
        name[nlen] = 0;
        if (nlen < len) { /* name:fraction */
            char *fe = NULL;
            double f = strtod(colon + 1, &fe);
            if (fe == colon + 1 || fe != s + len || !(f > 0 && f < 1))
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': '%.*s': the fraction after ':' must "
                                   "be a number strictly between 0 and 1", cuts, (int)len, s);
            if (*layer >= 0)
                return clg_err_set(err, CLG_ERR_UNSUPPORTED, "--stages '%s': more than one cut inside a layer is "
                                   "not supported yet", cuts);
            int i = clg_net_find(net, name);
            if (i < 0)
                return clg_err_set(err, CLG_ERR_NOT_FOUND, "--stages '%s': '%s' is not a layer of %s", cuts, name,
                                   net->source);
            const char *why = NULL;
            if (!split_key(net, &net->proto[i], &why))
                return clg_err_set(err, CLG_ERR_UNSUPPORTED, "--stages '%s': cannot cut inside '%s': %s", cuts, name,
                                   why);
            int C = net->proto[i].out_shape[1], k = (int)(f * C + 0.5);
            if (k < 1 || k >= C)
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': %g of the %d output channels of '%s' "
                                   "leaves one side without a channel", cuts, f, C, name);
            *layer = i;
            *c = k;
            strcat(name, "@0");
        }
        int w = snprintf(rest + o, cap - o, "%s%s", o ? "," : "", name);
        if (w < 0 || (size_t)w >= cap - o)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': too long", cuts);
        o += (size_t)w;
        s = e ? e + 1 : s + len;
    }
    return CLG_OK;
}

/* "input = a,b" of layer l with every producer by name. */
static void put_inputs(clg_sbuf *b, const clg_net *net, const clg_layer *l)
{
    clg_sbuf_printf(b, "input = ");
    for (int k = 0; k < l->nin; k++)
        clg_sbuf_printf(b, "%s%s", k ? "," : "", l->inputs[k] < 0 ? "data" : net->proto[l->inputs[k]].name);
    clg_sbuf_printf(b, "\n");
}

/* Section sec's keys but name, input and skip (NULL: none). */
static void put_keys(clg_sbuf *b, const clg_cfg_section *sec, const char *skip)
{
    for (int k = 0; k < sec->nkv; k++) {
        const clg_cfg_kv *kv = &sec->kv[k];
        if (!strcmp(kv->key, "name") || !strcmp(kv->key, "input") || (skip && !strcmp(kv->key, skip)))
            continue;
        clg_sbuf_printf(b, "%s = %s\n", kv->key, kv->value);
    }
}

clg_status clg_pipe_split_net(clg_err *err, const clg_net *net, int layer, int c, int batch, clg_net **out)
{
    *out = NULL;
    const char *why = NULL;
    const clg_layer *sl = &net->proto[layer];
    const char *key = split_key(net, sl, &why);
    if (!key)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "pipeline: cannot cut inside '%s': %s", sl->name, why);
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "[net]\n");
    put_keys(&b, &net->cfg->sec[0], NULL);
    for (int i = 0; i < net->nlayers; i++) {
        const clg_layer *l = &net->proto[i];
        const clg_cfg_section *sec = &net->cfg->sec[i + 1];
        if (i != layer) { /* every producer and name spelled out: indices shift by two after the split */
            clg_sbuf_printf(&b, "\n[%s]\nname = %s\n", sec->name, l->name);
            if (clg_cfg_find(sec, "input"))
                put_inputs(&b, net, l);
            put_keys(&b, sec, NULL);
            continue;
        }
        for (int part = 0; part < 2; part++) {
            clg_sbuf_printf(&b, "\n[%s]\nname = %s@%d\n%s = %d\n", sec->name, l->name, part, key,
                            part ? l->out_shape[1] - c : c);
            put_inputs(&b, net, l);
            put_keys(&b, sec, key);
        }
        clg_sbuf_printf(&b, "\n[concat]\nname = %s\ninput = %s@0,%s@1\n", l->name, l->name, l->name);
    }
    if (b.oom) {
        clg_sbuf_free(&b);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    clg_net *s = NULL;
    clg_status st = clg_net_build(err, b.data, net->source, batch, &s);
    clg_sbuf_free(&b);
    if (st != CLG_OK)
        return clg_err_set(err, st, "pipeline: the network with '%s' cut inside: %s", sl->name, err->msg);
    int bad = s->nlayers != net->nlayers + 2 || s->loss_index != net->loss_index + 2;
    for (int i = 0; i < net->nlayers && !bad; i++) { /* the same graph, L made L@0, L@1, concat */
        const clg_layer *a = &net->proto[i], *q = &s->proto[i < layer ? i : i + 2];
        bad |= strcmp(a->name, q->name) || (i != layer && a->nin != q->nin) || memcmp(a->out_shape, q->out_shape, sizeof a->out_shape);
        for (int k = 0; k < a->nin && !bad && i != layer; k++)
            bad |= q->inputs[k] != (a->inputs[k] < layer ? a->inputs[k] : a->inputs[k] + 2);
    }
    if (bad) {
        clg_net_free(s);
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "pipeline: cutting inside '%s' changes the network's graph "
                           "(not supported for this model)", sl->name);
    }
    s->fp16 = net->fp16;
    s->hp = net->hp;
    *out = s;
    return CLG_OK;
}

void clg_pipe_split_inplace(clg_pipe *p)
{
    int L0 = p->split_layer, cat = L0 + 2;
    if (L0 < 0 || p->fp16 || p->T > 1) /* fp16: the concat writes its whole fp32 output and rounds it */
        return;
    const clg_layer *c = &p->net->proto[cat];
    if (c->ops != &clg_layer_concat_ops || c->nin != 2 || c->inputs[0] != L0)
        return;
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        if (e->tensor != L0 || p->stage_of[cat] != e->to % p->K)
            continue;
        e->at = cat;
        e->pitch = (size_t)c->out_shape[1] * c->out_shape[2] * c->out_shape[3];
        clg_pipe_stage *st = &p->st[e->to];
        for (int k = 0; k < st->nreps; k++)
            st->reps[k]->layers[cat].in_place |= 1u;
    }
}
