// Direct convolution kernels (any shape, meant for depthwise / small cases)
// (bias gradient: cl/conv_bwdf.cl). NCHW fp32; see src/ops/conv.c.

#ifndef CONV_WG // work-group of direct_bwd_filter (power of two; the host lowers it to the device's limit)
#define CONV_WG 64
#endif
// Quotients unsigned, remainders signed: see the note in im2col.cl.
#define UDIV(a, b) ((int)((uint)(a) / (uint)(b)))

// One work-item per output element: gws = (P*Q, K, N).
__kernel void direct_fwd(__global const float *x, const int offx, const int C, const int H, const int W,
                         const int K, const int R, const int S, const int P, const int Q,
                         const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                         const int dil_h, const int dil_w, const int groups,
                         __global const float *wt, const int offw, __global const float *bias, const int offb,
                         const int has_bias, const int relu, __global float *y, const int offy)
{
    const int pq = get_global_id(0);
    const int k = get_global_id(1);
    const int n = get_global_id(2);
    if (pq >= P * Q || k >= K)
        return;
    const int Cg = C / groups, Kg = K / groups;
    const int g = UDIV(k, Kg);
    const int p = UDIV(pq, Q), q = pq % Q;
    const int h0 = p * stride_h - pad_h, w0 = q * stride_w - pad_w;
    float acc = 0.0f;
    for (int c = 0; c < Cg; c++) {
        __global const float *xc = x + offx + (n * C + g * Cg + c) * H * W;
        __global const float *wc = wt + offw + (k * Cg + c) * R * S;
        for (int r = 0; r < R; r++) {
            const int h = h0 + r * dil_h;
            if (h < 0 || h >= H)
                continue;
            for (int s = 0; s < S; s++) {
                const int w = w0 + s * dil_w;
                if (w < 0 || w >= W)
                    continue;
                acc = fma(xc[h * W + w], wc[r * S + s], acc);
            }
        }
    }
    if (has_bias)
        acc += bias[offb + k];
    if (relu)
        acc = fmax(acc, 0.0f);
    y[offy + (n * K + k) * P * Q + pq] = acc;
}

// One work-item per input-gradient element: gws = (H*W, C, N).
__kernel void direct_bwd_data(__global const float *dy, const int offdy, const int C, const int H, const int W,
                              const int K, const int R, const int S, const int P, const int Q,
                              const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                              const int dil_h, const int dil_w, const int groups,
                              __global const float *wt, const int offw, __global float *dx, const int offdx)
{
    const int hw = get_global_id(0);
    const int c = get_global_id(1);
    const int n = get_global_id(2);
    if (hw >= H * W || c >= C)
        return;
    const int Cg = C / groups, Kg = K / groups;
    const int g = UDIV(c, Cg), cl = c % Cg;
    const int h = UDIV(hw, W), w = hw % W;
    float acc = 0.0f;
    for (int kk = 0; kk < Kg; kk++) {
        const int k = g * Kg + kk;
        __global const float *dyk = dy + offdy + (n * K + k) * P * Q;
        __global const float *wk = wt + offw + (k * Cg + cl) * R * S;
        for (int r = 0; r < R; r++) {
            const int hh = h + pad_h - r * dil_h;
            if (hh < 0 || hh % stride_h != 0)
                continue;
            const int p = UDIV(hh, stride_h);
            if (p >= P)
                continue;
            for (int s = 0; s < S; s++) {
                const int ww = w + pad_w - s * dil_w;
                if (ww < 0 || ww % stride_w != 0)
                    continue;
                const int q = UDIV(ww, stride_w);
                if (q >= Q)
                    continue;
                acc = fma(dyk[p * Q + q], wk[r * S + s], acc);
            }
        }
    }
    dx[offdx + (n * C + c) * H * W + hw] = acc;
}

static void wg_reduce_store(__local float *red, float acc, const float beta, __global float *dst)
{
    const int lid = get_local_id(0);
    red[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = CONV_WG / 2; st > 0; st >>= 1) {
        if (lid < st)
            red[lid] += red[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        *dst = beta == 0.0f ? red[0] : fma(beta, *dst, red[0]);
}

// One work-group of CONV_WG per filter-gradient element (k, c, r, s):
// gws = (CONV_WG * K*Cg*R*S), lws = (CONV_WG).
__kernel __attribute__((reqd_work_group_size(CONV_WG, 1, 1)))
void direct_bwd_filter(__global const float *x, const int offx, __global const float *dy, const int offdy,
                       const int N, const int C, const int H, const int W,
                       const int K, const int R, const int S, const int P, const int Q,
                       const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                       const int dil_h, const int dil_w, const int groups, const float beta,
                       __global float *dw, const int offdw)
{
    __local float red[CONV_WG];
    const int idx = get_group_id(0);
    const int Cg = C / groups, Kg = K / groups;
    const int s = idx % S;
    const int r = UDIV(idx, S) % R;
    const int c = UDIV(idx, R * S) % Cg;
    const int k = UDIV(idx, R * S * Cg);
    const int g = UDIV(k, Kg);
    const int PQ = P * Q;
    float acc = 0.0f;
    for (int i = get_local_id(0); i < N * PQ; i += CONV_WG) {
        const int n = UDIV(i, PQ), pq = i % PQ;
        const int p = UDIV(pq, Q), q = pq % Q;
        const int h = p * stride_h - pad_h + r * dil_h;
        const int w = q * stride_w - pad_w + s * dil_w;
        if (h >= 0 && h < H && w >= 0 && w < W)
            acc = fma(dy[offdy + (n * K + k) * PQ + pq], x[offx + ((n * C + g * Cg + c) * H + h) * W + w], acc);
    }
    wg_reduce_store(red, acc, beta, dw + offdw + idx);
}

// ---- FFT convolution helpers (src/ops/conv_fft.c) ----

// Zero-padded real planes for the FFT: dst[(pl*Fh + i)*Fw + j] =
// src[offsrc + pl*H*W + (i - pad_h)*W + (j - pad_w)] inside the image, else 0.
// gws = (Fw, Fh, planes).
__kernel void fft_pad(__global const float *src, const int offsrc, const int H, const int W, const int pad_h,
                      const int pad_w, const int Fh, const int Fw, __global float *dst)
{
    const int j = get_global_id(0);
    const int i = get_global_id(1);
    const int pl = get_global_id(2);
    if (j >= Fw || i >= Fh)
        return;
    const int h = i - pad_h, w = j - pad_w;
    float v = 0.0f;
    if (h >= 0 && h < H && w >= 0 && w < W)
        v = src[offsrc + (pl * H + h) * W + w];
    dst[(pl * Fh + i) * Fw + j] = v;
}

// Frequency-domain correlation: Y[n][k][f] = sum_c X[n][c][f] * conj(Wf[k][c][f])
// (complex, interleaved), F frequencies per plane. One work-item per
// (f, group of 4 output channels, image): gws = (F, ceil(K/4), nb).
__kernel void fft_cmul(__global const float2 *X, __global const float2 *Wf, const int C, const int K, const int F,
                       __global float2 *Y)
{
    const int f = get_global_id(0);
    const int k0 = get_global_id(1) * 4;
    const int n = get_global_id(2);
    if (f >= F || k0 >= K)
        return;
    const int nk = min(4, K - k0);
    float2 acc[4] = {(float2)(0.0f), (float2)(0.0f), (float2)(0.0f), (float2)(0.0f)};
    for (int c = 0; c < C; c++) {
        const float2 x = X[(n * C + c) * F + f];
        for (int kk = 0; kk < 4; kk++) {
            if (kk < nk) {
                const float2 w = Wf[((k0 + kk) * C + c) * F + f];
                acc[kk].x = fma(x.x, w.x, fma(x.y, w.y, acc[kk].x));
                acc[kk].y = fma(x.y, w.x, fma(-x.x, w.y, acc[kk].y));
            }
        }
    }
    for (int kk = 0; kk < nk; kk++)
        Y[(n * K + k0 + kk) * F + f] = acc[kk];
}

// y[offy + (nk*P + p)*Q + q] = act(src[(nk*Fh + p)*Fw + q] + bias[k]),
// k = nk % K: gws = (Q, P, nb*K).
__kernel void fft_crop(__global const float *src, const int Fh, const int Fw, const int K, const int P, const int Q,
                       __global const float *bias, const int offb, const int has_bias, const int relu,
                       __global float *y, const int offy)
{
    const int q = get_global_id(0);
    const int p = get_global_id(1);
    const int nk = get_global_id(2);
    if (q >= Q || p >= P)
        return;
    float v = src[(nk * Fh + p) * Fw + q];
    if (has_bias)
        v += bias[offb + nk % K];
    if (relu)
        v = fmax(v, 0.0f);
    y[offy + (nk * P + p) * Q + q] = v;
}
