/* Parameter storage of a replica: the parameter arena (every trainable
 * value and gradient a sub-buffer of one buffer each, so an update or a
 * reduction bucket is one launch or one copy) and, for fp16 storage, the
 * fp32 master copies, the half copies and the layers' fp32 views of them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/network_impl.h"
#include "ops/convert.h"

// ---- fp16 master, half and view copies ----

clg_status clg_replica_setup_fp16(clg_replica *r)
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
        CLG_TRY(clg_cvt_round_weights(dev, r->parena, r->harena, r->varena, r->arena_bytes / sizeof(float)));
    } else if (r->fp16 && r->master) {
        for (int i = 0; i < r->nlayers; i++)
            for (int p = 0; p < r->layers[i].nparams; p++) {
                int idx = i * CLG_MAX_PARAMS + p;
                clg_param *pr = &r->layers[i].params[p];
                if (!r->master[idx] || !r->w16[idx])
                    continue;
                if (pr->numel > INT32_MAX)
                    return clg_err_set(err, CLG_ERR_UNSUPPORTED, "parameter %s.%s is too large", r->layers[i].name,
                                       pr->name);
                CLG_TRY(clg_cvt_round_weights(dev, r->master[idx], r->w16[idx], pr->value, pr->numel));
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

void clg_replica_arena_free(clg_replica *r)
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
    clg_mem_uncharge(r->dev, r->arena_charged);
    r->arena_charged = 0;
    r->parena = r->garena = r->varena = r->harena = NULL;
    r->psub = r->gsub = r->vsub = NULL;
    r->arena_off = NULL;
    r->arena_bytes = 0;
    r->narena = 0;
}

/* Byte offset of every trainable parameter in the arena (lay[i], refs
 * order): off[] as given, checked against *bytes, or the default layout
 * (*bytes receives its size). */
static clg_status arena_layout(clg_replica *r, const clg_param_ref *refs, int n, const size_t *off, size_t *bytes,
                               size_t *lay)
{
    clg_err *err = clg_dev_err(r->dev);
    if (off) {
        for (int i = 0; i < n; i++) {
            lay[i] = off[i];
            if (off[i] % sizeof(float) || off[i] > *bytes ||
                refs[i].param->numel * sizeof(float) > *bytes - off[i])
                return clg_err_set(err, CLG_ERR_INTERNAL, "parameter arena: %s.%s does not fit its place",
                                   refs[i].layer->name, refs[i].param->name);
        }
    } else { /* the data-parallel layout's rule (src/parallel/dp.c make_layout) */
        cl_uint bits = 0;
        size_t align = 128;
        if (clGetDeviceInfo(r->dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) == CL_SUCCESS &&
            bits / 8 > align)
            align = bits / 8;
        *bytes = 0;
        for (int i = n - 1; i >= 0; i--) {
            lay[i] = *bytes;
            *bytes += (refs[i].param->numel * sizeof(float) + align - 1) / align * align;
        }
    }
    if (*bytes % sizeof(float))
        return clg_err_set(err, CLG_ERR_INTERNAL, "parameter arena of %zu bytes: not whole floats", *bytes);
    return CLG_OK;
}

/* New arenas being built: buffers (AR_*), a sub-buffer per trainable
 * parameter in each, and in fp16 mode the half copies. */
typedef struct arena_new {
    cl_mem buf[3], *sub[3], half;
} arena_new;

/* Creates the na arenas of `bytes` (zero-filled) with their sub-buffers at
 * lay[], and the half arena when na == 3, and writes the current values
 * into the value arena. Finishes the queue. */
static clg_status arena_build(clg_replica *r, const clg_param_ref *refs, int n, int na, const size_t *lay,
                              size_t bytes, arena_new *an)
{
    clg_device *dev = r->dev;
    clg_err *err = clg_dev_err(dev);
    clg_status st = CLG_OK;
    cl_int e = CL_SUCCESS;
    for (int a = 0; a < na && st == CLG_OK; a++) {
        an->buf[a] = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "clCreateBuffer (parameter arena)", __FILE__, __LINE__);
        else /* padding stays zero: the optimizer and the reduction run over it */
            st = clg_buf_fill(dev, an->buf[a], 0, bytes / sizeof(float), 0.0f);
    }
    if (st == CLG_OK && na == 3) { /* the half copies (written by round_weights only) */
        an->half = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, bytes / 2, NULL, &e);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "clCreateBuffer (half weights arena)", __FILE__, __LINE__);
    }
    float *img = st == CLG_OK ? calloc(bytes / sizeof(float), sizeof(float)) : NULL;
    if (st == CLG_OK && !img)
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena image, %zu bytes)", bytes);
    for (int i = 0; i < n && st == CLG_OK; i++) {
        size_t nb = refs[i].param->numel * sizeof(float);
        if (nb == 0)
            continue;
        cl_buffer_region reg = {lay[i], nb};
        for (int a = 0; a < na && st == CLG_OK; a++) {
            an->sub[a][i] = clCreateSubBuffer(an->buf[a], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
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
     * masters (clg_replica_weights_updated) */
    if (st == CLG_OK &&
        (e = clEnqueueWriteBuffer(dev->queue, an->buf[AR_P], CL_TRUE, 0, bytes, img, 0, NULL, NULL)) != CL_SUCCESS)
        st = clg_cl_fail(err, e, "clEnqueueWriteBuffer (parameter arena)", __FILE__, __LINE__);
    free(img);
    /* the old buffers go back to the pool (clg_replica_arena), where another
     * queue (a lane's transfer queue) may take them: nothing may still use them */
    if (st == CLG_OK && (e = clFinish(dev->queue)) != CL_SUCCESS)
        st = clg_cl_fail(err, e, "clFinish (parameter arena)", __FILE__, __LINE__);
    return st;
}

/* Releases arenas that were not installed (and the sub-buffer lists). */
static void arena_discard(arena_new *an, int na, int n)
{
    for (int a = 0; a < na; a++) {
        release_subs(an->sub[a], n);
        free(an->sub[a]);
        if (an->buf[a])
            clReleaseMemObject(an->buf[a]);
    }
    if (an->half)
        clReleaseMemObject(an->half);
}

/* Points every parameter's value / gradient / view slot at its sub-buffer of
 * the new arenas, giving the old buffers back, and takes over the arenas
 * and the layout lay (owned from here). */
static void arena_install(clg_replica *r, const clg_param_ref *refs, int n, int na, arena_new *an, size_t *lay,
                          size_t bytes)
{
    clg_device *dev = r->dev;
    int had = r->narena > 0;
    for (int i = 0; i < n; i++) {
        if (!an->sub[AR_P][i])
            continue;
        for (int a = 0; a < na; a++) {
            cl_mem *slot = arena_slot(r, &refs[i], a);
            if (!had)
                pool_return(dev, *slot);
            *slot = an->sub[a][i];
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
        clg_replica_arena_free(r);
    }
    r->parena = an->buf[AR_P];
    r->garena = an->buf[AR_G];
    r->varena = an->buf[AR_V];
    r->harena = an->half;
    r->psub = an->sub[AR_P];
    r->gsub = an->sub[AR_G];
    r->vsub = an->sub[AR_V];
    r->arena_off = lay;
    r->arena_bytes = bytes;
    r->narena = n;
}

clg_status clg_replica_arena(clg_replica *r, const size_t *off, size_t bytes)
{
    clg_err *err = clg_dev_err(r->dev);
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(r, 1, &refs, &n));
    int na = r->fp16 && r->master ? 3 : 2;
    size_t cnt = (size_t)CLG_MAX(n, 1);
    size_t *lay = calloc(cnt, sizeof *lay);
    arena_new an = {{NULL, NULL, NULL}, {NULL, NULL, NULL}, NULL};
    clg_status st = lay ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena)");
    for (int a = 0; a < na && st == CLG_OK; a++)
        if (!(an.sub[a] = calloc(cnt, sizeof(cl_mem))))
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory (parameter arena)");
    if (st == CLG_OK)
        st = arena_layout(r, refs, n, off, &bytes, lay);
    int same = st == CLG_OK && r->parena && r->narena == n && r->arena_bytes == bytes &&
               memcmp(lay, r->arena_off, n * sizeof *lay) == 0;
    if (st == CLG_OK && bytes > 0 && !same)
        st = arena_build(r, refs, n, na, lay, bytes, &an);
    if (st != CLG_OK || bytes == 0 || same) { /* the old buffers stay in place */
        arena_discard(&an, na, n);
        free(refs);
        free(lay);
        return st;
    }
    arena_install(r, refs, n, na, &an, lay, bytes);
    free(refs);
    /* counted once in place (the per-parameter buffers they replace are back in the pool) */
    size_t charge = (size_t)na * bytes + (na == 3 ? bytes / 2 : 0);
    CLG_TRY(clg_mem_charge(r->dev, charge, "parameter arenas"));
    r->arena_charged = charge;
    return clg_replica_weights_updated(r); /* fp16: views and half copies; tells the layers */
}
