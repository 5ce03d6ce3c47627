/* Chrome-trace timeline of training steps (--trace FILE.json; open it in
 * chrome://tracing or Perfetto). One process row per device lane with a
 * thread row per stream: "compute" (forward/backward per layer, optimizer,
 * from OpenCL profiling events of markers the lane enqueues around each
 * part), "transfer" (uploads, bucket reads and write-backs) and "host" (the
 * reduction's sums and the waits for other lanes). Device timestamps are
 * mapped onto the host clock once per lane (a marker's end against the
 * host time right after it completed). Events are kept (cl_event retained)
 * until the file is written, for the first max_steps steps. */
#ifndef CLG_PARALLEL_TRACE_H
#define CLG_PARALLEL_TRACE_H

#include "device/device.h"

enum { CLG_TR_COMPUTE = 0, CLG_TR_TRANSFER = 1, CLG_TR_HOST = 2, CLG_TR_MPI = 3 };

typedef struct clg_trace clg_trace;

CLG_INTERNAL clg_status clg_trace_create(clg_err *err, const char *path, int max_steps, clg_trace **out);
/* Writes the file (resolving the device events) and frees. */
CLG_INTERNAL clg_status clg_trace_close(clg_err *err, clg_trace *t);
CLG_INTERNAL void clg_trace_free(clg_trace *t);
/* Names lane `lane` (device name) and fixes its device->host clock offset
 * (blocks on dev's queue once). */
CLG_INTERNAL clg_status clg_trace_lane(clg_trace *t, int lane, clg_device *dev);
/* Whether step `step` is traced. */
CLG_INTERNAL int clg_trace_on(const clg_trace *t, int64_t step);
/* A span between the ends of two events on a device stream (a == NULL:
 * b's own start..end). Retains them. Thread-safe. */
CLG_INTERNAL void clg_trace_cl(clg_trace *t, int lane, int stream, const char *name, cl_event a, cl_event b);
/* A host span (clg_now_sec() seconds). Thread-safe. */
CLG_INTERNAL void clg_trace_host(clg_trace *t, int lane, const char *name, double t0, double t1);
/* A span of this rank's all-reduces across MPI ranks (host seconds): the
 * row "MPI rank R of N" (one trace file per rank). Thread-safe. */
CLG_INTERNAL void clg_trace_mpi(clg_trace *t, const char *name, double t0, double t1);

#endif
