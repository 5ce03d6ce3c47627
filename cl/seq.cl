// Sequence ops (issue 23): token embedding, learned positions, layer
// normalization, token cross-entropy. A sequence (N, T, C) is row-major, C
// fastest; rows = N*T. No float atomics: every sum has one owner and a fixed
// order, so results are bitwise reproducible. Offsets and counts in elements
// (uint); see src/ops/seq.h.

// ---- embedding ----
// y[p, d] = table[id_p, d] for p < ntok, d < D; ids are floats holding
// integers. An id that is not an integer in [0, V) writes zeros and leaves
// the smallest such position in flag[0] (the host starts it at 0xffffffff).
__kernel void emb_fwd(const uint ntok, const uint D, const uint V, __global const float *ids, const uint oid,
                      __global const float *table, __global float *y, const uint oy, __global uint *flag)
{
    const uint d = get_global_id(0);
    const uint p = get_global_id(1);
    if (d >= D || p >= ntok)
        return;
    const float f = ids[oid + p];
    const int ok = f >= 0.0f && f < (float)V && f == floor(f);
    const uint id = ok ? (uint)f : 0u;
    y[oy + (size_t)p * D + d] = ok ? table[(size_t)id * D + d] : 0.0f;
    if (!ok && d == 0)
        atomic_min(flag, p);
}

// Table gradient as a counting sort of the positions by id, then one owner
// per table element summing its positions in order (no float atomics):
//   emb_count: cnt[v] = number of positions holding id v (one work-item per v)
//   emb_scan:  start[v] = sum of cnt[0..v), start[V] = total (one work-item)
//   emb_fill:  list[start[v] ..] = the positions holding v, ascending
//   emb_sum:   dt[v, d] = (acc ? dt[v, d] : 0) + sum over list of dy[p, d]
// (acc: a tied dense head wrote its part first). Invalid ids match no v.
__kernel void emb_count(const uint ntok, const uint V, __global const float *ids, const uint oid, __global uint *cnt)
{
    const uint v = get_global_id(0);
    if (v >= V)
        return;
    const float fv = (float)v;
    uint c = 0;
    for (uint p = 0; p < ntok; p++)
        c += ids[oid + p] == fv;
    cnt[v] = c;
}

__kernel void emb_scan(const uint V, __global const uint *cnt, __global uint *start)
{
    if (get_global_id(0) != 0)
        return;
    uint s = 0;
    for (uint v = 0; v < V; v++) {
        start[v] = s;
        s += cnt[v];
    }
    start[V] = s;
}

__kernel void emb_fill(const uint ntok, const uint V, __global const float *ids, const uint oid,
                       __global const uint *start, __global uint *list)
{
    const uint v = get_global_id(0);
    if (v >= V)
        return;
    const float fv = (float)v;
    uint k = start[v];
    for (uint p = 0; p < ntok; p++)
        if (ids[oid + p] == fv)
            list[k++] = p;
}

__kernel void emb_sum(const uint D, const uint V, __global const uint *start, __global const uint *list,
                      __global const float *dy, const uint ody, __global float *dt, const uint acc)
{
    const uint d = get_global_id(0);
    const uint v = get_global_id(1);
    if (d >= D || v >= V)
        return;
    const size_t i = (size_t)v * D + d;
    float s = acc ? dt[i] : 0.0f;
    const uint e = start[v + 1];
    for (uint k = start[v]; k < e; k++)
        s += dy[ody + (size_t)list[k] * D + d];
    dt[i] = s;
}

// Sum and maximum of the 8 lanes of v, lane 0 first. Through a private
// array: oclgrind 21.10's --uninitialized crashes (SIGSEGV in its shadow
// copy) on arithmetic over swizzled lanes (v.lo + v.hi, v.s0 + v.s1).
inline float clg_fold8(const float8 v)
{
    float t[8];
    vstore8(v, 0, t);
    float s = t[0];
    for (int i = 1; i < 8; i++)
        s += t[i];
    return s;
}

inline float clg_max8(const float8 v)
{
    float t[8];
    vstore8(v, 0, t);
    float m = t[0];
    for (int i = 1; i < 8; i++)
        m = fmax(m, t[i]);
    return m;
}

// ---- learned positions ----
// y[n, t, c] = x[n, t, c] + P[t, c]; tc = T*C.
__kernel void pos_fwd(const uint total, const uint tc, __global const float *x, const uint ox,
                      __global const float *P, __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i < total)
        y[oy + i] = x[ox + i] + P[i % tc];
}

// dP[j] = sum_n dy[n*tc + j] for j < tc, in n order; 0 for the rows of
// positions tc <= j < ctc that the batch does not reach.
__kernel void pos_bwd(const uint N, const uint tc, const uint ctc, __global const float *dy, const uint ody,
                      __global float *dP)
{
    const uint j = get_global_id(0);
    if (j >= ctc)
        return;
    float s = 0.0f;
    if (j < tc)
        for (uint n = 0; n < N; n++)
            s += dy[ody + (size_t)n * tc + j];
    dP[j] = s;
}

// ---- layer normalization over C, one work-item per row ----
// Two passes (mean, then the sum of squared deviations): no E[x^2] - E[x]^2
// cancellation; both on x - x[0] of the row, so a mean far from 0 against
// the spread keeps its digits (x - x0 is exact for nearby values). Saves
// mean - x0 ("shifted mean") and rstd = 1 / sqrt(var + eps) per row.
__kernel void ln_fwd(const uint rows, const uint C, const float eps, __global const float *x, const uint ox,
                     __global const float *g, __global const float *b, const uint affine, __global float *y,
                     const uint oy, __global float *mean, __global float *rstd)
{
    const uint r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float *xr = x + ox + (size_t)r * C;
    __global float *yr = y + oy + (size_t)r * C;
    const float x0 = xr[0];
    float s = 0.0f;
    for (uint c = 0; c < C; c++)
        s += xr[c] - x0;
    const float m = s / (float)C;
    float q = 0.0f;
    for (uint c = 0; c < C; c++) {
        const float d = (xr[c] - x0) - m;
        q = fma(d, d, q);
    }
    const float rs = rsqrt(q / (float)C + eps);
    for (uint c = 0; c < C; c++) {
        const float h = ((xr[c] - x0) - m) * rs;
        yr[c] = affine ? fma(h, g[c], b[c]) : h;
    }
    mean[r] = m;
    rstd[r] = rs;
}


// ln_fwd for C a multiple of 8: eight values per step in explicit vectors
// (the per-row loops otherwise read with a stride of C across work-items).
__kernel void ln_fwd8(const uint rows, const uint C, const float eps, __global const float *x, const uint ox,
                      __global const float *g, __global const float *b, const uint affine, __global float *y,
                      const uint oy, __global float *mean, __global float *rstd)
{
    const uint r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float *xr = x + ox + (size_t)r * C;
    __global float *yr = y + oy + (size_t)r * C;
    const uint nv = C / 8;
    const float x0 = xr[0];
    float8 s8 = (float8)(0.0f);
    for (uint k = 0; k < nv; k++)
        s8 += vload8(k, xr) - x0;
    const float m = clg_fold8(s8) / (float)C;
    float8 q8 = (float8)(0.0f);
    for (uint k = 0; k < nv; k++) {
        const float8 d = (vload8(k, xr) - x0) - m;
        q8 = fma(d, d, q8);
    }
    const float rs = rsqrt(clg_fold8(q8) / (float)C + eps);
    for (uint k = 0; k < nv; k++) {
        const float8 h = ((vload8(k, xr) - x0) - m) * rs;
        vstore8(affine ? fma(h, vload8(k, g), vload8(k, b)) : h, k, yr);
    }
    mean[r] = m;
    rstd[r] = rs;
}

// dx = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat)), gdy = g * dy;
// xhat = ((x - x0) - shifted mean) * rstd.
__kernel void ln_bwd_dx(const uint rows, const uint C, __global const float *x, const uint ox,
                        __global const float *dy, const uint ody, __global const float *g, const uint affine,
                        __global const float *mean, __global const float *rstd, __global float *dx, const uint odx)
{
    const uint r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float *xr = x + ox + (size_t)r * C;
    __global const float *dr = dy + ody + (size_t)r * C;
    __global float *o = dx + odx + (size_t)r * C;
    const float m = mean[r], rs = rstd[r], x0 = xr[0];
    float a = 0.0f, bsum = 0.0f;
    for (uint c = 0; c < C; c++) {
        const float gd = affine ? g[c] * dr[c] : dr[c];
        a += gd;
        bsum = fma(gd, ((xr[c] - x0) - m) * rs, bsum);
    }
    a /= (float)C;
    bsum /= (float)C;
    for (uint c = 0; c < C; c++) {
        const float gd = affine ? g[c] * dr[c] : dr[c];
        o[c] = rs * (gd - a - ((xr[c] - x0) - m) * rs * bsum);
    }
}

// dx of row r in float8 (C a multiple of 8); with pg (a constant at each call) also
// pg += dy * xhat, pb += dy over the row (ln_bwd_fused8).
static inline void ln_bwd_row8(const uint r, const uint C, __global const float *x, const uint ox,
                               __global const float *dy, const uint ody, __global const float *g, const uint affine,
                               __global const float *mean, __global const float *rstd, __global float *dx,
                               const uint odx, __global float *pg, __global float *pb)
{
    __global const float *xr = x + ox + (size_t)r * C;
    __global const float *dr = dy + ody + (size_t)r * C;
    __global float *o = dx + odx + (size_t)r * C;
    const uint nv = C / 8;
    const float m = mean[r], rs = rstd[r], x0 = xr[0];
    float8 a8 = (float8)(0.0f), b8 = (float8)(0.0f);
    for (uint k = 0; k < nv; k++) {
        const float8 gd = affine ? vload8(k, g) * vload8(k, dr) : vload8(k, dr);
        a8 += gd;
        b8 = fma(gd, ((vload8(k, xr) - x0) - m) * rs, b8);
    }
    const float a = clg_fold8(a8) / (float)C, bsum = clg_fold8(b8) / (float)C;
    for (uint k = 0; k < nv; k++) {
        const float8 d = vload8(k, dr), h = ((vload8(k, xr) - x0) - m) * rs;
        const float8 gd = affine ? vload8(k, g) * d : d;
        vstore8(rs * (gd - a - h * bsum), k, o);
        if (pg) {
            vstore8(fma(d, h, vload8(k, pg)), k, pg);
            vstore8(vload8(k, pb) + d, k, pb);
        }
    }
}

// ln_bwd_dx for C a multiple of 8, in float8 (as ln_fwd8).
__kernel void ln_bwd_dx8(const uint rows, const uint C, __global const float *x, const uint ox,
                         __global const float *dy, const uint ody, __global const float *g, const uint affine,
                         __global const float *mean, __global const float *rstd, __global float *dx, const uint odx)
{
    const uint r = get_global_id(0);
    if (r < rows)
        ln_bwd_row8(r, C, x, ox, dy, ody, g, affine, mean, rstd, dx, odx, 0, 0);
}

// dg[c] = sum_r dy[r, c] * xhat[r, c], db[c] = sum_r dy[r, c] in two
// deterministic steps: ln_bwd_param sums chunk k of LN_ROWS rows into
// part[k] (2 x C floats: dg then db), one work-item per (c, k);
// ln_bwd_param_sum adds the chunks in order.
#ifndef LN_ROWS // rows per partial sum (ln_bwd_param)
#define LN_ROWS 64
#endif
__kernel void ln_bwd_param(const uint rows, const uint C, __global const float *x, const uint ox,
                           __global const float *dy, const uint ody, __global const float *mean,
                           __global const float *rstd, __global float *part)
{
    const uint c = get_global_id(0);
    const uint k = get_global_id(1);
    if (c >= C || k * LN_ROWS >= rows)
        return;
    float sg = 0.0f, sb = 0.0f;
    const uint end = min(rows, (k + 1) * LN_ROWS);
    for (uint r = k * LN_ROWS; r < end; r++) {
        const size_t i = (size_t)r * C + c;
        const float d = dy[ody + i];
        sg = fma(d, ((x[ox + i] - x[ox + (size_t)r * C]) - mean[r]) * rstd[r], sg);
        sb += d;
    }
    part[(size_t)k * 2 * C + c] = sg;
    part[(size_t)k * 2 * C + C + c] = sb;
}

// ln_bwd_dx8 and ln_bwd_param in one pass (CPU devices: one read of x and dy,
// one launch fewer): one work-item per chunk k of LN_ROWS rows writes dx of
// its rows and part[k], adding the rows in the order ln_bwd_param does (the
// same sums, bit for bit); part[k] stays in the cache between rows.
__kernel void ln_bwd_fused8(const uint rows, const uint C, __global const float *x, const uint ox,
                            __global const float *dy, const uint ody, __global const float *g, const uint affine,
                            __global const float *mean, __global const float *rstd, __global float *dx,
                            const uint odx, __global float *part)
{
    const uint k = get_global_id(0);
    if (k * LN_ROWS >= rows)
        return;
    const uint nv = C / 8, end = min(rows, (k + 1) * LN_ROWS);
    __global float *pg = part + (size_t)k * 2 * C, *pb = pg + C;
    for (uint q = 0; q < nv; q++) {
        vstore8((float8)(0.0f), q, pg);
        vstore8((float8)(0.0f), q, pb);
    }
    for (uint r = k * LN_ROWS; r < end; r++)
        ln_bwd_row8(r, C, x, ox, dy, ody, g, affine, mean, rstd, dx, odx, pg, pb);
}

__kernel void ln_bwd_param_sum(const uint chunks, const uint C, __global const float *part, __global float *dg,
                               __global float *db)
{
    const uint c = get_global_id(0);
    if (c >= C)
        return;
    float sg = 0.0f, sb = 0.0f;
    for (uint k = 0; k < chunks; k++) {
        sg += part[(size_t)k * 2 * C + c];
        sb += part[(size_t)k * 2 * C + C + c];
    }
    dg[c] = sg;
    db[c] = sb;
}

// ---- token cross-entropy, one work-item per position ----
// (one work-item per row: on PoCL 3x faster than a work-group per row with
// local-memory reductions at 4096 x 256, whose barriers cost more than the
// strided reads)
// p = softmax(x) over V classes; loss[r] = w * ((1 - eps) (-log p_y) + eps
// mean_c (-log p_c)), correct[r] = w when the first argmax is the label
// (w = 1/T: the layer reports per-sample means over positions). A label
// outside [0, V) gives a NaN loss.
__kernel void tok_xent_fwd(const uint rows, const uint V, const float w, const float eps,
                           __global const float *x, const uint ox, __global float *p, const uint op,
                           __global const int *labels, const uint ol, __global float *loss, __global float *correct)
{
    const uint r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float *xr = x + ox + (size_t)r * V;
    __global float *pr = p + op + (size_t)r * V;
    float mx = xr[0];
    uint am = 0;
    for (uint c = 1; c < V; c++)
        if (xr[c] > mx) {
            mx = xr[c];
            am = c;
        }
    float s = 0.0f, sx = 0.0f; // s: without the maximum's own term, exactly 1
    for (uint c = 0; c < V; c++) {
        const float e = exp(xr[c] - mx);
        pr[c] = e;
        s += c == am ? 0.0f : e;
        sx += xr[c] - mx;
    }
    const float ls = log1p(s); // log1p: accurate when the row is confident
    const float inv = 1.0f / (1.0f + s);
    for (uint c = 0; c < V; c++)
        pr[c] *= inv;
    const int y = labels[ol + r];
    const int ok = y >= 0 && (uint)y < V;
    const float nll = ok ? ls - (xr[ok ? y : 0] - mx) : NAN;
    const float uni = ls - sx / (float)V; // mean_c -log p_c
    loss[r] = w * ((1.0f - eps) * nll + eps * uni);
    correct[r] = (ok && am == (uint)y) ? w : 0.0f;
}

// The same for V a multiple of 8, eight classes per step in explicit
// vectors (the per-row loops otherwise read with a stride of V across
// work-items); partial sums in 8 lanes, folded in lane order.
__kernel void tok_xent_fwd8(const uint rows, const uint V, const float w, const float eps,
                            __global const float *x, const uint ox, __global float *p, const uint op,
                            __global const int *labels, const uint ol, __global float *loss, __global float *correct)
{
    const uint r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float *xr = x + ox + (size_t)r * V;
    __global float *pr = p + op + (size_t)r * V;
    const uint nv = V / 8;
    float8 m8 = vload8(0, xr);
    for (uint k = 1; k < nv; k++)
        m8 = fmax(m8, vload8(k, xr));
    const float mx = clg_max8(m8);
    uint am = 0; // the first maximum
    while (am + 1 < V && xr[am] != mx)
        am++;
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    float8 s8 = (float8)(0.0f), sx8 = (float8)(0.0f);
    for (uint k = 0; k < nv; k++) {
        const float8 d = vload8(k, xr) - mx;
        const float8 e = exp(d);
        vstore8(e, k, pr);
        s8 += select(e, (float8)(0.0f), lane + (int)(8 * k) == (int8)((int)am)); // without the maximum's own 1
        sx8 += d;
    }
    const float s = clg_fold8(s8), sx = clg_fold8(sx8);
    const float ls = log1p(s);
    const float inv = 1.0f / (1.0f + s);
    for (uint k = 0; k < nv; k++)
        vstore8(vload8(k, pr) * inv, k, pr);
    const int y = labels[ol + r];
    const int ok = y >= 0 && (uint)y < V;
    const float nll = ok ? ls - (xr[ok ? y : 0] - mx) : NAN;
    const float uni = ls - sx / (float)V;
    loss[r] = w * ((1.0f - eps) * nll + eps * uni);
    correct[r] = (ok && am == (uint)y) ? w : 0.0f;
}

// dx = scale * (p - (1 - eps) onehot(y) - eps / V)
__kernel void tok_xent_bwd(const uint rows, const uint V, const float scale, const float eps,
                           __global const float *p, const uint op, __global const int *labels, const uint ol,
                           __global float *dx, const uint odx)
{
    const uint c = get_global_id(0);
    const uint r = get_global_id(1);
    if (c >= V || r >= rows)
        return;
    const size_t i = (size_t)r * V + c;
    const int y = labels[ol + r];
    const float t = (c == (uint)y ? 1.0f - eps : 0.0f) + eps / (float)V;
    dx[odx + i] = scale * (p[op + i] - t);
}
