/* Shared by the parallel-training tests (test_dp, test_shard, test_pipe,
 * test_pipe_split, test_tp, test_tp_combos, test_pptp): models, synthetic data, a
 * run's parameters on the host and their comparison, device checks, main. */
#ifndef CLG_TESTS_TRAIN_TESTUTIL_H
#define CLG_TESTS_TRAIN_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "testutil.h"
#include "train/session.h"

#define TT_MAX_TENSORS 64

/* The test program's context, made on first use (inside a test when fixed:
 * tu_ctx_fixed(0), else tu_ctx(NULL)); tt_run_suite destroys it. */
clg_ctx *tt_ctx(int fixed);
/* tu_run(s), then destroys tt_ctx's context: main's exit status. */
int tt_run_suite(Suite *s);

/* main's check: the number of OpenCL devices a context sees when need or
 * more, else 0 after "prog: needs N OpenCL devices (POCL_DEVICES=...)". */
int tt_devices(const char *prog, int need);
/* tt_devices(prog, 2) != 0. */
int tt_two_devices(const char *prog);
/* 1 when ctx has four devices or more, else 0 after "what: skipped (needs
 * four devices; test TEST has them)". */
int tt_four_devices(clg_ctx *ctx, const char *what, const char *test);

/* The text of models/NAME of the source tree (malloc'd). */
char *tt_read_model(const char *name);

/* An MLP 784-256-256-10 with separate [activation] and [dropout] layers
 * (fc1, relu1, drop1 p = 0.25, fc2, relu2, fc3), SGD (momentum, weight
 * decay) or Adam; a static buffer. */
const char *tt_mlp_text(int adam);
/* Three 3x3 convolutions of 8 filters on 28x28 (conv1 relu, max pool,
 * dropout; conv2 relu, max pool; conv3 fused relu), flattened into a dense
 * output layer fc of 10 classes; SGD. */
extern const char *const tt_cnn_text;

/* n samples of `sample` floats, class k in 0..9: noise in [0, 1) with the
 * k-th tenth of the sample brighter by 0.5. */
void tt_synth_bands(clg_rng *rng, float *x, int32_t *y, int n, size_t sample);
/* n c x h x w samples, class k in 0..3: noise with quadrant k brighter by 0.5. */
void tt_synth_quadrants(clg_rng *rng, float *x, int32_t *y, int n, int c, int h, int w);

/* steps more training steps of the session m (batch samples each, from
 * tt_synth_bands on the stream rng, learning rate lr); per step its loss
 * and the loss scale after it into loss and scale (each may be NULL). */
void tt_train(clg_model *m, clg_rng *rng, int steps, int batch, double lr, double *loss, double *scale);

/* Host copies of a run's parameter tensors. */
typedef struct tt_weights {
    int n;
    float *v[TT_MAX_TENSORS];
    size_t numel[TT_MAX_TENSORS];
    char name[TT_MAX_TENSORS][128];
} tt_weights;

void tt_weights_free(tt_weights *w);
/* A host copy of the n floats of mem on dev (poisoned before the read). */
float *tt_fetch(clg_device *dev, cl_mem mem, size_t n);
/* Every parameter of replica r (fp16: the fp32 masters) appended to w,
 * named LAYER.PARAM. */
void tt_grab_replica(const clg_replica *r, tt_weights *w);
/* tt_grab_replica of the session's whole network (pipeline, tp: gathered
 * from the stages and lanes). */
void tt_grab_session(clg_model *m, tt_weights *w);

/* Two tensor-parallel lanes a and b of layers first..last (role: CLG_TP_*
 * per layer; b not its group's first lane): the replicated parameters
 * bitwise equal, b's row-split biases zero. The number of replicated
 * tensors compared. */
int tt_check_lanes(const clg_replica *a, const clg_replica *b, const int *role, int first, int last);

/* Relative L2 difference |a - b| / |b| of n floats (inf where non-finite). */
double tt_rel_l2(const float *a, const float *b, size_t n);
/* The worst tt_rel_l2 of a's tensors against b's (same count and sizes),
 * printed with what; each must be within tol (tol < 0: bitwise equal). */
double tt_compare(const tt_weights *a, const tt_weights *b, double tol, const char *what);
/* A session refused: st == want, the context's last error holds msg
 * (printed after "refused what: "). */
void tt_refused(clg_ctx *ctx, clg_status st, clg_status want, const char *what, const char *msg);

/* Every one of n losses of a within rel (+ 1e-5) of b's. */
void tt_compare_loss(const double *a, const double *b, int n, double rel, const char *what);

#endif
