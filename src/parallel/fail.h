/* The first failure of a step among the threads of a team (pipeline
 * stages, tensor-parallel lanes): recorded once, every waiter woken, and
 * the message that names where it happened.
 *
 *   if (rc != CLG_OK)   // on the failing thread
 *       clg_fail_once(&p->mu, &p->cv, &p->abort, &p->fail_stage, &p->fail_status, s, rc);
 *   ...                 // after the team: the recorded one's message
 *   clg_fail_report(&ctx->err, rc, "pipeline stage 1 (layers conv2..loss)", dev);
 */
#ifndef CLG_PARALLEL_FAIL_H
#define CLG_PARALLEL_FAIL_H

#include <pthread.h>

#include "device/device.h"

/* Under mu: when *abort is 0, sets it and records who = me and *status = rc
 * (a later failure of another thread, usually a consequence, is not
 * recorded); wakes every thread waiting on cv either way. */
CLG_INTERNAL void clg_fail_once(pthread_mutex_t *mu, pthread_cond_t *cv, int *abort, int *who, clg_status *status,
                                int me, clg_status rc);
/* Sets err to "<where> on device N (NAME): <the device's last error>" with
 * status rc and returns rc. */
CLG_INTERNAL clg_status clg_fail_report(clg_err *err, clg_status rc, const char *where, const clg_device *dev);

#endif
