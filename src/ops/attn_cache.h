/* Generation's key/value cache (cl/decode.cl): clg_attn_cache_append and
 * clg_attn_forward_cached (declared in attention.h, fp32 caches) and, with half = 1,
 * their fp16-storage counterparts, whose caches hold IEEE half values
 * (offsets and pitches in halves; queries, new keys and values and the
 * output stay fp32; core OpenCL 1.2 vload_half / vstore_half_rte, no
 * cl_khr_fp16 needed). */
#ifndef CLG_OPS_ATTN_CACHE_H
#define CLG_OPS_ATTN_CACHE_H

#include "ops/attention.h"

/* half = 0: clg_attn_cache_append / clg_attn_forward_cached; 1: the caches kc, vc hold half values. */
CLG_INTERNAL clg_status clg_attn_cache_append_prec(clg_device *dev, const clg_attn_desc *a, int half, int Tc, int past,
                                                   const clg_attn_seq *k_new, const clg_attn_seq *v_new,
                                                   const clg_attn_seq *kc, const clg_attn_seq *vc);
CLG_INTERNAL clg_status clg_attn_forward_cached_prec(clg_device *dev, const clg_attn_desc *a, int half, int Tc,
                                                     int past, const clg_attn_seq *q, const clg_attn_seq *kc,
                                                     const clg_attn_seq *vc, const clg_attn_seq *o);

#endif
