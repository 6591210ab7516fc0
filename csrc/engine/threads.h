/*
 * threads.h -- teams of threads (threads.c): how many threads a call gets, the rows
 * of a work item, and a team that runs a function on per-thread workspaces.
 */
#ifndef POSENC_THREADS_H
#define POSENC_THREADS_H

#include "../posenc.h"
#include "alloc.h"

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

#endif /* POSENC_THREADS_H */
