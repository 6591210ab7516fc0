/*
 * engine_lp.c -- the engine in bfloat16 and float16 (POSENC_BF16, POSENC_F16):
 * design (a) of docs/low_precision.md taken at the engine's boundary.  The
 * float arrays of a problem are widened to float32 (exactly), the float32
 * engine runs on them, and every result is narrowed once, to nearest even,
 * into the caller's 16-bit array: a result is narrow(float32 engine(widen(
 * inputs))) bit for bit, on every ISA.  lse is float32 both ways.
 *
 * Memory: a float32 copy of the inputs, O(inputs) (the logits backward's
 * G is an input: twice its 16-bit bytes).  The logits forward runs in
 * chunks of batch rows (or of heads of one batch row) of at most
 * POSENC_LP_CHUNK_BYTES of float32 logits, widening q and k a chunk at a
 * time: no float32 copy of the whole (B, H, n, m) or of q and k, and a
 * chunk's logits are still in the caches when they are narrowed.  The
 * attention's results are O(n).
 */
#include "engine.h"

/* Float32 logits held at once by the forward (one chunk); the C tests
 * build with a small one so that every way of chunking runs. */
#ifndef POSENC_LP_CHUNK_BYTES
#define POSENC_LP_CHUNK_BYTES ((size_t)4 << 20)
#endif
/* Elements per work item of a conversion: a few L2-sized pieces. */
#define LP_BLOCK ((size_t)1 << 15)

/* ------------------------------------------------------------ conversion */

typedef struct {
    const void *src;
    void *dst;
    size_t len;
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

static void lp_convert_block(const lp_job *job, size_t r, size_t t0, size_t len)
{
    const lp_row *row = &job->rows[r];
    if (job->to_f32) {
        float *dst = (float *)row->dst + t0;
        const uint16_t *src = (const uint16_t *)row->src + t0;
        (job->bf16 ? job->cv->bf16_to_f32 : job->cv->f16_to_f32)(dst, src, len);
    } else {
        uint16_t *dst = (uint16_t *)row->dst + t0;
        const float *src = (const float *)row->src + t0;
        (job->bf16 ? job->cv->f32_to_bf16 : job->cv->f32_to_f16)(dst, src, len);
    }
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
        const size_t t0 = ((size_t)t - job->blocks[r]) * LP_BLOCK;
        lp_convert_block(job, r, t0, posenc_min(LP_BLOCK, job->rows[r].len - t0));
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

static void lp_job_add(lp_job *job, const void *src, void *dst, size_t len)
{
    if (!src || !dst || !len)
        return;
    job->rows[job->count] = (lp_row){src, dst, len};
    job->blocks[job->count + 1] = job->blocks[job->count] + (len + LP_BLOCK - 1) / LP_BLOCK;
    ++job->count;
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

/* The float arrays of a problem: where each is, how many elements. */
enum { A_Q, A_K, A_POS_Q, A_POS_K, A_TABLE, A_QUERY_TABLE, A_KEY_TABLE, A_SEGMENT_TABLE,
       A_THETA, A_COUNT };

static void problem_arrays(const posenc_problem *p, const void *const **at, size_t *len)
{
    at[A_Q] = &p->q, len[A_Q] = p->B * p->H * p->n * p->d;
    at[A_K] = &p->k, len[A_K] = p->B * p->H * p->m * p->d;
    at[A_POS_Q] = &p->pos_q, len[A_POS_Q] = p->pos_q_heads * p->n * p->d_p;
    at[A_POS_K] = &p->pos_k, len[A_POS_K] = p->pos_k_heads * p->m * p->d_p;
    at[A_TABLE] = &p->table, len[A_TABLE] = p->table_heads * p->table_rows;
    at[A_QUERY_TABLE] = &p->query_table,
    len[A_QUERY_TABLE] = p->query_table_heads * p->query_table_rows * p->d;
    at[A_KEY_TABLE] = &p->key_table, len[A_KEY_TABLE] = p->key_table_heads * p->key_table_rows * p->d;
    at[A_SEGMENT_TABLE] = &p->segment_table,
    len[A_SEGMENT_TABLE] = p->segment_table_heads * p->n_segments * p->n_segments;
    at[A_THETA] = &p->theta, len[A_THETA] = p->theta_heads * 2;
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
 * The float32 problem of p: each present array of p widened into the arena
 * (one region per buffer: M4's one table on both sides stays one buffer).
 * With a->base NULL it only takes the regions (the sizing pass).  With
 * qk_units > 0, q and k get regions of that many (b, h) units and are not
 * queued: the caller widens them a chunk at a time.
 */
static void lp_problem(const posenc_problem *p, posenc_problem *p32, lp_arena *a, lp_job *job,
                       size_t qk_units)
{
    const void *const *at[A_COUNT];
    size_t len[A_COUNT];
    size_t where[A_COUNT];
    problem_arrays(p, at, len);
    if (qk_units) {
        len[A_Q] = qk_units * p->n * p->d;
        len[A_K] = qk_units * p->m * p->d;
    }
    *p32 = *p;
    p32->dtype = POSENC_F32;
    const void *const *at32[A_COUNT];
    size_t len32[A_COUNT];
    problem_arrays(p32, at32, len32);
    for (int t = 0; t < A_COUNT; ++t) {
        if (!*at[t])
            continue;
        int shared = -1;
        for (int u = 0; u < t; ++u)
            if (*at[u] == *at[t] && len[u] == len[t])
                shared = u;
        where[t] = shared >= 0 ? where[shared] : lp_take(a, len[t]);
        if (!a->base)
            continue;
        *(const void **)at32[t] = a->base + where[t];
        if (shared < 0 && !(qk_units && (t == A_Q || t == A_K)))
            lp_job_add(job, *at[t], a->base + where[t], len[t]);
    }
}

/* The float32 gradient slots of g (same sharing rule: one buffer, one region). */
static void lp_grads(const posenc_problem *p, const posenc_grads *g, posenc_grads *g32,
                     lp_arena *a, lp_job *narrow)
{
    const void *const *at[A_COUNT];
    size_t len[A_COUNT], where[A_COUNT];
    problem_arrays(p, at, len);
    void *const out[A_COUNT] = {g->q, g->k, g->pos_q, g->pos_k, g->table, g->query_table,
                                g->key_table, g->segment_table, g->theta};
    void **out32[A_COUNT] = {&g32->q, &g32->k, &g32->pos_q, &g32->pos_k, &g32->table,
                             &g32->query_table, &g32->key_table, &g32->segment_table,
                             &g32->theta};
    for (int t = 0; t < A_COUNT; ++t) {
        *out32[t] = NULL;
        if (!out[t])
            continue;
        int shared = -1;
        for (int u = 0; u < t; ++u)
            if (out[u] == out[t])
                shared = u;
        where[t] = shared >= 0 ? where[shared] : lp_take(a, len[t]);
        if (!a->base)
            continue;
        *out32[t] = a->base + where[t];
        if (shared < 0)
            lp_job_add(narrow, a->base + where[t], out[t], len[t]);
    }
}

/* Allocates the arena once sized (a->used floats); POSENC_ENOMEM if not. */
static int lp_arena_alloc(lp_arena *a)
{
    a->base = (float *)posenc_alloc(a->used ? a->used : 1, sizeof(float));
    return a->base ? POSENC_OK : POSENC_ENOMEM;
}

/* ----------------------------------------------------------- entry points */

/* The sub-problem of batch rows [b0, b0 + nb) and heads [h0, h0 + nh) of a
 * float32 problem (nb == 1 when nh < H): the per-head arrays of H heads
 * start at h0, shared ones stay; q and k are the caller's to set. */
static posenc_problem lp_slice(const posenc_problem *p, size_t b0, size_t nb, size_t h0, size_t nh)
{
    posenc_problem s = *p;
    s.B = nb;
    s.H = nh;
    if (p->segment_q) {
        s.segment_q = p->segment_q + b0 * p->n;
        s.segment_k = p->segment_k + b0 * p->m;
    }
#define LP_HEADS(field, heads, per_head)                                                 \
    if (p->field && p->heads == p->H) {                                                  \
        s.field = (const float *)p->field + h0 * (per_head);                              \
        s.heads = nh;                                                                    \
    }
    LP_HEADS(pos_q, pos_q_heads, p->n * p->d_p)
    LP_HEADS(pos_k, pos_k_heads, p->m * p->d_p)
    LP_HEADS(table, table_heads, p->table_rows)
    LP_HEADS(query_table, query_table_heads, p->query_table_rows * p->d)
    LP_HEADS(key_table, key_table_heads, p->key_table_rows * p->d)
    LP_HEADS(segment_table, segment_table_heads, p->n_segments * p->n_segments)
    LP_HEADS(theta, theta_heads, 2)
#undef LP_HEADS
    return s;
}

/*
 * Each entry point lays out its float32 arena twice with the same calls:
 * pass 0 sizes it (a.base NULL: nothing is written or queued), then it is
 * allocated, and pass 1 places the arrays and queues their conversions.
 */

static int lp_forward(const posenc_problem *p, void *out, int num_threads)
{
    posenc_problem p32;
    lp_arena a = {0, NULL};
    lp_job widen, narrow;
    lp_job_init(&widen, p, 1);
    lp_job_init(&narrow, p, 0);
    const size_t row = p->n * p->m;                   /* logits of one (b, h) */
    const size_t per_batch = p->H * row, budget = POSENC_LP_CHUNK_BYTES / sizeof(float);
    size_t nb = 1, nh = p->H, chunk = 0;
    if (row && per_batch <= budget)
        nb = posenc_max(1, posenc_min(p->B, budget / per_batch));
    else if (row)
        nh = posenc_max(1, posenc_min(p->H, budget / row));
    int rc = POSENC_OK;
    for (int pass = 0; pass < 2 && rc == POSENC_OK; ++pass) {
        a.used = 0;
        lp_problem(p, &p32, &a, &widen, nb * nh);
        chunk = lp_take(&a, nb * nh * row);
        if (pass == 0)
            rc = lp_arena_alloc(&a);
    }
    if (rc == POSENC_OK)
        rc = lp_job_run(&widen, num_threads);
    /* chunk by chunk: its q and k widened into their regions, its float32
     * logits (small enough to stay in the caches) narrowed into out */
    float *const q32 = (float *)p32.q, *const k32 = (float *)p32.k;
    for (size_t b0 = 0; rc == POSENC_OK && b0 < p->B; b0 += nb)
        for (size_t h0 = 0; rc == POSENC_OK && h0 < p->H; h0 += nh) {
            const size_t bs = posenc_min(nb, p->B - b0), hs = posenc_min(nh, p->H - h0);
            const size_t unit0 = b0 * p->H + h0, units = bs * hs;
            widen.count = 0;
            lp_job_add(&widen, (const uint16_t *)p->q + unit0 * p->n * p->d, q32,
                       units * p->n * p->d);
            if (k32 != q32)   /* k is q: one region (lp_problem) */
                lp_job_add(&widen, (const uint16_t *)p->k + unit0 * p->m * p->d, k32,
                           units * p->m * p->d);
            rc = lp_job_run(&widen, num_threads);
            posenc_problem s = lp_slice(&p32, b0, bs, h0, hs);
            s.q = q32;
            s.k = k32;
            if (rc == POSENC_OK)
                rc = posenc_engine_f32.forward(&s, a.base + chunk, num_threads);
            narrow.count = 0;
            lp_job_add(&narrow, a.base + chunk, (uint16_t *)out + unit0 * row, units * row);
            if (rc == POSENC_OK)
                rc = lp_job_run(&narrow, num_threads);
        }
    posenc_free(a.base);
    return rc;
}

static int lp_backward(const posenc_problem *p, const void *grad, const posenc_grads *g,
                   int num_threads)
{
    posenc_problem p32;
    posenc_grads g32;
    lp_arena a = {0, NULL};
    lp_job widen, narrow;
    lp_job_init(&widen, p, 1);
    lp_job_init(&narrow, p, 0);
    const size_t logits = p->B * p->H * p->n * p->m;
    size_t at_grad = 0;
    int rc = POSENC_OK;
    for (int pass = 0; pass < 2 && rc == POSENC_OK; ++pass) {
        a.used = 0;
        lp_problem(p, &p32, &a, &widen, 0);
        at_grad = lp_take(&a, logits);
        lp_grads(p, g, &g32, &a, &narrow);
        if (pass == 0)
            rc = lp_arena_alloc(&a);
    }
    if (rc == POSENC_OK) {
        lp_job_add(&widen, grad, a.base + at_grad, logits);
        rc = lp_job_run(&widen, num_threads);
    }
    if (rc == POSENC_OK)
        rc = posenc_engine_f32.backward(&p32, a.base + at_grad, &g32, num_threads);
    if (rc == POSENC_OK)
        rc = lp_job_run(&narrow, num_threads);
    posenc_free(a.base);
    return rc;
}

static int lp_attention_forward(const posenc_problem *p, const posenc_attention *att, void *out,
                            void *lse, int num_threads)
{
    posenc_problem p32;
    posenc_attention a32 = *att;
    lp_arena a = {0, NULL};
    lp_job widen, narrow;
    lp_job_init(&widen, p, 1);
    lp_job_init(&narrow, p, 0);
    const size_t values = p->B * p->H * p->m * att->dv, outs = p->B * p->H * p->n * att->dv;
    size_t at_v = 0, at_out = 0;
    int rc = POSENC_OK;
    for (int pass = 0; pass < 2 && rc == POSENC_OK; ++pass) {
        a.used = 0;
        lp_problem(p, &p32, &a, &widen, 0);
        at_v = lp_take(&a, values);
        at_out = lp_take(&a, outs);
        if (pass == 0)
            rc = lp_arena_alloc(&a);
    }
    if (rc == POSENC_OK) {
        lp_job_add(&widen, att->v, a.base + at_v, values);
        lp_job_add(&narrow, a.base + at_out, out, outs);
        a32.v = a.base + at_v;
        rc = lp_job_run(&widen, num_threads);
    }
    if (rc == POSENC_OK)
        rc = posenc_engine_f32.attention_forward(&p32, &a32, a.base + at_out, lse, num_threads);
    if (rc == POSENC_OK)
        rc = lp_job_run(&narrow, num_threads);
    posenc_free(a.base);
    return rc;
}

static int lp_attention_backward(const posenc_problem *p, const posenc_attention *att,
                             const void *d_out, const void *out, const void *lse,
                             const posenc_grads *g, void *grad_v, int num_threads)
{
    posenc_problem p32;
    posenc_grads g32;
    posenc_attention a32 = *att;
    lp_arena a = {0, NULL};
    lp_job widen, narrow;
    lp_job_init(&widen, p, 1);
    lp_job_init(&narrow, p, 0);
    const size_t values = p->B * p->H * p->m * att->dv, outs = p->B * p->H * p->n * att->dv;
    size_t at_v = 0, at_d_out = 0, at_out = 0, at_grad_v = 0;
    int rc = POSENC_OK;
    for (int pass = 0; pass < 2 && rc == POSENC_OK; ++pass) {
        a.used = 0;
        lp_problem(p, &p32, &a, &widen, 0);
        at_v = lp_take(&a, values);
        at_d_out = lp_take(&a, outs);
        at_out = lp_take(&a, outs);
        at_grad_v = grad_v ? lp_take(&a, values) : 0;
        lp_grads(p, g, &g32, &a, &narrow);
        if (pass == 0)
            rc = lp_arena_alloc(&a);
    }
    if (rc == POSENC_OK) {
        lp_job_add(&widen, att->v, a.base + at_v, values);
        lp_job_add(&widen, d_out, a.base + at_d_out, outs);
        lp_job_add(&widen, out, a.base + at_out, outs);
        if (grad_v)
            lp_job_add(&narrow, a.base + at_grad_v, grad_v, values);
        a32.v = a.base + at_v;
        rc = lp_job_run(&widen, num_threads);
    }
    if (rc == POSENC_OK)
        rc = posenc_engine_f32.attention_backward(&p32, &a32, a.base + at_d_out, a.base + at_out,
                                              lse, &g32, grad_v ? a.base + at_grad_v : NULL,
                                              num_threads);
    if (rc == POSENC_OK)
        rc = lp_job_run(&narrow, num_threads);
    posenc_free(a.base);
    return rc;
}

const posenc_engine posenc_engine_lp = {lp_forward, lp_backward, lp_attention_forward,
                                    lp_attention_backward};
