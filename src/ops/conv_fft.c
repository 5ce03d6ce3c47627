/* FFT convolution through clFFT (forward pass; stride 1, no dilation, no
 * groups). Per chunk of images:
 *   fft_pad (x -> zero-padded Fh x Fw planes) -> clFFT R2C (batched 2-D)
 *   -> fft_cmul (Y[n][k] = sum_c X[n][c] conj(Wf[k][c]), a correlation)
 *   -> clFFT C2R (scale 1/(Fh*Fw)) -> fft_crop (+ bias, ReLU).
 * The filter spectra Wf are kept in the layer cache (clg_conv_cache) while
 * weights_version is unchanged. Fh >= max(H + pad_h, R, P) (likewise Fw)
 * avoids wrap-around on the outputs kept; sizes are rounded up to products
 * of 2, 3, 5, 7. clFFT is set up once per process while any context uses
 * it (clfftSetup on first use, clfftTeardown when the last context that
 * used it is destroyed); plans are baked once per (context, size, batch,
 * direction) and live in ctx->conv_state. */
#include <stdlib.h>
#include <string.h>

#include "clg_config.h"
#include "conv_impl.h"

#if CLG_HAVE_CLFFT
#include <clFFT.h>
#include <pthread.h>

typedef struct fft_plan {
    cl_command_queue queue;
    int fh, fw, batch, inverse;
    clfftPlanHandle h;
    size_t tmp_bytes;
} fft_plan;

typedef struct fft_state {
    fft_plan *plans;
    int n, cap;
} fft_state;

static pthread_mutex_t g_fft_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fft_users; /* contexts holding an fft_state: clFFT is set up while > 0 */

int clg_conv_fft_available(void) { return 1; }

static void fft_state_free(void *p)
{
    fft_state *st = p;
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        clFinish(st->plans[i].queue);
        clfftDestroyPlan(&st->plans[i].h);
    }
    free(st->plans);
    free(st);
    pthread_mutex_lock(&g_fft_lock);
    if (g_fft_users > 0 && --g_fft_users == 0)
        clfftTeardown();
    pthread_mutex_unlock(&g_fft_lock);
}

static clg_status fft_fail(clg_device *dev, clfftStatus e, const char *what)
{
    return clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "conv fft: %s failed (clFFT status %d)", what, (int)e);
}

static clg_status fft_state_get(clg_device *dev, fft_state **out)
{
    clg_ctx *ctx = dev->ctx;
    if (ctx->conv_state) {
        *out = ctx->conv_state;
        return CLG_OK;
    }
    fft_state *st = calloc(1, sizeof *st);
    if (!st)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "conv fft: out of host memory");
    pthread_mutex_lock(&g_fft_lock);
    if (g_fft_users == 0) {
        clfftSetupData sd;
        clfftStatus e = clfftInitSetupData(&sd);
        if (e == CLFFT_SUCCESS)
            e = clfftSetup(&sd);
        if (e != CLFFT_SUCCESS) {
            pthread_mutex_unlock(&g_fft_lock);
            free(st);
            return fft_fail(dev, e, "clfftSetup");
        }
    }
    g_fft_users++;
    pthread_mutex_unlock(&g_fft_lock);
    ctx->conv_state = st;
    ctx->conv_state_free = fft_state_free;
    *out = st;
    return CLG_OK;
}

/* Batched 2-D real FFT plan (forward R2C or inverse C2R), out of place,
 * planes packed densely: real Fh x Fw, complex Fh x (Fw/2 + 1). */
static clg_status fft_plan_get_locked(clg_device *dev, int fh, int fw, int batch, int inverse, fft_plan *out)
{
    fft_state *st = NULL;
    CLG_TRY(fft_state_get(dev, &st));
    for (int i = 0; i < st->n; i++) {
        fft_plan *p = &st->plans[i];
        if (p->queue == dev->queue && p->fh == fh && p->fw == fw && p->batch == batch && p->inverse == inverse) {
            *out = *p;
            return CLG_OK;
        }
    }
    if (st->n == st->cap) {
        int nc = st->cap ? 2 * st->cap : 8;
        fft_plan *np = realloc(st->plans, (size_t)nc * sizeof *np);
        if (!np)
            return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "conv fft: out of host memory");
        st->plans = np;
        st->cap = nc;
    }
    fft_plan p;
    memset(&p, 0, sizeof p);
    p.queue = dev->queue;
    p.fh = fh;
    p.fw = fw;
    p.batch = batch;
    p.inverse = inverse;
    size_t len[2] = {(size_t)fw, (size_t)fh};
    size_t fwc = (size_t)fw / 2 + 1;
    size_t rstr[2] = {1, (size_t)fw}, cstr[2] = {1, fwc};
    size_t rdist = (size_t)fh * fw, cdist = (size_t)fh * fwc;
    clfftStatus e = clfftCreateDefaultPlan(&p.h, dev->cl, CLFFT_2D, len);
    if (e != CLFFT_SUCCESS)
        return fft_fail(dev, e, "clfftCreateDefaultPlan");
    const char *what = "plan setup";
    if ((e = clfftSetPlanPrecision(p.h, CLFFT_SINGLE)) == CLFFT_SUCCESS &&
        (e = clfftSetLayout(p.h, inverse ? CLFFT_HERMITIAN_INTERLEAVED : CLFFT_REAL,
                            inverse ? CLFFT_REAL : CLFFT_HERMITIAN_INTERLEAVED)) == CLFFT_SUCCESS &&
        (e = clfftSetResultLocation(p.h, CLFFT_OUTOFPLACE)) == CLFFT_SUCCESS &&
        (e = clfftSetPlanInStride(p.h, CLFFT_2D, inverse ? cstr : rstr)) == CLFFT_SUCCESS &&
        (e = clfftSetPlanOutStride(p.h, CLFFT_2D, inverse ? rstr : cstr)) == CLFFT_SUCCESS &&
        (e = clfftSetPlanDistance(p.h, inverse ? cdist : rdist, inverse ? rdist : cdist)) == CLFFT_SUCCESS &&
        (e = clfftSetPlanBatchSize(p.h, (size_t)batch)) == CLFFT_SUCCESS) {
        what = "clfftBakePlan";
        if ((e = clfftBakePlan(p.h, 1, &dev->queue, NULL, NULL)) == CLFFT_SUCCESS) {
            what = "clfftGetTmpBufSize";
            e = clfftGetTmpBufSize(p.h, &p.tmp_bytes);
        }
    }
    if (e != CLFFT_SUCCESS) {
        clfftDestroyPlan(&p.h);
        return fft_fail(dev, e, what);
    }
    st->plans[st->n++] = p;
    *out = p;
    return CLG_OK;
}

/* The plan list (and clFFT's plan creation) is shared by the devices' threads. */
static clg_status fft_plan_get(clg_device *dev, int fh, int fw, int batch, int inverse, fft_plan *out)
{
    clg_ctx_lock(dev->ctx);
    clg_status st = fft_plan_get_locked(dev, fh, fw, batch, inverse, out);
    clg_ctx_unlock(dev->ctx);
    return st;
}

static clg_status fft_run(clg_device *dev, const fft_plan *p, cl_mem in, cl_mem out)
{
    cl_mem tmp = NULL;
    if (p->tmp_bytes)
        CLG_TRY(clg_buf_alloc(dev, p->tmp_bytes, &tmp));
    /* clFFT's enqueue is not safe from two threads at once (its kernel
     * repository and argument setting are shared): with devices driven by
     * their own threads, transforms on two devices at the same time gave
     * wrong results. Enqueues are short; the transforms still overlap. */
    pthread_mutex_lock(&g_fft_lock);
    clfftStatus e = clfftEnqueueTransform(p->h, p->inverse ? CLFFT_BACKWARD : CLFFT_FORWARD, 1, &dev->queue, 0, NULL,
                                          NULL, &in, &out, tmp);
    pthread_mutex_unlock(&g_fft_lock);
    clg_buf_release(dev, tmp);
    if (e != CLFFT_SUCCESS)
        return fft_fail(dev, e, "clfftEnqueueTransform");
    return CLG_OK;
}

/* Smallest n' >= n whose prime factors are 2, 3, 5, 7 (clFFT radices). */
static int good_size(int n)
{
    for (int m = n < 1 ? 1 : n;; m++) {
        int r = m;
        for (int f = 2; f <= 7; f++)
            while (r % f == 0)
                r /= f;
        if (r == 1)
            return m;
    }
}

static clg_status launch_pad(clg_device *dev, cl_mem src, size_t offsrc, int planes, int H, int W, int pad_h,
                             int pad_w, int fh, int fw, cl_mem dst)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv", "", "fft_pad", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, src);
    clg_ka_int(&a, (int)offsrc);
    clg_ka_int(&a, H);
    clg_ka_int(&a, W);
    clg_ka_int(&a, pad_h);
    clg_ka_int(&a, pad_w);
    clg_ka_int(&a, fh);
    clg_ka_int(&a, fw);
    clg_ka_mem(&a, dst);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "fft_pad args"));
    size_t gws[3] = {(size_t)fw, (size_t)fh, (size_t)planes};
    return clg_conv_enqueue(dev, k, 3, gws, NULL);
}

/* Filter spectra (K*C planes of Fh x fwc complex) into Wf. */
static clg_status filter_spectra(clg_device *dev, const clg_conv_shape *s, int fh, int fw, cl_mem w, size_t offw,
                                 cl_mem Wf)
{
    int planes = s->K * s->C;
    cl_mem wp = NULL;
    CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)planes * fh * fw, &wp));
    clg_status st = launch_pad(dev, w, offw, planes, s->R, s->S, 0, 0, fh, fw, wp);
    fft_plan p;
    if (st == CLG_OK)
        st = fft_plan_get(dev, fh, fw, planes, 0, &p);
    if (st == CLG_OK)
        st = fft_run(dev, &p, wp, Wf);
    clg_buf_release(dev, wp);
    return st;
}

clg_status clg_conv_fft_fwd(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem x, size_t offx,
                            cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), C = s->C, K = s->K;
    int fh = good_size(CLG_MAX(CLG_MAX(s->H + s->pad_h, s->R), P));
    int fw = good_size(CLG_MAX(CLG_MAX(s->W + s->pad_w, s->S), Q));
    int fwc = fw / 2 + 1, F = fh * fwc;
    size_t wf_floats = (size_t)2 * K * C * F;
    /* filter spectra: cached per weights_version, else a temporary */
    cl_mem Wf = NULL;
    int tmp_wf = 0;
    if (cache && cache->transformed[CLG_CONV_FFT] && cache->built_version[CLG_CONV_FFT] == cache->weights_version) {
        Wf = cache->transformed[CLG_CONV_FFT];
    } else {
        cl_mem *slot = cache ? &cache->transformed[CLG_CONV_FFT] : &Wf;
        if (!*slot)
            CLG_TRY(clg_buf_alloc(dev, sizeof(float) * wf_floats, slot));
        tmp_wf = cache == NULL;
        clg_status st = filter_spectra(dev, s, fh, fw, w, offw, *slot);
        if (st != CLG_OK) {
            clg_buf_release(dev, *slot);
            *slot = NULL;
            return st;
        }
        if (cache)
            cache->built_version[CLG_CONV_FFT] = cache->weights_version;
        Wf = *slot;
    }
    /* images per chunk: padded input + spectra of input and output + padded output */
    size_t per_image = (size_t)C * fh * fw + (size_t)2 * C * F + (size_t)2 * K * F + (size_t)K * fh * fw;
    size_t lim = CLG_MIN((size_t)8 << 20, clg_conv_ws_floats(dev));
    int nb = (int)CLG_MIN((size_t)s->N, CLG_MAX((size_t)1, lim / per_image));
    nb = CLG_CEIL_DIV(s->N, CLG_CEIL_DIV(s->N, nb)); /* even chunks: at most two plan batch sizes */
    cl_kernel kmul, kcrop;
    clg_status st = clg_kernel_get(dev, "conv", "", "fft_cmul", &kmul);
    if (st == CLG_OK)
        st = clg_kernel_get(dev, "conv", "", "fft_crop", &kcrop);
    cl_mem xp = NULL, X = NULL, Y = NULL, yp = NULL;
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * C * fh * fw, &xp);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * 2 * (size_t)nb * C * F, &X);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * 2 * (size_t)nb * K * F, &Y);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * K * fh * fw, &yp);
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0);
        fft_plan pf, pi;
        st = launch_pad(dev, x, offx + (size_t)n0 * C * s->H * s->W, nbc * C, s->H, s->W, s->pad_h, s->pad_w, fh, fw,
                        xp);
        if (st == CLG_OK)
            st = fft_plan_get(dev, fh, fw, nbc * C, 0, &pf);
        if (st == CLG_OK)
            st = fft_run(dev, &pf, xp, X);
        if (st != CLG_OK)
            break;
        clg_kargs a = {kmul, 0, CL_SUCCESS};
        clg_ka_mem(&a, X);
        clg_ka_mem(&a, Wf);
        clg_ka_int(&a, C);
        clg_ka_int(&a, K);
        clg_ka_int(&a, F);
        clg_ka_mem(&a, Y);
        if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "fft_cmul args")) != CLG_OK)
            break;
        size_t gws[3] = {(size_t)F, (size_t)CLG_CEIL_DIV(K, 4), (size_t)nbc};
        if ((st = clg_conv_enqueue(dev, kmul, 3, gws, NULL)) != CLG_OK)
            break;
        if ((st = fft_plan_get(dev, fh, fw, nbc * K, 1, &pi)) != CLG_OK || (st = fft_run(dev, &pi, Y, yp)) != CLG_OK)
            break;
        clg_kargs b = {kcrop, 0, CL_SUCCESS};
        clg_ka_mem(&b, yp);
        clg_ka_int(&b, fh);
        clg_ka_int(&b, fw);
        clg_ka_int(&b, K);
        clg_ka_int(&b, P);
        clg_ka_int(&b, Q);
        clg_ka_mem(&b, bias ? bias : yp);
        clg_ka_int(&b, (int)offb);
        clg_ka_int(&b, bias != NULL);
        clg_ka_int(&b, relu);
        clg_ka_mem(&b, y);
        clg_ka_int(&b, (int)(offy + (size_t)n0 * K * P * Q));
        if ((st = CLG_KA_DONE(clg_dev_err(dev), &b, "fft_crop args")) != CLG_OK)
            break;
        size_t gws2[3] = {(size_t)Q, (size_t)P, (size_t)nbc * K};
        st = clg_conv_enqueue(dev, kcrop, 3, gws2, NULL);
    }
    clg_buf_release(dev, xp);
    clg_buf_release(dev, X);
    clg_buf_release(dev, Y);
    clg_buf_release(dev, yp);
    if (tmp_wf)
        clg_buf_release(dev, Wf);
    return st;
}

#else /* !CLG_HAVE_CLFFT */

int clg_conv_fft_available(void) { return 0; }

clg_status clg_conv_fft_fwd(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem x, size_t offx,
                            cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    CLG_UNUSED(s), CLG_UNUSED(cache), CLG_UNUSED(x), CLG_UNUSED(offx), CLG_UNUSED(w), CLG_UNUSED(offw);
    CLG_UNUSED(bias), CLG_UNUSED(offb), CLG_UNUSED(relu), CLG_UNUSED(y), CLG_UNUSED(offy);
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                       "conv: the FFT algorithm is not available (built without clFFT)");
}

#endif
