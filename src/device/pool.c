/* Device buffer pool: released blocks are kept per size class and reused. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

size_t clg_pool_class(size_t bytes)
{
    if (bytes <= 256)
        return 256;
    /* 4 classes per power of two: 1, 1.25, 1.5, 1.75 x 2^k */
    int hb = 63 - __builtin_clzll((unsigned long long)bytes);
    size_t base = (size_t)1 << hb;
    size_t step = base / 4;
    size_t c = base;
    while (c < bytes)
        c += step;
    return c;
}

static void update_peak(clg_pool *p)
{
    if (p->stats.bytes_in_use > p->stats.peak_bytes)
        p->stats.peak_bytes = p->stats.bytes_in_use;
    if (p->stats.bytes_in_use + p->direct_bytes > p->total_peak)
        p->total_peak = p->stats.bytes_in_use + p->direct_bytes;
}

/* Whether `more` bytes fit the device's memory cap (device_mem_limit MiB; 0 none); else the refusal. */
static clg_status over_limit(clg_device *dev, uint64_t more, const char *what)
{
    clg_pool *p = &dev->pool;
    if (!p->limit || p->stats.bytes_in_use + p->direct_bytes + more <= p->limit)
        return CLG_OK;
    p->stats.failures++;
    return clg_err_set(clg_dev_err(dev), CLG_ERR_DEVICE_OOM,
                       "%s of %.2f MiB refused on device %d: %.2f MiB in use, past its memory limit of %.2f MiB "
                       "(device_mem_limit, --device-mem-limit)",
                       what, more / 1048576.0, dev->index,
                       (p->stats.bytes_in_use + p->direct_bytes) / 1048576.0, p->limit / 1048576.0);
}

clg_status clg_mem_charge(clg_device *dev, size_t bytes, const char *what)
{
    CLG_TRY(over_limit(dev, bytes, what));
    dev->pool.direct_bytes += bytes;
    update_peak(&dev->pool);
    return CLG_OK;
}

void clg_mem_uncharge(clg_device *dev, size_t bytes)
{
    dev->pool.direct_bytes -= CLG_MIN(bytes, dev->pool.direct_bytes);
}

#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define HUGE_BYTES ((size_t)2 << 20)

typedef struct huge_map {
    void *base;
    size_t len;
} huge_map;

static void CL_CALLBACK huge_unmap(cl_mem m, void *user)
{
    (void)m;
    huge_map *h = user;
    munmap(h->base, h->len);
    free(h);
}

/* Option hugepages: a buffer of cls bytes in an anonymous mapping aligned
 * to 2 MiB and advised MADV_HUGEPAGE (CL_MEM_USE_HOST_PTR; a CPU device
 * computes in it directly), unmapped when the runtime destroys the buffer.
 * NULL where it does not apply or a step fails (the caller allocates as
 * usual). With 4 KiB pages the TLB misses of the streaming kernels cost
 * 9-13% of a ResNet training step's CPU time here (2-core VM, PoCL 3.1);
 * resident memory grows by up to 2 MiB per buffer (the last huge page). */
static cl_mem huge_buffer(clg_device *dev, size_t cls)
{
    int mode = (int)dev->ctx->opts.hugepages - 1; /* auto,0,1 -> -1,0,1 */
    if (mode == 0 || cls < HUGE_BYTES || !(dev->info.type & CLG_DEVICE_CPU))
        return NULL;
    if (mode < 0 && !clg_device_is_pocl(dev))
        return NULL;
    size_t len = (cls + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES + HUGE_BYTES;
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    char *al = (char *)(((uintptr_t)base + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    huge_map *h = malloc(sizeof *h);
    cl_int e = CL_SUCCESS;
    cl_mem m = NULL;
    if (h) {
        (void)madvise(al, len - (size_t)(al - (char *)base), MADV_HUGEPAGE); /* a hint: failure is harmless */
        m = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, cls, al, &e);
    }
    if (m && e == CL_SUCCESS) {
        h->base = base;
        h->len = len;
        if (clSetMemObjectDestructorCallback(m, huge_unmap, h) == CL_SUCCESS)
            return m;
        clReleaseMemObject(m); /* no command has used it: gone before the unmap below */
    }
    free(h);
    munmap(base, len);
    return NULL;
}
#else
static cl_mem huge_buffer(clg_device *dev, size_t cls)
{
    (void)dev;
    (void)cls;
    return NULL;
}
#endif

clg_status clg_buf_alloc(clg_device *dev, size_t bytes, cl_mem *out)
{
    *out = NULL;
    clg_pool *p = &dev->pool;
    size_t cls = clg_pool_class(bytes ? bytes : 1);
    CLG_TRY(over_limit(dev, cls, "an allocation"));
    for (int i = p->nfree - 1; i >= 0; i--) {
        if (p->free_blocks[i].size == cls) {
            *out = p->free_blocks[i].mem;
            p->free_blocks[i] = p->free_blocks[--p->nfree];
            p->stats.bytes_cached -= cls;
            p->stats.bytes_in_use += cls;
            p->stats.hits++;
            update_peak(p);
            return CLG_OK;
        }
    }
    if (p->fail_after == 0) {
        p->stats.failures++;
        return clg_err_set(clg_dev_err(dev), CLG_ERR_DEVICE_OOM,
                           "cannot allocate %zu bytes on %s: CL_MEM_OBJECT_ALLOCATION_FAILURE (injected)", bytes,
                           dev->info.name);
    }
    if (p->fail_after > 0)
        p->fail_after--;
    if (dev->info.max_alloc_bytes && cls > dev->info.max_alloc_bytes) {
        p->stats.failures++;
        return clg_err_set(clg_dev_err(dev), CLG_ERR_DEVICE_OOM,
                           "cannot allocate %zu bytes on %s: larger than its maximum allocation of %llu bytes", bytes,
                           dev->info.name, (unsigned long long)dev->info.max_alloc_bytes);
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        cl_int e = CL_SUCCESS;
        cl_mem m = huge_buffer(dev, cls);
        p->huge_buffers += m != NULL;
        if (!m)
            m = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, cls, NULL, &e);
        if (e == CL_SUCCESS) {
            *out = m;
            p->stats.misses++;
            p->stats.bytes_in_use += cls;
            update_peak(p);
            return CLG_OK;
        }
        if ((e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES) && attempt == 0 && p->nfree > 0) {
            clg_pool_trim(dev); /* give cached blocks back and retry once */
            continue;
        }
        p->stats.failures++;
        return clg_cl_fail(clg_dev_err(dev), e, "clCreateBuffer", __FILE__, __LINE__);
    }
    return CLG_ERR_INTERNAL;
}

void clg_buf_release(clg_device *dev, cl_mem mem)
{
    if (!mem)
        return;
    clg_pool *p = &dev->pool;
    size_t size = 0;
    clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL);
    p->stats.bytes_in_use -= CLG_MIN(size, p->stats.bytes_in_use);
    if (p->stats.bytes_cached + size > p->cache_limit) {
        clReleaseMemObject(mem);
        return;
    }
    if (p->nfree == p->capfree) {
        int nc = p->capfree ? p->capfree * 2 : 32;
        clg_pool_block *nb = realloc(p->free_blocks, (size_t)nc * sizeof *nb);
        if (!nb) {
            clReleaseMemObject(mem);
            return;
        }
        p->free_blocks = nb;
        p->capfree = nc;
    }
    p->free_blocks[p->nfree].mem = mem;
    p->free_blocks[p->nfree].size = size;
    p->nfree++;
    p->stats.bytes_cached += size;
}

void clg_pool_trim(clg_device *dev)
{
    clg_pool *p = &dev->pool;
    for (int i = 0; i < p->nfree; i++)
        clReleaseMemObject(p->free_blocks[i].mem);
    p->nfree = 0;
    p->stats.bytes_cached = 0;
}
