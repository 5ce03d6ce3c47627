/* Communicator across processes (MPI ranks) for data parallelism over
 * machines. Every function works without MPI (Meson feature `mpi` off or not
 * found) and in a process not launched by mpirun: then it is the 1-rank
 * identity (rank 0 of 1, reductions leave the data as it is), so callers need
 * no #ifdefs.
 *
 * MPI is initialized by clg_comm_init only when the process runs under an MPI
 * launcher (OMPI_COMM_WORLD_SIZE or PMIX_RANK in the environment): a plain
 * `clgrad train` never touches MPI. Every MPI call goes through one lock
 * (MPI_THREAD_SERIALIZED is enough; lane threads and the main thread both
 * call in). Waits are polled with MPI_Test against a timeout (--comm-timeout,
 * default 60 s; ten times that until the first all-reduce has completed, which
 * covers every rank's kernel builds): a rank that died or hangs makes the others
 * fail with CLG_ERR_MPI and a message naming the ranks that no longer answer
 * (a ping on a private communicator, answered by every rank that is waiting).
 *
 * A clg_comm_op is one all-reduce channel with at most one reduction in flight
 * (its own communicator, so channels started from different threads in any
 * order never mismatch). Default mode: MPI_Iallreduce (sum). Deterministic
 * mode: every rank's data gathered (MPI_Iallgather) and summed in rank order,
 * the same on every rank and in every run. */
#ifndef CLG_PARALLEL_COMM_H
#define CLG_PARALLEL_COMM_H

#include "core/core.h"

/* Initializes MPI when launched by mpirun (idempotent; main thread only).
 * Returns CLG_ERR_MPI when MPI_Init fails or lacks thread support. Its
 * settings (options allreduce, comm_poll_us, comm_spin_s): opts (NULL: the
 * defaults), the environment for those left at their default. */
CLG_INTERNAL clg_status clg_comm_init(const clg_options *opts, clg_err *err);
/* Finalizes MPI when it was initialized (rc == 0), or aborts the whole job
 * (MPI_Abort with rc) when this process fails while others still run. */
CLG_INTERNAL void clg_comm_finalize(int rc);
CLG_INTERNAL int clg_comm_rank(void);
CLG_INTERNAL int clg_comm_size(void);
/* Options: the wait timeout in seconds (<= 0: the default 60) and the
 * deterministic (rank-ordered) reduction. */
CLG_INTERNAL void clg_comm_configure(double timeout_s, int deterministic);
CLG_INTERNAL int clg_comm_deterministic(void);
/* "ring", "MPI_Iallreduce" (CLGRAD_ALLREDUCE=mpi) or "rank-ordered" (deterministic). */
CLG_INTERNAL const char *clg_comm_algorithm(void);
CLG_INTERNAL double clg_comm_timeout(void);

/* This rank's slice [*off, *off + *cnt) of n items split over the ranks
 * (n / size each, the first n % size ranks one more). */
CLG_INTERNAL void clg_comm_slice(int n, int *off, int *cnt);

typedef struct clg_comm_op clg_comm_op;
/* A reduction channel (collective: every rank creates its channels in the
 * same order). *out stays NULL with one rank. */
CLG_INTERNAL clg_status clg_comm_op_create(clg_err *err, const char *what, clg_comm_op **out);
CLG_INTERNAL void clg_comm_op_free(clg_comm_op *op);
/* Starts the sum of buf[0..n) over the ranks, in place. sumsq (may be NULL)
 * receives the squared norm of the result when it completes. A failure is
 * reported by the wait. NULL op: nothing to do. Thread-safe. */
CLG_INTERNAL void clg_comm_op_start(clg_comm_op *op, float *buf, size_t n, double *sumsq);
/* Waits (polled, with the timeout) for the op's reduction; any number of
 * threads may wait for the same op. NULL op: CLG_OK. */
CLG_INTERNAL clg_status clg_comm_op_wait(clg_err *err, clg_comm_op *op);
/* Host seconds (clg_now_sec) when the op's last reduction started / completed. */
CLG_INTERNAL void clg_comm_op_times(const clg_comm_op *op, double *t0, double *t1);
/* Advances every reduction in flight (MPI progress); cheap, thread-safe. */
CLG_INTERNAL void clg_comm_progress(void);

/* Blocking sums over the ranks (main thread), with the timeout. */
CLG_INTERNAL clg_status clg_comm_allreduce_f64(clg_err *err, double *v, int n, const char *what);
CLG_INTERNAL clg_status clg_comm_barrier(clg_err *err, const char *what);
/* Bus bandwidth benchmark helper: one blocking all-reduce of n floats (sum),
 * as the training path does it (default or deterministic mode). */
CLG_INTERNAL clg_status clg_comm_allreduce_f32(clg_err *err, float *buf, size_t n, const char *what);
/* Link bandwidth: rank 0 sends bytes to rank 1 and back, reps times; *gbs
 * (rank 0): bytes / (best round trip / 2) in GB/s. Other ranks idle. */
CLG_INTERNAL clg_status clg_comm_pingpong(clg_err *err, void *buf, size_t bytes, int reps, double *gbs);

#endif
