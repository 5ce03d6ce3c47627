// Batch normalization over (N, HW) per channel, NCHW layout.
// Reductions in two steps, no atomics, fixed order (deterministic):
//   partial: 2-D range (i < HW, c): each work-item sums over the batch n for
//            its (c, i) -- contiguous across work-items, so it vectorizes;
//   finish:  one work-item per channel sums its HW partials.
// 2-D kernels run on exact ranges (the host picks local sizes that divide
// them) and so carry no bounds checks: on CPU back-ends a bounds check in a
// multi-dimensional kernel can defeat vectorization across work-items.
// Statistics use data shifted by the channel's first element K (x[0, c, 0])
// so the one-pass variance does not cancel when |mean| >> std; the mean is
// kept in that shifted form (mean[c] = batch mean - K) and every kernel
// forms x - mean as (x - K) - mean[c], so a mean far from zero is never
// rounded to float before the subtraction (batch 2-3 after a dense layer,
// where x - mean is a small difference of large values). The per-channel
// sums over HW partials are compensated (Neumaier).
// PyTorch convention: running = (1 - momentum) * running + momentum * batch,
// running_var uses the unbiased batch variance, normalization the biased one.

// Per-(c, i) partial sums over the batch. The loop over n inside a
// work-item keeps CPU back-ends from vectorizing across work-items, so each
// work-item handles W consecutive i with explicit vectors (W = 8, 4 or 1,
// chosen by the host from HW % W): range (HW / W, C).
#define VLOAD1(i, p) ((p)[i])
#define VSTORE1(v, i, p) ((p)[i] = (v))

// part[c*HW + i] = sum_n (x - K), part2[...] = sum_n (x - K)^2
#define BN_STATS_PARTIAL(SUF, T, LOAD, STORE)                                                               \
    __kernel void bn_stats_partial##SUF(const uint N, const uint C, const uint HW, __global const float *x,     \
                                        const uint ox, __global float *part, __global float *part2)             \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint c = get_global_id(1);                                                                    \
        __global const float *xc = x + ox + (size_t)c * HW;                                                 \
        const float K = xc[0];                                                                              \
        const size_t cs = (size_t)C * HW;                                                                   \
        T s = (T)(0.0f), q = (T)(0.0f);                                                                     \
        for (uint n = 0; n < N; n++) {                                                                      \
            const T d = LOAD(i, xc + n * cs) - K;                                                           \
            s += d;                                                                                         \
            q += d * d;                                                                                     \
        }                                                                                                   \
        STORE(s, i, part + (size_t)c * HW);                                                                 \
        STORE(q, i, part2 + (size_t)c * HW);                                                                \
    }
BN_STATS_PARTIAL(, float, VLOAD1, VSTORE1)
BN_STATS_PARTIAL(4, float4, vload4, vstore4)
BN_STATS_PARTIAL(8, float8, vload8, vstore8)

// *sa = sum a[0..n), *sb = sum b[0..n), each with Neumaier's compensation.
static void sum2_compensated(__global const float *a, __global const float *b, const uint n, float *sa, float *sb)
{
    float s = 0.0f, cs = 0.0f, q = 0.0f, cq = 0.0f;
    for (uint i = 0; i < n; i++) {
        const float va = a[i], vb = b[i];
        const float ts = s + va, tq = q + vb;
        cs += fabs(s) >= fabs(va) ? (s - ts) + va : (va - ts) + s;
        cq += fabs(q) >= fabs(vb) ? (q - tq) + vb : (vb - tq) + q;
        s = ts;
        q = tq;
    }
    *sa = s + cs;
    *sb = q + cq;
}

// mean[c] (shifted: batch mean - x[0, c, 0]), invstd[c]; update != 0 also
// moves the running stats.
// P partials per channel: HW (the forms above) or N (the row forms below).
__kernel void bn_stats_finish(const uint N, const uint C, const uint HW, const uint P, const float momentum,
                              const float eps, const int update, __global const float *x, const uint ox,
                              __global const float *part, __global const float *part2, __global float *mean,
                              __global float *invstd, __global float *rmean, __global float *rvar)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    const float K = x[ox + (size_t)c * HW];
    float s, q;
    sum2_compensated(part + (size_t)c * P, part2 + (size_t)c * P, P, &s, &q);
    const float M = (float)N * (float)HW;
    const float ds = s / M;
    const float var = fmax(q / M - ds * ds, 0.0f);
    const float mu = K + ds;
    mean[c] = ds;
    invstd[c] = 1.0f / sqrt(var + eps);
    if (update) {
        const float unbiased = M > 1.0f ? var * (M / (M - 1.0f)) : var;
        rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mu;
        rvar[c] = (1.0f - momentum) * rvar[c] + momentum * unbiased;
    }
}

// 2-D range (i < HW, row = n*C + c): y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]
__kernel void bn_apply(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,
                       __global float *y, const uint oy, __global const float *mean, __global const float *invstd,
                       __global const float *gamma, __global const float *beta)
{
    const uint i = get_global_id(0);
    const uint row = get_global_id(1);
    const uint c = row % C;
    const size_t k = (size_t)row * HW + i;
    const float a = invstd[c] * gamma[c];
    y[oy + k] = ((x[ox + k] - x[ox + (size_t)c * HW]) - mean[c]) * a + beta[c];
}

// inference: running statistics
__kernel void bn_apply_infer(const uint N, const uint C, const uint HW, const float eps, __global const float *x,
                             const uint ox, __global float *y, const uint oy, __global const float *rmean,
                             __global const float *rvar, __global const float *gamma, __global const float *beta)
{
    const uint i = get_global_id(0);
    const uint row = get_global_id(1);
    const uint c = row % C;
    const size_t k = (size_t)row * HW + i;
    const float a = rsqrt(rvar[c] + eps) * gamma[c];
    y[oy + k] = (x[ox + k] - rmean[c]) * a + beta[c];
}

// part[c*HW + i] = sum_n dy, part2[...] = sum_n dy * (x - K - mean[c])
#define BN_BWD_PARTIAL(SUF, T, LOAD, STORE)                                                                 \
    __kernel void bn_bwd_partial##SUF(const uint N, const uint C, const uint HW, __global const float *x,       \
                                      const uint ox, __global const float *dy, const uint ody,                  \
                                      __global const float *mean, __global float *part, __global float *part2)  \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint c = get_global_id(1);                                                                    \
        const size_t cs = (size_t)C * HW;                                                                   \
        __global const float *xc = x + ox + (size_t)c * HW;                                                 \
        __global const float *gc = dy + ody + (size_t)c * HW;                                               \
        const float K = xc[0], mu = mean[c];                                                                \
        T sb = (T)(0.0f), sg = (T)(0.0f);                                                                   \
        for (uint n = 0; n < N; n++) {                                                                      \
            const T g = LOAD(i, gc + n * cs);                                                               \
            sb += g;                                                                                        \
            sg += g * ((LOAD(i, xc + n * cs) - K) - mu);                                                    \
        }                                                                                                   \
        STORE(sb, i, part + (size_t)c * HW);                                                                \
        STORE(sg, i, part2 + (size_t)c * HW);                                                               \
    }
BN_BWD_PARTIAL(, float, VLOAD1, VSTORE1)
BN_BWD_PARTIAL(4, float4, vload4, vstore4)
BN_BWD_PARTIAL(8, float8, vload8, vstore8)

// dbeta[c] = sum dy, dgamma[c] = sum dy * xhat  (overwrites); keep != 0
// (synchronized batch norm, the local part): also st[2c] = sum dy,
// st[2c+1] = sum dy * (x - mean) over this device's slice, for the host to
// gather (dbeta, dgamma are then this slice's parameter gradients: the
// gradient reduction sums them over the devices).
// P partials per channel, as bn_stats_finish.
__kernel void bn_bwd_finish(const uint C, const uint P, __global const float *part, __global const float *part2,
                            __global const float *invstd, __global float *dgamma, __global float *dbeta,
                            const int keep, __global float *st)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    float sb, sg;
    sum2_compensated(part + (size_t)c * P, part2 + (size_t)c * P, P, &sb, &sg);
    dbeta[c] = sb;
    dgamma[c] = sg * invstd[c];
    if (keep) {
        st[2 * c] = sb;
        st[2 * c + 1] = sg;
    }
}

// 2-D range (i, row = n*C + c): dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)
__kernel void bn_bwd_data(const uint N, const uint C, const uint HW, const float invM, __global const float *x,
                          const uint ox, __global const float *dy, const uint ody, __global const float *mean,
                          __global const float *invstd, __global const float *gamma, __global const float *dgamma,
                          __global const float *dbeta, __global float *dx, const uint odx)
{
    const uint i = get_global_id(0);
    const uint row = get_global_id(1);
    const uint c = row % C;
    const size_t k = (size_t)row * HW + i;
    const float is = invstd[c];
    const float xhat = ((x[ox + k] - x[ox + (size_t)c * HW]) - mean[c]) * is;
    dx[odx + k] = gamma[c] * is * (dy[ody + k] - dbeta[c] * invM - xhat * dgamma[c] * invM);
}

// ---- synchronized batch norm (statistics over every device's slice) ----
// The host gathers each device's per-channel sums, combines them (in
// double, in device order: the same on every device) and hands back what
// these kernels need.

// Forward, local part: st[3c] = K (x[0, c, 0]), st[3c+1] = sum (x - K),
// st[3c+2] = sum (x - K)^2 over this device's slice (from the partials).
__kernel void bn_stats_sums(const uint C, const uint HW, const uint P, __global const float *x, const uint ox,
                            __global const float *part, __global const float *part2, __global float *st)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    float s, q;
    sum2_compensated(part + (size_t)c * P, part2 + (size_t)c * P, P, &s, &q);
    st[3 * c] = x[ox + (size_t)c * HW];
    st[3 * c + 1] = s;
    st[3 * c + 2] = q;
}

// Forward, global statistics in: g = {mean - K (this device's K), invstd,
// mean, unbiased variance} per channel (4 vectors of C); update != 0 also
// moves the running stats (the same on every device).
__kernel void bn_sync_set(const uint C, const float momentum, const int update, __global const float *g,
                          __global float *mean, __global float *invstd, __global float *rmean, __global float *rvar)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    mean[c] = g[c];
    invstd[c] = g[C + c];
    if (update) {
        rmean[c] = (1.0f - momentum) * rmean[c] + momentum * g[2 * C + c];
        rvar[c] = (1.0f - momentum) * rvar[c] + momentum * g[3 * C + c];
    }
}

// Backward, global sums in (g = {sum dy, sum dy * (x - mean)} per channel
// over every device): gdb = sum dy, gdg = sum dy * xhat, as bn_bwd_data
// takes them.
__kernel void bn_bwd_global(const uint C, __global const float *g, __global const float *invstd,
                            __global float *gdg, __global float *gdb)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    gdb[c] = g[c];
    gdg[c] = g[C + c] * invstd[c];
}

// ---- fused epilogues (the fusion pass of src/model/fuse.c) ----
// Training statistics stay exact: bn_stats_partial/finish as above, then one
// pass y = relu(bn(x)) or y = relu(bn(x) + r) (r: the residual branch of an
// [add]). Backward: g = dy where y > 0 (else 0) -- ReLU's gradient, taken
// from the stored output -- feeds the usual partial sums; with a residual,
// the same pass writes g as the residual's gradient (the [add] hands its
// gradient unchanged to both inputs); bn_bwd_data_relu forms dx from g.

// bn_apply_relu, bn_apply_add_relu: BN_APPLY_V below with W = 1.

// inference (running statistics), the same epilogues
#define BN_APPLY_INFER_ACT(NAME, RES)                                                                       \
    __kernel void NAME(const uint N, const uint C, const uint HW, const float eps, __global const float *x,     \
                       const uint ox, __global float *y, const uint oy, __global const float *rmean,            \
                       __global const float *rvar, __global const float *gamma, __global const float *beta,     \
                       __global const float *r, const uint orr)                                                 \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint row = get_global_id(1);                                                                  \
        const uint c = row % C;                                                                             \
        const size_t k = (size_t)row * HW + i;                                                              \
        const float a = rsqrt(rvar[c] + eps) * gamma[c];                                                    \
        float v = (x[ox + k] - rmean[c]) * a + beta[c];                                                     \
        if (RES)                                                                                            \
            v += r[orr + k];                                                                                \
        y[oy + k] = fmax(v, 0.0f);                                                                          \
    }
BN_APPLY_INFER_ACT(bn_apply_infer_relu, 0)
BN_APPLY_INFER_ACT(bn_apply_infer_add_relu, 1)

// part[c*HW + i] = sum_n g, part2[...] = sum_n g * (x - K - mean[c]) with
// g = dy masked by y > 0; RES: also dr = g. Range (HW / W, C) as above.
#define BN_BWD_PARTIAL_RELU(NAME, T, LOAD, STORE, RES)                                                      \
    __kernel void NAME(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,       \
                       __global const float *dy, const uint ody, __global const float *y, const uint oy,        \
                       __global const float *mean, __global float *part, __global float *part2,                 \
                       __global float *dr, const uint odr)                                                      \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint c = get_global_id(1);                                                                    \
        const size_t cs = (size_t)C * HW;                                                                   \
        __global const float *xc = x + ox + (size_t)c * HW;                                                 \
        __global const float *gc = dy + ody + (size_t)c * HW;                                               \
        __global const float *yc = y + oy + (size_t)c * HW;                                                 \
        __global float *rc = dr + odr + (size_t)c * HW;                                                     \
        const float K = xc[0], mu = mean[c];                                                                \
        T sb = (T)(0.0f), sg = (T)(0.0f);                                                                   \
        for (uint n = 0; n < N; n++) {                                                                      \
            const T g = select((T)(0.0f), LOAD(i, gc + n * cs), LOAD(i, yc + n * cs) > (T)(0.0f));          \
            if (RES)                                                                                        \
                STORE(g, i, rc + n * cs);                                                                   \
            sb += g;                                                                                        \
            sg += g * ((LOAD(i, xc + n * cs) - K) - mu);                                                    \
        }                                                                                                   \
        STORE(sb, i, part + (size_t)c * HW);                                                                \
        STORE(sg, i, part2 + (size_t)c * HW);                                                               \
    }
BN_BWD_PARTIAL_RELU(bn_bwd_partial_relu, float, VLOAD1, VSTORE1, 0)
BN_BWD_PARTIAL_RELU(bn_bwd_partial_relu4, float4, vload4, vstore4, 0)
BN_BWD_PARTIAL_RELU(bn_bwd_partial_relu8, float8, vload8, vstore8, 0)
BN_BWD_PARTIAL_RELU(bn_bwd_partial_add_relu, float, VLOAD1, VSTORE1, 1)
BN_BWD_PARTIAL_RELU(bn_bwd_partial_add_relu4, float4, vload4, vstore4, 1)
BN_BWD_PARTIAL_RELU(bn_bwd_partial_add_relu8, float8, vload8, vstore8, 1)

// bn_bwd_data_relu (bn_bwd_data with g = dy masked by y > 0): BN_BWD_DATA_V below with W = 1.

// ---- vector forms of the element-wise passes ----
// The same arithmetic as bn_apply, bn_bwd_data above, W consecutive
// elements of a row per work-item (W = 8 or 4, chosen by the host from
// HW % W; W = 1 for the scalar fused forms): range (HW / W, row = n*C + c).
// On CPU back-ends the scalar 2-D kernels pay per-element index and
// per-channel loads that these pay once per vector. EPI: 0 none, 1 relu,
// 2 + residual r then relu.
#define BN_APPLY_V(NAME, T, LOAD, STORE, EPI)                                                               \
    __kernel void NAME(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,       \
                       __global float *y, const uint oy, __global const float *mean,                            \
                       __global const float *invstd, __global const float *gamma, __global const float *beta,   \
                       __global const float *r, const uint orr)                                                 \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint row = get_global_id(1);                                                                  \
        const uint c = row % C;                                                                             \
        const size_t k = (size_t)row * HW;                                                                  \
        const float a = invstd[c] * gamma[c], K = x[ox + (size_t)c * HW], mu = mean[c], be = beta[c];       \
        T v = ((LOAD(i, x + ox + k) - K) - mu) * a + be;                                                    \
        if (EPI == 2)                                                                                       \
            v += LOAD(i, r + orr + k);                                                                      \
        if (EPI)                                                                                            \
            v = fmax(v, (T)(0.0f));                                                                         \
        STORE(v, i, y + oy + k);                                                                            \
    }
BN_APPLY_V(bn_apply_relu, float, VLOAD1, VSTORE1, 1)
BN_APPLY_V(bn_apply_add_relu, float, VLOAD1, VSTORE1, 2)
BN_APPLY_V(bn_apply4, float4, vload4, vstore4, 0)
BN_APPLY_V(bn_apply8, float8, vload8, vstore8, 0)
BN_APPLY_V(bn_apply_relu4, float4, vload4, vstore4, 1)
BN_APPLY_V(bn_apply_relu8, float8, vload8, vstore8, 1)
BN_APPLY_V(bn_apply_add_relu4, float4, vload4, vstore4, 2)
BN_APPLY_V(bn_apply_add_relu8, float8, vload8, vstore8, 2)

// dx = gamma * invstd * (g - dbeta / M - xhat * dgamma / M), g = dy (RELU 0)
// or dy masked by y > 0 (RELU 1); range (HW / W, row = n*C + c).
#define BN_BWD_DATA_V(NAME, T, LOAD, STORE, RELU)                                                           \
    __kernel void NAME(const uint N, const uint C, const uint HW, const float invM, __global const float *x,   \
                       const uint ox, __global const float *dy, const uint ody, __global const float *y,        \
                       const uint oy, __global const float *mean, __global const float *invstd,                 \
                       __global const float *gamma, __global const float *dgamma,                               \
                       __global const float *dbeta, __global float *dx, const uint odx)                         \
    {                                                                                                       \
        const uint i = get_global_id(0);                                                                    \
        const uint row = get_global_id(1);                                                                  \
        const uint c = row % C;                                                                             \
        const size_t k = (size_t)row * HW;                                                                  \
        const float is = invstd[c], K = x[ox + (size_t)c * HW], mu = mean[c];                               \
        const float gs = gamma[c] * is, db = dbeta[c] * invM, dg = dgamma[c] * invM;                        \
        const T xhat = ((LOAD(i, x + ox + k) - K) - mu) * is;                                               \
        T g = LOAD(i, dy + ody + k);                                                                        \
        if (RELU)                                                                                           \
            g = select((T)(0.0f), g, LOAD(i, y + oy + k) > (T)(0.0f));                                      \
        STORE(gs * (g - db - xhat * dg), i, dx + odx + k);                                                  \
    }
BN_BWD_DATA_V(bn_bwd_data_relu, float, VLOAD1, VSTORE1, 1)
BN_BWD_DATA_V(bn_bwd_data4, float4, vload4, vstore4, 0)
BN_BWD_DATA_V(bn_bwd_data8, float8, vload8, vstore8, 0)
BN_BWD_DATA_V(bn_bwd_data_relu4, float4, vload4, vstore4, 1)
BN_BWD_DATA_V(bn_bwd_data_relu8, float8, vload8, vstore8, 1)

// ---- row forms (CPU back-ends; option bn_rows) ----
// The forms above walk the batch with a C*HW stride inside a work-item (a
// new page per load) and pay per-vector index and per-channel loads; these
// stream one row (n, c) of HW contiguous values per work-item, with two
// independent accumulator chains in the reductions. 1-D range N*C
// (row = n*C + c), W = 8, 4 or 1 values per step (HW % W == 0). Row
// partials go to part[c*N + n] (bn_stats_finish / bn_bwd_finish with P = N).
// The fused relu's backward takes its mask from x, not y: the same
// expression as bn_row_apply_relu's ((x - K) - mean) * (invstd * gamma) +
// beta > 0, so the same bits (one tensor less to read per pass).
// Lane sums by dot() (a sum of swizzled lanes crashes oclgrind 21.10, see
// tests/oclgrind_check.sh).
#define HS1(v) (v)
#define HS4(v) dot((v), (float4)(1.0f))
#define HS8(v) (dot((v).lo, (float4)(1.0f)) + dot((v).hi, (float4)(1.0f)))

#define BN_ROW_STATS(SUF, T, LOAD, W, HS)                                                                   \
    __kernel void bn_row_stats##SUF(const uint N, const uint C, const uint HW, __global const float *x,        \
                                    const uint ox, __global float *part, __global float *part2)                 \
    {                                                                                                       \
        const uint row = get_global_id(0), c = row % C, nv = HW / W;                                        \
        __global const float *xr = x + ox + (size_t)row * HW;                                               \
        const float K = x[ox + (size_t)c * HW];                                                             \
        T s0 = (T)(0.0f), s1 = (T)(0.0f), q0 = (T)(0.0f), q1 = (T)(0.0f);                                   \
        uint i = 0;                                                                                         \
        for (; i + 1 < nv; i += 2) {                                                                        \
            const T d0 = LOAD(i, xr) - K, d1 = LOAD(i + 1, xr) - K;                                         \
            s0 += d0;                                                                                       \
            q0 += d0 * d0;                                                                                  \
            s1 += d1;                                                                                       \
            q1 += d1 * d1;                                                                                  \
        }                                                                                                   \
        if (i < nv) {                                                                                       \
            const T d = LOAD(i, xr) - K;                                                                    \
            s0 += d;                                                                                        \
            q0 += d * d;                                                                                    \
        }                                                                                                   \
        const T s = s0 + s1, q = q0 + q1;                                                                   \
        part[(size_t)c * N + row / C] = HS(s);                                                              \
        part2[(size_t)c * N + row / C] = HS(q);                                                             \
    }
BN_ROW_STATS(, float, VLOAD1, 1, HS1)
BN_ROW_STATS(4, float4, vload4, 4, HS4)
BN_ROW_STATS(8, float8, vload8, 8, HS8)

// The row apply passes: this work-item's row of x, r, y (W values per
// step), then y = ((x - K) - mu) * a + be over the row; EPI 1: relu, 2: +
// r, relu.
#define BN_ROW_APPLY_HEAD(W)                                                                                \
    const uint row = get_global_id(0), c = row % C, nv = HW / W;                                            \
    const size_t k = (size_t)row * HW;                                                                      \
    __global const float *xr = x + ox + k;                                                                  \
    __global const float *rr = r + orr + k;                                                                 \
    __global float *yr = y + oy + k;
#define BN_ROW_APPLY_LOOP(T, LOAD, STORE, EPI)                                                              \
    for (uint i = 0; i < nv; i++) {                                                                         \
        T v = ((LOAD(i, xr) - K) - mu) * a + be;                                                            \
        if (EPI == 2)                                                                                       \
            v += LOAD(i, rr);                                                                               \
        if (EPI)                                                                                            \
            v = fmax(v, (T)(0.0f));                                                                         \
        STORE(v, i, yr);                                                                                    \
    }

// A row kernel M at W = 1, 4, 8 (names NAME, NAME4, NAME8), mode MODE; the
// 9 kernels of a row apply pass: NAME, NAME_relu, NAME_add_relu at each W.
#define BN_ROW_W3(M, NAME, MODE)                                                                            \
    M(NAME, float, VLOAD1, VSTORE1, 1, MODE)                                                                \
    M(NAME##4, float4, vload4, vstore4, 4, MODE)                                                            \
    M(NAME##8, float8, vload8, vstore8, 8, MODE)
#define BN_ROW_EPIS(M, NAME)                                                                                \
    BN_ROW_W3(M, NAME, 0)                                                                                   \
    BN_ROW_W3(M, NAME##_relu, 1)                                                                            \
    BN_ROW_W3(M, NAME##_add_relu, 2)

// y = ((x - K) - mean) * (invstd * gamma) + beta; EPI as above.
#define BN_ROW_APPLY(NAME, T, LOAD, STORE, W, EPI)                                                          \
    __kernel void NAME(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,       \
                       __global float *y, const uint oy, __global const float *mean,                            \
                       __global const float *invstd, __global const float *gamma, __global const float *beta,   \
                       __global const float *r, const uint orr)                                                 \
    {                                                                                                       \
        BN_ROW_APPLY_HEAD(W)                                                                                \
        const float a = invstd[c] * gamma[c], K = x[ox + (size_t)c * HW], mu = mean[c], be = beta[c];       \
        BN_ROW_APPLY_LOOP(T, LOAD, STORE, EPI)                                                              \
    }
BN_ROW_EPIS(BN_ROW_APPLY, bn_row_apply)

// One value step of the backward reduction: g = dy (MODE 0), masked by the
// recomputed relu input > 0 (MODE 1), by y > 0 and stored as dr (MODE 2),
// or by y > 0 (MODE 3: a residual block's relu without dr);
// SB += g, SG += g * (x - K - mean).
#define BN_ROW_BWD_STEP(T, LOAD, STORE, MODE, I, SB, SG)                                                    \
    {                                                                                                       \
        const T xm = (LOAD(I, xr) - K) - mu;                                                                \
        T g = LOAD(I, gr);                                                                                  \
        if (MODE == 1)                                                                                      \
            g = select((T)(0.0f), g, xm * a + be > (T)(0.0f));                                              \
        if (MODE >= 2)                                                                                      \
            g = select((T)(0.0f), g, LOAD(I, yr) > (T)(0.0f));                                              \
        if (MODE == 2)                                                                                      \
            STORE(g, I, dr + odr + k);                                                                      \
        SB += g;                                                                                            \
        SG += g * xm;                                                                                       \
    }

// The backward row passes: this work-item's row of x, dy, y (W values per
// step), K and the shifted mean.
#define BN_ROW_BWD_HEAD(W)                                                                                  \
    const uint row = get_global_id(0), c = row % C, nv = HW / W;                                            \
    const size_t k = (size_t)row * HW;                                                                      \
    __global const float *xr = x + ox + k;                                                                  \
    __global const float *gr = dy + ody + k;                                                                \
    __global const float *yr = y + oy + k;                                                                  \
    const float K = x[ox + (size_t)c * HW], mu = mean[c];

// Row partials part[c*N + n] = sum g, part2[...] = sum g * (x - K - mean).
#define BN_ROW_BWD(NAME, T, LOAD, STORE, W, MODE)                                                           \
    __kernel void NAME(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,       \
                       __global const float *dy, const uint ody, __global const float *y, const uint oy,        \
                       __global const float *mean, __global const float *invstd, __global const float *gamma,   \
                       __global const float *beta, __global float *part, __global float *part2,                 \
                       __global float *dr, const uint odr)                                                      \
    {                                                                                                       \
        BN_ROW_BWD_HEAD(W)                                                                                  \
        const float a = invstd[c] * gamma[c], be = beta[c];                                                 \
        T b0 = (T)(0.0f), b1 = (T)(0.0f), g0 = (T)(0.0f), g1 = (T)(0.0f);                                   \
        uint i = 0;                                                                                         \
        for (; i + 1 < nv; i += 2) {                                                                        \
            BN_ROW_BWD_STEP(T, LOAD, STORE, MODE, i, b0, g0)                                                \
            BN_ROW_BWD_STEP(T, LOAD, STORE, MODE, i + 1, b1, g1)                                            \
        }                                                                                                   \
        if (i < nv)                                                                                         \
            BN_ROW_BWD_STEP(T, LOAD, STORE, MODE, i, b0, g0)                                                \
        const T sb = b0 + b1, sg = g0 + g1;                                                                 \
        part[(size_t)c * N + row / C] = HS##W(sb);                                                          \
        part2[(size_t)c * N + row / C] = HS##W(sg);                                                         \
    }
BN_ROW_W3(BN_ROW_BWD, bn_row_bwd, 0)
BN_ROW_W3(BN_ROW_BWD, bn_row_bwd_relu, 1)
BN_ROW_W3(BN_ROW_BWD, bn_row_bwd_add_relu, 2)
BN_ROW_W3(BN_ROW_BWD, bn_row_bwd_relu_y, 3)

// dx = gamma * invstd * (g - dbeta / M - xhat * dgamma / M), g = dy (RELU 0),
// dy masked by the recomputed relu input > 0 (RELU 1) or by y > 0 (RELU 2).
#define BN_ROW_DX(NAME, T, LOAD, STORE, W, RELU)                                                            \
    __kernel void NAME(const uint N, const uint C, const uint HW, const float invM, __global const float *x,   \
                       const uint ox, __global const float *dy, const uint ody, __global const float *y,        \
                       const uint oy, __global const float *mean,                                               \
                       __global const float *invstd, __global const float *gamma, __global const float *beta,   \
                       __global const float *dgamma, __global const float *dbeta, __global float *dx,           \
                       const uint odx)                                                                          \
    {                                                                                                       \
        BN_ROW_BWD_HEAD(W)                                                                                  \
        __global float *dxr = dx + odx + k;                                                                 \
        const float is = invstd[c];                                                                         \
        const float a = is * gamma[c], be = beta[c];                                                        \
        const float gs = gamma[c] * is, db = dbeta[c] * invM, dg = dgamma[c] * invM;                        \
        for (uint i = 0; i < nv; i++) {                                                                     \
            const T xm = (LOAD(i, xr) - K) - mu;                                                            \
            T g = LOAD(i, gr);                                                                              \
            if (RELU == 1)                                                                                  \
                g = select((T)(0.0f), g, xm * a + be > (T)(0.0f));                                          \
            if (RELU == 2)                                                                                  \
                g = select((T)(0.0f), g, LOAD(i, yr) > (T)(0.0f));                                          \
            STORE(gs * (g - db - (xm * is) * dg), i, dxr);                                                  \
        }                                                                                                   \
    }
BN_ROW_W3(BN_ROW_DX, bn_row_dx, 0)
BN_ROW_W3(BN_ROW_DX, bn_row_dx_relu, 1)
BN_ROW_W3(BN_ROW_DX, bn_row_dx_relu_y, 2)

// Inference (running statistics): y = (x - rmean) * (rsqrt(rvar + eps) *
// gamma) + beta, as bn_apply_infer (K = 0: x - 0 is x); EPI as above.
#define BN_ROW_INFER(NAME, T, LOAD, STORE, W, EPI)                                                          \
    __kernel void NAME(const uint N, const uint C, const uint HW, const float eps, __global const float *x,     \
                       const uint ox, __global float *y, const uint oy, __global const float *rmean,            \
                       __global const float *rvar, __global const float *gamma, __global const float *beta,     \
                       __global const float *r, const uint orr)                                                 \
    {                                                                                                       \
        BN_ROW_APPLY_HEAD(W)                                                                                \
        const float a = rsqrt(rvar[c] + eps) * gamma[c], K = 0.0f, mu = rmean[c], be = beta[c];             \
        BN_ROW_APPLY_LOOP(T, LOAD, STORE, EPI)                                                              \
    }
BN_ROW_EPIS(BN_ROW_INFER, bn_row_infer)
