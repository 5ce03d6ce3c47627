/* Host launchers for the sequence ops (see seq.h; kernels in cl/seq.cl). */
#include <math.h>
#include <string.h>

#include "seq.h"

#define SEQ_WG 64      /* 1-D groups (global size rounded up; kernels bound-check) */
#define LN_ROWS 64     /* rows per partial sum of the layer-norm parameter gradients (cl/seq.cl's default) */

// ---- helpers ----

/* Checks that off + n fits a uint and writes off to *o. */
static clg_status fit(clg_device *dev, const char *op, size_t off, size_t n, cl_uint *o)
{
    if (off + n > 0xffffffffu || n > 0xffffffffu)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "%s: %zu elements from offset %zu exceed the 2^32 limit of the sequence kernels", op, n, off);
    *o = (cl_uint)off;
    return CLG_OK;
}

static clg_status need(clg_device *dev, const char *op, int n, const cl_mem *mems, const char *const *names)
{
    for (int i = 0; i < n; i++)
        if (!mems[i])
            return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: NULL buffer '%s'", op, names[i]);
    return CLG_OK;
}

static clg_status positive(clg_device *dev, const char *op, long long a, long long b)
{
    if (a <= 0 || b <= 0)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: empty shape %lld x %lld", op, a, b);
    return CLG_OK;
}

/* Ids travel as floats: exact integers up to 2^24. */
static clg_status vocab_ok(clg_device *dev, const char *op, int V)
{
    if (V > (1 << 24))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "%s: vocab %d exceeds 2^24 (ids are floats)", op, V);
    return CLG_OK;
}

static clg_status kget(clg_device *dev, const char *name, cl_kernel *k)
{
    return clg_kernel_get(dev, "seq", "", name, k);
}

static clg_status run2(clg_device *dev, cl_kernel k, size_t n0, size_t n1, size_t wg0)
{
    size_t g[2] = {CLG_CEIL_DIV(n0, wg0) * wg0, n1};
    size_t l[2] = {wg0, 1};
    return clg_launch(dev, k, 2, g, l, CLG_LAUNCH_FIT, NULL);
}

// ---- embedding ----

clg_status clg_seq_embedding_forward(clg_device *dev, size_t ntok, int D, int V, cl_mem ids, size_t oid,
                                     cl_mem table, cl_mem y, size_t oy, cl_mem flag)
{
    const char *op = "embedding";
    cl_mem m[4] = {ids, table, y, flag};
    static const char *const nm[4] = {"ids", "table", "y", "flag"};
    CLG_TRY(need(dev, op, 4, m, nm));
    CLG_TRY(positive(dev, op, (long long)D, (long long)V));
    CLG_TRY(vocab_ok(dev, op, V));
    cl_uint uoid, uoy, dummy;
    CLG_TRY(fit(dev, op, oid, ntok, &uoid));
    CLG_TRY(fit(dev, op, oy, ntok * (size_t)D, &uoy));
    CLG_TRY(fit(dev, op, 0, (size_t)V * D, &dummy));
    if (ntok == 0)
        return CLG_OK;
    cl_uint un = (cl_uint)ntok, uD = (cl_uint)D, uV = (cl_uint)V;
    cl_kernel k;
    CLG_TRY(kget(dev, "emb_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, un);
    CLG_KA(&a, uD);
    CLG_KA(&a, uV);
    CLG_KA(&a, ids);
    CLG_KA(&a, uoid);
    CLG_KA(&a, table);
    CLG_KA(&a, y);
    CLG_KA(&a, uoy);
    CLG_KA(&a, flag);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return run2(dev, k, (size_t)D, ntok, D >= 64 ? 64 : 16);
}

/* One launch of kernel `name` over n0 x n1 (n1 == 0: 1-D) with the
 * arguments already set. */
static clg_status emb_launch(clg_device *dev, cl_kernel k, size_t n0, size_t n1)
{
    if (n1)
        return run2(dev, k, n0, n1, n0 >= 64 ? 64 : 16);
    return clg_launch_1d(dev, k, n0, SEQ_WG);
}

/* count, scan, fill (see cl/seq.cl): start (V + 1) and list (ntok) */
static clg_status emb_sort(clg_device *dev, cl_uint un, cl_uint uV, cl_mem ids, cl_uint uoid, cl_mem cnt,
                           cl_mem start, cl_mem list)
{
    cl_kernel k;
    CLG_TRY(kget(dev, "emb_count", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, un);
    CLG_KA(&a, uV);
    CLG_KA(&a, ids);
    CLG_KA(&a, uoid);
    CLG_KA(&a, cnt);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    CLG_TRY(emb_launch(dev, k, uV, 0));
    CLG_TRY(kget(dev, "emb_scan", &k));
    clg_kargs b = {k, 0, CL_SUCCESS};
    CLG_KA(&b, uV);
    CLG_KA(&b, cnt);
    CLG_KA(&b, start);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &b, "kernel arguments"));
    CLG_TRY(emb_launch(dev, k, 1, 0));
    CLG_TRY(kget(dev, "emb_fill", &k));
    clg_kargs c = {k, 0, CL_SUCCESS};
    CLG_KA(&c, un);
    CLG_KA(&c, uV);
    CLG_KA(&c, ids);
    CLG_KA(&c, uoid);
    CLG_KA(&c, start);
    CLG_KA(&c, list);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &c, "kernel arguments"));
    return emb_launch(dev, k, uV, 0);
}

clg_status clg_seq_embedding_backward(clg_device *dev, size_t ntok, int D, int V, cl_mem ids, size_t oid, cl_mem dy,
                                      size_t ody, cl_mem dtable, int acc)
{
    const char *op = "embedding backward";
    cl_mem m[3] = {ids, dy, dtable};
    static const char *const nm[3] = {"ids", "dy", "dtable"};
    CLG_TRY(need(dev, op, 3, m, nm));
    CLG_TRY(positive(dev, op, (long long)D, (long long)V));
    CLG_TRY(vocab_ok(dev, op, V));
    cl_uint uoid = 0, uody = 0, dummy = 0;
    CLG_TRY(fit(dev, op, oid, ntok, &uoid));
    CLG_TRY(fit(dev, op, ody, ntok * (size_t)D, &uody));
    CLG_TRY(fit(dev, op, 0, (size_t)V * D + 1, &dummy));
    cl_uint un = (cl_uint)ntok, uD = (cl_uint)D, uV = (cl_uint)V, uacc = acc ? 1u : 0u;
    /* per-call temporaries: released right after enqueueing (the in-order queue orders any reuse) */
    cl_mem cnt = NULL, start = NULL, list = NULL;
    clg_status st = clg_buf_alloc(dev, (size_t)V * sizeof(cl_uint), &cnt);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, ((size_t)V + 1) * sizeof(cl_uint), &start);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, CLG_MAX(ntok, 1) * sizeof(cl_uint), &list);
    if (st == CLG_OK)
        st = emb_sort(dev, un, uV, ids, uoid, cnt, start, list);
    cl_kernel k = NULL;
    if (st == CLG_OK)
        st = kget(dev, "emb_sum", &k);
    if (st == CLG_OK) {
        clg_kargs a = {k, 0, CL_SUCCESS};
        CLG_KA(&a, uD);
        CLG_KA(&a, uV);
        CLG_KA(&a, start);
        CLG_KA(&a, list);
        CLG_KA(&a, dy);
        CLG_KA(&a, uody);
        CLG_KA(&a, dtable);
        CLG_KA(&a, uacc);
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments");
    }
    if (st == CLG_OK)
        st = emb_launch(dev, k, (size_t)D, (size_t)V);
    clg_buf_release(dev, cnt);
    clg_buf_release(dev, start);
    clg_buf_release(dev, list);
    return st;
}

// ---- learned positions ----

clg_status clg_seq_pos_forward(clg_device *dev, int N, int T, int C, cl_mem x, size_t ox, cl_mem P, cl_mem y,
                               size_t oy)
{
    const char *op = "posembed";
    cl_mem m[3] = {x, P, y};
    static const char *const nm[3] = {"x", "P", "y"};
    CLG_TRY(need(dev, op, 3, m, nm));
    CLG_TRY(positive(dev, op, (long long)T, (long long)C));
    size_t total = (size_t)N * T * C;
    cl_uint uox, uoy, utot = 0, utc = (cl_uint)((size_t)T * C);
    CLG_TRY(fit(dev, op, ox, total, &uox));
    CLG_TRY(fit(dev, op, oy, total, &uoy));
    utot = (cl_uint)total;
    if (total == 0)
        return CLG_OK;
    cl_kernel k;
    CLG_TRY(kget(dev, "pos_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, utot);
    CLG_KA(&a, utc);
    CLG_KA(&a, x);
    CLG_KA(&a, uox);
    CLG_KA(&a, P);
    CLG_KA(&a, y);
    CLG_KA(&a, uoy);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, total, 256);
}

clg_status clg_seq_pos_backward(clg_device *dev, int N, int T, int C, int context, cl_mem dy, size_t ody, cl_mem dP)
{
    const char *op = "posembed backward";
    cl_mem m[2] = {dy, dP};
    static const char *const nm[2] = {"dy", "dP"};
    CLG_TRY(need(dev, op, 2, m, nm));
    CLG_TRY(positive(dev, op, (long long)T, (long long)C));
    if (T > context)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: %d positions exceed the context %d", op, T,
                           context);
    size_t total = (size_t)N * T * C;
    cl_uint uody, dummy;
    CLG_TRY(fit(dev, op, ody, total, &uody));
    CLG_TRY(fit(dev, op, 0, (size_t)context * C, &dummy));
    cl_uint uN = (cl_uint)N, utc = (cl_uint)((size_t)T * C), uctc = (cl_uint)((size_t)context * C);
    cl_kernel k;
    CLG_TRY(kget(dev, "pos_bwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, uN);
    CLG_KA(&a, utc);
    CLG_KA(&a, uctc);
    CLG_KA(&a, dy);
    CLG_KA(&a, uody);
    CLG_KA(&a, dP);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, (size_t)context * C, SEQ_WG);
}

// ---- layer normalization ----

clg_status clg_seq_layernorm_forward(clg_device *dev, size_t rows, int C, float eps, cl_mem x, size_t ox, cl_mem gamma,
                                     cl_mem beta, cl_mem y, size_t oy, cl_mem mean, cl_mem rstd)
{
    const char *op = "layernorm";
    cl_mem m[4] = {x, y, mean, rstd};
    static const char *const nm[4] = {"x", "y", "mean", "rstd"};
    CLG_TRY(need(dev, op, 4, m, nm));
    CLG_TRY(positive(dev, op, 1, (long long)C));
    if ((gamma == NULL) != (beta == NULL))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: gamma and beta go together", op);
    if (!(eps > 0.0f) || !isfinite(eps))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: eps %g is not a positive number", op,
                           (double)eps);
    cl_uint uox, uoy, dummy;
    CLG_TRY(fit(dev, op, ox, rows * (size_t)C, &uox));
    CLG_TRY(fit(dev, op, oy, rows * (size_t)C, &uoy));
    CLG_TRY(fit(dev, op, 0, rows, &dummy));
    if (rows == 0)
        return CLG_OK;
    cl_uint ur = (cl_uint)rows, uC = (cl_uint)C, aff = gamma ? 1u : 0u;
    cl_float fe = eps;
    cl_mem g = gamma ? gamma : x, b = beta ? beta : x; /* not read without affine */
    cl_kernel k;
    CLG_TRY(kget(dev, C % 8 == 0 ? "ln_fwd8" : "ln_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, ur);
    CLG_KA(&a, uC);
    CLG_KA(&a, fe);
    CLG_KA(&a, x);
    CLG_KA(&a, uox);
    CLG_KA(&a, g);
    CLG_KA(&a, b);
    CLG_KA(&a, aff);
    CLG_KA(&a, y);
    CLG_KA(&a, uoy);
    CLG_KA(&a, mean);
    CLG_KA(&a, rstd);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, rows, SEQ_WG);
}

/* dgamma, dbeta = the sums of the chunks' partial sums part (2 C floats each), in order. */
static clg_status ln_param_sum(clg_device *dev, cl_uint chunks, cl_uint uC, cl_mem part, cl_mem dgamma, cl_mem dbeta)
{
    cl_kernel k;
    CLG_TRY(kget(dev, "ln_bwd_param_sum", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, chunks);
    CLG_KA(&a, uC);
    CLG_KA(&a, part);
    CLG_KA(&a, dgamma);
    CLG_KA(&a, dbeta);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, uC, SEQ_WG);
}

/* dgamma, dbeta: partial sums over chunks of LN_ROWS rows, then the chunks in order. */
static clg_status ln_param_grads(clg_device *dev, cl_uint ur, cl_uint uC, cl_mem x, cl_uint uox, cl_mem dy,
                                 cl_uint uody, cl_mem mean, cl_mem rstd, cl_mem dgamma, cl_mem dbeta)
{
    cl_uint chunks = (ur + LN_ROWS - 1) / LN_ROWS;
    cl_mem part = NULL;
    CLG_TRY(clg_buf_alloc(dev, (size_t)CLG_MAX(chunks, 1) * 2 * uC * sizeof(float), &part));
    cl_kernel k = NULL;
    clg_status st = chunks ? kget(dev, "ln_bwd_param", &k) : CLG_OK;
    if (st == CLG_OK && chunks) {
        clg_kargs a = {k, 0, CL_SUCCESS};
        CLG_KA(&a, ur);
        CLG_KA(&a, uC);
        CLG_KA(&a, x);
        CLG_KA(&a, uox);
        CLG_KA(&a, dy);
        CLG_KA(&a, uody);
        CLG_KA(&a, mean);
        CLG_KA(&a, rstd);
        CLG_KA(&a, part);
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments");
        if (st == CLG_OK)
            st = run2(dev, k, uC, chunks, uC >= 64 ? 64 : 16);
    }
    if (st == CLG_OK)
        st = ln_param_sum(dev, chunks, uC, part, dgamma, dbeta);
    clg_buf_release(dev, part);
    return st;
}

/* CPU devices, C a multiple of 8: dx with the chunks' dgamma, dbeta partial
 * sums in one pass (ln_bwd_fused8), then the chunks in order. */
static clg_status ln_bwd_fused(clg_device *dev, cl_uint ur, cl_uint uC, clg_kargs *a, cl_mem dgamma, cl_mem dbeta)
{
    cl_uint chunks = (ur + LN_ROWS - 1) / LN_ROWS;
    cl_mem part = NULL;
    CLG_TRY(clg_buf_alloc(dev, (size_t)chunks * 2 * uC * sizeof(float), &part));
    CLG_KA(a, part);
    clg_status st = CLG_KA_DONE(clg_dev_err(dev), a, "kernel arguments");
    if (st == CLG_OK)
        st = clg_launch_1d(dev, a->k, chunks, 1); /* a work-item per chunk: its own group */
    if (st == CLG_OK)
        st = ln_param_sum(dev, chunks, uC, part, dgamma, dbeta);
    clg_buf_release(dev, part);
    return st;
}

clg_status clg_seq_layernorm_backward(clg_device *dev, size_t rows, int C, cl_mem x, size_t ox, cl_mem dy, size_t ody,
                                      cl_mem gamma, cl_mem mean, cl_mem rstd, cl_mem dgamma, cl_mem dbeta, cl_mem dx,
                                      size_t odx)
{
    const char *op = "layernorm backward";
    cl_mem m[4] = {x, dy, mean, rstd};
    static const char *const nm[4] = {"x", "dy", "mean", "rstd"};
    CLG_TRY(need(dev, op, 4, m, nm));
    CLG_TRY(positive(dev, op, 1, (long long)C));
    if ((dgamma == NULL) != (dbeta == NULL))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: dgamma and dbeta go together", op);
    cl_uint uox, uody, uodx = 0, dummy;
    CLG_TRY(fit(dev, op, ox, rows * (size_t)C, &uox));
    CLG_TRY(fit(dev, op, ody, rows * (size_t)C, &uody));
    if (dx)
        CLG_TRY(fit(dev, op, odx, rows * (size_t)C, &uodx));
    CLG_TRY(fit(dev, op, 0, rows, &dummy));
    cl_uint ur = (cl_uint)rows, uC = (cl_uint)C;
    cl_kernel k;
    const int fused = dgamma && dx && rows > 0 && C % 8 == 0 && (dev->info.type & CLG_DEVICE_CPU);
    if (dgamma && !fused)
        CLG_TRY(ln_param_grads(dev, ur, uC, x, uox, dy, uody, mean, rstd, dgamma, dbeta));
    if (!dx || rows == 0)
        return CLG_OK;
    cl_uint aff = gamma ? 1u : 0u;
    cl_mem g = gamma ? gamma : x;
    CLG_TRY(kget(dev, fused ? "ln_bwd_fused8" : C % 8 == 0 ? "ln_bwd_dx8" : "ln_bwd_dx", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, ur);
    CLG_KA(&a, uC);
    CLG_KA(&a, x);
    CLG_KA(&a, uox);
    CLG_KA(&a, dy);
    CLG_KA(&a, uody);
    CLG_KA(&a, g);
    CLG_KA(&a, aff);
    CLG_KA(&a, mean);
    CLG_KA(&a, rstd);
    CLG_KA(&a, dx);
    CLG_KA(&a, uodx);
    if (fused)
        return ln_bwd_fused(dev, ur, uC, &a, dgamma, dbeta);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, rows, SEQ_WG);
}

// ---- token cross-entropy ----

clg_status clg_seq_token_xent_forward(clg_device *dev, size_t rows, int V, float w, float eps, cl_mem x, size_t ox,
                                      cl_mem p, size_t op_, cl_mem labels, size_t ol, cl_mem loss, cl_mem correct)
{
    const char *op = "token loss";
    cl_mem m[5] = {x, p, labels, loss, correct};
    static const char *const nm[5] = {"x", "p", "labels", "loss", "correct"};
    CLG_TRY(need(dev, op, 5, m, nm));
    CLG_TRY(positive(dev, op, 1, (long long)V));
    cl_uint uox, uop, uol;
    CLG_TRY(fit(dev, op, ox, rows * (size_t)V, &uox));
    CLG_TRY(fit(dev, op, op_, rows * (size_t)V, &uop));
    CLG_TRY(fit(dev, op, ol, rows, &uol));
    if (rows == 0)
        return CLG_OK;
    cl_uint ur = (cl_uint)rows, uV = (cl_uint)V;
    cl_float fw = w, fe = eps;
    cl_kernel k;
    CLG_TRY(kget(dev, V % 8 == 0 ? "tok_xent_fwd8" : "tok_xent_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, ur);
    CLG_KA(&a, uV);
    CLG_KA(&a, fw);
    CLG_KA(&a, fe);
    CLG_KA(&a, x);
    CLG_KA(&a, uox);
    CLG_KA(&a, p);
    CLG_KA(&a, uop);
    CLG_KA(&a, labels);
    CLG_KA(&a, uol);
    CLG_KA(&a, loss);
    CLG_KA(&a, correct);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return clg_launch_1d(dev, k, rows, SEQ_WG);
}

clg_status clg_seq_token_xent_backward(clg_device *dev, size_t rows, int V, float scale, float eps, cl_mem p,
                                       size_t op_, cl_mem labels, size_t ol, cl_mem dx, size_t odx)
{
    const char *op = "token loss backward";
    cl_mem m[3] = {p, labels, dx};
    static const char *const nm[3] = {"p", "labels", "dx"};
    CLG_TRY(need(dev, op, 3, m, nm));
    CLG_TRY(positive(dev, op, 1, (long long)V));
    cl_uint uop, uol, uodx;
    CLG_TRY(fit(dev, op, op_, rows * (size_t)V, &uop));
    CLG_TRY(fit(dev, op, ol, rows, &uol));
    CLG_TRY(fit(dev, op, odx, rows * (size_t)V, &uodx));
    if (rows == 0)
        return CLG_OK;
    cl_uint ur = (cl_uint)rows, uV = (cl_uint)V;
    cl_float fs = scale, fe = eps;
    cl_kernel k;
    CLG_TRY(kget(dev, "tok_xent_bwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    CLG_KA(&a, ur);
    CLG_KA(&a, uV);
    CLG_KA(&a, fs);
    CLG_KA(&a, fe);
    CLG_KA(&a, p);
    CLG_KA(&a, uop);
    CLG_KA(&a, labels);
    CLG_KA(&a, uol);
    CLG_KA(&a, dx);
    CLG_KA(&a, uodx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "kernel arguments"));
    return run2(dev, k, (size_t)V, rows, V >= 64 ? 64 : 16);
}
