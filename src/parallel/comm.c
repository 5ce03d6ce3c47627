/* Communicator across processes (see comm.h). */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clg_config.h"
#include "core/options.h"
#include "parallel/comm.h"

#define DEFAULT_TIMEOUT 60.0
#define FIRST_FACTOR 10.0 /* until the first all-reduce completed: kernel builds on every rank */

static int g_rank = 0, g_size = 1;
static double g_timeout = DEFAULT_TIMEOUT;
static int g_det = 0;

void clg_comm_configure(double timeout_s, int deterministic)
{
    g_timeout = timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT;
    g_det = deterministic != 0;
}

int clg_comm_deterministic(void) { return g_det; }
double clg_comm_timeout(void) { return g_timeout; }
int clg_comm_rank(void) { return g_rank; }
int clg_comm_size(void) { return g_size; }

void clg_comm_slice(int n, int *off, int *cnt)
{
    int q = n / g_size, r = n % g_size;
    *cnt = q + (g_rank < r);
    *off = g_rank * q + CLG_MIN(g_rank, r);
}

#if CLG_HAVE_MPI

#include <mpi.h>

static int g_use_mpi_iallreduce = 0; /* CLGRAD_ALLREDUCE=mpi: MPI_Iallreduce instead of clgrad's ring */

const char *clg_comm_algorithm(void)
{
    return g_det ? "rank-ordered" : g_use_mpi_iallreduce ? "MPI_Iallreduce" : "ring";
}

#define TAG_PING 7101
#define TAG_PONG 7102
#define MAX_INFLIGHT 4096

enum { OP_IDLE, OP_FLIGHT, OP_DONE, OP_FAILED };

struct clg_comm_op {
    char what[64];
    MPI_Comm comm;
    MPI_Request req;
    int state;
    float *buf;
    size_t n;
    double *sumsq;
    float *gather; /* deterministic mode: every rank's data */
    size_t gather_cap;
    char msg[160]; /* OP_FAILED */
    double t0, t1;
    /* ring all-reduce (default): step of 2(R-1), its receive and send */
    int ring, step;
    MPI_Request rq[2];
    float *tmp; /* one chunk received in the reduce-scatter half */
    size_t tmp_cap;
};

static int g_mpi = 0;       /* MPI initialized by us */
static int g_nap_max = 200; /* us: the longest sleep between two polls */
static double g_spin_s = 0.02; /* s: a wait spins (yielding) this long before it sleeps */
static int g_completed = 0; /* an all-reduce has completed (the timeout is no longer stretched) */
static int g_failed = 0;    /* a wait timed out or failed: every later wait fails at once */
static char g_fail_msg[400];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static MPI_Comm g_ping = MPI_COMM_NULL, g_main = MPI_COMM_NULL;
static clg_comm_op *g_flight[MAX_INFLIGHT];
static int g_nflight;

static void mpi_msg(int code, char *buf, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", code);
    snprintf(buf, cap, "%.100s", s);
}

static clg_status mpi_fail(clg_err *err, int code, const char *call)
{
    char s[200];
    mpi_msg(code, s, sizeof s);
    return clg_err_set(err, CLG_ERR_MPI, "rank %d of %d: %s: %s", g_rank, g_size, call, s);
}

clg_status clg_comm_init(const clg_options *opts, clg_err *err)
{
    static int done = 0;
    if (done)
        return CLG_OK;
    done = 1;
    /* only under an MPI launcher: a plain run never loads MPI's runtime */
    if (!clg_opts_mpi_launcher(NULL))
        return CLG_OK;
    clg_opts o; /* the communicator's settings: opts (or defaults), then the environment, read here once */
    if (opts)
        o = *opts;
    else
        clg_opts_init(&o);
    clg_status ost = clg_opts_read_env(&o, err);
    if (ost != CLG_OK)
        return ost;
    int inited = 0, prov = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int e = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov);
        if (e != MPI_SUCCESS)
            return clg_err_set(err, CLG_ERR_MPI, "MPI_Init_thread failed (error %d)", e);
        g_mpi = 1;
    } else {
        MPI_Query_thread(&prov);
    }
    if (prov < MPI_THREAD_SERIALIZED)
        return clg_err_set(err, CLG_ERR_MPI,
                           "MPI provides thread level %d, clgrad needs MPI_THREAD_SERIALIZED (lane threads call MPI "
                           "under one lock)",
                           prov);
    g_use_mpi_iallreduce = o.allreduce == 1; /* ring,mpi */
    g_nap_max = (int)o.comm_poll_us;
    g_spin_s = o.comm_spin_s;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int e = MPI_Comm_dup(MPI_COMM_WORLD, &g_ping);
    if (e == MPI_SUCCESS)
        e = MPI_Comm_dup(MPI_COMM_WORLD, &g_main);
    if (e != MPI_SUCCESS)
        return mpi_fail(err, e, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(g_ping, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g_main, MPI_ERRORS_RETURN);
    return CLG_OK;
}

void clg_comm_finalize(int rc)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!g_mpi || fin)
        return;
    if ((rc != 0 || g_failed) && g_size > 1) {
        fflush(stdout);
        fflush(stderr);
        /* the others would wait for this rank until their timeout */
        MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
    }
    MPI_Finalize();
}

static double now(void) { return clg_now_sec(); }

#define CLG_TRY_COMM(expr)            \
    do {                              \
        clg_status st_ = (expr);      \
        if (st_ != CLG_OK)            \
            return st_;               \
    } while (0)

/* Between two polls of a wait that began at t0: MPI moves data only inside
 * MPI calls (Open MPI's TCP transport has no progress thread), so long sleeps
 * throttle a transfer (1 ms sleeps cost Open MPI's MPI_Iallreduce a third of
 * its speed here); sleeps of up to 200 us cost the ring nothing measurable,
 * and do not take a core from the other ranks of a loaded machine as spinning
 * does. The first g_spin_s seconds of a wait only yield the core; then sleeps
 * of 10 us growing to g_nap_max. CLGRAD_COMM_SPIN_S / CLGRAD_COMM_POLL_US
 * change both (tuning aids). */
static void nap(int *us, double t0)
{
    if (clg_now_sec() - t0 < g_spin_s) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, (long)*us * 1000L};
    nanosleep(&ts, NULL);
    if (*us < g_nap_max)
        *us = CLG_MIN(2 * *us, g_nap_max);
}

/* Answers the pings of ranks that are looking for dead peers (g_mu held). */
static void serve_pings(void)
{
    for (;;) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PING, g_ping, &flag, &s) != MPI_SUCCESS || !flag)
            return;
        int v = 0;
        if (MPI_Recv(&v, 1, MPI_INT, s.MPI_SOURCE, TAG_PING, g_ping, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        MPI_Send(&g_rank, 1, MPI_INT, s.MPI_SOURCE, TAG_PONG, g_ping);
    }
}

/* After a timeout: which ranks still answer a ping (every rank that waits in
 * clgrad's reduction does)? The message goes to g_fail_msg (g_mu held). */
static void find_missing(const char *what, double limit)
{
    int n = g_size;
    MPI_Request *rq = calloc((size_t)2 * n, sizeof *rq);
    int *pong = calloc((size_t)n, sizeof *pong), *got = calloc((size_t)n, sizeof *got);
    static int ping_val;
    ping_val = g_rank;
    char missing[200] = "";
    size_t used = 0;
    int nmiss = 0;
    if (rq && pong && got) {
        for (int r = 0; r < n; r++) {
            rq[2 * r] = rq[2 * r + 1] = MPI_REQUEST_NULL;
            if (r == g_rank)
                continue;
            MPI_Isend(&ping_val, 1, MPI_INT, r, TAG_PING, g_ping, &rq[2 * r]);
            MPI_Irecv(&pong[r], 1, MPI_INT, r, TAG_PONG, g_ping, &rq[2 * r + 1]);
        }
        double grace = CLG_MIN(5.0, CLG_MAX(1.0, g_timeout / 4)), t0 = now();
        int us = 50, left = n - 1;
        while (left > 0 && now() - t0 < grace) {
            for (int r = 0; r < n; r++) {
                if (r == g_rank || got[r])
                    continue;
                int flag = 0;
                if (MPI_Test(&rq[2 * r + 1], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
                    got[r] = 1;
                    left--;
                }
            }
            serve_pings();
            pthread_mutex_unlock(&g_mu);
            nap(&us, t0);
            pthread_mutex_lock(&g_mu);
        }
        for (int r = 0; r < n; r++)
            if (r != g_rank && !got[r]) {
                nmiss++;
                used += (size_t)snprintf(missing + used, used < sizeof missing ? sizeof missing - used : 0, "%s%d",
                                         nmiss > 1 ? ", " : "", r);
                if (used >= sizeof missing)
                    used = sizeof missing - 1;
            }
    }
    if (nmiss > 0)
        snprintf(g_fail_msg, sizeof g_fail_msg,
                 "rank %d of %d: the %s did not complete within %.0f s (--comm-timeout); rank%s %s did not answer: "
                 "dead or hung",
                 g_rank, g_size, what, limit, nmiss > 1 ? "s" : "", missing);
    else
        snprintf(g_fail_msg, sizeof g_fail_msg,
                 "rank %d of %d: the %s did not complete within %.0f s (--comm-timeout); every rank still answers "
                 "(one is slower than the timeout allows, or stuck outside the reduction)",
                 g_rank, g_size, what, limit);
    /* the requests to silent ranks are left behind: the job ends */
    free(rq);
    free(pong);
    free(got);
}

static clg_status timed_out(clg_err *err, const char *what, double limit)
{
    static int finding = 0; /* one thread looks for the silent ranks; the others wait for its message */
    pthread_mutex_lock(&g_mu);
    if (!g_failed && !finding) {
        finding = 1;
        find_missing(what, limit); /* (releases g_mu while it waits for answers) */
        g_failed = 1;
    }
    while (!g_failed) {
        pthread_mutex_unlock(&g_mu);
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_mu);
    }
    pthread_mutex_unlock(&g_mu);
    return clg_err_set(err, CLG_ERR_MPI, "%s", g_fail_msg);
}

static double limit_now(void) { return g_completed ? g_timeout : g_timeout * FIRST_FACTOR; }

static void flight_remove(clg_comm_op *op)
{
    for (int i = 0; i < g_nflight; i++)
        if (g_flight[i] == op) {
            g_flight[i] = g_flight[--g_nflight];
            return;
        }
}

/* The op's reduction has arrived: deterministic sum in rank order, norm (g_mu held). */
static void complete(clg_comm_op *op)
{
    size_t n = op->n;
    if (g_det) {
        memcpy(op->buf, op->gather, n * sizeof(float));
        for (int r = 1; r < g_size; r++) {
            const float *src = op->gather + (size_t)r * n;
            for (size_t k = 0; k < n; k++)
                op->buf[k] += src[k];
        }
    }
    if (op->sumsq) {
        double sq = 0;
        for (size_t k = 0; k < n; k++)
            sq += (double)op->buf[k] * op->buf[k];
        *op->sumsq = sq;
    }
    op->t1 = now();
    op->state = OP_DONE;
    g_completed = 1;
    flight_remove(op);
}

/* Ring all-reduce over R ranks: the buffer in R chunks; R-1 steps of
 * reduce-scatter (receive chunk c from the left neighbour, add it to ours,
 * pass it on) leave each rank one fully summed chunk, R-1 steps of
 * all-gather pass the sums around. Each rank sends 2(R-1)/R of the buffer:
 * the bandwidth-optimal schedule, with plain point-to-point messages that
 * Open MPI's TCP transport streams at the link's speed (its MPI_Iallreduce
 * over TCP moved large buffers at a third of that here). */
static void chunk(size_t n, int i, size_t *off, size_t *cnt)
{
    size_t q = n / (size_t)g_size, r = n % (size_t)g_size;
    *cnt = q + ((size_t)i < r);
    *off = (size_t)i * q + CLG_MIN((size_t)i, r);
}

static int ring_post(clg_comm_op *op)
{
    int R = g_size, r = g_rank, s = op->step;
    int sc, rc; /* chunks sent and received in this step */
    if (s < R - 1) {
        sc = ((r - s) % R + R) % R;
        rc = ((r - s - 1) % R + R) % R;
    } else {
        int t = s - (R - 1);
        sc = ((r + 1 - t) % R + R) % R;
        rc = ((r - t) % R + R) % R;
    }
    size_t so, sn, ro, rn;
    chunk(op->n, sc, &so, &sn);
    chunk(op->n, rc, &ro, &rn);
    float *dst = s < R - 1 ? op->tmp : op->buf + ro;
    int e = MPI_Irecv(dst, (int)rn, MPI_FLOAT, (r - 1 + R) % R, 21, op->comm, &op->rq[0]);
    if (e == MPI_SUCCESS)
        e = MPI_Isend(op->buf + so, (int)sn, MPI_FLOAT, (r + 1) % R, 21, op->comm, &op->rq[1]);
    return e;
}

static void fail_op(clg_comm_op *op, const char *call, int e)
{
    char s[120];
    mpi_msg(e, s, sizeof s);
    snprintf(op->msg, sizeof op->msg, "%s: %s", call, s);
    op->state = OP_FAILED;
    flight_remove(op);
}

/* Advances the ring as far as the messages have arrived (g_mu held). */
static void ring_test(clg_comm_op *op)
{
    int R = g_size;
    for (;;) {
        int flag = 0;
        int e = MPI_Testall(2, op->rq, &flag, MPI_STATUSES_IGNORE);
        if (e != MPI_SUCCESS) {
            fail_op(op, "MPI_Testall (ring all-reduce)", e);
            return;
        }
        if (!flag)
            return;
        if (op->step < R - 1) { /* reduce-scatter: add the received chunk */
            int s = op->step, rc = ((g_rank - s - 1) % R + R) % R;
            size_t ro, rn;
            chunk(op->n, rc, &ro, &rn);
            float *dst = op->buf + ro;
            for (size_t k = 0; k < rn; k++)
                dst[k] += op->tmp[k];
        }
        if (++op->step == 2 * (R - 1)) {
            complete(op);
            return;
        }
        if ((e = ring_post(op)) != MPI_SUCCESS) {
            fail_op(op, "MPI_Isend/Irecv (ring all-reduce)", e);
            return;
        }
    }
}

/* One MPI_Test of the op (g_mu held). */
static void test_op(clg_comm_op *op)
{
    if (op->state != OP_FLIGHT)
        return;
    if (op->ring) {
        ring_test(op);
        return;
    }
    int flag = 0;
    int e = MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
    if (e != MPI_SUCCESS) {
        char s[120];
        mpi_msg(e, s, sizeof s);
        snprintf(op->msg, sizeof op->msg, "MPI_Test: %s", s);
        op->state = OP_FAILED;
        flight_remove(op);
    } else if (flag) {
        complete(op);
    }
}

clg_status clg_comm_op_create(clg_err *err, const char *what, clg_comm_op **out)
{
    *out = NULL;
    if (g_size < 2)
        return CLG_OK;
    clg_comm_op *op = calloc(1, sizeof *op);
    if (!op)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    snprintf(op->what, sizeof op->what, "%s", what);
    op->req = op->rq[0] = op->rq[1] = MPI_REQUEST_NULL;
    pthread_mutex_lock(&g_mu);
    int e = MPI_Comm_dup(g_main, &op->comm);
    if (e == MPI_SUCCESS)
        MPI_Comm_set_errhandler(op->comm, MPI_ERRORS_RETURN);
    pthread_mutex_unlock(&g_mu);
    if (e != MPI_SUCCESS) {
        free(op);
        return mpi_fail(err, e, "MPI_Comm_dup");
    }
    *out = op;
    return CLG_OK;
}

void clg_comm_op_free(clg_comm_op *op)
{
    if (!op)
        return;
    pthread_mutex_lock(&g_mu);
    flight_remove(op);
    if (!g_failed) { /* after a failure the job ends: a stuck request cannot be freed */
        if (op->req != MPI_REQUEST_NULL)
            MPI_Wait(&op->req, MPI_STATUS_IGNORE);
        MPI_Waitall(2, op->rq, MPI_STATUSES_IGNORE);
        MPI_Comm_free(&op->comm);
    }
    pthread_mutex_unlock(&g_mu);
    free(op->gather);
    free(op->tmp);
    free(op);
}

void clg_comm_op_start(clg_comm_op *op, float *buf, size_t n, double *sumsq)
{
    if (!op)
        return;
    pthread_mutex_lock(&g_mu);
    op->buf = buf;
    op->n = n;
    op->sumsq = sumsq;
    op->t0 = now();
    op->t1 = op->t0;
    op->msg[0] = 0;
    op->ring = 0;
    int e = MPI_SUCCESS;
    if (n > (size_t)INT_MAX) {
        snprintf(op->msg, sizeof op->msg, "%zu floats exceed one MPI message (use a smaller --bucket-mb)", n);
        op->state = OP_FAILED;
    } else if (g_det) {
        size_t need = n * (size_t)g_size;
        if (need > op->gather_cap) {
            float *g = realloc(op->gather, need * sizeof(float));
            if (!g) {
                snprintf(op->msg, sizeof op->msg, "out of memory for the rank-ordered reduction (%zu floats)", need);
                op->state = OP_FAILED;
            } else {
                op->gather = g;
                op->gather_cap = need;
            }
        }
        if (!op->msg[0])
            e = MPI_Iallgather(buf, (int)n, MPI_FLOAT, op->gather, (int)n, MPI_FLOAT, op->comm, &op->req);
    } else if (g_use_mpi_iallreduce) {
        e = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, op->comm, &op->req);
    } else {
        size_t need = n / (size_t)g_size + 1;
        if (need > op->tmp_cap) {
            float *t = realloc(op->tmp, need * sizeof(float));
            if (!t) {
                snprintf(op->msg, sizeof op->msg, "out of memory for the ring all-reduce (%zu floats)", need);
                op->state = OP_FAILED;
            } else {
                op->tmp = t;
                op->tmp_cap = need;
            }
        }
        op->ring = 1;
        op->step = 0;
        op->rq[0] = op->rq[1] = MPI_REQUEST_NULL;
        if (!op->msg[0])
            e = ring_post(op);
    }
    if (!op->msg[0] && e != MPI_SUCCESS) {
        char s[120];
        mpi_msg(e, s, sizeof s);
        snprintf(op->msg, sizeof op->msg, "%s: %s",
                 g_det ? "MPI_Iallgather" : op->ring ? "MPI_Isend/Irecv (ring all-reduce)" : "MPI_Iallreduce", s);
        op->state = OP_FAILED;
    } else if (!op->msg[0]) {
        op->state = OP_FLIGHT;
        if (g_nflight < MAX_INFLIGHT)
            g_flight[g_nflight++] = op;
        test_op(op); /* small messages are often done at once */
    }
    pthread_mutex_unlock(&g_mu);
}

void clg_comm_progress(void)
{
    if (g_size < 2)
        return;
    pthread_mutex_lock(&g_mu);
    for (int i = g_nflight - 1; i >= 0; i--)
        if (i < g_nflight)
            test_op(g_flight[i]);
    pthread_mutex_unlock(&g_mu);
}

clg_status clg_comm_op_wait(clg_err *err, clg_comm_op *op)
{
    if (!op)
        return CLG_OK;
    double t0 = now();
    int us = 10;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        test_op(op);
        int st = op->state, failed = g_failed;
        if (st == OP_FLIGHT)
            serve_pings();
        pthread_mutex_unlock(&g_mu);
        if (st == OP_DONE || st == OP_IDLE)
            return CLG_OK;
        if (st == OP_FAILED)
            return clg_err_set(err, CLG_ERR_MPI, "rank %d of %d: %s: %s", g_rank, g_size, op->what, op->msg);
        if (failed)
            return clg_err_set(err, CLG_ERR_MPI, "%s", g_fail_msg);
        double lim = limit_now();
        if (now() - t0 > lim)
            return timed_out(err, op->what, lim);
        nap(&us, t0);
    }
}

void clg_comm_op_times(const clg_comm_op *op, double *t0, double *t1)
{
    *t0 = op ? op->t0 : 0;
    *t1 = op ? op->t1 : 0;
}

/* Waits for a request of the main thread (polled, with the timeout). */
static clg_status wait_req(clg_err *err, MPI_Request *req, const char *what)
{
    double t0 = now();
    int us = 10;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        int flag = 0, e = MPI_Test(req, &flag, MPI_STATUS_IGNORE), failed = g_failed;
        if (e == MPI_SUCCESS && !flag)
            serve_pings();
        pthread_mutex_unlock(&g_mu);
        if (e != MPI_SUCCESS)
            return mpi_fail(err, e, what);
        if (flag) {
            g_completed = 1;
            return CLG_OK;
        }
        if (failed)
            return clg_err_set(err, CLG_ERR_MPI, "%s", g_fail_msg);
        double lim = limit_now();
        if (now() - t0 > lim)
            return timed_out(err, what, lim);
        nap(&us, t0);
    }
}

clg_status clg_comm_allreduce_f64(clg_err *err, double *v, int n, const char *what)
{
    if (g_size < 2)
        return CLG_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    clg_status st = CLG_OK;
    double *all = NULL;
    pthread_mutex_lock(&g_mu);
    int e;
    if (g_det) { /* rank order, as the gradients */
        all = malloc((size_t)n * g_size * sizeof(double));
        e = all ? MPI_Iallgather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, g_main, &req) : MPI_ERR_NO_MEM;
    } else {
        e = MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, g_main, &req);
    }
    pthread_mutex_unlock(&g_mu);
    if (e != MPI_SUCCESS)
        st = mpi_fail(err, e, what);
    if (st == CLG_OK)
        st = wait_req(err, &req, what);
    if (st == CLG_OK && all)
        for (int k = 0; k < n; k++) {
            double acc = all[k];
            for (int r = 1; r < g_size; r++)
                acc += all[(size_t)r * n + k];
            v[k] = acc;
        }
    free(all);
    return st;
}

clg_status clg_comm_barrier(clg_err *err, const char *what)
{
    if (g_size < 2)
        return CLG_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    pthread_mutex_lock(&g_mu);
    int e = MPI_Ibarrier(g_main, &req);
    pthread_mutex_unlock(&g_mu);
    if (e != MPI_SUCCESS)
        return mpi_fail(err, e, what);
    return wait_req(err, &req, what);
}

clg_status clg_comm_allreduce_f32(clg_err *err, float *buf, size_t n, const char *what)
{
    if (g_size < 2)
        return CLG_OK;
    static clg_comm_op *op = NULL; /* the benchmark's channel (main thread only) */
    if (!op) {
        clg_status st = clg_comm_op_create(err, what, &op);
        if (st != CLG_OK)
            return st;
    }
    clg_comm_op_start(op, buf, n, NULL);
    return clg_comm_op_wait(err, op);
}

clg_status clg_comm_pingpong(clg_err *err, void *buf, size_t bytes, int reps, double *gbs)
{
    *gbs = 0;
    if (g_size < 2 || g_rank > 1)
        return clg_comm_barrier(err, "ping-pong barrier");
    if (bytes > (size_t)INT_MAX)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "ping-pong of %zu bytes: too large for one message", bytes);
    double best = 1e30;
    int peer = 1 - g_rank;
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        for (int leg = 0; leg < 2; leg++) {
            MPI_Request req = MPI_REQUEST_NULL;
            int sending = (leg == 0) == (g_rank == 0);
            pthread_mutex_lock(&g_mu);
            int e = sending ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, 11, g_main, &req)
                            : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, 11, g_main, &req);
            pthread_mutex_unlock(&g_mu);
            if (e != MPI_SUCCESS)
                return mpi_fail(err, e, sending ? "MPI_Isend" : "MPI_Irecv");
            CLG_TRY_COMM(wait_req(err, &req, "ping-pong"));
        }
        double rt = now() - t0;
        if (rt < best)
            best = rt;
    }
    *gbs = bytes / (best / 2) / 1e9;
    return clg_comm_barrier(err, "ping-pong barrier");
}

#else /* no MPI: one rank */

const char *clg_comm_algorithm(void) { return g_det ? "rank-ordered" : "none (one rank)"; }

struct clg_comm_op {
    int unused;
};

clg_status clg_comm_init(const clg_options *opts, clg_err *err)
{
    CLG_UNUSED(opts);
    int n = 0;
    if (clg_opts_mpi_launcher(&n) && n > 1) /* each process would train alone, all writing the same files */
        return clg_err_set(err, CLG_ERR_MPI,
                           "started by mpirun with %d ranks, but clgrad was built without MPI (meson feature 'mpi'; "
                           "Debian: libopenmpi-dev)",
                           n);
    return CLG_OK;
}
void clg_comm_finalize(int rc) { CLG_UNUSED(rc); }
clg_status clg_comm_op_create(clg_err *err, const char *what, clg_comm_op **out)
{
    CLG_UNUSED(err);
    CLG_UNUSED(what);
    *out = NULL;
    return CLG_OK;
}
void clg_comm_op_free(clg_comm_op *op) { CLG_UNUSED(op); }
void clg_comm_op_start(clg_comm_op *op, float *buf, size_t n, double *sumsq)
{
    CLG_UNUSED(op);
    CLG_UNUSED(buf);
    CLG_UNUSED(n);
    CLG_UNUSED(sumsq);
}
clg_status clg_comm_op_wait(clg_err *err, clg_comm_op *op)
{
    CLG_UNUSED(err);
    CLG_UNUSED(op);
    return CLG_OK;
}
void clg_comm_op_times(const clg_comm_op *op, double *t0, double *t1)
{
    CLG_UNUSED(op);
    *t0 = *t1 = 0;
}
void clg_comm_progress(void) {}
clg_status clg_comm_allreduce_f64(clg_err *err, double *v, int n, const char *what)
{
    CLG_UNUSED(err);
    CLG_UNUSED(v);
    CLG_UNUSED(n);
    CLG_UNUSED(what);
    return CLG_OK;
}
clg_status clg_comm_barrier(clg_err *err, const char *what)
{
    CLG_UNUSED(err);
    CLG_UNUSED(what);
    return CLG_OK;
}
clg_status clg_comm_allreduce_f32(clg_err *err, float *buf, size_t n, const char *what)
{
    CLG_UNUSED(err);
    CLG_UNUSED(buf);
    CLG_UNUSED(n);
    CLG_UNUSED(what);
    return CLG_OK;
}
clg_status clg_comm_pingpong(clg_err *err, void *buf, size_t bytes, int reps, double *gbs)
{
    CLG_UNUSED(err);
    CLG_UNUSED(buf);
    CLG_UNUSED(bytes);
    CLG_UNUSED(reps);
    *gbs = 0;
    return CLG_OK;
}

#endif
