/* Chrome-trace writer (see trace.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/trace.h"

#define TRACE_LANES 16

typedef struct tr_event {
    int lane, stream;
    char name[48];
    cl_event a, b;   /* device span (a may be NULL) */
    double t0, t1;   /* host span (seconds) when a and b are NULL */
} tr_event;

struct clg_trace {
    char *path;
    int max_steps;
    pthread_mutex_t mu;
    tr_event *ev;
    size_t n, cap;
    double offset_s[TRACE_LANES]; /* host seconds = device ns * 1e-9 + offset */
    char lane_name[TRACE_LANES][192];
    int nlanes;
    double t_origin;
};

clg_status clg_trace_create(clg_err *err, const char *path, int max_steps, clg_trace **out)
{
    *out = NULL;
    clg_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the trace");
    }
    t->max_steps = max_steps;
    t->t_origin = clg_now_sec();
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return CLG_OK;
}

void clg_trace_free(clg_trace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        if (t->ev[i].a)
            clReleaseEvent(t->ev[i].a);
        if (t->ev[i].b)
            clReleaseEvent(t->ev[i].b);
    }
    free(t->ev);
    free(t->path);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

clg_status clg_trace_lane(clg_trace *t, int lane, clg_device *dev)
{
    if (!t || lane < 0 || lane >= TRACE_LANES)
        return CLG_OK;
    snprintf(t->lane_name[lane], sizeof t->lane_name[lane], "lane %d: device %d (%s)", lane, dev->index,
             dev->info.name);
    if (lane + 1 > t->nlanes)
        t->nlanes = lane + 1;
    cl_event m = NULL;
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &m));
    cl_int e = clWaitForEvents(1, &m);
    double host = clg_now_sec();
    cl_ulong end = 0;
    if (e == CL_SUCCESS)
        e = clGetEventProfilingInfo(m, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
    clReleaseEvent(m);
    if (e != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(dev), e, "trace clock", __FILE__, __LINE__);
    t->offset_s[lane] = host - (double)end * 1e-9;
    return CLG_OK;
}

int clg_trace_on(const clg_trace *t, int64_t step) { return t && step < t->max_steps; }

static void push(clg_trace *t, const tr_event *e)
{
    pthread_mutex_lock(&t->mu);
    if (t->n == t->cap) {
        size_t nc = t->cap ? 2 * t->cap : 1024;
        tr_event *ne = realloc(t->ev, nc * sizeof *ne);
        if (!ne) {
            pthread_mutex_unlock(&t->mu);
            if (e->a)
                clReleaseEvent(e->a);
            if (e->b)
                clReleaseEvent(e->b);
            return; /* the trace loses an event, the run goes on */
        }
        t->ev = ne;
        t->cap = nc;
    }
    t->ev[t->n++] = *e;
    pthread_mutex_unlock(&t->mu);
}

static tr_event make_event(int lane, int stream, const char *name)
{
    tr_event e;
    memset(&e, 0, sizeof e);
    e.lane = lane;
    e.stream = stream;
    snprintf(e.name, sizeof e.name, "%s", name);
    return e;
}

void clg_trace_cl(clg_trace *t, int lane, int stream, const char *name, cl_event a, cl_event b)
{
    if (!t || !b)
        return;
    tr_event e = make_event(lane, stream, name);
    if (a && clRetainEvent(a) == CL_SUCCESS)
        e.a = a;
    if (clRetainEvent(b) != CL_SUCCESS) {
        if (e.a)
            clReleaseEvent(e.a);
        return;
    }
    e.b = b;
    push(t, &e);
}

/* A span [t0, t1] of host time on a row. */
static void host_span(clg_trace *t, int lane, int row, const char *name, double t0, double t1)
{
    if (!t)
        return;
    tr_event e = make_event(lane, row, name);
    e.t0 = t0;
    e.t1 = t1;
    push(t, &e);
}

void clg_trace_host(clg_trace *t, int lane, const char *name, double t0, double t1)
{
    host_span(t, lane, CLG_TR_HOST, name, t0, t1);
}

void clg_trace_mpi(clg_trace *t, const char *name, double t0, double t1)
{
    host_span(t, TRACE_LANES, CLG_TR_MPI, name, t0, t1);
}

static double prof(cl_event ev, cl_profiling_info what)
{
    cl_ulong v = 0;
    if (clWaitForEvents(1, &ev) != CL_SUCCESS ||
        clGetEventProfilingInfo(ev, what, sizeof v, &v, NULL) != CL_SUCCESS)
        return -1;
    return (double)v * 1e-9;
}

clg_status clg_trace_close(clg_err *err, clg_trace *t)
{
    if (!t)
        return CLG_OK;
    static const char *streams[] = {"compute", "transfer", "host"};
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    int first = 1;
    for (int l = 0; l < t->nlanes; l++) {
        clg_sbuf_printf(&b, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": ", first ? "" : ",\n", l);
        clg_sbuf_json_str(&b, t->lane_name[l]);
        clg_sbuf_printf(&b, "}}");
        first = 0;
        for (int s = 0; s < 3; s++)
            clg_sbuf_printf(&b, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                            l, s, streams[s]);
    }
    if (clg_comm_size() > 1) /* the MPI row: its own process entry */
        clg_sbuf_printf(&b,
                        "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"MPI rank %d of "
                        "%d\"}},\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": "
                        "{\"name\": \"all-reduce\"}}",
                        first ? "" : ",\n", TRACE_LANES, clg_comm_rank(), clg_comm_size(), TRACE_LANES, CLG_TR_MPI);
    for (size_t i = 0; i < t->n; i++) {
        const tr_event *e = &t->ev[i];
        double t0 = e->t0, t1 = e->t1;
        if (e->b) {
            double off = e->lane < TRACE_LANES ? t->offset_s[e->lane] : 0;
            t0 = (e->a ? prof(e->a, CL_PROFILING_COMMAND_END) : prof(e->b, CL_PROFILING_COMMAND_START)) + off;
            t1 = prof(e->b, CL_PROFILING_COMMAND_END) + off;
            if (t0 < off || t1 < off) /* profiling info unavailable */
                continue;
        }
        if (t1 < t0)
            t1 = t0;
        clg_sbuf_printf(&b, ",\n{\"name\": ");
        clg_sbuf_json_str(&b, e->name);
        clg_sbuf_printf(&b, ", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}", e->lane,
                        e->stream, (t0 - t->t_origin) * 1e6, (t1 - t0) * 1e6);
    }
    clg_sbuf_printf(&b, "\n]}\n");
    clg_status st = b.oom ? clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory writing the trace")
                          : clg_file_write_atomic(err, t->path, b.data, b.len);
    clg_sbuf_free(&b);
    clg_trace_free(t);
    return st;
}
