/* clgrad tune [--device SEL] [--quick] [--shapes LIST] [--background]: GEMM
 * auto-tuning per device; and the background tuner `clgrad train` starts
 * after a run that used GEMM shapes without measurements (cli_tune_spawn). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opts.h"

extern char **environ;

static void progress(void *user, const char *line)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

typedef struct tune_opts {
    cli_common c;
    int quick, no_clblast, background;
    const char *shapes;
} tune_opts;

#define TUNE_MAX_SHAPES 64

/* "MxNxK,MxNxK,...": each size 1..16777216; n receives the count. */
static int parse_shapes(const char *list, int (*out)[3], int max, int *n)
{
    *n = 0;
    const char *p = list;
    while (p && *p) {
        char *end;
        for (int d = 0; d < 3; d++) {
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 1 || v > (1 << 24) || (d < 2 && *end != 'x'))
                return 0;
            if (*n < max)
                out[*n][d] = (int)v;
            p = end + (d < 2);
        }
        if (*p && *p != ',')
            return 0;
        if (++*n > max)
            return 0;
        p += *p == ',';
    }
    return *n > 0;
}

static const char *check_shapes(const char *value)
{
    int s[TUNE_MAX_SHAPES][3], n;
    return parse_shapes(value, s, TUNE_MAX_SHAPES, &n) ? NULL : "MxNxK[,MxNxK...] (at most 64, sizes >= 1)";
}

static const cli_opt opts[] = {
    {.name = "--devices", .alias = "--device", .kind = CLI_STRING, CLI_FIELD_(cli_common, devices), .arg = "SEL",
     .help = "device selector: all (default), gpu, cpu, accelerator, 0,2 or name:TEXT"},
    CLI_FLAG_OPT("--quick", tune_opts, quick, 1, "reduced search space (a few minutes per device)"),
    CLI_FLAG_OPT("--no-clblast", tune_opts, no_clblast, 1, "do not time CLBlast (auto then keeps its stored choice)"),
    {.name = "--shapes", .kind = CLI_LIST, CLI_FIELD_(tune_opts, shapes), .arg = "LIST", .check = check_shapes,
     .help = "tune only these products' classes: MxNxK[,MxNxK...] (default: square\n"
             "products and the DL layer shapes)"},
    CLI_FLAG_OPT("--background", tune_opts, background, 1,
                 "the helper mode train starts itself (see below): --shapes only, quick\n"
                 "then full, idle priority, after the trainer exits, nothing printed"),
    {.name = "--verbose", .alias = "-v", .kind = CLI_FLAG, CLI_FIELD_(cli_common, verbose), .set = 2,
     .help = "debug logging (program builds, cache loads)"},
    CLI_END,
};

const cli_spec cli_spec_tune = {
    .name = "tune",
    .synopsis = "[--devices SEL] [--quick] [--no-clblast] [--shapes LIST] [--verbose]",
    .about = "Searches the GEMM kernel parameters per shape class (the DL layer shapes and\n"
             "square products) on every selected device and stores the winners, and whether\n"
             "CLBlast is faster per class, in the tuning database under the cache directory\n"
             "(one JSON file per device name + driver version). Each winner is stored with\n"
             "the figures of the built-in defaults and of the shipped family entry on the same\n"
             "product (clgrad devices shows them).",
    .opts = opts,
    .notes = "Untuned devices start from the shipped entry of their family (data/tune-families.json:\n"
             "PoCL AVX2 / AVX-512 CPUs, NVIDIA sm_80 / sm_90, AMD gfx9-11, Intel Xe), else the\n"
             "built-in defaults. After a `clgrad train` run that used GEMM shape classes with no\n"
             "measurement of their own, train starts `clgrad tune --background --shapes ...`:\n"
             "a detached process at nice 19, SCHED_IDLE and idle I/O priority that waits for the\n"
             "trainer to exit, then tunes those classes one at a time, each only once the\n"
             "CPUs are quiet (< 25% busy; it gives up after background_tune_wait seconds of\n"
             "busy CPUs), saving the database atomically after each: first with the quick\n"
             "search, then again with the full one; last it measures again the convolution\n"
             "algorithm choices made under the earlier GEMM parameters. The next run reads the\n"
             "entries at its start (and measures again any such choice still left).\n"
             "One background tuner runs at a time per user. CLGRAD_BACKGROUND_TUNE=off\n"
             "(--set background_tune=off) turns it off; =quick leaves out the full search.",
};

/* Busy fraction of all CPUs over `sec` seconds (/proc/stat); -1 unknown. */
static double cpu_busy(double sec)
{
    unsigned long long a[2][8] = {{0}};
    for (int s = 0; s < 2; s++) {
        FILE *f = fopen("/proc/stat", "r");
        if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &a[s][0], &a[s][1], &a[s][2], &a[s][3],
                         &a[s][4], &a[s][5], &a[s][6], &a[s][7]) != 8) {
            if (f)
                fclose(f);
            return -1;
        }
        fclose(f);
        if (s == 0)
            usleep((useconds_t)(sec * 1e6));
    }
    double tot = 0, idle = 0;
    for (int i = 0; i < 8; i++)
        tot += (double)(a[1][i] - a[0][i]);
    idle = (double)(a[1][3] - a[0][3]) + (double)(a[1][4] - a[0][4]);
    return tot > 0 ? 1.0 - idle / tot : -1;
}

/* The background helper's setup: lowest CPU and I/O priority, one at a time
 * (flock, released at exit), after the trainer that started it has exited.
 * 0: go on. */
static int background_setup(void)
{
    if (setpriority(PRIO_PROCESS, 0, 19) != 0)
        return -1;
#ifdef __linux__
    struct sched_param sp = {0};
    (void)sched_setscheduler(0, SCHED_IDLE, &sp); /* runs only on otherwise idle CPUs */
#ifdef SYS_ioprio_set
    (void)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, 3 << 13 /* IOPRIO_CLASS_IDLE */);
#endif
#endif
    char lock[128];
    snprintf(lock, sizeof lock, "/tmp/clgrad-tune-%u.lock", (unsigned)getuid());
    int fd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0)
        return -1; /* another background tuner runs: it has the machine */
    pid_t parent = getppid();
    double t0 = cli_now();
    while (getppid() == parent && parent != 1 && cli_now() - t0 < 600)
        usleep(200000);
    return 0;
}

/* Waits until the CPUs are quiet (< 25% busy over a second) or until the
 * deadline; 1 when quiet. */
static int wait_quiet(double deadline)
{
    do {
        double b = cpu_busy(1.0);
        if (b >= 0 && b < 0.25)
            return 1;
    } while (cli_now() < deadline);
    return 0;
}

/* The background helper's work: one shape class at a time, each only while
 * the CPUs are quiet, so a run started meanwhile shares the machine with at
 * most one class's timing (a few seconds); it stops when they stay busy past
 * the wait (0: no waiting). Each class is saved as it is done. Two passes:
 * the quick search gives every class an entry soon (the next run's start
 * reads them), then the full search (the space `clgrad tune` searches; its
 * winners of WGS 8 or MR 16 are outside the quick one) times the classes
 * again and replaces their entries, so a cache filled in the background
 * reaches what `clgrad tune` gives. Last, the convolution algorithm choices
 * made under the earlier GEMM parameters are measured again (one shape at a
 * time, each once the CPUs are quiet), so the next run need not. */
typedef struct quiet_wait {
    double wait_s, deadline;
} quiet_wait;

/* clg_conv_refresh_choices' stop: nonzero when the CPUs stay busy past the wait. */
static int busy_stop(void *user)
{
    quiet_wait *q = user;
    if (q->wait_s > 0 && !wait_quiet(q->deadline))
        return 1;
    q->deadline = cli_now() + q->wait_s;
    return 0;
}

static void background_tune(clg_ctx *ctx, int device, int (*shapes)[3], int ns, double wait_s, int passes)
{
    quiet_wait q = {wait_s, cli_now() + wait_s};
    for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < ns; i++) {
            if (busy_stop(&q) ||
                clg_tune_gemm_shapes(ctx, device, (const int(*)[3])shapes + i, 1, pass == 0, NULL, NULL) != CLG_OK)
                return;
        }
    /* the convolution choices the runs made under the earlier parameters, measured
     * again here rather than in the next run */
    clg_conv_refresh_choices(ctx, device, busy_stop, &q);
}

int cmd_tune(int argc, char **argv)
{
    tune_opts o = {0};
    CLI_PARSE(&cli_spec_tune, argc, argv, &o);
    const char *devices = o.c.devices;
    int quick = o.quick || o.background, clblast = !o.no_clblast && !o.background, verbose = o.c.verbose;
    int shapes[TUNE_MAX_SHAPES][3], ns = 0;
    if (o.shapes)
        parse_shapes(o.shapes, shapes, TUNE_MAX_SHAPES, &ns);
    if (o.background && !ns)
        return cli_usage_error("tune", "--background needs --shapes");
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(devices, verbose ? verbose : (o.background ? 0 : 1), &rc);
    if (!ctx)
        return rc;
    char wait[32];
    double wait_s = atof(cli_option_value(ctx, "background_tune_wait", wait, sizeof wait));
    char mode[16];
    cli_option_value(ctx, "background_tune", mode, sizeof mode);
    if (o.background && background_setup() != 0) {
        clg_ctx_destroy(ctx);
        return CLI_OK; /* another background tuner has the machine */
    }
    for (int d = 0; d < clg_device_count(ctx); d++) {
        /* devices of one kind share a database: tune the first of them */
        clg_device_info di, dj;
        int dup = 0;
        for (int j = 0; j < d && !dup && clg_device_info_get(ctx, d, &di) == CLG_OK; j++)
            dup = clg_device_info_get(ctx, j, &dj) == CLG_OK && strcmp(di.name, dj.name) == 0 &&
                  strcmp(di.driver_version, dj.driver_version) == 0 && strcmp(di.platform, dj.platform) == 0;
        if (dup)
            continue;
        if (o.background) {
            background_tune(ctx, d, shapes, ns, wait_s, strcmp(mode, "quick") == 0 ? 1 : 2);
            continue;
        }
        clg_progress_fn pf = progress;
        clg_status st = ns ? clg_tune_gemm_shapes(ctx, d, (const int(*)[3])shapes, ns, quick, pf, NULL)
                           : clg_tune_gemm(ctx, d, quick, clblast, pf, NULL);
        if (st != CLG_OK) {
            rc = cli_fail("tuning device %d failed: %s", d, clg_last_error(ctx));
            break;
        }
    }
    clg_ctx_destroy(ctx);
    return rc;
}

/* After a training run: the GEMM shapes of ctx's devices without an own
 * measurement of their class go to a detached `clgrad tune --background`. */
void cli_tune_spawn(clg_ctx *ctx, const char *devices, int verbose)
{
    char mode[16];
    cli_option_value(ctx, "background_tune", mode, sizeof mode);
    char cache[16];
    cli_option_value(ctx, "cache", cache, sizeof cache);
    if (!ctx || strcmp(mode, "off") == 0 || strcmp(cache, "1") != 0 || clg_mpi_size() > 1 ||
        getenv("OMPI_COMM_WORLD_SIZE"))
        return;
    char list[TUNE_MAX_SHAPES * 28] = "";
    int total = 0;
    for (int d = 0; d < clg_device_count(ctx) && total < TUNE_MAX_SHAPES; d++) {
        int sh[32][3];
        int n = clg_tune_gemm_pending(ctx, d, sh, 32);
        for (int i = 0; i < n && i < 32 && total < TUNE_MAX_SHAPES; i++) {
            char one[40], wrapped[sizeof list + 2];
            snprintf(one, sizeof one, ",%dx%dx%d,", sh[i][0], sh[i][1], sh[i][2]);
            snprintf(wrapped, sizeof wrapped, ",%s,", list);
            if (strstr(wrapped, one))
                continue; /* the same shape from another device */
            one[strlen(one) - 1] = 0;
            strncat(list, one + (total ? 0 : 1), sizeof list - strlen(list) - 1);
            total++;
        }
    }
    if (!total)
        return;
    char *argv[] = {(char *)"clgrad", (char *)"tune", (char *)"--background", (char *)"--devices",
                    (char *)(devices ? devices : "all"), (char *)"--shapes", list, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    pid_t pid = 0;
    if (posix_spawn_file_actions_init(&fa) != 0)
        return;
    if (posix_spawnattr_init(&at) == 0) {
        /* its own session: it outlives the trainer and a terminal's signals */
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
        if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) == 0 &&
            posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0) == 0 &&
            posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0) == 0 &&
            posix_spawn(&pid, "/proc/self/exe", &fa, &at, argv, environ) != 0)
            pid = 0;
        posix_spawnattr_destroy(&at);
    }
    posix_spawn_file_actions_destroy(&fa);
    if (pid > 0 && verbose >= 2)
        fprintf(stderr, "clgrad: started background GEMM tuning (pid %d) of %d shape(s): %s\n", (int)pid, total, list);
}
