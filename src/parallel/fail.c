/* The first failure of a step among a team's threads (see fail.h). */
#include "parallel/fail.h"

void clg_fail_once(pthread_mutex_t *mu, pthread_cond_t *cv, int *abort, int *who, clg_status *status, int me,
                   clg_status rc)
{
    pthread_mutex_lock(mu);
    if (!*abort) {
        *abort = 1;
        *who = me;
        *status = rc;
    }
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

clg_status clg_fail_report(clg_err *err, clg_status rc, const char *where, const clg_device *dev)
{
    return clg_err_set(err, rc, "%s on device %d (%s): %s", where, dev->index, dev->info.name, dev->err.msg);
}
