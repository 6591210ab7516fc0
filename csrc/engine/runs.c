/*
 * runs.c -- bucket maps as runs over offsets, segment ids as runs over keys,
 * and aligned workspace allocation.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t posenc_mul_size(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return SIZE_MAX;
    return count * size;
}

void *posenc_alloc(size_t count, size_t size)
{
    size_t bytes = posenc_mul_size(count, size);
    if (bytes == SIZE_MAX || bytes > SIZE_MAX - POSENC_ALIGN)
        return NULL;
    bytes = posenc_round_up(bytes ? bytes : 1, POSENC_ALIGN);
    void *ptr = NULL;
    if (posix_memalign(&ptr, POSENC_ALIGN, bytes) != 0)
        return NULL;
    return ptr;
}

void posenc_free(void *ptr) { free(ptr); }

int posenc_runs_build(posenc_runs *r, const int64_t *map, ptrdiff_t o_first, size_t len)
{
    memset(r, 0, sizeof *r);
    if (len == 0)
        return POSENC_OK;
    /* Pass 1 counts the runs, pass 2 fills them: the same greedy scan. */
    for (int pass = 0; pass < 2; ++pass) {
        size_t count = 0;
        size_t t = 0;
        while (t < len) {
            ptrdiff_t step = 0;
            size_t end = t + 1;
            if (end < len) {
                int64_t diff = map[end] - map[t];
                if (diff >= -1 && diff <= 1) {
                    step = (ptrdiff_t)diff;
                    while (end < len && map[end] - map[end - 1] == step)
                        ++end;
                }
            }
            if (pass == 1) {
                posenc_run *run = &r->runs[count];
                run->o_begin = o_first + (ptrdiff_t)t;
                run->o_end = o_first + (ptrdiff_t)end;
                run->b_begin = (ptrdiff_t)map[t];
                run->step = step;
            }
            ++count;
            t = end;
        }
        if (pass == 0) {
            r->runs = (posenc_run *)posenc_alloc(count, sizeof(posenc_run));
            if (!r->runs)
                return POSENC_ENOMEM;
            r->count = count;
        }
    }
    int64_t lo = map[0], hi = map[0];
    for (size_t t = 1; t < len; ++t) {
        if (map[t] < lo) lo = map[t];
        if (map[t] > hi) hi = map[t];
    }
    r->b_min = (ptrdiff_t)lo;
    r->b_max = (ptrdiff_t)hi;
    return POSENC_OK;
}

void posenc_runs_free(posenc_runs *r)
{
    posenc_free(r->runs);
    memset(r, 0, sizeof *r);
}

size_t posenc_runs_seek(const posenc_runs *r, ptrdiff_t o)
{
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->runs[mid].o_end <= o)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int posenc_seg_runs_build(posenc_seg_runs *s, const int64_t *seg_k, size_t B, size_t m)
{
    memset(s, 0, sizeof *s);
    size_t total = 0;
    for (size_t b = 0; b < B; ++b)
        for (size_t j = 0; j < m; ++j)
            if (j == 0 || seg_k[b * m + j] != seg_k[b * m + j - 1])
                ++total;
    s->runs = (posenc_seg_run *)posenc_alloc(total, sizeof(posenc_seg_run));
    s->start = (size_t *)posenc_alloc(B + 1, sizeof(size_t));
    if (!s->runs || !s->start) {
        posenc_seg_runs_free(s);
        return POSENC_ENOMEM;
    }
    size_t count = 0;
    for (size_t b = 0; b < B; ++b) {
        s->start[b] = count;
        for (size_t j = 0; j < m; ++j) {
            if (j == 0 || seg_k[b * m + j] != seg_k[b * m + j - 1]) {
                s->runs[count].j_begin = j;
                s->runs[count].segment = (size_t)seg_k[b * m + j];
                ++count;
            }
            s->runs[count - 1].j_end = j + 1;
        }
    }
    s->start[B] = count;
    return POSENC_OK;
}

void posenc_seg_runs_free(posenc_seg_runs *s)
{
    posenc_free(s->runs);
    posenc_free(s->start);
    memset(s, 0, sizeof *s);
}

/*
 * Row x of the bucket matrix reaches the offsets [a + sigma x, b + sigma x]:
 * query side sigma = -1, a = jb, b = m - 1; key side sigma = +1,
 * a = -(n - 1), b = 0.  Offsets run over [-(n - 1), m - 1], map[o + n - 1].
 */
int posenc_spans_build(posenc_spans *s, const posenc_runs *runs, const int64_t *map, size_t n,
                       size_t m, int key_side, size_t jb, size_t tile)
{
    memset(s, 0, sizeof *s);
    const ptrdiff_t rows = (ptrdiff_t)(key_side ? m : n);
    const ptrdiff_t o_first = -(ptrdiff_t)(n - 1), o_last = (ptrdiff_t)m - 1;
    const ptrdiff_t a = key_side ? o_first : (ptrdiff_t)jb, b = key_side ? 0 : o_last;
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
        for (ptrdiff_t o = lo; o <= hi; ++o) {
            const ptrdiff_t bucket = (ptrdiff_t)map[o - o_first];
            if (bucket < b_lo) b_lo = bucket;
            if (bucket > b_hi) b_hi = bucket;
        }
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
