/*
 * clgrad — a portable OpenCL deep-learning runtime.
 *
 * Overview
 *   A context (clg_ctx) owns one or more OpenCL devices, each with its own
 *   cl_context and in-order command queue. Kernels are JIT-compiled from the
 *   sources embedded in the library and their binaries cached on disk.
 *   Every fallible call returns a clg_status (CLG_OK == 0, errors < 0); the
 *   detail of the last failure is kept on the handle: clg_last_error(ctx).
 *   The library never exits or aborts on bad input.
 *
 * ABI
 *   Every params struct (clg_*_params) starts with `size_t size`, which its
 *   _init macro sets to the sizeof the application was compiled with; the
 *   library reads only the fields within that size and takes defaults for
 *   fields added later, so an application built against this header keeps
 *   working with later libraries of the same soname (CLG_ABI_VERSION).
 *   Always initialise a params struct with its _init macro. Calls that fill
 *   a struct (clg_device_info_get, clg_pool_stats_get, clg_model_metrics,
 *   clg_model_evaluate, clg_train_run, clg_bench_train) are macros that pass
 *   the caller's sizeof, and the library writes no more than that. Fields are
 *   only ever appended, each starting at or after the previous version's
 *   sizeof. The primitives API (clgrad_prim.h: GEMM, convolution,
 *   pooling, softmax on the caller's OpenCL queue and buffers) follows the
 *   same rule.
 *
 * Thread safety
 *   A context is used by one thread at a time. clg_status_string() and
 *   clg_version*() are safe from any thread.
 *
 * Example (built and run by tests/test_example_header.c):
 *
 *   #include <clgrad.h>
 *   #include <stdio.h>
 *   int main(void) {
 *       clg_ctx_params p;
 *       clg_ctx_params_init(&p);
 *       p.devices = "all";
 *       clg_ctx *ctx = NULL;
 *       clg_status st = clg_ctx_create(&p, &ctx);
 *       if (st != CLG_OK) {
 *           fprintf(stderr, "clgrad: %s\n", clg_last_error(NULL));
 *           return 1;
 *       }
 *       for (int i = 0; i < clg_device_count(ctx); i++) {
 *           clg_device_info info;
 *           if (clg_device_info_get(ctx, i, &info) == CLG_OK)
 *               printf("%d: %s (%s)\n", i, info.name, info.vendor);
 *       }
 *       clg_ctx_destroy(ctx);
 *       return 0;
 *   }
 */
#ifndef CLGRAD_H
#define CLGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CLG_API __declspec(dllexport)
#elif defined(__GNUC__)
#define CLG_API __attribute__((visibility("default")))
#else
#define CLG_API
#endif

/* ---- version ---- */
#define CLG_VERSION_MAJOR 0
#define CLG_VERSION_MINOR 2
#define CLG_VERSION_PATCH 0
/* The library's soname number (libclgrad.so.CLG_ABI_VERSION): changes only
 * when a binary built against an older header can no longer work. */
#define CLG_ABI_VERSION 1
#define CLG_VERSION_HEX ((CLG_VERSION_MAJOR << 16) | (CLG_VERSION_MINOR << 8) | CLG_VERSION_PATCH)

/* (major << 16) | (minor << 8) | patch of the library actually loaded. */
CLG_API unsigned clg_version(void);
/* "major.minor.patch" of the library actually loaded. */
CLG_API const char *clg_version_string(void);

/* ---- status codes: one table, so codes and messages cannot drift ---- */
#define CLG_STATUS_MAP(X)                                                   \
    X(OK, 0, "success")                                                     \
    X(ERR_INVALID_ARG, -1, "invalid argument")                              \
    X(ERR_NO_DEVICE, -2, "no matching OpenCL device")                       \
    X(ERR_OPENCL, -3, "OpenCL call failed")                                 \
    X(ERR_BUILD, -4, "kernel build failed")                                 \
    X(ERR_HOST_OOM, -5, "out of host memory")                               \
    X(ERR_DEVICE_OOM, -6, "out of device memory")                           \
    X(ERR_IO, -7, "file I/O failed")                                        \
    X(ERR_FORMAT, -8, "malformed input")                                    \
    X(ERR_UNSUPPORTED, -9, "unsupported operation")                         \
    X(ERR_SHAPE, -10, "incompatible shapes")                                \
    X(ERR_NOT_FOUND, -11, "not found")                                      \
    X(ERR_CHECKSUM, -12, "checksum mismatch")                               \
    X(ERR_MPI, -13, "MPI call failed")                                      \
    X(ERR_INTERNAL, -14, "internal error")

typedef enum clg_status {
#define CLG_X_ENUM(name, code, msg) CLG_##name = code,
    CLG_STATUS_MAP(CLG_X_ENUM)
#undef CLG_X_ENUM
} clg_status;

/* Static message for a status code ("unknown status" for foreign values). */
CLG_API const char *clg_status_string(clg_status st);
/* Symbolic name without prefix, e.g. "ERR_IO". */
CLG_API const char *clg_status_name(clg_status st);

/* ---- context ---- */
typedef struct clg_ctx clg_ctx;

typedef struct clg_ctx_params {
    size_t size; /* sizeof, set by clg_ctx_params_init (see "ABI" above) */
    /* Device selector (borrowed): "all" (default), "gpu", "cpu",
     * an index list "0,2", or "name:SUBSTRING". NULL: option devices
     * (CLGRAD_DEVICES). */
    const char *devices;
    /* Program binary cache: 1 on (default), 0 off. Option cache = 0
     * (CLGRAD_CACHE=0) also turns it off. */
    int use_cache;
    /* Cache directory (borrowed); NULL: option cache_dir
     * (CLGRAD_CACHE_DIR), else $XDG_CACHE_HOME/clgrad, else $HOME/.cache/clgrad. */
    const char *cache_dir;
    /* Directory with .cl sources to use instead of the embedded ones
     * (borrowed); NULL: option kernel_dir (CLGRAD_KERNEL_DIR). */
    const char *kernel_dir;
    /* 0 quiet, 1 info, 2 debug (to stderr). */
    int verbose;
    /* Settings (borrowed, see "options" below); NULL: every option at its
     * default. Options left at their default here are read from their
     * environment variables by clg_ctx_create. devices, use_cache, cache_dir
     * and kernel_dir above win over the options of the same meaning. */
    const struct clg_options *options;
} clg_ctx_params;

/* ---- options ----
 * Every setting of the library is an option of one table (`clgrad options`
 * prints it; docs/options.md): a name (e.g. "gemm_backend"), a type, a
 * default, a range or choices, and an environment variable (CLGRAD_ + the
 * name in capitals). A context's values come from, in order: the default;
 * the environment, read once by clg_ctx_create (never later); a value set in
 * the clg_options given in clg_ctx_params.options. Test aids have no
 * environment variable. Example:
 *
 *     clg_options *o = NULL;
 *     clg_options_create(&o);
 *     if (clg_options_set(o, "gemm_backend", "own") != CLG_OK)
 *         fprintf(stderr, "%s\n", clg_last_error(NULL));
 *     p.options = o;                 // clg_ctx_params p, initialised
 *     clg_ctx_create(&p, &ctx);
 *     clg_options_destroy(o);         // the context keeps its own copy
 *
 * A clg_options is used by one thread at a time. */
typedef struct clg_options clg_options;
/* Where an option's value came from. */
typedef enum clg_option_source {
    CLG_OPTION_DEFAULT = 0, /* the table's default */
    CLG_OPTION_ENV = 1,     /* its environment variable */
    CLG_OPTION_SET = 2      /* clg_options_set (the clgrad program: a flag) */
} clg_option_source;
/* A set of options, all at their defaults. */
CLG_API clg_status clg_options_create(clg_options **out);
/* NULL is a no-op. */
CLG_API void clg_options_destroy(clg_options *o);
/* Sets option `name` from text: bools 0/1 (no/yes, off/on, false/true),
 * integers and reals within the option's range, one of a choice's names.
 * CLG_ERR_INVALID_ARG for an unknown name or a refused value, with the
 * option and what it accepts in clg_last_error(NULL); o is unchanged then. */
CLG_API clg_status clg_options_set(clg_options *o, const char *name, const char *value);
/* Reads the environment variable of every option of o still at its default,
 * as clg_ctx_create does (for printing what a context would get). A bad
 * value is CLG_ERR_INVALID_ARG naming the variable. */
CLG_API clg_status clg_options_read_env(clg_options *o);
/* The options a context runs with (borrowed, valid while ctx lives). */
CLG_API const clg_options *clg_ctx_options(const clg_ctx *ctx);
/* Number of options in the table (indices 0 .. count-1 for clg_option_info_get). */
CLG_API int clg_options_count(void);
typedef struct clg_option_info {
    size_t size;        /* sizeof, set by clg_option_info_get (see "ABI" above) */
    const char *name;   /* e.g. "gemm_backend" (static) */
    const char *env;    /* e.g. "CLGRAD_GEMM_BACKEND" (static) */
    const char *type;   /* "bool", "int", "real", "string" or "choice" (static) */
    const char *kind;   /* "user", "tuning" (a tuning or measurement aid) or "test" (a test aid: no environment) */
    const char *default_value; /* as text (static) */
    const char *choices;       /* "auto,own,clblast,ref" for a choice, else "" (static) */
    double min, max;           /* range of an int or real (bool: 0, 1; others 0, 0) */
    const char *doc;           /* one line (static) */
    char value[1024];          /* the current value as text */
    clg_option_source source;  /* where the value came from */
    char accepts[256];         /* what it accepts, as text: "auto, own, clblast, ref", "0 or 1", "1..4", "text" */
} clg_option_info;
/* Row `index` of the table with its value in o (NULL: the defaults). A
 * macro: passes the sizeof of *out the caller was compiled with. */
CLG_API clg_status clg_option_info_get_size(const clg_options *o, int index, clg_option_info *out, size_t size);
#define clg_option_info_get(o, index, out) clg_option_info_get_size((o), (index), (out), sizeof *(out))

/* Defaults. A macro: passes the sizeof the caller was compiled with. */
CLG_API void clg_ctx_params_init_size(clg_ctx_params *p, size_t size);
#define clg_ctx_params_init(p) clg_ctx_params_init_size((p), sizeof *(p))
/* Creates a context on the selected devices. On failure *out is NULL and
 * clg_last_error(NULL) tells why. */
CLG_API clg_status clg_ctx_create(const clg_ctx_params *p, clg_ctx **out);
/* NULL is a no-op. */
CLG_API void clg_ctx_destroy(clg_ctx *ctx);

/* Detail of the last failure on ctx; with ctx == NULL, of the last failure
 * in this thread that had no context (e.g. clg_ctx_create). Never NULL. */
CLG_API const char *clg_last_error(const clg_ctx *ctx);

/* ---- devices ---- */
typedef enum clg_device_type {
    CLG_DEVICE_CPU = 1,
    CLG_DEVICE_GPU = 2,
    CLG_DEVICE_ACCELERATOR = 4,
    CLG_DEVICE_OTHER = 8
} clg_device_type;

typedef struct clg_device_info {
    char name[128];
    char vendor[128];
    char platform[128];
    char driver_version[64];
    char device_version[64];   /* "OpenCL 3.0 PoCL ..." */
    char opencl_c_version[64]; /* "OpenCL C 1.2 ..." */
    clg_device_type type;
    int platform_index;        /* index among all platforms */
    int device_index;          /* index within its platform */
    unsigned compute_units;
    unsigned max_clock_mhz;
    uint64_t global_mem_bytes;
    uint64_t local_mem_bytes;
    uint64_t max_alloc_bytes;
    size_t max_work_group_size;
    int has_fp16;
    int has_fp64;
} clg_device_info;

/* Number of devices in the context (>= 1 for a created context). */
CLG_API int clg_device_count(const clg_ctx *ctx);
/* A macro: passes the sizeof of *out the caller was compiled with (only that much is written). */
CLG_API clg_status clg_device_info_get_size(const clg_ctx *ctx, int index, clg_device_info *out, size_t size);
#define clg_device_info_get(ctx, index, out) clg_device_info_get_size((ctx), (index), (out), sizeof *(out))

/* Buffer pool statistics of one device. */
typedef struct clg_pool_stats {
    uint64_t bytes_in_use;   /* handed out and not yet released */
    uint64_t bytes_cached;   /* released, kept for reuse */
    uint64_t peak_bytes;     /* max of bytes_in_use */
    uint64_t hits;           /* allocations served from the cache */
    uint64_t misses;         /* allocations that went to clCreateBuffer */
    uint64_t failures;       /* allocations that failed */
} clg_pool_stats;

CLG_API clg_status clg_pool_stats_get_size(const clg_ctx *ctx, int device, clg_pool_stats *out, size_t size);
#define clg_pool_stats_get(ctx, device, out) clg_pool_stats_get_size((ctx), (device), (out), sizeof *(out))

/* Runs a small GEMM on every device against a host reference in double.
 * Returns CLG_OK when every device agrees within tolerance; max_rel_err
 * (may be NULL) receives the worst relative error seen. */
CLG_API clg_status clg_selfcheck(clg_ctx *ctx, double *max_rel_err);

/* ======================================================================
 * Models and training (owner: trainer)
 *
 * A model is built from a model file (or its text), instantiated on one
 * device of a context or, data-parallel, on several (clg_model_params.devices):
 * a replica per device, each batch split between them by measured speed,
 * gradients summed in a fixed device order so the replicas stay identical. Images are NCHW float arrays of the model's input
 * shape; labels are int32 class indices.
 *
 *   clg_model *m;
 *   clg_model_params mp;
 *   clg_model_params_init(&mp);
 *   clg_model_create_file(ctx, "models/lenet5.cfg", &mp, &m);
 *   clg_model_load_weights(m, "lenet5.safetensors");
 *   clg_model_predict(m, images, n, probs);   // probs: n * classes floats
 *   clg_model_destroy(m);
 * ====================================================================== */
typedef struct clg_model clg_model;

typedef struct clg_model_params {
    size_t size;        /* sizeof, set by clg_model_params_init (see "ABI" above) */
    int device;         /* device index in the context (default 0) */
    int batch;          /* largest batch per call; 0: the model file's [net] batch */
    uint64_t seed;      /* weight initialisation seed (default 1) */
    /* Training settings used by clg_model_train_step; NULL / negative:
     * the model file's [net] values. */
    const char *optimizer; /* "sgd", "adam", "adamw" */
    double learning_rate;
    double momentum;
    double weight_decay;
    /* "fp32" (default, NULL) or "fp16": activations and weights stored in
     * half, fp32 master weights, dynamic loss scaling; layers compute in fp32. */
    const char *precision;
    /* Data parallelism: the devices to train on, a selector over the
     * context's devices ("all", "gpu", "cpu", "0,2", "name:TEXT"; indices
     * count the context's devices). NULL: the one device `device`. Each
     * device holds a replica; every batch is split between them. */
    const char *devices;
    /* How a batch is split: "auto" (NULL: by measured speed, re-balanced as
     * it drifts), "even", or weights per device "3,1". */
    const char *split;
    /* Gradient reduction bucket size in MiB (0: 25). */
    double bucket_mb;
    /* Pipeline parallelism (docs/parallel.md): "pp=K" cuts the network into
     * K stages, one per device that `devices` selects (it must select K),
     * each holding only its layers' parameters, optimizer state and
     * activations; NULL or "": none (data parallelism over `devices`).
     * "dp=1,pp=K" is the same; "dp=D,pp=K" runs D pipelines. "tp=T": tensor
     * parallelism over T devices (split dense pairs, the rest replicated;
     * docs/parallel.md); "dp=D,tp=T" runs D groups of T; "pp=K,tp=T" runs
     * each of K stages on T devices, "dp=D,pp=K,tp=T" D such pipelines. */
    const char *parallel;
    const char *stages;        /* "conv2,fc1": cut after these layers (K-1 names); NULL: balanced by cost */
    int microbatches;          /* micro-batches per step (0: 4 x K, at most the batch) */
    const char *pipe_schedule; /* "1f1b" (default, NULL) or "gpipe" */
    int pipe_recompute;        /* 1: a stage stashes only its entering activations per micro-batch in flight
                                * and runs its forward again before the backward (less memory, one more
                                * forward); 0 (default): a whole activation set per micro-batch in flight */
    /* 1: sharded optimizer state (ZeRO stage 1) over the devices: each keeps
     * the optimizer state of 1/N of the parameters, updates that part and
     * the updated parts are gathered to every device; the same numbers as
     * unsharded (bitwise). 0 (default): every device keeps all of it. */
    int shard_optimizer;
} clg_model_params;

typedef struct clg_metrics {
    int64_t step;       /* optimizer steps taken */
    double loss;        /* mean loss of the last train step / predict-with-labels call */
    double accuracy;    /* fraction correct of the same */
    int samples;        /* samples in that call */
} clg_metrics;

/* Defaults. A macro: passes the sizeof the caller was compiled with. */
CLG_API void clg_model_params_init_size(clg_model_params *p, size_t size);
#define clg_model_params_init(p) clg_model_params_init_size((p), sizeof *(p))
/* Builds a model from a file or from model text (source_name may be NULL).
 * Errors (with line numbers) through clg_last_error(ctx). A file holding an
 * ONNX model (detected by content) is imported with its weights and input
 * normalization; unsupported operators are refused, naming the node. */
CLG_API clg_status clg_model_create_file(clg_ctx *ctx, const char *path, const clg_model_params *p, clg_model **out);
CLG_API clg_status clg_model_create_string(clg_ctx *ctx, const char *text, const char *source_name,
                                           const clg_model_params *p, clg_model **out);
/* A model argument to a path: an existing file as is; otherwise a shipped
 * model by name ("lenet5", "lenet5.cfg"; NAME.onnx is tried after NAME.cfg),
 * looked up in $CLGRAD_MODEL_DIR (read at the call: there is no context),
 * in share/clgrad/models of the installed tree the library was loaded from,
 * in the configured install directory, and in the source tree's models/ (an
 * uninstalled build). out receives the path (cap bytes); CLG_ERR_NOT_FOUND
 * names the directories searched and the models they hold
 * (clg_last_error(NULL)). */
CLG_API clg_status clg_model_find(const char *name, char *out, size_t cap);
/* NULL is a no-op. */
CLG_API void clg_model_destroy(clg_model *m);
/* Input shape, classes and the largest batch per call. */
CLG_API void clg_model_shape(const clg_model *m, int *channels, int *height, int *width, int *classes, int *batch);
/* Writes the layer table (name, type, output shape, params, MFLOPs) into
 * buf (NUL-terminated, truncated to cap). Returns the full length. */
CLG_API size_t clg_model_summary(const clg_model *m, char *buf, size_t cap);
/* Weights (and normalization, when present) from / to a checkpoint file
 * (safetensors layout). A checkpoint of another model is rejected. */
CLG_API clg_status clg_model_load_weights(clg_model *m, const char *path);
CLG_API clg_status clg_model_save_weights(clg_model *m, const char *path);
/* 1 when the model file carried its weights (ONNX), so no weights file is needed. */
CLG_API int clg_model_has_file_weights(const clg_model *m);
/* Writes the model (layers, weights, input normalization) as ONNX: opset 13, 17 with sequence layers. */
CLG_API clg_status clg_model_export_onnx(clg_model *m, const char *path);
/* Inference on n images (any n >= 1; split into batches). probs receives
 * n * classes floats (softmax probabilities, or the raw outputs of a
 * model without a softmax layer). Input normalization loaded with the
 * weights is applied. A model reading token ids ([net] input = tokens) is
 * refused (CLG_ERR_UNSUPPORTED, naming clg_model_generate). */
CLG_API clg_status clg_model_predict(clg_model *m, const float *images, int n, float *probs);
/* One training step (forward, backward, optimizer) on n <= batch images:
 * n labels; for a model reading token ids ([net] input = tokens: images are
 * T ids each) n T labels, the target of every position. */
CLG_API clg_status clg_model_train_step(clg_model *m, const float *images, const int32_t *labels, int n);
CLG_API clg_status clg_model_metrics_size(const clg_model *m, clg_metrics *out, size_t size);
#define clg_model_metrics(m, out) clg_model_metrics_size((m), (out), sizeof *(out))

/* Device memory of a model on one of its devices (index 0 .. devices - 1
 * in its device list), in bytes: what the device's account holds for it
 * now, by kind, and the account's peak since the model was created (the
 * buffer pool's blocks in use plus the parameter and optimizer arenas; the
 * cap of the option device_mem_limit applies to the same sum). Before the
 * first training step the optimizer state is 0 unless it was created. A
 * pipeline (pp=K, dp=D): index 0 .. D*K - 1 is a stage (replica d's stage
 * s at d*K + s), devices = D*K. */
typedef struct clg_device_memory {
    int devices;          /* the model's devices */
    int device;           /* this one's index in the context */
    uint64_t parameters;  /* parameter and gradient arenas (fp16: master, half and view copies too) */
    uint64_t optimizer;   /* optimizer state (sharded: this device's part) */
    uint64_t activations; /* planned activation buffers */
    uint64_t workspace;   /* the rest in use: feeds, convolution and GEMM workspaces, scratch */
    uint64_t peak;        /* peak of the account since the model (or a later one on this device) was created */
    uint64_t limit;       /* device_mem_limit in bytes (0: none) */
} clg_device_memory;
CLG_API clg_status clg_model_memory_size(const clg_model *m, int index, clg_device_memory *out, size_t size);
#define clg_model_memory(m, index, out) clg_model_memory_size((m), (index), (out), sizeof *(out))

/* Whole training runs (what `clgrad train` does). */
typedef struct clg_train_params {
    size_t size;                /* sizeof, set by clg_train_params_init (see "ABI" above) */
    const char *model;          /* model file (required) */
    const char *data;           /* "fashion-mnist", "mnist", "cifar10" or a path (required) */
    int device;                 /* device index in the context (default 0) */
    int epochs;                 /* 0: [net] epochs */
    int batch;                  /* 0: [net] batch */
    double learning_rate;       /* < 0: [net] */
    const char *optimizer;      /* NULL: [net] */
    const char *schedule;       /* "none", "step", "cosine"; NULL: [net] */
    long warmup;                /* linear warm-up steps; < 0: [net] */
    double momentum;            /* < 0: [net] */
    double weight_decay;        /* < 0: [net] */
    double clip_norm;           /* < 0: [net]; 0 off */
    const char *precision;      /* "fp32" (default) or "fp16" */
    const char *checkpoint_dir; /* NULL: no checkpoints */
    int resume;                 /* 1: continue from checkpoint_dir/last.safetensors (the same model, checked
                                 * by its hash); 2: load only its weights and train from step 0 */
    uint64_t seed;              /* default 1 */
    const char *log_csv;        /* CSV per epoch; an SVG plot is written next to it */
    int64_t max_steps;          /* stop after this many optimizer steps in total; 0: no limit */
    long limit_train;           /* use only the first N training samples; 0: all */
    long limit_test;            /* likewise for the test set; 0: all; < 0: no evaluation */
    int progress;               /* progress on stderr: 0 off, 1 on */
    const char *save_weights;   /* also write the final weights here (may be NULL) */
    const char *augment;        /* "none", "flip", "shift:N", "flip,shift:N"; NULL: [net] */
    const char *devices;        /* as clg_model_params.devices; NULL: the one device `device` */
    const char *split;          /* as clg_model_params.split */
    double bucket_mb;           /* as clg_model_params.bucket_mb */
    const char *trace;          /* Chrome-trace timeline of the first trace_steps steps (NULL: none) */
    int trace_steps;            /* 0: 20 */
    double val_fraction;        /* in (0, 1): hold out this fraction of the training set (seeded by val_seed)
                                 * and evaluate on it instead of the test set; 0: the test set */
    uint64_t val_seed;          /* the hold-out's seed (0: 1); the same seed and data give the same split */
    const char *parallel;       /* as clg_model_params.parallel ("pp=K") */
    const char *stages;         /* as clg_model_params.stages */
    int microbatches;           /* as clg_model_params.microbatches */
    const char *pipe_schedule;  /* as clg_model_params.pipe_schedule */
    int pipe_recompute;         /* as clg_model_params.pipe_recompute */
    int shard_optimizer;        /* as clg_model_params.shard_optimizer */
    /* called once, when the run's first training step has ended (NULL: nothing): every kernel of a step is
     * built by then, and the clgrad program stops its background precompile helper there, so that it does
     * not compete with the algorithm timing, the split's calibration and the steps after */
    void (*first_step_done)(void *user);
    void *first_step_done_user;
} clg_train_params;

typedef struct clg_train_report {
    int epochs_done;
    int64_t steps;
    double train_loss, train_accuracy; /* last epoch (or partial epoch) */
    double test_loss, test_accuracy;   /* last evaluation (-1 when none) */
    double images_per_s;               /* training throughput over the run */
    double seconds;
    int devices;                       /* devices trained on */
    char shares[128];                  /* their final batch shares, "0.50/0.50" */
    /* token models ([net] input = tokens): positions per sample (0: an image
     * model) and the training throughput in tokens/s (images_per_s * tokens_per_sample) */
    int tokens_per_sample;
    double tokens_per_s;
} clg_train_report;

/* Defaults. A macro: passes the sizeof the caller was compiled with. */
CLG_API void clg_train_params_init_size(clg_train_params *p, size_t size);
#define clg_train_params_init(p) clg_train_params_init_size((p), sizeof *(p))
/* A macro: the report's sizeof goes with it (see "ABI"); out must not be NULL. */
CLG_API clg_status clg_train_run_size(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out, size_t size);
#define clg_train_run(ctx, p, out) clg_train_run_size((ctx), (p), (out), sizeof *(out))

/* Evaluation of a model on a dataset ("fashion-mnist", ... or a path; the
 * test split). limit > 0 uses only the first limit samples. "text:FILE" for
 * a model reading token ids: the file's held-out last 10%, in consecutive
 * windows of the model's context; loss per byte and bits per byte. */
typedef struct clg_eval_report {
    int samples;
    int classes;
    double loss, accuracy;
    int64_t *confusion; /* classes x classes, row = true class, column = predicted; malloc'd */
    double bits_per_byte; /* text data (held-out tail, classes 0, no confusion): loss / ln 2; else 0 */
} clg_eval_report;
CLG_API clg_status clg_model_evaluate_size(clg_model *m, const char *data, long limit, clg_eval_report *out,
                                           size_t size);
#define clg_model_evaluate(m, data, limit, out) clg_model_evaluate_size((m), (data), (limit), (out), sizeof *(out))
CLG_API void clg_eval_report_free(clg_eval_report *r);
/* Text generation from a model reading token ids whose classes are the 256
 * byte values (e.g. models/gpt-mini.cfg): autoregressive byte sampling with
 * a key/value cache (each new byte costs one position, not the prefix).
 * The prompt (its last context - 1 bytes when longer; none: a newline) is
 * not part of the output. When the text fills the context, the window
 * slides: the model recomputes it from its last context / 2 bytes and goes
 * on with the cache. Sampling: temperature 0 picks the most likely byte
 * (greedy, the lowest on ties); else softmax(logits / temperature) over the
 * top_k most likely bytes (0: all), drawn with a PCG32 stream of seed, so a
 * seed gives the same bytes on every run. no_cache = 1 recomputes the whole
 * window for every byte (same bytes, for tests and benchmarks). */
typedef struct clg_generate_params {
    size_t size;            /* sizeof, set by clg_generate_params_init */
    const char *prompt;     /* NULL: none */
    size_t prompt_len;      /* bytes of prompt; 0: strlen(prompt) */
    int tokens;             /* bytes to generate, >= 1 (default 256) */
    double temperature;     /* >= 0 (default 1.0) */
    int top_k;              /* 0..256 (default 0: all) */
    uint64_t seed;          /* default 1 */
    int no_cache;           /* 1: recompute the window for every byte */
    /* (may be NULL) called with each byte as soon as it is chosen; a
     * nonzero return stops the generation (CLG_OK, fewer bytes). */
    int (*on_byte)(void *user, unsigned char byte);
    void *user;
    unsigned char *out;     /* (may be NULL) receives the first out_cap generated bytes */
    size_t out_cap;
    /* 1: fp16 storage: the decoder keeps its copy of the weights (rounded to
     * half), the activations between layers and the attention layers'
     * key/value caches in IEEE half (half the cache's bytes), computing in
     * fp32 as --precision fp16 training does; any OpenCL 1.2 device (half
     * values are reached through vload_half / vstore_half). Default 0: fp32. */
    int fp16;
} clg_generate_params;
typedef struct clg_generate_report {
    int generated;          /* bytes generated */
    int prompt_used;        /* prompt bytes the model saw (after truncation) */
    int recomputes;         /* whole-window passes (the prompt, slides, every byte with no_cache) */
    double seconds;         /* wall time of the generation (after the model's decoder is set up) */
    uint64_t cache_bytes;   /* device bytes of the key/value caches (context positions of every attention layer) */
} clg_generate_report;
CLG_API void clg_generate_params_init_size(clg_generate_params *p, size_t size);
#define clg_generate_params_init(p) clg_generate_params_init_size((p), sizeof *(p))
/* out receives the report. */
CLG_API clg_status clg_model_generate_size(clg_model *m, const clg_generate_params *p, clg_generate_report *out,
                                           size_t size);
#define clg_model_generate(m, p, out) clg_model_generate_size((m), (p), (out), sizeof *(out))
/* Predicts every image of an IDX images file (uint8 pixels / 255, or float32
 * values as they are) or a PGM image (resized
 * images are not supported: the shape must match the model input).
 * *probs (n * classes floats) is malloc'd: release with clg_free. Token
 * models are refused as by clg_model_predict. */
CLG_API clg_status clg_model_predict_file(clg_model *m, const char *path, float **probs, int *n);
/* Next-byte distributions of a token model ([net] input = tokens, 256 or
 * more classes per position, e.g. models/gpt-mini.cfg) over a text of
 * len >= 1 bytes: *probs (len * classes floats, malloc'd: release with
 * clg_free), row i the softmax probabilities of the byte after text[i]
 * (row len - 1: of the byte that would follow the text). The text is cut
 * into consecutive windows of the model's context T, window k the bytes
 * k T .. k T + T - 1, each seen from its first byte (as clg_model_evaluate
 * sees the held-out tail of text data, so the mean of -ln p(text[i + 1])
 * over a tail of k T + 1 bytes is evaluate's loss); the last window is
 * padded with byte 0 after the text, which a causal model does not see.
 * Image models are refused (CLG_ERR_UNSUPPORTED). */
CLG_API clg_status clg_model_predict_text(clg_model *m, const unsigned char *text, size_t len, float **probs);
CLG_API void clg_free(void *p);

/* Training throughput on synthetic data (what `clgrad bench train` does). */
typedef struct clg_bench_train_params {
    size_t size;       /* sizeof, set by clg_bench_train_params_init (see "ABI" above) */
    const char *model; /* model file */
    int device;        /* device index (default 0) */
    int batch;         /* default 128 */
    int steps;         /* timed steps (default 20) */
    int warmup;        /* untimed steps first (default 3; data parallel: more until the split settled) */
    uint64_t seed;
    const char *precision; /* "fp32" (default, NULL) or "fp16" */
    const char *devices;   /* as clg_model_params.devices; NULL: the one device `device` */
    const char *split;     /* as clg_model_params.split */
    double bucket_mb;      /* as clg_model_params.bucket_mb */
    const char *trace;     /* Chrome-trace timeline of the timed steps (NULL: none) */
    const char *parallel;      /* as clg_model_params.parallel ("pp=K") */
    const char *stages;        /* as clg_model_params.stages */
    int microbatches;          /* as clg_model_params.microbatches */
    const char *pipe_schedule; /* as clg_model_params.pipe_schedule */
    int pipe_recompute;        /* as clg_model_params.pipe_recompute */
    int shard_optimizer;   /* as clg_model_params.shard_optimizer */
    /* called once, when the first warm-up step has ended (NULL: nothing; not called with warmup 0): every
     * kernel of a step is built by then, and the clgrad program stops its background precompile helper
     * there, so that it never competes with algorithm timing, the split's calibration or a timed step */
    void (*warm_done)(void *user);
    void *warm_done_user;
} clg_bench_train_params;
typedef struct clg_bench_train_report {
    double images_per_s;  /* batch * steps / time of the timed steps */
    double ms_per_step;   /* mean */
    double ms_per_step_median;
    double seconds;
    int devices;          /* devices used */
    char shares[128];     /* their batch shares at the end, "0.50/0.50" */
    /* start-up (clgrad bench start): */
    double setup_s;       /* model creation: parse, build, weights, memory plan */
    double first_step_s;  /* the first step, waited for (compiles and algorithm choices land here) */
    double first_step_end; /* CLOCK_MONOTONIC seconds at the end of the first step */
    double first_step_cpu_s; /* CPU time of the process (all threads) at the end of the first step */
    double launches_per_step; /* kernel launches per timed step, all devices */
    double pipe_bubble;   /* a pipeline (parallel "pp=K"): the stages' mean idle share over the timed steps; else -1 */
    /* device memory (clg_model_memory) at the end, the largest over the devices, MiB: */
    double mem_peak_mib;  /* peak of the device's account */
    double mem_optim_mib; /* optimizer state */
    char warning[320];    /* "" or why the step times suggest more busy threads than free cores */
    /* token models ([net] input = tokens): positions per sample (0: an image model) and tokens/s */
    int tokens_per_sample;
    double tokens_per_s;  /* images_per_s * tokens_per_sample */
    /* data parallel: warm-up steps run (the requested warm-up, or more until the split settled and every
     * per-device batch size was met: at most 16 more), and within the timed steps the split's moves and the
     * passes that met new per-device batch sizes between steps (with their seconds) */
    int warmup_run;
    int split_moves_timed;
    int prepares_timed;
    double prepare_timed_s;
    double cpu_ms_per_step; /* CPU time of the process (all threads) per timed step: the work a step costs,
                               which a loaded machine stretches less than the wall time */
} clg_bench_train_report;
/* Defaults. A macro: passes the sizeof the caller was compiled with. */
CLG_API void clg_bench_train_params_init_size(clg_bench_train_params *p, size_t size);
#define clg_bench_train_params_init(p) clg_bench_train_params_init_size((p), sizeof *(p))
CLG_API clg_status clg_bench_train_size(clg_ctx *ctx, const clg_bench_train_params *p, clg_bench_train_report *out,
                                        size_t size);
#define clg_bench_train(ctx, p, out) clg_bench_train_size((ctx), (p), (out), sizeof *(out))

/* ====================================================================== */
/* Front ends: what the clgrad program needs besides models and training
 * (MPI jobs, program statistics, tuning, precompiling). */

/* MPI: a process started by mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK in the
 * environment) initializes MPI in clg_mpi_init (main thread, before any other
 * call; idempotent) and is rank clg_mpi_rank() of clg_mpi_size(); any other
 * process, or a build without MPI, is rank 0 of 1 and never loads MPI. The
 * communicator's settings (options allreduce, comm_poll_us, comm_spin_s) come
 * from opts (NULL: the defaults), then the environment for those left at their
 * default. Failure: CLG_ERR_MPI, detail in clg_last_error(NULL). */
CLG_API clg_status clg_mpi_init(const clg_options *opts);
/* Ends MPI at exit: finalizes it after a successful run (exit_code 0), or
 * ends the whole job (MPI_Abort) when this rank fails. No-op without MPI. */
CLG_API void clg_mpi_finalize(int exit_code);
CLG_API int clg_mpi_rank(void);
CLG_API int clg_mpi_size(void);
/* The job's reduction options, before training starts: the wait for another
 * rank in seconds (<= 0: the default, 60) and the rank-ordered (bitwise
 * repeatable) gradient sum. */
CLG_API void clg_mpi_configure(double timeout_s, int deterministic);
/* The reduction in use: "ring", "MPI_Iallreduce" (CLGRAD_ALLREDUCE=mpi) or
 * "rank-ordered" (deterministic). */
CLG_API const char *clg_mpi_algorithm(void);
/* Blocking collectives of the job (main thread; every rank calls them in the
 * same order), with the wait timeout: a barrier, and sums over the ranks in
 * place, buf[0..n) of floats as training reduces gradients, or of doubles.
 * With one rank: nothing to do. Failure: CLG_ERR_MPI naming the ranks that no
 * longer answer, detail in clg_last_error(NULL). */
CLG_API clg_status clg_mpi_barrier(void);
CLG_API clg_status clg_mpi_allreduce_f32(float *buf, size_t n);
CLG_API clg_status clg_mpi_allreduce_f64(double *buf, size_t n);
/* Link bandwidth: rank 0 sends bytes of buf to rank 1 and back, reps times;
 * *gbs (rank 0): bytes / (best round trip / 2) in GB/s. Other ranks idle. */
CLG_API clg_status clg_mpi_pingpong(void *buf, size_t bytes, int reps, double *gbs);

/* Writes len bytes of data to path atomically (a temporary file beside it,
 * fsync, rename, directory fsync): a reader sees the old file or the new,
 * never part of one (clgrad sweep's results table). Failure: CLG_ERR_IO,
 * detail in clg_last_error(NULL). */
CLG_API clg_status clg_write_file_atomic(const char *path, const void *data, size_t len);

/* OpenCL programs of the context so far: built from source and loaded from
 * the binary cache (either may be NULL). */
CLG_API void clg_ctx_program_counts(const clg_ctx *ctx, int *built, int *cache_loaded);
/* Whether the program-binary cache holds the element-wise kernels every
 * training step builds, for the first device: 1 yes, 0 no (a cold cache),
 * -1 unknown (no binary cache, or no device). */
CLG_API int clg_ctx_cache_warm(clg_ctx *ctx);

/* GEMM auto-tuning of device index `device` (clg_device_count): searches the
 * kernel parameters per shape class and stores the winners (and, with
 * clblast, whether CLBlast is faster per class) in the tuning database under
 * the cache directory. quick: a reduced search. progress (may be NULL) gets
 * one line at a time. Takes minutes. */
typedef void (*clg_progress_fn)(void *user, const char *line);
CLG_API clg_status clg_tune_gemm(clg_ctx *ctx, int device, int quick, int clblast, clg_progress_fn progress,
                                 void *user);

/* GEMM auto-tuning of the given shapes only (n rows of M, N, K), e.g. the
 * pending shapes below; otherwise as clg_tune_gemm (CLBlast timed only for
 * the classes whose own-vs-CLBlast choice is stored: decided again against
 * the new parameters). */
CLG_API clg_status clg_tune_gemm_shapes(clg_ctx *ctx, int device, const int (*shapes)[3], int n, int quick,
                                        clg_progress_fn progress, void *user);
/* GEMM shapes (M, N, K rows, at most max written) this context ran on the
 * device whose shape class has no measurement of its own yet: what
 * background tuning measures. Returns the count (0 for a bad argument). */
CLG_API int clg_tune_gemm_pending(clg_ctx *ctx, int device, int (*shapes)[3], int max);
/* Measures again the cached convolution algorithm choices of the device
 * that were made under other GEMM parameters than its tuning database holds
 * now (after clg_tune_gemm*), so the next run does not; stop (may be NULL) is
 * asked before each shape, nonzero ends it. Returns how many were measured
 * (0 for a bad argument). */
CLG_API int clg_conv_refresh_choices(clg_ctx *ctx, int device, int (*stop)(void *user), void *user);

/* Where the GEMM parameters of a device come from (clgrad devices). Lookup
 * order: the device's own measurements (clgrad tune, background tuning) >
 * the shipped entry of its device family (data/tune-families.json) > the
 * built-in defaults. */
typedef struct clg_gemm_tuning {
    int source;            /* 2: own measurements, 1: shipped family entries, 0: built-in defaults */
    int own_classes;       /* GEMM shape classes measured on this device */
    char family[48];       /* the shipped family that matches the device ("" none) */
    int family_measured;   /* 1: the family's entries were measured on a machine of the family, 0: estimated */
    char ref_class[16];    /* the class the figures are for: the largest tuned product ("" none) */
    int ref_m, ref_n, ref_k;
    double tuned_gflops;   /* tuned figure (own; else the family's reference machine), 0 unknown */
    double default_gflops; /* the built-in defaults on the same product, 0 unknown */
    double family_gflops;  /* the family's set on the same product, measured here, 0 unknown */
} clg_gemm_tuning;
CLG_API clg_status clg_gemm_tuning_get_size(clg_ctx *ctx, int device, clg_gemm_tuning *out, size_t size);
#define clg_gemm_tuning_get(ctx, device, out) clg_gemm_tuning_get_size((ctx), (device), (out), sizeof *(out))

/* Builds and compiles every kernel a training step of m launches: each
 * layer's forward and backward once on zeros, in layer order or reversed;
 * with measure, then a step with learning rate 0 (when the model has a
 * loss), which measures the convolution algorithms of shapes without a
 * stored choice. Nothing is trained. */
CLG_API clg_status clg_model_precompile(clg_model *m, int reverse, int measure);

/* GEMM benchmarks (clgrad bench gemm): C (m x n) = op(A) op(B), row-major,
 * single precision, batch products per call (0 or 1: one). */
typedef struct clg_bench_gemm_shape {
    const char *label; /* static text, e.g. "vgg-s conv2 fwd" */
    int m, n, k, ta, tb, batch;
} clg_bench_gemm_shape;
/* The GEMMs of the VGG-S and LeNet-5 layers at this batch size (forward, data
 * and weight gradients; a convolution as im2col M=Kout N=B*P*Q K=C*R*S):
 * fills up to max; returns how many there are. */
CLG_API int clg_bench_gemm_dl_shapes(int batch, clg_bench_gemm_shape *out, int max);
/* 1 when the CLBlast GEMM backend is compiled in. */
CLG_API int clg_have_clblast(void);
/* Times backend "own" (what clgrad runs for the shape: tuned or default
 * parameters) or "clblast" on device index `device`, scratch operands, one
 * warm-up then reps runs timed by OpenCL events: *ms is their median. */
CLG_API clg_status clg_bench_gemm_time(clg_ctx *ctx, int device, const clg_bench_gemm_shape *s, const char *backend,
                                       int reps, double *ms);
/* What "own" runs for the shape (the kernel and its parameters), into buf. */
CLG_API void clg_bench_gemm_describe(clg_ctx *ctx, int device, const clg_bench_gemm_shape *s, char *buf, size_t len);

/* Convolution benchmarks (clgrad bench conv, bench prim). A shape: input
 * n x c x h x w (NCHW), k filters of (c / groups) x r x s, zero padding,
 * stride and dilation per axis. A pass: 0 forward, 1 backward-data,
 * 2 backward-filter; an algorithm: a clg_prim_conv_algo value (0 automatic;
 * names by clg_prim_conv_algo_name). */
typedef struct clg_bench_conv_shape {
    int n, c, h, w, k, r, s;
    int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, groups;
} clg_bench_conv_shape;
typedef struct clg_bench_conv_result {
    double ms;      /* median of the timed runs (ms) */
    double rel_err; /* with check: max|got-ref| / max|ref| against a double-precision host
                     * reference on N(0,1) inputs and filters (infinite on a NaN); else NaN */
    int chosen;     /* the algorithm run: for algorithm 0, what the automatic choice picked */
} clg_bench_conv_result;
/* CLG_OK when the shape is valid, else CLG_ERR_INVALID_ARG naming the bad
 * field in clg_last_error(ctx). */
CLG_API clg_status clg_bench_conv_check(clg_ctx *ctx, const clg_bench_conv_shape *s);
/* 1 when the algorithm can run this pass of the (valid) shape, else 0. */
CLG_API int clg_bench_conv_supported(const clg_bench_conv_shape *s, int pass, int algo);
/* Runs one pass of the shape with one algorithm on device index `device`:
 * a warm-up (kernel builds; the automatic choice measures here unless the
 * context's option conv_auto_defer is on), then reps runs, each timed by the
 * wall clock around a finished queue, filter transforms rebuilt every run as
 * in training; fills *out. Inputs and filters are N(0,1), the same for every
 * call. Failure: detail in clg_last_error(ctx). */
CLG_API clg_status clg_bench_conv_time(clg_ctx *ctx, int device, const clg_bench_conv_shape *s, int pass, int algo,
                                       int reps, int check, clg_bench_conv_result *out);

/* The primitives API against the internal launchers it wraps (clgrad bench
 * prim), on device 0's queue of ctx and the same buffers. A handle holds a
 * primitives handle on that queue; gemm_backend ("own" or "clblast"; NULL:
 * own) is used by both paths (it becomes ctx's GEMM backend too). A
 * measurement times both paths in `rounds` (>= 2) rounds, alternating (the
 * order flips every round); a sample repeats the call until it spans >= 5 ms
 * (ms per call, queue finished). The handle is used by one thread at a time
 * and destroyed before ctx. Failure: detail in clg_last_error(ctx). */
typedef struct clg_bench_prim clg_bench_prim;
typedef struct clg_bench_prim_result {
    double internal_ms, public_ms; /* medians over the rounds */
    double ratio;                  /* median over the rounds of public / internal */
    int algo;                      /* convolutions: the algorithm the public path chose */
} clg_bench_prim_result;
CLG_API clg_status clg_bench_prim_create(clg_ctx *ctx, const char *gemm_backend, clg_bench_prim **out);
/* NULL is a no-op. */
CLG_API void clg_bench_prim_destroy(clg_bench_prim *b);
/* C (m x n) = op(A) op(B), row-major, single precision, random operands. */
CLG_API clg_status clg_bench_prim_gemm(clg_bench_prim *b, int m, int n, int k, int ta, int tb, int rounds,
                                       clg_bench_prim_result *out);
/* One pass of a convolution with the automatic algorithm, random operands. */
CLG_API clg_status clg_bench_prim_conv(clg_bench_prim *b, const clg_bench_conv_shape *s, int pass, int rounds,
                                       clg_bench_prim_result *out);

/* ====================================================================== */

#ifdef __cplusplus
}
#endif

/* The primitives API (GEMM, convolution, pooling, softmax on the caller's
 * OpenCL context, queue and buffers): the second installed header, included
 * here with <CL/cl.h>. Define CLG_NO_PRIMITIVES before including clgrad.h to
 * leave it (and the OpenCL headers) out. */
#ifndef CLG_NO_PRIMITIVES
#include "clgrad_prim.h"
#endif
#endif /* CLGRAD_H */
