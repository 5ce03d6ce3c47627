// Generation with a key/value cache (src/ops/attn_cache.c, used by
// src/model/decode.c through [attention]'s forward_step). Built with
// -DHD=d (head width) and, for clgrad generate --precision fp16, -DKV_HALF:
// the caches then hold IEEE half values, stored with vstore_half_rte and
// read with vload_half (core OpenCL 1.2: no cl_khr_fp16 needed); the
// arithmetic is fp32 either way. Offsets and row pitches count elements
// (halves in a half cache, floats elsewhere).
#ifndef HD // head width (values per head)
#define HD 32
#endif
#ifdef KV_HALF
#define KV_T half
#define KV_LOAD(p, i) vload_half((i), (p))
#define KV_STORE(v, p, i) vstore_half_rte((v), (i), (p))
#else
#define KV_T float
#define KV_LOAD(p, i) ((p)[i])
#define KV_STORE(v, p, i) ((p)[i] = (v))
#endif

// Cache rows past .. past + Tq - 1 of every sample n (Tc rows per sample,
// pitch ldc) = rows of X (Tq per sample, pitch ldx), C values a row.
__kernel void kv_append(const uint C, const uint Tq, const uint Tc, const uint past, const uint N,
                        __global const float *X, const uint ox, const uint ldx, __global KV_T *Cache, const uint oc,
                        const uint ldc)
{
    const uint c = get_global_id(0), row = get_global_id(1);
    if (c >= C || row >= N * Tq)
        return;
    const uint n = row / Tq, i = row - n * Tq;
    KV_STORE(X[ox + (size_t)row * ldx + c], Cache, oc + ((size_t)n * Tc + past + i) * ldc + c);
}

// Queries of Tq new positions past .. past + Tq - 1 against the cached keys and values of
// positions 0 .. past + Tq - 1 (rows n * Tc + j of Kc, Vc: Tc rows per sample), causal:
// position past + i sees j <= past + i. One work-item per (i, n * H + h); online softmax
// key by key (generation runs one or a few queries, so no tiles). Writes O only.
__kernel void attn_fwd_cached(const uint Tq, const uint Tc, const uint past, const uint H, const uint NH,
                              const float scale, const int causal, __global const float *Q, const uint oq,
                              const uint ldq, __global const KV_T *Kc, const uint okc, const uint ldkc,
                              __global const KV_T *Vc, const uint ovc, const uint ldvc, __global float *O,
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
            s += q[d] * KV_LOAD(Kc, kr + d);
        const float mn = fmax(m, s);
        const float corr = exp(m - mn), p = exp(s - mn);
        l = l * corr + p;
        for (uint d = 0; d < HD; d++)
            acc[d] = acc[d] * corr + p * KV_LOAD(Vc, vr + d);
        m = mn;
    }
    __global float *orow = O + oo + ((size_t)n * Tq + i) * ldo + h * HD;
    const float inv = 1.0f / l;
    for (uint d = 0; d < HD; d++)
        orow[d] = acc[d] * inv;
}
