/* Test-only preload for oclgrind runs (tests/oclgrind_check.sh): replaces
 * clEnqueueFillBuffer by one blocking clEnqueueWriteBuffer of the expanded
 * pattern over the same range. Same contents; but oclgrind 21.10 re-creates
 * a buffer's shadow memory on every host write, and it applies a fill
 * pattern by pattern, so after a fill only the last pattern counts as
 * initialised and every kernel reading the filled buffer is reported (e.g.
 * the optimizer's momentum, zeroed by clEnqueueFillBuffer in
 * src/train/optim.c: "Uninitialized value written" in sgd_step). One write
 * of the whole range is recorded correctly. The library itself fills by
 * kernel (clg_buf_fill); this covers code that still calls the API. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) CL_API_ENTRY cl_int CL_API_CALL clEnqueueFillBuffer(cl_command_queue q, cl_mem buf, const void *pattern,
                                                    size_t pattern_size, size_t offset, size_t size,
                                                    cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    if (!pattern || pattern_size == 0 || size % pattern_size || offset % pattern_size)
        return CL_INVALID_VALUE;
    unsigned char *host = malloc(size ? size : 1);
    if (!host)
        return CL_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < size; i += pattern_size)
        memcpy(host + i, pattern, pattern_size);
    cl_int rc = clEnqueueWriteBuffer(q, buf, CL_TRUE, offset, size, host, nwait, wait, ev);
    free(host);
    return rc;
}
