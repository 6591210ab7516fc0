/*
 * alloc.c -- the engine's workspace: 64-byte aligned blocks (a cache line,
 * and the alignment of an AVX-512 vector), sizes checked for overflow, and
 * the per-thread arenas of a team.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>

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
