/* A network with one replica's weights -> ONNX (see export.h). Layer
 * options are read back from the model text's sections (the source of truth
 * the layers were configured from); weights from the replica's authoritative
 * fp32 buffers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "onnx/export.h"
#include "onnx/onnx.h"
#include "src/onnx/onnx.pb-c.h"

typedef struct {
    clg_err *err;
    const clg_net *net;
    const clg_replica *rep; /* the weights */
    const clg_replica *const *lrep; /* NULL, or per layer the replica holding its weights (pipeline stages) */
    void **allocs; /* everything below is freed through this list */
    size_t nallocs, capallocs;
    int oom;
    Onnx__NodeProto **nodes;
    size_t nnodes, capnodes;
    Onnx__TensorProto **inits;
    size_t ninits, capinits;
    int seq; /* the network has sequence layers: opset 17 */
} ex;

static void *xalloc(ex *e, size_t n)
{
    if (e->oom)
        return NULL;
    if (e->nallocs == e->capallocs) {
        size_t nc = e->capallocs ? e->capallocs * 2 : 256;
        void **na = realloc(e->allocs, nc * sizeof *na);
        if (!na) {
            e->oom = 1;
            return NULL;
        }
        e->allocs = na;
        e->capallocs = nc;
    }
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        e->oom = 1;
        return NULL;
    }
    e->allocs[e->nallocs++] = p;
    return p;
}

static char *xstr(ex *e, const char *s)
{
    size_t n = strlen(s);
    char *d = xalloc(e, n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static int push(ex *e, void ***arr, size_t *n, size_t *cap, void *item)
{
    if (!item || e->oom)
        return 0;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 32;
        void **na = realloc(*arr, nc * sizeof *na);
        if (!na) {
            e->oom = 1;
            return 0;
        }
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = item;
    return 1;
}

static Onnx__NodeProto *node(ex *e, const char *op, const char *name, const char *const *in, int nin, const char *out)
{
    Onnx__NodeProto *n = xalloc(e, sizeof *n);
    char **ins = xalloc(e, sizeof(char *) * (size_t)(nin > 0 ? nin : 1));
    char **outs = xalloc(e, sizeof(char *));
    if (!n || !ins || !outs)
        return NULL;
    onnx__node_proto__init(n);
    for (int i = 0; i < nin; i++)
        ins[i] = xstr(e, in[i]);
    outs[0] = xstr(e, out);
    n->n_input = (size_t)nin;
    n->input = ins;
    n->n_output = 1;
    n->output = outs;
    n->name = xstr(e, name);
    n->op_type = xstr(e, op);
    if (!push(e, (void ***)&e->nodes, &e->nnodes, &e->capnodes, n))
        return NULL;
    return n;
}

/* A new attribute name of the given type appended to node n (NULL where n is NULL or an allocation fails). */
static Onnx__AttributeProto *new_attr(ex *e, Onnx__NodeProto *n, const char *name,
                                      Onnx__AttributeProto__AttributeType type)
{
    if (!n)
        return NULL;
    Onnx__AttributeProto *a = xalloc(e, sizeof *a);
    Onnx__AttributeProto **na = xalloc(e, sizeof *na * (n->n_attribute + 1));
    if (!a || !na)
        return NULL;
    onnx__attribute_proto__init(a);
    a->name = xstr(e, name);
    a->has_type = 1;
    a->type = type;
    for (size_t i = 0; i < n->n_attribute; i++)
        na[i] = n->attribute[i];
    na[n->n_attribute] = a;
    n->attribute = na;
    n->n_attribute++;
    return a;
}

static void attr_int(ex *e, Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (!a)
        return;
    a->has_i = 1;
    a->i = v;
}

static void attr_float(ex *e, Onnx__NodeProto *n, const char *name, float v)
{
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (!a)
        return;
    a->has_f = 1;
    a->f = v;
}

static void attr_ints(ex *e, Onnx__NodeProto *n, const char *name, const int64_t *v, int cnt)
{
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *d = xalloc(e, sizeof(int64_t) * (size_t)cnt);
    if (!a || !d)
        return;
    memcpy(d, v, sizeof(int64_t) * (size_t)cnt);
    a->n_ints = (size_t)cnt;
    a->ints = d;
}

/* A float initializer (raw little-endian data). */
static void init_f32(ex *e, const char *name, const int64_t *dims, int ndim, const float *data)
{
    Onnx__TensorProto *t = xalloc(e, sizeof *t);
    int64_t *d = xalloc(e, sizeof(int64_t) * (size_t)(ndim ? ndim : 1));
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)dims[i];
    uint8_t *raw = xalloc(e, n * 4);
    if (!t || !d || !raw)
        return;
    onnx__tensor_proto__init(t);
    if (ndim > 0) /* a scalar has no dims (and dims may be NULL) */
        memcpy(d, dims, sizeof(int64_t) * (size_t)ndim);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &data[i], 4);
        raw[4 * i] = (uint8_t)u;
        raw[4 * i + 1] = (uint8_t)(u >> 8);
        raw[4 * i + 2] = (uint8_t)(u >> 16);
        raw[4 * i + 3] = (uint8_t)(u >> 24);
    }
    t->n_dims = (size_t)ndim;
    t->dims = d;
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    t->name = xstr(e, name);
    t->has_raw_data = 1;
    t->raw_data.len = n * 4;
    t->raw_data.data = raw;
    push(e, (void ***)&e->inits, &e->ninits, &e->capinits, t);
}

static void init_scalar(ex *e, const char *name, float v) { init_f32(e, name, NULL, 0, &v); }

/* An int64 initializer of cnt values, rank 1 (ndim 1) or a scalar (ndim 0). */
static void init_i64(ex *e, const char *name, int ndim, const int64_t *v, int cnt)
{
    Onnx__TensorProto *t = xalloc(e, sizeof *t);
    int64_t *d = xalloc(e, sizeof(int64_t));
    uint8_t *raw = xalloc(e, (size_t)cnt * 8);
    if (!t || !d || !raw)
        return;
    onnx__tensor_proto__init(t);
    d[0] = cnt;
    for (int i = 0; i < cnt; i++)
        for (int b = 0; b < 8; b++)
            raw[8 * i + b] = (uint8_t)((uint64_t)v[i] >> (8 * b));
    t->n_dims = (size_t)ndim;
    t->dims = d;
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    t->name = xstr(e, name);
    t->has_raw_data = 1;
    t->raw_data.len = (size_t)cnt * 8;
    t->raw_data.data = raw;
    push(e, (void ***)&e->inits, &e->ninits, &e->capinits, t);
}

static Onnx__ValueInfoProto *value_info(ex *e, const char *name, int ndim, const int64_t *dims)
{
    Onnx__ValueInfoProto *v = xalloc(e, sizeof *v);
    Onnx__TypeProto *tp = xalloc(e, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = xalloc(e, sizeof *tt);
    Onnx__TensorShapeProto *sh = xalloc(e, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dd = xalloc(e, sizeof *dd * (size_t)ndim);
    if (!v || !tp || !tt || !sh || !dd)
        return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int i = 0; i < ndim; i++) {
        Onnx__TensorShapeProto__Dimension *d = xalloc(e, sizeof *d);
        if (!d)
            return NULL;
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] < 0) { /* the batch: symbolic */
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = xstr(e, "N");
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        }
        dd[i] = d;
    }
    sh->n_dim = (size_t)ndim;
    sh->dim = dd;
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    v->name = xstr(e, name);
    v->type = tp;
    return v;
}

/* A layer's integer key as its section holds it (def when absent). */
static long sec_int(const clg_cfg_section *s, const char *key, long def)
{
    const clg_cfg_kv *kv = clg_cfg_find(s, key);
    return kv ? strtol(kv->value, NULL, 10) : def;
}

static double sec_float(const clg_cfg_section *s, const char *key, double def)
{
    const clg_cfg_kv *kv = clg_cfg_find(s, key);
    return kv ? strtod(kv->value, NULL) : def;
}

static const char *sec_str(const clg_cfg_section *s, const char *key, const char *def)
{
    const clg_cfg_kv *kv = clg_cfg_find(s, key);
    return kv ? kv->value : def;
}

/* Binary node op(a, b) -> out named out. */
static void bin(ex *e, const char *op, const char *a, const char *b, const char *out)
{
    const char *in[2] = {a, b};
    node(e, op, out, in, 2, out);
}

/* GELU, tanh form: 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi),
 * values base.gt_*: Mul x x, Mul x, Mul a, Add x, Mul k, Tanh, Add 1, Mul x, Mul 0.5. */
static void gelu_tanh(ex *e, const char *base, const char *x, const char *out)
{
    char v[9][160], c[4][160];
    static const char *const vn[9] = {"x2", "x3", "ax3", "inner", "u", "tanh", "one_plus", "xt", "out"};
    static const char *const cn[4] = {"a", "k", "one", "half"};
    static const float cv[4] = {0.044715f, 0.79788456080286536f, 1.0f, 0.5f};
    for (int i = 0; i < 9; i++)
        snprintf(v[i], sizeof v[i], "%s.gt_%s", base, vn[i]);
    for (int i = 0; i < 4; i++) {
        snprintf(c[i], sizeof c[i], "%s.gt_%s", base, cn[i]);
        init_scalar(e, c[i], cv[i]);
    }
    bin(e, "Mul", x, x, v[0]);
    bin(e, "Mul", v[0], x, v[1]);
    bin(e, "Mul", v[1], c[0], v[2]);
    bin(e, "Add", x, v[2], v[3]);
    bin(e, "Mul", v[3], c[1], v[4]);
    const char *tin = v[4];
    node(e, "Tanh", v[5], &tin, 1, v[5]);
    bin(e, "Add", v[5], c[2], v[6]);
    bin(e, "Mul", x, v[6], v[7]);
    const char *i8[2] = {v[7], c[3]};
    node(e, "Mul", base, i8, 2, out);
}

/* Activation node(s) from x to out, named base (the GELU form's inner
 * nodes and values base.gelu_*). type: relu, leaky, sigmoid, tanh, gelu. */
static clg_status activation(ex *e, const char *type, double alpha, const char *base, const char *x, const char *out)
{
    char a[160], b[160], c[160], d[160];
    if (strcmp(type, "relu") == 0)
        node(e, "Relu", base, &x, 1, out);
    else if (strcmp(type, "sigmoid") == 0)
        node(e, "Sigmoid", base, &x, 1, out);
    else if (strcmp(type, "tanh") == 0)
        node(e, "Tanh", base, &x, 1, out);
    else if (strcmp(type, "leaky") == 0)
        attr_float(e, node(e, "LeakyRelu", base, &x, 1, out), "alpha", (float)alpha);
    else if (strcmp(type, "gelu") == 0) { /* opset 13 has no Gelu: the erf form */
        snprintf(a, sizeof a, "%s.gelu_div", base);
        snprintf(b, sizeof b, "%s.gelu_erf", base);
        snprintf(c, sizeof c, "%s.gelu_add", base);
        snprintf(d, sizeof d, "%s.gelu_mul", base);
        char k2[160], k1[160], kh[160];
        snprintf(k2, sizeof k2, "%s.sqrt2", base);
        snprintf(k1, sizeof k1, "%s.one", base);
        snprintf(kh, sizeof kh, "%s.half", base);
        init_scalar(e, k2, 1.41421356237f);
        init_scalar(e, k1, 1.0f);
        init_scalar(e, kh, 0.5f);
        const char *i0[2] = {x, k2}, *i1[1] = {a}, *i2[2] = {b, k1}, *i3[2] = {x, c}, *i4[2] = {d, kh};
        node(e, "Div", a, i0, 2, a);
        node(e, "Erf", b, i1, 1, b);
        node(e, "Add", c, i2, 2, c);
        node(e, "Mul", d, i3, 2, d);
        node(e, "Mul", base, i4, 2, out);
    } else if (strcmp(type, "gelu_tanh") == 0)
        gelu_tanh(e, base, x, out);
    else if (strcmp(type, "linear") != 0)
        return clg_err_set(e->err, CLG_ERR_UNSUPPORTED, "ONNX export: activation '%s' has no mapping", type);
    return CLG_OK;
}

/* Reads parameter p of the replica's layer li into host memory (malloc'd). */
static clg_status read_param(ex *e, int li, int p, float **out)
{
    const clg_replica *r = e->lrep ? e->lrep[li] : e->rep;
    clg_param_ref ref = {&r->layers[li], &r->layers[li].params[p]};
    float *h = malloc(CLG_MAX(ref.param->numel, 1) * sizeof(float));
    if (!h)
        return clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory");
    cl_int st = clEnqueueReadBuffer(r->dev->queue, clg_replica_master(r, &ref), CL_TRUE, 0,
                                    ref.param->numel * sizeof(float), h, 0, NULL, NULL);
    if (st != CL_SUCCESS) {
        free(h);
        return clg_cl_fail(e->err, st, "read weights for ONNX export", __FILE__, __LINE__);
    }
    *out = h;
    return CLG_OK;
}

static clg_status export_params(ex *e, int li)
{
    const clg_layer *l = &(e->lrep ? e->lrep[li] : e->rep)->layers[li];
    for (int p = 0; p < l->nparams; p++) {
        float *h = NULL;
        CLG_TRY(read_param(e, li, p, &h));
        int64_t dims[4];
        for (int d = 0; d < l->params[p].ndim; d++)
            dims[d] = l->params[p].shape[d];
        char nm[160];
        snprintf(nm, sizeof nm, "%s.%s", l->name, l->params[p].name);
        init_f32(e, nm, dims, l->params[p].ndim, h);
        free(h);
    }
    return CLG_OK;
}

// ---- one layer -> nodes ----

/* The layer being exported: its inputs' value names and ranks, its output's
 * value name and rank (the first input's unless the mapping changes it),
 * its section of the model text and the names derived from its own. */
typedef struct {
    int index;
    const clg_layer *l;
    const clg_cfg_section *s;
    const char *in[CLG_MAX_INPUTS];
    int in_rank[CLG_MAX_INPUTS];
    const char *out;
    int rank;
    const char *act; /* the section's activation (linear: none) */
    double alpha;
    int has_act;
    char pre[160], wn[160], bn[160], actn[160], flat[160];
} xlayer;

/* The output of the main node: the activation's input when one follows. */
static const char *main_out(const xlayer *x) { return x->has_act ? x->pre : x->out; }

static clg_status fused_activation(ex *e, const xlayer *x)
{
    return x->has_act ? activation(e, x->act, x->alpha, x->actn, x->pre, x->out) : CLG_OK;
}

/* The first input, flattened to (N, rest) unless it has rank 2. */
static const char *flat_input(ex *e, xlayer *x)
{
    const char *in = x->in[0];
    if (x->in_rank[0] == 2)
        return in;
    snprintf(x->flat, sizeof x->flat, "%s.flat", x->l->name);
    attr_int(e, node(e, "Flatten", x->flat, &in, 1, x->flat), "axis", 1);
    return x->flat;
}

static clg_status x_conv(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    const clg_cfg_section *s = x->s;
    clg_status st = export_params(e, x->index);
    const char *ins[3] = {x->in[0], x->wn, x->bn};
    Onnx__NodeProto *n = node(e, "Conv", l->name, ins, l->nparams > 1 ? 3 : 2, main_out(x));
    int64_t R = l->params[0].shape[2], S = l->params[0].shape[3], stride = sec_int(s, "stride", 1),
            pad = sec_int(s, "pad", 0), dil = sec_int(s, "dilation", 1);
    int64_t ks[2] = {R, S}, strides[2] = {stride, stride}, pads[4] = {pad, pad, pad, pad}, dils[2] = {dil, dil};
    attr_ints(e, n, "kernel_shape", ks, 2);
    attr_ints(e, n, "strides", strides, 2);
    attr_ints(e, n, "pads", pads, 4);
    attr_ints(e, n, "dilations", dils, 2);
    attr_int(e, n, "group", sec_int(s, "groups", 1));
    return st == CLG_OK ? fused_activation(e, x) : st;
}

/* (.., K) x W^T for a (M, K) weight named w: Transpose(w) -> name.wT, MatMul
 * (node name) -> out, or, with a bias b, -> name.mm and Add (node
 * name.bias_add) -> out. */
static void matmul_wt(ex *e, const char *name, const char *x, const char *w, const char *b, const char *out)
{
    char wt[160], mm[160], ba[160];
    snprintf(wt, sizeof wt, "%s.wT", name);
    snprintf(mm, sizeof mm, "%s.mm", name);
    snprintf(ba, sizeof ba, "%s.bias_add", name);
    int64_t perm[2] = {1, 0};
    attr_ints(e, node(e, "Transpose", wt, &w, 1, wt), "perm", perm, 2);
    const char *mi[2] = {x, wt}, *ai[2] = {mm, b};
    node(e, "MatMul", name, mi, 2, b ? mm : out);
    if (b)
        node(e, "Add", ba, ai, 2, out);
}

static clg_status x_dense(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    const char *tie = sec_str(x->s, "tie", "");
    if (l->in_seq[0] || tie[0]) { /* per position on a sequence: MatMul + Add; tied: the embedding's table */
        if (!l->in_seq[0])
            return clg_err_set(e->err, CLG_ERR_UNSUPPORTED,
                               "ONNX export: dense layer '%s' with tie = on a non-sequence input has no mapping",
                               l->name);
        clg_status st = export_params(e, x->index);
        char tw[160];
        snprintf(tw, sizeof tw, "%s.weight", tie);
        const char *bias = NULL;
        for (int p = 0; p < l->nparams; p++)
            if (strcmp(l->params[p].name, "bias") == 0)
                bias = x->bn;
        matmul_wt(e, l->name, x->in[0], tie[0] ? tw : x->wn, bias, main_out(x));
        x->rank = 3;
        return st == CLG_OK ? fused_activation(e, x) : st;
    }
    clg_status st = export_params(e, x->index);
    const char *ins[3] = {flat_input(e, x), x->wn, x->bn};
    Onnx__NodeProto *n = node(e, "Gemm", x->l->name, ins, x->l->nparams > 1 ? 3 : 2, main_out(x));
    attr_int(e, n, "transB", 1);
    x->rank = 2;
    return st == CLG_OK ? fused_activation(e, x) : st;
}

/* [embedding]: the float ids (N, C, H, W) -> Reshape (N, T) -> Cast int64 ->
 * Gather rows of the table (vocab, dim) -> (N, T, dim). */
static clg_status x_embedding(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    clg_status st = export_params(e, x->index);
    char shp[160], ids[160], idl[160];
    snprintf(shp, sizeof shp, "%s.ids_shape", l->name);
    snprintf(ids, sizeof ids, "%s.ids", l->name);
    snprintf(idl, sizeof idl, "%s.ids_int", l->name);
    int64_t sv[2] = {-1, (int64_t)l->out_shape[1]};
    init_i64(e, shp, 1, sv, 2);
    bin(e, "Reshape", x->in[0], shp, ids);
    const char *ci = ids;
    attr_int(e, node(e, "Cast", idl, &ci, 1, idl), "to", ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
    const char *gi[2] = {x->wn, idl};
    attr_int(e, node(e, "Gather", l->name, gi, 2, x->out), "axis", 0);
    x->rank = 3;
    return st;
}

/* [posembed]: x + Slice(table, rows 0..T). */
static clg_status x_posembed(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    clg_status st = export_params(e, x->index);
    char a[4][160], sl[160];
    static const char *const an[4] = {"starts", "ends", "axes", "steps"};
    int64_t av[4] = {0, (int64_t)l->in_shape[0][1], 0, 1};
    for (int k = 0; k < 4; k++) {
        snprintf(a[k], sizeof a[k], "%s.%s", l->name, an[k]);
        init_i64(e, a[k], 1, &av[k], 1);
    }
    snprintf(sl, sizeof sl, "%s.slice", l->name);
    const char *si[5] = {x->wn, a[0], a[1], a[2], a[3]};
    node(e, "Slice", sl, si, 5, sl);
    const char *ai[2] = {x->in[0], sl};
    node(e, "Add", l->name, ai, 2, x->out);
    x->rank = 3;
    return st;
}

/* [layernorm]: LayerNormalization over the last axis (opset 17); affine = 0
 * gets a scale of ones (name.ones). */
static clg_status x_layernorm(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    clg_status st = export_params(e, x->index);
    char g[160], b[160];
    int C = l->in_shape[0][2];
    if (l->nparams == 2) {
        snprintf(g, sizeof g, "%s.gamma", l->name);
        snprintf(b, sizeof b, "%s.beta", l->name);
    } else {
        snprintf(g, sizeof g, "%s.ones", l->name);
        float *ones = malloc((size_t)C * sizeof(float));
        if (!ones)
            return clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory");
        for (int c = 0; c < C; c++)
            ones[c] = 1.0f;
        int64_t d = C;
        init_f32(e, g, &d, 1, ones);
        free(ones);
    }
    const char *ins[3] = {x->in[0], g, b};
    Onnx__NodeProto *n = node(e, "LayerNormalization", l->name, ins, l->nparams == 2 ? 3 : 2, x->out);
    attr_int(e, n, "axis", -1);
    attr_float(e, n, "epsilon", (float)sec_float(x->s, "eps", 1e-5));
    x->rank = 3;
    return st;
}

/* name.SUFFIX into buf (160 bytes). */
#define VN(buf, suffix) snprintf(buf, sizeof buf, "%s." suffix, l->name)

/* [attention] (N, T, C): qkv = x Wqkv^T + b -> Reshape (N, T, 3, H, d) ->
 * Transpose (3, N, H, T, d) -> Gather 0, 1, 2: q, k, v (N, H, T, d);
 * s = (q k^T) * scale [+ mask: -1e30 above the diagonal]; Softmax(-1); p v ->
 * Transpose (N, T, H, d) -> Reshape (N, T, C) -> x Wout^T + bout. */
static clg_status x_attention(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    clg_status st = export_params(e, x->index);
    int T = l->in_shape[0][1], C = l->in_shape[0][2], H = (int)sec_int(x->s, "heads", 1), d = C / H;
    char qw[160], qb[160], ow[160], ob[160], qkv[160], r5[160], s5[160], t5[160], hv[3][160], iv[3][160], kt[160],
        sc[160], sn[160], ss[160], mk[160], sm[160], pv[160], pt[160], r3[160], s3[160];
    VN(qw, "qkv_weight"); VN(qb, "qkv_bias"); VN(ow, "out_weight"); VN(ob, "out_bias");
    VN(qkv, "qkv"); VN(r5, "qkv_heads"); VN(s5, "qkv_heads_shape"); VN(t5, "qkv_t");
    VN(hv[0], "q"); VN(hv[1], "k"); VN(hv[2], "v"); VN(iv[0], "i0"); VN(iv[1], "i1"); VN(iv[2], "i2");
    VN(kt, "kT"); VN(sc, "scores"); VN(sn, "scale"); VN(ss, "scaled"); VN(mk, "mask"); VN(sm, "probs");
    VN(pv, "pv"); VN(pt, "pv_t"); VN(r3, "merged"); VN(s3, "merged_shape");
    matmul_wt(e, qkv, x->in[0], qw, qb, qkv);
    int64_t sh5[5] = {0, 0, 3, H, d}, sh3[3] = {0, 0, C}, p5[5] = {2, 0, 3, 1, 4}, p4k[4] = {0, 1, 3, 2},
            p4o[4] = {0, 2, 1, 3};
    init_i64(e, s5, 1, sh5, 5);
    init_i64(e, s3, 1, sh3, 3);
    bin(e, "Reshape", qkv, s5, r5);
    const char *tin = r5;
    attr_ints(e, node(e, "Transpose", t5, &tin, 1, t5), "perm", p5, 5);
    for (int k = 0; k < 3; k++) {
        int64_t idx = k;
        init_i64(e, iv[k], 0, &idx, 1);
        const char *gi[2] = {t5, iv[k]};
        attr_int(e, node(e, "Gather", hv[k], gi, 2, hv[k]), "axis", 0);
    }
    tin = hv[1];
    attr_ints(e, node(e, "Transpose", kt, &tin, 1, kt), "perm", p4k, 4);
    bin(e, "MatMul", hv[0], kt, sc);
    init_scalar(e, sn, (float)(1.0 / sqrt((double)d)));
    bin(e, "Mul", sc, sn, ss);
    const char *smin = ss;
    char msk[160];
    if (sec_int(x->s, "causal", 1)) {
        float *m = malloc((size_t)T * T * sizeof(float));
        if (!m)
            return clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory");
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++)
                m[(size_t)i * T + j] = j > i ? -1e30f : 0.0f;
        int64_t md[2] = {T, T};
        init_f32(e, mk, md, 2, m);
        free(m);
        VN(msk, "masked");
        bin(e, "Add", ss, mk, msk);
        smin = msk;
    }
    attr_int(e, node(e, "Softmax", sm, &smin, 1, sm), "axis", -1);
    bin(e, "MatMul", sm, hv[2], pv);
    tin = pv;
    attr_ints(e, node(e, "Transpose", pt, &tin, 1, pt), "perm", p4o, 4);
    bin(e, "Reshape", pt, s3, r3);
    matmul_wt(e, l->name, r3, ow, ob, x->out);
    x->rank = 3;
    return st;
}
#undef VN

static clg_status x_pool(ex *e, xlayer *x)
{
    const char *type = x->l->ops->type;
    int64_t k = sec_int(x->s, "size", 1), sd = sec_int(x->s, "stride", k), pad = sec_int(x->s, "pad", 0);
    int64_t ks[2] = {k, k}, strides[2] = {sd, sd}, pads[4] = {pad, pad, pad, pad};
    Onnx__NodeProto *n = node(e, type[0] == 'm' ? "MaxPool" : "AveragePool", x->l->name, x->in, 1, x->out);
    attr_ints(e, n, "kernel_shape", ks, 2);
    attr_ints(e, n, "strides", strides, 2);
    attr_ints(e, n, "pads", pads, 4);
    if (type[0] == 'a')
        attr_int(e, n, "count_include_pad", 1);
    return CLG_OK;
}

static clg_status x_gap(ex *e, xlayer *x)
{
    node(e, "GlobalAveragePool", x->l->name, x->in, 1, x->out);
    return CLG_OK;
}

static clg_status x_activation(ex *e, xlayer *x)
{
    return activation(e, sec_str(x->s, "type", "relu"), x->alpha, x->l->name, x->in[0], x->out);
}

static clg_status x_batchnorm(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    clg_status st = export_params(e, x->index);
    char pn[4][160];
    const char *ins[5] = {x->in[0], pn[0], pn[1], pn[2], pn[3]};
    for (int p = 0; p < 4; p++)
        snprintf(pn[p], sizeof pn[p], "%s.%s", l->name, l->params[p].name);
    Onnx__NodeProto *n = node(e, "BatchNormalization", l->name, ins, 5, x->out);
    attr_float(e, n, "epsilon", (float)sec_float(x->s, "eps", 1e-5));
    attr_float(e, n, "momentum", (float)(1.0 - sec_float(x->s, "momentum", 0.1)));
    return st;
}

static clg_status x_dropout(ex *e, xlayer *x)
{
    char rn[160];
    snprintf(rn, sizeof rn, "%s.ratio", x->l->name);
    init_scalar(e, rn, (float)sec_float(x->s, "p", 0.5));
    const char *ins[2] = {x->in[0], rn};
    node(e, "Dropout", x->l->name, ins, 2, x->out);
    return CLG_OK;
}

static clg_status x_flatten(ex *e, xlayer *x)
{
    attr_int(e, node(e, "Flatten", x->l->name, x->in, 1, x->out), "axis", 1);
    x->rank = 2;
    return CLG_OK;
}

static clg_status x_add(ex *e, xlayer *x)
{
    const clg_layer *l = x->l;
    char cur[160], outn[160];
    snprintf(cur, sizeof cur, "%s", x->in[0]);
    for (int k = 1; k < l->nin; k++) { /* a chain of two-input Adds */
        if (k == l->nin - 1)
            snprintf(outn, sizeof outn, "%s", x->out);
        else
            snprintf(outn, sizeof outn, "%s.sum%d", l->name, k);
        const char *ins[2] = {cur, x->in[k]};
        node(e, "Add", k == l->nin - 1 ? l->name : outn, ins, 2, outn);
        snprintf(cur, sizeof cur, "%s", outn);
    }
    return CLG_OK;
}

static clg_status x_concat(ex *e, xlayer *x)
{
    attr_int(e, node(e, "Concat", x->l->name, x->in, x->l->nin, x->out), "axis", 1);
    return CLG_OK;
}

static clg_status x_softmax(ex *e, xlayer *x)
{
    if (x->l->in_seq[0]) { /* the token loss: softmax over the classes at every position */
        attr_int(e, node(e, "Softmax", x->l->name, x->in, 1, x->out), "axis", -1);
        x->rank = 3;
        return CLG_OK;
    }
    const char *in = flat_input(e, x);
    attr_int(e, node(e, "Softmax", x->l->name, &in, 1, x->out), "axis", 1);
    x->rank = 2;
    return CLG_OK;
}

static const struct {
    const char *type;
    clg_status (*fn)(ex *e, xlayer *x);
} exporters[] = {
    {"convolutional", x_conv}, {"dense", x_dense},         {"maxpool", x_pool},      {"avgpool", x_pool},
    {"gap", x_gap},            {"activation", x_activation}, {"batchnorm", x_batchnorm}, {"dropout", x_dropout},
    {"flatten", x_flatten},    {"add", x_add},             {"concat", x_concat},     {"softmax", x_softmax},
    {"embedding", x_embedding}, {"posembed", x_posembed},  {"layernorm", x_layernorm}, {"attention", x_attention},
};

/* Layer i: its nodes, its output's value name in vname[i] and rank in rank[i]. */
static clg_status export_layer(ex *e, int i, const char *in_name, char (*vname)[96], int *rank)
{
    /* the graph as configured (a replica's fusion pass, src/model/fuse.c, rewires its own layers); the
       weights come from the replica (or pipeline stage) holding them, read_param */
    const clg_layer *l = &e->net->proto[i];
    xlayer x;
    memset(&x, 0, sizeof x);
    x.index = i;
    x.l = l;
    x.s = &e->net->cfg->sec[i + 1];
    for (int k = 0; k < l->nin; k++) {
        x.in[k] = l->inputs[k] < 0 ? in_name : vname[l->inputs[k]];
        x.in_rank[k] = l->inputs[k] < 0 ? 4 : rank[l->inputs[k]];
    }
    snprintf(vname[i], sizeof vname[i], "%s", i == e->net->nlayers - 1 ? "output" : l->name);
    x.out = vname[i];
    x.rank = x.in_rank[0];
    snprintf(x.pre, sizeof x.pre, "%s.pre", l->name);
    snprintf(x.actn, sizeof x.actn, "%s.act", l->name);
    snprintf(x.wn, sizeof x.wn, "%s.weight", l->name);
    snprintf(x.bn, sizeof x.bn, "%s.bias", l->name);
    x.act = sec_str(x.s, "activation", "linear");
    x.alpha = sec_float(x.s, "alpha", 0.01);
    x.has_act = strcmp(x.act, "linear") != 0;
    for (size_t k = 0; k < sizeof exporters / sizeof exporters[0]; k++) {
        if (strcmp(l->ops->type, exporters[k].type) == 0) {
            clg_status st = exporters[k].fn(e, &x);
            rank[i] = x.rank;
            return st;
        }
    }
    return clg_err_set(e->err, CLG_ERR_UNSUPPORTED, "ONNX export: layer '%s' of type [%s] has no ONNX mapping",
                       l->name, l->ops->type);
}

// ---- the graph ----

/* (x - mean) / std per channel, as clg_model_predict applies it; returns the
 * normalized input's value name. */
static const char *export_norm(ex *e, const clg_ds_norm *norm)
{
    const clg_net *net = e->net;
    int64_t dims[4] = {1, net->in_c, 1, 1};
    float mean[CLG_DS_MAX_CHANNELS], sd[CLG_DS_MAX_CHANNELS];
    for (int c = 0; c < net->in_c && c < CLG_DS_MAX_CHANNELS; c++) {
        mean[c] = c < norm->c ? norm->mean[c] : 0.0f;
        sd[c] = c < norm->c ? norm->std[c] : 1.0f;
    }
    init_f32(e, "norm.mean", dims, 4, mean);
    init_f32(e, "norm.std", dims, 4, sd);
    const char *i0[2] = {"input", "norm.mean"}, *i1[2] = {"input_centered", "norm.std"};
    node(e, "Sub", "norm_sub", i0, 2, "input_centered");
    node(e, "Div", "norm_div", i1, 2, "input_normalized");
    return "input_normalized";
}

/* The graph's input (N, C, H, W) and output (rank out_rank) descriptions. */
static void graph_io(ex *e, Onnx__GraphProto *g, int out_rank)
{
    const clg_net *net = e->net;
    int64_t idims[4] = {-1, net->in_c, net->in_h, net->in_w};
    const clg_layer *ll = &(e->lrep ? e->lrep[net->nlayers - 1] : e->rep)->layers[net->nlayers - 1];
    int64_t odims[4] = {-1, ll->out_shape[1], ll->out_shape[2], ll->out_shape[3]};
    Onnx__ValueInfoProto **gi = xalloc(e, sizeof *gi), **go = xalloc(e, sizeof *go);
    if (gi && go) {
        gi[0] = value_info(e, "input", 4, idims);
        go[0] = value_info(e, "output", out_rank, odims);
        g->n_input = 1;
        g->input = gi;
        g->n_output = 1;
        g->output = go;
    }
}

static clg_status build(ex *e, const clg_ds_norm *norm, Onnx__GraphProto *g)
{
    int L = e->net->nlayers;
    char (*vname)[96] = calloc((size_t)L, sizeof *vname); /* output value of each layer */
    int *rank = calloc((size_t)L, sizeof(int));
    if (!vname || !rank) {
        free(vname);
        free(rank);
        return clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory");
    }
    for (int i = 0; i < L; i++)
        e->seq |= (e->lrep ? e->lrep[i] : e->rep)->layers[i].out_seq;
    const char *in_name = norm && !e->net->input_tokens ? export_norm(e, norm) : "input";
    clg_status st = CLG_OK;
    for (int i = 0; i < L && st == CLG_OK && !e->oom; i++)
        st = export_layer(e, i, in_name, vname, rank);
    if (st == CLG_OK && !e->oom)
        graph_io(e, g, rank[L - 1]);
    free(vname);
    free(rank);
    if (st == CLG_OK && e->oom)
        st = clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory building the ONNX graph");
    return st;
}

/* The graph as a ModelProto's bytes (malloc'd). */
static clg_status pack_model(ex *e, Onnx__GraphProto *g, uint8_t **buf, size_t *len)
{
    g->n_node = e->nnodes;
    g->node = e->nodes;
    g->n_initializer = e->ninits;
    g->initializer = e->inits;
    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    mp.has_ir_version = 1;
    mp.ir_version = e->seq ? 8 : 7; /* ONNX 1.8+: opset 13; 1.12+: opset 17 (LayerNormalization) */
    mp.producer_name = "clgrad";
    mp.producer_version = (char *)clg_version_string();
    Onnx__OperatorSetIdProto op;
    onnx__operator_set_id_proto__init(&op);
    op.domain = "";
    op.has_version = 1;
    op.version = e->seq ? CLG_ONNX_EXPORT_OPSET_SEQ : CLG_ONNX_EXPORT_OPSET;
    Onnx__OperatorSetIdProto *ops[1] = {&op};
    mp.n_opset_import = 1;
    mp.opset_import = ops;
    mp.graph = g;
    char doc[512];
    snprintf(doc, sizeof doc, "exported by clgrad from %s", e->net->source);
    mp.doc_string = doc;
    *len = onnx__model_proto__get_packed_size(&mp);
    *buf = malloc(*len ? *len : 1);
    if (!*buf)
        return clg_err_set(e->err, CLG_ERR_HOST_OOM, "out of memory");
    onnx__model_proto__pack(&mp, *buf);
    return CLG_OK;
}

static clg_status export_any(clg_err *err, const clg_net *net, const clg_replica *rep,
                             const clg_replica *const *lrep, const clg_ds_norm *norm, const char *path)
{
    if (!net || !rep || !path)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "ONNX export: network, replica and path are required");
    if (rep->net != net || rep->nlayers != net->nlayers)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "ONNX export: the replica is not one of the network %s",
                           net->source);
    ex e;
    memset(&e, 0, sizeof e);
    e.err = err;
    e.net = net;
    e.rep = rep;
    e.lrep = lrep;
    for (int i = 0; lrep && i < net->nlayers; i++)
        if (!lrep[i] || lrep[i]->net != net || i < lrep[i]->first || i > lrep[i]->last)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "ONNX export: no replica holds layer %d of %s", i,
                               net->source);
    Onnx__GraphProto g;
    onnx__graph_proto__init(&g);
    g.name = "clgrad";
    uint8_t *buf = NULL;
    size_t len = 0;
    clg_status st = build(&e, norm, &g);
    if (st == CLG_OK)
        st = pack_model(&e, &g, &buf, &len);
    if (st == CLG_OK)
        st = clg_file_write_atomic(err, path, buf, len);
    free(buf);
    for (size_t i = 0; i < e.nallocs; i++)
        free(e.allocs[i]);
    free(e.allocs);
    free(e.nodes);
    free(e.inits);
    return st;
}

clg_status clg_onnx_export(clg_err *err, const clg_net *net, const clg_replica *rep, const clg_ds_norm *norm,
                           const char *path)
{
    return export_any(err, net, rep, NULL, norm, path);
}

clg_status clg_onnx_export_stages(clg_err *err, const clg_net *net, const clg_replica *const *reps,
                                  const clg_ds_norm *norm, const char *path)
{
    return export_any(err, net, reps ? reps[0] : NULL, reps, norm, path);
}
