/* ONNX -> clgrad model text + weights (see onnx.h).
 *
 * The bytes are first walked without recursion against the generated
 * descriptors (nesting depth and message count capped), then unpacked by
 * protobuf-c. Nodes are mapped in graph order onto clgrad layers:
 *   Conv -> convolutional, Gemm / MatMul (+ Add of a constant) -> dense,
 *   Relu/LeakyRelu/Sigmoid/Tanh/Gelu and the Erf form of GELU -> the
 *   producer's activation when it is a conv/dense used only there, else an
 *   activation layer, MaxPool/AveragePool/GlobalAveragePool -> pools,
 *   BatchNormalization -> batchnorm, Dropout -> dropout, Flatten/Reshape to
 *   2-D -> flatten, Add -> add, Concat (axis 1) -> concat, Softmax -> the
 *   softmax loss layer, Identity and Constant -> nothing, a zero Pad ->
 *   the padding of the Conv / AveragePool reading it, Transpose of a
 *   constant -> a constant, Sub/Div of per-channel constants on the graph
 *   input -> the input normalization.
 * A graph that does not end in Softmax gets one appended (clgrad's
 * classifier output). */
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx.h"
#include "src/onnx/onnx.pb-c.h"

/* ---- wire-format walk: depth and message count, no recursion ---- */

typedef struct {
    const uint8_t *end;
    const ProtobufCMessageDescriptor *desc;
} walk_frame;

static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *d, uint32_t num)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == num)
            return &d->fields[i];
    return NULL;
}

static clg_status walk_check(clg_err *err, const char *src, const uint8_t *data, size_t len)
{
    walk_frame stack[CLG_ONNX_MAX_DEPTH];
    int depth = 1;
    stack[0].end = data + len;
    stack[0].desc = &onnx__model_proto__descriptor;
    const uint8_t *p = data;
    uint64_t messages = 1;
    while (depth > 0) {
        walk_frame *f = &stack[depth - 1];
        if (p == f->end) {
            depth--;
            continue;
        }
        uint64_t key = 0, v = 0;
        if (!clg_onnx_varint(&p, f->end, &key))
            return clg_err_set(err, CLG_ERR_FORMAT, "%s: not a valid ONNX file (bad field key at byte %zu)", src,
                               (size_t)(p - data));
        unsigned wt = (unsigned)(key & 7);
        uint32_t num = (uint32_t)(key >> 3);
        switch (wt) {
        case 0:
            if (!clg_onnx_varint(&p, f->end, &v))
                return clg_err_set(err, CLG_ERR_FORMAT, "%s: not a valid ONNX file (bad varint at byte %zu)", src,
                                   (size_t)(p - data));
            break;
        case 1:
        case 5: {
            size_t n = wt == 1 ? 8 : 4;
            if ((size_t)(f->end - p) < n)
                return clg_err_set(err, CLG_ERR_FORMAT, "%s: not a valid ONNX file (truncated at byte %zu)", src,
                                   (size_t)(p - data));
            p += n;
            break;
        }
        case 2: {
            if (!clg_onnx_varint(&p, f->end, &v) || v > (uint64_t)(f->end - p))
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "%s: not a valid ONNX file (length beyond its message at byte %zu)", src,
                                   (size_t)(p - data));
            const ProtobufCFieldDescriptor *fd = f->desc ? find_field(f->desc, num) : NULL;
            if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (depth >= CLG_ONNX_MAX_DEPTH)
                    return clg_err_set(err, CLG_ERR_FORMAT, "%s: messages nested deeper than %d levels (refused)",
                                       src, CLG_ONNX_MAX_DEPTH);
                if (++messages > CLG_ONNX_MAX_MESSAGES)
                    return clg_err_set(err, CLG_ERR_FORMAT, "%s: more than %u messages (refused)", src,
                                       CLG_ONNX_MAX_MESSAGES);
                stack[depth].end = p + v;
                stack[depth].desc = fd->descriptor;
                depth++;
            } else {
                p += v;
            }
            break;
        }
        default:
            return clg_err_set(err, CLG_ERR_FORMAT, "%s: not a valid ONNX file (wire type %u at byte %zu)", src, wt,
                               (size_t)(p - data));
        }
    }
    return CLG_OK;
}

/* ---- string -> int hash table ---- */

typedef struct {
    const char **keys;
    int *vals;
    size_t cap, n;
} smap;

static uint64_t shash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int smap_get(const smap *m, const char *k)
{
    if (!m->cap || !k)
        return -1;
    for (size_t i = shash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i])
            return -1;
        if (strcmp(m->keys[i], k) == 0)
            return m->vals[i];
    }
}

static int smap_put(smap *m, const char *k, int v)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 64;
        const char **nk = calloc(nc, sizeof *nk);
        int *nv = calloc(nc, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return 0;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                size_t j = shash(m->keys[i]) & (nc - 1);
                while (nk[j])
                    j = (j + 1) & (nc - 1);
                nk[j] = m->keys[i];
                nv[j] = m->vals[i];
            }
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = nc;
    }
    size_t i = shash(k) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], k) != 0)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
    return 1;
}

static void smap_free(smap *m)
{
    free(m->keys);
    free(m->vals);
}

/* ---- import state ---- */

#define IMP_MAX_IN 8 /* inputs of one layer (CLG_MAX_INPUTS) */
#define IMP_MAX_KV 12
#define IMP_MAX_TABLES 16 /* embedding tables a head may be tied to */

typedef struct {
    int ndim;
    int64_t dims[8];
    size_t numel;
    float *f;     /* FLOAT data (owned) or NULL */
    int64_t *i64; /* INT64 data (owned) or NULL */
} cten;

typedef struct {
    int layer;      /* producing layer; -1: the network input */
    int c, h, w;    /* shape without N */
    int norm_stage; /* network input only: 0 raw, 1 mean subtracted, 2 divided by std */
    int nuse;       /* consumers: node inputs + graph outputs */
    int pad;        /* a zero Pad of this many pixels per side still to apply (folded into a Conv / AveragePool) */
    int rank;       /* ONNX rank: 4 (N, C, H, W) or 2 (N, features); broadcasting and axes depend on it */
} value;

typedef struct {
    const char *type; /* section name */
    char name[64];
    int in[IMP_MAX_IN];
    int nin;
    char key[IMP_MAX_KV][16];
    char val[IMP_MAX_KV][40];
    int nkv;
    int c, h, w;   /* output shape */
    int fusable;   /* conv / dense: an activation may be fused */
    int act;       /* activation fused (0 none) */
    int bias;      /* conv / dense: has a bias */
    int rank;      /* ONNX rank of the output (4 or 2) */
} ilayer;

typedef struct {
    clg_err *err;
    const char *src;
    int opset;
    const Onnx__NodeProto *node; /* node being mapped (messages) */
    cten *consts;
    int nconsts, capconsts;
    smap cmap; /* name -> consts index */
    value *vals;
    int nvals, capvals;
    smap vmap; /* value name -> vals index */
    ilayer *layers;
    int nlayers, caplayers;
    smap lnames; /* layer names in use (keys owned: lname_store) */
    char **lname_store;
    int nlname;
    clg_ckpt *ck;
    int in_c, in_h, in_w;
    float mean[CLG_DS_MAX_CHANNELS], std[CLG_DS_MAX_CHANNELS];
    int has_norm;
    smap uses; /* value name -> usecnt index */
    int *usecnt;
    int nuses, capuses;
    int allow_pad; /* the node being mapped folds a pending Pad (Conv, AveragePool) */
    int tokens;    /* an [embedding] reads the input: [net] input = tokens */
    struct {
        const char *name; /* constant: an embedding's table, or (transposed) its transpose */
        int layer, transposed;
    } tables[IMP_MAX_TABLES];
    int ntables;
} imp;

static clg_status failv(imp *im, clg_status st, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (im->node)
        return clg_err_set(im->err, st, "%s: node '%s' (%s, opset %d): %s", im->src,
                           im->node->name && im->node->name[0] ? im->node->name : "(unnamed)",
                           im->node->op_type ? im->node->op_type : "?", im->opset, msg);
    return clg_err_set(im->err, st, "%s: %s", im->src, msg);
}

static clg_status fail(imp *im, const char *fmt, ...) CLG_PRINTF(2, 3);
static clg_status fail(imp *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clg_status st = failv(im, CLG_ERR_FORMAT, fmt, ap);
    va_end(ap);
    return st;
}

static clg_status unsupported(imp *im, const char *fmt, ...) CLG_PRINTF(2, 3);
static clg_status unsupported(imp *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clg_status st = failv(im, CLG_ERR_UNSUPPORTED, fmt, ap);
    va_end(ap);
    return st;
}

static clg_status oom(imp *im) { return clg_err_set(im->err, CLG_ERR_HOST_OOM, "%s: out of memory", im->src); }

/* ---- attributes ---- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0)
            return n->attribute[i];
    return NULL;
}

#define AT(x) ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##x

/* The attribute's type: its type field, or (files that leave it UNDEFINED) the field that holds a value. */
static int attr_type(const Onnx__AttributeProto *a)
{
    if (a->type != AT(UNDEFINED))
        return (int)a->type;
    return a->has_f ? AT(FLOAT) : a->has_i ? AT(INT) : a->has_s ? AT(STRING) : a->t ? AT(TENSOR)
         : a->n_floats ? AT(FLOATS) : a->n_ints ? AT(INTS) : a->n_strings ? AT(STRINGS) : AT(UNDEFINED);
}

static const char *attr_type_name(int t)
{
    static const char *const names[] = {"UNDEFINED", "FLOAT", "INT", "STRING", "TENSOR", "GRAPH", "FLOATS",
                                        "INTS", "STRINGS", "TENSORS", "GRAPHS", "SPARSE_TENSOR",
                                        "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
    return t >= 0 && t < (int)(sizeof names / sizeof *names) ? names[t] : "unknown";
}

/* The node's attribute name (*out NULL when absent); refused, naming node, attribute and both types, unless
 * it has the type the operator's definition gives it and holds a value of that type. Every operator reads its
 * attributes through this (or the typed getters below). */
static clg_status attr_get(imp *im, const char *name, int type, const Onnx__AttributeProto **out)
{
    const Onnx__AttributeProto *a = attr(im->node, name);
    *out = NULL;
    if (!a)
        return CLG_OK;
    int t = attr_type(a);
    int has = type == AT(FLOAT) ? a->has_f : type == AT(INT) ? a->has_i : type == AT(STRING) ? a->has_s
            : type == AT(TENSOR) ? a->t != NULL : 1;
    if (t == type && !has)
        return fail(im, "attribute %s is typed %s but holds no value", name, attr_type_name(t));
    if (t != type)
        return fail(im, "attribute %s is %s; the operator defines it as %s", name, attr_type_name(t),
                    attr_type_name(type));
    *out = a;
    return CLG_OK;
}

/* An INT attribute in [lo, hi] (def when absent). */
static clg_status attr_int(imp *im, const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const Onnx__AttributeProto *a = NULL;
    CLG_TRY(attr_get(im, name, AT(INT), &a));
    *out = a ? a->i : def;
    if (a && (a->i < lo || a->i > hi))
        return fail(im, "attribute %s = %lld is outside [%lld, %lld] (INT)", name, (long long)a->i, (long long)lo,
                    (long long)hi);
    return CLG_OK;
}

/* A 0/1 INT attribute (def 0 when absent). */
static clg_status attr_bool(imp *im, const char *name, int *out)
{
    int64_t v = 0;
    CLG_TRY(attr_int(im, name, 0, 0, 1, &v));
    *out = (int)v;
    return CLG_OK;
}

/* A finite FLOAT attribute in [lo, hi] (def when absent). */
static clg_status attr_float(imp *im, const char *name, double def, double lo, double hi, double *out)
{
    const Onnx__AttributeProto *a = NULL;
    CLG_TRY(attr_get(im, name, AT(FLOAT), &a));
    *out = a ? a->f : def;
    if (a && !isfinite(a->f))
        return fail(im, "attribute %s = %g is not a finite FLOAT", name, (double)a->f);
    if (a && !(a->f >= lo && a->f <= hi))
        return fail(im, "attribute %s = %g is outside [%g, %g] (finite FLOAT)", name, (double)a->f, lo, hi);
    return CLG_OK;
}

/* A STRING attribute: *is_def 1 when absent or equal to def (other values: the caller decides). */
static clg_status attr_str_is(imp *im, const char *name, const char *def, int *is_def)
{
    const Onnx__AttributeProto *a = NULL;
    CLG_TRY(attr_get(im, name, AT(STRING), &a));
    *is_def = !a || (a->s.len == strlen(def) && memcmp(a->s.data, def, a->s.len) == 0);
    return CLG_OK;
}

/* auto_pad: NOTSET (default) or VALID; anything else is refused. */
static clg_status attr_auto_pad(imp *im)
{
    int notset = 0, valid = 0;
    CLG_TRY(attr_str_is(im, "auto_pad", "NOTSET", &notset));
    CLG_TRY(attr_str_is(im, "auto_pad", "VALID", &valid));
    if (!notset && !valid)
        return unsupported(im, "auto_pad other than NOTSET / VALID (write explicit pads)");
    return CLG_OK;
}

/* A pair attribute (h, w) that must be equal: *out gets it (def when absent).
 * want: number of entries expected (2 for kernel/strides/dilations, 4 for pads). */
static clg_status attr_sym(imp *im, const char *name, int want, int64_t def, int64_t lo, int64_t hi, int *out)
{
    const Onnx__AttributeProto *a = NULL;
    CLG_TRY(attr_get(im, name, AT(INTS), &a));
    if (!a || a->n_ints == 0) {
        *out = (int)def;
        return CLG_OK;
    }
    if ((int)a->n_ints != want)
        return unsupported(im, "attribute %s has %zu values (a 2-D operator needs %d)", name, a->n_ints, want);
    for (size_t i = 1; i < a->n_ints; i++)
        if (a->ints[i] != a->ints[0])
            return unsupported(im, "attribute %s is not the same in every direction (clgrad supports square %s only)",
                               name, name);
    if (a->ints[0] < lo || a->ints[0] > hi)
        return fail(im, "attribute %s = %lld is outside [%lld, %lld]", name, (long long)a->ints[0], (long long)lo,
                    (long long)hi);
    *out = (int)a->ints[0];
    return CLG_OK;
}

/* ---- tensors ---- */

static void cten_free(cten *t);

static clg_status tensor_read_data(imp *im, const Onnx__TensorProto *t, cten *out)
{
    memset(out, 0, sizeof *out);
    const char *nm = t->name ? t->name : "(unnamed)";
    if (t->n_external_data > 0 || (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL))
        return unsupported(im, "tensor '%s' keeps its data in an external file; external data is refused (save the "
                               "model with its weights inside the file)",
                           nm);
    if (t->segment)
        return unsupported(im, "tensor '%s' is segmented (not supported)", nm);
    if (t->n_dims > 8)
        return unsupported(im, "tensor '%s' has %zu dimensions (at most 8)", nm, t->n_dims);
    out->ndim = (int)t->n_dims;
    size_t numel = 1;
    for (size_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] < 0 || t->dims[d] > (int64_t)CLG_ONNX_MAX_TENSOR)
            return fail(im, "tensor '%s': dimension %zu is %lld", nm, d, (long long)t->dims[d]);
        out->dims[d] = t->dims[d];
        if (t->dims[d] && numel > CLG_ONNX_MAX_TENSOR / (size_t)t->dims[d])
            return fail(im, "tensor '%s' has more than %zu elements (refused)", nm, CLG_ONNX_MAX_TENSOR);
        numel *= (size_t)t->dims[d];
    }
    out->numel = numel;
    int dt = t->has_data_type ? t->data_type : 0;
    const uint8_t *raw = t->has_raw_data ? t->raw_data.data : NULL;
    size_t rawn = t->has_raw_data ? t->raw_data.len : 0;
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
        out->f = malloc(CLG_MAX(numel, 1) * sizeof(float));
        if (!out->f)
            return oom(im);
        if (t->has_raw_data) {
            if (rawn != numel * 4)
                return fail(im, "tensor '%s': %zu raw bytes for %zu floats", nm, rawn, numel);
            for (size_t i = 0; i < numel; i++) { /* little-endian IEEE single */
                uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 | (uint32_t)raw[4 * i + 2] << 16 |
                             (uint32_t)raw[4 * i + 3] << 24;
                memcpy(&out->f[i], &u, 4);
            }
        } else {
            if (t->n_float_data != numel)
                return fail(im, "tensor '%s': %zu values for %zu elements", nm, t->n_float_data, numel);
            if (numel)
                memcpy(out->f, t->float_data, numel * sizeof(float));
        }
        for (size_t i = 0; i < numel; i++)
            if (!isfinite(out->f[i]))
                return fail(im, "tensor '%s': element %zu is not finite", nm, i);
        return CLG_OK;
    }
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) {
        out->i64 = malloc(CLG_MAX(numel, 1) * sizeof(int64_t));
        if (!out->i64)
            return oom(im);
        if (t->has_raw_data) {
            if (rawn != numel * 8)
                return fail(im, "tensor '%s': %zu raw bytes for %zu int64 values", nm, rawn, numel);
            for (size_t i = 0; i < numel; i++) {
                uint64_t u = 0;
                for (int b = 7; b >= 0; b--)
                    u = u << 8 | raw[8 * i + (size_t)b];
                out->i64[i] = (int64_t)u;
            }
        } else {
            if (t->n_int64_data != numel)
                return fail(im, "tensor '%s': %zu values for %zu elements", nm, t->n_int64_data, numel);
            if (numel)
                memcpy(out->i64, t->int64_data, numel * sizeof(int64_t));
        }
        return CLG_OK;
    }
    return unsupported(im, "tensor '%s' has data type %d (only float32 weights and int64 shapes are supported)", nm,
                       dt);
}

static void cten_free(cten *t)
{
    free(t->f);
    free(t->i64);
    t->f = NULL;
    t->i64 = NULL;
}

/* tensor_read_data, and nothing held on failure */
static clg_status tensor_read(imp *im, const Onnx__TensorProto *t, cten *out)
{
    clg_status st = tensor_read_data(im, t, out);
    if (st != CLG_OK)
        cten_free(out);
    return st;
}

static clg_status const_add(imp *im, const char *name, cten *t)
{
    if (!name || !name[0]) {
        cten_free(t);
        return fail(im, "a constant has no name");
    }
    if (smap_get(&im->cmap, name) >= 0 || smap_get(&im->vmap, name) >= 0) {
        cten_free(t);
        return fail(im, "the name '%s' is defined twice", name);
    }
    if (im->nconsts == im->capconsts) {
        int nc = im->capconsts ? im->capconsts * 2 : 64;
        cten *n = realloc(im->consts, sizeof *n * (size_t)nc);
        if (!n) {
            cten_free(t);
            return oom(im);
        }
        im->consts = n;
        im->capconsts = nc;
    }
    im->consts[im->nconsts] = *t;
    if (!smap_put(&im->cmap, name, im->nconsts)) {
        cten_free(t);
        return oom(im);
    }
    im->nconsts++;
    return CLG_OK;
}

static const cten *cget(const imp *im, const char *name)
{
    int i = smap_get(&im->cmap, name);
    return i >= 0 ? &im->consts[i] : NULL;
}

/* A float constant input of the current node (NULL with an error when it is not one). */
static const cten *cin(imp *im, size_t k, const char *what, clg_status *st)
{
    const Onnx__NodeProto *n = im->node;
    if (k >= n->n_input || !n->input[k] || !n->input[k][0]) {
        *st = fail(im, "input %zu (%s) is missing", k, what);
        return NULL;
    }
    const cten *t = cget(im, n->input[k]);
    if (!t) {
        *st = unsupported(im, "input %zu (%s) '%s' must be a constant (an initializer)", k, what, n->input[k]);
        return NULL;
    }
    if (!t->f) {
        *st = fail(im, "input %zu (%s) '%s' must hold float32 values", k, what, n->input[k]);
        return NULL;
    }
    *st = CLG_OK;
    return t;
}

/* 1 when constant c, added to / dividing a tensor of rank `rank` (4: N, K,
 * H, W; 2: N, K) under ONNX (numpy) broadcasting, acts per channel K (or is
 * one value). A (K) vector against a rank-4 tensor would act along W. */
static int per_channel(const cten *c, int K, int rank)
{
    if (c->numel == 1)
        return 1;
    if (c->numel != (size_t)K || c->ndim > rank)
        return 0;
    int kpos = c->ndim - (rank == 4 ? 3 : 1); /* index of the K dimension in c's dims */
    if (kpos < 0)
        return 0;
    for (int d = 0; d < c->ndim; d++)
        if (d != kpos && c->dims[d] != 1)
            return 0;
    return c->dims[kpos] == K;
}

/* ---- values and layers ---- */

static int vget(const imp *im, const char *name) { return name ? smap_get(&im->vmap, name) : -1; }

/* The value of input k (a computed tensor, not a constant). */
static clg_status vin(imp *im, size_t k, int *out)
{
    const Onnx__NodeProto *n = im->node;
    if (k >= n->n_input || !n->input[k] || !n->input[k][0])
        return fail(im, "input %zu is missing", k);
    int v = vget(im, n->input[k]);
    if (v < 0) {
        if (cget(im, n->input[k]))
            return unsupported(im, "input %zu '%s' is a constant; clgrad needs a computed tensor there", k,
                               n->input[k]);
        return fail(im, "input %zu '%s' is not produced by an earlier node (graph not sorted?)", k, n->input[k]);
    }
    if (im->vals[v].pad && !im->allow_pad)
        return unsupported(im, "input %zu '%s' comes from a Pad; padding is supported only into Conv / AveragePool", k,
                           n->input[k]);
    *out = v;
    return CLG_OK;
}

static clg_status vdef(imp *im, const char *name, int layer, int c, int h, int w, int norm_stage, int rank)
{
    if (!name || !name[0])
        return fail(im, "an output has no name");
    if (smap_get(&im->vmap, name) >= 0 || smap_get(&im->cmap, name) >= 0)
        return fail(im, "the value '%s' is defined twice", name);
    if (im->nvals == im->capvals) {
        int nc = im->capvals ? im->capvals * 2 : 64;
        value *n = realloc(im->vals, sizeof *n * (size_t)nc);
        if (!n)
            return oom(im);
        im->vals = n;
        im->capvals = nc;
    }
    value *v = &im->vals[im->nvals];
    v->layer = layer;
    v->c = c;
    v->h = h;
    v->w = w;
    v->norm_stage = norm_stage;
    v->pad = 0;
    v->rank = rank;
    int u = smap_get(&im->uses, name);
    v->nuse = u >= 0 ? im->usecnt[u] : 0;
    if (!smap_put(&im->vmap, name, im->nvals))
        return oom(im);
    im->nvals++;
    return CLG_OK;
}

/* The node's output k (required). */
static clg_status out_name(imp *im, size_t k, const char **out)
{
    if (k >= im->node->n_output || !im->node->output[k] || !im->node->output[k][0])
        return fail(im, "output %zu is missing", k);
    *out = im->node->output[k];
    return CLG_OK;
}

/* Extra outputs (mask, indices, running statistics) must be unused. */
static clg_status extra_outputs_unused(imp *im, size_t from)
{
    for (size_t k = from; k < im->node->n_output; k++)
        if (im->node->output[k] && im->node->output[k][0] && smap_get(&im->uses, im->node->output[k]) >= 0)
            return unsupported(im, "output %zu ('%s') is not supported (only the first output may be used)", k,
                               im->node->output[k]);
    return CLG_OK;
}

static void make_name(imp *im, char *dst, size_t cap, const char *want, const char *op)
{
    char base[48];
    size_t j = 0;
    const char *s = want && want[0] ? want : op;
    for (; *s && j < 40; s++) {
        unsigned char ch = (unsigned char)*s;
        base[j++] = (char)(isalnum(ch) || ch == '_' || ch == '-' || ch == '.' ? ch : '_');
    }
    base[j] = 0;
    if (!isalpha((unsigned char)base[0])) {
        memmove(base + 1, base, j + 1);
        base[0] = 'n';
    }
    snprintf(dst, cap, "%s", base);
    for (int k = 2; smap_get(&im->lnames, dst) >= 0 || strcmp(dst, "data") == 0 || strcmp(dst, "input") == 0; k++)
        snprintf(dst, cap, "%s_%d", base, k);
}

static clg_status layer_new(imp *im, const char *type, const char *want, const int *in, int nin, ilayer **out)
{
    if (nin > IMP_MAX_IN)
        return unsupported(im, "%d inputs (at most %d)", nin, IMP_MAX_IN);
    if (im->nlayers == im->caplayers) {
        int nc = im->caplayers ? im->caplayers * 2 : 32;
        ilayer *n = realloc(im->layers, sizeof *n * (size_t)nc);
        if (!n)
            return oom(im);
        im->layers = n;
        im->caplayers = nc;
    }
    char **ns = realloc(im->lname_store, sizeof *ns * (size_t)(im->nlname + 1));
    if (!ns)
        return oom(im);
    im->lname_store = ns;
    ilayer *l = &im->layers[im->nlayers];
    memset(l, 0, sizeof *l);
    l->type = type;
    l->rank = 4;
    make_name(im, l->name, sizeof l->name, want, im->node ? im->node->op_type : type);
    char *copy = strdup(l->name);
    if (!copy)
        return oom(im);
    im->lname_store[im->nlname++] = copy;
    if (!smap_put(&im->lnames, copy, im->nlayers))
        return oom(im);
    for (int i = 0; i < nin; i++)
        l->in[i] = in[i];
    l->nin = nin;
    im->nlayers++;
    *out = l;
    return CLG_OK;
}

static void kv(ilayer *l, const char *k, const char *fmt, ...) CLG_PRINTF(3, 4);
static void kv(ilayer *l, const char *k, const char *fmt, ...)
{
    int i = 0;
    while (i < l->nkv && strcmp(l->key[i], k) != 0)
        i++;
    if (i == l->nkv) {
        if (l->nkv == IMP_MAX_KV)
            return; /* never: a layer gets at most 7 keys */
        l->nkv++;
    }
    snprintf(l->key[i], sizeof l->key[i], "%s", k);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->val[i], sizeof l->val[i], fmt, ap);
    va_end(ap);
}

static clg_status weight(imp *im, const ilayer *l, const char *param, int ndim, const int *shape, const float *data)
{
    char nm[160];
    snprintf(nm, sizeof nm, "%s.%s", l->name, param);
    return clg_ckpt_add_f32(im->err, im->ck, nm, ndim, shape, data);
}

/* Maps the node output to layer l (index li) with l's shape. */
static clg_status produce(imp *im, int li)
{
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    ilayer *l = &im->layers[li];
    return vdef(im, o, li, l->c, l->h, l->w, 0, l->rank);
}

/* ---- operators ---- */

static int conv_out(int in, int k, int s, int p, int d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

static clg_status op_conv(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    clg_status st = CLG_OK;
    im->allow_pad = 1;
    st = vin(im, 0, &xv);
    im->allow_pad = 0;
    CLG_TRY(st);
    const cten *W = cin(im, 1, "weights", &st);
    CLG_TRY(st);
    const cten *B = NULL;
    if (n->n_input > 2 && n->input[2] && n->input[2][0]) {
        B = cin(im, 2, "bias", &st);
        CLG_TRY(st);
    }
    const value x = im->vals[xv];
    if (W->ndim != 4)
        return unsupported(im, "weights of %d dimensions (only 2-D convolution)", W->ndim);
    int stride, dil, pad, group;
    int64_t group64 = 1;
    CLG_TRY(attr_int(im, "group", 1, 1, 1 << 20, &group64));
    group = (int)group64;
    CLG_TRY(attr_sym(im, "strides", 2, 1, 1, 4096, &stride));
    CLG_TRY(attr_sym(im, "dilations", 2, 1, 1, 4096, &dil));
    CLG_TRY(attr_sym(im, "pads", 4, 0, 0, 4096, &pad));
    pad += x.pad; /* a zero Pad before the Conv */
    CLG_TRY(attr_auto_pad(im));
    int K = (int)W->dims[0], Cg = (int)W->dims[1], R = (int)W->dims[2], S = (int)W->dims[3];
    int ks = 0;
    CLG_TRY(attr_sym(im, "kernel_shape", 2, R, 1, 4096, &ks));
    if (K < 1 || Cg < 1 || R < 1 || S < 1 || R > 4096 || S > 4096 || K > (1 << 20))
        return fail(im, "weights of shape %lldx%lldx%lldx%lld", (long long)W->dims[0], (long long)W->dims[1],
                    (long long)W->dims[2], (long long)W->dims[3]);
    if (ks != R || (attr(n, "kernel_shape") && R != S))
        return unsupported(im, "kernel_shape does not match the %dx%d weights", R, S);
    if (group < 1 || (long long)Cg * group != x.c || K % group)
        return fail(im, "weights for %d input channels x %d groups, the input has %d channels", Cg, group, x.c);
    if (B && B->numel != (size_t)K)
        return fail(im, "bias of %zu values for %d filters", B->numel, K);
    int P = conv_out(x.h, R, stride, pad, dil), Q = conv_out(x.w, S, stride, pad, dil);
    if (P < 1 || Q < 1)
        return fail(im, "the output would be empty (%dx%d input)", x.h, x.w);
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "convolutional", n->name, &in, 1, &l));
    kv(l, "filters", "%d", K);
    if (R == S)
        kv(l, "size", "%d", R);
    else {
        kv(l, "size_h", "%d", R);
        kv(l, "size_w", "%d", S);
    }
    if (stride != 1)
        kv(l, "stride", "%d", stride);
    if (pad)
        kv(l, "pad", "%d", pad);
    if (dil != 1)
        kv(l, "dilation", "%d", dil);
    if (group != 1)
        kv(l, "groups", "%d", group);
    l->c = K;
    l->h = P;
    l->w = Q;
    l->fusable = 1;
    l->bias = B != NULL;
    int ws[4] = {K, Cg, R, S};
    CLG_TRY(weight(im, l, "weight", 4, ws, W->f));
    if (B)
        CLG_TRY(weight(im, l, "bias", 1, &K, B->f));
    return produce(im, im->nlayers - 1);
}

/* dense from a value and a weight matrix w (units x in, row-major) */
static clg_status make_dense(imp *im, int xv, const float *w, int units, const float *bias)
{
    const value x = im->vals[xv];
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "dense", im->node->name, &in, 1, &l));
    kv(l, "units", "%d", units);
    l->c = units;
    l->h = l->w = 1;
    l->rank = 2;
    l->fusable = 1;
    l->bias = bias != NULL;
    int ws[2] = {units, x.c * x.h * x.w};
    CLG_TRY(weight(im, l, "weight", 2, ws, w));
    if (bias)
        CLG_TRY(weight(im, l, "bias", 1, &units, bias));
    return produce(im, im->nlayers - 1);
}

static clg_status op_gemm(imp *im, int matmul)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    clg_status st = CLG_OK;
    CLG_TRY(vin(im, 0, &xv));
    const cten *B = cin(im, 1, "weights", &st);
    CLG_TRY(st);
    const cten *C = NULL;
    if (!matmul && n->n_input > 2 && n->input[2] && n->input[2][0]) {
        C = cin(im, 2, "bias", &st);
        CLG_TRY(st);
    }
    double alpha = 1, beta = 1;
    int transA = 0, transB = 0;
    if (!matmul) {
        CLG_TRY(attr_float(im, "alpha", 1.0, -FLT_MAX, FLT_MAX, &alpha));
        CLG_TRY(attr_float(im, "beta", 1.0, -FLT_MAX, FLT_MAX, &beta));
        CLG_TRY(attr_bool(im, "transA", &transA));
        CLG_TRY(attr_bool(im, "transB", &transB));
    }
    if (transA)
        return unsupported(im, "transA = 1 (the input must be samples x features)");
    if (B->ndim != 2)
        return unsupported(im, "weights of %d dimensions (a 2-D matrix is needed)", B->ndim);
    const value x = im->vals[xv];
    if (x.rank != 2)
        return unsupported(im, "a rank-%d input (%s multiplies the last axis; a Flatten first makes it samples x "
                               "features)",
                           x.rank, matmul ? "MatMul" : "Gemm");
    long long feat = (long long)x.c * x.h * x.w;
    long long units = transB ? B->dims[0] : B->dims[1], kin = transB ? B->dims[1] : B->dims[0];
    if (kin != feat || units < 1 || units > (1 << 24))
        return fail(im, "weights %lldx%lld do not fit %lld input features", (long long)B->dims[0],
                    (long long)B->dims[1], feat);
    if (C && !per_channel(C, (int)units, 2))
        return unsupported(im, "bias of %zu values (%d dimensions) is not one per unit of %lld", C->numel, C->ndim,
                           units);
    float *w = malloc(B->numel * sizeof(float) + 1);
    float *b = C ? malloc((size_t)units * sizeof(float)) : NULL;
    if (!w || (C && !b)) {
        free(w);
        free(b);
        return oom(im);
    }
    for (long long u = 0; u < units; u++)
        for (long long k = 0; k < kin; k++)
            w[u * kin + k] = (float)(alpha * (transB ? B->f[u * kin + k] : B->f[k * units + u]));
    for (long long u = 0; C && u < units; u++)
        b[u] = (float)(beta * C->f[C->numel == 1 ? 0 : u]);
    st = make_dense(im, xv, w, (int)units, b);
    free(w);
    free(b);
    return st;
}

/* Add of a constant: the bias of a conv / dense without one whose output is used only here. */
static clg_status add_const_bias(imp *im, int xv, const cten *c)
{
    value *x = &im->vals[xv];
    if (x->layer < 0 || x->nuse != 1)
        return unsupported(im, "adding a constant is supported only as the bias of a Conv / MatMul");
    ilayer *l = &im->layers[x->layer];
    if (!l->fusable || l->bias || l->act || x->layer != im->nlayers - 1)
        return unsupported(im, "adding a constant is supported only as the bias of a Conv / MatMul");
    int K = l->rank == 3 ? l->h : l->c; /* a sequence (N, T, units): c = T */
    if (!per_channel(c, K, l->rank))
        return unsupported(im, "a constant of %zu values (%d dimensions) is not a per-channel bias of %d channels",
                           c->numel, c->ndim, K);
    float *b = malloc((size_t)K * sizeof(float));
    if (!b)
        return oom(im);
    for (int k = 0; k < K; k++)
        b[k] = c->f[c->numel == 1 ? 0 : k];
    clg_status st = weight(im, l, "bias", 1, &K, b);
    free(b);
    l->bias = 1;
    CLG_TRY(st);
    return produce(im, x->layer);
}

static clg_status act_layer(imp *im, int xv, const char *type, double alpha)
{
    value *x = &im->vals[xv];
    /* fuse into the producing conv / dense when this is its only consumer */
    if (x->layer >= 0 && x->layer == im->nlayers - 1 && im->layers[x->layer].fusable && !im->layers[x->layer].act &&
        x->nuse == 1) {
        ilayer *l = &im->layers[x->layer];
        kv(l, "activation", "%s", type);
        if (strcmp(type, "leaky") == 0)
            kv(l, "alpha", "%.9g", alpha);
        l->act = 1;
        return produce(im, x->layer);
    }
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "activation", im->node->name, &in, 1, &l));
    kv(l, "type", "%s", type);
    if (strcmp(type, "leaky") == 0)
        kv(l, "alpha", "%.9g", alpha);
    l->rank = x->rank;
    l->c = x->c;
    l->h = x->h;
    l->w = x->w;
    return produce(im, im->nlayers - 1);
}

static clg_status op_pool(imp *im, int is_max)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    im->allow_pad = !is_max; /* zero padding is what an average counting the padding sees */
    clg_status st = vin(im, 0, &xv);
    im->allow_pad = 0;
    CLG_TRY(st);
    const value x = im->vals[xv];
    int k = 0, stride, pad, dil;
    if (!attr(n, "kernel_shape"))
        return fail(im, "kernel_shape is required");
    CLG_TRY(attr_sym(im, "kernel_shape", 2, 1, 1, 65536, &k));
    CLG_TRY(attr_sym(im, "strides", 2, 1, 1, 65536, &stride));
    CLG_TRY(attr_sym(im, "pads", 4, 0, 0, k / 2, &pad));
    CLG_TRY(attr_sym(im, "dilations", 2, 1, 1, 1, &dil));
    int ceil_mode = 0, storage_order = 0, count_include_pad = 0;
    CLG_TRY(attr_bool(im, "ceil_mode", &ceil_mode));
    CLG_TRY(attr_bool(im, "storage_order", &storage_order));
    CLG_TRY(attr_bool(im, "count_include_pad", &count_include_pad));
    if (ceil_mode)
        return unsupported(im, "ceil_mode = 1 (clgrad floors the output size)");
    if (storage_order)
        return unsupported(im, "storage_order = 1");
    CLG_TRY(attr_auto_pad(im));
    if (!is_max && pad > 0 && !count_include_pad)
        return unsupported(im, "count_include_pad = 0 with padding (clgrad's average counts the padding)");
    pad += x.pad; /* a zero Pad before the average */
    if (pad > k / 2)
        return unsupported(im, "padding %d with a %dx%d window (at most %d)", pad, k, k, k / 2);
    CLG_TRY(extra_outputs_unused(im, 1));
    int P = (x.h + 2 * pad - k) / stride + 1, Q = (x.w + 2 * pad - k) / stride + 1;
    if (x.h + 2 * pad < k || x.w + 2 * pad < k)
        return fail(im, "a %dx%d window does not fit the %dx%d input", k, k, x.h, x.w);
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, is_max ? "maxpool" : "avgpool", n->name, &in, 1, &l));
    kv(l, "size", "%d", k);
    kv(l, "stride", "%d", stride);
    if (pad)
        kv(l, "pad", "%d", pad);
    l->c = x.c;
    l->h = P;
    l->w = Q;
    return produce(im, im->nlayers - 1);
}

static clg_status simple_layer(imp *im, const char *type, int xv, int c, int h, int w)
{
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, type, im->node->name, &in, 1, &l));
    l->c = c;
    l->h = h;
    l->w = w;
    l->rank = strcmp(type, "flatten") == 0 || strcmp(type, "softmax") == 0 ? 2
              : strcmp(type, "gap") == 0                                ? 4
                                                                        : im->vals[xv].rank;
    return produce(im, im->nlayers - 1);
}

static clg_status op_batchnorm(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    clg_status st = CLG_OK;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    const char *what[4] = {"scale", "bias", "mean", "variance"};
    const cten *t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = cin(im, (size_t)i + 1, what[i], &st);
        CLG_TRY(st);
        if (t[i]->numel != (size_t)x.c)
            return fail(im, "%s has %zu values for %d channels", what[i], t[i]->numel, x.c);
    }
    for (int c = 0; c < x.c; c++)
        if (!(t[3]->f[c] >= 0))
            return fail(im, "variance of channel %d is negative", c);
    int training_mode = 0;
    CLG_TRY(attr_bool(im, "training_mode", &training_mode));
    if (training_mode)
        return unsupported(im, "training_mode = 1 (export the model in inference mode)");
    CLG_TRY(extra_outputs_unused(im, 1));
    double eps = 1e-5, mom = 0.9;
    CLG_TRY(attr_float(im, "epsilon", 1e-5, 0, FLT_MAX, &eps));
    CLG_TRY(attr_float(im, "momentum", 0.9, 0, 1, &mom));
    if (!(eps >= 1e-12 && eps <= 1.0))
        return unsupported(im, "epsilon %g outside [1e-12, 1]", eps);
    if (!(mom >= 0 && mom <= 1))
        mom = 0.9;
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "batchnorm", n->name, &in, 1, &l));
    kv(l, "eps", "%.9g", eps);
    kv(l, "momentum", "%.9g", 1.0 - mom); /* ONNX keeps mom of the old statistic, PyTorch / clgrad 1 - mom */
    l->rank = x.rank;
    l->c = x.c;
    l->h = x.h;
    l->w = x.w;
    const char *pn[4] = {"gamma", "beta", "running_mean", "running_var"};
    for (int i = 0; i < 4; i++)
        CLG_TRY(weight(im, l, pn[i], 1, &x.c, t[i]->f));
    return produce(im, im->nlayers - 1);
}

static clg_status op_dropout(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    double p = 0.5;
    CLG_TRY(attr_float(im, "ratio", 0.5, 0, 1, &p));
    if (n->n_input > 1 && n->input[1] && n->input[1][0]) {
        const cten *r = cget(im, n->input[1]);
        if (!r || !r->f || r->numel != 1)
            return unsupported(im, "the ratio must be a constant scalar");
        p = r->f[0];
    }
    if (n->n_input > 2 && n->input[2] && n->input[2][0]) {
        const cten *tm = cget(im, n->input[2]);
        if (!tm)
            return unsupported(im, "training_mode must be a constant");
    }
    if (!(p >= 0 && p <= 0.99))
        return unsupported(im, "ratio %g outside [0, 0.99]", p);
    CLG_TRY(extra_outputs_unused(im, 1));
    int in = im->vals[xv].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "dropout", n->name, &in, 1, &l));
    kv(l, "p", "%.9g", p);
    l->rank = x.rank;
    l->c = x.c;
    l->h = x.h;
    l->w = x.w;
    return produce(im, im->nlayers - 1);
}

/* Flatten / Reshape to (N, features): a flatten layer, or nothing when
 * the value already is a vector. */
static clg_status to_2d(imp *im, int xv)
{
    const value x = im->vals[xv];
    if (x.h == 1 && x.w == 1) {
        const char *o = NULL;
        CLG_TRY(out_name(im, 0, &o));
        return vdef(im, o, x.layer, x.c, 1, 1, x.norm_stage, 2);
    }
    long long f = (long long)x.c * x.h * x.w;
    if (f > (1LL << 30))
        return fail(im, "%lld features", f);
    return simple_layer(im, "flatten", xv, (int)f, 1, 1);
}

static clg_status op_reshape(imp *im)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    const Onnx__NodeProto *n = im->node;
    const cten *s = n->n_input > 1 && n->input[1] ? cget(im, n->input[1]) : NULL;
    if (!s || !s->i64)
        return unsupported(im, "the target shape must be a constant int64 tensor");
    long long f = (long long)x.c * x.h * x.w;
    if (s->numel == 2 && (s->i64[0] == 0 || s->i64[0] == -1 || s->i64[0] > 0) &&
        (s->i64[1] == -1 || s->i64[1] == f) && !(s->i64[0] == -1 && s->i64[1] == -1))
        return to_2d(im, xv);
    if (s->numel == 4 && (s->i64[0] == 0 || s->i64[0] == -1 || s->i64[0] > 0) && s->i64[1] == x.c &&
        s->i64[2] == x.h && s->i64[3] == x.w) { /* no-op */
        const char *o = NULL;
        CLG_TRY(out_name(im, 0, &o));
        return vdef(im, o, x.layer, x.c, x.h, x.w, x.norm_stage, 4);
    }
    return unsupported(im, "only a reshape to (batch, features) is supported");
}

static clg_status op_add(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    if (n->n_input != 2)
        return fail(im, "%zu inputs (Add takes 2)", n->n_input);
    const cten *c0 = n->input[0] ? cget(im, n->input[0]) : NULL, *c1 = n->input[1] ? cget(im, n->input[1]) : NULL;
    if (c0 || c1) {
        if (c0 && c1)
            return unsupported(im, "adding two constants");
        int xv = 0;
        CLG_TRY(vin(im, c0 ? 1 : 0, &xv));
        const cten *c = c0 ? c0 : c1;
        if (!c->f)
            return fail(im, "the constant is not float32");
        return add_const_bias(im, xv, c);
    }
    int a = 0, b = 0;
    CLG_TRY(vin(im, 0, &a));
    CLG_TRY(vin(im, 1, &b));
    const value va = im->vals[a], vb = im->vals[b];
    if (va.c != vb.c || va.h != vb.h || va.w != vb.w || va.rank != vb.rank)
        return unsupported(im, "shapes %dx%dx%d and %dx%dx%d differ (no broadcasting)", va.c, va.h, va.w, vb.c, vb.h,
                           vb.w);
    int in[2];
    in[0] = im->vals[a].layer; /* -1: the network input ("data") */
    in[1] = im->vals[b].layer; /* -1: the network input ("data") */
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "add", n->name, in, 2, &l));
    l->rank = va.rank;
    l->c = va.c;
    l->h = va.h;
    l->w = va.w;
    return produce(im, im->nlayers - 1);
}

static clg_status op_concat(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int64_t axis = 1;
    CLG_TRY(attr_int(im, "axis", 1, -4, 3, &axis));
    if (n->n_input < 2 || n->n_input > IMP_MAX_IN)
        return unsupported(im, "%zu inputs (2 to %d)", n->n_input, IMP_MAX_IN);
    int in[IMP_MAX_IN], c = 0, h = 0, w = 0, in0v = 0;
    for (size_t i = 0; i < n->n_input; i++) {
        int v = 0;
        CLG_TRY(vin(im, i, &v));
        if (i == 0)
            in0v = v;
        const value x = im->vals[v];
        if (i == 0) {
            h = x.h;
            w = x.w;
        } else if (x.h != h || x.w != w)
            return fail(im, "inputs of different heights / widths");
        if (x.rank != im->vals[in0v].rank || !(axis == 1 || (x.rank == 4 && axis == -3) || (x.rank == 2 && axis == -1)))
            return unsupported(im, "axis %lld (only channels, axis 1)", (long long)axis);
        c += x.c;
        in[i] = im->vals[v].layer; /* -1: the network input ("data") */
    }
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "concat", n->name, in, (int)n->n_input, &l));
    l->rank = im->vals[in0v].rank;
    l->c = c;
    l->h = h;
    l->w = w;
    return produce(im, im->nlayers - 1);
}

/* Sub / Div by per-channel constants on the network input: the input
 * normalization (x - mean) / std. */
static clg_status op_norm(imp *im, int is_div)
{
    int xv = 0;
    clg_status st = CLG_OK;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    if (x.layer != -1 || x.norm_stage >= (is_div ? 2 : 1) || x.nuse != 1)
        return unsupported(im, "%s is supported only by a per-channel constant on the network input (the input "
                               "normalization)",
                           is_div ? "division" : "subtraction");
    const cten *c = cin(im, 1, is_div ? "std" : "mean", &st);
    CLG_TRY(st);
    if (!per_channel(c, x.c, 4))
        return unsupported(im, "a constant of %zu values (%d dimensions) is not per channel of the %d input channels "
                               "(shape (1, C, 1, 1) or one value)",
                           c->numel, c->ndim, x.c);
    if (x.c > CLG_DS_MAX_CHANNELS)
        return unsupported(im, "input normalization of %d channels (at most %d)", x.c, CLG_DS_MAX_CHANNELS);
    for (int ch = 0; ch < x.c; ch++) {
        float v = c->f[c->numel == 1 ? 0 : ch];
        if (is_div) {
            if (!(v >= 1e-6f && v <= 1e5f))
                return unsupported(im, "std %g of channel %d outside [1e-6, 1e5]", v, ch);
            im->std[ch] = v;
        } else {
            if (!(v >= -1e5f && v <= 1e5f))
                return unsupported(im, "mean %g of channel %d outside [-1e5, 1e5]", v, ch);
            im->mean[ch] = v;
        }
    }
    im->has_norm = 1;
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    return vdef(im, o, -1, x.c, x.h, x.w, is_div ? 2 : 1, 4);
}

/* Pad with zeros, the same on every side of H and W: folded into the
 * Conv / AveragePool that reads it (nothing when 0). */
static clg_status op_pad(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    int constant = 0;
    CLG_TRY(attr_str_is(im, "mode", "constant", &constant));
    if (!constant)
        return unsupported(im, "mode other than constant");
    const int64_t *pads = NULL;
    size_t np = 0;
    const Onnx__AttributeProto *pa = NULL;
    CLG_TRY(attr_get(im, "pads", AT(INTS), &pa));
    if (n->n_input > 1 && n->input[1] && n->input[1][0]) {
        const cten *c = cget(im, n->input[1]);
        if (!c || !c->i64)
            return unsupported(im, "pads must be a constant int64 tensor");
        pads = c->i64;
        np = c->numel;
    } else if (pa) {
        pads = pa->ints;
        np = pa->n_ints;
    }
    double value = 0.0;
    CLG_TRY(attr_float(im, "value", 0.0, -FLT_MAX, FLT_MAX, &value));
    if (n->n_input > 2 && n->input[2] && n->input[2][0]) {
        const cten *c = cget(im, n->input[2]);
        if (!c || !c->f || c->numel != 1)
            return unsupported(im, "the padding value must be a constant scalar");
        value = c->f[0];
    }
    if (value != 0)
        return unsupported(im, "padding with %g (only zeros)", value);
    if (np != 8 || pads[0] || pads[1] || pads[4] || pads[5] || pads[2] != pads[3] || pads[2] != pads[6] ||
        pads[2] != pads[7] || pads[2] < 0 || pads[2] > 4096)
        return unsupported(im, "only the same zero padding on every side of height and width");
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    CLG_TRY(vdef(im, o, x.layer, x.c, x.h, x.w, x.norm_stage, x.rank));
    im->vals[im->nvals - 1].pad = x.pad + (int)pads[2];
    if (im->vals[im->nvals - 1].pad && im->vals[im->nvals - 1].nuse != 1)
        return unsupported(im, "a padded tensor read by %d nodes (only by one Conv / AveragePool)",
                           im->vals[im->nvals - 1].nuse);
    return CLG_OK;
}

static int is_scalar(const imp *im, const char *name, double want, double tol)
{
    const cten *c = name ? cget(im, name) : NULL;
    return c && c->f && c->numel == 1 && fabs(c->f[0] - want) <= tol;
}

/* The other input of a 2-input node besides `name`, or NULL. */
static const char *other_input(const Onnx__NodeProto *n, const char *name)
{
    if (n->n_input != 2 || !n->input[0] || !n->input[1])
        return NULL;
    if (strcmp(n->input[0], name) == 0)
        return n->input[1];
    if (strcmp(n->input[1], name) == 0)
        return n->input[0];
    return NULL;
}

static int is_op(const Onnx__NodeProto *n, const char *op)
{
    return n->op_type && strcmp(n->op_type, op) == 0 && (!n->domain || !n->domain[0] || strcmp(n->domain, "ai.onnx") == 0);
}

/* The node after `from` (within a few) that reads value `name`. */
static int next_reader(const Onnx__GraphProto *g, size_t from, const char *name)
{
    for (size_t i = from + 1; i < g->n_node && i < from + 8; i++)
        for (size_t k = 0; k < g->node[i]->n_input; k++)
            if (g->node[i]->input[k] && strcmp(g->node[i]->input[k], name) == 0)
                return (int)i;
    return -1;
}

/* GELU in the erf form as PyTorch writes it:
 *   y = (x * (erf(x / sqrt 2) + 1)) * 0.5
 * Returns the index of the last node of the pattern, or -1. */
static int match_gelu(const imp *im, const Onnx__GraphProto *g, size_t i, int parts[4])
{
    const Onnx__NodeProto *d = g->node[i];
    if (!is_op(d, "Div") || d->n_input != 2 || d->n_output != 1 || !d->input[0] || !d->input[1] ||
        !is_scalar(im, d->input[1], 1.41421356, 1e-3) || vget(im, d->input[0]) < 0)
        return -1;
    const char *x = d->input[0];
    int e = next_reader(g, i, d->output[0]);
    if (e < 0 || !is_op(g->node[e], "Erf") || g->node[e]->n_output != 1)
        return -1;
    int a = next_reader(g, (size_t)e, g->node[e]->output[0]);
    if (a < 0 || !is_op(g->node[a], "Add") || g->node[a]->n_output != 1 ||
        !is_scalar(im, other_input(g->node[a], g->node[e]->output[0]), 1.0, 1e-6))
        return -1;
    int m = next_reader(g, (size_t)a, g->node[a]->output[0]);
    const char *ox = m >= 0 ? other_input(g->node[m], g->node[a]->output[0]) : NULL;
    if (m < 0 || !is_op(g->node[m], "Mul") || g->node[m]->n_output != 1 || !ox || strcmp(ox, x) != 0)
        return -1;
    int h = next_reader(g, (size_t)m, g->node[m]->output[0]);
    if (h < 0 || !is_op(g->node[h], "Mul") || g->node[h]->n_output != 1 ||
        !is_scalar(im, other_input(g->node[h], g->node[m]->output[0]), 0.5, 1e-6))
        return -1;
    parts[0] = e;
    parts[1] = a;
    parts[2] = m;
    parts[3] = h;
    return h;
}

static clg_status op_constant(imp *im)
{
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    cten t;
    memset(&t, 0, sizeof t);
    const Onnx__AttributeProto *a, *av, *avf, *avfs, *avi, *avis;
    CLG_TRY(attr_get(im, "value", AT(TENSOR), &av));
    CLG_TRY(attr_get(im, "value_float", AT(FLOAT), &avf));
    CLG_TRY(attr_get(im, "value_floats", AT(FLOATS), &avfs));
    CLG_TRY(attr_get(im, "value_int", AT(INT), &avi));
    CLG_TRY(attr_get(im, "value_ints", AT(INTS), &avis));
    if ((a = av) && a->t) {
        CLG_TRY(tensor_read(im, a->t, &t));
    } else if ((a = avf) && a->has_f) {
        t.numel = 1;
        t.f = malloc(sizeof(float));
        if (!t.f)
            return oom(im);
        t.f[0] = a->f;
    } else if ((a = avfs) && a->n_floats <= CLG_ONNX_MAX_TENSOR) {
        t.ndim = 1;
        t.dims[0] = (int64_t)a->n_floats;
        t.numel = a->n_floats;
        t.f = malloc(CLG_MAX(a->n_floats, 1) * sizeof(float));
        if (!t.f)
            return oom(im);
        if (a->n_floats)
            memcpy(t.f, a->floats, a->n_floats * sizeof(float));
    } else if ((a = avi) && a->has_i) {
        t.numel = 1;
        t.i64 = malloc(sizeof(int64_t));
        if (!t.i64)
            return oom(im);
        t.i64[0] = a->i;
    } else if ((a = avis) && a->n_ints <= CLG_ONNX_MAX_TENSOR) {
        t.ndim = 1;
        t.dims[0] = (int64_t)a->n_ints;
        t.numel = a->n_ints;
        t.i64 = malloc(CLG_MAX(a->n_ints, 1) * sizeof(int64_t));
        if (!t.i64)
            return oom(im);
        if (a->n_ints)
            memcpy(t.i64, a->ints, a->n_ints * sizeof(int64_t));
    } else {
        return unsupported(im, "a constant without a float / int value");
    }
    for (size_t i = 0; t.f && i < t.numel; i++)
        if (!isfinite(t.f[i])) {
            cten_free(&t);
            return fail(im, "constant element %zu is not finite", i);
        }
    return const_add(im, o, &t);
}

static const char supported_ops[] =
    "Conv, Gemm, MatMul (+ Add), Relu, LeakyRelu, Sigmoid, Tanh, Gelu (and its Erf form), MaxPool, AveragePool, "
    "GlobalAveragePool, BatchNormalization, Dropout, Flatten, Reshape to 2-D, Add, Concat, Softmax, Identity, "
    "Constant, Pad (zeros, into Conv / AveragePool), Transpose of a constant, Sub/Div on the input; for sequences the "
    "patterns clgrad exports: Reshape+Cast+Gather (embedding), Slice+Add (positions), LayerNormalization, MatMul "
    "(+ Add), the attention block, GELU (erf or tanh form), Softmax over the last axis";

static clg_status op_activation(imp *im, const char *op)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    double alpha = 0.01;
    const char *type = op[0] == 'R' ? "relu" : op[0] == 'S' ? "sigmoid" : op[0] == 'T' ? "tanh" : "gelu";
    if (op[0] == 'L') {
        type = "leaky";
        CLG_TRY(attr_float(im, "alpha", 0.01, -FLT_MAX, FLT_MAX, &alpha));
        if (!(alpha >= 0 && alpha <= 1))
            return unsupported(im, "alpha %g outside [0, 1]", alpha);
    }
    if (op[0] == 'G') {
        int exact = 0;
        CLG_TRY(attr_str_is(im, "approximate", "none", &exact));
        if (!exact)
            return unsupported(im, "approximate GELU (only the erf form)");
    }
    return act_layer(im, xv, type, alpha);
}

/* Div: the first node of a GELU in its erf form (one layer; *i moves to the
 * pattern's last node), else the input normalization's division. */
static clg_status op_div(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    int parts[4];
    int end = match_gelu(im, g, *i, parts);
    if (end < 0)
        return op_norm(im, 1);
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    /* the pattern reads x twice: fusing into the producer is fine when nothing else does */
    value *x = &im->vals[xv];
    int saved = x->nuse;
    if (x->nuse == 2)
        x->nuse = 1;
    im->node = g->node[end]; /* the activation takes the last node's output */
    clg_status st = act_layer(im, xv, "gelu", 0.01);
    x = &im->vals[xv];
    x->nuse = saved;
    CLG_TRY(st);
    /* the nodes in between are skipped: only the pattern reads their outputs */
    for (size_t k = *i + 1; k < (size_t)end; k++) {
        const Onnx__NodeProto *m = g->node[k];
        int part = is_op(m, "Constant") || (int)k == parts[0] || (int)k == parts[1] || (int)k == parts[2];
        if (!part) { /* another node between the pattern's nodes */
            im->node = m;
            return unsupported(im, "a node between the nodes of a GELU (erf form) pattern");
        }
    }
    *i = (size_t)end;
    return CLG_OK;
}

static clg_status op_gap(imp *im)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    return simple_layer(im, "gap", xv, im->vals[xv].c, 1, 1);
}

static clg_status op_flatten(imp *im)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    int64_t axis = 1;
    CLG_TRY(attr_int(im, "axis", 1, -4, 4, &axis));
    if (axis != 1)
        return unsupported(im, "axis %lld (only 1: batch x features)", (long long)axis);
    return to_2d(im, xv);
}

static clg_status op_identity(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    const cten *c = n->n_input == 1 && n->input[0] ? cget(im, n->input[0]) : NULL;
    if (c) { /* a copy of a constant (exporters write these for initializers) */
        const char *o = NULL;
        CLG_TRY(out_name(im, 0, &o));
        cten t = *c;
        t.f = NULL;
        t.i64 = NULL;
        size_t bytes = CLG_MAX(c->numel, 1) * (c->f ? sizeof(float) : sizeof(int64_t));
        void *d = malloc(bytes);
        if (!d)
            return oom(im);
        memcpy(d, c->f ? (const void *)c->f : (const void *)c->i64, bytes);
        if (c->f)
            t.f = d;
        else
            t.i64 = d;
        return const_add(im, o, &t);
    }
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    return vdef(im, o, x.layer, x.c, x.h, x.w, x.norm_stage, x.rank);
}

/* Transpose of a constant matrix (a weight written as (in, out)). */
static clg_status op_transpose(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    const cten *c = n->n_input == 1 && n->input[0] ? cget(im, n->input[0]) : NULL;
    const Onnx__AttributeProto *pa = NULL;
    CLG_TRY(attr_get(im, "perm", AT(INTS), &pa));
    if (!c || !c->f || c->ndim != 2 || (pa && !(pa->n_ints == 2 && pa->ints[0] == 1 && pa->ints[1] == 0)))
        return unsupported(im, "only the transpose of a constant matrix");
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    cten t = *c;
    t.dims[0] = c->dims[1];
    t.dims[1] = c->dims[0];
    t.f = malloc(CLG_MAX(c->numel, 1) * sizeof(float));
    if (!t.f)
        return oom(im);
    for (int64_t r = 0; r < c->dims[0]; r++)
        for (int64_t q = 0; q < c->dims[1]; q++)
            t.f[q * c->dims[0] + r] = c->f[r * c->dims[1] + q];
    for (int k = 0, nt = im->ntables; k < nt; k++) /* an embedding's table transposed: a tied head may use it */
        if (!im->tables[k].transposed && strcmp(im->tables[k].name, n->input[0]) == 0 &&
            im->ntables < IMP_MAX_TABLES) {
            im->tables[im->ntables].name = o;
            im->tables[im->ntables].layer = im->tables[k].layer;
            im->tables[im->ntables++].transposed = 1;
        }
    return const_add(im, o, &t);
}

static clg_status op_softmax(imp *im)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    int64_t axis = 0;
    CLG_TRY(attr_int(im, "axis", im->opset >= 13 ? -1 : 1, -4, 3, &axis));
    if (x.rank == 3) { /* over the classes at every position: the token loss */
        if (im->opset < 13 || (axis != -1 && axis != 2))
            return unsupported(im, "softmax over axis %lld of a sequence (only the last axis)", (long long)axis);
        int in = x.layer;
        ilayer *l = NULL;
        CLG_TRY(layer_new(im, "softmax", im->node->name, &in, 1, &l));
        l->c = x.c;
        l->h = x.h;
        l->w = 1;
        l->rank = 3;
        return produce(im, im->nlayers - 1);
    }
    if (x.h != 1 || x.w != 1)
        return unsupported(im, "softmax over a %dx%dx%d tensor (class scores of shape batch x classes only)", x.c,
                           x.h, x.w);
    /* rank 2: axis 1 = -1; rank 4 (N, C, 1, 1): axis 1, or -3; before opset 13 an axis
     * flattens from there, so axis 1 covers C x 1 x 1 too */
    if (!(axis == 1 || (x.rank == 2 && axis == -1) || (x.rank == 4 && axis == -3)))
        return unsupported(im, "axis %lld of a rank-%d tensor (only the class axis, 1)", (long long)axis, x.rank);
    return simple_layer(im, "softmax", xv, x.c, 1, 1);
}

/* ---- sequences (issue 23): the patterns clgrad's exporter writes ----
 * A sequence (N, T, C) is a rank-3 value with c = T, h = C, w = 1 (the
 * layout of clgrad's sequence tensors, {N, T, C, 1}). */

/* Nodes g->node[i..i+n) have the op types ops[0..n) (NULL when the graph ends first). */
static int ops_at(const Onnx__GraphProto *g, size_t i, const char *const *ops, size_t n)
{
    if (i + n > g->n_node)
        return 0;
    for (size_t k = 0; k < n; k++)
        if (!is_op(g->node[i + k], ops[k]) || g->node[i + k]->n_output < 1 || g->node[i + k]->n_input < 1)
            return 0;
    return 1;
}

/* Input k of node n is the output of node m. */
static int reads(const Onnx__NodeProto *n, size_t k, const Onnx__NodeProto *m)
{
    return k < n->n_input && n->input[k] && m->output[0] && strcmp(n->input[k], m->output[0]) == 0;
}

/* Input k of node n is the value `name`. */
static int in_is(const Onnx__NodeProto *n, size_t k, const char *name)
{
    return k < n->n_input && n->input[k] && name && strcmp(n->input[k], name) == 0;
}

/* An int attribute of node n (def when absent). */
static int64_t node_int(const Onnx__NodeProto *n, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_i ? a->i : def;
}

/* Node n's "perm" is exactly p[0..cnt). */
static int perm_is(const Onnx__NodeProto *n, const int64_t *p, size_t cnt)
{
    const Onnx__AttributeProto *a = attr(n, "perm");
    if (!a || a->n_ints != cnt)
        return 0;
    for (size_t k = 0; k < cnt; k++)
        if (a->ints[k] != p[k])
            return 0;
    return 1;
}

/* The int64 constant input k of node n with cnt values (NULL otherwise). */
static const int64_t *i64_in(const imp *im, const Onnx__NodeProto *n, size_t k, size_t cnt)
{
    const cten *c = k < n->n_input && n->input[k] ? cget(im, n->input[k]) : NULL;
    return c && c->i64 && c->numel == cnt ? c->i64 : NULL;
}

static clg_status seq_value(imp *im, int li)
{
    const char *o = NULL;
    CLG_TRY(out_name(im, 0, &o));
    ilayer *l = &im->layers[li];
    return vdef(im, o, li, l->c, l->h, 1, 0, 3);
}

/* Reshape (N, ...) -> (N, T), Cast to int64 (or int32), Gather of a table
 * (vocab, dim), axis 0: an [embedding] reading token ids. -1: no match. */
static int match_embedding(const imp *im, const Onnx__GraphProto *g, size_t i)
{
    static const char *const ops[3] = {"Reshape", "Cast", "Gather"};
    if (!ops_at(g, i, ops, 3))
        return -1;
    const Onnx__NodeProto *r = g->node[i], *c = g->node[i + 1], *ga = g->node[i + 2];
    int xv = vget(im, r->input[0]);
    const int64_t *s = i64_in(im, r, 1, 2);
    const cten *t = ga->n_input == 2 && ga->input[0] ? cget(im, ga->input[0]) : NULL;
    int64_t to = node_int(c, "to", 0);
    if (xv < 0 || im->vals[xv].layer != -1 || !s || !reads(c, 0, r) || !reads(ga, 1, c) || !t || !t->f ||
        t->ndim != 2 || node_int(ga, "axis", 0) != 0 ||
        (to != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 && to != ONNX__TENSOR_PROTO__DATA_TYPE__INT32))
        return -1;
    long long T = (long long)im->vals[xv].c * im->vals[xv].h * im->vals[xv].w;
    if (T > (1 << 24))
        return -1;
    return (s[1] == T || s[1] == -1) && (s[0] == -1 || s[0] == 0) && s[0] != s[1] ? (int)(i + 2) : -1;
}

static clg_status op_embedding(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    im->node = g->node[*i + 2];
    const cten *t = cget(im, im->node->input[0]);
    int in = -1, shape[2] = {(int)t->dims[0], (int)t->dims[1]};
    if (t->dims[0] < 1 || t->dims[0] > (1 << 24) || t->dims[1] < 1 || t->dims[1] > (1 << 20))
        return unsupported(im, "an embedding table of %lldx%lld", (long long)t->dims[0], (long long)t->dims[1]);
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "embedding", im->node->name, &in, 1, &l));
    kv(l, "vocab", "%d", shape[0]);
    kv(l, "dim", "%d", shape[1]);
    l->c = x.c * x.h * x.w;
    l->h = shape[1];
    l->w = 1;
    l->rank = 3;
    im->tokens = 1;
    CLG_TRY(weight(im, l, "weight", 2, shape, t->f));
    if (im->ntables < IMP_MAX_TABLES) { /* a MatMul with its transpose is a head tied to it */
        im->tables[im->ntables].name = im->node->input[0];
        im->tables[im->ntables++].layer = im->nlayers - 1;
    }
    *i += 2;
    return seq_value(im, im->nlayers - 1);
}

/* Slice(table (context, C), starts 0, ends T[, axes 0[, steps 1]]) then Add
 * to a sequence (N, T, C): a [posembed]. */
static clg_status op_slice(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    const Onnx__NodeProto *n = im->node;
    const cten *t = n->n_input >= 3 && n->input[0] ? cget(im, n->input[0]) : NULL;
    const int64_t *st = i64_in(im, n, 1, 1), *en = i64_in(im, n, 2, 1), *ax = i64_in(im, n, 3, 1),
                  *sp = i64_in(im, n, 4, 1);
    const Onnx__NodeProto *a = *i + 1 < g->n_node && n->n_output == 1 && n->output[0] ? g->node[*i + 1] : NULL;
    const char *xn = a && is_op(a, "Add") && a->n_output >= 1 ? other_input(a, n->output[0]) : NULL;
    int xv = xn ? vget(im, xn) : -1;
    if (!t || !t->f || t->ndim != 2 || !st || !en || st[0] != 0 || (n->n_input > 3 && !ax) ||
        (ax && ax[0] != 0 && ax[0] != -2) || (n->n_input > 4 && (!sp || sp[0] != 1)) || xv < 0 ||
        im->vals[xv].rank != 3)
        return unsupported(im, "only the slice of a position table (context x C, rows 0..T) added to a sequence, "
                               "as clgrad exports [posembed]");
    const value x = im->vals[xv];
    if (CLG_MIN(en[0], t->dims[0]) != x.c || t->dims[1] != x.h)
        return unsupported(im, "a position table of %lldx%lld sliced to %lld rows does not fit a sequence %dx%d",
                           (long long)t->dims[0], (long long)t->dims[1], (long long)en[0], x.c, x.h);
    im->node = a;
    int in = x.layer, shape[2] = {(int)t->dims[0], (int)t->dims[1]};
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "posembed", a->name, &in, 1, &l));
    kv(l, "context", "%d", shape[0]);
    l->c = x.c;
    l->h = x.h;
    l->w = 1;
    l->rank = 3;
    CLG_TRY(weight(im, l, "weight", 2, shape, t->f));
    *i += 1;
    return seq_value(im, im->nlayers - 1);
}

/* LayerNormalization over the last axis of a sequence: [layernorm]
 * (affine = 0 when the scale is all ones and the bias absent or zero). */
static clg_status op_layernorm(imp *im)
{
    const Onnx__NodeProto *n = im->node;
    int xv = 0;
    clg_status st = CLG_OK;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    const cten *s = cin(im, 1, "scale", &st);
    CLG_TRY(st);
    const cten *b = NULL;
    if (n->n_input > 2 && n->input[2] && n->input[2][0]) {
        b = cin(im, 2, "bias", &st);
        CLG_TRY(st);
    }
    int64_t axis = -1;
    double eps = 1e-5;
    CLG_TRY(attr_int(im, "axis", -1, -3, 2, &axis));
    CLG_TRY(attr_float(im, "epsilon", 1e-5, 1e-12, 1.0, &eps));
    CLG_TRY(extra_outputs_unused(im, 1));
    if (x.rank != 3 || (axis != -1 && axis != 2))
        return unsupported(im, "only a layer norm over the last axis of a sequence (batch, positions, features)");
    int C = x.h;
    if (s->numel != (size_t)C || (b && b->numel != (size_t)C))
        return unsupported(im, "scale / bias of %zu / %zu values for %d features", s->numel, b ? b->numel : 0, C);
    int affine = 0;
    for (int c = 0; c < C; c++)
        affine |= s->f[c] != 1.0f || (b && b->f[c] != 0.0f);
    int in = x.layer;
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "layernorm", n->name, &in, 1, &l));
    kv(l, "eps", "%.9g", eps);
    kv(l, "affine", "%d", affine);
    l->c = x.c;
    l->h = C;
    l->w = 1;
    l->rank = 3;
    if (affine) {
        float *zero = calloc((size_t)C, sizeof(float));
        if (!zero)
            return oom(im);
        st = weight(im, l, "gamma", 1, &C, s->f);
        if (st == CLG_OK)
            st = weight(im, l, "beta", 1, &C, b ? b->f : zero);
        free(zero);
        CLG_TRY(st);
    }
    return seq_value(im, im->nlayers - 1);
}

/* MatMul of a sequence by a constant (K, units): [dense] per position
 * (tie = the embedding when the constant is its table transposed). */
static clg_status seq_dense(imp *im, int xv, const cten *B, const char *bname)
{
    const value x = im->vals[xv];
    if (B->ndim != 2 || B->dims[0] != x.h || B->dims[1] < 1 || B->dims[1] > (1 << 24))
        return unsupported(im, "weights of %d dimensions do not fit %d features per position", B->ndim, x.h);
    int K = (int)B->dims[0], units = (int)B->dims[1];
    int tied = -1;
    for (int k = 0; k < im->ntables; k++)
        if (im->tables[k].transposed && strcmp(im->tables[k].name, bname) == 0)
            tied = im->tables[k].layer;
    int in = x.layer;
    ilayer *l = NULL;
    CLG_TRY(layer_new(im, "dense", im->node->name, &in, 1, &l));
    kv(l, "units", "%d", units);
    l->c = x.c;
    l->h = units;
    l->w = 1;
    l->rank = 3;
    l->fusable = 1;
    if (tied >= 0) {
        kv(l, "tie", "%s", im->layers[tied].name);
        return seq_value(im, im->nlayers - 1);
    }
    float *w = malloc((size_t)K * units * sizeof(float));
    if (!w)
        return oom(im);
    for (int u = 0; u < units; u++)
        for (int k = 0; k < K; k++)
            w[(size_t)u * K + k] = B->f[(size_t)k * units + u];
    int ws[2] = {units, K};
    clg_status st = weight(im, l, "weight", 2, ws, w);
    free(w);
    CLG_TRY(st);
    return seq_value(im, im->nlayers - 1);
}

/* The attention pattern clgrad exports, from its first MatMul at node i:
 *  0 MatMul(x, Wqkv^T)  1 Add(b)  2 Reshape(0, 0, 3, H, d)  3 Transpose(2, 0, 3, 1, 4)
 *  4-6 Gather(axis 0, 0 / 1 / 2): q, k, v  7 Transpose(k, (0, 1, 3, 2))  8 MatMul(q, kT)
 *  9 Mul(scale)  [10 Add(mask (T, T): 0 on and below the diagonal, <= -1e4 above)]
 *  Softmax(-1)  MatMul(p, v)  Transpose(0, 2, 1, 3)  Reshape(0, 0, C)
 *  Transpose(Wout) MatMul  Add(bout).
 * Returns the index of the last node, -1 when no match; *causal, *heads. */
static int match_attention(const imp *im, const Onnx__GraphProto *g, size_t i, int *causal, int *heads)
{
    static const char *const head[10] = {"MatMul", "Add",    "Reshape", "Transpose", "Gather",
                                         "Gather", "Gather", "Transpose", "MatMul",  "Mul"};
    static const char *const tail[7] = {"Softmax", "MatMul", "Transpose", "Reshape", "Transpose", "MatMul", "Add"};
    static const int64_t p5[5] = {2, 0, 3, 1, 4}, pk[4] = {0, 1, 3, 2}, po[4] = {0, 2, 1, 3};
    if (!ops_at(g, i, head, 10))
        return -1;
    const Onnx__NodeProto *const *n = (const Onnx__NodeProto *const *)g->node + i;
    int xv = vget(im, n[0]->input[0]);
    const int64_t *s5 = i64_in(im, n[2], 1, 5);
    if (xv < 0 || im->vals[xv].rank != 3 || !s5 || s5[0] != 0 || s5[1] != 0 || s5[2] != 3 || s5[3] < 1 ||
        s5[3] > 65536 || s5[4] < 1 || s5[4] > (1 << 20) || s5[3] * s5[4] != im->vals[xv].h || !perm_is(n[3], p5, 5) ||
        !perm_is(n[7], pk, 4) || i + 10 >= g->n_node)
        return -1;
    for (int k = 0; k < 3; k++) {
        const int64_t *ix = i64_in(im, n[4 + k], 1, 1);
        if (!ix || ix[0] != k || node_int(n[4 + k], "axis", 0) != 0 || !reads(n[4 + k], 0, n[3]))
            return -1;
    }
    int T = im->vals[xv].c;
    *causal = is_op(n[10], "Add");
    if (*causal) {
        const cten *m = n[10]->n_input == 2 ? cget(im, n[10]->input[1]) : NULL;
        if (!m || !m->f || m->numel != (size_t)T * T)
            return -1;
        for (int r = 0; r < T; r++)
            for (int c = 0; c < T; c++)
                if (c > r ? !(m->f[r * T + c] <= -1e4f) : m->f[r * T + c] != 0.0f)
                    return -1;
    }
    size_t t0 = i + 10 + (size_t)*causal;
    if (!ops_at(g, t0, tail, 7) || !perm_is(g->node[t0 + 2], po, 4) ||
        !(node_int(g->node[t0], "axis", -1) == -1 || node_int(g->node[t0], "axis", -1) == 3))
        return -1;
    const Onnx__NodeProto *const *t = (const Onnx__NodeProto *const *)g->node + t0;
    const int64_t *s3 = i64_in(im, t[3], 1, 3);
    int wired = reads(n[1], 0, n[0]) && reads(n[2], 0, n[1]) && reads(n[3], 0, n[2]) && reads(n[7], 0, n[5]) &&
                reads(n[8], 0, n[4]) && reads(n[8], 1, n[7]) && reads(n[9], 0, n[8]) &&
                (!*causal || reads(n[10], 0, n[9])) && reads(t[0], 0, g->node[t0 - 1]) && reads(t[1], 0, t[0]) &&
                reads(t[1], 1, n[6]) && reads(t[2], 0, t[1]) && reads(t[3], 0, t[2]) && reads(t[5], 0, t[3]) &&
                reads(t[5], 1, t[4]) && reads(t[6], 0, t[5]) && s3 && s3[0] == 0 && s3[1] == 0 &&
                s3[2] == im->vals[xv].h;
    if (!wired)
        return -1;
    *heads = (int)s5[3];
    return (int)(t0 + 6);
}

/* A constant (K, M) input k of node n transposed into w (M x K, malloc'd). */
static clg_status const_t(imp *im, const Onnx__NodeProto *n, size_t k, int K, int M, float **w)
{
    const cten *c = k < n->n_input && n->input[k] ? cget(im, n->input[k]) : NULL;
    if (!c || !c->f || c->ndim != 2 || c->dims[0] != K || c->dims[1] != M)
        return unsupported(im, "attention: input %zu of '%s' must be a constant %dx%d", k, n->name ? n->name : "",
                           K, M);
    *w = malloc((size_t)K * M * sizeof(float));
    if (!*w)
        return oom(im);
    for (int r = 0; r < K; r++)
        for (int q = 0; q < M; q++)
            (*w)[(size_t)q * K + r] = c->f[(size_t)r * M + q];
    return CLG_OK;
}

static clg_status op_attention(imp *im, const Onnx__GraphProto *g, size_t *i, int end, int causal, int heads)
{
    const Onnx__NodeProto *const *n = (const Onnx__NodeProto *const *)g->node;
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    const value x = im->vals[xv];
    int C = x.h, d = C / heads;
    const cten *sc = cget(im, n[*i + 9]->n_input == 2 && n[*i + 9]->input[1] ? n[*i + 9]->input[1] : "");
    if (!sc || !sc->f || sc->numel != 1 || fabs(sc->f[0] * sqrt((double)d) - 1.0) > 1e-5)
        return unsupported(im, "attention: the scores' scale must be 1/sqrt(head width %d)", d);
    const cten *bq = cget(im, n[*i + 1]->n_input == 2 && n[*i + 1]->input[1] ? n[*i + 1]->input[1] : "");
    const cten *bo = cget(im, n[end]->n_input == 2 && n[end]->input[1] ? n[end]->input[1] : "");
    const cten *wo = cget(im, n[end - 2]->input[0]);
    if (!bq || !bq->f || bq->numel != (size_t)3 * C || !bo || !bo->f || bo->numel != (size_t)C || !wo || !wo->f ||
        wo->numel != (size_t)C * C)
        return unsupported(im, "attention: the biases (3C, C) and the output weight (C x C) must be constants");
    float *wq = NULL;
    CLG_TRY(const_t(im, n[*i], 1, C, 3 * C, &wq));
    int in = x.layer, s2[2] = {3 * C, C}, s3 = 3 * C, o2[2] = {C, C};
    ilayer *l = NULL;
    im->node = n[end];
    clg_status st = layer_new(im, "attention", n[end - 1]->name, &in, 1, &l); /* the output MatMul: the layer's name */
    if (st == CLG_OK) {
        kv(l, "heads", "%d", heads);
        kv(l, "causal", "%d", causal);
        l->c = x.c;
        l->h = C;
        l->w = 1;
        l->rank = 3;
        st = weight(im, l, "qkv_weight", 2, s2, wq);
    }
    free(wq);
    CLG_TRY(st);
    CLG_TRY(weight(im, l, "qkv_bias", 1, &s3, bq->f));
    CLG_TRY(weight(im, l, "out_weight", 2, o2, wo->f));
    CLG_TRY(weight(im, l, "out_bias", 1, &C, bo->f));
    *i = (size_t)end;
    return seq_value(im, im->nlayers - 1);
}

/* MatMul: the attention pattern, a per-position dense on a sequence, else a Gemm-like dense. */
static clg_status op_matmul(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    int xv = vget(im, im->node->n_input == 2 ? im->node->input[0] : NULL);
    if (xv < 0 || im->vals[xv].rank != 3)
        return op_gemm(im, 1);
    int causal = 0, heads = 0, end = match_attention(im, g, *i, &causal, &heads);
    if (end >= 0)
        return op_attention(im, g, i, end, causal, heads);
    clg_status st = CLG_OK;
    const cten *B = cin(im, 1, "weights", &st);
    CLG_TRY(st);
    return seq_dense(im, xv, B, im->node->input[1]);
}

/* GELU, tanh form, as clgrad exports it: Mul(x, x), Mul x, Mul 0.044715,
 * Add x, Mul sqrt(2/pi), Tanh, Add 1, Mul x, Mul 0.5. */
static clg_status op_mul(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    static const char *const ops[9] = {"Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"};
    const Onnx__NodeProto *const *n = (const Onnx__NodeProto *const *)g->node + *i;
    const char *x = n[0]->n_input == 2 ? n[0]->input[0] : NULL;
    int ok = x && in_is(n[0], 1, x) && ops_at(g, *i, ops, 9);
    ok = ok && reads(n[1], 0, n[0]) && in_is(n[1], 1, x) && reads(n[2], 0, n[1]) &&
         is_scalar(im, n[2]->n_input == 2 ? n[2]->input[1] : NULL, 0.044715, 1e-6) && in_is(n[3], 0, x) &&
         reads(n[3], 1, n[2]) && reads(n[4], 0, n[3]) &&
         is_scalar(im, n[4]->n_input == 2 ? n[4]->input[1] : NULL, 0.7978845608, 1e-6) && reads(n[5], 0, n[4]) &&
         reads(n[6], 0, n[5]) && is_scalar(im, n[6]->n_input == 2 ? n[6]->input[1] : NULL, 1.0, 0) &&
         in_is(n[7], 0, x) && reads(n[7], 1, n[6]) && reads(n[8], 0, n[7]) &&
         is_scalar(im, n[8]->n_input == 2 ? n[8]->input[1] : NULL, 0.5, 0);
    if (!ok)
        return unsupported(im, "Mul is supported only within a GELU (erf or tanh form, as clgrad exports it)");
    int xv = 0;
    CLG_TRY(vin(im, 0, &xv));
    value *v = &im->vals[xv];
    int saved = v->nuse; /* the pattern reads x 5 times: fusing into the producer is fine when nothing else does */
    if (v->nuse == 5)
        v->nuse = 1;
    im->node = n[8];
    clg_status st = act_layer(im, xv, "gelu_tanh", 0.01);
    im->vals[xv].nuse = saved;
    CLG_TRY(st);
    *i += 8;
    return CLG_OK;
}

static clg_status map_node(imp *im, const Onnx__GraphProto *g, size_t *i)
{
    const Onnx__NodeProto *n = g->node[*i];
    im->node = n;
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
        return unsupported(im, "operator domain '%s' is not supported (only the default ONNX domain)", n->domain);
    const char *op = n->op_type ? n->op_type : "";
    if (strcmp(op, "Conv") == 0)
        return op_conv(im);
    if (strcmp(op, "Gemm") == 0)
        return op_gemm(im, 0);
    if (strcmp(op, "MatMul") == 0)
        return op_matmul(im, g, i);
    if (strcmp(op, "Mul") == 0)
        return op_mul(im, g, i);
    if (strcmp(op, "Slice") == 0)
        return op_slice(im, g, i);
    if (strcmp(op, "LayerNormalization") == 0)
        return op_layernorm(im);
    if (strcmp(op, "Add") == 0)
        return op_add(im);
    if (strcmp(op, "Relu") == 0 || strcmp(op, "Sigmoid") == 0 || strcmp(op, "Tanh") == 0 ||
        strcmp(op, "LeakyRelu") == 0 || strcmp(op, "Gelu") == 0)
        return op_activation(im, op);
    if (strcmp(op, "Div") == 0)
        return op_div(im, g, i);
    if (strcmp(op, "Sub") == 0)
        return op_norm(im, 0);
    if (strcmp(op, "MaxPool") == 0)
        return op_pool(im, 1);
    if (strcmp(op, "AveragePool") == 0)
        return op_pool(im, 0);
    if (strcmp(op, "GlobalAveragePool") == 0)
        return op_gap(im);
    if (strcmp(op, "BatchNormalization") == 0)
        return op_batchnorm(im);
    if (strcmp(op, "Dropout") == 0)
        return op_dropout(im);
    if (strcmp(op, "Flatten") == 0)
        return op_flatten(im);
    if (strcmp(op, "Reshape") == 0)
        return match_embedding(im, g, *i) >= 0 ? op_embedding(im, g, i) : op_reshape(im);
    if (strcmp(op, "Identity") == 0)
        return op_identity(im);
    if (strcmp(op, "Concat") == 0)
        return op_concat(im);
    if (strcmp(op, "Pad") == 0)
        return op_pad(im);
    if (strcmp(op, "Transpose") == 0)
        return op_transpose(im);
    if (strcmp(op, "Softmax") == 0)
        return op_softmax(im);
    return unsupported(im, "unsupported operator (supported: %s)", supported_ops);
}

/* ---- graph ---- */

static clg_status graph_input(imp *im, const Onnx__GraphProto *g)
{
    const Onnx__ValueInfoProto *in = NULL;
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *v = g->input[i];
        if (!v->name || cget(im, v->name))
            continue; /* an initializer listed as input */
        if (in)
            return unsupported(im, "the graph has several inputs ('%s', '%s'); clgrad models take one image tensor",
                               in->name, v->name);
        in = v;
    }
    if (!in)
        return fail(im, "the graph has no input");
    const Onnx__TypeProto *tp = in->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return unsupported(im, "input '%s' is not a tensor", in->name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type && tt->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        return unsupported(im, "input '%s' has element type %d (float32 only)", in->name, tt->elem_type);
    if (!tt->shape || tt->shape->n_dim != 4)
        return unsupported(im, "input '%s' must be 4-D (batch, channels, height, width) with known sizes", in->name);
    int d[3];
    for (int k = 1; k < 4; k++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[k];
        if (dm->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE || dm->dim_value < 1 ||
            dm->dim_value > 65536)
            return unsupported(im, "input '%s': dimension %d must be a fixed size in [1, 65536]", in->name, k);
        d[k - 1] = (int)dm->dim_value;
    }
    im->in_c = d[0];
    im->in_h = d[1];
    im->in_w = d[2];
    for (int c = 0; c < CLG_DS_MAX_CHANNELS; c++) {
        im->mean[c] = 0;
        im->std[c] = 1;
    }
    return vdef(im, in->name, -1, d[0], d[1], d[2], 0, 4);
}

static clg_status emit(imp *im, char **text)
{
    clg_sbuf b = {0};
    const ilayer *ll = &im->layers[im->nlayers - 1];
    int classes = ll->rank == 3 ? ll->h : ll->c;
    clg_sbuf_printf(&b, "# imported from ONNX (opset %d)\n[net]\nchannels = %d\nheight = %d\nwidth = %d\nclasses = %d\n%s\n",
                    im->opset, im->in_c, im->in_h, im->in_w, classes, im->tokens ? "input = tokens\n" : "");
    for (int i = 0; i < im->nlayers; i++) {
        const ilayer *l = &im->layers[i];
        clg_sbuf_printf(&b, "[%s]\nname = %s\n", l->type, l->name);
        int implicit = l->nin == 1 && l->in[0] == i - 1;
        if (!implicit) {
            clg_sbuf_printf(&b, "input = ");
            for (int k = 0; k < l->nin; k++)
                clg_sbuf_printf(&b, "%s%s", k ? ", " : "", l->in[k] < 0 ? "data" : im->layers[l->in[k]].name);
            clg_sbuf_printf(&b, "\n");
        }
        for (int k = 0; k < l->nkv; k++)
            clg_sbuf_printf(&b, "%s = %s\n", l->key[k], l->val[k]);
        if (l->fusable && !l->bias)
            clg_sbuf_printf(&b, "bias = 0\n");
        clg_sbuf_printf(&b, "\n");
    }
    if (b.oom) {
        clg_sbuf_free(&b);
        return oom(im);
    }
    *text = b.data;
    return CLG_OK;
}

static clg_status import_model(imp *im, const Onnx__ModelProto *mp, char **text)
{
    im->opset = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if ((!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0) && o->has_version)
            im->opset = (int)CLG_MIN(o->version, 1000000);
    }
    if (im->opset < CLG_ONNX_OPSET_MIN || im->opset > CLG_ONNX_OPSET_MAX)
        return unsupported(im, "opset %d (supported: %d to %d)", im->opset, CLG_ONNX_OPSET_MIN, CLG_ONNX_OPSET_MAX);
    const Onnx__GraphProto *g = mp->graph;
    if (!g)
        return fail(im, "the model has no graph");
    if (g->n_node > CLG_ONNX_MAX_NODES || g->n_initializer > CLG_ONNX_MAX_NODES)
        return unsupported(im, "%zu nodes / %zu initializers (at most %d each)", g->n_node, g->n_initializer,
                           CLG_ONNX_MAX_NODES);
    if (g->n_sparse_initializer)
        return unsupported(im, "sparse initializers");
    for (size_t i = 0; i < g->n_initializer; i++) {
        cten t;
        CLG_TRY(tensor_read(im, g->initializer[i], &t));
        CLG_TRY(const_add(im, g->initializer[i]->name, &t));
    }
    if (g->n_output != 1 || !g->output[0]->name)
        return unsupported(im, "the graph has %zu outputs (clgrad models have one: the class scores)", g->n_output);
    /* consumers of every value (node inputs + the graph output), for fusing
     * an activation into its producer and the normalization check */
    for (size_t i = 0; i <= g->n_node; i++) {
        size_t nin = i < g->n_node ? g->node[i]->n_input : 1;
        for (size_t k = 0; k < nin; k++) {
            const char *name = i < g->n_node ? g->node[i]->input[k] : g->output[0]->name;
            if (!name || !name[0])
                continue;
            int j = smap_get(&im->uses, name);
            if (j < 0) {
                if (im->nuses == im->capuses) {
                    int nc = im->capuses ? im->capuses * 2 : 64;
                    int *n = realloc(im->usecnt, sizeof *n * (size_t)nc);
                    if (!n)
                        return oom(im);
                    im->usecnt = n;
                    im->capuses = nc;
                }
                j = im->nuses++;
                im->usecnt[j] = 0;
                if (!smap_put(&im->uses, name, j))
                    return oom(im);
            }
            im->usecnt[j]++;
        }
    }
    CLG_TRY(graph_input(im, g));
    clg_status st = CLG_OK;
    /* Constant nodes first: they read nothing, and patterns (GELU) look ahead at them */
    for (size_t i = 0; i < g->n_node && st == CLG_OK; i++)
        if (is_op(g->node[i], "Constant")) {
            im->node = g->node[i];
            st = op_constant(im);
        }
    for (size_t i = 0; i < g->n_node && st == CLG_OK; i++)
        if (!is_op(g->node[i], "Constant"))
            st = map_node(im, g, &i);
    im->node = NULL;
    CLG_TRY(st);
    if (im->nlayers == 0)
        return unsupported(im, "the graph has no layers clgrad can run");
    int ov = vget(im, g->output[0]->name);
    if (ov < 0 || im->vals[ov].layer != im->nlayers - 1)
        return unsupported(im, "the graph output '%s' must be the result of the last node", g->output[0]->name);
    ilayer *last = &im->layers[im->nlayers - 1];
    if (strcmp(last->type, "softmax") != 0 && last->rank == 3) { /* token scores: the token loss */
        int in = im->nlayers - 1;
        ilayer *l = NULL;
        CLG_TRY(layer_new(im, "softmax", "softmax", &in, 1, &l));
        l->c = im->layers[in].c;
        l->h = im->layers[in].h;
        l->w = 1;
        l->rank = 3;
    } else if (strcmp(last->type, "softmax") != 0) {
        if (last->h != 1 || last->w != 1)
            return unsupported(im, "the graph output is %dx%dx%d per sample; clgrad needs class scores", last->c,
                               last->h, last->w);
        int in = im->nlayers - 1;
        ilayer *l = NULL;
        CLG_TRY(layer_new(im, "softmax", "softmax", &in, 1, &l));
        l->c = im->layers[in].c;
        l->h = l->w = 1;
    }
    return emit(im, text);
}

clg_status clg_onnx_import(clg_err *err, const void *data, size_t len, const char *source, char **text,
                           clg_ckpt **weights)
{
    *text = NULL;
    *weights = NULL;
    const char *src = source ? source : "<onnx>";
    if (!data)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: no data", src);
    if (len > CLG_ONNX_MAX_BYTES)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: %zu bytes (ONNX files of at most %zu bytes are read)", src,
                           len, CLG_ONNX_MAX_BYTES);
    CLG_TRY(walk_check(err, src, data, len));
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, data);
    if (!mp)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s: not a valid ONNX model (protobuf decoding failed)", src);
    imp im;
    memset(&im, 0, sizeof im);
    im.err = err;
    im.src = src;
    clg_status st = clg_ckpt_create(err, &im.ck);
    if (st == CLG_OK)
        st = import_model(&im, mp, text);
    if (st == CLG_OK && im.has_norm) {
        st = clg_ckpt_set_meta_i64(err, im.ck, "norm.channels", im.in_c);
        char key[64];
        for (int c = 0; c < im.in_c && st == CLG_OK; c++) {
            snprintf(key, sizeof key, "norm.mean.%d", c);
            st = clg_ckpt_set_meta_f64(err, im.ck, key, im.mean[c]);
            snprintf(key, sizeof key, "norm.std.%d", c);
            if (st == CLG_OK)
                st = clg_ckpt_set_meta_f64(err, im.ck, key, im.std[c]);
        }
    }
    for (int i = 0; i < im.nconsts; i++)
        cten_free(&im.consts[i]);
    free(im.consts);
    smap_free(&im.cmap);
    free(im.vals);
    smap_free(&im.vmap);
    free(im.layers);
    smap_free(&im.lnames);
    for (int i = 0; i < im.nlname; i++)
        free(im.lname_store[i]);
    free(im.lname_store);
    smap_free(&im.uses);
    free(im.usecnt);
    onnx__model_proto__free_unpacked(mp, NULL);
    if (st != CLG_OK) {
        free(*text);
        *text = NULL;
        clg_ckpt_free(im.ck);
        return st;
    }
    *weights = im.ck;
    return CLG_OK;
}
