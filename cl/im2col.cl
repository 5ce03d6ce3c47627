// im2col / col2im and a channel-packing copy for convolution (NCHW, fp32).
// Quotients use UDIV (unsigned) and remainders '%' so no signed div/rem pair
// of the same operands exists (LLVM would pair them with a `freeze` that
// oclgrind's uninitialized-value checker cannot interpret).
// Launch geometry and argument meaning: src/ops/conv.c.
// Column matrix element (b, crs, pq) lives at col[offcol + b*bstride + crs*ld + pq]
// where crs = (c*R + r)*S + s indexes the filter window of one group and
// pq = p*Q + q the output position.

#define UDIV(a, b) ((int)((uint)(a) / (uint)(b)))

// One work-item per (output row p, window element crs, image b) writes the
// Q contiguous entries of that row: gws = (P, Cg*R*S, images).
__kernel void im2col(__global const float *x, const int offx, const int C, const int H, const int W,
                     const int c0, const int Cg, const int R, const int S, const int P, const int Q,
                     const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                     const int dil_h, const int dil_w,
                     __global float *col, const int offcol, const int bstride, const int ld)
{
    const int p = get_global_id(0);
    const int crs = get_global_id(1);
    const int b = get_global_id(2);
    if (p >= P || crs >= Cg * R * S)
        return;
    const int s = crs % S;
    const int r = UDIV(crs, S) % R;
    const int c = UDIV(crs, R * S);
    const int h = p * stride_h - pad_h + r * dil_h;
    __global float *dst = col + offcol + b * bstride + crs * ld + p * Q;
    if (h < 0 || h >= H) {
        for (int q = 0; q < Q; q++)
            dst[q] = 0.0f;
        return;
    }
    __global const float *src = x + offx + ((b * C + c0 + c) * H + h) * W;
    const int w0 = s * dil_w - pad_w; // input column of q = 0
    // q in [qa, qb) reads inside the row: 0 <= q*stride_w + w0 < W
    const int qa = w0 >= 0 ? 0 : UDIV(-w0 + stride_w - 1, stride_w);
    const int qb = w0 >= W ? 0 : min(Q, UDIV(W - 1 - w0, stride_w) + 1);
    for (int q = 0; q < min(qa, Q); q++)
        dst[q] = 0.0f;
    if (stride_w == 1) {
        for (int q = qa; q < qb; q++)
            dst[q] = src[q + w0];
    } else {
        for (int q = qa; q < qb; q++)
            dst[q] = src[q * stride_w + w0];
    }
    for (int q = max(qb, qa); q < Q; q++)
        dst[q] = 0.0f;
}

// Gathers the column gradient back to the image (overwrites dx channels
// c0 .. c0+Cg-1): every input pixel sums the column entries that read it.
__kernel void col2im(__global const float *col, const int offcol, const int bstride, const int ld,
                     const int C, const int H, const int W, const int c0, const int Cg,
                     const int R, const int S, const int P, const int Q,
                     const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                     const int dil_h, const int dil_w,
                     __global float *dx, const int offdx)
{
    const int hw = get_global_id(0);
    const int c = get_global_id(1);
    const int b = get_global_id(2);
    if (hw >= H * W || c >= Cg)
        return;
    const int h = UDIV(hw, W), w = hw % W;
    __global const float *cb = col + offcol + b * bstride;
    float acc = 0.0f;
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
            acc += cb[((c * R + r) * S + s) * ld + p * Q + q];
        }
    }
    dx[offdx + ((b * C + c0 + c) * H + h) * W + w] = acc;
}

// dst[c*ld + b*HW + i] = src[offsrc + (b*Ctot + c0 + c)*HW + i]: gathers one
// channel group of a batch chunk into a (Cg) x (nb*HW) matrix.
__kernel void pack_chw(__global const float *src, const int offsrc, const int Ctot, const int c0, const int Cg,
                       const int HW, __global float *dst, const int offdst, const int ld)
{
    const int i = get_global_id(0);
    const int c = get_global_id(1);
    const int b = get_global_id(2);
    if (i >= HW || c >= Cg)
        return;
    dst[offdst + c * ld + b * HW + i] = src[offsrc + (b * Ctot + c0 + c) * HW + i];
}

// a / b for 0 <= a < 2^23, b > 0 without an integer divide (x86 has no
// vector one, so a divide per work-item serialises vectorised kernels): the
// float estimate is off by at most one and is corrected.
inline int fdiv(const int a, const int b, const float invb)
{
    int q = (int)((float)a * invb);
    const int r = a - q * b;
    q += (r >= b) - (r < 0);
    return q;
}

// One work-item per column element, gws = (Q, P, images*Cg*R*S): dim 0
// runs along the output row so the reads (stride 1) and the writes are
// consecutive across work-items and CPU runtimes vectorise them with masked
// loads at the padded edges. Requires images*Cg*R*S < 2^23 (fdiv).
// z = b*Cg*R*S + crs, or with b_inner = crs*nb + b (the image index runs
// fastest, so that consecutive work-groups write neighbouring rows when the
// column matrix is image-interleaved: bstride < ld).
__kernel void im2col_w(__global const float *x, const int offx, const int C, const int H, const int W,
                       const int c0, const int Cg, const int R, const int S, const int P, const int Q,
                       const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                       const int dil_h, const int dil_w,
                       __global float *col, const int offcol, const int bstride, const int ld,
                       const int nb, const int b_inner)
{
    const int q = get_global_id(0);
    const int p = get_global_id(1);
    const int z = get_global_id(2);
    if (q >= Q || p >= P)
        return;
    const int rs = R * S, crsn = Cg * rs;
    const int d = b_inner ? nb : crsn; // branch-free: keeps the kernel vectorisable
    const int hi = fdiv(z, d, 1.0f / (float)d), lo = z - hi * d;
    const int b = b_inner ? lo : hi, crs = b_inner ? hi : lo;
    const int c = fdiv(crs, rs, 1.0f / (float)rs), rsi = crs - c * rs;
    const int r = fdiv(rsi, S, 1.0f / (float)S), s = rsi - r * S;
    const int h = p * stride_h - pad_h + r * dil_h;
    const int w = q * stride_w - pad_w + s * dil_w;
    float v = 0.0f;
    if ((uint)h < (uint)H && (uint)w < (uint)W)
        v = x[offx + ((b * C + c0 + c) * H + h) * W + w];
    col[offcol + b * bstride + crs * ld + p * Q + q] = v;
}

#if defined(CR) && defined(CS)
// col2im for dilation 1 with the window fixed at compile time (-D CR=R
// -D CS=S) and the stride too (-D CU=stride_h -D CV=stride_w; 1 when not
// given): unrolled gather of the column entries that read input pixel
// (h, w) -- with a stride, only the taps whose offset the stride divides
// (a 1x1 window with stride 2 reads one entry at even (h, w), none
// elsewhere). gws = (W, H, images*Cg); dim 0 along the row makes every
// column read consecutive across work-items (masked at the edges).
#ifndef CU
#define CU 1
#endif
#ifndef CV
#define CV 1
#endif
__kernel void col2im_s1(__global const float *col, const int offcol, const int bstride, const int ld,
                        const int C, const int H, const int W, const int c0, const int Cg,
                        const int P, const int Q, const int pad_h, const int pad_w,
                        __global float *dx, const int offdx)
{
    const int w = get_global_id(0);
    const int h = get_global_id(1);
    const int z = get_global_id(2);
    if (w >= W || h >= H)
        return;
    const int b = fdiv(z, Cg, 1.0f / (float)Cg), c = z - b * Cg;
    __global const float *cb = col + offcol + b * bstride + c * (CR * CS) * ld;
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < CR; r++) {
        const int hh = h + pad_h - r;
        const int p = hh / CU; /* hh < 0 is refused by the (uint) test below or by hh != p * CU */
        const int okh = hh == p * CU && (uint)p < (uint)P;
#pragma unroll
        for (int s = 0; s < CS; s++) {
            const int ww = w + pad_w - s;
            const int q = ww / CV;
            if (okh && ww == q * CV && (uint)q < (uint)Q)
                acc += cb[(r * CS + s) * ld + p * Q + q];
        }
    }
    dx[offdx + ((b * C + c0 + c) * H + h) * W + w] = acc;
}
#endif
