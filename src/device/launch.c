/* Kernel launches within the device's limits: work-group size per kernel
 * and per dimension, reqd_work_group_size, local memory; clg_enqueue, the
 * one enqueue every launcher goes through (a wait list in, an event out),
 * and the clg_deps scope of an operation of several launches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

// ---- limits ----

static const clg_kernel_entry *entry_of(const clg_device *dev, cl_kernel k)
{
    for (int i = 0; i < dev->nprogs; i++)
        for (int j = 0; j < dev->progs[i].nkernels; j++)
            if (dev->progs[i].kernels[j].kernel == k)
                return &dev->progs[i].kernels[j];
    return NULL;
}

/* CLG_LAUNCH_PAD on this device: CPU devices, unless option wg_canon = 0
 * (=1 turns it on for every device). Decided once per device. */
static int canon_on(clg_device *dev)
{
    if (!dev->wg_canon) {
        long mode = dev->ctx->opts.wg_canon; /* auto,0,1 */
        int on = mode ? mode == 2 : (dev->info.type & CLG_DEVICE_CPU) != 0;
        dev->wg_canon = on ? 2 : 1;
    }
    return dev->wg_canon == 2;
}

clg_status clg_kernel_limits(clg_device *dev, cl_kernel k, clg_wg_limits *L)
{
    memset(L, 0, sizeof *L);
    size_t devmax = dev->info.max_work_group_size ? dev->info.max_work_group_size : 1;
    size_t kmax = 0, mult = 0, reqd[3] = {0, 0, 0};
    const clg_kernel_entry *e = entry_of(dev, k);
    if (e) {
        kmax = e->wg_max;
        mult = e->wg_multiple;
        memcpy(reqd, e->wg_reqd, sizeof reqd);
    } else { /* a kernel not from clg_kernel_get: ask the runtime */
        if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kmax, &kmax, NULL) != CL_SUCCESS)
            kmax = 0;
        if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof mult, &mult,
                                     NULL) != CL_SUCCESS)
            mult = 0;
        if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof reqd, reqd, NULL) !=
            CL_SUCCESS)
            memset(reqd, 0, sizeof reqd);
    }
    L->max_total = kmax ? CLG_MIN(kmax, devmax) : devmax;
    for (int d = 0; d < 3; d++) {
        size_t m = dev->max_item[d] ? dev->max_item[d] : L->max_total;
        L->max_item[d] = CLG_MIN(m, L->max_total);
        L->reqd[d] = reqd[d];
    }
    L->multiple = mult ? mult : 1;
    L->local_mem = dev->info.local_mem_bytes;
    L->canon = canon_on(dev);
    return CLG_OK;
}

clg_status clg_kernel_wg_limit(clg_device *dev, cl_kernel k, size_t *max)
{
    clg_wg_limits L;
    CLG_TRY(clg_kernel_limits(dev, k, &L));
    *max = L.max_total;
    return CLG_OK;
}

size_t clg_device_wg_pow2(const clg_device *dev, size_t want)
{
    size_t lim = dev->info.max_work_group_size ? CLG_MIN(want, dev->info.max_work_group_size) : want;
    size_t p = 1;
    while (p * 2 <= lim)
        p *= 2;
    return p;
}

clg_status clg_kernel_get_wg(clg_device *dev, const char *prog, const char *name, const char *macro, size_t want,
                             cl_kernel *k, size_t *wg)
{
    char opts[80] = "";
    *wg = clg_device_wg_pow2(dev, want);
    if (*wg != want)
        snprintf(opts, sizeof opts, "-D %s=%zu", macro, *wg);
    return clg_kernel_get(dev, prog, opts, name, k);
}

static size_t smallest_factor(size_t v)
{
    for (size_t f = 2; f * f <= v; f++)
        if (v % f == 0)
            return f;
    return v;
}

void clg_wg_fit(const clg_wg_limits *L, cl_uint dims, size_t *lws)
{
    for (cl_uint d = 0; d < dims; d++)
        while (lws[d] > L->max_item[d] && lws[d] > 1)
            lws[d] /= smallest_factor(lws[d]);
    for (;;) {
        size_t total = 1;
        cl_uint big = 0;
        for (cl_uint d = 0; d < dims; d++) {
            total *= lws[d];
            if (lws[d] > lws[big])
                big = d;
        }
        if (total <= L->max_total || lws[big] <= 1)
            return;
        lws[big] /= smallest_factor(lws[big]);
    }
}

void clg_wg_geom(const clg_wg_limits *L, cl_uint dims, const size_t *n, size_t want0, size_t want_total, size_t *gws,
                 size_t *lws)
{
    size_t cap0 = CLG_MIN(want0, L->max_item[0]);
    size_t l0 = 1;
    while (l0 < n[0] && l0 * 2 <= cap0)
        l0 *= 2;
    /* a partly empty group beats a group below the SIMD width */
    while (l0 < L->multiple && l0 * 2 <= cap0 && l0 * 2 <= L->max_total)
        l0 *= 2;
    lws[0] = l0;
    for (cl_uint d = 1; d < dims; d++)
        lws[d] = 1;
    if (dims > 1) {
        size_t l1 = 1;
        while ((l1 < n[1] || (L->canon && n[1] >= 16)) && l0 * l1 * 2 <= want_total)
            l1 *= 2;
        lws[1] = l1;
    }
    clg_wg_fit(L, dims, lws);
    for (cl_uint d = 0; d < dims; d++)
        gws[d] = (n[d] + lws[d] - 1) / lws[d] * lws[d];
}

// ---- launch ----

static void kernel_name(cl_kernel k, char *buf, size_t len)
{
    buf[0] = 0;
    if (clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, len, buf, NULL) != CL_SUCCESS)
        snprintf(buf, len, "?");
    buf[len - 1] = 0;
}

static void limits_str(clg_device *dev, cl_kernel k, const clg_wg_limits *L, char *buf, size_t len)
{
    cl_ulong klocal = 0;
    if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_LOCAL_MEM_SIZE, sizeof klocal, &klocal, NULL) != CL_SUCCESS)
        klocal = 0;
    snprintf(buf, len,
             "limits of %s: %zu work-items per group for this kernel (device %zu), per dimension %zux%zux%zu, "
             "local memory %llu bytes (kernel uses %llu)",
             dev->info.name, L->max_total, dev->info.max_work_group_size, L->max_item[0], L->max_item[1],
             L->max_item[2], (unsigned long long)L->local_mem, (unsigned long long)klocal);
}

static int fits(const clg_wg_limits *L, cl_uint dims, const size_t *lws)
{
    size_t total = 1;
    for (cl_uint d = 0; d < dims; d++) {
        if (lws[d] == 0 || lws[d] > L->max_item[d])
            return 0;
        total *= lws[d];
    }
    if (L->reqd[0])
        for (cl_uint d = 0; d < 3; d++)
            if ((d < dims ? lws[d] : 1) != L->reqd[d])
                return 0;
    return total <= L->max_total;
}

/* Checks and fits the local size (into l) and pads the range for
 * CLG_LAUNCH_PAD (into padded); *gws_io then points at the range to enqueue
 * and *use_lws says whether l is passed to the runtime. */
static clg_status launch_geometry(clg_device *dev, cl_kernel k, const clg_wg_limits *L, cl_uint dims,
                                  const size_t **gws_io, const size_t *lws, unsigned flags, size_t *l, size_t *padded,
                                  int *use_lws)
{
    clg_err *err = clg_dev_err(dev);
    const size_t *gws = *gws_io;
    if (!lws && (flags & CLG_LAUNCH_PAD) && !L->reqd[0] && canon_on(dev)) {
        /* one local size for every range; dims 0 and 1 rounded up (the kernel bound-checks them) */
        /* two sizes at most: long rows (>= 256 along dim 0) get 4x wider groups,
         * so that a range like 6272 x 9 is not cut into thousands of groups */
        l[0] = dims == 1 ? 64 : gws[0] >= 256 ? 4 * CLG_WG_CANON_X : CLG_WG_CANON_X;
        if (dims > 1)
            l[1] = CLG_WG_CANON_Y;
        clg_wg_fit(L, dims, l);
        for (cl_uint d = 0; d < dims; d++)
            padded[d] = d < 2 ? (gws[d] + l[d] - 1) / l[d] * l[d] : gws[d];
        *gws_io = gws = padded;
        lws = l;
        flags |= CLG_LAUNCH_FIT;
    }
    *use_lws = lws != NULL;
    if (!lws)
        return CLG_OK;
    if (lws != l)
        memcpy(l, lws, dims * sizeof *l);
    if (!fits(L, dims, l) && (flags & CLG_LAUNCH_FIT) && !L->reqd[0])
        clg_wg_fit(L, dims, l);
    if (!fits(L, dims, l)) {
        char name[128], lim[400];
        kernel_name(k, name, sizeof name);
        limits_str(dev, k, L, lim, sizeof lim);
        if (L->reqd[0])
            return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                               "kernel %s: work-group %zux%zux%zu differs from its reqd_work_group_size "
                               "%zux%zux%zu (%s)",
                               name, l[0], dims > 1 ? l[1] : 1, dims > 2 ? l[2] : 1, L->reqd[0], L->reqd[1],
                               L->reqd[2], lim);
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "kernel %s: work-group %zux%zux%zu does not fit (%s)", name, l[0],
                           dims > 1 ? l[1] : 1, dims > 2 ? l[2] : 1, lim);
    }
    for (cl_uint d = 0; d < dims; d++)
        if (gws[d] % l[d])
            return clg_err_set(err, CLG_ERR_INTERNAL,
                               "clg_launch: global size %zu is not a multiple of the local size %zu (dim %u)", gws[d],
                               l[d], d);
    return CLG_OK;
}

/* Keeps ev (retained here) for CLGRAD_PROFILE's kernel times. */
static void kprof_keep(clg_device *dev, cl_event ev)
{
    if (clRetainEvent(ev) != CL_SUCCESS)
        return;
    if (dev->nkev == dev->capkev) {
        int nc = dev->capkev ? 2 * dev->capkev : 256;
        cl_event *ne = realloc(dev->kev, (size_t)nc * sizeof *ne);
        if (ne) {
            dev->kev = ne;
            dev->capkev = nc;
        }
    }
    if (dev->nkev < dev->capkev)
        dev->kev[dev->nkev++] = ev;
    else
        clReleaseEvent(ev);
}

/* Keeps ev (retained here) as the newest launch of dev's clg_deps scope. */
static void deps_keep(clg_deps *d, cl_event ev)
{
    if (d->last)
        clReleaseEvent(d->last);
    d->last = clRetainEvent(ev) == CL_SUCCESS ? ev : NULL;
}

/* Nothing to launch: a wait list still has to hold back what follows. */
static clg_status enqueue_empty(clg_device *dev, cl_uint num_wait, const cl_event *wait, cl_event *ev)
{
    if (num_wait == 0)
        return CLG_OK;
    cl_event m = NULL;
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueBarrierWithWaitList(dev->queue, num_wait, wait, &m));
    if (dev->deps)
        deps_keep(dev->deps, m);
    if (ev)
        *ev = m;
    else
        clReleaseEvent(m);
    return CLG_OK;
}

clg_status clg_enqueue(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws, const size_t *lws,
                       unsigned flags, cl_uint num_wait, const cl_event *wait, cl_event *ev)
{
    clg_err *err = clg_dev_err(dev);
    if (ev)
        *ev = NULL;
    if (dims < 1 || dims > 3)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "clg_launch: %u dimensions", dims);
    if ((num_wait > 0) != (wait != NULL))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "clg_enqueue: %u events to wait for but the list is %s",
                           num_wait, wait ? "not NULL" : "NULL");
    clg_deps *deps = dev->deps;
    if (deps && deps->num_wait) { /* the scope's list goes to its first command */
        if (num_wait)
            CLG_TRY(clg_deps_foreign(dev));
        else {
            num_wait = deps->num_wait;
            wait = deps->wait;
            deps->num_wait = 0;
            deps->wait = NULL;
        }
    }
    for (cl_uint d = 0; d < dims; d++)
        if (gws[d] == 0)
            return enqueue_empty(dev, num_wait, wait, ev);
    clg_wg_limits L;
    CLG_TRY(clg_kernel_limits(dev, k, &L));
    size_t l[3] = {1, 1, 1}, padded[3];
    int use_lws = 0;
    CLG_TRY(launch_geometry(dev, k, &L, dims, &gws, lws, flags, l, padded, &use_lws));
    cl_event e = NULL;
    cl_int rc = clEnqueueNDRangeKernel(dev->queue, k, dims, NULL, gws, use_lws ? l : NULL, num_wait, wait,
                                       ev || dev->kprof || deps ? &e : NULL);
    if (rc != CL_SUCCESS) {
        char name[128], lim[400], what[700];
        kernel_name(k, name, sizeof name);
        limits_str(dev, k, &L, lim, sizeof lim);
        snprintf(what, sizeof what, "clEnqueueNDRangeKernel(%s, local %zux%zux%zu; %s)", name, l[0], l[1], l[2],
                 lim);
        return clg_cl_fail(err, rc, what, __FILE__, __LINE__);
    }
    dev->launches++;
    if (e && dev->kprof)
        kprof_keep(dev, e);
    if (e && deps)
        deps_keep(deps, e);
    if (ev)
        *ev = e;
    else if (e)
        clReleaseEvent(e);
    return CLG_OK;
}

// ---- dependencies of an operation (clg_deps) ----

void clg_deps_begin(clg_device *dev, clg_deps *d, cl_uint num_wait, const cl_event *wait)
{
    d->num_wait = num_wait;
    d->wait = num_wait ? wait : NULL;
    d->last = NULL;
    dev->deps = d;
}

clg_status clg_deps_foreign(clg_device *dev)
{
    clg_deps *d = dev->deps;
    if (!d)
        return CLG_OK;
    if (d->last) { /* a launch after the foreign command gives the scope's event again */
        clReleaseEvent(d->last);
        d->last = NULL;
    }
    if (d->num_wait == 0)
        return CLG_OK;
    cl_uint n = d->num_wait;
    d->num_wait = 0;
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueBarrierWithWaitList(dev->queue, n, d->wait, NULL));
    return CLG_OK;
}

clg_status clg_deps_end(clg_device *dev, clg_deps *d, clg_status st, cl_event *event)
{
    dev->deps = NULL;
    cl_event last = d->last;
    d->last = NULL;
    if (st == CLG_OK && (d->num_wait || (event && !last))) {
        /* no command took the list, or the newest command was not a launch */
        cl_event m = NULL;
        cl_int rc = d->num_wait ? clEnqueueBarrierWithWaitList(dev->queue, d->num_wait, d->wait, event ? &m : NULL)
                                : clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &m);
        d->num_wait = 0;
        if (rc != CL_SUCCESS) {
            if (last)
                clReleaseEvent(last);
            return clg_cl_fail(clg_dev_err(dev), rc, "clEnqueue{Barrier,Marker}WithWaitList", __FILE__, __LINE__);
        }
        if (m) {
            if (last)
                clReleaseEvent(last);
            last = m;
        }
    }
    if (st == CLG_OK && event)
        *event = last;
    else if (last)
        clReleaseEvent(last);
    return st;
}

void clg_kprof_take(clg_device *dev, double *ms, int *count)
{
    double t = 0;
    for (int i = 0; i < dev->nkev; i++) {
        cl_ulong a = 0, b = 0;
        if (clGetEventProfilingInfo(dev->kev[i], CL_PROFILING_COMMAND_START, sizeof a, &a, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(dev->kev[i], CL_PROFILING_COMMAND_END, sizeof b, &b, NULL) == CL_SUCCESS && b > a)
            t += (double)(b - a) * 1e-6;
        clReleaseEvent(dev->kev[i]);
    }
    if (ms)
        *ms = t;
    if (count)
        *count = dev->nkev;
    dev->nkev = 0;
}

// ---- identity ----

clg_vendor clg_device_vendor(const clg_device *dev)
{
    const char *v = dev->info.vendor;
    if (clg_str_icontains(v, "nvidia"))
        return CLG_VENDOR_NVIDIA;
    if (clg_str_icontains(v, "advanced micro") || clg_str_icontains(v, "amd"))
        return CLG_VENDOR_AMD;
    if (clg_str_icontains(v, "intel"))
        return CLG_VENDOR_INTEL;
    return CLG_VENDOR_OTHER;
}

void clg_device_fingerprint(const clg_device *dev, char *buf, size_t len)
{
    snprintf(buf, len, "%s|%s|%s|%s|type%d|lmem%llu|wg%zu|cu%u|fp16:%d", dev->info.name, dev->info.vendor,
             dev->info.platform, dev->info.driver_version, (int)dev->info.type,
             (unsigned long long)dev->info.local_mem_bytes, dev->info.max_work_group_size, dev->info.compute_units,
             dev->info.has_fp16);
}

// ---- fill ----

clg_status clg_buf_fill(clg_device *dev, cl_mem buf, size_t off, size_t n, float v)
{
    if (n == 0)
        return CLG_OK;
    if (n > 0xffffffffu || off > 0xffffffffu - n)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "fill: %zu floats at %zu exceed 32-bit indexing", n,
                           off);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "eltwise", "", "fill", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    cl_uint un = (cl_uint)n, uo = (cl_uint)off;
    clg_ka_arg(&a, sizeof un, &un);
    clg_ka_float(&a, v);
    clg_ka_mem(&a, buf);
    clg_ka_arg(&a, sizeof uo, &uo);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "fill args"));
    return clg_launch_1d(dev, k, n, 256);
}
