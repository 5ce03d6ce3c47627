// Optimizer kernels: SGD (momentum, Nesterov, weight decay), Adam/AdamW,
// squared-norm partial sums (gradient clipping, fp16 overflow checks) and a
// few small vector helpers used by the network (gradient summation).
// Every kernel is 1-D over n elements; gscale multiplies the raw gradient
// (clipping factor / inverse loss scale). The updates take a decay mask:
// with use_mask, element i is decayed only where dmask[i] != 0 (the
// parameter arena of a model with [net] decay_matrices_only = 1; dmask is
// not read otherwise).

__kernel void sgd_step(__global float *w, __global const float *g, __global float *m, const int n, const float lr,
                       const float momentum, const float wd_all, const int nesterov, const float gscale,
                       __global const uchar *dmask, const int use_mask)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float wd = use_mask && !dmask[i] ? 0.0f : wd_all;
    float wi = w[i];
    float gi = g[i] * gscale + wd * wi;
    if (momentum != 0.0f) {
        float v = momentum * m[i] + gi;
        m[i] = v;
        gi = nesterov ? gi + momentum * v : v;
    }
    w[i] = wi - lr * gi;
}

// Adam (decoupled == 0: L2 added to the gradient) and AdamW (decoupled == 1:
// w -= lr * wd * w). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t; omb1 = 1 - beta1 and
// omb2 = 1 - beta2 come from the host, computed in double (1 - 0.999f in float
// is off by 1e-5 relative).
__kernel void adam_step(__global float *w, __global const float *g, __global float *m, __global float *v,
                        const int n, const float lr, const float beta1, const float beta2, const float omb1,
                        const float omb2, const float eps,
                        const float wd_all, const int decoupled, const float bc1, const float bc2, const float gscale,
                        __global const uchar *dmask, const int use_mask)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float wd = use_mask && !dmask[i] ? 0.0f : wd_all;
    float wi = w[i];
    float gi = g[i] * gscale;
    if (decoupled)
        wi -= lr * wd * wi;
    else
        gi += wd * wi;
    float mi = beta1 * m[i] + omb1 * gi;
    float vi = beta2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrt(vi / bc2) + eps;
    w[i] = wi - lr * (mi / bc1) / denom;
}

// partial[out_off + group] = sum over this group's strided share of x[i]^2.
// Work-group size must be WG (a power of two).
#ifndef WG
#define WG 256
#endif
// out[group] = the sum of s over the work-group (a fixed tree: the same
// order on every device), acc: WG floats of local memory.
static void group_sum_store(__local float *acc, float s, __global float *out)
{
    int lid = get_local_id(0);
    acc[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = WG / 2; st > 0; st >>= 1) {
        if (lid < st)
            acc[lid] += acc[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        out[get_group_id(0)] = acc[0];
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void sumsq_partial(__global const float *x, const int n,
                                                                           __global float *partial,
                                                                           const int out_off)
{
    __local float acc[WG];
    int lid = get_local_id(0);
    float s = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) {
        float v = x[i];
        s += v * v;
    }
    group_sum_store(acc, s, partial + out_off);
}

// y += a * x
__kernel void axpy_f32(__global float *y, __global const float *x, const float a, const int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[i] += a * x[i];
}

// y = v
__kernel void fill_f32(__global float *y, const float v, const int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[i] = v;
}

// Device-to-device gradient reduction (lanes sharing one cl_context):
// dst[off + i] = a[off + i] (+ b[off + i] when has_b) over i < n; when sq,
// partial[out_off + group] = this group's sum of squares of the result.
// Chained in lane order ((a0 + a1) + a2) ..., the same float additions as
// the host path. Work-group size must be WG (a power of two).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void lane_add(__global float *dst, __global const float *a,
                                                                      __global const float *b, const int has_b,
                                                                      const int off, const int n, const int sq,
                                                                      __global float *partial, const int out_off)
{
#pragma OPENCL FP_CONTRACT OFF
    // v * v rounded, then added: what the host path's copy computes
    // (clg_optk_sumsq_host), so both paths give the same norm to the bit
    __local float acc[WG];
    int lid = get_local_id(0);
    float s = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) {
        float v = a[off + i];
        if (has_b)
            v += b[off + i];
        dst[off + i] = v;
        s += v * v;
    }
    if (!sq)
        return;
    group_sum_store(acc, s, partial + out_off);
}
