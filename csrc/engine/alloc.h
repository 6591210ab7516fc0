/*
 * alloc.h -- the engine's memory (alloc.c): 64-byte aligned blocks whose sizes are
 * checked for overflow, and the size arithmetic every file uses.
 */
#ifndef POSENC_ALLOC_H
#define POSENC_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* 64-byte aligned allocation; NULL on failure or overflow. */
void *posenc_alloc(size_t count, size_t size);
void posenc_free(void *ptr);

/* count * size with overflow detection: SIZE_MAX on overflow. */
size_t posenc_mul_size(size_t count, size_t size);

#define POSENC_ALIGN 64

static inline size_t posenc_round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }
static inline size_t posenc_min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t posenc_max(size_t a, size_t b) { return a > b ? a : b; }

#endif /* POSENC_ALLOC_H */
