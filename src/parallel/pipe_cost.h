/* The pipeline's creation-time measurements (per-layer costs for the
 * default partition, the transfer paths' times) remembered across runs in
 * the device's tuning database (<cache_dir>/tune/): each figure becomes the
 * least of this run's and every earlier run's on the same device, network
 * and micro-batch. Other processes' load only adds time, so the least is
 * the best estimate, and a run on a loaded machine no longer moves the cut
 * (or the cut inside a layer, or the transfer path) away from where the
 * unloaded figures put it. Off with a cache that is not used (CLGRAD_CACHE=0)
 * or option pipe_cost_memory=0. */
#ifndef CLG_PARALLEL_PIPE_COST_H
#define CLG_PARALLEL_PIPE_COST_H

#include "device/device.h"
#include "model/network.h"

/* cost[0..nlayers): this run's measured ms per layer (a micro-batch of mb; wdefer: dense weight products left
 * out), each replaced by the least measured on dev so far; the result remembered. */
CLG_INTERNAL void clg_pipe_cost_remember(clg_device *dev, const clg_net *net, int mb, int wdefer, double *cost);
/* The same for the two transfer paths' seconds of a tensor of the given bytes. */
CLG_INTERNAL void clg_pipe_xfer_remember(clg_device *dev, size_t bytes, double *t_dev, double *t_host);

/* The measured imbalance of a 2-stage pipeline cut inside a layer by default (pipe.c): the second stage's CPU
 * ms per micro-batch beyond the first's, less what the layer costs predicted (the concat, the late weight
 * gradients' launches, the step's end: work the one-device measurement does not see). get: the remembered
 * figure (0: none); put: a run's figure averaged into it. The default partition adds it to the second stage.
 * cut: the run's cut inside a layer (clg_pipe_split_auto's prev), remembered beside it (get: 0 when none). */
CLG_INTERNAL double clg_pipe_bias_get(clg_device *dev, const clg_net *net, int mb, int wdefer, int *cut);
CLG_INTERNAL void clg_pipe_bias_put(clg_device *dev, const clg_net *net, int mb, int wdefer, double ms, int cut);

#endif
