/*
 * threads.c -- a team that can start.  An OpenMP runtime cannot fail a
 * parallel region: when it cannot create a thread (an address-space limit,
 * RLIMIT_NPROC, a cgroup's pids.max) GNU libgomp prints "Thread creation
 * failed" and calls exit(1), LLVM's libomp aborts.  So before the first
 * region whose team exceeds the largest that could start, the engine creates
 * that many threads itself, as the runtime would (default attributes, the
 * stack size of OMP_STACKSIZE / GOMP_STACKSIZE), holds them all, and joins
 * them.  If some fail, the team is lowered to what succeeded, with headroom,
 * and that limit is remembered.  Results are bitwise identical for any team,
 * so a limit only costs speed.
 *
 * libgomp lets the threads beyond a smaller team exit and creates them again
 * for a larger one, while those that exit may still hold their stacks: so a
 * first start probes twice the team's threads, and where that fails (near a
 * limit) every regrowth is probed too.
 */
#define _POSIX_C_SOURCE 200809L
#include "threads.h"

#if defined(_OPENMP) && (defined(__unix__) || defined(__APPLE__))
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t team_started = 1;        /* the largest team known to start */
static size_t team_limit = SIZE_MAX;   /* the most that can, once a probe failed */
static size_t team_last = 1;           /* the last team: the runtime's threads now */
static int near_limit;                 /* a probe could not create all it wanted */

/* Threads beyond the team's that the probe also creates: room for what the
 * call allocates before its region starts (workspace, runtime bookkeeping). */
static size_t headroom(size_t team) { return 1 + (team - 1) / 8; }

/* OMP_STACKSIZE, else GOMP_STACKSIZE, as libgomp reads them: a number of
 * kilobytes, or of bytes, kilobytes, megabytes, gigabytes with a B, K, M or
 * G suffix; 0 when neither is set (or valid): the default stack. */
static size_t omp_stack_size(void)
{
    static const char *const names[2] = {"OMP_STACKSIZE", "GOMP_STACKSIZE"};
    for (int t = 0; t < 2; ++t) {
        const char *text = getenv(names[t]);
        if (!text)
            continue;
        char *end;
        const unsigned long long value = strtoull(text, &end, 10);
        while (*end == ' ' || *end == '\t')
            ++end;
        int shift = 10;
        switch (*end) {
        case 'b': case 'B': shift = 0; ++end; break;
        case 'k': case 'K': shift = 10; ++end; break;
        case 'm': case 'M': shift = 20; ++end; break;
        case 'g': case 'G': shift = 30; ++end; break;
        default: break;
        }
        while (*end == ' ' || *end == '\t')
            ++end;
        if (end != text && *end == '\0' && value <= (SIZE_MAX >> shift))
            return (size_t)value << shift;
    }
    return 0;
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t go;
    int released;
} probe_gate;

/* A probe thread: alive until every other one has been created. */
static void *probe_wait(void *arg)
{
    probe_gate *gate = (probe_gate *)arg;
    pthread_mutex_lock(&gate->lock);
    while (!gate->released)
        pthread_cond_wait(&gate->go, &gate->lock);
    pthread_mutex_unlock(&gate->lock);
    return NULL;
}

/* How many of `count` threads could be alive at once (all joined on return). */
static size_t probe(size_t count)
{
    pthread_t *ids = (pthread_t *)malloc(count * sizeof *ids);
    if (!ids)
        return 0;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        free(ids);
        return 0;
    }
    const size_t stack = omp_stack_size();
    if (stack)
        pthread_attr_setstacksize(&attr, stack);   /* libgomp itself refuses a bad one */
    probe_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    size_t created = 0;
    while (created < count && pthread_create(&ids[created], &attr, probe_wait, &gate) == 0)
        ++created;
    pthread_mutex_lock(&gate.lock);
    gate.released = 1;
    pthread_cond_broadcast(&gate.go);
    pthread_mutex_unlock(&gate.lock);
    for (size_t t = 0; t < created; ++t)
        pthread_join(ids[t], NULL);
    pthread_attr_destroy(&attr);
    free(ids);
    return created;
}

size_t posenc_team_startable(size_t team)
{
    if (team <= 1)
        return team;
    pthread_mutex_lock(&probe_lock);
    if (team > team_limit)
        team = team_limit;
    const int first = team > team_started;
    if (first || (near_limit && team > team_last)) {
        const size_t need = team - 1 + headroom(team);
        /* a first start also makes sure the runtime can regrow its pool
         * while the threads it let go are still exiting: 2 (team - 1) */
        const size_t want = first && 2 * (team - 1) > need ? 2 * (team - 1) : need;
        const size_t created = probe(want);
        if (created < want)
            near_limit = 1;
        if (created < need) {
            /* the largest team whose threads and headroom were all created */
            while (team > 1 && team - 1 + headroom(team) > created)
                --team;
            team_limit = team;
        }
        if (team > team_started)
            team_started = team;
    }
    team_last = team;
    pthread_mutex_unlock(&probe_lock);
    return team;
}

#else

size_t posenc_team_startable(size_t team) { return team; }

#endif

int posenc_run_team(size_t team, size_t ws_bytes, void (*fn)(void *arg, void *ws), void *arg)
{
    const size_t ws = posenc_round_up(ws_bytes ? ws_bytes : 1, POSENC_ALIGN);
    char *arena = (char *)posenc_alloc(team ? team : 1, ws);
    if (!arena)
        return POSENC_ENOMEM;
    if (team <= 1) {
        fn(arg, arena);
    } else {
#pragma omp parallel num_threads((int)team)
        fn(arg, arena + (size_t)posenc_thread_id() * ws);
    }
    posenc_free(arena);
    return POSENC_OK;
}
