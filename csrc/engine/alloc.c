/*
 * alloc.c -- the engine's workspace: 64-byte aligned blocks (a cache line,
 * and the alignment of an AVX-512 vector), sizes checked for overflow.
 */
#define _POSIX_C_SOURCE 200809L
#include "alloc.h"

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
