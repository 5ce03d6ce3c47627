/* Network: model text -> layer graph (inputs resolved by name or index),
 * shape inference through the layers' configure/setup, and the printed
 * layer table. The [net] section is read by net_config.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "model/network_impl.h"

int clg_net_find(const clg_net *net, const char *name)
{
    for (int i = 0; i < net->nlayers; i++)
        if (strcmp(net->proto[i].name, name) == 0)
            return i;
    return -1;
}

int clg_net_labels_per_sample(const clg_net *net)
{
    if (!net || net->loss_index < 0)
        return 1;
    const clg_layer *l = &net->proto[net->loss_index];
    return l->in_seq[0] && strcmp(l->ops->type, "softmax") == 0 ? l->in_shape[0][1] : 1;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
    return s;
}

/* Resolves the `input` key of layer idx into l->inputs. */
static clg_status parse_inputs(clg_err *err, clg_net *net, clg_cfg_section *s, clg_layer *l, int idx)
{
    const char *spec = NULL;
    CLG_TRY(clg_cfg_str(err, net->cfg, s, "input", "", &spec));
    const clg_cfg_kv *kv = clg_cfg_find(s, "input");
    int line = kv ? kv->line : s->line;
    if (!spec[0]) {
        l->nin = 1;
        l->inputs[0] = idx - 1; /* -1: network input for the first layer */
        return CLG_OK;
    }
    char buf[512];
    if (strlen(spec) >= sizeof buf)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: input list too long", net->source, line);
    strcpy(buf, spec);
    l->nin = 0;
    /* split by hand: strtok_r would skip the empty entries of "a,", ",a", "a,,b" */
    for (char *tok = buf, *next; tok; tok = next) {
        char *comma = strchr(tok, ',');
        next = comma ? comma + 1 : NULL;
        if (comma)
            *comma = 0;
        char *t = trim(tok);
        if (l->nin >= CLG_MAX_INPUTS)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: layer '%s' has more than %d inputs", net->source, line,
                               l->name, CLG_MAX_INPUTS);
        int src;
        char *end = NULL;
        errno = 0;
        long x = strtol(t, &end, 10);
        if (!*t)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: empty entry in input list '%s' of layer '%s'",
                               net->source, line, spec, l->name);
        if (end != t && *end == 0 && !errno) {
            src = x < 0 ? (int)(idx + x) : (int)x;
            if (x < 0 && idx + x < -1)
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "%s:%d: input %ld of layer '%s' points before the network input (layer %d)",
                                   net->source, line, x, l->name, idx);
            if (x >= 0 && x >= idx)
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "%s:%d: input %ld of layer '%s' (layer %d) is not an earlier layer", net->source,
                                   line, x, l->name, idx);
        } else if (strcmp(t, "data") == 0 || strcmp(t, "input") == 0) {
            src = -1;
        } else {
            src = -2;
            for (int j = 0; j < idx; j++)
                if (strcmp(net->proto[j].name, t) == 0)
                    src = j;
            if (src == -2)
                return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: layer '%s' reads unknown input '%s' (no earlier layer has that name)",
                                   net->source, line, l->name, t);
        }
        if (src >= 0 && net->proto[src].is_loss)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: layer '%s' reads the output of loss layer '%s'",
                               net->source, line, l->name, net->proto[src].name);
        l->inputs[l->nin++] = src;
    }
    return CLG_OK;
}

clg_status clg_net_layer_fail(clg_err *err, clg_status st, const clg_net *net, const clg_layer *l, const char *what)
{
    clg_err *e = err ? err : clg_err_tls();
    if (strncmp(e->msg, net->source, strlen(net->source)) == 0)
        return st;
    char tmp[CLG_ERR_LEN];
    snprintf(tmp, sizeof tmp, "%s", e->msg);
    return clg_err_set(err, st, "%s:%d: layer '%s' (%s): %s: %s", net->source, l->line, l->name, l->ops->type, what,
                       tmp);
}

/* A sequence input reaches only layers that take sequences: their setup
 * sets out_seq (see layer.h). */
static clg_status check_seq(clg_err *err, const clg_net *net, const clg_layer *l)
{
    for (int k = 0; k < l->nin && !l->out_seq; k++)
        if (l->in_seq[k])
            return clg_err_set(err, CLG_ERR_SHAPE,
                               "%s:%d: layer '%s' (%s) does not take a sequence input (N, T, C): input %d ('%s') is "
                               "one; sequences go to dense, layernorm, attention, posembed, activation, dropout, "
                               "add or softmax",
                               net->source, l->line, l->name, l->ops->type, k,
                               l->inputs[k] >= 0 ? net->proto[l->inputs[k]].name : "data");
    return CLG_OK;
}

clg_status clg_net_instantiate(clg_err *err, clg_net *net, clg_layer *layers, int batch, int first_time)
{
    clg_cfg *cfg = net->cfg;
    for (int i = 0; i < net->nlayers; i++) {
        clg_cfg_section *s = &cfg->sec[i + 1];
        clg_layer *l = &layers[i];
        memset(l, 0, sizeof *l);
        l->ops = clg_layer_lookup(s->name);
        if (!l->ops) {
            char known[1024] = "";
            const char *const *names = clg_layer_type_names();
            for (int k = 0; names && names[k]; k++) {
                if (k)
                    strncat(known, ", ", sizeof known - strlen(known) - 1);
                strncat(known, names[k], sizeof known - strlen(known) - 1);
            }
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: unknown section type [%s] (known: net, %s)", net->source,
                               s->line, s->name, known);
        }
        l->line = s->line;
        l->index = i;
        const char *name = NULL;
        CLG_TRY(clg_cfg_str(err, cfg, s, "name", "", &name));
        if (name[0]) {
            if (strlen(name) >= sizeof l->name)
                return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: layer name '%s' is too long (max %zu)", net->source,
                                   s->line, name, sizeof l->name - 1);
            if (strcmp(name, "data") == 0 || strcmp(name, "input") == 0 || strchr(name, ','))
                return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: '%s' is not a valid layer name", net->source,
                                   s->line, name);
            /* `input = N` reads N as a layer index, so a numeric name would be ambiguous */
            char *end = NULL;
            (void)strtol(name, &end, 10);
            if (end != name && *end == 0) {
                const clg_cfg_kv *kv = clg_cfg_find(s, "name");
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "%s:%d: [%s] key 'name': '%s' is not a valid layer name (it reads as a number, "
                                   "which 'input' takes as a layer index; use a name that is not an integer)",
                                   net->source, kv ? kv->line : s->line, s->name, name);
            }
            for (int j = 0; j < i; j++)
                if (strcmp(layers[j].name, name) == 0)
                    return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: layer name '%s' is already used by line %d",
                                       net->source, s->line, name, layers[j].line);
            strcpy(l->name, name);
        } else {
            snprintf(l->name, sizeof l->name, "%s%d", s->name, i);
        }
        /* parse_inputs resolves names through net->proto (same names in every instance) */
        CLG_TRY(parse_inputs(err, net, s, l, i));
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            if (src < 0) {
                l->in_shape[k][0] = batch;
                l->in_shape[k][1] = net->in_c;
                l->in_shape[k][2] = net->in_h;
                l->in_shape[k][3] = net->in_w;
            } else {
                memcpy(l->in_shape[k], layers[src].out_shape, sizeof l->in_shape[k]);
                l->in_seq[k] = layers[src].out_seq;
            }
        }
        clg_status st = l->ops->configure(l, err, cfg, s);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, net, l, "configure");
        if (first_time)
            CLG_TRY(clg_cfg_check_unused(err, cfg, s));
        st = l->ops->setup(l, err);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, net, l, "shapes");
        CLG_TRY(check_seq(err, net, l));
        for (int k = 0; k < 4; k++)
            if (l->out_shape[k] <= 0)
                return clg_err_set(err, CLG_ERR_SHAPE,
                                   "%s:%d: layer '%s' (%s) gives an empty output shape %dx%dx%dx%d", net->source,
                                   s->line, l->name, l->ops->type, l->out_shape[0], l->out_shape[1], l->out_shape[2],
                                   l->out_shape[3]);
    }
    for (int i = 0; i < net->nlayers; i++) {
        clg_layer *l = &layers[i];
        if (!l->ops->link)
            continue;
        clg_status st = l->ops->link(l, err, cfg, layers, net->nlayers);
        if (st != CLG_OK)
            return clg_net_layer_fail(err, st, net, l, "link");
    }
    return CLG_OK;
}

void clg_net_destroy_layers(clg_layer *layers, int n, clg_device *dev)
{
    if (!layers)
        return;
    for (int i = 0; i < n; i++)
        clg_layer_free(&layers[i], dev);
}

/* Every layer but the last must feed a later layer: an unused output would
 * have no gradient buffer in backward. */
static clg_status check_dead_branches(clg_err *err, const clg_net *net)
{
    for (int i = 0; i < net->nlayers - 1; i++) {
        int used = 0;
        for (int j = i + 1; j < net->nlayers && !used; j++)
            for (int k = 0; k < net->proto[j].nin; k++)
                used |= net->proto[j].inputs[k] == i;
        if (!used)
            return clg_err_set(err, CLG_ERR_FORMAT,
                               "%s:%d: the output of layer '%s' feeds no layer (a dead branch; only the last layer may "
                               "be unused): give a later layer 'input = %s' or remove it",
                               net->source, net->proto[i].line, net->proto[i].name, net->proto[i].name);
    }
    return CLG_OK;
}

clg_status clg_net_build(clg_err *err, const char *text, const char *source_name, int batch, clg_net **out)
{
    return clg_net_build_shape(err, text, source_name, batch, NULL, out);
}

clg_status clg_net_build_shape(clg_err *err, const char *text, const char *source_name, int batch, const int *chw,
                               clg_net **out)
{
    *out = NULL;
    if (!text)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "model text is NULL");
    clg_net *net = calloc(1, sizeof *net);
    if (!net)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory building a network");
    snprintf(net->source, sizeof net->source, "%s", source_name ? source_name : "<string>");
    net->text = strdup(text);
    clg_status st = net->text ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = clg_cfg_parse(err, text, net->source, &net->cfg);
    if (st == CLG_OK && (net->cfg->nsec == 0 || strcmp(net->cfg->sec[0].name, "net") != 0))
        st = clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: the first section must be [net] (input shape and training settings)",
                         net->source, net->cfg->nsec ? net->cfg->sec[0].line : 1);
    if (st == CLG_OK)
        st = clg_net_parse_config(err, net, &net->cfg->sec[0]);
    if (st == CLG_OK && chw) {
        net->in_c = chw[0];
        net->in_h = chw[1];
        net->in_w = chw[2];
    }
    if (st == CLG_OK && net->cfg->nsec < 2)
        st = clg_err_set(err, CLG_ERR_FORMAT, "%s: the model has no layers after [net]", net->source);
    if (st == CLG_OK) {
        if (batch > 0)
            net->batch = batch;
        net->nlayers = net->cfg->nsec - 1;
        net->proto = calloc((size_t)net->nlayers, sizeof *net->proto);
        if (!net->proto)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    if (st == CLG_OK)
        st = clg_net_instantiate(err, net, net->proto, net->batch, 1);
    if (st == CLG_OK) {
        net->loss_index = -1;
        for (int i = 0; i < net->nlayers; i++) {
            clg_layer *l = &net->proto[i];
            if (l->is_loss && i != net->nlayers - 1) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: loss layer '%s' must be the last layer", net->source,
                                 l->line, l->name);
                break;
            }
            if (l->is_loss)
                net->loss_index = i;
            for (int p = 0; p < l->nparams; p++)
                if (l->params[p].trainable)
                    net->nparams += l->params[p].numel;
            net->flops += l->flops / CLG_MAX(1, net->batch);
        }
    }
    if (st == CLG_OK)
        st = check_dead_branches(err, net);
    if (st == CLG_OK) {
        const clg_layer *last = &net->proto[net->nlayers - 1];
        int outs = last->out_seq ? last->out_shape[2] : last->out_shape[1]; /* a sequence: classes per position */
        if (net->classes == 0)
            net->classes = outs;
        else if (net->classes != outs && last->is_loss)
            st = clg_err_set(err, CLG_ERR_SHAPE, "%s:%d: [net] classes = %d but the last layer '%s' has %d outputs",
                             net->source, net->cfg->sec[0].line, net->classes, last->name, outs);
    }
    if (st != CLG_OK) {
        clg_net_free(net);
        return st;
    }
    *out = net;
    return CLG_OK;
}

clg_status clg_net_load(clg_err *err, const char *path, int batch, clg_net **out)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    CLG_TRY(clg_file_read(err, path, &text, &len));
    if (strlen(text) != len) {
        free(text);
        return clg_err_set(err, CLG_ERR_FORMAT, "%s: model file contains a NUL byte (not a text file?)", path);
    }
    clg_status st = clg_net_build(err, text, path, batch, out);
    free(text);
    return st;
}

void clg_net_free(clg_net *net)
{
    if (!net)
        return;
    clg_net_destroy_layers(net->proto, net->nlayers, NULL);
    free(net->proto);
    clg_cfg_free(net->cfg);
    free(net->text);
    free(net);
}

static void human(char *dst, size_t n, double v)
{
    if (v >= 1e9)
        snprintf(dst, n, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(dst, n, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(dst, n, "%.1fk", v / 1e3);
    else
        snprintf(dst, n, "%.0f", v);
}

void clg_net_print(const clg_net *net, FILE *f)
{
    fprintf(f, "%-3s %-14s %-14s %-16s %-18s %10s %10s\n", "#", "name", "type", "input", "output (CxHxW)", "params",
            "MFLOPs");
    fprintf(f, "%-3s %-14s %-14s %-16s %-18s %10s %10s\n", "", "data", "input", "", "", "", "");
    for (int i = 0; i < net->nlayers; i++) {
        const clg_layer *l = &net->proto[i];
        char ins[64] = "", shape[48], params[16];
        for (int k = 0; k < l->nin; k++) {
            char one[16];
            if (l->inputs[k] < 0)
                snprintf(one, sizeof one, "%sdata", k ? "," : "");
            else
                snprintf(one, sizeof one, "%s%d", k ? "," : "", l->inputs[k]);
            strncat(ins, one, sizeof ins - strlen(ins) - 1);
        }
        snprintf(shape, sizeof shape, "%dx%dx%d", l->out_shape[1], l->out_shape[2], l->out_shape[3]);
        size_t np = 0;
        for (int p = 0; p < l->nparams; p++)
            if (l->params[p].trainable)
                np += l->params[p].numel;
        human(params, sizeof params, (double)np);
        fprintf(f, "%-3d %-14.14s %-14.14s %-16.16s %-18s %10s %10.3f\n", i, l->name, l->ops->type, ins, shape, params,
                l->flops / CLG_MAX(1, l->in_shape[0][0]) / 1e6);
    }
    char params[16];
    human(params, sizeof params, (double)net->nparams);
    fprintf(f, "input %dx%dx%d, %d layers, %s trainable parameters, %.3f MFLOPs per sample (forward)\n", net->in_c,
            net->in_h, net->in_w, net->nlayers, params, net->flops / 1e6);
}

