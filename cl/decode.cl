// Generation (src/model/decode.c) with the key/value cache in half
// (clgrad generate --precision fp16): rows are stored with vstore_half_rte
// and read with vload_half, core OpenCL 1.2 functions that need no
// cl_khr_fp16; the arithmetic is fp32. Offsets and row pitches count
// elements (halves in the caches, floats elsewhere).
#ifndef HD // head width (values per head): -DHD=d for the attention kernel
#define HD 32
#endif

// Cache rows past .. past + Tq - 1 of every sample n (Tc rows per sample,
// pitch ldc) = half(rows of X: Tq per sample, pitch ldx), C values a row.
__kernel void kv_append_half(const uint C, const uint Tq, const uint Tc, const uint past, const uint N,
                             __global const float *X, const uint ox, const uint ldx, __global half *Cache,
                             const uint oc, const uint ldc)
{
    const uint c = get_global_id(0), row = get_global_id(1);
    if (c >= C || row >= N * Tq)
        return;
    const uint n = row / Tq, i = row - n * Tq;
    vstore_half_rte(X[ox + (size_t)row * ldx + c], oc + ((size_t)n * Tc + past + i) * ldc + c, Cache);
}

// attn_fwd_cached (cl/attention.cl) with half K and V caches: queries of Tq
// new positions past .. past + Tq - 1 against the cached rows 0 ..
// past + Tq - 1, causal (position past + i sees j <= past + i). One
// work-item per (i, n * H + h); online softmax key by key. Writes O only.
__kernel void attn_fwd_cached_half(const uint Tq, const uint Tc, const uint past, const uint H, const uint NH,
                                   const float scale, const int causal, __global const float *Q, const uint oq,
                                   const uint ldq, __global const half *Kc, const uint okc, const uint ldkc,
                                   __global const half *Vc, const uint ovc, const uint ldvc, __global float *O,
                                   const uint oo, const uint ldo)
{
    const uint i = get_global_id(0), nh = get_global_id(1);
    if (i >= Tq || nh >= NH)
        return;
    const uint n = nh / H, h = nh - n * H;
    float q[HD], acc[HD];
    __global const float *qr = Q + oq + ((size_t)n * Tq + i) * ldq + h * HD;
    for (uint d = 0; d < HD; d++) {
        q[d] = qr[d] * scale;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const uint jn = causal ? past + i + 1 : past + Tq;
    for (uint j = 0; j < jn; j++) {
        const size_t kr = okc + ((size_t)n * Tc + j) * ldkc + h * HD;
        const size_t vr = ovc + ((size_t)n * Tc + j) * ldvc + h * HD;
        float s = 0.0f;
        for (uint d = 0; d < HD; d++)
            s += q[d] * vload_half(kr + d, Kc);
        const float mn = fmax(m, s);
        const float corr = exp(m - mn), p = exp(s - mn);
        l = l * corr + p;
        for (uint d = 0; d < HD; d++)
            acc[d] = acc[d] * corr + p * vload_half(vr + d, Vc);
        m = mn;
    }
    __global float *orow = O + oo + ((size_t)n * Tq + i) * ldo + h * HD;
    const float inv = 1.0f / l;
    for (uint d = 0; d < HD; d++)
        orow[d] = acc[d] * inv;
}
