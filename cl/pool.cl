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

// General kernels: 3-D range (q, p, plane), one work-item per output
// element; planes = N*C.
__kernel void maxpool_fwd(const uint planes, POOL_ARGS, __global const float *x, const uint ox, __global float *y,
                          const uint oy)
{
    const uint q = get_global_id(0);
    const uint p = get_global_id(1);
    const uint pl = get_global_id(2);
    if (q >= Q || p >= P || pl >= planes)
        return;
    const size_t i = ((size_t)pl * P + p) * Q + q;
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

// Overlapping windows (stride < size), two steps: maxpool_argmax stores the
// first maximum of every window (index h*W + w in its plane), then one
// work-item per input element gathers dy over the windows that chose it.
__kernel void maxpool_argmax(const uint planes, POOL_ARGS, __global const float *x, const uint ox,
                             __global int *am)
{
    const uint q = get_global_id(0);
    const uint p = get_global_id(1);
    const uint pl = get_global_id(2);
    if (q >= Q || p >= P || pl >= planes)
        return;
    __global const float *xp = x + ox + (size_t)pl * H * W;
    am[((size_t)pl * P + p) * Q + q] =
        window_argmax(xp, (int)H, (int)W, (int)(p * SH) - (int)PH, (int)(q * SW) - (int)PW, (int)KH, (int)KW);
}

__kernel void maxpool_bwd(const uint planes, POOL_ARGS, __global const int *am, __global const float *dy,
                          const uint ody, __global float *dx, const uint odx)
{
    const int w = (int)get_global_id(0);
    const int h = (int)get_global_id(1);
    const uint pl = get_global_id(2);
    if (w >= (int)W || h >= (int)H || pl >= planes)
        return;
    const size_t i = ((size_t)pl * H + (size_t)h) * W + (size_t)w;
    __global const float *dyp = dy + ody + (size_t)pl * P * Q;
    __global const int *amp = am + (size_t)pl * P * Q;
    int plo, phi, qlo, qhi;
    window_range(h, (int)KH, (int)SH, (int)PH, (int)P, &plo, &phi);
    window_range(w, (int)KW, (int)SW, (int)PW, (int)Q, &qlo, &qhi);
    const int self = h * (int)W + w;
    float g = 0.0f;
    for (int p = plo; p <= phi; p++)
        for (int q = qlo; q <= qhi; q++)
            g += amp[p * (int)Q + q] == self ? dyp[p * (int)Q + q] : 0.0f;
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
    const uint q = get_global_id(0);
    const uint p = get_global_id(1);
    const uint pl = get_global_id(2);
    if (q >= Q || p >= P || pl >= planes)
        return;
    const size_t i = ((size_t)pl * P + p) * Q + q;
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
    const int w = (int)get_global_id(0);
    const int h = (int)get_global_id(1);
    const uint pl = get_global_id(2);
    if (w >= (int)W || h >= (int)H || pl >= planes)
        return;
    const size_t i = ((size_t)pl * H + (size_t)h) * W + (size_t)w;
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

// one work-item per input element: gws = (hw, planes) (no division by hw
// per element to find its plane)
__kernel void gap_bwd(const uint planes, const uint hw, __global const float *dy, const uint ody, __global float *dx,
                      const uint odx)
{
    const uint j = get_global_id(0);
    const uint pl = get_global_id(1);
    if (j >= hw || pl >= planes)
        return;
    dx[odx + (size_t)pl * hw + j] = dy[ody + pl] / (float)hw;
}

// Non-overlapping windows (stride >= size): one work-item per output element
// scatters dy to its window's first maximum and 0 elsewhere in the window;
// input elements outside every window are zeroed beforehand by the host.
__kernel void maxpool_bwd_scatter(const uint planes, POOL_ARGS, __global const float *x, const uint ox,
                                  __global const float *dy, const uint ody, __global float *dx, const uint odx)
{
    const uint q = get_global_id(0);
    const uint p = get_global_id(1);
    const uint pl = get_global_id(2);
    if (q >= Q || p >= P || pl >= planes)
        return;
    __global const float *xp = x + ox + (size_t)pl * H * W;
    __global float *dxp = dx + odx + (size_t)pl * H * W;
    const int h0 = (int)(p * SH) - (int)PH, w0 = (int)(q * SW) - (int)PW;
    const int am = window_argmax(xp, (int)H, (int)W, h0, w0, (int)KH, (int)KW);
    const float g = dy[ody + ((size_t)pl * P + p) * Q + q];
    for (int r = 0; r < (int)KH; r++) {
        const int h = h0 + r;
        if (h < 0 || h >= (int)H)
            continue;
        for (int s = 0; s < (int)KW; s++) {
            const int w = w0 + s;
            if (w < 0 || w >= (int)W)
                continue;
            dxp[h * (int)W + w] = select(0.0f, g, h * (int)W + w == am);
        }
    }
}

__kernel void avgpool_bwd_scatter(const uint planes, POOL_ARGS, __global const float *dy, const uint ody,
                                  __global float *dx, const uint odx)
{
    const uint q = get_global_id(0);
    const uint p = get_global_id(1);
    const uint pl = get_global_id(2);
    if (q >= Q || p >= P || pl >= planes)
        return;
    __global float *dxp = dx + odx + (size_t)pl * H * W;
    const int h0 = (int)(p * SH) - (int)PH, w0 = (int)(q * SW) - (int)PW;
    const float g = dy[ody + ((size_t)pl * P + p) * Q + q] /
                    avg_divisor(h0, w0, (int)H, (int)W, (int)KH, (int)KW, (int)PH, (int)PW);
    for (int r = 0; r < (int)KH; r++) {
        const int h = h0 + r;
        if (h < 0 || h >= (int)H)
            continue;
        for (int s = 0; s < (int)KW; s++) {
            const int w = w0 + s;
            if (w < 0 || w >= (int)W)
                continue;
            dxp[h * (int)W + w] = g;
        }
    }
}

// 2x2 windows, stride 2, no padding, even H and W (the common case): 2-D
// range (q, row) with row = plane * P + p, so input rows 2*row and 2*row+1
// follow without divisions. First maximum in row-major order wins.
// Backward with relu != 0: x is a relu's output and the gradient passes only
// where the window's maximum is > 0, the relu's derivative at the one
// element that receives it (the relu layer's own backward pass is then
// skipped: src/model/fuse.c).
__kernel void maxpool2_fwd(const uint rows, const uint Q, __global const float *x, const uint ox, __global float *y,
                           const uint oy)
{
    const uint q = get_global_id(0);
    const uint r = get_global_id(1);
    if (q >= Q || r >= rows)
        return;
    __global const float *a = x + ox + (size_t)(2 * r) * (2 * Q) + 2 * q;
    y[oy + (size_t)r * Q + q] = fmax(fmax(a[0], a[1]), fmax(a[2 * Q], a[2 * Q + 1]));
}

__kernel void maxpool2_bwd(const uint rows, const uint Q, __global const float *x, const uint ox,
                           __global const float *dy, const uint ody, __global float *dx, const uint odx,
                           const uint relu)
{
    const uint q = get_global_id(0);
    const uint r = get_global_id(1);
    if (q >= Q || r >= rows)
        return;
    const size_t o = (size_t)(2 * r) * (2 * Q) + 2 * q;
    const float2 t = vload2(0, x + ox + o);
    const float2 b = vload2(0, x + ox + o + 2 * Q);
    // first maximum in the order t.x, t.y, b.x, b.y
    const float m = fmax(fmax(t.x, t.y), fmax(b.x, b.y));
    const float gy = dy[ody + (size_t)r * Q + q];
    const float g = relu && !(m > 0.0f) ? 0.0f : gy;
    const int e0 = t.x == m;
    const int e1 = !e0 && t.y == m;
    const int e2 = !e0 && !e1 && b.x == m;
    const int e3 = !e0 && !e1 && !e2;
    vstore2((float2)(e0 ? g : 0.0f, e1 ? g : 0.0f), 0, dx + odx + o);
    vstore2((float2)(e2 ? g : 0.0f, e3 ? g : 0.0f), 0, dx + odx + o + 2 * Q);
}

// Even Q (W % 4 == 0): two outputs per work-item with float4 loads/stores;
// exact range (Q / 2, rows), no bounds checks (the host guarantees them).
__kernel void maxpool2_fwd4(const uint rows, const uint Q2, __global const float *x, const uint ox,
                            __global float *y, const uint oy)
{
    const uint j = get_global_id(0);
    const uint r = get_global_id(1);
    const uint W = 4 * Q2;
    const size_t o = (size_t)(2 * r) * W + 4 * j;
    const float4 m2 = fmax(vload4(0, x + ox + o), vload4(0, x + ox + o + W));
    vstore2(fmax(m2.even, m2.odd), j, y + oy + (size_t)r * (2 * Q2));
}

__kernel void maxpool2_bwd4(const uint rows, const uint Q2, __global const float *x, const uint ox,
                            __global const float *dy, const uint ody, __global float *dx, const uint odx,
                            const uint relu)
{
    const uint j = get_global_id(0);
    const uint r = get_global_id(1);
    const uint W = 4 * Q2;
    const size_t o = (size_t)(2 * r) * W + 4 * j;
    const float4 t = vload4(0, x + ox + o);
    const float4 b = vload4(0, x + ox + o + W);
    const float2 g = vload2(j, dy + ody + (size_t)r * (2 * Q2));
    /* the gradient goes to the first maximum of each window in the order
     * top-left, top-right, bottom-left, bottom-right: hand the remaining
     * gradient to each candidate in turn (rem - rem == 0 exactly) */
    const float2 tl = t.even, tr = t.odd, bl = b.even, br = b.odd;
    const float2 m = fmax(fmax(tl, tr), fmax(bl, br));
    float2 rem = relu ? select((float2)(0.0f), g, m > 0.0f) : g;
    const float2 d0 = select((float2)(0.0f), rem, tl == m);
    rem -= d0;
    const float2 d1 = select((float2)(0.0f), rem, tr == m);
    rem -= d1;
    const float2 d2 = select((float2)(0.0f), rem, bl == m);
    rem -= d2;
    vstore4((float4)(d0.x, d1.x, d0.y, d1.y), 0, dx + odx + o);
    vstore4((float4)(d2.x, rem.x, d2.y, rem.y), 0, dx + odx + o + W);
}

__kernel void avgpool2_fwd(const uint rows, const uint Q, __global const float *x, const uint ox, __global float *y,
                           const uint oy)
{
    const uint q = get_global_id(0);
    const uint r = get_global_id(1);
    if (q >= Q || r >= rows)
        return;
    __global const float *a = x + ox + (size_t)(2 * r) * (2 * Q) + 2 * q;
    y[oy + (size_t)r * Q + q] = 0.25f * ((a[0] + a[1]) + (a[2 * Q] + a[2 * Q + 1]));
}

__kernel void avgpool2_bwd(const uint rows, const uint Q, __global const float *dy, const uint ody,
                           __global float *dx, const uint odx)
{
    const uint q = get_global_id(0);
    const uint r = get_global_id(1);
    if (q >= Q || r >= rows)
        return;
    const size_t o = (size_t)(2 * r) * (2 * Q) + 2 * q;
    const float g = 0.25f * dy[ody + (size_t)r * Q + q];
    vstore2((float2)(g, g), 0, dx + odx + o);
    vstore2((float2)(g, g), 0, dx + odx + o + 2 * Q);
}
