/* clgrad sweep under mpirun: the files through which rank 0, which runs
 * the search, hands jobs to the other ranks and hears back from them
 * (DIR/ranks/). Every file is written atomically (a temporary file and a
 * rename, clg_write_file_atomic), so a reader on the same machine or on
 * another that shares the directory sees a whole file or none; each
 * mailbox (rank R, slot S) has one writer at a time: rank 0 posts a job
 * only to an idle slot, the slot's rank takes it (reads and removes it),
 * runs it and posts the process's end, which rank 0 takes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sweep.h"

static void rpath(const char *dir, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ranks%s%s", dir, name ? "/" : "", name ? name : "");
}

/* Reads a small file whole (NUL-terminated): 1 read, 0 absent, -1 error. */
static int slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? 0 : -1;
    size_t n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f);
    fclose(f);
    buf[n] = 0;
    return bad ? -1 : 1;
}

static int put(const char *dir, const char *name, const char *text)
{
    char path[4200];
    rpath(dir, name, path, sizeof path);
    if (clg_write_file_atomic(path, text, strlen(text)) != CLG_OK)
        return cli_fail("sweep: %s", clg_last_error(NULL)), -1;
    return 0;
}

int sweep_ranks_reset(const char *dir)
{
    char path[4200];
    rpath(dir, NULL, path, sizeof path);
    DIR *d = opendir(path);
    if (d) { /* a killed sweep's mailboxes */
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char f[4600];
            if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
                continue;
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            if (unlink(f) && errno != ENOENT) {
                closedir(d);
                return cli_fail("sweep: %s: %s", f, strerror(errno)), -1;
            }
        }
        closedir(d);
    } else if (mkdir(path, 0755) && errno != EEXIST) {
        return cli_fail("sweep: %s: %s", path, strerror(errno)), -1;
    }
    return 0;
}

int sweep_ranks_hello(const char *dir, int rank, const char *host, int ngroups, const char (*groups)[32])
{
    char text[4096], name[64];
    int len = snprintf(text, sizeof text, "%s\n%d\n", host, ngroups);
    for (int i = 0; i < ngroups && len < (int)sizeof text; i++)
        len += snprintf(text + len, sizeof text - (size_t)len, "%s\n", groups[i]);
    if (len >= (int)sizeof text)
        return cli_fail("sweep: too many device groups to list"), -1;
    snprintf(name, sizeof name, "rank-%d.hello", rank);
    return put(dir, name, text);
}

int sweep_ranks_read_hello(const char *dir, int rank, char *host, size_t hcap, int *ngroups, char (*groups)[32],
                           int maxg)
{
    char path[4200], text[4096], name[64];
    snprintf(name, sizeof name, "rank-%d.hello", rank);
    rpath(dir, name, path, sizeof path);
    if (slurp(path, text, sizeof text) != 1)
        return cli_fail("sweep: %s: cannot read it (is the sweep's directory shared by every rank?)", path), -1;
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    char *num = line ? strtok_r(NULL, "\n", &save) : NULL;
    int n = num ? atoi(num) : -1;
    if (!line || n < 0 || n > maxg)
        return cli_fail("sweep: %s: not a rank's greeting", path), -1;
    snprintf(host, hcap, "%s", line);
    for (int i = 0; i < n; i++) {
        const char *g = strtok_r(NULL, "\n", &save);
        if (!g)
            return cli_fail("sweep: %s: not a rank's greeting", path), -1;
        snprintf(groups[i], 32, "%s", g);
    }
    *ngroups = n;
    return 0;
}

int sweep_ranks_post(const char *dir, int rank, int slot, const sw_job *job)
{
    char text[96], name[64];
    snprintf(text, sizeof text, "%d %d %d\n", job->trial, job->rung, job->epochs);
    snprintf(name, sizeof name, "r%d-s%d.job", rank, slot);
    return put(dir, name, text);
}

/* Takes (reads and removes) a mailbox file: 1 taken, 0 none, -1 error. */
static int take(const char *dir, const char *name, char *text, size_t cap)
{
    char path[4200];
    rpath(dir, name, path, sizeof path);
    int r = slurp(path, text, cap);
    if (r < 0)
        return cli_fail("sweep: %s: %s", path, strerror(errno)), -1;
    if (r == 0)
        return 0;
    if (unlink(path))
        return cli_fail("sweep: %s: %s", path, strerror(errno)), -1;
    return 1;
}

int sweep_ranks_take(const char *dir, int rank, int slot, sw_job *job)
{
    char text[96], name[64];
    snprintf(name, sizeof name, "r%d-s%d.job", rank, slot);
    int r = take(dir, name, text, sizeof text);
    if (r == 1 && sscanf(text, "%d %d %d", &job->trial, &job->rung, &job->epochs) != 3)
        return cli_fail("sweep: ranks/%s: not a job", name), -1;
    return r;
}

int sweep_ranks_done(const char *dir, int rank, int slot, int status)
{
    char text[32], name[64];
    snprintf(text, sizeof text, "%d\n", status);
    snprintf(name, sizeof name, "r%d-s%d.done", rank, slot);
    return put(dir, name, text);
}

int sweep_ranks_collect(const char *dir, int rank, int slot, int *status)
{
    char text[32], name[64];
    snprintf(name, sizeof name, "r%d-s%d.done", rank, slot);
    int r = take(dir, name, text, sizeof text);
    if (r == 1 && sscanf(text, "%d", status) != 1)
        return cli_fail("sweep: ranks/%s: not a process's end", name), -1;
    return r;
}

int sweep_ranks_end(const char *dir) { return put(dir, "end", "end\n"); }

int sweep_ranks_ended(const char *dir)
{
    char path[4200];
    rpath(dir, "end", path, sizeof path);
    return access(path, F_OK) == 0;
}
