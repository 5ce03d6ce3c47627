// Pooling kernels (NCHW). Window size KH x KW, stride SH x SW, padding PH x PW;
// output P x Q with PyTorch's floor rule. Max pooling treats padding as
// -inf and routes the gradient to the first maximum of each window (row-major
// order), recomputed in backward from the input (no argmax buffer, no
// atomics: every input element gathers from the windows that contain it).
// Average pooling counts padding in the divisor like PyTorch's default
// (count_include_pad=True): divisor = window area clipped to the padded input.

#define POOL_ARGS                                                                                        \
    const uint H, const uint W, const uint P, const uint Q, const uint KH, const uint KW, const uint SH, \
        const uint SW, const uint PH, const uint PW

// one work-item per output element; planes = N*C
__kernel void maxpool_fwd(const uint planes, POOL_ARGS, __global const float *x, const uint ox, __global float *y,
                          const uint oy)
{
    const uint i = get_global_id(0);
    if (i >= planes * P * Q)
        return;
    const uint q = i % Q;
    const uint t = i / Q;
    const uint p = t % P;
    const uint pl = t / P;
    __global const float *xp = x + ox + (size_t)pl * H * W;
    const int h0 = (int)(p * SH) - (int)PH;
    const int w0 = (int)(q * SW) - (int)PW;
    float m = -INFINITY;
    for (uint r = 0; r < KH; r++) {
        const int h = h0 + (int)r;
        if (h < 0 || h >= (int)H)
            continue;
        for (uint s = 0; s < KW; s++) {
            const int w = w0 + (int)s;
            if (w < 0 || w >= (int)W)
                continue;
            m = fmax(m, xp[h * (int)W + w]);
        }
    }
    y[oy + i] = m;
}

// index (h*W + w) of the first maximum of window (p, q); -1 if empty
inline int window_argmax(__global const float *xp, const int H, const int W, const int h0, const int w0,
                         const int KH, const int KW)
{
    float m = -INFINITY;
    int am = -1;
    for (int r = 0; r < KH; r++) {
        const int h = h0 + r;
        if (h < 0 || h >= H)
            continue;
        for (int s = 0; s < KW; s++) {
            const int w = w0 + s;
            if (w < 0 || w >= W)
                continue;
            const float v = xp[h * W + w];
            if (v > m || am < 0) {
                m = v;
                am = h * W + w;
            }
        }
    }
    return am;
}

// Output windows containing input row h: p with p*S - PAD <= h < p*S - PAD + K.
inline void window_range(const int h, const int K, const int S, const int PAD, const int P, int *lo, int *hi)
{
    const int a = h + PAD - K + 1; // p*S >= a
    *lo = a <= 0 ? 0 : (a + S - 1) / S;
    *hi = min((h + PAD) / S, P - 1);
}

// one work-item per input element: dx = sum of dy over windows whose argmax it is
__kernel void maxpool_bwd(const uint planes, POOL_ARGS, __global const float *x, const uint ox,
                          __global const float *dy, const uint ody, __global float *dx, const uint odx)
{
    const uint i = get_global_id(0);
    if (i >= planes * H * W)
        return;
    const int w = (int)(i % W);
    const uint t = i / W;
    const int h = (int)(t % H);
    const uint pl = t / H;
    __global const float *xp = x + ox + (size_t)pl * H * W;
    __global const float *dyp = dy + ody + (size_t)pl * P * Q;
    int plo, phi, qlo, qhi;
    window_range(h, (int)KH, (int)SH, (int)PH, (int)P, &plo, &phi);
    window_range(w, (int)KW, (int)SW, (int)PW, (int)Q, &qlo, &qhi);
    const int self = h * (int)W + w;
    float g = 0.0f;
    for (int p = plo; p <= phi; p++)
        for (int q = qlo; q <= qhi; q++) {
            const int am = window_argmax(xp, (int)H, (int)W, p * (int)SH - (int)PH, q * (int)SW - (int)PW,
                                         (int)KH, (int)KW);
            if (am == self)
                g += dyp[p * (int)Q + q];
        }
    dx[odx + i] = g;
}

inline float avg_divisor(const int h0, const int w0, const int H, const int W, const int KH, const int KW,
                         const int PH, const int PW)
{
    const int h1 = min(h0 + KH, H + PH);
    const int w1 = min(w0 + KW, W + PW);
    return (float)((h1 - h0) * (w1 - w0));
}

__kernel void avgpool_fwd(const uint planes, POOL_ARGS, __global const float *x, const uint ox, __global float *y,
                          const uint oy)
{
    const uint i = get_global_id(0);
    if (i >= planes * P * Q)
        return;
    const uint q = i % Q;
    const uint t = i / Q;
    const uint p = t % P;
    const uint pl = t / P;
    __global const float *xp = x + ox + (size_t)pl * H * W;
    const int h0 = (int)(p * SH) - (int)PH;
    const int w0 = (int)(q * SW) - (int)PW;
    float acc = 0.0f;
    for (uint r = 0; r < KH; r++) {
        const int h = h0 + (int)r;
        if (h < 0 || h >= (int)H)
            continue;
        for (uint s = 0; s < KW; s++) {
            const int w = w0 + (int)s;
            if (w < 0 || w >= (int)W)
                continue;
            acc += xp[h * (int)W + w];
        }
    }
    y[oy + i] = acc / avg_divisor(h0, w0, (int)H, (int)W, (int)KH, (int)KW, (int)PH, (int)PW);
}

__kernel void avgpool_bwd(const uint planes, POOL_ARGS, __global const float *dy, const uint ody, __global float *dx,
                          const uint odx)
{
    const uint i = get_global_id(0);
    if (i >= planes * H * W)
        return;
    const int w = (int)(i % W);
    const uint t = i / W;
    const int h = (int)(t % H);
    const uint pl = t / H;
    __global const float *dyp = dy + ody + (size_t)pl * P * Q;
    int plo, phi, qlo, qhi;
    window_range(h, (int)KH, (int)SH, (int)PH, (int)P, &plo, &phi);
    window_range(w, (int)KW, (int)SW, (int)PW, (int)Q, &qlo, &qhi);
    float g = 0.0f;
    for (int p = plo; p <= phi; p++)
        for (int q = qlo; q <= qhi; q++) {
            const int h0 = p * (int)SH - (int)PH, w0 = q * (int)SW - (int)PW;
            g += dyp[p * (int)Q + q] / avg_divisor(h0, w0, (int)H, (int)W, (int)KH, (int)KW, (int)PH, (int)PW);
        }
    dx[odx + i] = g;
}

// Global average pooling: one work-item per plane.
__kernel void gap_fwd(const uint planes, const uint hw, __global const float *x, const uint ox, __global float *y,
                      const uint oy)
{
    const uint pl = get_global_id(0);
    if (pl >= planes)
        return;
    __global const float *xp = x + ox + (size_t)pl * hw;
    float acc = 0.0f;
    for (uint i = 0; i < hw; i++)
        acc += xp[i];
    y[oy + pl] = acc / (float)hw;
}

// one work-item per input element
__kernel void gap_bwd(const uint planes, const uint hw, __global const float *dy, const uint ody, __global float *dx,
                      const uint odx)
{
    const uint i = get_global_id(0);
    if (i >= planes * hw)
        return;
    dx[odx + i] = dy[ody + i / hw] / (float)hw;
}
