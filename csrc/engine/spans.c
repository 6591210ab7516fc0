/*
 * spans.c -- where a bucket matrix of the backward is zero (posenc_spans, see
 * spans.h), so its GEMMs can skip those blocks.
 */
#include "spans.h"
#include "../posenc.h"
#include "alloc.h"

#include <string.h>

/*
 * Row x of the bucket matrix reaches the offsets [a + sigma x, b + sigma x]:
 * query side sigma = -1, a = jb, b = m - 1; key side sigma = +1,
 * a = -(n - 1), b = 0.  Offsets run over [-(n - 1), m - 1], map[o + n - 1],
 * and stop at o_max (a causal attention's G is zero past j - i = query_offset).
 */
int posenc_spans_build(posenc_spans *s, const posenc_runs *runs, const int64_t *map, size_t n,
                       size_t m, int key_side, size_t jb, size_t tile, ptrdiff_t o_max)
{
    memset(s, 0, sizeof *s);
    const ptrdiff_t rows = (ptrdiff_t)(key_side ? m : n);
    const ptrdiff_t o_first = -(ptrdiff_t)(n - 1);
    const ptrdiff_t o_last = o_max < (ptrdiff_t)m - 1 ? o_max : (ptrdiff_t)m - 1;
    const ptrdiff_t a = key_side ? o_first : (ptrdiff_t)jb, b = key_side ? 0 : (ptrdiff_t)m - 1;
    const size_t R = (size_t)(runs->b_max - runs->b_min + 1);
    const size_t row_tiles = ((size_t)rows + tile - 1) / tile, bucket_tiles = (R + tile - 1) / tile;
    ptrdiff_t *o_lo = (ptrdiff_t *)posenc_alloc(R, sizeof(ptrdiff_t));
    ptrdiff_t *o_hi = (ptrdiff_t *)posenc_alloc(R, sizeof(ptrdiff_t));
    s->by_row = (size_t *)posenc_alloc(2 * row_tiles, sizeof(size_t));
    s->by_bucket = (size_t *)posenc_alloc(2 * bucket_tiles, sizeof(size_t));
    if (!o_lo || !o_hi || !s->by_row || !s->by_bucket) {
        posenc_free(o_lo);
        posenc_free(o_hi);
        posenc_spans_free(s);
        return POSENC_ENOMEM;
    }
    /* each bucket's offsets, [o_lo, o_hi] (empty: o_lo > o_hi) */
    for (size_t r = 0; r < R; ++r) {
        o_lo[r] = o_last + 1;
        o_hi[r] = o_first - 1;
    }
    for (ptrdiff_t o = o_first; o <= o_last; ++o) {
        const size_t r = (size_t)(map[o - o_first] - runs->b_min);
        if (o < o_lo[r]) o_lo[r] = o;
        if (o > o_hi[r]) o_hi[r] = o;
    }
    for (size_t t = 0; t < row_tiles; ++t) {
        const ptrdiff_t x0 = (ptrdiff_t)(t * tile), x1 = posenc_min((t + 1) * tile, (size_t)rows) - 1;
        ptrdiff_t lo = key_side ? a + x0 : a - x1, hi = key_side ? b + x1 : b - x0;
        if (lo < o_first) lo = o_first;
        if (hi > o_last) hi = o_last;
        ptrdiff_t b_lo = runs->b_max + 1, b_hi = runs->b_min - 1;
        if (lo <= hi)
            posenc_map_extent(map, (size_t)(lo - o_first), (size_t)(hi - o_first + 1), &b_lo, &b_hi);
        const int empty = b_lo > b_hi;
        s->by_row[2 * t] = empty ? 0 : (size_t)(b_lo - runs->b_min);
        s->by_row[2 * t + 1] = empty ? 0 : (size_t)(b_hi - runs->b_min + 1);
    }
    for (size_t t = 0; t < bucket_tiles; ++t) {
        ptrdiff_t lo = o_last + 1, hi = o_first - 1;
        for (size_t r = t * tile; r < posenc_min((t + 1) * tile, R); ++r) {
            if (o_lo[r] < lo) lo = o_lo[r];
            if (o_hi[r] > hi) hi = o_hi[r];
        }
        /* rows x with a + sigma x <= hi and b + sigma x >= lo */
        ptrdiff_t x_lo = key_side ? lo - b : a - hi, x_hi = key_side ? hi - a : b - lo;
        if (x_lo < 0) x_lo = 0;
        if (x_hi > rows - 1) x_hi = rows - 1;
        const int empty = lo > hi || x_lo > x_hi;
        s->by_bucket[2 * t] = empty ? 0 : (size_t)x_lo;
        s->by_bucket[2 * t + 1] = empty ? 0 : (size_t)x_hi + 1;
    }
    posenc_free(o_lo);
    posenc_free(o_hi);
    return POSENC_OK;
}

void posenc_spans_free(posenc_spans *s)
{
    posenc_free(s->by_row);
    posenc_free(s->by_bucket);
    memset(s, 0, sizeof *s);
}
