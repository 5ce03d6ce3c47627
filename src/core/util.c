/* Hashing, CRC, files, time, random numbers and a small string builder. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

// ---- hashing ----

uint64_t clg_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t clg_hash_str(const char *s, uint64_t seed)
{
    /* include the terminator so ("ab","c") and ("a","bc") differ */
    return clg_hash64(s ? s : "", (s ? strlen(s) : 0) + 1, seed);
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t clg_crc32(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init); /* devices' threads checksum concurrently */
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

// ---- files ----

clg_status clg_file_read(clg_err *err, const char *path, char **out, size_t *len)
{
    *out = NULL;
    if (len)
        *len = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then
     * refused by the regular-file check below. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return clg_err_set(err, errno == ENOENT ? CLG_ERR_NOT_FOUND : CLG_ERR_IO, "cannot open '%s': %s",
                           path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return clg_err_set(err, CLG_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return clg_err_set(err, CLG_ERR_IO, "'%s' is %s, not a regular file", path,
                           S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO" : "a special file");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (sb.st_size < 0 || (uint64_t)sb.st_size >= (uint64_t)SIZE_MAX) {
        close(fd);
        return clg_err_set(err, CLG_ERR_IO, "'%s' is too large to read", path);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "no memory to read '%s' (%zu bytes)", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return clg_err_set(err, CLG_ERR_IO, "short read on '%s' (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len)
        *len = n;
    return CLG_OK;
}

clg_status clg_text_check_nul(clg_err *err, const char *source, const char *text, size_t len)
{
    const char *z = memchr(text, 0, len);
    if (z)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:offset %zu: NUL byte in a text file (binary or corrupt?)", source,
                           (size_t)(z - text));
    return CLG_OK;
}

clg_status clg_file_read_text(clg_err *err, const char *path, char **out, size_t *len)
{
    size_t n = 0;
    clg_status st = clg_file_read(err, path, out, &n);
    if (st != CLG_OK)
        return st;
    st = clg_text_check_nul(err, path, *out, n);
    if (st != CLG_OK) {
        free(*out);
        *out = NULL;
        return st;
    }
    if (len)
        *len = n;
    return CLG_OK;
}

/* "NAME.tmp.XXXXXX" (mkstemp's six characters) for base NAME. */
static int is_temp_of(const char *entry, const char *base)
{
    size_t bl = strlen(base);
    if (strncmp(entry, base, bl) != 0 || strncmp(entry + bl, ".tmp.", 5) != 0)
        return 0;
    const char *x = entry + bl + 5;
    size_t k = 0;
    for (; x[k]; k++)
        if (!((x[k] >= 'a' && x[k] <= 'z') || (x[k] >= 'A' && x[k] <= 'Z') || (x[k] >= '0' && x[k] <= '9')))
            return 0;
    return k == 6;
}

/* Removes NAME.tmp.XXXXXX files left by writers killed before their
 * rename: only those modified before `before` (the start of this write), so
 * a concurrent writer's fresh temporary file is kept. Best effort. Returns
 * how many were removed; the first one's name into first (cap > 0). */
static int remove_stale_temps(const char *dir, const char *base, const struct timespec *before, char *first,
                              size_t cap)
{
    int removed = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_temp_of(e->d_name, base))
            continue;
        struct stat sb;
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (sb.st_mtim.tv_sec < before->tv_sec ||
            (sb.st_mtim.tv_sec == before->tv_sec && sb.st_mtim.tv_nsec < before->tv_nsec)) {
            /* a live writer holds its temporary under flock (temp_create): not stale */
            int tfd = openat(dfd, e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (tfd < 0)
                continue;
            int live = flock(tfd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
            if (!live && unlinkat(dfd, e->d_name, 0) == 0 && removed++ == 0 && cap > 0)
                snprintf(first, cap, "%s/%s", dir, e->d_name);
            close(tfd);
        }
    }
    closedir(d);
    return removed;
}

/* Directory and base name of path ("." when it has no slash); malloc'd dir. */
static char *split_dir(const char *path, const char **base)
{
    const char *sl = strrchr(path, '/');
    *base = sl ? sl + 1 : path;
    size_t n = sl ? (size_t)(sl - path) : 1;
    char *d = malloc(n + 1);
    if (!d)
        return NULL;
    if (!sl)
        memcpy(d, ".", 2);
    else if (n == 0)
        memcpy(d, "/", 2);
    else {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

int clg_file_remove_stale_temps(const char *path, char *first, size_t cap)
{
    const char *base = NULL;
    char *dir = split_dir(path, &base);
    struct timespec now;
    if (cap > 0)
        first[0] = 0;
    if (!dir || clock_gettime(CLOCK_REALTIME, &now) != 0) {
        free(dir);
        return 0;
    }
    int n = remove_stale_temps(dir, base, &now, first, cap);
    free(dir);
    return n;
}

int clg_file_lock(const char *path, double timeout_s)
{
    size_t pl = strlen(path);
    char *lp = malloc(pl + 8);
    if (!lp)
        return -1;
    snprintf(lp, pl + 8, "%s.lock", path);
    int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    free(lp);
    if (fd < 0)
        return -1;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    double t0 = clg_now_sec();
    while (fcntl(fd, F_SETLK, &fl) != 0) {
        if ((errno != EACCES && errno != EAGAIN && errno != EINTR) || clg_now_sec() - t0 > timeout_s) {
            close(fd);
            return -1;
        }
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);
    }
    return fd;
}

void clg_file_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* closing drops the process's fcntl locks on the file */
}

/* A new temporary from the template tmp ("...XXXXXX", rewritten), held under
 * an exclusive flock until its descriptor closes, so another writer's sweep
 * of stale temporaries leaves it alone; one a sweep removed between its
 * creation and the lock is replaced. -1 with errno on failure. */
static int temp_create(char *tmp)
{
    size_t tl = strlen(tmp);
    for (int tries = 0; tries < 8; tries++) {
        memcpy(tmp + tl - 6, "XXXXXX", 6);
        int fd = mkstemp(tmp);
        if (fd < 0)
            return -1;
        if (flock(fd, LOCK_EX) != 0)
            return fd; /* no flock on this file system: as before, unguarded */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(tmp, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return fd;
        close(fd); /* swept before the lock: another name */
    }
    errno = EAGAIN;
    return -1;
}

clg_status clg_file_write_atomic(clg_err *err, const char *path, const void *data, size_t len)
{
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 32);
    const char *base = NULL;
    char *dir = split_dir(path, &base);
    if (!tmp || !dir) {
        free(tmp);
        free(dir);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "no memory");
    }
    snprintf(tmp, pl + 32, "%s.tmp.XXXXXX", path);
    int fd = temp_create(tmp);
    if (fd < 0) {
        clg_status st = clg_err_set(err, CLG_ERR_IO, "cannot create temporary file for '%s': %s", path,
                                    strerror(errno));
        free(tmp);
        free(dir);
        return st;
    }
    struct stat own;
    int have_start = fstat(fd, &own) == 0;
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            goto fail;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fchmod(fd, 0644) != 0 || fsync(fd) != 0)
        goto fail;
    /* renamed while still open, so under its lock until it has its name */
    if (rename(tmp, path) != 0)
        goto fail;
    (void)close(fd); /* the data is on disk (fsync) */
    fd = -1;
    /* make the rename durable, then sweep what killed writers left */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    if (have_start)
        (void)remove_stale_temps(dir, base, &own.st_mtim, NULL, 0);
    free(tmp);
    free(dir);
    return CLG_OK;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    free(dir);
    return clg_err_set(err, CLG_ERR_IO, "cannot write '%s': %s", path, strerror(e));
}

clg_status clg_mkdirs(clg_err *err, const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return clg_err_set(err, CLG_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return clg_err_set(err, CLG_ERR_IO, "'%s' is not a directory", path);
    return CLG_OK;
}

// ---- time ----

double clg_now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_clock(clockid_t id)
{
    struct timespec ts;
    return clock_gettime(id, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : 0.0;
}

double clg_thread_cpu_sec(void) { return cpu_clock(CLOCK_THREAD_CPUTIME_ID); }

double clg_process_cpu_sec(void) { return cpu_clock(CLOCK_PROCESS_CPUTIME_ID); }

// ---- random numbers: PCG32 (O'Neill), XSH-RR variant ----

void clg_rng_seed(clg_rng *r, uint64_t seed, uint64_t stream)
{
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    clg_rng_u32(r);
    r->state += seed;
    clg_rng_u32(r);
}

uint32_t clg_rng_u32(clg_rng *r)
{
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t xs = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xs >> rot) | (xs << ((-rot) & 31));
}

float clg_rng_uniform(clg_rng *r) { return (float)(clg_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float clg_rng_normal(clg_rng *r)
{
    float u1 = clg_rng_uniform(r), u2 = clg_rng_uniform(r);
    if (u1 < 1e-7f)
        u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

// ---- string builder ----

void clg_sbuf_printf(clg_sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = (b->cap ? b->cap * 2 : 256) + (size_t)n;
        char *nd = realloc(b->data, ncap);
        if (!nd) {
            b->oom = 1;
            return;
        }
        b->data = nd;
        b->cap = ncap;
    }
}

void clg_sbuf_json_str(clg_sbuf *b, const char *s)
{
    clg_sbuf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            clg_sbuf_printf(b, "\\%c", *p);
        else if (*p < 0x20)
            clg_sbuf_printf(b, "\\u%04x", *p);
        else
            clg_sbuf_printf(b, "%c", *p);
    }
    clg_sbuf_printf(b, "\"");
}

void clg_sbuf_free(clg_sbuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

int clg_str_icontains(const char *s, const char *w)
{
    size_t n = strlen(w);
    for (; *s; s++) {
        size_t i = 0;
        while (i < n && s[i] && tolower((unsigned char)s[i]) == tolower((unsigned char)w[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

// ---- caller-sized structs ----

void clg_sized_init(void *dst, size_t size, const void *defaults, size_t full)
{
    if (!dst || size < sizeof(size_t))
        return;
    memcpy(dst, defaults, size < full ? size : full);
    if (size > full) /* a newer caller: fields this library does not know stay zero */
        memset((char *)dst + full, 0, size - full);
    memcpy(dst, &size, sizeof size);
}

clg_status clg_sized_read(clg_err *err, const char *what, void *dst, size_t full, const void *src)
{
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < sizeof(size_t) || size > 65536)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "%s: size field is %zu, not the struct's size: initialise it with %s_init() first", what,
                           size, what);
    memcpy(dst, src, size < full ? size : full);
    memcpy(dst, &full, sizeof full);
    return CLG_OK;
}

void clg_sized_write(void *dst, size_t size, const void *src, size_t full)
{
    if (dst && size)
        memcpy(dst, src, size < full ? size : full);
}
