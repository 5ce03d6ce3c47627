/* Tuning database under concurrent writers: several processes (a sweep's
 * trials, background tuning beside a training run) each add their own keys
 * and save at the same moment, round after round; after every round the
 * file must hold every key saved so far (clg_tune_save reads, merges and
 * replaces the file under its lock, so no writer overwrites another's
 * update with an older copy); and the atomic replacement itself under
 * writers of one file at the same moment. */
#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/tune.h"
#include "testutil.h"

#define NPROC 6
#define ROUNDS 4

static const char *g_dir = "tune-concurrent-test"; /* under the build dir */

static void key_of(char *buf, size_t n, int p, int r) { snprintf(buf, n, "gemm/proc%dround%d", p, r); }

/* One writer: a context of its own; per round waits for the go byte, adds
 * its key, saves, reports. Exit status 0 when every save succeeded. */
static int writer(int p, int rd, int wr)
{
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    cp.devices = "0";
    cp.cache_dir = g_dir;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&cp, &ctx);
    if (st != CLG_OK) { /* 's': skip (no device), 'f': failed */
        fprintf(stderr, "writer %d: %s\n", p, clg_last_error(NULL));
        char c = st == CLG_ERR_NO_DEVICE ? 's' : 'f';
        return write(wr, &c, 1) == 1 && st == CLG_ERR_NO_DEVICE ? TU_SKIP : 2;
    }
    clg_device *d = &ctx->devs[0];
    int bad = 0;
    char c = 'r'; /* ready */
    if (write(wr, &c, 1) != 1)
        return 2;
    for (int r = 0; r < ROUNDS; r++) {
        if (read(rd, &c, 1) != 1) /* the go byte (EOF: the parent gave up) */
            return 2;
        clg_tune_entry e;
        memset(&e, 0, sizeof e);
        key_of(e.key, sizeof e.key, p, r);
        clg_tune_set(&e, "family", p);
        if (clg_tune_put(d, &e) != CLG_OK || clg_tune_save(d) != CLG_OK) {
            fprintf(stderr, "writer %d: %s\n", p, clg_last_error(ctx));
            bad = 1;
        }
        c = 'd'; /* done */
        if (write(wr, &c, 1) != 1)
            return 2;
    }
    clg_ctx_destroy(ctx);
    return bad;
}

/* The text of the one database file under g_dir/tune (malloc'd; NULL when none). */
static char *read_db(void)
{
    char dir[256], path[600];
    snprintf(dir, sizeof dir, "%s/tune", g_dir);
    DIR *dd = opendir(dir);
    if (!dd)
        return NULL;
    struct dirent *de;
    path[0] = 0;
    while ((de = readdir(dd)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".json") == 0)
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    }
    closedir(dd);
    FILE *f = path[0] ? fopen(path, "rb") : NULL;
    if (!f)
        return NULL;
    char *text = calloc(1, 1 << 20);
    size_t n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    (void)n;
    fclose(f);
    return text;
}

static void rm_db(void)
{
    char dir[256], path[600];
    snprintf(dir, sizeof dir, "%s/tune", g_dir);
    DIR *dd = opendir(dir);
    if (!dd)
        return;
    struct dirent *de;
    while ((de = readdir(dd)) != NULL)
        if (de->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            remove(path);
        }
    closedir(dd);
}

START_TEST(test_concurrent_writers)
{
    rm_db();
    int to_child[NPROC][2], to_parent[2];
    pid_t pid[NPROC];
    ck_assert_int_eq(pipe(to_parent), 0);
    for (int p = 0; p < NPROC; p++) {
        ck_assert_int_eq(pipe(to_child[p]), 0);
        pid[p] = fork();
        ck_assert_int_ge(pid[p], 0);
        if (pid[p] == 0) {
            /* no write end of a go pipe stays open here, so a writer sees
             * EOF when the parent stops */
            for (int q = 0; q <= p; q++)
                close(to_child[q][1]);
            close(to_parent[0]);
            _exit(writer(p, to_child[p][0], to_parent[1]));
        }
        close(to_child[p][0]);
    }
    close(to_parent[1]);
    for (int p = 0; p < NPROC; p++) { /* every writer has its context */
        char c = 0;
        ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
        if (c == 's') {
            for (int q = 0; q < NPROC; q++)
                kill(pid[q], SIGKILL);
            exit(TU_SKIP);
        }
        ck_assert_msg(c == 'r', "a writer could not create its context");
    }
    int lost = 0;
    for (int r = 0; r < ROUNDS; r++) {
        char c;
        for (int p = 0; p < NPROC; p++) /* go, all at once */
            ck_assert_int_eq(write(to_child[p][1], "g", 1), 1);
        for (int p = 0; p < NPROC; p++) {
            ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
            ck_assert_int_eq(c, 'd');
        }
        char *text = read_db();
        ck_assert_ptr_nonnull(text);
        for (int p = 0; p < NPROC; p++)
            for (int q = 0; q <= r; q++) {
                char key[64], quoted[80];
                key_of(key, sizeof key, p, q);
                snprintf(quoted, sizeof quoted, "\"%s\"", key);
                if (!strstr(text, quoted)) {
                    fprintf(stderr, "round %d: %s lost\n", r, key);
                    lost++;
                }
            }
        free(text);
    }
    for (int p = 0; p < NPROC; p++) {
        int status = 0;
        ck_assert_int_eq(waitpid(pid[p], &status, 0), pid[p]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed (status %d)", p, status);
    }
    ck_assert_msg(lost == 0, "%d updates lost", lost);
}
END_TEST

/* The atomic replacement under it (clg_file_write_atomic, no lock): writers
 * of one file at the same moment must all succeed, each sweeping the
 * temporaries killed writers left without deleting a live writer's; the
 * file is always one writer's whole text. */
START_TEST(test_atomic_writers)
{
    const char *path = "tune-concurrent-test/atomic.txt";
    clg_err err = {0};
    ck_assert(clg_mkdirs(&err, "tune-concurrent-test") == CLG_OK);
    enum { WRITES = 40, BYTES = 200000 };
    pid_t pid[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pid[p] = fork();
        ck_assert_int_ge(pid[p], 0);
        if (pid[p] == 0) {
            char *buf = malloc(BYTES);
            int bad = !buf;
            for (int i = 0; i < WRITES && !bad; i++) {
                memset(buf, 'a' + p, BYTES);
                clg_err e = {0};
                if (clg_file_write_atomic(&e, path, buf, BYTES) != CLG_OK) {
                    fprintf(stderr, "writer %d, write %d: %s\n", p, i, e.msg);
                    bad = 1;
                }
            }
            free(buf);
            _exit(bad);
        }
    }
    int failed = 0;
    for (int p = 0; p < NPROC; p++) {
        int status = 0;
        ck_assert_int_eq(waitpid(pid[p], &status, 0), pid[p]);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    ck_assert_msg(failed == 0, "%d of %d writers failed", failed, NPROC);
    char *text = NULL;
    size_t len = 0;
    ck_assert(clg_file_read(&err, path, &text, &len) == CLG_OK);
    ck_assert_uint_eq(len, BYTES);
    for (size_t i = 1; i < len; i++)
        ck_assert_msg(text[i] == text[0], "the file mixes two writers' bytes at %zu", i);
    free(text);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_concurrent_writers, test_atomic_writers};
    return tu_run_tests("tune-concurrent", 120, tests, 2);
}
