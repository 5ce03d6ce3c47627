/* Algorithm choice for CLG_CONV_AUTO: measure every eligible algorithm once
 * per (device, shape, pass), keep the fastest in memory and in
 * <cache_dir>/conv-algos-<devicehash>.json (one entry per line, each with
 * its device hash and how far its timing can be trusted: an unconfirmed
 * choice is measured again at a later run, see clg_conv_algo_rec and
 * docs/benchmarks.md). The choices a training run used travel in its
 * checkpoints (clg_conv_auto_state / clg_conv_auto_pin), so a resumed run
 * computes with the same algorithms (docs/reliability.md, "Resume and
 * measured choices"). */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_impl.h"
#include "io/json.h"
#include "tune.h"

typedef struct algo_entry {
    uint64_t devhash;
    char key[160];
    clg_conv_algo_rec r;
    int checked; /* measured, re-measured or marked in this process: not measured again here */
} algo_entry;

typedef struct loaded_file {
    uint64_t devhash;
    char path[1100];
} loaded_file;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static algo_entry *g_entries;
static int g_nentries, g_capentries;
static loaded_file *g_files;
static int g_nfiles, g_capfiles;
/* shapes served by the default while their measurement waits (clg_conv_auto_choose), counted per
 * device: two lanes on identical devices each serve their first use with the default, so neither
 * measures while the other computes (data parallelism meets the second use between steps, lane by lane) */
typedef struct {
    const clg_device *dev;
    uint64_t devhash;
    char key[160];
    int uses;
} pending_entry;
static pending_entry *g_pending;
static int g_npending, g_cappending;
/* Choices of this process and pinned ones: the final choice each (device,
 * shape, pass) resolved to here (what a checkpoint records), and the choices
 * a resumed run takes from its checkpoint ahead of the cache file and of
 * measuring (clg_conv_auto_pin). */
typedef struct choice_entry {
    uint64_t devhash;
    char key[160];
    clg_conv_algo algo;
} choice_entry;
typedef struct choice_list {
    choice_entry *e;
    int n, cap;
} choice_list;
static choice_list g_used, g_pins;
static unsigned g_generation; /* bumped whenever pins change: layers resolve again */
/* tests: a deterministic time per algorithm in place of the wall clock */
static double (*g_fake_ms)(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass);
static double (*g_fake_load)(void); /* tests: the load signal of a measurement */
static char g_dir[1024];             /* tests: the algorithm cache file's directory in place of the cache dir */

/* Trust in a measurement (docs/benchmarks.md, "Trusting a measurement"):
 * timed on a quiet machine (threads waited for a CPU at most LOAD_MAX of
 * their CPU time, the winner's rounds within SPREAD_MAX of each other) and
 * won by at least MARGIN_MIN; else re-measured at a later run, at most
 * MAX_TRIES times per shape. */
#define LOAD_MAX 0.25
#define SPREAD_MAX 0.5
#define MARGIN_MIN 0.03
#define MAX_TRIES 2
#define SLOW_RATIO 1.5 /* training time over the recorded figure that marks a choice */
#define SLOW_USES 3    /* ... averaged over at least this many uses */

/* F(4x4,3x3) joins the automatic choice only where its fp32 error is within
 * tolerance: measured max|err|/max|ref| = 1.5e-5 (fwd), 1.4e-5 (bwd-data)
 * and 2.6e-6 (bwd-filter, F(3x3,4x4)) with 3x3x256 filters on N(0,1) data
 * (clgrad bench conv --n 8 --c 256 --k 256 --h 14 --w 14 --check), growing
 * about as sqrt(reduction length); so it is a candidate up to 512 reduced
 * channels (< 3e-5 expected, tolerance 1e-4), and for backward-filter up to
 * 4M reduced positions (6.2e-6 measured at 128x28x28).
 * Option conv_wino4_auto = 0 keeps it out of auto entirely, 1 admits it for
 * every size. */
static int wino4_in_auto(const clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass)
{
    long mode = dev->ctx->opts.conv_wino4_auto; /* auto,0,1 */
    if (mode)
        return mode == 2;
    if (pass == CLG_CONV_BWD_FILTER) /* F(3x3,4x4): reduction over N*P*Q; 6.2e-6 at 128x28x28 */
        return (double)s->N * clg_conv_out_h(s) * clg_conv_out_w(s) <= 4e6;
    int reduced = pass == CLG_CONV_BWD_DATA ? s->K : s->C;
    return reduced <= 512;
}

static uint64_t device_hash(clg_device *dev)
{
    char fp[700];
    clg_device_fingerprint(dev, fp, sizeof fp);
    return clg_hash_str(fp, CLG_HASH_SEED);
}

clg_conv_algo clg_conv_algo_default(const clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass)
{
    if (s->groups > 1 && s->groups == s->C) /* depthwise: no reduction for a GEMM to share */
        return CLG_CONV_DIRECT;
    int reduced = pass == CLG_CONV_FWD ? s->C : pass == CLG_CONV_BWD_DATA ? s->K : CLG_MIN(s->C, s->K);
    if (!clg_conv_algo_supported(CLG_CONV_WINOGRAD, s, pass) || reduced < 8) {
        /* few channels or strided: the transforms cost more than they save;
         * on CPUs the shape-specialised direct kernels beat im2col's column
         * traffic there (docs/benchmarks.md, Convolution) for strided and 4x4+ windows;
         * 1x1 is a GEMM, and a 3x3 first layer is about even with im2col */
        int big = s->R * s->S >= 16 || s->stride_h > 1 || s->stride_w > 1;
        /* (a strided 1x1's backward-data: one pass over dx, zeros included) */
        int proj = pass == CLG_CONV_BWD_DATA && clg_conv_s1x1(s);
        if ((dev->info.type & CLG_DEVICE_CPU) && clg_conv_djit_ok(dev, s, pass) && (s->R * s->S > 1 || proj) && big)
            return CLG_CONV_DIRECT;
        return CLG_CONV_IM2COL;
    }
    int f4 = wino4_in_auto(dev, s, pass);
    /* (CPUs, weight gradients: the direct kernels usually measure faster
     * than Winograd's transforms, but they build one program per layer
     * shape, and the untuned default is what a cold first step compiles:
     * Winograd shares one program across the layers; `auto` measures
     * direct from the second use on.) */
    if (dev->info.type & CLG_DEVICE_CPU) {
        /* measured on PoCL (docs/benchmarks.md, Convolution): fused wins fwd and bwd-data */
        if (pass != CLG_CONV_BWD_FILTER && clg_conv_algo_supported(CLG_CONV_WINOGRAD4_FUSED, s, pass))
            return f4 ? CLG_CONV_WINOGRAD4_FUSED : CLG_CONV_WINOGRAD_FUSED;
        return f4 ? CLG_CONV_WINOGRAD4 : CLG_CONV_WINOGRAD;
    }
    /* GPUs: the separate design (transforms + the tiled local-memory GEMM);
     * the fused design keeps a work-item's tiles in local memory, which a
     * 32-64 KiB GPU fills with few work-items. F(4x4) where its local tiles
     * and the error policy allow, on the vendors with 48-64 KiB local memory. */
    clg_vendor vendor = clg_device_vendor(dev);
    int big_local = vendor == CLG_VENDOR_NVIDIA || vendor == CLG_VENDOR_AMD;
    return f4 && big_local ? CLG_CONV_WINOGRAD4 : CLG_CONV_WINOGRAD;
}

/* Option conv_auto_measure = 0: AUTO takes clg_conv_algo_default instead of
 * measuring (simulators, first runs on a new device). */
static int auto_measure(const clg_device *dev) { return dev->ctx->opts.conv_auto_measure != 0; }

static const char *pass_tag(clg_conv_pass p) { return p == CLG_CONV_FWD ? "fwd" : p == CLG_CONV_BWD_DATA ? "bwd-data" : "bwd-filter"; }

/* The batch in a key is its size class: exact up to 8, then two classes per
 * octave (12, 16, 24, 32, 48, ...). A data-parallel device's share of the
 * batch moves by a few samples as the split follows the measured speeds; the
 * best algorithm does not, and each new exact size would be timed anew. */
static int batch_class(int N)
{
    if (N <= 8)
        return N;
    int c = 8;
    while (c < N)
        c = c % 3 == 0 ? c / 3 * 4 : c / 2 * 3; /* 8 -> 12 -> 16 -> 24 -> 32 ... */
    return c;
}

static void shape_key(char *dst, size_t n, const clg_conv_shape *s, clg_conv_pass pass)
{
    /* "v5": measurements of the kernels of this version, with the fused
     * Winograd algorithms and the shape-specialised direct kernels among
     * the candidates, keyed by batch class (older entries are ignored);
     * "v6" for strided backward-data with dilation 1, whose im2col gather
     * became the unrolled one (col2im_s1 with the stride compiled in), so
     * its v5 measurements are stale; "v7" for the same shapes once direct
     * ran them by stride phases (dconv_fwdk per phase, no wasted taps);
     * "v8" for the weight gradients winograd-fused runs (a new candidate);
     * "v9" for all of them once its kernel changed (2 x 4-tile groups at
     * outputs of <= 8 columns, measured there too; longer chunks);
     * "v10" for the weight gradients once winograd4-fused (F(3x3, 4x4))
     * became a candidate, and for strided 1x1 backward-data without padding
     * once direct ran it as one 1x1 GEMM-like pass writing dx's zeros too */
    int v7 = pass == CLG_CONV_BWD_DATA && (s->stride_h > 1 || s->stride_w > 1) && s->dil_h == 1 && s->dil_w == 1;
    int v10 = (pass == CLG_CONV_BWD_FILTER && clg_conv_wgrad_ok(s)) ||
              (v7 && clg_conv_s1x1(s));
    snprintf(dst, n, "%s:%s:n%d,c%d,h%d,w%d,k%d,r%d,s%d,p%dx%d,u%dx%d,d%dx%d,g%d", v10 ? "v10" : v7 ? "v7" : "v5",
             pass_tag(pass),
             batch_class(s->N), s->C, s->H, s->W, s->K, s->R, s->S, s->pad_h, s->pad_w, s->stride_h, s->stride_w,
             s->dil_h, s->dil_w, s->groups);
}

static int table_find(uint64_t devhash, const char *key)
{
    for (int i = 0; i < g_nentries; i++)
        if (g_entries[i].devhash == devhash && strcmp(g_entries[i].key, key) == 0)
            return i;
    return -1;
}

static int table_put(uint64_t devhash, const char *key, const clg_conv_algo_rec *r)
{
    int i = table_find(devhash, key);
    if (i < 0) {
        if (g_nentries == g_capentries) {
            int nc = g_capentries ? 2 * g_capentries : 32;
            algo_entry *ne = realloc(g_entries, (size_t)nc * sizeof *ne);
            if (!ne)
                return -1;
            g_entries = ne;
            g_capentries = nc;
        }
        i = g_nentries++;
        g_entries[i].devhash = devhash;
        snprintf(g_entries[i].key, sizeof g_entries[i].key, "%s", key);
        g_entries[i].checked = 0;
    }
    g_entries[i].r = *r;
    return i;
}

static const char *file_dir(clg_device *dev) { return g_dir[0] ? g_dir : dev->ctx->cache_dir; }

static void file_path(clg_device *dev, uint64_t devhash, char *dst, size_t n)
{
    snprintf(dst, n, "%s/conv-algos-%016llx.json", file_dir(dev), (unsigned long long)devhash);
}

/* A file's entry: added where the table lacks the shape, and replacing the
 * table's where another process changed it later (higher rev). */
static void table_merge(void *user, uint64_t devhash, const char *key, const clg_conv_algo_rec *r)
{
    (void)user;
    int i = table_find(devhash, key);
    if (i < 0 || r->rev > g_entries[i].r.rev)
        table_put(devhash, key, r);
}

// ---- the cache file: a JSON object with one entry per line ----

void clg_conv_algos_format(clg_sbuf *b, int first, uint64_t devhash, const char *key, const clg_conv_algo_rec *r)
{
    clg_sbuf_printf(b,
                    "%s {\"key\": \"%s\", \"algo\": \"%s\", \"ms\": %.4f, \"dev\": \"%016llx\", \"n\": %d, "
                    "\"margin\": %.4f, \"spread\": %.4f, \"load\": %.3f, \"conf\": %d, \"tries\": %d, \"rev\": %d, "
                    "\"slow\": %d, \"gemm\": %.0f}\n",
                    first ? "" : ",", key, clg_conv_algo_name(r->algo), r->ms, (unsigned long long)devhash, r->n,
                    r->margin, r->spread, r->load, r->conf, r->tries, r->rev, r->slow, r->gemm);
}

/* A number field of an entry within [lo, hi], else dflt (absent: an older file version). */
static double num_field(const clg_json *j, const char *name, double lo, double hi, double dflt)
{
    const clg_json *v = clg_json_get(j, name);
    return v && v->type == CLG_JSON_NUM && v->num >= lo && v->num <= hi ? v->num : dflt;
}

/* The trust fields of a version-3 entry; an entry without a valid "conf" is unconfirmed. */
static void parse_trust(const clg_json *j, clg_conv_algo_rec *r)
{
    r->conf = (int)num_field(j, "conf", 0, 1, 0);
    r->n = (int)num_field(j, "n", 1, 1e9, 0);
    r->margin = num_field(j, "margin", -1, 1e9, -1);
    r->spread = num_field(j, "spread", 0, 1e9, 0);
    r->load = num_field(j, "load", -1, 1e9, -1);
    r->tries = (int)num_field(j, "tries", 0, 1000, 0);
    r->rev = (int)num_field(j, "rev", 0, 1e9, 0);
    r->slow = (int)num_field(j, "slow", 0, 1, 0);
    r->gemm = num_field(j, "gemm", 0, 4294967295.0, -1);
}

/* A key as the writer writes it: unescaped, so no quote, backslash or control character. */
static int plain_key(const clg_json *k)
{
    for (size_t i = 0; i < k->len; i++) {
        unsigned char c = (unsigned char)k->str[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return 0;
    }
    return k->len > 0;
}

/* One line's entry, {"key": "...", "algo": "...", "ms": N, "dev": "<16 hex digits>"}
 * (io/json.c's reader); 0 when malformed. */
static int parse_entry_line(const char *line, size_t len, char *key, size_t keycap, clg_conv_algo_rec *r,
                            uint64_t *dev)
{
    clg_err scratch;
    clg_json *j = NULL;
    if (clg_json_parse(&scratch, line, len, "conv algorithm cache", &j) != CLG_OK)
        return 0;
    const clg_json *k = clg_json_get(j, "key"), *a = clg_json_get(j, "algo"), *m = clg_json_get(j, "ms"),
                   *d = clg_json_get(j, "dev");
    int ok = k && k->type == CLG_JSON_STR && plain_key(k) && k->len < keycap && a &&
             a->type == CLG_JSON_STR && m && m->type == CLG_JSON_NUM && m->num >= 0 && m->num < 1e12 && d &&
             d->type == CLG_JSON_STR && d->len == 16 && strspn(d->str, "0123456789abcdef") == 16 &&
             clg_conv_algo_parse(&scratch, a->str, &r->algo) == CLG_OK && r->algo != CLG_CONV_AUTO;
    if (ok) {
        memcpy(key, k->str, k->len + 1);
        r->ms = m->num;
        *dev = strtoull(d->str, NULL, 16);
        parse_trust(j, r);
    }
    clg_json_free(j);
    return ok;
}

int clg_conv_algos_parse(char *text, uint64_t devhash,
                         void (*put)(void *user, uint64_t devhash, const char *key, const clg_conv_algo_rec *r),
                         void *user)
{
    int n = 0;
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        const char *next = line + len + (line[len] == '\n');
        /* entries after the first are written as ", {...}"; the header and
         * closing lines are not entries */
        size_t skip = strspn(line, " \t");
        if (skip < len && line[skip] == ',')
            skip++;
        skip += strspn(line + skip, " \t");
        size_t end = len;
        while (end > skip && (line[end - 1] == ' ' || line[end - 1] == '\t' || line[end - 1] == '\r'))
            end--;
        /* only "{...}" lines are entries: the header ("{... [") and the closing
         * "]}" are not, and are not parsed (no JSON error logged for them) */
        if (end - skip < 2 || line[skip] != '{' || line[end - 1] != '}') {
            line = next;
            continue;
        }
        char key[160];
        clg_conv_algo_rec r = {0};
        uint64_t dev;
        if (parse_entry_line(line + skip, len - skip, key, sizeof key, &r, &dev) && dev == devhash) {
            put(user, devhash, key, &r);
            n++;
        }
        line = next;
    }
    return n;
}

/* First line of the file: format, version and the device fingerprint (a
 * file whose first line differs, e.g. one measured on another device or
 * copied from one, is ignored). Version 3 records how far each timing can be
 * trusted; a version-2 file is read, its entries unconfirmed. */
static void file_header(clg_device *dev, clg_sbuf *b, int version)
{
    char fp[700];
    clg_device_fingerprint(dev, fp, sizeof fp);
    clg_sbuf_printf(b, "{\"format\": \"clgrad-conv-algos\", \"version\": %d, \"device\": ", version);
    clg_sbuf_json_str(b, fp);
    clg_sbuf_printf(b, ", \"entries\": [\n");
}

/* Adds the entries of the file at path (when its header is this device's)
 * that the table lacks. */
static int file_merge(clg_device *dev, uint64_t devhash, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    clg_err scratch;
    if (clg_file_read(&scratch, path, &text, &len) != CLG_OK)
        return 0;
    int ours = 0;
    for (int version = 3; version >= 2 && !ours; version--) {
        clg_sbuf hdr = {0};
        file_header(dev, &hdr, version);
        ours = !hdr.oom && len >= hdr.len && memcmp(text, hdr.data, hdr.len) == 0;
        clg_sbuf_free(&hdr);
    }
    if (ours)
        clg_conv_algos_parse(text, devhash, table_merge, NULL);
    else
        clg_log(1, "conv algorithm cache %s is not for this device (%s); measuring again", path, dev->info.name);
    free(text);
    return ours;
}

/* Loads the file once per (device hash, path); malformed lines and
 * entries of other devices are ignored. */
static void file_load(clg_device *dev, uint64_t devhash)
{
    char path[1100];
    file_path(dev, devhash, path, sizeof path);
    for (int i = 0; i < g_nfiles; i++)
        if (g_files[i].devhash == devhash && strcmp(g_files[i].path, path) == 0)
            return;
    if (g_nfiles == g_capfiles) {
        int nc = g_capfiles ? 2 * g_capfiles : 4;
        loaded_file *nf = realloc(g_files, (size_t)nc * sizeof *nf);
        if (!nf)
            return;
        g_files = nf;
        g_capfiles = nc;
    }
    g_files[g_nfiles].devhash = devhash;
    snprintf(g_files[g_nfiles].path, sizeof g_files[g_nfiles].path, "%s", path);
    g_nfiles++;
    if (!dev->ctx->use_cache)
        return;
    (void)file_merge(dev, devhash, path);
}

static void file_save(clg_device *dev, uint64_t devhash)
{
    if (!dev->ctx->use_cache || dev->ctx->cache_readonly)
        return;
    char path[1100];
    file_path(dev, devhash, path, sizeof path);
    clg_err scratch;
    if (clg_mkdirs(&scratch, file_dir(dev)) != CLG_OK)
        return;
    /* Several processes (sweep trials, parallel runs) share the file: under
     * its lock, merge what the others wrote since this one loaded it, then
     * replace it atomically, so neither a torn file nor a lost entry. */
    int lk = clg_file_lock(path, 10.0);
    (void)file_merge(dev, devhash, path);
    clg_sbuf b = {0};
    file_header(dev, &b, 3);
    int first = 1;
    for (int i = 0; i < g_nentries; i++) {
        if (g_entries[i].devhash != devhash)
            continue;
        clg_conv_algos_format(&b, first, devhash, g_entries[i].key, &g_entries[i].r);
        first = 0;
    }
    clg_sbuf_printf(&b, "]}\n");
    if (!b.oom)
        clg_file_write_atomic(&scratch, path, b.data, b.len);
    clg_file_unlock(lk);
    clg_sbuf_free(&b);
}

/* Time of one run of algo (ms, wall clock around a finished queue), or < 0 on failure. */
static double time_once(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass,
                        const clg_conv_io *io)
{
    double t0 = clg_now_sec();
    if (clg_conv_run(dev, s, algo, pass, NULL, io) != CLG_OK || clFinish(dev->queue) != CL_SUCCESS)
        return -1;
    if (g_fake_ms) /* tests (clg_conv_auto_set_timer) */
        return g_fake_ms(dev, s, algo, pass);
    return (clg_now_sec() - t0) * 1e3;
}

static int candidate(const clg_device *dev, clg_conv_algo a, const clg_conv_shape *s, clg_conv_pass pass)
{
    if (!clg_conv_algo_supported(a, s, pass))
        return 0;
    if ((a == CLG_CONV_WINOGRAD4 || a == CLG_CONV_WINOGRAD4_FUSED) && !wino4_in_auto(dev, s, pass))
        return 0; /* fused F(4x4) has the same transforms, so the same error policy */
    /* the fused weight gradient runs a few work-items per compute unit (written for CPUs); with
     * outputs of 8 columns or fewer it runs groups of 2 x 4 tiles, or half-empty 4-tile groups
     * where there is one tile row (docs/benchmarks.md, "Fused Winograd weight gradient") */
    if ((a == CLG_CONV_WINOGRAD_FUSED || a == CLG_CONV_WINOGRAD4_FUSED) && pass == CLG_CONV_BWD_FILTER &&
        (!(dev->info.type & CLG_DEVICE_CPU) || clg_conv_out_h(s) <= 2))
        return 0;
    if (a == CLG_CONV_FFT) /* meant for large kernels; forced runs may use it from 2x2 */
        return s->R >= 5 && s->S >= 5;
    if (a == CLG_CONV_DIRECT) {
        /* the shape-specialised kernels run any size; the generic ones are
         * meant for depthwise / small problems: skip measuring them on big dense ones */
        if (clg_conv_djit_ok(dev, s, pass))
            return 1;
        double macs = (double)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s) * (s->C / s->groups) * s->R * s->S;
        return (s->groups > 1 && s->groups == s->C) || macs <= 2e7;
    }
    return 1;
}

/* CPU time and time spent waiting for a CPU (runnable, not running) of this
 * process's threads so far, seconds (Linux schedstat); 0 where unknown. */
static int sched_totals(double *run_s, double *wait_s)
{
#ifdef __linux__
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    double run = 0, wait = 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long long a = 0, b = 0;
        if (fscanf(f, "%llu %llu", &a, &b) == 2) {
            run += (double)a * 1e-9;
            wait += (double)b * 1e-9;
            n++;
        }
        fclose(f);
    }
    closedir(d);
    *run_s = run;
    *wait_s = wait;
    return n > 0;
#else
    (void)run_s;
    (void)wait_s;
    return 0;
#endif
}

/* The load signal between two sched_totals samples: wait per unit of CPU time; -1 unknown
 * (no schedstat, too little CPU time to tell, or a thread that ended in between). */
static double load_between(int ok, double run0, double wait0, double run1, double wait1)
{
    double (*fake)(void);
    pthread_mutex_lock(&g_lock);
    fake = g_fake_load;
    pthread_mutex_unlock(&g_lock);
    if (fake)
        return fake();
    if (!ok || run1 - run0 < 1e-3 || wait1 < wait0)
        return -1;
    return (wait1 - wait0) / (run1 - run0);
}

/* Times the eligible algorithms into scratch outputs, so the caller's buffers
 * stay untouched, and fills r (algo, its figures and their trust). One
 * warm-up run each (kernel builds), then 3 rounds over all candidates in
 * turn, keeping each one's fastest and slowest run: interleaving makes the
 * comparison fair when the machine's load changes during measurement. */
static clg_status measure(clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass, const clg_conv_io *io,
                          const char *key, clg_conv_algo_rec *r)
{
    size_t P = (size_t)clg_conv_out_h(s), Q = (size_t)clg_conv_out_w(s);
    size_t nout = pass == CLG_CONV_FWD       ? (size_t)s->N * s->K * P * Q
                  : pass == CLG_CONV_BWD_DATA ? (size_t)s->N * s->C * s->H * s->W
                                              : (size_t)s->K * (s->C / s->groups) * s->R * s->S;
    cl_mem scratch = NULL;
    CLG_TRY(clg_buf_alloc(dev, sizeof(float) * nout, &scratch));
    clg_conv_io mio = *io;
    mio.y = mio.dx = mio.dw = scratch;
    mio.offy = mio.offdx = mio.offdw = 0;
    mio.db = NULL;
    mio.beta = 0.0f;
    char saved[CLG_ERR_LEN];
    snprintf(saved, sizeof saved, "%s", clg_dev_err(dev)->msg);
    double lo[CLG_CONV_ALGO_COUNT], hi[CLG_CONV_ALGO_COUNT];
    for (int a = 0; a < CLG_CONV_ALGO_COUNT; a++) {
        lo[a] = candidate(dev, (clg_conv_algo)a, s, pass) && a != CLG_CONV_AUTO &&
                        time_once(dev, s, (clg_conv_algo)a, pass, &mio) >= 0
                    ? 1e300
                    : -1;
        hi[a] = 0;
    }
    double run0 = 0, wait0 = 0, run1 = 0, wait1 = 0;
    int sched = sched_totals(&run0, &wait0);
    for (int round = 0; round < 3; round++)
        for (int a = 1; a < CLG_CONV_ALGO_COUNT; a++) {
            if (lo[a] < 0)
                continue;
            double ms = time_once(dev, s, (clg_conv_algo)a, pass, &mio);
            lo[a] = ms < 0 ? -1 : ms < lo[a] ? ms : lo[a];
            hi[a] = ms > hi[a] ? ms : hi[a];
        }
    sched = sched && sched_totals(&run1, &wait1);
    int best = -1, second = -1;
    for (int a = 1; a < CLG_CONV_ALGO_COUNT; a++) {
        clg_log(2, "conv auto %s: %s %.3f ms", key, clg_conv_algo_name((clg_conv_algo)a), lo[a]);
        if (lo[a] < 0)
            continue;
        if (best < 0 || lo[a] < lo[best]) {
            second = best;
            best = a;
        } else if (second < 0 || lo[a] < lo[second])
            second = a;
    }
    snprintf(clg_dev_err(dev)->msg, sizeof clg_dev_err(dev)->msg, "%s", saved);
    clg_buf_release(dev, scratch);
    if (best < 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INTERNAL,
                           "conv auto: no algorithm could run the %s pass of %s", pass_tag(pass), key);
    memset(r, 0, sizeof *r);
    r->algo = (clg_conv_algo)best;
    r->ms = lo[best];
    r->margin = second >= 0 && lo[best] > 0 ? lo[second] / lo[best] - 1 : -1;
    r->spread = lo[best] > 0 ? hi[best] / lo[best] - 1 : 0;
    r->load = load_between(sched, run0, wait0, run1, wait1);
    r->n = s->N;
    return CLG_OK;
}

/* Timed on a quiet machine (load -1, unknown, counts as quiet); trusted when also won by a clear margin. */
static int quiet(const clg_conv_algo_rec *r) { return r->load <= LOAD_MAX && r->spread <= SPREAD_MAX; }
static int trusted(const clg_conv_algo_rec *r) { return quiet(r) && (r->margin < 0 || r->margin >= MARGIN_MIN); }

/* Measured with other GEMM choices than the device's now (the background
 * tuner or `clgrad tune` changed them since): the algorithms that run GEMM
 * kernels ran other ones then, so the comparison no longer holds. */
static int gemm_stale(const clg_conv_algo_rec *r, double stamp)
{
    return r->gemm >= 0 && stamp >= 0 && r->gemm != stamp;
}

/* The device's GEMM stamp to compare with; -1 (nothing stale) with a read-only
 * cache, where a new measurement could not be kept and every run would repeat it. */
static double current_stamp(clg_device *dev)
{
    return dev->ctx->cache_readonly ? -1 : (double)clg_tune_gemm_stamp(dev);
}

/* Measured before this process but not trusted, or with other GEMM choices,
 * and not yet re-measured here. */
static int recheck_due(const algo_entry *e, double stamp)
{
    return !e->checked && ((!e->r.conf && e->r.tries < MAX_TRIES) || gemm_stale(&e->r, stamp));
}

/* A re-measurement r of an unconfirmed choice old: a quiet one replaces it
 * for good, and so does one that agrees with it (two measurements, one
 * winner); of two loaded ones that disagree the less loaded is kept,
 * unconfirmed until MAX_TRIES re-measurements. */
static void settle(const clg_conv_algo_rec *old, clg_conv_algo_rec *r)
{
    int tries = old->tries + 1, rev = old->rev + 1;
    if (!quiet(r) && r->algo != old->algo && old->load >= 0 && (r->load < 0 || old->load < r->load))
        *r = *old;
    r->conf = quiet(r) || r->algo == old->algo || tries >= MAX_TRIES;
    r->tries = tries;
    r->rev = rev;
    r->slow = 0;
}

clg_status clg_conv_auto_pick(clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass, const clg_conv_io *io,
                              clg_conv_algo *out)
{
    char key[160];
    shape_key(key, sizeof key, s, pass);
    uint64_t dh = device_hash(dev);
    double stamp = current_stamp(dev);
    pthread_mutex_lock(&g_lock);
    file_load(dev, dh);
    if (!auto_measure(dev)) {
        pthread_mutex_unlock(&g_lock);
        *out = clg_conv_algo_default(dev, s, pass);
        return CLG_OK;
    }
    int i = table_find(dh, key);
    clg_conv_algo_rec old = {0};
    int have_old = i >= 0 && clg_conv_algo_supported(g_entries[i].r.algo, s, pass);
    if (have_old) {
        old = g_entries[i].r;
        if (!recheck_due(&g_entries[i], stamp)) {
            *out = old.algo;
            pthread_mutex_unlock(&g_lock);
            return CLG_OK;
        }
        g_entries[i].checked = 1; /* once per process, whatever comes of it */
    }
    pthread_mutex_unlock(&g_lock);

    clg_conv_algo_rec r;
    clg_status st = measure(dev, s, pass, io, key, &r);
    if (st != CLG_OK && have_old) { /* the earlier measurement stands */
        *out = old.algo;
        return CLG_OK;
    }
    CLG_TRY(st);
    /* measured with other GEMM kernels: a new measurement, not a second opinion on the old one */
    int stale = have_old && gemm_stale(&old, stamp);
    if (have_old && !stale)
        settle(&old, &r);
    else
        r.conf = trusted(&r);
    if (stale)
        r.rev = old.rev + 1;
    r.gemm = clg_tune_gemm_stamp(dev); /* after: measuring may have recorded GEMM backend choices */
    clg_log(1, "conv auto %s: %s %s (%.3f ms, margin %.0f%%, spread %.0f%%, load %.2f%s)", key,
            stale ? "GEMM choices changed, re-measured," : have_old ? "re-measured," : "chose",
            clg_conv_algo_name(r.algo), r.ms, 100 * r.margin, 100 * r.spread, r.load,
            r.conf ? "" : "; unconfirmed: measured again at a later run");
    pthread_mutex_lock(&g_lock);
    i = table_put(dh, key, &r);
    if (i >= 0) {
        g_entries[i].checked = 1;
        file_save(dev, dh);
    }
    pthread_mutex_unlock(&g_lock);
    *out = r.algo;
    return CLG_OK;
}

// ---- re-measuring in the background tuner ----

/* The shape and pass of a key as shape_key writes it (n: the batch timed);
 * 0 unless the key is the one shape_key gives for them (another version). */
static int key_shape(const char *key, int n, clg_conv_shape *s, clg_conv_pass *pass)
{
    char ver[4], tag[16];
    int N;
    memset(s, 0, sizeof *s);
    if (sscanf(key, "%3[v0-9]:%15[a-z-]:n%d,c%d,h%d,w%d,k%d,r%d,s%d,p%dx%d,u%dx%d,d%dx%d,g%d", ver, tag, &N, &s->C,
               &s->H, &s->W, &s->K, &s->R, &s->S, &s->pad_h, &s->pad_w, &s->stride_h, &s->stride_w, &s->dil_h,
               &s->dil_w, &s->groups) != 16)
        return 0;
    *pass = strcmp(tag, "fwd") == 0        ? CLG_CONV_FWD
            : strcmp(tag, "bwd-data") == 0 ? CLG_CONV_BWD_DATA
                                           : CLG_CONV_BWD_FILTER;
    s->N = n > 0 ? n : N;
    if (s->C < 1 || s->H < 1 || s->W < 1 || s->K < 1 || s->R < 1 || s->S < 1 || s->groups < 1 || s->stride_h < 1 ||
        s->stride_w < 1 || s->dil_h < 1 || s->dil_w < 1 || clg_conv_out_h(s) < 1 || clg_conv_out_w(s) < 1 ||
        (double)s->N * s->C * s->H * s->W > 1e9 || (double)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s) > 1e9)
        return 0;
    char again[160];
    shape_key(again, sizeof again, s, *pass);
    return strcmp(again, key) == 0;
}

/* Measures one cached shape again on zero-filled operands and stores the result. */
static clg_status refresh_one(clg_device *dev, uint64_t dh, const char *key, const clg_conv_shape *s,
                              clg_conv_pass pass, const clg_conv_algo_rec *old)
{
    size_t nx = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->K * (s->C / s->groups) * s->R * s->S,
           ny = (size_t)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s);
    clg_conv_io io;
    memset(&io, 0, sizeof io);
    clg_status st = clg_buf_alloc(dev, sizeof(float) * nx, &io.x);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * nw, &io.w);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * ny, &io.dy);
    if (st == CLG_OK)
        st = clg_buf_fill(dev, io.x, 0, nx, 0.0f);
    if (st == CLG_OK)
        st = clg_buf_fill(dev, io.w, 0, nw, 0.0f);
    if (st == CLG_OK)
        st = clg_buf_fill(dev, io.dy, 0, ny, 0.0f);
    io.y = io.dy; /* measure() writes scratch outputs of its own */
    clg_conv_algo_rec r;
    if (st == CLG_OK)
        st = measure(dev, s, pass, &io, key, &r);
    clg_buf_release(dev, io.x);
    clg_buf_release(dev, io.w);
    clg_buf_release(dev, io.dy);
    if (st != CLG_OK)
        return st;
    /* at the tuner's idle priority the load signal counts every wait for any other
     * process: trust is judged by the spread and the margin (the rounds interleave
     * the candidates), and a winner that agrees with a confirmed earlier choice confirms it */
    r.conf = (r.spread <= SPREAD_MAX && (r.margin < 0 || r.margin >= MARGIN_MIN)) || (old->conf && r.algo == old->algo);
    r.rev = old->rev + 1;
    r.gemm = clg_tune_gemm_stamp(dev);
    clg_log(1, "conv auto %s: GEMM choices changed, re-measured, %s (%.3f ms, margin %.0f%%, load %.2f)", key,
            clg_conv_algo_name(r.algo), r.ms, 100 * r.margin, r.load);
    pthread_mutex_lock(&g_lock);
    int i = table_put(dh, key, &r);
    if (i >= 0) {
        g_entries[i].checked = 1;
        file_save(dev, dh);
    }
    pthread_mutex_unlock(&g_lock);
    return CLG_OK;
}

int clg_conv_auto_refresh(clg_device *dev, int (*stop)(void *user), void *user)
{
    if (!auto_measure(dev))
        return 0;
    uint64_t dh = device_hash(dev);
    double stamp = current_stamp(dev);
    int done = 0;
    for (;;) { /* one stale entry at a time: the table may grow and move meanwhile */
        char key[160] = "";
        clg_conv_algo_rec old = {0};
        pthread_mutex_lock(&g_lock);
        file_load(dev, dh);
        for (int i = 0; i < g_nentries && !key[0]; i++)
            if (g_entries[i].devhash == dh && !g_entries[i].checked && gemm_stale(&g_entries[i].r, stamp)) {
                g_entries[i].checked = 1;
                snprintf(key, sizeof key, "%s", g_entries[i].key);
                old = g_entries[i].r;
            }
        pthread_mutex_unlock(&g_lock);
        if (!key[0] || (stop && stop(user)))
            return done;
        clg_conv_shape s;
        clg_conv_pass pass;
        clg_err saved = dev->err; /* a shape that does not run is not the caller's error */
        if (key_shape(key, old.n, &s, &pass) && clg_conv_algo_supported(old.algo, &s, pass) &&
            refresh_one(dev, dh, key, &s, pass, &old) == CLG_OK)
            done++;
        dev->err = saved;
    }
}

static int defer_uses(const clg_device *dev) { return (int)dev->ctx->opts.conv_auto_defer; /* 0..1000 */ }

/* The shape's pending entry on one device (uses 0 when new); NULL without memory. */
static pending_entry *pending_slot(const clg_device *dev, uint64_t devhash, const char *key)
{
    for (int i = 0; i < g_npending; i++)
        if (g_pending[i].dev == dev && g_pending[i].devhash == devhash && strcmp(g_pending[i].key, key) == 0)
            return &g_pending[i];
    if (g_npending == g_cappending) {
        int nc = g_cappending ? 2 * g_cappending : 32;
        pending_entry *np = realloc(g_pending, (size_t)nc * sizeof *np);
        if (!np)
            return NULL;
        g_pending = np;
        g_cappending = nc;
    }
    pending_entry *p = &g_pending[g_npending++];
    p->dev = dev;
    p->devhash = devhash;
    snprintf(p->key, sizeof p->key, "%s", key);
    p->uses = 0;
    return p;
}

/* Counts one use of a shape still to be measured; 1 while it is within its deferred uses. */
static int pending_use(const clg_device *dev, uint64_t devhash, const char *key, int defer)
{
    pending_entry *p = pending_slot(dev, devhash, key);
    return p && ++p->uses <= defer; /* no memory: measure now */
}

static int choice_find(const choice_list *l, uint64_t devhash, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (l->e[i].devhash == devhash && strcmp(l->e[i].key, key) == 0)
            return i;
    return -1;
}

/* Adds or replaces; 0, or -1 without memory. */
static int choice_put(choice_list *l, uint64_t devhash, const char *key, clg_conv_algo algo)
{
    int i = choice_find(l, devhash, key);
    if (i < 0) {
        if (l->n == l->cap) {
            int nc = l->cap ? 2 * l->cap : 32;
            choice_entry *ne = realloc(l->e, (size_t)nc * sizeof *ne);
            if (!ne)
                return -1;
            l->e = ne;
            l->cap = nc;
        }
        i = l->n++;
        l->e[i].devhash = devhash;
        snprintf(l->e[i].key, sizeof l->e[i].key, "%s", key);
    }
    l->e[i].algo = algo;
    return 0;
}

static void note_final(uint64_t devhash, const char *key, clg_conv_algo algo)
{
    pthread_mutex_lock(&g_lock);
    (void)choice_put(&g_used, devhash, key, algo); /* without memory a checkpoint lacks it: measured again */
    pthread_mutex_unlock(&g_lock);
}

clg_status clg_conv_auto_choose(clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass, const clg_conv_io *io,
                                clg_conv_algo *out, int *final)
{
    *final = 1;
    char key[160];
    shape_key(key, sizeof key, s, pass);
    uint64_t dh = device_hash(dev);
    pthread_mutex_lock(&g_lock);
    int pin = choice_find(&g_pins, dh, key);
    clg_conv_algo pinned = pin >= 0 ? g_pins.e[pin].algo : CLG_CONV_AUTO;
    pthread_mutex_unlock(&g_lock);
    if (pinned != CLG_CONV_AUTO && clg_conv_algo_supported(pinned, s, pass)) { /* a resumed run's checkpoint */
        note_final(dh, key, pinned);
        *out = pinned;
        return CLG_OK;
    }
    int defer = defer_uses(dev);
    if (defer > 0 && auto_measure(dev)) {
        double stamp = current_stamp(dev);
        pthread_mutex_lock(&g_lock);
        file_load(dev, dh);
        int i = table_find(dh, key);
        int known = i >= 0 && clg_conv_algo_supported(g_entries[i].r.algo, s, pass);
        /* an unconfirmed choice waits for its re-measurement as a new shape does, with its own algorithm */
        int wait = (!known || recheck_due(&g_entries[i], stamp)) && pending_use(dev, dh, key, defer);
        clg_conv_algo d = known ? g_entries[i].r.algo : clg_conv_algo_default(dev, s, pass);
        pthread_mutex_unlock(&g_lock);
        if (wait && clg_conv_algo_supported(d, s, pass)) {
            clg_log(2, "conv auto %s: %s until measured", key, clg_conv_algo_name(d));
            *out = d;
            *final = 0;
            return CLG_OK;
        }
    }
    CLG_TRY(clg_conv_auto_pick(dev, s, pass, io, out));
    note_final(dh, key, *out);
    return CLG_OK;
}

// ---- the choices in force, through checkpoints ----

/* The distinct device hashes of the context's devices into hs (at most cap); their count. */
static int ctx_hashes(clg_ctx *ctx, uint64_t *hs, int cap)
{
    int n = 0;
    for (int d = 0; d < ctx->ndev; d++) {
        uint64_t h = device_hash(&ctx->devs[d]);
        int seen = 0;
        for (int j = 0; j < n && !seen; j++)
            seen = hs[j] == h;
        if (!seen && n < cap)
            hs[n++] = h;
    }
    return n;
}

void clg_conv_auto_state(clg_ctx *ctx, clg_sbuf *out)
{
    uint64_t hs[64];
    int nh = ctx_hashes(ctx, hs, 64);
    pthread_mutex_lock(&g_lock);
    for (int h = 0; h < nh; h++) {
        for (int i = 0; i < g_used.n; i++)
            if (g_used.e[i].devhash == hs[h])
                clg_sbuf_printf(out, "%016llx %s %s;", (unsigned long long)hs[h], g_used.e[i].key,
                                clg_conv_algo_name(g_used.e[i].algo));
        for (int i = 0; i < g_npending; i++) { /* per device: one entry per shape, the most uses */
            if (g_pending[i].devhash != hs[h] || g_pending[i].uses <= 0 ||
                choice_find(&g_used, hs[h], g_pending[i].key) >= 0)
                continue;
            int uses = g_pending[i].uses, first = 1;
            for (int j = 0; j < g_npending && first; j++)
                if (j != i && g_pending[j].devhash == hs[h] && strcmp(g_pending[j].key, g_pending[i].key) == 0) {
                    first = j > i;
                    uses = CLG_MAX(uses, g_pending[j].uses);
                }
            if (first)
                clg_sbuf_printf(out, "%016llx %s ~%d;", (unsigned long long)hs[h], g_pending[i].key, uses);
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* One entry "<16 hex digits> <key> <algo>" or "... ~<uses>" of len bytes at
 * e; 0 when malformed. */
static int parse_state_entry(const char *e, size_t len, uint64_t *dh, char *key, size_t keycap, clg_conv_algo *algo,
                             int *uses)
{
    char buf[320];
    if (len >= sizeof buf)
        return 0;
    memcpy(buf, e, len);
    buf[len] = 0;
    char *sp1 = strchr(buf, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || sp1 - buf != 16 || strspn(buf, "0123456789abcdef") != 16 || strchr(sp2 + 1, ' '))
        return 0;
    *sp1 = *sp2 = 0;
    size_t kl = strlen(sp1 + 1);
    if (kl == 0 || kl >= keycap)
        return 0;
    for (size_t i = 0; i < kl; i++)
        if ((unsigned char)sp1[1 + i] < 0x21 || sp1[1 + i] == '"' || sp1[1 + i] == '\\')
            return 0;
    *dh = strtoull(buf, NULL, 16);
    memcpy(key, sp1 + 1, kl + 1);
    const char *v = sp2 + 1;
    *uses = 0;
    *algo = CLG_CONV_AUTO;
    if (v[0] == '~') {
        char *end = NULL;
        long u = strtol(v + 1, &end, 10);
        if (end == v + 1 || *end || u < 1 || u > 1000000)
            return 0;
        *uses = (int)u;
        return 1;
    }
    clg_err scratch;
    return clg_conv_algo_parse(&scratch, v, algo) == CLG_OK && *algo != CLG_CONV_AUTO;
}

/* Sets the shape's pending uses to at least uses on every device of ctx
 * with that hash (without memory: measured at its next use). */
static void pending_restore(clg_ctx *ctx, uint64_t devhash, const char *key, int uses)
{
    for (int d = 0; d < ctx->ndev; d++) {
        if (device_hash(&ctx->devs[d]) != devhash)
            continue;
        pending_entry *p = pending_slot(&ctx->devs[d], devhash, key);
        if (p)
            p->uses = CLG_MAX(p->uses, uses);
    }
}

clg_status clg_conv_auto_pin(clg_ctx *ctx, clg_err *err, const char *state, const char *what)
{
    uint64_t hs[64];
    int nh = ctx_hashes(ctx, hs, 64), pinned = 0, other = 0;
    clg_status st = CLG_OK;
    pthread_mutex_lock(&g_lock);
    int k = 0;
    for (const char *e = state; *e && st == CLG_OK; k++) {
        size_t len = strcspn(e, ";");
        uint64_t dh = 0;
        char key[160];
        clg_conv_algo algo;
        int uses = 0;
        if (!parse_state_entry(e, len, &dh, key, sizeof key, &algo, &uses)) {
            st = clg_err_set(err, CLG_ERR_FORMAT,
                             "%s: entry %d is not '<device hash> <shape key> <algorithm or ~uses>'", what, k + 1);
            break;
        }
        int ours = 0;
        for (int h = 0; h < nh && !ours; h++)
            ours = hs[h] == dh;
        if (!ours)
            other++;
        else if (uses > 0)
            pending_restore(ctx, dh, key, uses);
        else if (choice_put(&g_pins, dh, key, algo) != 0)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "%s: out of memory", what);
        else
            pinned++;
        e += len + (e[len] == ';');
    }
    g_generation++;
    pthread_mutex_unlock(&g_lock);
    if (st == CLG_OK && other)
        clg_log(1, "%s: %d convolution algorithm choices are for another device; those shapes are chosen anew", what,
                other);
    if (st == CLG_OK)
        clg_log(2, "%s: %d convolution algorithm choices pinned", what, pinned);
    return st;
}

/* Marks the final choice of (shape, pass) for re-measurement at the next run
 * when its kernels took more than SLOW_RATIO x its recorded figure (per
 * sample) in training; 1 when marked. Only a trusted choice this process
 * computed with, and at most MAX_TRIES times per shape; never re-measured in
 * this process (checked). */
static int observe_one(clg_device *dev, uint64_t dh, const clg_conv_shape *s, clg_conv_pass pass, double expect_ratio)
{
    char key[160];
    shape_key(key, sizeof key, s, pass);
    int i = table_find(dh, key), u = choice_find(&g_used, dh, key);
    if (i < 0 || u < 0 || g_used.e[u].algo != g_entries[i].r.algo || !g_entries[i].r.conf ||
        g_entries[i].r.tries >= MAX_TRIES || !(expect_ratio > SLOW_RATIO))
        return 0;
    clg_conv_algo_rec *r = &g_entries[i].r;
    r->conf = 0;
    r->slow = 1;
    r->rev++;
    g_entries[i].checked = 1;
    clg_log(1, "conv auto %s: %s ran %.1fx its measured time in training; measured again at the next run", key,
            clg_conv_algo_name(r->algo), expect_ratio);
    (void)dev;
    return 1;
}

/* The recorded time of (shape, pass) scaled to s's batch, where this process computed with the recorded
 * choice; 0 otherwise. */
static double expected_ms(uint64_t dh, const clg_conv_shape *s, clg_conv_pass pass)
{
    char key[160];
    shape_key(key, sizeof key, s, pass);
    int i = table_find(dh, key), u = choice_find(&g_used, dh, key);
    if (i < 0 || u < 0 || g_used.e[u].algo != g_entries[i].r.algo || g_entries[i].r.n <= 0)
        return 0;
    return g_entries[i].r.ms * s->N / g_entries[i].r.n;
}

void clg_conv_auto_observe(clg_device *dev, const clg_conv_shape *s, double fwd_ms, double bwd_ms, int steps)
{
    if (steps < SLOW_USES || !auto_measure(dev))
        return;
    uint64_t dh = device_hash(dev);
    pthread_mutex_lock(&g_lock);
    int marked = 0;
    double ef = expected_ms(dh, s, CLG_CONV_FWD);
    if (fwd_ms > 0 && ef > 0)
        marked += observe_one(dev, dh, s, CLG_CONV_FWD, fwd_ms / ef);
    /* the backward passes together: the layer's profile does not split them */
    double ed = expected_ms(dh, s, CLG_CONV_BWD_DATA), eb = expected_ms(dh, s, CLG_CONV_BWD_FILTER);
    if (bwd_ms > 0 && ed + eb > 0) {
        marked += observe_one(dev, dh, s, CLG_CONV_BWD_DATA, bwd_ms / (ed + eb));
        marked += observe_one(dev, dh, s, CLG_CONV_BWD_FILTER, bwd_ms / (ed + eb));
    }
    if (marked)
        file_save(dev, dh);
    pthread_mutex_unlock(&g_lock);
}

unsigned clg_conv_auto_generation(void)
{
    pthread_mutex_lock(&g_lock);
    unsigned g = g_generation;
    pthread_mutex_unlock(&g_lock);
    return g;
}

void clg_conv_auto_set_timer(double (*fn)(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                          clg_conv_pass pass))
{
    pthread_mutex_lock(&g_lock);
    g_fake_ms = fn;
    pthread_mutex_unlock(&g_lock);
}

void clg_conv_auto_set_load(double (*fn)(void), const char *dir)
{
    pthread_mutex_lock(&g_lock);
    g_fake_load = fn;
    snprintf(g_dir, sizeof g_dir, "%s", dir ? dir : "");
    pthread_mutex_unlock(&g_lock);
}

void clg_conv_auto_forget(void)
{
    pthread_mutex_lock(&g_lock);
    free(g_entries);
    free(g_files);
    free(g_pending);
    free(g_used.e);
    free(g_pins.e);
    g_entries = NULL;
    g_files = NULL;
    g_pending = NULL;
    g_nentries = g_capentries = g_nfiles = g_capfiles = g_npending = g_cappending = 0;
    memset(&g_used, 0, sizeof g_used);
    memset(&g_pins, 0, sizeof g_pins);
    g_generation++;
    pthread_mutex_unlock(&g_lock);
}
