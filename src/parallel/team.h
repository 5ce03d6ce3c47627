/* A team of host threads, one per lane, so every device is driven by its own
 * thread (PoCL's `basic` device, for one, runs kernels in the thread that
 * waits on its queue; a GPU driver overlaps either way). With one lane the
 * job runs inline on the caller's thread: the N = 1 case is the same code
 * without a thread hand-off. clg_team_create_ex(.., caller_lane0 = 1, ..)
 * runs lane 0 on the caller's thread too, inside clg_team_end (after what
 * the caller did between begin and end), and starts threads for lanes 1..
 * only: one host thread fewer competing for the cores and one hand-off
 * less per job (data parallelism on PoCL `basic`, where every lane thread
 * computes).
 *
 *   clg_team_begin(t, fn, arg);   // fn(arg, lane) starts on every lane
 *   ... the caller prepares the next batch ...
 *   st = clg_team_end(t);         // waits; the first failing lane's status
 */
#ifndef CLG_PARALLEL_TEAM_H
#define CLG_PARALLEL_TEAM_H

#include "core/core.h"

typedef struct clg_team clg_team;
typedef clg_status (*clg_team_fn)(void *arg, int lane);

CLG_INTERNAL clg_status clg_team_create(clg_err *err, int lanes, clg_team **out);
/* caller_lane0: lane 0 on the caller's thread (above). No spin at first
 * (clg_team_set_spin). */
CLG_INTERNAL clg_status clg_team_create_ex(clg_err *err, int lanes, int caller_lane0, clg_team **out);
/* Joins the threads. NULL is a no-op. */
CLG_INTERNAL void clg_team_free(clg_team *t);
CLG_INTERNAL void clg_team_begin(clg_team *t, clg_team_fn fn, void *arg);
/* Waits for every lane of the job begun last; returns CLG_OK or the status
 * of the lowest-numbered failing lane (*failed receives it, may be NULL). */
CLG_INTERNAL clg_status clg_team_end(clg_team *t, int *failed);
/* From the next wait on, a lane waiting for the next job and clg_team_end
 * waiting for the lanes first spin spin_us microseconds (yielding the
 * core) before they sleep on a condition variable (0: sleep at once). */
CLG_INTERNAL void clg_team_set_spin(clg_team *t, int spin_us);
/* The waits since the last call that ended within their spin (*hit) or slept (*miss). */
CLG_INTERNAL void clg_team_spin_take(clg_team *t, int *hit, int *miss);
/* Until pred(arg) holds, at most spin_us microseconds, yielding the core
 * between checks (pred reads its words with atomic loads); returns whether it
 * held. Then the caller waits on its condition variable as usual. */
CLG_INTERNAL int clg_spin_until(int (*pred)(const void *), const void *arg, int spin_us);
/* begin + end. */
CLG_INTERNAL clg_status clg_team_run(clg_team *t, clg_team_fn fn, void *arg, int *failed);

#endif
