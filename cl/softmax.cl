// Loss kernels: softmax + cross-entropy and mean squared error.
// Per-sample losses go to a scratch vector; loss_reduce folds them (and the
// per-sample "correct" flags) into result[0] = loss sum, result[1] = correct.
// Every reduction is a fixed-order local-memory tree: deterministic.

#ifndef SM_WG // reduction group (power of two; the host lowers it to the device's limit)
#define SM_WG 64
#endif

// One work-group per sample s. x: (N, C) logits; p: (N, C) probabilities.
// loss[s] = logsumexp(x_s) - x_s[label] = log1p(sum_{c != argmax} exp(x_c - max)) + max - x_s[label];
// correct[s] = (first argmax == label).
// A label outside [0, C) gives a NaN loss (the data is wrong; make it show).
__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1))) void
softmax_xent_fwd(const uint C, __global const float *x, const uint ox, __global float *p, const uint op,
                 __global const int *labels, const uint ol, __global float *loss, __global float *correct)
{
    __local float lmax[SM_WG];
    __local int larg[SM_WG];
    __local float lsum[SM_WG];
    const uint s = get_group_id(0);
    const uint lid = get_local_id(0);
    __global const float *xs = x + ox + (size_t)s * C;
    __global float *ps = p + op + (size_t)s * C;

    float m = -INFINITY;
    int am = 0x7fffffff;
    for (uint c = lid; c < C; c += SM_WG) {
        const float v = xs[c];
        if (v > m) {
            m = v;
            am = (int)c;
        }
    }
    lmax[lid] = m;
    larg[lid] = am;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w) {
            const float o = lmax[lid + w];
            const int oa = larg[lid + w];
            if (o > lmax[lid] || (o == lmax[lid] && oa < larg[lid])) {
                lmax[lid] = o;
                larg[lid] = oa;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = lmax[0];
    const int amax = larg[0];

    // sum over every class but the (first) maximum, whose term is exactly 1:
    // log1p keeps the loss accurate when the prediction is confident
    float sum = 0.0f;
    for (uint c = lid; c < C; c += SM_WG)
        sum += (int)c == amax ? 0.0f : exp(xs[c] - m);
    lsum[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            lsum[lid] += lsum[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    sum = lsum[0];
    const float inv = 1.0f / (1.0f + sum);
    for (uint c = lid; c < C; c += SM_WG)
        ps[c] = exp(xs[c] - m) * inv;
    if (lid == 0) {
        const int lab = labels[ol + s];
        const int ok = lab >= 0 && lab < (int)C;
        loss[s] = ok ? log1p(sum) + (m - xs[ok ? lab : 0]) : NAN;
        correct[s] = (ok && amax == lab) ? 1.0f : 0.0f;
    }
}

// The work-group's tree sum of a and of b (every work-item's values, in
// the same order of additions for both kernels) into result[0] and result[1].
static void sum2_store(__local float *l, __local float *k, const float a, const float b, __global float *result)
{
    const uint lid = get_local_id(0);
    l[lid] = a;
    k[lid] = b;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w) {
            l[lid] += l[lid + w];
            k[lid] += k[lid + w];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        result[0] = l[0];
        result[1] = k[0];
    }
}

// Softmax + cross-entropy forward with the loss reduction in one launch
// (small N * C): one work-group; work-item lid takes samples lid, lid +
// SM_WG, ... each serially over its C classes with softmax_xent_fwd's
// arithmetic (first argmax; log1p of the sum without the maximum's term),
// then result[0] = loss sum, result[1] = correct count by loss_reduce's tree
// (the same order of additions).
__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1))) void
softmax_xent_fwd_reduce(const uint N, const uint C, __global const float *x, const uint ox, __global float *p,
                        const uint op, __global const int *labels, const uint ol, __global float *result)
{
    __local float l[SM_WG];
    __local float k[SM_WG];
    const uint lid = get_local_id(0);
    float a = 0.0f, b = 0.0f;
    for (uint s = lid; s < N; s += SM_WG) {
        __global const float *xs = x + ox + (size_t)s * C;
        __global float *ps = p + op + (size_t)s * C;
        float m = -INFINITY;
        int amax = 0x7fffffff;
        for (uint c = 0; c < C; c++) {
            const float v = xs[c];
            if (v > m) {
                m = v;
                amax = (int)c;
            }
        }
        float sum = 0.0f;
        for (uint c = 0; c < C; c++)
            sum += (int)c == amax ? 0.0f : exp(xs[c] - m);
        const float inv = 1.0f / (1.0f + sum);
        for (uint c = 0; c < C; c++)
            ps[c] = exp(xs[c] - m) * inv;
        const int lab = labels[ol + s];
        const int ok = lab >= 0 && lab < (int)C;
        a += ok ? log1p(sum) + (m - xs[ok ? lab : 0]) : NAN;
        b += (ok && amax == lab) ? 1.0f : 0.0f;
    }
    sum2_store(l, k, a, b, result);
}

// dx[s, c] = scale * (p[s, c] - (c == label[s]))
__kernel void softmax_xent_bwd(const uint C, const uint N, const float scale, __global const float *p, const uint op,
                               __global const int *labels, const uint ol, __global float *dx, const uint odx)
{
    const uint c = get_global_id(0);
    const uint s = get_global_id(1);
    if (c >= C || s >= N)
        return;
    const size_t i = (size_t)s * C + c;
    const float onehot = labels[ol + s] == (int)c ? 1.0f : 0.0f;
    dx[odx + i] = scale * (p[op + i] - onehot);
}

// MSE, per sample over F features: loss[s] = mean_f (x - t)^2. Also copies
// x to y (the layer's output is its prediction).
__kernel void mse_fwd(const uint F, const uint N, __global const float *x, const uint ox, __global const float *t,
                      const uint ot, __global float *y, const uint oy, __global float *loss, __global float *correct)
{
    const uint s = get_global_id(0);
    if (s >= N)
        return;
    float acc = 0.0f;
    for (uint f = 0; f < F; f++) {
        const size_t i = (size_t)s * F + f;
        const float v = x[ox + i];
        const float d = v - t[ot + i];
        acc += d * d;
        y[oy + i] = v;
    }
    loss[s] = acc / (float)F;
    correct[s] = 0.0f;
}

// dx = scale * 2 (x - t) / F
__kernel void mse_bwd(const uint n, const float scale2f, __global const float *x, const uint ox,
                      __global const float *t, const uint ot, __global float *dx, const uint odx)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    dx[odx + i] = scale2f * (x[ox + i] - t[ot + i]);
}

// One work-group: result[0] = sum loss[0..N), result[1] = sum correct[0..N).
__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1))) void
loss_reduce(const uint N, __global const float *loss, __global const float *correct, __global float *result)
{
    __local float l[SM_WG];
    __local float k[SM_WG];
    const uint lid = get_local_id(0);
    float a = 0.0f, b = 0.0f;
    for (uint s = lid; s < N; s += SM_WG) {
        a += loss[s];
        b += correct[s];
    }
    sum2_store(l, k, a, b, result);
}

// ---- plain softmax over rows (primitives API) ----
// One work-group per row s of x (N, C): y_s = exp(x_s - max) / sum exp(x_s - max).
__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1))) void
softmax_fwd(const uint C, __global const float *x, const uint ox, __global float *y, const uint oy)
{
    __local float red[SM_WG];
    const uint s = get_group_id(0);
    const uint lid = get_local_id(0);
    __global const float *xs = x + ox + (size_t)s * C;
    __global float *ys = y + oy + (size_t)s * C;
    float m = -INFINITY;
    for (uint c = lid; c < C; c += SM_WG)
        m = fmax(m, xs[c]);
    red[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            red[lid] = fmax(red[lid], red[lid + w]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    for (uint c = lid; c < C; c += SM_WG)
        sum += exp(xs[c] - m);
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            red[lid] += red[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (uint c = lid; c < C; c += SM_WG)
        ys[c] = exp(xs[c] - m) * inv;
}

// dx_s = y_s * (dy_s - sum_c dy_s[c] * y_s[c]), one work-group per row.
__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1))) void
softmax_bwd(const uint C, __global const float *y, const uint oy, __global const float *dy, const uint ody,
            __global float *dx, const uint odx)
{
    __local float red[SM_WG];
    const uint s = get_group_id(0);
    const uint lid = get_local_id(0);
    __global const float *ys = y + oy + (size_t)s * C;
    __global const float *gs = dy + ody + (size_t)s * C;
    __global float *ds = dx + odx + (size_t)s * C;
    float dot = 0.0f;
    for (uint c = lid; c < C; c += SM_WG)
        dot += gs[c] * ys[c];
    red[lid] = dot;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = SM_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            red[lid] += red[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    dot = red[0];
    for (uint c = lid; c < C; c += SM_WG)
        ds[c] = ys[c] * (gs[c] - dot);
}
