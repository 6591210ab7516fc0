/*
 * runs.c -- bucket maps as runs over offsets, segment ids as runs over keys.
 */
#include "runs.h"
#include "../posenc.h"
#include "alloc.h"

#include <string.h>

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

int posenc_segment_runs_build(posenc_segment_runs *s, const int64_t *segment_k, size_t B, size_t m)
{
    memset(s, 0, sizeof *s);
    size_t total = 0;
    for (size_t b = 0; b < B; ++b)
        for (size_t j = 0; j < m; ++j)
            if (j == 0 || segment_k[b * m + j] != segment_k[b * m + j - 1])
                ++total;
    s->runs = (posenc_segment_run *)posenc_alloc(total, sizeof(posenc_segment_run));
    s->start = (size_t *)posenc_alloc(B + 1, sizeof(size_t));
    if (!s->runs || !s->start) {
        posenc_segment_runs_free(s);
        return POSENC_ENOMEM;
    }
    size_t count = 0;
    for (size_t b = 0; b < B; ++b) {
        s->start[b] = count;
        for (size_t j = 0; j < m; ++j) {
            if (j == 0 || segment_k[b * m + j] != segment_k[b * m + j - 1]) {
                s->runs[count].j_begin = j;
                s->runs[count].segment = (size_t)segment_k[b * m + j];
                ++count;
            }
            s->runs[count - 1].j_end = j + 1;
        }
    }
    s->start[B] = count;
    return POSENC_OK;
}

void posenc_segment_runs_free(posenc_segment_runs *s)
{
    posenc_free(s->runs);
    posenc_free(s->start);
    memset(s, 0, sizeof *s);
}
