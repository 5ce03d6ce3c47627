/* clgrad bench allreduce [--min-kib K] [--max-mib M] [--deterministic] [--json]:
 * all-reduce bandwidth across the MPI ranks of the job (run it under mpirun). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct allreduce_opts {
    cli_common c;
    long min_kib, max_mib;
} allreduce_opts;

static const cli_opt opts[] = {
    CLI_INT_OPT("--min-kib", allreduce_opts, min_kib, 1, 1 << 20, "K", "smallest size in KiB (default 1)"),
    CLI_INT_OPT("--max-mib", allreduce_opts, max_mib, 1, 4096, "M", "largest size in MiB (default 256)"),
    CLI_OPT_MPI,
    CLI_FLAG_OPT("--json", cli_common, json, 1, "one JSON object per size"),
    CLI_END,
};

const cli_spec cli_spec_bench_allreduce = {
    .name = "bench allreduce",
    .synopsis = "[--min-kib K] [--max-mib M] [--deterministic] [--json]   (under mpirun -np R)",
    .about = "Times the gradient all-reduce of `clgrad train` (sum of float buffers over the ranks,\n"
             "polled as training polls it) for sizes from 1 KiB to 256 MiB (x4 steps), and a\n"
             "rank 0 <-> rank 1 ping-pong of the largest size as the link's own bandwidth.\n"
             "Bus bandwidth = size * 2(R-1)/R / time (what a ring all-reduce moves per rank).",
    .opts = opts,
};

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_allreduce(int argc, char **argv)
{
    allreduce_opts o = {.min_kib = 1, .max_mib = 256};
    CLI_PARSE(&cli_spec_bench_allreduce, argc, argv, &o);
    long min_kib = o.min_kib, max_mib = o.max_mib;
    int json = o.c.json, det = o.c.deterministic;
    clg_mpi_configure(o.c.comm_timeout, o.c.deterministic);
    int R = clg_mpi_size(), me = clg_mpi_rank();
    if (R < 2) {
        fprintf(stderr, "clgrad bench allreduce: one rank: nothing to reduce (run it under mpirun -np 2 or more)\n");
        return CLI_OK;
    }
    size_t maxb = (size_t)max_mib << 20, minb = (size_t)min_kib << 10;
    float *buf = malloc(maxb), *ref = malloc(maxb);
    if (!buf || !ref) {
        free(buf);
        free(ref);
        return cli_fail("bench allreduce: out of memory for %zu bytes", maxb);
    }
    int rc = CLI_OK;
    if (me == 0 && !json)
        printf("%d ranks, %s all-reduce of float sums\n%12s %8s %12s %12s %12s\n", R,
               det ? "deterministic (gather + rank order)" : clg_mpi_algorithm(), "bytes", "iters", "median ms",
               "algbw GB/s", "busbw GB/s");
    for (size_t bytes = minb; bytes <= maxb && rc == CLI_OK; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        for (size_t k = 0; k < n; k++) /* checked: the sum of (rank + 1) * (k % 7) */
            ref[k] = (float)((me + 1) * (int)(k % 7));
        /* iterations: ~0.3 s per size, at least 3 (synchronized through rank 0's count) */
        double t_one = 0;
        int iters = 0;
        double times[64];
        for (int it = -1; it < 64 && rc == CLI_OK; it++) {
            memcpy(buf, ref, bytes);
            double c[1] = {0};
            if (clg_mpi_barrier() != CLG_OK) {
                rc = CLI_FAIL;
                break;
            }
            double t0 = cli_now();
            if (clg_mpi_allreduce_f32(buf, n) != CLG_OK) {
                rc = CLI_FAIL;
                break;
            }
            double dt = cli_now() - t0;
            if (it < 0) { /* warm-up: check the result once */
                double want_mul = R * (R + 1) / 2.0;
                for (size_t k = 0; k < n; k += 97)
                    if (buf[k] != (float)(want_mul * (double)(k % 7))) {
                        fprintf(stderr, "clgrad: bench allreduce: wrong sum at element %zu: %g, expected %g\n", k,
                                (double)buf[k], want_mul * (double)(k % 7));
                        rc = CLI_FAIL;
                        break;
                    }
                t_one = dt;
                continue;
            }
            times[iters++] = dt;
            c[0] = (iters >= 3 && (iters * t_one > 0.3 || iters >= 64)) ? 1 : 0;
            if (clg_mpi_allreduce_f64(c, 1) != CLG_OK) { /* every rank stops together */
                rc = CLI_FAIL;
                break;
            }
            if (c[0] >= 1)
                break;
        }
        if (rc != CLI_OK)
            break;
        /* (rank 0's times: every iteration starts at a barrier and ends when all data arrived) */
        double med = median(times, iters);
        double alg = bytes / med / 1e9, bus = alg * 2.0 * (R - 1) / R;
        if (me == 0) {
            if (json)
                printf("{\"bytes\": %zu, \"ranks\": %d, \"iters\": %d, \"median_ms\": %.4f, \"algbw_gbs\": %.4f, "
                       "\"busbw_gbs\": %.4f, \"deterministic\": %d}\n",
                       bytes, R, iters, med * 1e3, alg, bus, det);
            else
                printf("%12zu %8d %12.4f %12.4f %12.4f\n", bytes, iters, med * 1e3, alg, bus);
            fflush(stdout);
        }
    }
    /* the link itself: rank 0 -> 1 -> 0 ping-pong of the largest size */
    if (rc == CLI_OK) {
        double bw = 0;
        if (clg_mpi_pingpong(buf, maxb, 3, &bw) != CLG_OK)
            rc = CLI_FAIL;
        else if (me == 0) {
            if (json)
                printf("{\"pingpong_bytes\": %zu, \"link_gbs\": %.4f}\n", maxb, bw);
            else
                printf("link (rank 0 <-> 1 ping-pong, %zu bytes): %.4f GB/s one way\n", maxb, bw);
        }
    }
    if (rc != CLI_OK)
        cli_fail("bench allreduce: %s", clg_last_error(NULL));
    free(buf);
    free(ref);
    return rc;
}
