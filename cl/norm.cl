// Batch normalization over (N, HW) per channel, NCHW layout.
// Statistics and gradient sums: one work-group per channel, two passes
// (mean, then centred squares) reduced with a fixed local-memory tree.
// PyTorch convention: running = (1 - momentum) * running + momentum * batch,
// running_var uses the unbiased batch variance, normalization the biased one.

#define BN_WG 128

inline float bn_tree(__local float *buf, const uint lid)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = BN_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            buf[lid] += buf[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// mean[c], invstd[c] of the batch; update != 0 also moves the running stats.
__kernel __attribute__((reqd_work_group_size(BN_WG, 1, 1))) void
bn_stats(const uint N, const uint C, const uint HW, const float momentum, const float eps, const int update,
         __global const float *x, const uint ox, __global float *mean, __global float *invstd,
         __global float *rmean, __global float *rvar)
{
    __local float buf[BN_WG];
    const uint c = get_group_id(0);
    const uint lid = get_local_id(0);
    const uint M = N * HW;
    __global const float *xc = x + ox + (size_t)c * HW;
    const size_t cs = (size_t)C * HW;

    float s = 0.0f;
    for (uint j = lid; j < M; j += BN_WG) {
        const uint n = j / HW;
        s += xc[n * cs + (j - n * HW)];
    }
    buf[lid] = s;
    const float mu = bn_tree(buf, lid) / (float)M;

    float q = 0.0f;
    for (uint j = lid; j < M; j += BN_WG) {
        const uint n = j / HW;
        const float d = xc[n * cs + (j - n * HW)] - mu;
        q += d * d;
    }
    buf[lid] = q;
    const float ss = bn_tree(buf, lid);
    if (lid == 0) {
        const float var = ss / (float)M;
        mean[c] = mu;
        invstd[c] = rsqrt(var + eps);
        if (update) {
            const float unbiased = M > 1 ? ss / (float)(M - 1) : var;
            rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mu;
            rvar[c] = (1.0f - momentum) * rvar[c] + momentum * unbiased;
        }
    }
}

// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]
__kernel void bn_apply(const uint n, const uint C, const uint HW, __global const float *x, const uint ox,
                       __global float *y, const uint oy, __global const float *mean, __global const float *invstd,
                       __global const float *gamma, __global const float *beta)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    const uint c = (i / HW) % C;
    y[oy + i] = (x[ox + i] - mean[c]) * (invstd[c] * gamma[c]) + beta[c];
}

// inference: running statistics
__kernel void bn_apply_infer(const uint n, const uint C, const uint HW, const float eps, __global const float *x,
                             const uint ox, __global float *y, const uint oy, __global const float *rmean,
                             __global const float *rvar, __global const float *gamma, __global const float *beta)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    const uint c = (i / HW) % C;
    y[oy + i] = (x[ox + i] - rmean[c]) * (rsqrt(rvar[c] + eps) * gamma[c]) + beta[c];
}

// dbeta[c] = sum dy, dgamma[c] = sum dy * xhat  (overwrites)
__kernel __attribute__((reqd_work_group_size(BN_WG, 1, 1))) void
bn_bwd_reduce(const uint N, const uint C, const uint HW, __global const float *x, const uint ox,
              __global const float *dy, const uint ody, __global const float *mean, __global const float *invstd,
              __global float *dgamma, __global float *dbeta)
{
    __local float buf[BN_WG];
    const uint c = get_group_id(0);
    const uint lid = get_local_id(0);
    const uint M = N * HW;
    const size_t cs = (size_t)C * HW;
    __global const float *xc = x + ox + (size_t)c * HW;
    __global const float *gc = dy + ody + (size_t)c * HW;
    const float mu = mean[c];
    float sb = 0.0f, sg = 0.0f;
    for (uint j = lid; j < M; j += BN_WG) {
        const uint n = j / HW;
        const size_t k = n * cs + (j - n * HW);
        const float g = gc[k];
        sb += g;
        sg += g * (xc[k] - mu);
    }
    buf[lid] = sb;
    const float tb = bn_tree(buf, lid);
    buf[lid] = sg;
    const float tg = bn_tree(buf, lid);
    if (lid == 0) {
        dbeta[c] = tb;
        dgamma[c] = tg * invstd[c];
    }
}

// dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)  (training-mode statistics)
__kernel void bn_bwd_data(const uint n, const uint C, const uint HW, const float invM, __global const float *x,
                          const uint ox, __global const float *dy, const uint ody, __global const float *mean,
                          __global const float *invstd, __global const float *gamma, __global const float *dgamma,
                          __global const float *dbeta, __global float *dx, const uint odx)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    const uint c = (i / HW) % C;
    const float is = invstd[c];
    const float xhat = (x[ox + i] - mean[c]) * is;
    dx[odx + i] = gamma[c] * is * (dy[ody + i] - dbeta[c] * invM - xhat * dgamma[c] * invM);
}
