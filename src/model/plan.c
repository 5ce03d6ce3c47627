/* Liveness-planned activation memory of a replica: every forward output and
 * output gradient (and in fp16 mode the half tensors and the layers' fp32
 * working buffers) gets a lifetime in steps of the training pass, and
 * tensors whose lifetimes do not overlap share memory: packed into slot
 * buffers, or placed at offsets of one arena of sub-buffers. */
#include <stdlib.h>
#include <string.h>

#include "model/network_impl.h"

typedef struct plan_item {
    int start, end; /* inclusive step interval */
    size_t bytes;
    clg_tensor *t;  /* the tensor placed in the slot, or */
    cl_mem *target; /* a bare buffer (fp16 working buffers) */
    int slot;
} plan_item;

static int cmp_item(const void *a, const void *b)
{
    const plan_item *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return 0;
}

/* Greedy packing of items into slots (buffers): items sorted by start, each
 * placed into a free slot (one whose last item ended before it starts):
 * the smallest that fits, else the largest free one (grown). slot_bytes and
 * slot_end have room for n slots (zeroed). Returns the number of slots. */
static int pack(plan_item *it, int n, size_t *slot_bytes, int *slot_end)
{
    qsort(it, (size_t)n, sizeof *it, cmp_item);
    int nslots = 0;
    for (int a = 0; a < n; a++) {
        int best = -1;
        for (int s = 0; s < nslots; s++) {
            if (slot_end[s] >= it[a].start)
                continue;
            if (best < 0) {
                best = s;
                continue;
            }
            int fits = slot_bytes[s] >= it[a].bytes, bfits = slot_bytes[best] >= it[a].bytes;
            if ((fits && (!bfits || slot_bytes[s] < slot_bytes[best])) ||
                (!fits && !bfits && slot_bytes[s] > slot_bytes[best]))
                best = s;
        }
        if (best < 0)
            best = nslots++;
        if (slot_bytes[best] < it[a].bytes)
            slot_bytes[best] = it[a].bytes;
        slot_end[best] = it[a].end;
        it[a].slot = best;
    }
    return nslots;
}

/* Offset planning in one arena: items in order of decreasing size, each at
 * the lowest aligned offset whose byte range overlaps no placed item that
 * lives at the same time. offs[] receives the offsets; returns the arena
 * size. */
static int cmp_size_desc(const void *a, const void *b)
{
    const plan_item *x = *(const plan_item *const *)a, *y = *(const plan_item *const *)b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static clg_status place(clg_err *err, plan_item *it, int n, size_t align, size_t *offs, size_t *arena)
{
    plan_item **ord = malloc((size_t)CLG_MAX(n, 1) * sizeof *ord);
    size_t *cand = malloc((size_t)(n + 1) * sizeof *cand);
    int *conf = malloc((size_t)CLG_MAX(n, 1) * sizeof *conf);
    char *placed = calloc((size_t)CLG_MAX(n, 1), 1);
    if (!ord || !cand || !conf || !placed) {
        free(ord);
        free(cand);
        free(conf);
        free(placed);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    }
    for (int i = 0; i < n; i++)
        ord[i] = &it[i];
    qsort(ord, (size_t)n, sizeof *ord, cmp_size_desc);
    size_t top = 0;
    for (int q = 0; q < n; q++) {
        int a = (int)(ord[q] - it);
        int nc = 0, ncand = 0;
        cand[ncand++] = 0;
        for (int j = 0; j < n; j++)
            if (placed[j] && !(it[j].end < it[a].start || it[a].end < it[j].start)) {
                conf[nc++] = j;
                cand[ncand++] = align_up(offs[j] + it[j].bytes, align);
            }
        size_t best = (size_t)-1;
        for (int c = 0; c < ncand; c++) {
            if (cand[c] >= best)
                continue;
            int ok = 1;
            for (int k = 0; k < nc && ok; k++) {
                int j = conf[k];
                if (cand[c] < offs[j] + it[j].bytes && offs[j] < cand[c] + it[a].bytes)
                    ok = 0;
            }
            if (ok)
                best = cand[c];
        }
        offs[a] = best;
        placed[a] = 1;
        if (best + it[a].bytes > top)
            top = best + it[a].bytes;
    }
    free(ord);
    free(cand);
    free(conf);
    free(placed);
    *arena = top;
    return CLG_OK;
}

/* One planning run: the items and the per-layer facts they come from. */
typedef struct plan {
    clg_replica *r;
    clg_err *err;
    plan_item *it;
    int n;
    int *last_consumer; /* per layer: the last layer reading its output, -1: none */
    int *slot_end;      /* pack()'s scratch, room for every item */
    size_t *slot_bytes;
    uint64_t naive, halfb; /* unshared fp32 bytes; bytes of the half tensors */
} plan;

static void plan_free(plan *p)
{
    free(p->it);
    free(p->last_consumer);
    free(p->slot_end);
    free(p->slot_bytes);
}

static clg_status plan_init(plan *p, clg_replica *r)
{
    int L = r->nlayers;
    size_t cap = (size_t)L * (5 + 3 * CLG_MAX_INPUTS);
    memset(p, 0, sizeof *p);
    p->r = r;
    p->err = clg_dev_err(r->dev);
    p->it = calloc(cap, sizeof *p->it);
    p->last_consumer = malloc((size_t)L * sizeof(int));
    p->slot_end = calloc(cap, sizeof(int));
    p->slot_bytes = calloc(cap, sizeof(size_t));
    if (!p->it || !p->last_consumer || !p->slot_end || !p->slot_bytes) {
        plan_free(p);
        return clg_err_set(p->err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    }
    for (int i = 0; i < L; i++)
        p->last_consumer[i] = -1;
    for (int j = 0; j < L; j++)
        for (int k = 0; k < r->layers[j].nin; k++) {
            int s = r->layers[j].inputs[k];
            if (s >= 0 && j > p->last_consumer[s])
                p->last_consumer[s] = j;
        }
    return CLG_OK;
}

/* fp32: steps: forward of layer i = i; backward of layer i = 2L-1-i.
 * Forward activations live until their own layer's backward (every layer's
 * backward may read its output and its inputs); output gradients live from
 * the first consumer's backward to their own layer's backward.
 *
 * fp16 (half != 0): every step has three sub-steps, expand (half -> fp32
 * working buffers), compute (the layer), store (fp32 -> half), so a half
 * tensor whose last use is an expansion frees its memory for the compute.
 * Half tensors: act[i] (2 bytes per element; the last layer's output stays
 * fp32) and dact[i]; fp32 working buffers of each layer (work[i]) live for
 * the sub-steps that use them. Everything is packed together. */
#define FS(i, p) (3 * (i) + (p))
#define BS(i, p) (3 * L + 3 * (L - 1 - (i)) + (p))

/* The fp16 items of layer i: its half output and output gradient, its
 * working buffers, and the chains that spare conversions. */
static void plan_layer_half(plan *p, int i, int has_grad)
{
    clg_replica *r = p->r;
    int L = r->nlayers, last = i == L - 1, n = p->n;
    plan_item *it = p->it;
    clg_layer *l = &r->layers[i];
    clg_tensor *a = &r->act[i], *g = &r->dact[i];
    size_t numel = clg_tensor_numel(a), f32 = numel * sizeof(float);
    struct clg_layer_work *w = &r->work[i];
    int uses = 0, use_k = -1, next_reads = 0;
    for (int j = i + 1; j < L; j++)
        for (int k = 0; k < r->layers[j].nin; k++)
            if (r->layers[j].inputs[k] == i) {
                uses++;
                use_k = k;
                next_reads |= j == i + 1;
            }
    /* chains only inside the replica's layers: a pipeline stage's cut is crossed in half (act / dact); an
       earlier stage's layer whose output this stage reads has only its half output and gradient here */
    int inside = i >= r->first && i + 1 <= r->last, own = i >= r->first && i <= r->last;
    w->fchain = !last && next_reads && inside;
    w->bchain = has_grad && uses == 1 && p->last_consumer[i] == i + 1 && inside;
    w->bchain_k = w->bchain ? use_k : -1;
    if (last)
        it[n++] = (plan_item){FS(i, 1), BS(i, 1), f32, a, NULL, -1};
    else {
        it[n++] = (plan_item){FS(i, 2), BS(i, 0), numel * 2, a, NULL, -1};
        if (own) {
            it[n++] = (plan_item){FS(i, 1), w->fchain ? FS(i + 1, 1) : FS(i, 2), f32, NULL, &w->f_out, -1};
            it[n++] = (plan_item){BS(i, 0), BS(i, 1), f32, NULL, &w->b_out, -1};
        }
        p->halfb += numel * 2;
    }
    if (has_grad && !w->bchain) {
        it[n++] = (plan_item){BS(p->last_consumer[i], 2), BS(i, 0), numel * 2, g, NULL, -1};
        if (own)
            it[n++] = (plan_item){BS(i, 0), BS(i, 1), f32, NULL, &w->b_dout, -1};
        p->halfb += numel * 2;
    }
    for (int k = 0; k < l->nin && own; k++) {
        int src = l->inputs[k];
        if (src < 0)
            continue;
        size_t b = clg_tensor_numel(&r->act[src]) * sizeof(float);
        if (!(src == i - 1 && r->work[src].fchain))
            it[n++] = (plan_item){FS(i, 0), FS(i, 1), b, NULL, &w->f_in[k], -1};
        it[n++] = (plan_item){BS(i, 0), BS(i, 1), b, NULL, &w->b_in[k], -1};
        it[n++] = (plan_item){BS(i, 1), r->work[src].bchain ? BS(src, 1) : BS(i, 2), b, NULL, &w->b_din[k], -1};
    }
    p->n = n;
}

/* Whether a replica of layers [first, last] keeps layer i's output: its
 * own, or an earlier one it reads. */
static int stage_needs(const clg_replica *r, int i)
{
    if (i >= r->first && i <= r->last)
        return 1;
    if (i > r->last)
        return 0;
    for (int j = r->first; j <= r->last; j++)
        for (int k = 0; k < r->layers[j].nin; k++)
            if (r->layers[j].inputs[k] == i)
                return 1;
    return 0;
}

/* Shapes act[] (and with alloc dact[]) and lists every item to place. */
static void plan_items(plan *p, int half, int alloc)
{
    clg_replica *r = p->r;
    int L = r->nlayers;
    for (int i = 0; i < L; i++) {
        clg_layer *l = &r->layers[i];
        clg_tensor *a = &r->act[i];
        if (!stage_needs(r, i)) { /* a pipeline stage's replica: another stage's layer */
            a->mem = NULL;
            r->dact[i].mem = NULL;
            continue;
        }
        a->n = r->batch;
        a->c = l->out_shape[1];
        a->h = l->out_shape[2];
        a->w = l->out_shape[3];
        size_t f32 = clg_tensor_numel(a) * sizeof(float);
        int has_grad = p->last_consumer[i] >= 0 && !l->is_loss;
        clg_tensor *g = &r->dact[i];
        if (alloc) {
            *g = *a;
            g->mem = NULL;
        }
        if (l->fused_into) /* its output aliases the fused batch norm's (fuse.c) */
            continue;
        p->naive += f32 * (has_grad ? 2 : 1);
        if (half) {
            plan_layer_half(p, i, has_grad);
            continue;
        }
        p->it[p->n++] = (plan_item){i, 2 * L - 1 - i, f32, a, NULL, -1};
        if (has_grad)
            p->it[p->n++] = (plan_item){2 * L - 1 - p->last_consumer[i], 2 * L - 1 - i, f32, g, NULL, -1};
    }
}
#undef FS
#undef BS

/* Points item a's tensor or bare buffer at mem (offset 0). */
static void plan_assign(plan_item *a, cl_mem mem)
{
    if (a->t) {
        a->t->mem = mem;
        a->t->off = 0;
    } else {
        *a->target = mem;
    }
}

/* Allocates the one-arena plan: the arena (slots[0]) and a sub-buffer per item. */
static clg_status plan_alloc_arena(plan *p, const size_t *offs, size_t arena)
{
    clg_replica *r = p->r;
    clg_err *err = p->err;
    clg_status st = CLG_OK;
    r->naive_bytes = p->naive;
    r->half_bytes = p->halfb;
    r->slots = calloc(1, sizeof(cl_mem));
    r->slot_bytes = calloc(1, sizeof(size_t));
    r->subs = calloc((size_t)CLG_MAX(p->n, 1), sizeof(cl_mem));
    if (!r->slots || !r->slot_bytes || !r->subs)
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    if (st == CLG_OK) {
        r->nslots = 1;
        r->slot_bytes[0] = arena;
        st = clg_buf_alloc(r->dev, arena, &r->slots[0]);
    }
    for (int a = 0; a < p->n && st == CLG_OK; a++) {
        cl_buffer_region reg = {offs[a], p->it[a].bytes};
        cl_int e = CL_SUCCESS;
        cl_mem sub = clCreateSubBuffer(r->slots[0], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
        if (e != CL_SUCCESS) {
            st = clg_cl_fail(err, e, "clCreateSubBuffer (activation arena)", __FILE__, __LINE__);
            break;
        }
        r->subs[r->nsubs++] = sub;
        plan_assign(&p->it[a], sub);
    }
    return st;
}

/* One arena, a sub-buffer per tensor; sub-buffer origins must be aligned
 * to the device's base alignment. *fits = 0 when alloc is asked for and the
 * arena is larger than one allocation may be (nothing done: the caller
 * plans separate buffers instead). */
static clg_status plan_offsets(plan *p, int alloc, int *fits, uint64_t *total)
{
    clg_replica *r = p->r;
    cl_uint align_bits = 0;
    clGetDeviceInfo(r->dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    size_t align = CLG_MAX((size_t)256, (size_t)align_bits / 8), arena = 0;
    size_t *offs = calloc((size_t)CLG_MAX(p->n, 1), sizeof *offs);
    clg_status st = offs ? place(p->err, p->it, p->n, align, offs, &arena)
                         : clg_err_set(p->err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    *fits = 1;
    if (st == CLG_OK && alloc && r->dev->info.max_alloc_bytes && arena > r->dev->info.max_alloc_bytes)
        *fits = 0;
    else if (st == CLG_OK) {
        *total = arena;
        if (alloc)
            st = plan_alloc_arena(p, offs, arena);
    }
    free(offs);
    return st;
}

/* Packs the items into slot buffers (with alloc: allocated and assigned). */
static clg_status plan_slots(plan *p, int alloc, uint64_t *total)
{
    clg_replica *r = p->r;
    clg_status st = CLG_OK;
    int nslots = pack(p->it, p->n, p->slot_bytes, p->slot_end);
    uint64_t sum = 0;
    for (int s = 0; s < nslots; s++)
        sum += p->slot_bytes[s];
    *total = sum;
    if (!alloc)
        return CLG_OK;
    r->naive_bytes = p->naive;
    r->half_bytes = p->halfb;
    r->slot_bytes = p->slot_bytes;
    p->slot_bytes = NULL;
    r->slots = calloc((size_t)CLG_MAX(nslots, 1), sizeof(cl_mem));
    if (!r->slots)
        st = clg_err_set(p->err, CLG_ERR_HOST_OOM, "out of memory planning activations");
    else
        r->nslots = nslots;
    for (int s = 0; s < r->nslots && st == CLG_OK; s++)
        st = clg_buf_alloc(r->dev, r->slot_bytes[s], &r->slots[s]);
    if (st == CLG_OK)
        for (int a = 0; a < p->n; a++)
            plan_assign(&p->it[a], r->slots[p->it[a].slot]);
    return st;
}

clg_status clg_replica_plan_memory(clg_replica *r, int half, int alloc, int offsets, uint64_t *total)
{
    plan p;
    CLG_TRY(plan_init(&p, r));
    plan_items(&p, half, alloc);
    int fits = 0;
    clg_status st = offsets ? plan_offsets(&p, alloc, &fits, total) : CLG_OK;
    if (st == CLG_OK && !fits) /* fp32 slots, or an arena too large for one allocation */
        st = plan_slots(&p, alloc, total);
    plan_free(&p);
    return st;
}
