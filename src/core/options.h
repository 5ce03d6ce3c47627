/* Settings of the library: one table (CLG_OPTIONS) of every option with its
 * environment variable, type, default, range or choices, kind and a line of
 * documentation. The values of one context live in a clg_opts (ctx->opts):
 * defaults, then what the caller set (clg_options on clg_ctx_params), then,
 * for options the caller left alone, the environment, read once by
 * clg_ctx_create (clg_opts_read_env). Code reads the fields, never the
 * environment: options.c is the only file of src/ that calls getenv. */
#ifndef CLG_OPTIONS_H
#define CLG_OPTIONS_H

#include "core/core.h"

/* X(name, ENV, TYPE, "default", lo, hi, "choices", KIND, "doc")
 *   TYPE: BOOL (0/1; also no/yes, off/on, false/true), INT (lo..hi), DOUBLE
 *         (lo..hi), STR (free text, at most CLG_OPT_STR_MAX - 1 bytes; lo 1: must not
 *         be empty, and an empty environment variable is refused, not ignored), CHOICE
 *         (one of the comma-separated choices; the field holds its index).
 *   KIND: USER (documented, read from the environment), TUNING (a tuning or
 *         measurement aid, read from the environment), TEST (a test aid: set
 *         through clg_options / clg_ctx_option_set only, never the environment). */
#define CLG_OPTIONS(X)                                                                                               \
    X(devices, "CLGRAD_DEVICES", STR, "all", 1, 0, "", USER,                                                         \
      "device selector when clg_ctx_params.devices is NULL: all, gpu, cpu, accelerator, 0,2 or name:SUBSTRING")      \
    X(cache, "CLGRAD_CACHE", CHOICE, "1", 0, 0, "1,0,ro", USER,                                                      \
      "program binary and tuning caches: 1 on, 0 off, ro read only (never written)")                                 \
    X(cache_dir, "CLGRAD_CACHE_DIR", STR, "", 0, 0, "", USER,                                                        \
      "cache directory; empty: $XDG_CACHE_HOME/clgrad, else $HOME/.cache/clgrad")                                    \
    X(kernel_dir, "CLGRAD_KERNEL_DIR", STR, "", 0, 0, "", USER,                                                      \
      "directory of .cl sources used instead of the embedded ones (kernel development)")                             \
    X(shared_context, "CLGRAD_SHARED_CONTEXT", BOOL, "1", 0, 1, "", USER,                                            \
      "devices of one platform share one cl_context (0: one context per device)")                                    \
    X(fp16, "CLGRAD_FP16", CHOICE, "auto", 0, 0, "auto,0,1", USER,                                                   \
      "half arithmetic: auto from cl_khr_fp16; 0 storage only (vload_half); 1 as if the extension were reported")    \
    X(data_dir, "CLGRAD_DATA_DIR", STR, "", 0, 0, "", USER,                                                          \
      "first directory searched for the named datasets (mnist, fashion-mnist, cifar10)")                             \
    X(model_dir, "CLGRAD_MODEL_DIR", STR, "", 0, 0, "", USER,                                                        \
      "first directory searched for shipped models given by name")                                                   \
    X(profile, "CLGRAD_PROFILE", BOOL, "0", 0, 1, "", USER,                                                          \
      "time every layer's forward and backward pass (kernel time from events)")                                      \
    X(gemm_backend, "CLGRAD_GEMM_BACKEND", CHOICE, "auto", 0, 0, "auto,own,clblast,ref", USER,                       \
      "matrix products: own kernels, CLBlast, the faster of both per shape (auto), or the reference kernel")         \
    X(dp_reduce, "CLGRAD_DP_REDUCE", CHOICE, "auto", 0, 0, "auto,host,device", USER,                                 \
      "gradient sum of lanes sharing a cl_context: on the host, on a device, or the faster (overrides the model's)") \
    X(dp_caller_lane, "CLGRAD_DP_CALLER_LANE", BOOL, "1", 0, 1, "", TUNING,                                          \
      "data parallelism: the calling thread drives device lane 0 (0: a host thread of its own for every lane)")      \
    X(dp_spin_us, "CLGRAD_DP_SPIN_US", INT, "200", 0, 1000000, "", TUNING,                                          \
      "data parallelism: microseconds a lane waiting for another spins (yielding) before it sleeps, where the lanes " \
      "compute in their own threads with a core each (0: sleep at once)")                                            \
    X(pipe_wdefer, "CLGRAD_PIPE_WDEFER", CHOICE, "auto", 0, 0, "auto,0,1,step", TUNING,                              \
      "pipeline: dense weight gradients after a stage's schedule (1: per micro-batch; step: one product; auto: 0)")\
    X(pipe_wlate, "CLGRAD_PIPE_WLATE", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                    \
      "pipeline: a stage sends its input gradients before its weight gradients (the same bits; auto: 1)")          \
    X(pipe_cost_memory, "CLGRAD_PIPE_COST_MEMORY", BOOL, "1", 0, 1, "", TUNING,                                    \
      "pipeline: the default partition uses the least costs of this and earlier runs and their stage balance")     \
    X(allreduce, "CLGRAD_ALLREDUCE", CHOICE, "ring", 0, 0, "ring,mpi", USER,                                         \
      "under mpirun: clgrad's ring all-reduce or MPI_Iallreduce")                                                    \
    X(precompile, "CLGRAD_PRECOMPILE", CHOICE, "auto", 0, 0, "auto,0,1", USER,                                       \
      "clgrad train: a helper process compiles the model's programs: auto on a cold cache of PoCL devices, 0, 1")    \
    X(background_tune, "CLGRAD_BACKGROUND_TUNE", CHOICE, "auto", 0, 0, "auto,off,quick", USER,                      \
      "clgrad train: GEMM shapes run without own tuning are tuned after the run by a detached idle-priority helper " \
      "(auto: quick then full search; quick: the quick search only)")                                               \
    X(background_tune_wait, "CLGRAD_BACKGROUND_TUNE_WAIT", INT, "600", 0, 86400, "", TUNING,                         \
      "background tuner: at most this many seconds waiting for quiet CPUs (< 25% busy) before each class (0: none)") \
    X(binary_cache, "CLGRAD_BINARY_CACHE", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                 \
      "on-disk program binaries: auto (PoCL: stored at context end), 0 off, 1 stored when built")                   \
    X(wg_canon, "CLGRAD_WG_CANON", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                         \
      "pad launches to canonical work-group sizes: auto on CPU devices, 0 never, 1 on every device")                 \
    X(gemm_unpacked, "CLGRAD_GEMM_UNPACKED", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                               \
      "CPU products without packing: auto by shape, 0 never, 1 wherever the kernels apply")                          \
    X(gemm_splitk, "CLGRAD_GEMM_SPLITK", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                   \
      "split-K GEMM for long-K, small-output products: auto by shape and compute units, 0 never, 1 always")          \
    X(act_arena, "CLGRAD_ACT_ARENA", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                       \
      "fp16 activations as sub-buffers of one arena: auto (not on NVIDIA's driver), 0 separate buffers, 1 always")   \
    X(gemm_auto_measure, "CLGRAD_GEMM_AUTO_MEASURE", BOOL, "1", 0, 1, "", TUNING,                                    \
      "gemm_backend auto measures both backends per shape (0: takes the stored or default choice)")                  \
    X(conv_auto_measure, "CLGRAD_CONV_AUTO_MEASURE", BOOL, "1", 0, 1, "", TUNING,                                    \
      "automatic convolution algorithm measured per shape (0: the per-device default, no timing)")                   \
    X(conv_auto_defer, "CLGRAD_CONV_AUTO_DEFER", INT, "0", 0, 1000, "", TUNING,                                      \
      "uses of a new convolution shape run with the default algorithm before it is measured")                        \
    X(conv_wino4_auto, "CLGRAD_CONV_WINO4_AUTO", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                           \
      "Winograd F(4x4) among the automatic candidates: auto within its error policy, 0 never, 1 always")             \
    X(conv_chunk_floats, "CLGRAD_CONV_CHUNK_FLOATS", INT, "1048576", 1, 2147483647, "", TUNING,                      \
      "separate Winograd: transform workspace budget per chunk of images, in floats")                                \
    X(conv_legacy, "CLGRAD_CONV_LEGACY", BOOL, "0", 0, 1, "", TUNING,                                                \
      "row-per-work-item im2col and the generic col2im (A/B timing of the element-wise kernels)")                    \
    X(conv_profile, "CLGRAD_CONV_PROFILE", BOOL, "0", 0, 1, "", TUNING,                                              \
      "print the time of each convolution step to stderr (finishes the queue after each)")                           \
    X(djit_fwd, "CLGRAD_DJIT_FWD", CHOICE, "auto", 0, 0, "auto,q,k", TUNING,                                         \
      "direct convolution design: auto by shape, q row vectors, k output-channel vectors (forward; "               \
      "k also runs strided backward-data by stride phases)")                                                         \
    X(wfused_nt, "CLGRAD_WFUSED_NT", INT, "2", 1, 4, "", TUNING, "fused Winograd: tiles per work-item")               \
    X(wfused_kb, "CLGRAD_WFUSED_KB", CHOICE, "auto", 0, 0, "auto,1,2,4,8,16", TUNING,                                \
      "fused Winograd: output channels per register block (auto: 8, fewer for narrow layers)")                       \
    X(wfused_wgs, "CLGRAD_WFUSED_WGS", INT, "1", 1, 256, "", TUNING,                                                 \
      "fused Winograd: work-group size (capped at the device's)")                                                    \
    X(wfused_scratch_kb, "CLGRAD_WFUSED_SCRATCH_KB", INT, "256", 8, 1048576, "", TUNING,                             \
      "fused Winograd: scratch budget per work-item, KiB")                                                           \
    X(wfused_xopts, "CLGRAD_WFUSED_XOPTS", STR, "", 0, 0, "", TUNING,                                                \
      "fused Winograd: extra program build options (experiments)")                                                   \
    X(bn_fuse, "CLGRAD_BN_FUSE", BOOL, "1", 0, 1, "", TUNING,                                                        \
      "a batch norm computes the relu (and residual add + relu) after it in one pass (0: separate layers)")          \
    X(relu_pool_fold, "CLGRAD_RELU_POOL_FOLD", BOOL, "1", 0, 1, "", TUNING,                                          \
      "a 2x2 max pool after a relu convolution applies the relu's derivative in its backward pass (0: the "          \
      "convolution does)")                                                                                           \
    X(bn_rows, "CLGRAD_BN_ROWS", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                           \
      "batch norm kernels with one work-item per (image, channel) row: auto on CPU devices, 0 never, 1 always")      \
    X(hugepages, "CLGRAD_HUGEPAGES", CHOICE, "auto", 0, 0, "auto,0,1", TUNING,                                       \
      "pooled device buffers of 2 MiB or more in host memory the kernel may back with transparent huge pages "     \
      "(Linux, CPU devices): auto on PoCL, 0 never, 1 on every CPU device")                                          \
    X(optim_per_tensor, "CLGRAD_OPTIM_PER_TENSOR", BOOL, "0", 0, 1, "", TUNING,                                      \
      "optimizer: one launch per parameter tensor instead of one over the parameter arena")                          \
    X(comm_poll_us, "CLGRAD_COMM_POLL_US", INT, "200", 1, 1000000, "", TUNING,                                       \
      "under mpirun: longest sleep between two polls of a pending transfer, microseconds")                           \
    X(comm_spin_s, "CLGRAD_COMM_SPIN_S", DOUBLE, "0.02", 0, 3600, "", TUNING,                                        \
      "under mpirun: seconds a wait spins (yielding) before it sleeps")                                              \
    X(test_dp_spin, "CLGRAD_TEST_DP_SPIN", BOOL, "0", 0, 1, "", TEST,                                               \
      "data-parallel waits spin (dp_spin_us) whatever the devices (tests of the spinning waits)")                    \
    X(test_slow_lane, "CLGRAD_TEST_SLOW_LANE", STR, "", 0, 0, "", TEST,                                              \
      "LANE:FACTOR: that data-parallel lane reports FACTOR times its measured time (split tests)")                   \
    X(fp16_scale_interval, "CLGRAD_FP16_SCALE_INTERVAL", INT, "0", 0, 1000000000, "", TEST,                          \
      "fp16 loss scale: good steps before it grows (0: the built-in interval)")                                      \
    X(device_mem_limit, "CLGRAD_DEVICE_MEM_LIMIT", DOUBLE, "0", 0, 1e9, "", TUNING,                                  \
      "cap on each device's memory in MiB (buffer pool and arenas; refusals name the device; 0: none)")

#define CLG_OPT_STR_MAX 1024

typedef enum clg_opt_type { CLG_OPT_BOOL, CLG_OPT_INT, CLG_OPT_DOUBLE, CLG_OPT_STR, CLG_OPT_CHOICE } clg_opt_type;
typedef enum clg_opt_kind { CLG_OPT_USER, CLG_OPT_TUNING, CLG_OPT_TEST } clg_opt_kind;

typedef enum clg_opt_id {
#define CLG_X_ID(name, env, type, def, lo, hi, choices, kind, doc) CLG_OPT_ID_##name,
    CLG_OPTIONS(CLG_X_ID)
#undef CLG_X_ID
        CLG_OPT_COUNT
} clg_opt_id;

/* One field per option: long for BOOL, INT and CHOICE (the choice's index),
 * double for DOUBLE, a NUL-terminated string for STR. */
#define CLG_OPT_FIELD_BOOL(n) long n;
#define CLG_OPT_FIELD_INT(n) long n;
#define CLG_OPT_FIELD_CHOICE(n) long n;
#define CLG_OPT_FIELD_DOUBLE(n) double n;
#define CLG_OPT_FIELD_STR(n) char n[CLG_OPT_STR_MAX];
/* The public handle clg_options (include/clgrad.h) is this struct. */
struct clg_options {
    size_t size; /* sizeof(clg_opts): the struct's version */
#define CLG_X_FIELD(name, env, type, def, lo, hi, choices, kind, doc) CLG_OPT_FIELD_##type(name)
    CLG_OPTIONS(CLG_X_FIELD)
#undef CLG_X_FIELD
    unsigned char source[CLG_OPT_COUNT]; /* clg_option_source of each value */
};
typedef struct clg_options clg_opts;

/* Static description of one option (the table's row). */
typedef struct clg_opt_desc {
    const char *name, *env;
    clg_opt_type type;
    const char *def;
    double lo, hi;
    const char *choices; /* comma-separated (CHOICE) */
    clg_opt_kind kind;
    const char *doc;
} clg_opt_desc;

CLG_INTERNAL const clg_opt_desc *clg_opt_desc_of(int id);
/* Index of the option called name (its snake_case name), or -1. */
CLG_INTERNAL int clg_opt_find(const char *name);
CLG_INTERNAL const char *clg_opt_type_name(clg_opt_type t);
CLG_INTERNAL const char *clg_opt_kind_name(clg_opt_kind k);

/* Every option at its default, source CLG_OPTION_DEFAULT. */
CLG_INTERNAL void clg_opts_init(clg_opts *o);
/* Parses value for option id into o with source src. A refusal names the
 * option and what it accepts, e.g. "option gemm_backend: 'foo' is not one
 * of auto, own, clblast, ref". o is unchanged on failure. */
CLG_INTERNAL clg_status clg_opts_set_id(clg_opts *o, int id, const char *value, clg_option_source src, clg_err *err);
/* The same by name; an unknown name is CLG_ERR_INVALID_ARG naming it. */
CLG_INTERNAL clg_status clg_opts_set(clg_opts *o, const char *name, const char *value, clg_option_source src,
                                     clg_err *err);
/* Reads the environment variable of every USER and TUNING option still at
 * its default (empty variables count as unset). A bad value is refused,
 * naming the variable and the option. */
CLG_INTERNAL clg_status clg_opts_read_env(clg_opts *o, clg_err *err);
/* The same for option id alone: for the calls that have no context
 * (clg_model_find, clg_dataset_open, MPI start-up), read when they run. */
CLG_INTERNAL clg_status clg_opts_read_env_one(clg_opts *o, int id, clg_err *err);
/* The value of option id as text (bools 0/1, choices by name). */
CLG_INTERNAL void clg_opts_format(const clg_opts *o, int id, char *buf, size_t n);
/* The default cache directory: $XDG_CACHE_HOME/clgrad, else $HOME/.cache/clgrad (else /tmp/...). */
CLG_INTERNAL void clg_opts_default_cache_dir(char *dst, size_t n);
/* 1 when the process was started by an MPI launcher (mpirun's variables),
 * with its world size in *size (0 when not told). */
CLG_INTERNAL int clg_opts_mpi_launcher(int *size);

#endif
