/*
 * spans.h -- where a bucket matrix is zero (spans.c), so that the backward's GEMMs
 * through it skip those blocks.
 */
#ifndef POSENC_SPANS_H
#define POSENC_SPANS_H

#include "runs.h"

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

#endif /* POSENC_SPANS_H */
