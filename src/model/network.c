/* Network: model file -> layer graph, shape inference, layer table,
 * liveness-planned activation memory, per-device replicas, forward and
 * backward passes. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/dataset.h"
#include "model/layers.h"
#include "model/network.h"

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

static const char *const opt_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const sched_names[] = {"none", "step", "cosine", NULL};

static clg_status parse_net_section(clg_err *err, clg_net *net, clg_cfg_section *s)
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
    CLG_TRY(clg_cfg_enum(err, cfg, s, "optimizer", "sgd", opt_names, &e));
    h->optimizer = e;
    CLG_TRY(clg_cfg_float(err, cfg, s, "beta1", h->beta1, 0, 0.999999, &h->beta1));
    CLG_TRY(clg_cfg_float(err, cfg, s, "beta2", h->beta2, 0, 0.99999999, &h->beta2));
    CLG_TRY(clg_cfg_float(err, cfg, s, "epsilon", h->epsilon, 0, 1, &h->epsilon));
    CLG_TRY(clg_cfg_enum(err, cfg, s, "schedule", "none", sched_names, &e));
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
    CLG_TRY(clg_cfg_int(err, cfg, s, "augment_shift", 0, 0, CLG_DS_MAX_SHIFT, &v));
    h->augment_shift = (int)v;
    return clg_cfg_check_unused(err, cfg, s);
}

int clg_net_find(const clg_net *net, const char *name)
{
    for (int i = 0; i < net->nlayers; i++)
        if (strcmp(net->proto[i].name, name) == 0)
            return i;
    return -1;
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

/* Prefixes err's message with the layer's location unless it names the source already. */
static clg_status layer_fail(clg_err *err, clg_status st, const clg_net *net, const clg_layer *l, const char *what)
{
    clg_err *e = err ? err : clg_err_tls();
    if (strncmp(e->msg, net->source, strlen(net->source)) == 0)
        return st;
    char tmp[CLG_ERR_LEN];
    snprintf(tmp, sizeof tmp, "%s", e->msg);
    return clg_err_set(err, st, "%s:%d: layer '%s' (%s): %s: %s", net->source, l->line, l->name, l->ops->type, what,
                       tmp);
}

/* Configures + sets up one set of layer instances for `batch` samples. */
static clg_status instantiate(clg_err *err, clg_net *net, clg_layer *layers, int batch, int first_time)
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
            }
        }
        clg_status st = l->ops->configure(l, err, cfg, s);
        if (st != CLG_OK)
            return layer_fail(err, st, net, l, "configure");
        if (first_time)
            CLG_TRY(clg_cfg_check_unused(err, cfg, s));
        st = l->ops->setup(l, err);
        if (st != CLG_OK)
            return layer_fail(err, st, net, l, "shapes");
        for (int k = 0; k < 4; k++)
            if (l->out_shape[k] <= 0)
                return clg_err_set(err, CLG_ERR_SHAPE,
                                   "%s:%d: layer '%s' (%s) gives an empty output shape %dx%dx%dx%d", net->source,
                                   s->line, l->name, l->ops->type, l->out_shape[0], l->out_shape[1], l->out_shape[2],
                                   l->out_shape[3]);
    }
    return CLG_OK;
}

static void destroy_layers(clg_layer *layers, int n, clg_device *dev)
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
        st = parse_net_section(err, net, &net->cfg->sec[0]);
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
        st = instantiate(err, net, net->proto, net->batch, 1);
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
        if (net->classes == 0)
            net->classes = last->out_shape[1];
        else if (net->classes != last->out_shape[1] && last->is_loss)
            st = clg_err_set(err, CLG_ERR_SHAPE, "%s:%d: [net] classes = %d but the last layer '%s' has %d outputs",
                             net->source, net->cfg->sec[0].line, net->classes, last->name, last->out_shape[1]);
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
    destroy_layers(net->proto, net->nlayers, NULL);
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

// ---- memory planning ----

typedef struct plan_item {
    int start, end; /* inclusive step interval */
    size_t bytes;
    clg_tensor *t;  /* the tensor placed in the slot, or */
    cl_mem *target; /* a bare buffer (fp16 working buffers) */
    int slot;
} plan_item;

static int cmp_item(const void *a, const void *b)
{
    const plan_item *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return 0;
}

/* Greedy packing of items into slots (buffers): items sorted by start, each
 * placed into a free slot (one whose last item ended before it starts):
 * the smallest that fits, else the largest free one (grown). slot_bytes and
 * slot_end have room for n slots (zeroed). Returns the number of slots. */
static int pack(plan_item *it, int n, size_t *slot_bytes, int *slot_end)
{
    qsort(it, (size_t)n, sizeof *it, cmp_item);
    int nslots = 0;
    for (int a = 0; a < n; a++) {
        int best = -1;
        for (int s = 0; s < nslots; s++) {
            if (slot_end[s] >= it[a].start)
                continue;
            if (best < 0) {
                best = s;
                continue;
            }
            int fits = slot_bytes[s] >= it[a].bytes, bfits = slot_bytes[best] >= it[a].bytes;
            if ((fits && (!bfits || slot_bytes[s] < slot_bytes[best])) ||
                (!fits && !bfits && slot_bytes[s] > slot_bytes[best]))
                best = s;
        }
        if (best < 0)
            best = nslots++;
        if (slot_bytes[best] < it[a].bytes)
            slot_bytes[best] = it[a].bytes;
        slot_end[best] = it[a].end;
        it[a].slot = best;
    }
    return nslots;
}

/* Offset planning in one arena: items in order of decreasing size, each at
 * the lowest aligned offset whose byte range overlaps no placed item that
 * lives at the same time. offs[] receives the offsets; returns the arena
 * size. */
static int cmp_size_desc(const void *a, const void *b)
{
    const plan_item *x = *(const plan_item *const *)a, *y = *(const plan_item *const *)b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static clg_status place(clg_err *err, plan_item *it, int n, size_t align, size_t *offs, size_t *arena)
{
    plan_item **ord = malloc((size_t)CLG_MAX(n, 1) * sizeof *ord);
    size_t *cand = malloc((size_t)(n + 1) * sizeof *cand);
    int *conf = malloc((size_t)CLG_MAX(n, 1) * sizeof *conf);
    char *placed = calloc((size_t)CLG_MAX(n, 1), 1);
    if (!ord || !cand || !conf || !placed) {
        free(ord);
        free(cand);
        free(conf);
        free(placed);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    }
    for (int i = 0; i < n; i++)
        ord[i] = &it[i];
    qsort(ord, (size_t)n, sizeof *ord, cmp_size_desc);
    size_t top = 0;
    for (int q = 0; q < n; q++) {
        int a = (int)(ord[q] - it);
        int nc = 0, ncand = 0;
        cand[ncand++] = 0;
        for (int j = 0; j < n; j++)
            if (placed[j] && !(it[j].end < it[a].start || it[a].end < it[j].start)) {
                conf[nc++] = j;
                cand[ncand++] = align_up(offs[j] + it[j].bytes, align);
            }
        size_t best = (size_t)-1;
        for (int c = 0; c < ncand; c++) {
            if (cand[c] >= best)
                continue;
            int ok = 1;
            for (int k = 0; k < nc && ok; k++) {
                int j = conf[k];
                if (cand[c] < offs[j] + it[j].bytes && offs[j] < cand[c] + it[a].bytes)
                    ok = 0;
            }
            if (ok)
                best = cand[c];
        }
        offs[a] = best;
        placed[a] = 1;
        if (best + it[a].bytes > top)
            top = best + it[a].bytes;
    }
    free(ord);
    free(cand);
    free(conf);
    free(placed);
    *arena = top;
    return CLG_OK;
}

/* fp32: steps: forward of layer i = i; backward of layer i = 2L-1-i.
 * Forward activations live until their own layer's backward (every layer's
 * backward may read its output and its inputs); output gradients live from
 * the first consumer's backward to their own layer's backward.
 *
 * fp16 (half != 0): every step has three sub-steps, expand (half -> fp32
 * working buffers), compute (the layer), store (fp32 -> half), so a half
 * tensor whose last use is an expansion frees its memory for the compute.
 * Half tensors: act[i] (2 bytes per element; the last layer's output stays
 * fp32) and dact[i]; fp32 working buffers of each layer (work[i]) live for
 * the sub-steps that use them. Everything is packed together.
 *
 * alloc == 0 only sizes the plan (*total) and leaves the replica's buffers
 * alone. */
#define FS(i, p) (3 * (i) + (p))
#define BS(i, p) (3 * L + 3 * (L - 1 - (i)) + (p))
static clg_status plan_memory(clg_replica *r, int half, int alloc, int offsets, uint64_t *total)
{
    clg_err *err = clg_dev_err(r->dev);
    int L = r->nlayers;
    size_t cap = (size_t)L * (5 + 3 * CLG_MAX_INPUTS);
    plan_item *it = calloc(cap, sizeof *it);
    int *last_consumer = malloc((size_t)L * sizeof(int));
    int *slot_end = calloc(cap, sizeof(int));
    size_t *slot_bytes = calloc(cap, sizeof(size_t));
    if (!it || !last_consumer || !slot_end || !slot_bytes) {
        free(it);
        free(last_consumer);
        free(slot_end);
        free(slot_bytes);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    }
    for (int i = 0; i < L; i++)
        last_consumer[i] = -1;
    for (int j = 0; j < L; j++)
        for (int k = 0; k < r->layers[j].nin; k++) {
            int s = r->layers[j].inputs[k];
            if (s >= 0 && j > last_consumer[s])
                last_consumer[s] = j;
        }
    int n = 0;
    uint64_t naive = 0, halfb = 0;
    for (int i = 0; i < L; i++) {
        clg_layer *l = &r->layers[i];
        clg_tensor *a = &r->act[i];
        a->n = r->batch;
        a->c = l->out_shape[1];
        a->h = l->out_shape[2];
        a->w = l->out_shape[3];
        size_t numel = clg_tensor_numel(a), f32 = numel * sizeof(float);
        int last = i == L - 1, has_grad = last_consumer[i] >= 0 && !l->is_loss;
        clg_tensor *g = &r->dact[i];
        if (alloc) {
            *g = *a;
            g->mem = NULL;
        }
        naive += f32 * (has_grad ? 2 : 1);
        if (!half) {
            it[n++] = (plan_item){i, 2 * L - 1 - i, f32, a, NULL, -1};
            if (has_grad)
                it[n++] = (plan_item){2 * L - 1 - last_consumer[i], 2 * L - 1 - i, f32, g, NULL, -1};
            continue;
        }
        struct clg_layer_work *w = &r->work[i];
        int uses = 0, use_k = -1, next_reads = 0;
        for (int j = i + 1; j < L; j++)
            for (int k = 0; k < r->layers[j].nin; k++)
                if (r->layers[j].inputs[k] == i) {
                    uses++;
                    use_k = k;
                    next_reads |= j == i + 1;
                }
        w->fchain = !last && next_reads;
        w->bchain = has_grad && uses == 1 && last_consumer[i] == i + 1;
        w->bchain_k = w->bchain ? use_k : -1;
        if (last)
            it[n++] = (plan_item){FS(i, 1), BS(i, 1), f32, a, NULL, -1};
        else {
            it[n++] = (plan_item){FS(i, 2), BS(i, 0), numel * 2, a, NULL, -1};
            it[n++] = (plan_item){FS(i, 1), w->fchain ? FS(i + 1, 1) : FS(i, 2), f32, NULL, &w->f_out, -1};
            it[n++] = (plan_item){BS(i, 0), BS(i, 1), f32, NULL, &w->b_out, -1};
            halfb += numel * 2;
        }
        if (has_grad && !w->bchain) {
            it[n++] = (plan_item){BS(last_consumer[i], 2), BS(i, 0), numel * 2, g, NULL, -1};
            it[n++] = (plan_item){BS(i, 0), BS(i, 1), f32, NULL, &w->b_dout, -1};
            halfb += numel * 2;
        }
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            if (src < 0)
                continue;
            size_t b = clg_tensor_numel(&r->act[src]) * sizeof(float);
            if (!(src == i - 1 && r->work[src].fchain))
                it[n++] = (plan_item){FS(i, 0), FS(i, 1), b, NULL, &w->f_in[k], -1};
            it[n++] = (plan_item){BS(i, 0), BS(i, 1), b, NULL, &w->b_in[k], -1};
            it[n++] = (plan_item){BS(i, 1), r->work[src].bchain ? BS(src, 1) : BS(i, 2), b, NULL, &w->b_din[k], -1};
        }
    }
    clg_status st = CLG_OK;
    if (offsets) {
        /* one arena, a sub-buffer per tensor; sub-buffer origins must be aligned to the device's base alignment */
        cl_uint align_bits = 0;
        clGetDeviceInfo(r->dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
        size_t align = CLG_MAX((size_t)256, (size_t)align_bits / 8), arena = 0;
        size_t *offs = calloc((size_t)CLG_MAX(n, 1), sizeof *offs);
        st = offs ? place(err, it, n, align, offs, &arena)
                  : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
        if (st == CLG_OK && alloc && r->dev->info.max_alloc_bytes && arena > r->dev->info.max_alloc_bytes)
            offsets = 0; /* larger than one allocation may be: separate buffers below */
        else if (st == CLG_OK) {
            *total = arena;
            if (alloc) {
                r->naive_bytes = naive;
                r->half_bytes = halfb;
                r->slots = calloc(1, sizeof(cl_mem));
                r->slot_bytes = calloc(1, sizeof(size_t));
                r->subs = calloc((size_t)CLG_MAX(n, 1), sizeof(cl_mem));
                if (!r->slots || !r->slot_bytes || !r->subs)
                    st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
                if (st == CLG_OK) {
                    r->nslots = 1;
                    r->slot_bytes[0] = arena;
                    st = clg_buf_alloc(r->dev, arena, &r->slots[0]);
                }
                for (int a = 0; a < n && st == CLG_OK; a++) {
                    cl_buffer_region reg = {offs[a], it[a].bytes};
                    cl_int e = CL_SUCCESS;
                    cl_mem sub = clCreateSubBuffer(r->slots[0], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
                    if (e != CL_SUCCESS) {
                        st = clg_cl_fail(err, e, "clCreateSubBuffer (activation arena)", __FILE__, __LINE__);
                        break;
                    }
                    r->subs[r->nsubs++] = sub;
                    if (it[a].t) {
                        it[a].t->mem = sub;
                        it[a].t->off = 0;
                    } else {
                        *it[a].target = sub;
                    }
                }
            }
        }
        free(offs);
        if (offsets || st != CLG_OK) {
            free(it);
            free(last_consumer);
            free(slot_end);
            free(slot_bytes);
            return st;
        }
    }
    int nslots = pack(it, n, slot_bytes, slot_end);
    uint64_t sum = 0;
    for (int s = 0; s < nslots; s++)
        sum += slot_bytes[s];
    *total = sum;
    if (alloc) {
        r->naive_bytes = naive;
        r->half_bytes = halfb;
        r->slot_bytes = slot_bytes;
        slot_bytes = NULL;
        r->slots = calloc((size_t)CLG_MAX(nslots, 1), sizeof(cl_mem));
        if (!r->slots)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
        else
            r->nslots = nslots;
        for (int s = 0; s < r->nslots && st == CLG_OK; s++)
            st = clg_buf_alloc(r->dev, r->slot_bytes[s], &r->slots[s]);
        if (st == CLG_OK)
            for (int a = 0; a < n; a++) {
                if (it[a].t) {
                    it[a].t->mem = r->slots[it[a].slot];
                    it[a].t->off = 0;
                } else {
                    *it[a].target = r->slots[it[a].slot];
                }
            }
    }
    free(it);
    free(last_consumer);
    free(slot_end);
    free(slot_bytes);
    return st;
}
#undef FS
#undef BS

// ---- fp16 storage ----

static const char *cvt_opts(const clg_device *dev) { return dev->info.has_fp16 ? "-D HAVE_FP16=1" : ""; }

/* One of the (mem a, int aoff, mem b, int boff, int n) kernels of cl/convert.cl. */
static clg_status cvt(clg_device *dev, const char *kernel, cl_mem a, size_t aoff, cl_mem b, size_t boff, size_t n)
{
    clg_err *err = clg_dev_err(dev);
    if (n == 0)
        return CLG_OK;
    if (n > INT32_MAX || aoff > INT32_MAX || boff > INT32_MAX)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "fp16 conversion of %zu elements: too large for one kernel", n);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "convert", cvt_opts(dev), kernel, &k));
    int ao = (int)aoff, bo = (int)boff, nn = (int)n;
    CLG_CL_CHECK(err, clSetKernelArg(k, 0, sizeof(cl_mem), &a));
    CLG_CL_CHECK(err, clSetKernelArg(k, 1, sizeof(int), &ao));
    CLG_CL_CHECK(err, clSetKernelArg(k, 2, sizeof(cl_mem), &b));
    CLG_CL_CHECK(err, clSetKernelArg(k, 3, sizeof(int), &bo));
    CLG_CL_CHECK(err, clSetKernelArg(k, 4, sizeof(int), &nn));
    return clg_launch_1d(dev, k, n, 64);
}

/* A half tensor expanded into an fp32 working buffer (same shape, off 0). */
static clg_status expand(clg_device *dev, const clg_tensor *h, cl_mem buf, clg_tensor *out)
{
    clg_tensor src = *h; /* out may alias h */
    *out = src;
    out->mem = buf;
    out->off = 0;
    return cvt(dev, "f16_to_f32", src.mem, src.off, buf, 0, clg_tensor_numel(&src));
}

/* Master (fp32) and half copies of the trainable weights. */
static clg_status setup_fp16(clg_replica *r)
{
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    int L = r->nlayers;
    r->master = calloc((size_t)L * CLG_MAX_PARAMS, sizeof(cl_mem));
    r->w16 = calloc((size_t)L * CLG_MAX_PARAMS, sizeof(cl_mem));
    if (!r->master || !r->w16)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = 0; i < L; i++)
        for (int p = 0; p < r->layers[i].nparams; p++) {
            clg_param *pr = &r->layers[i].params[p];
            if (!pr->trainable || pr->numel == 0)
                continue;
            int idx = i * CLG_MAX_PARAMS + p;
            CLG_TRY(clg_buf_alloc(dev, pr->numel * sizeof(float), &r->master[idx]));
            CLG_TRY(clg_buf_alloc(dev, pr->numel * 2, &r->w16[idx]));
            CLG_CL_CHECK(err, clEnqueueCopyBuffer(dev->queue, pr->value, r->master[idx], 0, 0,
                                                  pr->numel * sizeof(float), 0, NULL, NULL));
        }
    return clg_replica_weights_updated(r);
}

cl_mem clg_replica_master(const clg_replica *r, const clg_param_ref *ref)
{
    if (r->fp16 && r->master && ref->param->trainable) {
        cl_mem m = r->master[ref->layer->index * CLG_MAX_PARAMS + (int)(ref->param - ref->layer->params)];
        if (m)
            return m;
    }
    return ref->param->value;
}

clg_status clg_replica_weights_updated(clg_replica *r)
{
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    if (r->fp16 && r->master && r->varena && r->harena && r->arena_bytes / sizeof(float) <= INT32_MAX) {
        /* one launch over the arenas (master, half, fp32 view; zero padding stays zero) */
        cl_kernel k;
        CLG_TRY(clg_kernel_get(dev, "convert", cvt_opts(dev), "round_weights", &k));
        int n = (int)(r->arena_bytes / sizeof(float));
        CLG_CL_CHECK(err, clSetKernelArg(k, 0, sizeof(cl_mem), &r->parena));
        CLG_CL_CHECK(err, clSetKernelArg(k, 1, sizeof(cl_mem), &r->harena));
        CLG_CL_CHECK(err, clSetKernelArg(k, 2, sizeof(cl_mem), &r->varena));
        CLG_CL_CHECK(err, clSetKernelArg(k, 3, sizeof(int), &n));
        CLG_TRY(clg_launch_1d(dev, k, (size_t)n, 64));
    } else if (r->fp16 && r->master) {
        cl_kernel k;
        CLG_TRY(clg_kernel_get(dev, "convert", cvt_opts(dev), "round_weights", &k));
        for (int i = 0; i < r->nlayers; i++)
            for (int p = 0; p < r->layers[i].nparams; p++) {
                int idx = i * CLG_MAX_PARAMS + p;
                clg_param *pr = &r->layers[i].params[p];
                if (!r->master[idx] || !r->w16[idx])
                    continue;
                if (pr->numel > INT32_MAX)
                    return clg_err_set(err, CLG_ERR_UNSUPPORTED, "parameter %s.%s is too large", r->layers[i].name,
                                       pr->name);
                int n = (int)pr->numel;
                CLG_CL_CHECK(err, clSetKernelArg(k, 0, sizeof(cl_mem), &r->master[idx]));
                CLG_CL_CHECK(err, clSetKernelArg(k, 1, sizeof(cl_mem), &r->w16[idx]));
                CLG_CL_CHECK(err, clSetKernelArg(k, 2, sizeof(cl_mem), &pr->value));
                CLG_CL_CHECK(err, clSetKernelArg(k, 3, sizeof(int), &n));
                CLG_TRY(clg_launch_1d(dev, k, (size_t)n, 64));
            }
    }
    clg_replica_params_changed(r);
    return CLG_OK;
}

// ---- parameter arena ----

/* The arenas: values (fp16: the master copies), gradients, and in fp16 mode
 * the layers' fp32 views of the half weights. */
enum { AR_P = 0, AR_G = 1, AR_V = 2 };

/* Where trainable parameter ref's authoritative fp32 value is kept: the
 * master slot in fp16 mode, else param->value. */
static cl_mem *value_slot(clg_replica *r, const clg_param_ref *ref)
{
    if (r->fp16 && r->master) {
        cl_mem *m = &r->master[ref->layer->index * CLG_MAX_PARAMS + (int)(ref->param - ref->layer->params)];
        if (*m)
            return m;
    }
    return &ref->param->value;
}

static cl_mem *arena_slot(clg_replica *r, const clg_param_ref *ref, int a)
{
    return a == AR_P ? value_slot(r, ref) : a == AR_G ? &ref->param->grad : &ref->param->value;
}

/* Gives a replaced parameter buffer back to the pool after one host write
 * of zeros over all of it: its values came from a host write of fewer
 * bytes than the block, and oclgrind 21.10 then tracks only that many
 * bytes of the block as initialisable, so a reuse as another operation's
 * workspace would be misreported (tests/oclgrind_check.sh; freeing it
 * instead passes the write's size on to the next buffer created). */
static void pool_return(clg_device *dev, cl_mem m)
{
    size_t size = 0;
    if (!m)
        return;
    void *z = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL) == CL_SUCCESS && size ? calloc(1, size)
                                                                                                 : NULL;
    if (z)
        clEnqueueWriteBuffer(dev->queue, m, CL_TRUE, 0, size, z, 0, NULL, NULL); /* best effort */
    free(z);
    clg_buf_release(dev, m);
}

static void release_subs(cl_mem *sub, int n)
{
    for (int i = 0; sub && i < n; i++)
        if (sub[i]) {
            clReleaseMemObject(sub[i]);
            sub[i] = NULL;
        }
}

/* Hands the arenas' sub-buffers back (the layers' and master slots that
 * point at them become NULL) and frees the arenas. */
static void arena_free(clg_replica *r)
{
    cl_mem *subs[3] = {r->psub, r->gsub, r->vsub};
    for (int i = 0; i < r->nlayers && r->narena > 0; i++)
        for (int p = 0; p < r->layers[i].nparams; p++) {
            clg_param *pr = &r->layers[i].params[p];
            cl_mem *m = r->master ? &r->master[i * CLG_MAX_PARAMS + p] : NULL;
            for (int a = 0; a < 3; a++)
                for (int j = 0; subs[a] && j < r->narena; j++) {
                    cl_mem s = subs[a][j];
                    if (!s)
                        continue;
                    if (pr->value == s)
                        pr->value = NULL;
                    if (pr->grad == s)
                        pr->grad = NULL;
                    if (m && *m == s)
                        *m = NULL;
                }
        }
    for (int a = 0; a < 3; a++) {
        release_subs(subs[a], r->narena);
        free(subs[a]);
    }
    cl_mem bufs[4] = {r->parena, r->garena, r->varena, r->harena};
    for (int a = 0; a < 4; a++)
        if (bufs[a])
            clReleaseMemObject(bufs[a]);
    free(r->arena_off);
    r->parena = r->garena = r->varena = r->harena = NULL;
    r->psub = r->gsub = r->vsub = NULL;
    r->arena_off = NULL;
    r->arena_bytes = 0;
    r->narena = 0;
}

clg_status clg_replica_arena(clg_replica *r, const size_t *off, size_t bytes)
{
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(r, 1, &refs, &n));
    int na = r->fp16 && r->master ? 3 : 2;
    size_t cnt = (size_t)CLG_MAX(n, 1);
    size_t *lay = calloc(cnt, sizeof *lay);
    cl_mem buf[3] = {NULL, NULL, NULL}, *sub[3] = {NULL, NULL, NULL}, half = NULL;
    clg_status st = lay ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena)");
    for (int a = 0; a < na && st == CLG_OK; a++)
        if (!(sub[a] = calloc(cnt, sizeof(cl_mem))))
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena)");
    if (st == CLG_OK && off) {
        for (int i = 0; i < n; i++) {
            lay[i] = off[i];
            if (off[i] % sizeof(float) || off[i] > bytes || refs[i].param->numel * sizeof(float) > bytes - off[i]) {
                st = clg_err_set(err, CLG_ERR_INTERNAL, "parameter arena: %s.%s does not fit its place",
                                 refs[i].layer->name, refs[i].param->name);
                break;
            }
        }
    } else if (st == CLG_OK) { /* the data-parallel layout's rule (src/parallel/dp.c make_layout) */
        cl_uint bits = 0;
        size_t align = 128;
        if (clGetDeviceInfo(dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) == CL_SUCCESS &&
            bits / 8 > align)
            align = bits / 8;
        bytes = 0;
        for (int i = n - 1; i >= 0; i--) {
            lay[i] = bytes;
            bytes += (refs[i].param->numel * sizeof(float) + align - 1) / align * align;
        }
    }
    if (st == CLG_OK && bytes % sizeof(float))
        st = clg_err_set(err, CLG_ERR_INTERNAL, "parameter arena of %zu bytes: not whole floats", bytes);
    int same = r->parena && r->narena == n && r->arena_bytes == bytes && memcmp(lay, r->arena_off, n * sizeof *lay) == 0;
    cl_int e = CL_SUCCESS;
    for (int a = 0; a < na && st == CLG_OK && bytes > 0 && !same; a++) {
        buf[a] = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "clCreateBuffer (parameter arena)", __FILE__, __LINE__);
        else /* padding stays zero: the optimizer and the reduction run over it */
            st = clg_buf_fill(dev, buf[a], 0, bytes / sizeof(float), 0.0f);
    }
    if (st == CLG_OK && na == 3 && bytes > 0 && !same) { /* the half copies (written by round_weights only) */
        half = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, bytes / 2, NULL, &e);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "clCreateBuffer (half weights arena)", __FILE__, __LINE__);
    }
    float *img = st == CLG_OK && bytes > 0 && !same ? calloc(bytes / sizeof(float), sizeof(float)) : NULL;
    if (st == CLG_OK && bytes > 0 && !same && !img)
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena image, %zu bytes)", bytes);
    for (int i = 0; i < n && st == CLG_OK && bytes > 0 && !same; i++) {
        size_t nb = refs[i].param->numel * sizeof(float);
        if (nb == 0)
            continue;
        cl_buffer_region reg = {lay[i], nb};
        for (int a = 0; a < na && st == CLG_OK; a++) {
            sub[a][i] = clCreateSubBuffer(buf[a], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
            if (e != CL_SUCCESS) {
                st = clg_cl_fail(err, e, "clCreateSubBuffer (parameter arena)", __FILE__, __LINE__);
                break;
            }
        }
        /* the values into the host image of the parameter arena */
        cl_mem src = *arena_slot(r, &refs[i], AR_P);
        if (st == CLG_OK && src &&
            (e = clEnqueueReadBuffer(dev->queue, src, CL_TRUE, 0, nb, img + lay[i] / sizeof(float), 0, NULL, NULL)) !=
                CL_SUCCESS)
            st = clg_cl_fail(err, e, "clEnqueueReadBuffer (parameter arena)", __FILE__, __LINE__);
    }
    /* one host write of the whole parameter arena (zero padding): oclgrind
     * keeps the initialised state of a whole-buffer write, not of copies
     * into a region of it (tests/oclgrind_check.sh); gradients start at
     * zero (the fill above); fp16: the views and half copies come from the
     * masters (clg_replica_weights_updated below) */
    if (st == CLG_OK && bytes > 0 && !same &&
        (e = clEnqueueWriteBuffer(dev->queue, buf[AR_P], CL_TRUE, 0, bytes, img, 0, NULL, NULL)) != CL_SUCCESS)
        st = clg_cl_fail(err, e, "clEnqueueWriteBuffer (parameter arena)", __FILE__, __LINE__);
    free(img);
    /* the old buffers go back to the pool below, where another queue (a
     * lane's transfer queue) may take them: nothing may still use them */
    if (st == CLG_OK && bytes > 0 && !same && (e = clFinish(dev->queue)) != CL_SUCCESS)
        st = clg_cl_fail(err, e, "clFinish (parameter arena)", __FILE__, __LINE__);
    if (st != CLG_OK || bytes == 0 || same) { /* the old buffers stay in place */
        for (int a = 0; a < na; a++) {
            release_subs(sub[a], n);
            free(sub[a]);
            if (buf[a])
                clReleaseMemObject(buf[a]);
        }
        if (half)
            clReleaseMemObject(half);
        free(refs);
        free(lay);
        return st;
    }
    int had = r->narena > 0;
    for (int i = 0; i < n; i++) {
        if (!sub[AR_P][i])
            continue;
        for (int a = 0; a < na; a++) {
            cl_mem *slot = arena_slot(r, &refs[i], a);
            if (!had)
                pool_return(dev, *slot);
            *slot = sub[a][i];
        }
        int idx = refs[i].layer->index * CLG_MAX_PARAMS + (int)(refs[i].param - refs[i].layer->params);
        if (na == 3 && r->w16 && r->w16[idx]) { /* the half arena replaces them */
            pool_return(dev, r->w16[idx]);
            r->w16[idx] = NULL;
        }
    }
    if (had) { /* the slots point at the new arenas now: arena_free only releases the old ones */
        release_subs(r->psub, r->narena);
        release_subs(r->gsub, r->narena);
        release_subs(r->vsub, r->narena);
        arena_free(r);
    }
    r->parena = buf[AR_P];
    r->garena = buf[AR_G];
    r->varena = buf[AR_V];
    r->harena = half;
    r->psub = sub[AR_P];
    r->gsub = sub[AR_G];
    r->vsub = sub[AR_V];
    r->arena_off = lay;
    r->arena_bytes = bytes;
    r->narena = n;
    free(refs);
    return clg_replica_weights_updated(r); /* fp16: views and half copies; tells the layers */
}

clg_status clg_replica_create(clg_net *net, clg_device *dev, uint64_t seed, clg_replica **out)
{
    *out = NULL;
    clg_err *err = clg_dev_err(dev);
    clg_replica *r = calloc(1, sizeof *r);
    if (!r)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory creating a replica");
    r->net = net;
    r->dev = dev;
    r->nlayers = net->nlayers;
    r->batch = net->batch;
    r->loss_index = net->loss_index;
    r->layers = calloc((size_t)net->nlayers, sizeof *r->layers);
    r->act = calloc((size_t)net->nlayers, sizeof *r->act);
    r->dact = calloc((size_t)net->nlayers, sizeof *r->dact);
    clg_status st = (r->layers && r->act && r->dact) ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = instantiate(err, net, r->layers, r->batch, 0);
    clg_rng rng;
    clg_rng_seed(&rng, seed, 0x6e6574ULL);
    for (int i = 0; i < r->nlayers && st == CLG_OK; i++) {
        clg_layer *l = &r->layers[i];
        st = l->ops->init(l, dev, &rng);
        if (st != CLG_OK)
            st = layer_fail(err, st, net, l, "init");
    }
    r->fp16 = net->fp16;
    if (st == CLG_OK && r->fp16 && !(r->work = calloc((size_t)r->nlayers, sizeof *r->work)))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = plan_memory(r, 0, !r->fp16, 0, &r->fp32_bytes);
    r->planned_bytes = r->fp32_bytes;
    if (st == CLG_OK && r->fp16) {
        st = plan_memory(r, 0, 0, 1, &r->fp32_offset_bytes);
        if (st == CLG_OK)
            st = plan_memory(r, 1, 1, 1, &r->planned_bytes);
    }
    if (st == CLG_OK && r->fp16)
        st = setup_fp16(r);
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
    arena_free(r);
    destroy_layers(r->layers, r->nlayers, r->dev);
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

static void prof_kernels(clg_replica *r, double *ms, long *n)
{
    double k = 0;
    int c = 0;
    clg_kprof_take(r->dev, &k, &c);
    *ms += k;
    *n += c;
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

void clg_replica_set_input(clg_replica *r, cl_mem buf, size_t off)
{
    r->input.mem = buf;
    r->input.off = off;
}

void clg_replica_set_labels(clg_replica *r, cl_mem labels, size_t off, float grad_scale)
{
    if (r->loss_index < 0)
        return;
    clg_layer *l = &r->layers[r->loss_index];
    l->loss.labels = labels;
    l->loss.labels_off = off;
    l->loss.grad_scale = grad_scale;
}

static clg_tensor with_n(const clg_tensor *t, int n)
{
    clg_tensor x = *t;
    x.n = n;
    return x;
}

clg_status clg_replica_forward(clg_replica *r, int n, int training)
{
    clg_err *err = clg_dev_err(r->dev);
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "forward: batch %d outside [1, %d]", n, r->batch);
    if (!r->input.mem)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "forward: no input set");
    if (r->profile) { /* launches before the forward pass (uploads, fills) are not a layer's */
        clFinish(r->dev->queue);
        clg_kprof_take(r->dev, NULL, NULL);
    }
    for (int i = 0; i < r->nlayers; i++) {
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS];
        double t0 = r->profile ? clg_now_sec() : 0;
        int half_out = r->fp16 && i != r->nlayers - 1;
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = with_n(src < 0 ? &r->input : &r->act[src], n);
            if (!r->fp16 || src < 0)
                continue;
            if (src == i - 1 && r->work[src].fchain) { /* the previous output, still in fp32 */
                in[k].mem = r->work[src].f_out;
                in[k].off = 0;
            } else { /* stored in half: expand into fp32 */
                CLG_TRY(expand(r->dev, &in[k], r->work[i].f_in[k], &in[k]));
            }
        }
        clg_tensor o = with_n(&r->act[i], n), oh = o;
        if (half_out) {
            o.mem = r->work[i].f_out;
            o.off = 0;
        }
        clg_status st = l->ops->forward(l, r->dev, in, l->nin, &o, training);
        if (st != CLG_OK)
            return layer_fail(err, st, r->net, l, "forward");
        if (half_out) /* round the output to half for storage (and in place when the next layer reads it) */
            CLG_TRY(cvt(r->dev, r->work[i].fchain ? "f32_to_f16_keep" : "f32_to_f16", o.mem, o.off, oh.mem, oh.off,
                        clg_tensor_numel(&o)));
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_fwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_fwd_k[i], &r->prof_fwd_n[i]);
        }
        if (r->after_layer)
            CLG_TRY(r->after_layer(r->after_layer_user, i, 0));
    }
    if (r->profile)
        r->prof_calls++;
    return CLG_OK;
}

static clg_status add_kernel(clg_device *dev, cl_mem y, cl_mem x, size_t n)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "optim", "", "axpy_f32", &k));
    clg_err *err = clg_dev_err(dev);
    int nn = (int)n;
    float a = 1.0f;
    CLG_CL_CHECK(err, clSetKernelArg(k, 0, sizeof(cl_mem), &y));
    CLG_CL_CHECK(err, clSetKernelArg(k, 1, sizeof(cl_mem), &x));
    CLG_CL_CHECK(err, clSetKernelArg(k, 2, sizeof(float), &a));
    CLG_CL_CHECK(err, clSetKernelArg(k, 3, sizeof(int), &nn));
    return clg_launch_1d(dev, k, n, 64);
}

/* Backward in fp16 storage: each layer's inputs, output and output gradient
 * are expanded from half into the fp32 working buffers, its input gradients
 * land in fp32 and are rounded into the half gradient tensors (summed there
 * where a tensor feeds several layers). */
static clg_status backward_fp16(clg_replica *r, int n, char *written)
{
    clg_err *err = clg_dev_err(r->dev);
    int L = r->nlayers;
    for (int i = L - 1; i >= 0; i--) {
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        double t0 = r->profile ? clg_now_sec() : 0;
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = with_n(src < 0 ? &r->input : &r->act[src], n);
            din[k] = in[k];
            if (src < 0) {
                din[k].mem = NULL;
                continue;
            }
            CLG_TRY(expand(r->dev, &in[k], r->work[i].b_in[k], &in[k]));
            din[k].mem = r->work[i].b_din[k];
            din[k].off = 0;
        }
        clg_tensor o = with_n(&r->act[i], n);
        if (i != L - 1)
            CLG_TRY(expand(r->dev, &o, r->work[i].b_out, &o));
        clg_tensor dout = with_n(&r->dact[i], n);
        if (r->work[i].bchain) { /* handed over in fp32 by layer i+1 */
            dout.mem = r->work[i + 1].b_din[r->work[i].bchain_k];
            dout.off = 0;
        } else if (dout.mem) {
            CLG_TRY(expand(r->dev, &dout, r->work[i].b_dout, &dout));
        }
        clg_status st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (st != CLG_OK)
            return layer_fail(err, st, r->net, l, "backward");
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            if (src < 0)
                continue;
            clg_tensor g = with_n(&r->dact[src], n);
            if (r->work[src].bchain) { /* layer src reads it in fp32: round in place */
                CLG_TRY(cvt(r->dev, "f32_round_f16", din[k].mem, din[k].off, din[k].mem, din[k].off,
                            clg_tensor_numel(&g)));
                continue;
            }
            CLG_TRY(cvt(r->dev, written[src] ? "f16_add_f32" : "f32_to_f16", written[src] ? g.mem : din[k].mem,
                        written[src] ? g.off : din[k].off, written[src] ? din[k].mem : g.mem,
                        written[src] ? din[k].off : g.off, clg_tensor_numel(&g)));
            written[src] = 1;
        }
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_bwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_bwd_k[i], &r->prof_bwd_n[i]);
        }
        if (r->after_layer)
            CLG_TRY(r->after_layer(r->after_layer_user, i, 1));
    }
    return CLG_OK;
}

clg_status clg_replica_backward(clg_replica *r, int n)
{
    clg_err *err = clg_dev_err(r->dev);
    int L = r->nlayers;
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "backward: batch %d outside [1, %d]", n, r->batch);
    if (r->loss_index < 0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: the model has no loss layer (softmax or mse) to train",
                           r->net->source);
    char *written = calloc((size_t)L, 1);
    if (!written)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (r->fp16) {
        clg_status st = backward_fp16(r, n, written);
        free(written);
        return st;
    }
    clg_status st = CLG_OK;
    for (int i = L - 1; i >= 0 && st == CLG_OK; i--) {
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        int pending[CLG_MAX_INPUTS]; /* din[k] went to scratch; add into dact[src] after */
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            pending[k] = 0;
            in[k] = with_n(src < 0 ? &r->input : &r->act[src], n);
            if (src < 0) {
                din[k] = in[k];
                din[k].mem = NULL;
                continue;
            }
            din[k] = with_n(&r->dact[src], n);
            if (written[src]) {
                size_t bytes = clg_tensor_numel(&r->dact[src]) * sizeof(float);
                if (r->scratch_bytes[k] < bytes) {
                    clg_buf_release(r->dev, r->scratch[k]);
                    r->scratch[k] = NULL;
                    r->scratch_bytes[k] = 0;
                    st = clg_buf_alloc(r->dev, bytes, &r->scratch[k]);
                    if (st != CLG_OK)
                        break;
                    r->scratch_bytes[k] = bytes;
                }
                din[k].mem = r->scratch[k];
                din[k].off = 0;
                pending[k] = 1;
            }
            written[src] = 1;
        }
        if (st != CLG_OK)
            break;
        clg_tensor o = with_n(&r->act[i], n);
        clg_tensor dout = with_n(&r->dact[i], n);
        double t0 = r->profile ? clg_now_sec() : 0;
        st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (r->profile) {
            clFinish(r->dev->queue);
            r->prof_bwd[i] += 1000 * (clg_now_sec() - t0);
            prof_kernels(r, &r->prof_bwd_k[i], &r->prof_bwd_n[i]);
        }
        if (st != CLG_OK) {
            st = layer_fail(err, st, r->net, l, "backward");
            break;
        }
        for (int k = 0; k < l->nin && st == CLG_OK; k++)
            if (pending[k])
                st = add_kernel(r->dev, r->dact[l->inputs[k]].mem, r->scratch[k], clg_tensor_numel(&din[k]));
        if (st == CLG_OK && r->after_layer)
            st = r->after_layer(r->after_layer_user, i, 1);
    }
    free(written);
    return st;
}

/* Runs each layer's forward and backward once on zeroed inputs, the layers
 * taken from the last to the first (reverse) or first to last, so a
 * process can compile the kernels a training step launches in another
 * order than the step does (clg_session_precompile). Values are meaningless
 * afterwards (activations, gradients, batch-norm running statistics);
 * weights are not touched. fp16 storage runs the plain forward and backward
 * (its conversions chain across layers). */
clg_status clg_replica_precompile(clg_replica *r, int n, int reverse)
{
    clg_err *err = clg_dev_err(r->dev);
    if (n <= 0 || n > r->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "precompile: batch %d outside [1, %d]", n, r->batch);
    if (!r->input.mem)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "precompile: no input set");
    if (r->fp16 || r->loss_index < 0) {
        CLG_TRY(clg_replica_forward(r, n, 1));
        return r->loss_index < 0 ? CLG_OK : clg_replica_backward(r, n);
    }
    int L = r->nlayers;
    for (int j = 0; j < L; j++) {
        int i = reverse ? L - 1 - j : j;
        clg_layer *l = &r->layers[i];
        clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
        for (int k = 0; k < l->nin; k++) {
            int src = l->inputs[k];
            in[k] = with_n(src < 0 ? &r->input : &r->act[src], n);
            din[k] = src < 0 ? in[k] : with_n(&r->dact[src], n);
            if (src < 0)
                din[k].mem = NULL;
            else /* garbage could hold denormals (slow) or NaN: zeros compute like data */
                CLG_TRY(clg_buf_fill(r->dev, in[k].mem, in[k].off, clg_tensor_numel(&in[k]), 0.0f));
        }
        clg_tensor o = with_n(&r->act[i], n), dout = with_n(&r->dact[i], n);
        clg_status st = l->ops->forward(l, r->dev, in, l->nin, &o, 1);
        if (st != CLG_OK)
            return layer_fail(err, st, r->net, l, "forward");
        if (dout.mem)
            CLG_TRY(clg_buf_fill(r->dev, dout.mem, dout.off, clg_tensor_numel(&dout), 0.0f));
        st = l->ops->backward(l, r->dev, in, l->nin, &o, &dout, din);
        if (st != CLG_OK)
            return layer_fail(err, st, r->net, l, "backward");
    }
    return CLG_OK;
}

const clg_tensor *clg_replica_output(const clg_replica *r) { return &r->act[r->nlayers - 1]; }

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

// ---- non-finite diagnosis ----

typedef struct nf_diag {
    clg_replica *r;
    int n;
    char *buf;
    size_t cap;
    int found;
    float *host;
    size_t host_cap;
} nf_diag;

/* Index of the first non-finite float of mem[off .. off + n) (blocking read
 * behind everything enqueued so far), -1 when all are finite, -2 when the
 * read failed. *v receives the value. */
static long nf_first(nf_diag *d, cl_mem mem, size_t off, size_t n, float *v)
{
    if (!mem || n == 0)
        return -1;
    if (d->host_cap < n) {
        float *h = realloc(d->host, n * sizeof(float));
        if (!h)
            return -2;
        d->host = h;
        d->host_cap = n;
    }
    if (clEnqueueReadBuffer(d->r->dev->queue, mem, CL_TRUE, off * sizeof(float), n * sizeof(float), d->host, 0, NULL,
                            NULL) != CL_SUCCESS)
        return -2;
    for (size_t k = 0; k < n; k++)
        if (!isfinite(d->host[k])) {
            *v = d->host[k];
            return (long)k;
        }
    return -1;
}

/* ", its parameters are finite" or ", its parameter 'weight' is non-finite already". */
static void nf_params(nf_diag *d, const clg_layer *l, char *out, size_t cap)
{
    snprintf(out, cap, "%s", l->nparams ? "; its parameters are finite (the overflow happens in this layer)" : "");
    for (int p = 0; p < l->nparams; p++) { /* trainable only: the check's own forward updates running statistics */
        float v;
        if (l->params[p].trainable && nf_first(d, l->params[p].value, 0, l->params[p].numel, &v) >= 0) {
            snprintf(out, cap, "; its parameter '%s' is non-finite already (a previous update overflowed)",
                     l->params[p].name);
            return;
        }
    }
}

static clg_status nf_hook(void *user, int i, int backward)
{
    nf_diag *d = user;
    clg_replica *r = d->r;
    clg_layer *l = &r->layers[i];
    float v = 0;
    long k = -1;
    char what[96] = "", extra[160] = "";
    if (!backward) {
        clg_tensor o = with_n(&r->act[i], d->n);
        if (r->fp16 && i != r->nlayers - 1) { /* the fp32 output before rounding to half */
            o.mem = r->work[i].f_out;
            o.off = 0;
        }
        k = nf_first(d, o.mem, o.off, clg_tensor_numel(&o), &v);
        if (k >= 0) {
            snprintf(what, sizeof what, "output");
            nf_params(d, l, extra, sizeof extra);
        } else if (l->is_loss && (k = nf_first(d, l->loss.result, 0, 1, &v)) >= 0) {
            snprintf(what, sizeof what, "loss");
        }
    } else {
        for (int p = 0; p < l->nparams && k < 0; p++)
            if (l->params[p].trainable && (k = nf_first(d, l->params[p].grad, 0, l->params[p].numel, &v)) >= 0)
                snprintf(what, sizeof what, "gradient of its parameter '%s'", l->params[p].name);
        for (int j = 0; j < l->nin && k < 0; j++) {
            int src = l->inputs[j];
            if (src < 0)
                continue;
            clg_tensor g = with_n(&r->dact[src], d->n);
            if (r->fp16) {
                g.mem = r->work[i].b_din[j];
                g.off = 0;
            }
            if ((k = nf_first(d, g.mem, g.off, clg_tensor_numel(&g), &v)) >= 0)
                snprintf(what, sizeof what, "gradient of its input %d", j);
        }
    }
    if (backward && k >= 0)
        nf_params(d, l, extra, sizeof extra);
    if (k == -2) {
        snprintf(d->buf, d->cap, "the check of layer '%s' could not read its buffers", l->name);
        d->found = 1;
    } else if (k >= 0) {
        snprintf(d->buf, d->cap, "first non-finite value in %s: layer '%s' (%s, %s:%d), %s (%g at element %ld)%s",
                 backward ? "backward" : "forward", l->name, l->ops->type, r->net->source, l->line, what, v, k, extra);
        d->found = 1;
    }
    return d->found ? CLG_ERR_INTERNAL : CLG_OK; /* stop at the first finding */
}

void clg_replica_explain_nonfinite(clg_replica *r, int n, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = 0;
    if (!r || n <= 0 || n > r->batch || !r->input.mem) {
        snprintf(buf, cap, "no staged batch to check");
        return;
    }
    nf_diag d = {.r = r, .n = n, .buf = buf, .cap = cap};
    clg_err saved;
    clg_err_copy(&saved, clg_dev_err(r->dev)); /* the caller's failure stays the device's last error */
    clFinish(r->dev->queue);
    clg_tensor x = with_n(&r->input, n);
    float v = 0;
    long k = nf_first(&d, x.mem, x.off, clg_tensor_numel(&x), &v);
    if (k >= 0) {
        snprintf(buf, cap, "the input batch holds a non-finite value (%g at element %ld)", v, k);
    } else {
        clg_status (*hook)(void *, int, int) = r->after_layer;
        void *user = r->after_layer_user;
        const clg_layer_sync **sync = calloc((size_t)r->nlayers, sizeof *sync);
        if (!sync) {
            snprintf(buf, cap, "no memory for the check");
            clg_err_copy(clg_dev_err(r->dev), &saved);
            return;
        }
        for (int i = 0; i < r->nlayers; i++) { /* alone: the other replicas are not running this step */
            sync[i] = r->layers[i].sync;
            r->layers[i].sync = NULL;
        }
        r->after_layer = nf_hook;
        r->after_layer_user = &d;
        clg_status st = clg_replica_forward(r, n, 1);
        if (st == CLG_OK && !d.found)
            st = clg_replica_backward(r, n);
        r->after_layer = hook;
        r->after_layer_user = user;
        for (int i = 0; i < r->nlayers; i++)
            r->layers[i].sync = sync[i];
        free(sync);
        for (int i = 0; i < r->nlayers && !d.found && st == CLG_OK; i++) /* NaN weights behind a ReLU (max(NaN, 0) = 0) */
            for (int p = 0; p < r->layers[i].nparams && !d.found; p++)
                if ((k = nf_first(&d, r->layers[i].params[p].value, 0, r->layers[i].params[p].numel, &v)) >= 0) {
                    snprintf(buf, cap,
                             "every output and gradient is finite when the batch is run again, but layer '%s' (%s, "
                             "%s:%d) holds a non-finite parameter '%s' (%g at element %ld)",
                             r->layers[i].name, r->layers[i].ops->type, r->net->source, r->layers[i].line,
                             r->layers[i].params[p].name, v, k);
                    d.found = 1;
                }
        if (!d.found)
            snprintf(buf, cap, st == CLG_OK ? "every layer's output, gradient and parameter is finite when the batch is "
                                              "run again"
                                            : "the check could not run the batch again");
    }
    clFinish(r->dev->queue);
    clg_err_copy(clg_dev_err(r->dev), &saved);
    free(d.host);
}
