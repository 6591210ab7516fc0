/*
 * engine_lp.c -- the engine in bfloat16 and float16 (POSENC_BF16, POSENC_F16):
 * design (a) of docs/low_precision.md taken at the engine's boundary.  The
 * float arrays of a problem are widened to float32 (exactly), the float32
 * engine runs on them, and every result is narrowed once, to nearest even,
 * into the caller's 16-bit array: a result is narrow(float32 engine(widen(
 * inputs))) bit for bit, on every ISA.  lse is float32 both ways.  Two
 * exceptions: the term modules' gradients that the engine sums over the batch in
 * a problem of several chunks (lp_chunks: float64 sums over the chunks), and the
 * bfloat16 content logits
 * on avx512 with AVX512-BF16, which go to design (b),
 * posenc_bf16_content_forward (bf16dot.c: vdpbf16ps products, within the
 * same bound but summed in another order).
 *
 * Where the bfloat16 GEMM runs, the per-unit inputs are not widened at all:
 * the float32 engine reads them through their bfloat16 twins (lp_chunks).
 *
 * Memory: every entry point runs in chunks of (b, h) units (lp_chunks):
 * the float32 arena holds the widened parameters and one chunk's per-unit
 * arrays, never a float32 copy of the logits, G or the inputs.  The arena
 * of the last call is kept for the next (lp_arena_alloc): fresh pages would
 * cost a page fault each, more than the conversions.
 */
#include "engine.h"

#include <stdatomic.h>
#include <math.h>
#include <string.h>

#include "bf16dot.h"

void posenc_narrow_bf16(uint16_t *dst, const double *src, size_t count)
{
    posenc_active_convert()->f64_to_bf16(dst, src, count);
}

/* The float32 bytes of one chunk's per-unit arrays.  The logits' (n m per
 * unit, converted at memory speed) mostly stay in the last-level cache from
 * the float32 engine to the narrowing, yet hold all batch rows of a head at
 * the headline shape (B = 8, n = m = 512: 10.5 MiB); measured there, bf16
 * time / float32 time of t5, tupe, diet_abs logits forward: 4 MiB 0.68-0.42,
 * 16 MiB 0.92-0.82, 32 MiB 0.77.  The attention's (O(n d) per unit against
 * O(n m d) work) are larger, so that a call has few chunks: each chunk costs
 * parallel regions, whose barriers a loaded machine makes dear.  The C tests
 * build with small ones so that every way of chunking runs. */
#ifndef POSENC_LP_CHUNK_BYTES
#define POSENC_LP_CHUNK_BYTES ((size_t)16 << 20)
#endif
#ifndef POSENC_LP_ATTENTION_CHUNK_BYTES
#define POSENC_LP_ATTENTION_CHUNK_BYTES ((size_t)32 << 20)
#endif
/* The largest arena kept between calls. */
#define LP_KEEP_BYTES ((size_t)64 << 20)
/* Elements per work item of a conversion: a few L2-sized pieces. */
#define LP_BLOCK ((size_t)1 << 15)

/* ------------------------------------------------------------ conversion */

/* `segments` runs of `len` elements, src and dst `*_stride` elements apart:
 * converted (16-bit <-> float32) or, with `copy`, float32 copied (lse). */
typedef struct {
    const void *src;
    void *dst;
    size_t len, segments, src_stride, dst_stride;
    int copy;
} lp_row;

#define LP_MAX_ROWS 16

/* Arrays to widen (to_f32) or narrow, converted block by block by a team. */
typedef struct {
    const posenc_convert *cv;
    int bf16, to_f32;
    lp_row rows[LP_MAX_ROWS];
    size_t count;
    size_t blocks[LP_MAX_ROWS + 1];   /* prefix sums of each row's blocks */
} lp_job;

/* Block k of row r: LP_BLOCK elements (fewer at a segment's end). */
static void lp_convert_block(const lp_job *job, size_t r, size_t k)
{
    const lp_row *row = &job->rows[r];
    const size_t per_segment = (row->len + LP_BLOCK - 1) / LP_BLOCK;
    const size_t segment = k / per_segment, t0 = k % per_segment * LP_BLOCK;
    const size_t len = posenc_min(LP_BLOCK, row->len - t0);
    const size_t from = segment * row->src_stride + t0, to = segment * row->dst_stride + t0;
    if (row->copy)
        memcpy((float *)row->dst + to, (const float *)row->src + from, len * sizeof(float));
    else if (job->to_f32)
        (job->bf16 ? job->cv->bf16_to_f32 : job->cv->f16_to_f32)(
            (float *)row->dst + to, (const uint16_t *)row->src + from, len);
    else
        (job->bf16 ? job->cv->f32_to_bf16 : job->cv->f32_to_f16)(
            (uint16_t *)row->dst + to, (const float *)row->src + from, len);
}

static void lp_convert_team_fn(void *arg, void *ws)
{
    const lp_job *job = (const lp_job *)arg;
    const ptrdiff_t total = (ptrdiff_t)job->blocks[job->count];
    (void)ws;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (ptrdiff_t t = 0; t < total; ++t) {
        size_t r = 0;
        while (job->blocks[r + 1] <= (size_t)t)
            ++r;
        lp_convert_block(job, r, (size_t)t - job->blocks[r]);
    }
}

static void lp_job_init(lp_job *job, const posenc_problem *p, int to_f32)
{
    job->cv = posenc_active_convert();
    job->bf16 = p->dtype == POSENC_BF16;
    job->to_f32 = to_f32;
    job->count = 0;
    job->blocks[0] = 0;
}

static void lp_job_add_rows(lp_job *job, lp_row row)
{
    if (!row.src || !row.dst || !row.len || !row.segments)
        return;
    job->rows[job->count] = row;
    job->blocks[job->count + 1] =
        job->blocks[job->count] + row.segments * ((row.len + LP_BLOCK - 1) / LP_BLOCK);
    ++job->count;
}

/* One contiguous array of len elements. */
static void lp_job_add(lp_job *job, const void *src, void *dst, size_t len)
{
    lp_job_add_rows(job, (lp_row){src, dst, len, 1, 0, 0, 0});
}

static int lp_job_run(const lp_job *job, int num_threads)
{
    const size_t blocks = job->blocks[job->count];
    if (!blocks)
        return POSENC_OK;
    const size_t threads = num_threads > 0 ? (size_t)num_threads : 1;
    const size_t team = blocks < 4 ? 1 : posenc_team_startable(posenc_min(threads, blocks));
    return posenc_run_team(team, 0, lp_convert_team_fn, (void *)job);
}

/* ------------------------------------------------------- the float32 copy */

/* The float arrays of a problem: q and k, then posenc.h's POSENC_ARRAYS (the rotation's
 * tables, constants), up to A_COUNT; where each is, how many elements. */
#define LP_ENUM_(name, ...) A_##name,
enum { A_Q, A_K, POSENC_ARRAYS(LP_ENUM_) A_COUNT };
#undef LP_ENUM_
#define A_FIRST_CONST (A_K + 1)

static void problem_arrays(const posenc_problem *p, const void *const **at, size_t *len)
{
    at[A_Q] = &p->q, len[A_Q] = p->B * p->H * p->n * p->d;
    at[A_K] = &p->k, len[A_K] = p->B * posenc_kv_heads(p) * p->m * p->d;
#define LP_CONST_(name, count) at[A_##name] = &p->name, len[A_##name] = (count);
    POSENC_ARRAYS(LP_CONST_)
#undef LP_CONST_
}

/* A float32 arena of regions, each 64-byte aligned. */
typedef struct {
    size_t used;      /* floats */
    float *base;
} lp_arena;

static size_t lp_take(lp_arena *a, size_t len)
{
    const size_t at = a->used;
    a->used += posenc_round_up(len, POSENC_ALIGN / sizeof(float));
    return at;
}

/*
 * The float32 problem of p: each present constant array of p (the rotation's tables; q and
 * k are widened a chunk at a time, the term modules' arrays are float64 or float32 from
 * the caller) widened into the arena (one region per buffer: the keys' tables that are the
 * queries' stay one).  With a->base NULL it only takes the regions (the sizing pass).
 */
static void lp_problem(const posenc_problem *p, posenc_problem *p32, lp_arena *a, lp_job *job)
{
    const void *const *at[A_COUNT];
    size_t len[A_COUNT];
    size_t where[A_COUNT];
    problem_arrays(p, at, len);
    *p32 = *p;
    p32->dtype = POSENC_F32;
    p32->bf16_gemm = p->dtype == POSENC_BF16;   /* its GEMMs on vdpbf16ps where the CPU has it */
    const void *const *at32[A_COUNT];
    size_t len32[A_COUNT];
    problem_arrays(p32, at32, len32);
    for (int t = A_FIRST_CONST; t < A_COUNT; ++t) {
        if (!*at[t])
            continue;
        int shared = -1;
        for (int u = A_FIRST_CONST; u < t; ++u)
            if (*at[u] == *at[t] && len[u] == len[t])
                shared = u;
        where[t] = shared >= 0 ? where[shared] : lp_take(a, len[t]);
        if (!a->base)
            continue;
        *(const void **)at32[t] = a->base + where[t];
        if (shared < 0)
            lp_job_add(job, *at[t], a->base + where[t], len[t]);
    }
}

/*
 * The arena kept from the last call (at most LP_KEEP_BYTES): its first
 * LP_HEADER floats hold its capacity in floats, the arena follows.  Taken
 * and given back by atomic exchanges, so concurrent calls each have their
 * own (a second one allocates).
 */
#define LP_HEADER (POSENC_ALIGN / sizeof(float))
static _Atomic(float *) lp_kept;

/* The arena once sized (a->used floats): the kept one if large enough,
 * else a new one; POSENC_ENOMEM if it cannot be had. */
static int lp_arena_alloc(lp_arena *a)
{
    float *block = atomic_exchange(&lp_kept, NULL);
    if (block && *(size_t *)block < a->used) {
        posenc_free(block);
        block = NULL;
    }
    if (!block && (block = (float *)posenc_alloc(LP_HEADER + a->used, sizeof(float))))
        *(size_t *)block = a->used;
    a->base = block ? block + LP_HEADER : NULL;
    return block ? POSENC_OK : POSENC_ENOMEM;
}

/* The arena back: kept for the next call if small enough, else freed. */
static void lp_arena_free(lp_arena *a)
{
    if (!a->base)
        return;
    float *block = a->base - LP_HEADER;
    if (*(size_t *)block * sizeof(float) <= LP_KEEP_BYTES)
        block = atomic_exchange(&lp_kept, block);
    posenc_free(block);
}

/* ----------------------------------------------------------- sub-problems */


/* The sub-problem of batch rows [b0, b0 + nb) and heads [h0, h0 + nh) of a
 * float32 problem: the term modules' arrays from unit (b0, h0), the rotation's tables as
 * they are; q and k (gathered by the caller) are the caller's to set. */
static posenc_problem lp_slice(const posenc_problem *p, size_t b0, size_t nb, size_t h0, size_t nh)
{
    posenc_problem s = *p;
    s.B = nb;
    s.H = nh;
    if (p->H_kv)   /* whole groups of query heads (lp_plan) */
        s.H_kv = nh / posenc_kv_group(p);
    if (p->positions_q)
        s.positions_q = p->positions_q + b0 * p->n;
    if (p->positions_k)
        s.positions_k = p->positions_k + b0 * p->m;
    /* the term modules' arrays (float64, or float32 the `real` ones: csrc/terms.h): from
     * unit (b0, h0) */
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int t = 0; t < POSENC_TERM_ARRAYS_MAX; ++t) {
            posenc_term_array *x = &s.terms[k].array[t];
            const size_t at = b0 * x->batch_stride + h0 * x->head_stride;
            if (x->data && posenc_term_array_real(k, t))
                x->data = (const float *)x->data + at;
            else if (x->data && posenc_term_array_type(k, t) == POSENC_TERM_INDEX)
                x->data = (const int64_t *)x->data + at;
            else if (x->data)
                x->data = (const double *)x->data + at;
        }
    return s;
}

/* ------------------------------------------------------- chunked calls */

/*
 * Every entry point runs in chunks of (b, h) units, batch rows [b0, b0 + nb)
 * x heads [h0, h0 + nh): all batch rows of a few heads where they fit the
 * budget (so the float32 engine's per-head blocks, TUPE's and DIET-ABS's
 * batch-free terms, serve all of them, as in a float32 call), else whole
 * batch rows, else heads of one batch row.  A chunk's per-unit arrays (q, k,
 * v, G, d_out, out, lse, d_lse; the results) are gathered, widened, into float32
 * regions of the arena sized for one chunk, at most about
 * POSENC_LP_CHUNK_BYTES (the logits) or POSENC_LP_ATTENTION_CHUNK_BYTES,
 * and the results scattered back, narrowed: nothing of O(B H n m) or of the
 * inputs' size is allocated.  Per-unit results are the float32 engine's on
 * the chunk (they do not depend on how the units are grouped); the term
 * modules' gradients are float64 per unit, written in place, and those the
 * engine sums over the batch (posenc_term_summed) are float64 sums over the
 * chunks in chunk order (lp_block_grads_add): a one-chunk problem gives the
 * float32 engine's bits, a larger one the same terms in another association
 * (equal to rounding, deterministic for any thread count).
 */
enum { S_Q, S_K, S_V, S_G, S_D_OUT, S_OUT_IN, S_LSE_IN, S_D_LSE_IN, S_RESULT, S_LSE, S_DQ, S_DK,
       S_DV, S_COUNT };
#define S_FIRST_OUTPUT S_RESULT

typedef enum { LP_LOGITS, LP_LOGITS_BACKWARD, LP_ATTENTION, LP_ATTENTION_BACKWARD } lp_kind;

typedef struct {
    const void *src;     /* inputs: (B, H, ...), 16-bit (float32 with copy) */
    void *dst;           /* outputs: the same */
    size_t per_unit;     /* elements per (b, h) */
    int copy;            /* float32 both sides (lse) */
    size_t at;           /* the chunk's float32 region in the arena */
    int direct;          /* an output the float32 engine stores in bfloat16 itself
                            (bf16_out_heads): no region, no narrowing */
    size_t group;        /* query heads per unit: k, v and their gradients have one unit per
                            key head (grouped-query attention), the rest 1 (0 is read as 1) */
} lp_stream;

static size_t lp_group(const lp_stream *st) { return st->group ? st->group : 1; }

/* The stream's unit of query unit u = b H + h: u, or its key head's. */
static size_t lp_unit(const lp_stream *st, size_t u, size_t H)
{
    return u / H * (H / lp_group(st)) + u % H / lp_group(st);
}

/* Whether a stream has a float32 region in the arena: an input, or an
 * output the engine does not store itself. */
static int lp_has_region(const lp_stream *st)
{
    return st->src || (st->dst && !st->direct);
}

/* Whether gradient (k, t) of gs is an earlier kind's buffer (one vector table on both
 * sides: its two gradients one buffer). */
static int lp_grad_shared(const posenc_grads *gs, int k, int t)
{
    for (int e = 0; e < k; ++e)
        for (int x = 0; x < POSENC_TERM_ARRAYS_MAX; ++x)
            if (gs->terms[e][x] == gs->terms[k][t])
                return 1;
    return 0;
}

/* A backward chunk of batch rows from b0 > 0 and hs heads: its gradients of the modules
 * the engine sums over the batch (by blocks, a vector table's slots: posenc_term_summed;
 * the chunk's batch sum, in its first batch row's units: gs's) added into batch row 0's
 * (a head's chunks run in batch order, the first setting them); a buffer once. */
static void lp_block_grads_add(const posenc_problem *p, const posenc_grads *gs, size_t b0,
                               size_t hs)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int t = 0; t < POSENC_TERM_ARRAYS_MAX && posenc_term_summed(k); ++t) {
            const size_t len = p->terms[k].array[t].per_unit;
            const double *part = (const double *)gs->terms[k][t];
            if (!part || lp_grad_shared(gs, k, t))
                continue;
            double *sum = (double *)gs->terms[k][t] - b0 * gs->term_units_per_row * len;
            for (size_t e = 0; e < hs * len; ++e)
                sum[e] += part[e];
        }
}

/* The chunk's shape: nb batch rows x nh heads of at most `budget` floats.
 * With a term module whose gradient goes by blocks (TUPE's and DIET-ABS's dense
 * factor), which the float32 engine's logits' backward forms head by head in
 * parallel, a chunk of all batch rows holds a head per thread where 4 budgets
 * hold them (else threads idle there). */
static void lp_plan(const posenc_problem *p, size_t unit, size_t budget, int num_threads,
                    size_t *nb, size_t *nh)
{
    const size_t group = posenc_kv_group(p);
    *nb = p->B;
    *nh = p->H;
    if (!unit || p->B * p->H * unit <= budget)
        return;
    if (p->B * unit <= budget) {
        *nh = budget / (p->B * unit);
        const size_t per_thread = posenc_min(p->H, num_threads > 0 ? (size_t)num_threads : 1);
        if (posenc_terms_by_blocks(p) && *nh < per_thread && p->B * unit * per_thread <= 4 * budget)
            *nh = per_thread;
    } else if (p->H * unit <= budget) {
        *nb = budget / (p->H * unit);
    } else {
        *nb = 1;
        *nh = posenc_max(1, budget / unit);
    }
    /* whole groups of query heads: a key head's units in one chunk */
    *nh = posenc_min(p->H, posenc_max(group, *nh / group * group));
}

/* Stream st's units of the chunk at unit0 (bs runs of hs units, H units
 * apart in the caller's array) and its region (the runs back to back):
 * gathered from the caller's array, or scattered into it when `outward`. */
static lp_row chunk_rows(const lp_stream *st, void *region, size_t unit0, size_t bs, size_t hs,
                         size_t H, int outward)
{
    const size_t elem = st->copy ? sizeof(float) : sizeof(uint16_t);
    unit0 = lp_unit(st, unit0, H);   /* a key head's units: whole groups of query heads */
    hs /= lp_group(st);
    H /= lp_group(st);
    const size_t run = hs * st->per_unit, stride = H * st->per_unit;
    if (outward)
        return (lp_row){region, (char *)st->dst + unit0 * st->per_unit * elem, run, bs, run,
                        stride, st->copy};
    return (lp_row){(const char *)st->src + unit0 * st->per_unit * elem, region, run, bs, stride,
                    run, st->copy};
}

static int lp_chunks(lp_kind kind, const posenc_problem *p, lp_stream *st, const posenc_grads *g,
                     const posenc_attention *att, int num_threads)
{
    posenc_problem p32;
    lp_arena a = {0, NULL};
    double *sink_part = NULL;                   /* a chunk's dL/dsinks */
    lp_job widen, narrow;
    lp_job_init(&widen, p, 1);
    lp_job_init(&narrow, p, 0);
    size_t unit = 0, shared_with[S_COUNT];
    /* Where the bfloat16 GEMM runs, the float32 engine reads the inputs only
     * through their bfloat16 twins (bf16_shadows, marked unwritten): the
     * GEMMs, rowsum(dO out), and where the positional gradients read G, q or
     * k, or the rotation q and k, row blocks they widen themselves in cache
     * (backward_g_rows, x_all_finite, unit_rows).  Their float32 regions stay unwritten; the C tests fill
     * them with NaN (POSENC_LP_POISON), so that a read shows. */
    int unwidened[S_COUNT];
    /* k, v and their gradients: a unit per key head (grouped-query attention) */
    st[S_K].group = st[S_V].group = st[S_DK].group = st[S_DV].group = posenc_kv_group(p);
    const int twins = p->dtype == POSENC_BF16 && posenc_bf16_gemm_kernels();
    for (int t = 0; t < S_COUNT; ++t) {
        shared_with[t] = (size_t)t;
        unwidened[t] = twins && st[t].src && !st[t].copy;
        for (int u = 0; u < t && t < S_FIRST_OUTPUT; ++u)   /* k is q: the first's region */
            if (st[t].src && st[u].src == st[t].src && st[u].per_unit == st[t].per_unit &&
                lp_group(&st[u]) == lp_group(&st[t])) {
                shared_with[t] = (size_t)u;
                break;
            }
        if (lp_has_region(&st[t]) && shared_with[t] == (size_t)t)
            unit += (st[t].per_unit + lp_group(&st[t]) - 1) / lp_group(&st[t]);
    }
    size_t nb, nh;
    lp_plan(p, unit,
            (kind == LP_LOGITS || kind == LP_LOGITS_BACKWARD ? POSENC_LP_CHUNK_BYTES
                                                             : POSENC_LP_ATTENTION_CHUNK_BYTES) /
                sizeof(float),
            num_threads, &nb, &nh);
    /* the arena: sized, allocated, then placed (the same calls twice) */
    int rc = POSENC_OK;
    for (int pass = 0; pass < 2 && rc == POSENC_OK; ++pass) {
        a.used = 0;
        lp_problem(p, &p32, &a, &widen);
        for (int t = 0; t < S_COUNT; ++t)
            st[t].at = shared_with[t] != (size_t)t ? st[shared_with[t]].at
                       : lp_has_region(&st[t])    ? lp_take(&a, nb * nh / lp_group(&st[t]) *
                                                                    st[t].per_unit)
                                                  : 0;
        if (pass == 0)
            rc = lp_arena_alloc(&a);
    }
    if (rc == POSENC_OK && att && att->grad_sinks &&
        !(sink_part = (double *)posenc_alloc(p->H, sizeof(double))))
        rc = POSENC_ENOMEM;
    if (rc == POSENC_OK)
        rc = lp_job_run(&widen, num_threads);   /* the parameters */
#define REGION(t) (lp_has_region(&st[t]) ? (void *)(a.base + st[t].at) : NULL)
    for (size_t h0 = 0; rc == POSENC_OK && h0 < p->H; h0 += nh)
        for (size_t b0 = 0; rc == POSENC_OK && b0 < p->B; b0 += nb) {
            const size_t bs = posenc_min(nb, p->B - b0), hs = posenc_min(nh, p->H - h0);
            const size_t unit0 = b0 * p->H + h0;
            widen.count = 0;
            for (int t = 0; t < S_FIRST_OUTPUT; ++t) {
                if (!st[t].src || shared_with[t] != (size_t)t)
                    continue;
                if (!unwidened[t])
                    lp_job_add_rows(&widen, chunk_rows(&st[t], REGION(t), unit0, bs, hs, p->H, 0));
#ifdef POSENC_LP_POISON
                else
                    for (size_t e = 0; e < bs * hs / lp_group(&st[t]) * st[t].per_unit; ++e)
                        ((float *)REGION(t))[e] = NAN;
#endif
            }
            rc = lp_job_run(&widen, num_threads);
            posenc_problem s = lp_slice(&p32, b0, bs, h0, hs);
            s.q = REGION(S_Q);
            s.k = REGION(S_K);
            /* the bfloat16 inputs as the float32 engine's GEMMs read them (bf16_gemm) */
            posenc_bf16_shadow shadows[S_FIRST_OUTPUT];
            s.bf16_shadows = shadows;
            s.bf16_shadow_count = 0;
            for (int t = 0; t < S_FIRST_OUTPUT && p->dtype == POSENC_BF16; ++t)
                if (st[t].src && !st[t].copy && shared_with[t] == (size_t)t)
                    shadows[s.bf16_shadow_count++] = (posenc_bf16_shadow){
                        (const float *)REGION(t),
                        (const uint16_t *)st[t].src + lp_unit(&st[t], unit0, p->H) * st[t].per_unit,
                        bs * hs / lp_group(&st[t]), st[t].per_unit, hs / lp_group(&st[t]),
                        p->H / lp_group(&st[t]), unwidened[t]};
            posenc_grads gs;
            memset(&gs, 0, sizeof gs);
            gs.q = g && g->q ? REGION(S_DQ) : NULL;
            gs.k = g && g->k ? REGION(S_DK) : NULL;
            /* the term modules' gradients: float64 per unit, written in place */
            gs.term_units_per_row = g && g->term_units_per_row ? g->term_units_per_row : p->H;
            for (int k = 0; g && k < POSENC_TERM_COUNT; ++k)
                for (int t = 0; t < POSENC_TERM_ARRAYS_MAX; ++t)
                    if (g->terms[k][t])
                        gs.terms[k][t] = (double *)g->terms[k][t] +
                                         (b0 * gs.term_units_per_row + h0) *
                                             p->terms[k].array[t].per_unit;
            posenc_attention a32;
            if (att) {
                a32 = *att;
                a32.v = REGION(S_V);
                a32.key_padding_mask = att->key_padding_mask ? att->key_padding_mask + b0 * p->m
                                                             : NULL;
                a32.document_q = att->document_q ? att->document_q + b0 * p->n : NULL;
                a32.document_k = att->document_k ? att->document_k + b0 * p->m : NULL;
                a32.sinks = att->sinks ? att->sinks + h0 : NULL;
                a32.grad_sinks = att->grad_sinks ? sink_part : NULL;   /* added below */
                a32.d_lse = REGION(S_D_LSE_IN);   /* NULL without */
                a32.batch_offset = att->batch_offset + b0;   /* the dropout's (b, h) */
                a32.head_offset = att->head_offset + h0;
            }
            if (rc == POSENC_OK) {
                switch (kind) {
                case LP_LOGITS:
                    if (st[S_RESULT].direct) {   /* the caller's bfloat16 rows, H units a batch row */
                        s.bf16_out_heads = p->H;
                        rc = posenc_engine_f32.forward(
                            &s, (uint16_t *)st[S_RESULT].dst + unit0 * st[S_RESULT].per_unit,
                            num_threads);
                    } else {
                        rc = posenc_engine_f32.forward(&s, REGION(S_RESULT), num_threads);
                    }
                    break;
                case LP_LOGITS_BACKWARD:
                    rc = posenc_engine_f32.backward(&s, REGION(S_G), &gs, num_threads);
                    if (rc == POSENC_OK && b0 > 0)
                        lp_block_grads_add(p, &gs, b0, hs);
                    break;
                case LP_ATTENTION:
                    rc = posenc_engine_f32.attention_forward(&s, &a32, REGION(S_RESULT),
                                                             REGION(S_LSE), num_threads);
                    break;
                case LP_ATTENTION_BACKWARD:
                    rc = posenc_engine_f32.attention_backward(&s, &a32, REGION(S_D_OUT),
                                                              REGION(S_OUT_IN), REGION(S_LSE_IN),
                                                              &gs, REGION(S_DV), num_threads);
                    if (rc == POSENC_OK && b0 > 0)
                        lp_block_grads_add(p, &gs, b0, hs);
                    break;
                }
            }
            narrow.count = 0;
            for (int t = S_FIRST_OUTPUT; t < S_COUNT; ++t)
                if (st[t].dst && lp_has_region(&st[t]))
                    lp_job_add_rows(&narrow, chunk_rows(&st[t], REGION(t), unit0, bs, hs, p->H, 1));
            if (rc == POSENC_OK)
                rc = lp_job_run(&narrow, num_threads);
            for (size_t e = 0; rc == POSENC_OK && kind == LP_ATTENTION_BACKWARD &&
                               att->grad_sinks && e < hs; ++e)   /* the sinks', chunks in order */
                att->grad_sinks[h0 + e] = b0 == 0 ? sink_part[e] : att->grad_sinks[h0 + e] + sink_part[e];
        }
#undef REGION
    posenc_free(sink_part);
    lp_arena_free(&a);
    return rc;
}

/* ------------------------------------------------------ strided inputs */

/* A strided input (B, heads, rows, cols) of 16-bit elements and its contiguous copy. */
typedef struct {
    const void *src;
    posenc_strides strides;
    size_t heads, rows, cols;
    uint16_t *dst;
} lp_strided;

typedef struct {
    lp_strided in[4];
    size_t count, B, units;   /* units: B heads summed over the inputs */
} lp_gather_job;

static void lp_gather_team_fn(void *arg, void *ws)
{
    const lp_gather_job *job = (const lp_gather_job *)arg;
    (void)ws;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (ptrdiff_t t = 0; t < (ptrdiff_t)job->units; ++t) {
        size_t e = 0, u = (size_t)t;
        while (u >= job->B * job->in[e].heads)
            u -= job->B * job->in[e].heads, ++e;
        const lp_strided *x = &job->in[e];
        posenc_unit_rows(x->dst + u * x->rows * x->cols, x->src, &x->strides, x->heads, x->rows,
                         x->cols, sizeof(uint16_t), u / x->heads, u % x->heads, 0, x->rows);
    }
}

/* A problem (and attention, d_out) whose strided inputs are gathered into contiguous
 * copies (mem: one allocation, or NULL where none is strided), which the chunks read
 * (lp_chunks slices units of contiguous arrays): the float32 engine reads a strided
 * input a unit at a time in place, this engine copies it once per call. */
typedef struct {
    posenc_problem p;
    posenc_attention a;
    const void *d_out;
    void *mem;
} lp_inputs;

static int lp_inputs_gather(lp_inputs *x, const posenc_problem *p, const posenc_attention *att,
                            const void *d_out, int num_threads)
{
    x->p = *p;
    x->a = att ? *att : (posenc_attention){0};
    x->d_out = d_out;
    x->mem = NULL;
    lp_gather_job job = {{{0}}, 0, p->B, 0};
    const size_t kv = posenc_kv_heads(p), dv = att ? att->dv : 0;
    const struct { const void **at; posenc_strides *s; size_t heads, rows, cols; } in[4] = {
        {&x->p.q, &x->p.q_strides, p->H, p->n, p->d},
        {&x->p.k, &x->p.k_strides, kv, p->m, p->d},
        {att ? &x->a.v : NULL, att ? &x->a.v_strides : NULL, kv, p->m, dv},
        {d_out ? &x->d_out : NULL, att ? &x->a.d_out_strides : NULL, p->H, p->n, dv}};
    size_t total = 0;
    for (int e = 0; e < 4; ++e)
        if (in[e].at && in[e].s->r) {
            job.in[job.count++] = (lp_strided){*in[e].at, *in[e].s, in[e].heads, in[e].rows,
                                               in[e].cols, NULL};
            total += p->B * in[e].heads * in[e].rows * in[e].cols;
        }
    if (!job.count)
        return POSENC_OK;
    uint16_t *mem = (uint16_t *)posenc_alloc(total, sizeof(uint16_t));
    if (!mem)
        return POSENC_ENOMEM;
    x->mem = mem;
    for (size_t e = 0; e < job.count; ++e) {
        job.in[e].dst = mem;
        mem += p->B * job.in[e].heads * job.in[e].rows * job.in[e].cols;
        job.units += p->B * job.in[e].heads;
    }
    for (int e = 0, t = 0; e < 4; ++e)
        if (in[e].at && in[e].s->r) {
            *in[e].at = job.in[t++].dst;
            *in[e].s = (posenc_strides){0, 0, 0};
        }
    const size_t threads = num_threads > 0 ? (size_t)num_threads : 1;
    return posenc_run_team(posenc_team_startable(posenc_min(threads, job.units)), 0,
                           lp_gather_team_fn, &job);
}

/* ----------------------------------------------------------- entry points */

static int lp_forward_gathered(const posenc_problem *p, void *out, int num_threads)
{
    /* bfloat16 content logits on vdpbf16ps where the CPU has it (design (b)) */
    const int fast = posenc_bf16_content_forward(p, out, num_threads);
    if (fast >= 0)
        return fast;
    lp_stream st[S_COUNT] = {{0}};
    st[S_Q] = (lp_stream){p->q, NULL, p->n * p->d, 0, 0};
    st[S_K] = (lp_stream){p->k, NULL, p->m * p->d, 0, 0};
    /* bfloat16 logits stored by the float32 engine's GEMM itself, where it can
     * (forward returns -1 on the first chunk, before any store, where not) */
    st[S_RESULT] = (lp_stream){NULL, out, p->n * p->m, 0, 0, 1};
    if (p->dtype == POSENC_BF16 && posenc_bf16_gemm_kernels()) {
        const int direct = lp_chunks(LP_LOGITS, p, st, NULL, NULL, num_threads);
        if (direct >= 0)
            return direct;
    }
    st[S_RESULT].direct = 0;
    return lp_chunks(LP_LOGITS, p, st, NULL, NULL, num_threads);
}

static int lp_backward_gathered(const posenc_problem *p, const void *grad,
                                const posenc_grads *g, int num_threads)
{
    lp_stream st[S_COUNT] = {{0}};
    st[S_Q] = (lp_stream){p->q, NULL, p->n * p->d, 0, 0};
    st[S_K] = (lp_stream){p->k, NULL, p->m * p->d, 0, 0};
    st[S_G] = (lp_stream){grad, NULL, p->n * p->m, 0, 0};
    st[S_DQ] = (lp_stream){NULL, g->q, p->n * p->d, 0, 0};
    st[S_DK] = (lp_stream){NULL, g->k, p->m * p->d, 0, 0};
    return lp_chunks(LP_LOGITS_BACKWARD, p, st, g, NULL, num_threads);
}

static int lp_attention_forward_gathered(const posenc_problem *p, const posenc_attention *att,
                                         void *out, void *lse, int num_threads)
{
    lp_stream st[S_COUNT] = {{0}};
    st[S_Q] = (lp_stream){p->q, NULL, p->n * p->d, 0, 0};
    st[S_K] = (lp_stream){p->k, NULL, p->m * p->d, 0, 0};
    st[S_V] = (lp_stream){att->v, NULL, p->m * att->dv, 0, 0};
    st[S_RESULT] = (lp_stream){NULL, out, p->n * att->dv, 0, 0};
    st[S_LSE] = (lp_stream){NULL, lse, p->n, 1, 0};
    return lp_chunks(LP_ATTENTION, p, st, NULL, att, num_threads);
}

static int lp_attention_backward_gathered(const posenc_problem *p, const posenc_attention *att,
                                          const void *d_out, const void *out, const void *lse,
                                          const posenc_grads *g, void *grad_v, int num_threads)
{
    lp_stream st[S_COUNT] = {{0}};
    st[S_Q] = (lp_stream){p->q, NULL, p->n * p->d, 0, 0};
    st[S_K] = (lp_stream){p->k, NULL, p->m * p->d, 0, 0};
    st[S_V] = (lp_stream){att->v, NULL, p->m * att->dv, 0, 0};
    st[S_D_OUT] = (lp_stream){d_out, NULL, p->n * att->dv, 0, 0};
    st[S_OUT_IN] = (lp_stream){out, NULL, p->n * att->dv, 0, 0};
    st[S_DQ] = (lp_stream){NULL, g->q, p->n * p->d, 0, 0};
    st[S_DK] = (lp_stream){NULL, g->k, p->m * p->d, 0, 0};
    st[S_DV] = (lp_stream){NULL, grad_v, p->m * att->dv, 0, 0};
    st[S_LSE_IN] = (lp_stream){lse, NULL, p->n, 1, 0};
    st[S_D_LSE_IN] = (lp_stream){att->d_lse, NULL, p->n, 1, 0};   /* float32, as lse */
    return lp_chunks(LP_ATTENTION_BACKWARD, p, st, g, att, num_threads);
}

static int lp_forward(const posenc_problem *p, void *out, int num_threads)
{
    lp_inputs x;
    int rc = lp_inputs_gather(&x, p, NULL, NULL, num_threads);
    if (rc == POSENC_OK)
        rc = lp_forward_gathered(&x.p, out, num_threads);
    posenc_free(x.mem);
    return rc;
}

static int lp_backward(const posenc_problem *p, const void *grad, const posenc_grads *g,
                       int num_threads)
{
    lp_inputs x;
    int rc = lp_inputs_gather(&x, p, NULL, NULL, num_threads);
    if (rc == POSENC_OK)
        rc = lp_backward_gathered(&x.p, grad, g, num_threads);
    posenc_free(x.mem);
    return rc;
}

static int lp_attention_forward(const posenc_problem *p, const posenc_attention *att, void *out,
                                void *lse, int num_threads)
{
    lp_inputs x;
    int rc = lp_inputs_gather(&x, p, att, NULL, num_threads);
    if (rc == POSENC_OK)
        rc = lp_attention_forward_gathered(&x.p, &x.a, out, lse, num_threads);
    posenc_free(x.mem);
    return rc;
}

static int lp_attention_backward(const posenc_problem *p, const posenc_attention *att,
                                 const void *d_out, const void *out, const void *lse,
                                 const posenc_grads *g, void *grad_v, int num_threads)
{
    lp_inputs x;
    int rc = lp_inputs_gather(&x, p, att, d_out, num_threads);
    if (rc == POSENC_OK)
        rc = lp_attention_backward_gathered(&x.p, &x.a, x.d_out, out, lse, g, grad_v,
                                            num_threads);
    posenc_free(x.mem);
    return rc;
}

const posenc_engine posenc_engine_lp = {lp_forward, lp_backward, lp_attention_forward,
                                        lp_attention_backward, NULL, NULL};
