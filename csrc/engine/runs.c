/*
 * runs.c -- bucket maps as runs over offsets.
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
