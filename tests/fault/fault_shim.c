/* OpenCL fault injection (issue #11): interposes the OpenCL entry points the
 * library (and CLBlast / clFFT) call, counts the calls per kind, fails call
 * N of one kind with a chosen error, and counts the OpenCL objects created
 * and released so a run can tell which it leaked.
 *
 * Linked into tests/fault/fault_run (exported from the executable, so the
 * shared library's calls bind here first) or preloaded into any program:
 *   LD_PRELOAD=build/tests/fault/libclg_fault_shim.so CLG_FAULT=launch:40 clgrad train ...
 * Environment:
 *   CLG_FAULT=KIND:N[:ERR]  fail the N-th call (1-based) of KIND with ERR
 *                           (a negative cl_int; default: the kind's natural
 *                           error, e.g. CL_MEM_OBJECT_ALLOCATION_FAILURE for
 *                           buffer). Unset: count only.
 *   CLG_FAULT_REPORT=PATH   where clg_fault_report() (and exit) writes the
 *                           counts: "calls KIND N", "live TYPE N", "fired 0|1".
 * Kinds: see kind_names[] (each is a family of entry points). Object
 * releases, retains and information queries are never failed. */
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_shim.h"

/* the project builds with -fvisibility=hidden: these must be seen */
#pragma GCC visibility push(default)

enum { K_CONTEXT, K_QUEUE, K_BUFFER, K_PROGRAM, K_BUILD, K_KERNEL, K_SETARG, K_LAUNCH, K_WRITE, K_READ, K_COPY,
       K_FILL, K_MAP, K_MARKER, K_FINISH, K_FLUSH, K_WAIT, K_PROFILE, K_WGINFO, K_NKINDS };
static const char *const kind_names[K_NKINDS] = {
    "context", /* clCreateContext */
    "queue",   /* clCreateCommandQueue */
    "buffer",  /* clCreateBuffer, clCreateSubBuffer */
    "program", /* clCreateProgramWithSource / WithBinary */
    "build",   /* clBuildProgram */
    "kernel",  /* clCreateKernel, clCreateKernelsInProgram */
    "setarg",  /* clSetKernelArg */
    "launch",  /* clEnqueueNDRangeKernel */
    "write",   /* clEnqueueWriteBuffer */
    "read",    /* clEnqueueReadBuffer */
    "copy",    /* clEnqueueCopyBuffer */
    "fill",    /* clEnqueueFillBuffer */
    "map",     /* clEnqueueMapBuffer, clEnqueueUnmapMemObject */
    "marker",  /* clEnqueueMarkerWithWaitList, clEnqueueBarrierWithWaitList */
    "finish",  /* clFinish */
    "flush",   /* clFlush */
    "wait",    /* clWaitForEvents */
    "profile", /* clGetEventProfilingInfo */
    "wginfo",  /* clGetKernelWorkGroupInfo */
};
static const cl_int natural_error[K_NKINDS] = {
    CL_OUT_OF_HOST_MEMORY, CL_OUT_OF_RESOURCES, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY,
    CL_BUILD_PROGRAM_FAILURE, CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES,
    CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_MAP_FAILURE, CL_OUT_OF_RESOURCES,
    CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_OUT_OF_RESOURCES, CL_PROFILING_INFO_NOT_AVAILABLE,
    CL_OUT_OF_RESOURCES,
};

enum { O_CONTEXT, O_QUEUE, O_MEM, O_PROGRAM, O_KERNEL, O_EVENT, O_NOBJ };
static const char *const obj_names[O_NOBJ] = {"context", "queue", "mem", "program", "kernel", "event"};

static long calls[K_NKINDS];
static int fault_kind = -1, armed, fired;
static long fault_n;
static cl_int fault_err;

/* Live OpenCL objects: handle -> type, reference count, and whether a
 * dependency (clFFT, CLBlast) created it: their objects are reported apart,
 * as "foreign", so a leak inside them is not counted as clgrad's. */
typedef struct objnode {
    const void *h;
    int type, foreign;
    long refs;
    struct objnode *next;
} objnode;
#define OBJ_BUCKETS 4096
static objnode *objs[OBJ_BUCKETS];
static pthread_mutex_t obj_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t obj_bucket(const void *h) { return ((uintptr_t)h >> 4) % OBJ_BUCKETS; }

/* 1 when the code at return address ra lies in clFFT or CLBlast. */
static int foreign_caller(void *ra)
{
    Dl_info info;
    if (!ra || !dladdr(ra, &info) || !info.dli_fname)
        return 0;
    return strstr(info.dli_fname, "clFFT") != NULL || strstr(info.dli_fname, "clblast") != NULL;
}

/* d > 0: created (d objects of one handle: 1) or retained; d < 0: released. */
static void obj_ref(int type, const void *h, long d, void *ra)
{
    if (!h)
        return;
    pthread_mutex_lock(&obj_mu);
    objnode **pp = &objs[obj_bucket(h)];
    while (*pp && (*pp)->h != h)
        pp = &(*pp)->next;
    if (*pp) {
        (*pp)->refs += d;
        if ((*pp)->refs <= 0) {
            objnode *dead = *pp;
            *pp = dead->next;
            free(dead);
        }
    } else if (d > 0) { /* a handle not seen before: created here (retains of unknown handles count too) */
        objnode *n = malloc(sizeof *n);
        if (n) {
            *n = (objnode){h, type, foreign_caller(ra), d, objs[obj_bucket(h)]};
            objs[obj_bucket(h)] = n;
        }
    }
    pthread_mutex_unlock(&obj_mu);
}

/* live[type] of clgrad's own objects (foreign = 0) or the dependencies' (1). */
static void obj_count(int foreign, long live[O_NOBJ])
{
    memset(live, 0, sizeof(long) * O_NOBJ);
    pthread_mutex_lock(&obj_mu);
    for (int b = 0; b < OBJ_BUCKETS; b++)
        for (objnode *n = objs[b]; n; n = n->next)
            if (n->foreign == foreign)
                live[n->type]++;
    pthread_mutex_unlock(&obj_mu);
}

/* 1 when this call (of kind k, entry point fn, called from ra) is the one
 * to fail; says so on stderr with the caller as LIBRARY+OFFSET (for
 * addr2line -f -e LIBRARY OFFSET). */
static int inject(int k, const char *fn, void *ra)
{
    long c = __atomic_add_fetch(&calls[k], 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED) || k != fault_kind || c != fault_n)
        return 0;
    __atomic_store_n(&fired, 1, __ATOMIC_RELAXED);
    Dl_info info;
    int known = ra && dladdr(ra, &info) && info.dli_fname;
    fprintf(stderr, "fault-shim: %s (call %ld of kind %s) fails with %d, called from %s+0x%lx\n", fn, c,
            kind_names[k], (int)fault_err, known ? info.dli_fname : "?",
            known ? (unsigned long)((uintptr_t)ra - 1 - (uintptr_t)info.dli_fbase) : 0ul);
    return 1;
}

// ---- the real entry points ----

#define REAL(name) static __typeof__(&name) real_##name
REAL(clCreateContext);
REAL(clReleaseContext);
REAL(clRetainContext);
REAL(clRetainCommandQueue);
REAL(clCreateCommandQueue);
REAL(clReleaseCommandQueue);
REAL(clCreateBuffer);
REAL(clCreateSubBuffer);
REAL(clRetainMemObject);
REAL(clReleaseMemObject);
REAL(clCreateProgramWithSource);
REAL(clCreateProgramWithBinary);
REAL(clRetainProgram);
REAL(clReleaseProgram);
REAL(clBuildProgram);
REAL(clCreateKernel);
REAL(clCreateKernelsInProgram);
REAL(clRetainKernel);
REAL(clReleaseKernel);
REAL(clSetKernelArg);
REAL(clEnqueueNDRangeKernel);
REAL(clEnqueueWriteBuffer);
REAL(clEnqueueReadBuffer);
REAL(clEnqueueCopyBuffer);
REAL(clEnqueueFillBuffer);
REAL(clEnqueueMapBuffer);
REAL(clEnqueueUnmapMemObject);
REAL(clEnqueueMarkerWithWaitList);
REAL(clEnqueueBarrierWithWaitList);
REAL(clFinish);
REAL(clFlush);
REAL(clWaitForEvents);
REAL(clGetEventProfilingInfo);
REAL(clGetKernelWorkGroupInfo);
REAL(clCreateUserEvent);
REAL(clRetainEvent);
REAL(clReleaseEvent);

static void resolve(void *slot, const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        fprintf(stderr, "fault-shim: %s not found in the OpenCL library\n", name);
        abort(); /* a test tool, not the library: nothing can run without it */
    }
    memcpy(slot, &p, sizeof p);
}
#define RESOLVE(name) resolve(&real_##name, #name)

__attribute__((constructor)) static void shim_init(void)
{
    RESOLVE(clCreateContext);
    RESOLVE(clReleaseContext);
    RESOLVE(clRetainContext);
    RESOLVE(clRetainCommandQueue);
    RESOLVE(clCreateCommandQueue);
    RESOLVE(clReleaseCommandQueue);
    RESOLVE(clCreateBuffer);
    RESOLVE(clCreateSubBuffer);
    RESOLVE(clRetainMemObject);
    RESOLVE(clReleaseMemObject);
    RESOLVE(clCreateProgramWithSource);
    RESOLVE(clCreateProgramWithBinary);
    RESOLVE(clRetainProgram);
    RESOLVE(clReleaseProgram);
    RESOLVE(clBuildProgram);
    RESOLVE(clCreateKernel);
    RESOLVE(clCreateKernelsInProgram);
    RESOLVE(clRetainKernel);
    RESOLVE(clReleaseKernel);
    RESOLVE(clSetKernelArg);
    RESOLVE(clEnqueueNDRangeKernel);
    RESOLVE(clEnqueueWriteBuffer);
    RESOLVE(clEnqueueReadBuffer);
    RESOLVE(clEnqueueCopyBuffer);
    RESOLVE(clEnqueueFillBuffer);
    RESOLVE(clEnqueueMapBuffer);
    RESOLVE(clEnqueueUnmapMemObject);
    RESOLVE(clEnqueueMarkerWithWaitList);
    RESOLVE(clEnqueueBarrierWithWaitList);
    RESOLVE(clFinish);
    RESOLVE(clFlush);
    RESOLVE(clWaitForEvents);
    RESOLVE(clGetEventProfilingInfo);
    RESOLVE(clGetKernelWorkGroupInfo);
    RESOLVE(clCreateUserEvent);
    RESOLVE(clRetainEvent);
    RESOLVE(clReleaseEvent);
    const char *spec = getenv("CLG_FAULT");
    if (spec && *spec) {
        char kind[32];
        long n = 0, e = 0;
        int got = sscanf(spec, "%31[a-z]:%ld:%ld", kind, &n, &e);
        for (int k = 0; k < K_NKINDS && got >= 2; k++)
            if (strcmp(kind, kind_names[k]) == 0)
                fault_kind = k;
        if (fault_kind < 0 || n < 1) {
            fprintf(stderr, "fault-shim: CLG_FAULT='%s' is not KIND:N[:ERR] with a known kind\n", spec);
            exit(2);
        }
        fault_n = n;
        fault_err = got == 3 ? (cl_int)e : natural_error[fault_kind];
        armed = 1;
    }
}

// ---- control ----

void clg_fault_disarm(void) { __atomic_store_n(&armed, 0, __ATOMIC_RELAXED); }

int clg_fault_fired(void) { return __atomic_load_n(&fired, __ATOMIC_RELAXED); }

long clg_fault_live(void)
{
    long live[O_NOBJ], n = 0;
    obj_count(0, live);
    for (int t = 0; t < O_NOBJ; t++)
        n += live[t];
    return n;
}

void clg_fault_report(void)
{
    const char *path = getenv("CLG_FAULT_REPORT");
    FILE *f = path && *path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    long live[O_NOBJ], foreign[O_NOBJ];
    obj_count(0, live);
    obj_count(1, foreign);
    for (int k = 0; k < K_NKINDS; k++)
        fprintf(f, "calls %s %ld\n", kind_names[k], __atomic_load_n(&calls[k], __ATOMIC_RELAXED));
    for (int t = 0; t < O_NOBJ; t++)
        fprintf(f, "live %s %ld\n", obj_names[t], live[t]);
    for (int t = 0; t < O_NOBJ; t++)
        fprintf(f, "foreign %s %ld\n", obj_names[t], foreign[t]);
    fprintf(f, "fired %d\n", clg_fault_fired());
    fclose(f);
}

// ---- interposed entry points ----

#define FAIL_OBJ(k, name)                 \
    do {                                  \
        if (inject((k), #name, RA)) {         \
            if (errcode_ret)              \
                *errcode_ret = fault_err; \
            return NULL;                  \
        }                                 \
    } while (0)
#define FAIL_INT(k, name)         \
    do {                          \
        if (inject((k), #name, RA)) \
            return fault_err;     \
    } while (0)
#define RA __builtin_return_address(0)
/* counts the event an enqueue returned */
static cl_int evd(cl_int e, cl_event *ev, void *ra)
{
    if (e == CL_SUCCESS && ev)
        obj_ref(O_EVENT, *ev, 1, ra);
    return e;
}
static cl_int rel(cl_int e, int type, const void *h)
{
    if (e == CL_SUCCESS)
        obj_ref(type, h, -1, NULL);
    return e;
}
static cl_int ret(cl_int e, int type, const void *h, void *ra)
{
    if (e == CL_SUCCESS)
        obj_ref(type, h, 1, ra);
    return e;
}
static void *made(void *o, int type, void *ra)
{
    obj_ref(type, o, 1, ra);
    return o;
}

cl_context CL_API_CALL clCreateContext(const cl_context_properties *properties, cl_uint num_devices,
                                       const cl_device_id *devices,
                                       void(CL_CALLBACK *pfn_notify)(const char *, const void *, size_t, void *),
                                       void *user_data, cl_int *errcode_ret)
{
    FAIL_OBJ(K_CONTEXT, clCreateContext);
    return made(real_clCreateContext(properties, num_devices, devices, pfn_notify, user_data, errcode_ret), O_CONTEXT,
                RA);
}
cl_int CL_API_CALL clReleaseContext(cl_context c) { return rel(real_clReleaseContext(c), O_CONTEXT, c); }
cl_int CL_API_CALL clRetainContext(cl_context c)
{
    return ret(real_clRetainContext(c), O_CONTEXT, c, RA);
}

cl_command_queue CL_API_CALL clCreateCommandQueue(cl_context context, cl_device_id device,
                                                  cl_command_queue_properties properties, cl_int *errcode_ret)
{
    FAIL_OBJ(K_QUEUE, clCreateCommandQueue);
    return made(real_clCreateCommandQueue(context, device, properties, errcode_ret), O_QUEUE, RA);
}
cl_int CL_API_CALL clReleaseCommandQueue(cl_command_queue q) { return rel(real_clReleaseCommandQueue(q), O_QUEUE, q); }
cl_int CL_API_CALL clRetainCommandQueue(cl_command_queue q)
{
    return ret(real_clRetainCommandQueue(q), O_QUEUE, q, RA);
}

cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                  cl_int *errcode_ret)
{
    FAIL_OBJ(K_BUFFER, clCreateBuffer);
    return made(real_clCreateBuffer(context, flags, size, host_ptr, errcode_ret), O_MEM, RA);
}
cl_mem CL_API_CALL clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type, const void *info,
                                     cl_int *errcode_ret)
{
    FAIL_OBJ(K_BUFFER, clCreateSubBuffer);
    return made(real_clCreateSubBuffer(buffer, flags, type, info, errcode_ret), O_MEM, RA);
}
cl_int CL_API_CALL clRetainMemObject(cl_mem m)
{
    return ret(real_clRetainMemObject(m), O_MEM, m, RA);
}
cl_int CL_API_CALL clReleaseMemObject(cl_mem m) { return rel(real_clReleaseMemObject(m), O_MEM, m); }

cl_program CL_API_CALL clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                                 const size_t *lengths, cl_int *errcode_ret)
{
    FAIL_OBJ(K_PROGRAM, clCreateProgramWithSource);
    return made(real_clCreateProgramWithSource(context, count, strings, lengths, errcode_ret), O_PROGRAM, RA);
}
cl_program CL_API_CALL clCreateProgramWithBinary(cl_context context, cl_uint num_devices, const cl_device_id *devices,
                                                 const size_t *lengths, const unsigned char **binaries,
                                                 cl_int *binary_status, cl_int *errcode_ret)
{
    FAIL_OBJ(K_PROGRAM, clCreateProgramWithBinary);
    return made(real_clCreateProgramWithBinary(context, num_devices, devices, lengths, binaries, binary_status,
                                               errcode_ret),
                O_PROGRAM, RA);
}
cl_int CL_API_CALL clRetainProgram(cl_program p)
{
    return ret(real_clRetainProgram(p), O_PROGRAM, p, RA);
}
cl_int CL_API_CALL clReleaseProgram(cl_program p) { return rel(real_clReleaseProgram(p), O_PROGRAM, p); }

cl_int CL_API_CALL clBuildProgram(cl_program program, cl_uint num_devices, const cl_device_id *device_list,
                                  const char *options, void(CL_CALLBACK *pfn_notify)(cl_program, void *),
                                  void *user_data)
{
    FAIL_INT(K_BUILD, clBuildProgram);
    return real_clBuildProgram(program, num_devices, device_list, options, pfn_notify, user_data);
}

cl_kernel CL_API_CALL clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret)
{
    FAIL_OBJ(K_KERNEL, clCreateKernel);
    return made(real_clCreateKernel(program, kernel_name, errcode_ret), O_KERNEL, RA);
}
cl_int CL_API_CALL clCreateKernelsInProgram(cl_program program, cl_uint num_kernels, cl_kernel *kernels,
                                            cl_uint *num_kernels_ret)
{
    FAIL_INT(K_KERNEL, clCreateKernelsInProgram);
    cl_uint got = 0;
    cl_int e = real_clCreateKernelsInProgram(program, num_kernels, kernels, &got);
    if (num_kernels_ret)
        *num_kernels_ret = got;
    for (cl_uint i = 0; e == CL_SUCCESS && kernels && i < got; i++)
        obj_ref(O_KERNEL, kernels[i], 1, RA);
    return e;
}
cl_int CL_API_CALL clRetainKernel(cl_kernel k)
{
    return ret(real_clRetainKernel(k), O_KERNEL, k, RA);
}
cl_int CL_API_CALL clReleaseKernel(cl_kernel k) { return rel(real_clReleaseKernel(k), O_KERNEL, k); }

cl_int CL_API_CALL clSetKernelArg(cl_kernel kernel, cl_uint arg_index, size_t arg_size, const void *arg_value)
{
    FAIL_INT(K_SETARG, clSetKernelArg);
    return real_clSetKernelArg(kernel, arg_index, arg_size, arg_value);
}

cl_int CL_API_CALL clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel kernel, cl_uint work_dim,
                                          const size_t *global_work_offset, const size_t *global_work_size,
                                          const size_t *local_work_size, cl_uint nev, const cl_event *wait,
                                          cl_event *event)
{
    FAIL_INT(K_LAUNCH, clEnqueueNDRangeKernel);
    return evd(real_clEnqueueNDRangeKernel(q, kernel, work_dim, global_work_offset, global_work_size,
                                           local_work_size, nev, wait, event),
               event, RA);
}
cl_int CL_API_CALL clEnqueueWriteBuffer(cl_command_queue q, cl_mem buffer, cl_bool blocking, size_t offset,
                                        size_t size, const void *ptr, cl_uint nev, const cl_event *wait,
                                        cl_event *event)
{
    FAIL_INT(K_WRITE, clEnqueueWriteBuffer);
    return evd(real_clEnqueueWriteBuffer(q, buffer, blocking, offset, size, ptr, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clEnqueueReadBuffer(cl_command_queue q, cl_mem buffer, cl_bool blocking, size_t offset, size_t size,
                                       void *ptr, cl_uint nev, const cl_event *wait, cl_event *event)
{
    FAIL_INT(K_READ, clEnqueueReadBuffer);
    return evd(real_clEnqueueReadBuffer(q, buffer, blocking, offset, size, ptr, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clEnqueueCopyBuffer(cl_command_queue q, cl_mem src, cl_mem dst, size_t src_offset,
                                       size_t dst_offset, size_t size, cl_uint nev, const cl_event *wait,
                                       cl_event *event)
{
    FAIL_INT(K_COPY, clEnqueueCopyBuffer);
    return evd(real_clEnqueueCopyBuffer(q, src, dst, src_offset, dst_offset, size, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clEnqueueFillBuffer(cl_command_queue q, cl_mem buffer, const void *pattern, size_t pattern_size,
                                       size_t offset, size_t size, cl_uint nev, const cl_event *wait,
                                       cl_event *event)
{
    FAIL_INT(K_FILL, clEnqueueFillBuffer);
    return evd(real_clEnqueueFillBuffer(q, buffer, pattern, pattern_size, offset, size, nev, wait, event), event, RA);
}
void *CL_API_CALL clEnqueueMapBuffer(cl_command_queue q, cl_mem buffer, cl_bool blocking, cl_map_flags flags,
                                     size_t offset, size_t size, cl_uint nev, const cl_event *wait, cl_event *event,
                                     cl_int *errcode_ret)
{
    FAIL_OBJ(K_MAP, clEnqueueMapBuffer);
    void *p = real_clEnqueueMapBuffer(q, buffer, blocking, flags, offset, size, nev, wait, event, errcode_ret);
    if (p && event)
        obj_ref(O_EVENT, *event, 1, RA);
    return p;
}
cl_int CL_API_CALL clEnqueueUnmapMemObject(cl_command_queue q, cl_mem memobj, void *mapped, cl_uint nev,
                                           const cl_event *wait, cl_event *event)
{
    FAIL_INT(K_MAP, clEnqueueUnmapMemObject);
    return evd(real_clEnqueueUnmapMemObject(q, memobj, mapped, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clEnqueueMarkerWithWaitList(cl_command_queue q, cl_uint nev, const cl_event *wait, cl_event *event)
{
    FAIL_INT(K_MARKER, clEnqueueMarkerWithWaitList);
    return evd(real_clEnqueueMarkerWithWaitList(q, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clEnqueueBarrierWithWaitList(cl_command_queue q, cl_uint nev, const cl_event *wait,
                                                cl_event *event)
{
    FAIL_INT(K_MARKER, clEnqueueBarrierWithWaitList);
    return evd(real_clEnqueueBarrierWithWaitList(q, nev, wait, event), event, RA);
}
cl_int CL_API_CALL clFinish(cl_command_queue q)
{
    FAIL_INT(K_FINISH, clFinish);
    return real_clFinish(q);
}
cl_int CL_API_CALL clFlush(cl_command_queue q)
{
    FAIL_INT(K_FLUSH, clFlush);
    return real_clFlush(q);
}
cl_int CL_API_CALL clWaitForEvents(cl_uint n, const cl_event *list)
{
    FAIL_INT(K_WAIT, clWaitForEvents);
    return real_clWaitForEvents(n, list);
}
cl_int CL_API_CALL clGetEventProfilingInfo(cl_event ev, cl_profiling_info name, size_t size, void *value,
                                           size_t *size_ret)
{
    FAIL_INT(K_PROFILE, clGetEventProfilingInfo);
    return real_clGetEventProfilingInfo(ev, name, size, value, size_ret);
}
cl_int CL_API_CALL clGetKernelWorkGroupInfo(cl_kernel k, cl_device_id dev, cl_kernel_work_group_info name, size_t size,
                                            void *value, size_t *size_ret)
{
    FAIL_INT(K_WGINFO, clGetKernelWorkGroupInfo);
    return real_clGetKernelWorkGroupInfo(k, dev, name, size, value, size_ret);
}
cl_event CL_API_CALL clCreateUserEvent(cl_context context, cl_int *errcode_ret)
{
    return made(real_clCreateUserEvent(context, errcode_ret), O_EVENT, RA);
}
cl_int CL_API_CALL clRetainEvent(cl_event ev)
{
    return ret(real_clRetainEvent(ev), O_EVENT, ev, RA);
}
cl_int CL_API_CALL clReleaseEvent(cl_event ev) { return rel(real_clReleaseEvent(ev), O_EVENT, ev); }
