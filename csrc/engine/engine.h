/*
 * engine.h -- internals shared by the engine's files (not the public API):
 * bucket runs and spans (runs.c, spans.c), segment runs, the allocator
 * (alloc.c), threading, and the per-dtype entry points (engine_<dtype>.c).
 */
#ifndef POSENC_ENGINE_H
#define POSENC_ENGINE_H

#include "../posenc.h"

/* The kernels the engine runs a problem of `dtype` on: the active ISA's, or
 * for a float32 problem with bf16_gemm (its arrays hold bfloat16 values)
 * those with the bfloat16 GEMM where the CPU has it (posenc_bf16_gemm_kernels). */
static inline const posenc_kernels *posenc_engine_kernels(const posenc_problem *p,
                                                          posenc_dtype dtype)
{
    const posenc_kernels *bf16 = dtype == POSENC_F32 && p->bf16_gemm ? posenc_bf16_gemm_kernels()
                                                                     : NULL;
    return bf16 ? bf16 : posenc_active_kernels(dtype);
}

/*
 * A bucket map over offsets o = j - i, compressed into runs on which the
 * bucket is constant (step 0) or moves by one per offset (step +1 / -1).
 * Clipped maps are 3 runs, T5 about num_buckets; any map works, an
 * irregular one just gives more runs.
 */
typedef struct {
    ptrdiff_t o_begin, o_end;   /* offsets [o_begin, o_end) */
    ptrdiff_t b_begin;          /* bucket at o_begin */
    ptrdiff_t step;             /* -1, 0 or +1 */
} posenc_run;

typedef struct {
    posenc_run *runs;
    size_t count;
    ptrdiff_t b_min, b_max;     /* buckets used: [b_min, b_max] */
} posenc_runs;

/* Grouped-query attention (SPEC §7): the query heads per key head, and the key
 * (and value) unit b H_kv + h / group of query unit u = b H + h. */
static inline size_t posenc_kv_group(const posenc_problem *p)
{
    return p->H_kv ? p->H / p->H_kv : 1;
}

static inline size_t posenc_kv_heads(const posenc_problem *p)
{
    return p->H / posenc_kv_group(p);
}

static inline size_t posenc_kv_unit(const posenc_problem *p, size_t u)
{
    const size_t group = posenc_kv_group(p);
    return (u / p->H) * posenc_kv_heads(p) + (u % p->H) / group;
}

/* How many buckets [b_min, b_max] spans. */
static inline size_t posenc_runs_buckets(const posenc_runs *r)
{
    return (size_t)(r->b_max - r->b_min + 1);
}

/* Widens [*lo, *hi] to hold the buckets map[t], t in [t0, t1). */
static inline void posenc_map_extent(const int64_t *map, size_t t0, size_t t1, ptrdiff_t *lo,
                                     ptrdiff_t *hi)
{
    for (size_t t = t0; t < t1; ++t) {
        const ptrdiff_t bucket = (ptrdiff_t)map[t];
        if (bucket < *lo) *lo = bucket;
        if (bucket > *hi) *hi = bucket;
    }
}

/* map[t] is the bucket of offset o_first + t, t < len (len >= 1). */
int posenc_runs_build(posenc_runs *r, const int64_t *map, ptrdiff_t o_first, size_t len);
void posenc_runs_free(posenc_runs *r);

/* Runs shorter than this on average are served by indexed gathers through
 * the map rather than one contiguous copy per run (DeBERTa's log buckets). */
#define POSENC_SHORT_RUNS 12

static inline int posenc_runs_short(const posenc_runs *r, size_t offsets)
{
    return r->count * POSENC_SHORT_RUNS > offsets;
}

/* First run whose offsets reach past o (runs are sorted by offset). */
size_t posenc_runs_seek(const posenc_runs *r, ptrdiff_t o);

/*
 * The keys j in [*js, *je) of row i that fall in `run` and in [j_lo, j_hi),
 * with *bs the bucket of key *js.  Returns 0 when the run starts at or past
 * j_hi: iterating runs from posenc_runs_seek(r, j_lo - i), stop there.
 */
static inline int posenc_run_span(const posenc_run *run, ptrdiff_t i, ptrdiff_t j_lo,
                                  ptrdiff_t j_hi, ptrdiff_t *js, ptrdiff_t *je, ptrdiff_t *bs)
{
    ptrdiff_t first = run->o_begin + i, end = run->o_end + i;
    if (first < j_lo) first = j_lo;
    if (end > j_hi) end = j_hi;
    if (first >= end)
        return 0;
    *js = first;
    *je = end;
    *bs = run->b_begin + run->step * (first - i - run->o_begin);
    return 1;
}

/*
 * Run-length encoding of the key-side segment ids of every batch row:
 * the segments of batch row b are runs[start[b] .. start[b + 1]).
 */
typedef struct {
    size_t j_begin, j_end;
    size_t segment;
} posenc_segment_run;

typedef struct {
    posenc_segment_run *runs;
    size_t *start;              /* B + 1 entries */
} posenc_segment_runs;

int posenc_segment_runs_build(posenc_segment_runs *s, const int64_t *segment_k, size_t B, size_t m);
void posenc_segment_runs_free(posenc_segment_runs *s);

/*
 * Where a bucket matrix is zero.  The backward scatters G along diagonals
 * into X (rows x R, columns = buckets b_min..b_max of `runs`): row x of X is
 * a query row i (query side: offsets o = j - i, jb <= j < m) or a key j (key
 * side: o = j - i, 0 <= i < n).  Its GEMMs X.V (a reduction over buckets)
 * and X^T.Y (over rows) skip the blocks outside these spans: for each tile
 * of `tile` output rows, [begin, end) of the reduction index beyond which
 * the tile's entries of X are zero, so the skipped terms are products with
 * exact zeros.  Spans are supersets, computed once per call; offsets past
 * o_max (m - 1, or a causal attention's query_offset) are taken as zero.
 */
typedef struct {
    size_t *by_row;      /* 2 per tile of rows: the buckets they reach */
    size_t *by_bucket;   /* 2 per tile of buckets: the rows that reach them */
} posenc_spans;

int posenc_spans_build(posenc_spans *s, const posenc_runs *runs, const int64_t *map, size_t n,
                       size_t m, int key_side, size_t jb, size_t tile, ptrdiff_t o_max);
void posenc_spans_free(posenc_spans *s);

/* 64-byte aligned allocation; NULL on failure or overflow. */
void *posenc_alloc(size_t count, size_t size);
void posenc_free(void *ptr);

/* count * size with overflow detection: SIZE_MAX on overflow. */
size_t posenc_mul_size(size_t count, size_t size);

#define POSENC_ALIGN 64

/* Problems with fewer multiply-adds (B H n m (d + 1)) than this run on one
 * thread: waking an OpenMP team costs tens of microseconds, more on busy cores. */
#define POSENC_PARALLEL_MIN_WORK ((size_t)1 << 18)

/* At most `team`: the largest team not above it whose threads can be
 * created (threads.c), so that a parallel region never fails to start. */
size_t posenc_team_startable(size_t team);

/* The threads of a call of `work` multiply-adds: at most one per work item,
 * and one for a small call whatever the thread count asked for; never more
 * than can start. */
static inline size_t posenc_team_for(size_t threads, size_t items, size_t work)
{
    if (work < POSENC_PARALLEL_MIN_WORK)
        return 1;   /* a team's start and barrier cost more than the work */
    return posenc_team_startable(threads < items ? threads : items);
}

/* posenc_team_for a problem's B H n m (d + 1) multiply-adds. */
static inline size_t posenc_team(size_t threads, size_t items, const posenc_problem *p)
{
    return posenc_team_for(threads, items, posenc_mul_size(p->B * p->H * p->n, p->m * (p->d + 1)));
}

/* The rows of a work item: units of n rows are split into chunks of whole
 * tiles of mr rows when there are fewer units than threads (n when not). */
static inline size_t posenc_rows_per_item(size_t units, size_t n, size_t mr, size_t threads)
{
    const size_t tiles = (n + mr - 1) / mr;
    size_t chunks = units >= threads ? 1 : (threads + units - 1) / units;
    if (chunks > tiles)
        chunks = tiles;
    return (tiles + chunks - 1) / chunks * mr;
}

#ifdef _OPENMP
#include <omp.h>
static inline int posenc_thread_id(void) { return omp_get_thread_num(); }
#else
static inline int posenc_thread_id(void) { return 0; }
#endif

/* fn(arg, ws) on each thread of a team of `team` threads, ws that thread's
 * own ws_bytes (64-byte aligned) of one arena; fn's orphaned `omp for`
 * loops share the work.  A team of one runs on the calling thread without
 * an OpenMP region (whose start and barrier cost more than a small problem).
 * POSENC_OK, or POSENC_ENOMEM when the arena cannot be had. */
int posenc_run_team(size_t team, size_t ws_bytes, void (*fn)(void *arg, void *ws), void *arg);

static inline size_t posenc_round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* Whether logits `out` of `rows` rows of m items of `itemsize` bytes go
 * straight to memory: logits much larger than the caches are written with
 * non-temporal stores (POSENC_UKR_STREAM: no read-for-ownership of their
 * lines), which need 64-byte aligned rows. */
static inline int posenc_stream_logits(const void *out, size_t rows, size_t m, size_t itemsize)
{
    return (uintptr_t)out % POSENC_ALIGN == 0 && (m * itemsize) % POSENC_ALIGN == 0 &&
           posenc_mul_size(rows, m * itemsize) >= POSENC_STREAM_BYTES;
}
static inline size_t posenc_min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t posenc_max(size_t a, size_t b) { return a > b ? a : b; }

/* Asks the cache for the lines of [at, at + bytes) before they are first
 * read: a tile's operands that come from memory (the rows of q a GEMM reads
 * in place, the keys a causal tile packs next) are requested one tile
 * ahead, where the hardware's prefetcher, which follows long runs, would
 * miss them.  A hint: it never faults and changes no result. */
static inline void posenc_prefetch(const void *at, size_t bytes)
{
#if defined(__GNUC__)
    const uintptr_t end = (uintptr_t)at + bytes;
    for (uintptr_t line = (uintptr_t)at & ~(uintptr_t)63; line < end; line += 64)
        __builtin_prefetch((const void *)line, 0, 3);
#else
    (void)at;
    (void)bytes;
#endif
}

/* The engine of one dtype (engine_f32.c, engine_f64.c; engine_lp.c for
 * bfloat16 and float16): its entry points,
 * with the signatures of posenc_forward and company in posenc.h. */
typedef struct {
    int (*forward)(const posenc_problem *p, void *out, int num_threads);
    int (*backward)(const posenc_problem *p, const void *grad, const posenc_grads *g,
                    int num_threads);
    int (*attention_forward)(const posenc_problem *p, const posenc_attention *a, void *out,
                             void *lse, int num_threads);
    int (*attention_backward)(const posenc_problem *p, const posenc_attention *a,
                              const void *d_out, const void *out, const void *lse,
                              const posenc_grads *g, void *grad_v, int num_threads);
    int (*matmul)(const posenc_matmul_problem *mm, int num_threads);   /* NULL: not served */
} posenc_engine;

extern const posenc_engine posenc_engine_f32, posenc_engine_f64, posenc_engine_lp;

#endif /* POSENC_ENGINE_H */
