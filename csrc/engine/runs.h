/*
 * runs.h -- bucket maps as runs (runs.c): a positional table's map over offsets
 * compressed into runs on which the bucket is constant or moves by one.
 */
#ifndef POSENC_RUNS_H
#define POSENC_RUNS_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* POSENC_RUNS_H */
