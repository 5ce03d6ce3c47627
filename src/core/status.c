/* Status codes, error buffers and logging. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

int clg_log_level = 0;

const char *clg_status_string(clg_status st)
{
    switch (st) {
#define CLG_X_MSG(name, code, msg) \
    case CLG_##name:               \
        return msg;
        CLG_STATUS_MAP(CLG_X_MSG)
#undef CLG_X_MSG
    }
    return "unknown status";
}

const char *clg_status_name(clg_status st)
{
    switch (st) {
#define CLG_X_NAME(name, code, msg) \
    case CLG_##name:                \
        return #name;
        CLG_STATUS_MAP(CLG_X_NAME)
#undef CLG_X_NAME
    }
    return "UNKNOWN";
}

unsigned clg_version(void) { return CLG_VERSION_HEX; }

#define CLG_STR2(x) #x
#define CLG_STR(x) CLG_STR2(x)
const char *clg_version_string(void)
{
    return CLG_STR(CLG_VERSION_MAJOR) "." CLG_STR(CLG_VERSION_MINOR) "." CLG_STR(CLG_VERSION_PATCH);
}

static _Thread_local clg_err tls_err;
static atomic_uint_fast64_t g_err_seq;

clg_err *clg_err_tls(void) { return &tls_err; }

clg_status clg_err_setv(clg_err *err, clg_status st, const char *fmt, va_list ap)
{
    if (!err)
        err = &tls_err;
    char tmp[CLG_ERR_LEN];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    /* tmp may be built from err->msg (appending context): copy last */
    memcpy(err->msg, tmp, sizeof tmp);
    err->seq = atomic_fetch_add(&g_err_seq, 1) + 1;
    clg_log(2, "error %s: %s", clg_status_name(st), err->msg);
    return st;
}

void clg_err_copy(clg_err *dst, const clg_err *src)
{
    if (dst != src)
        *dst = *src;
}

clg_status clg_err_set(clg_err *err, clg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clg_status r = clg_err_setv(err, st, fmt, ap);
    va_end(ap);
    return r;
}

void clg_log(int level, const char *fmt, ...)
{
    if (level > clg_log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("clgrad: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
