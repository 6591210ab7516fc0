/*
 * philox.h -- Philox-4x32-10 (Salmon, Moraes, Dror, Shaw 2011, "Parallel
 * random numbers: as easy as 1, 2, 3"; Random123's constants): the
 * counter-based generator of the fused attention's dropout (SPEC §6).  A
 * keep decision is a pure function of (seed, b, h, i, j, dropout_p), so the
 * backward regenerates the forward's and every thread count and ISA draws
 * the same ones.  posenc/_attention.py is the same generator in NumPy
 * (posenc.attention_dropout_mask): the two agree bit for bit.
 */
#ifndef POSENC_PHILOX_H
#define POSENC_PHILOX_H

#include <stddef.h>
#include <stdint.h>

/* Random123's constants, which the vector rows (isa/philox_impl.h) share. */
#define PHILOX_M0 0xD2511F53u   /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u   /* Weyl key increments */
#define PHILOX_W1 0xBB67AE85u

/* out = Philox-4x32-10(counter, key). */
void posenc_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* A 32-bit word at least this keeps its entry: floor(dropout_p 2^32), dropout_p in [0, 1). */
uint32_t posenc_dropout_threshold(double dropout_p);

/*
 * The keep decisions of keys [0, len) of query row i (the row's index in
 * the call, not its position) of unit (b, h): keep[j] = 1 when word j mod 4
 * of Philox at counter (j / 4, i, h, b), key (seed mod 2^32, seed / 2^32),
 * is at least `threshold`, else 0.  Indices are taken mod 2^32.
 */
void posenc_dropout_row(uint8_t *keep, size_t len, uint64_t seed, uint32_t threshold, size_t b,
                        size_t h, size_t i);

/* The same decisions for keys [from, len) only (from a multiple of 4), into
 * keep[from .. len): the tail of a vector kernel's row (posenc_kernels'
 * dropout_row, which must agree with posenc_dropout_row bit for bit). */
void posenc_dropout_span(uint8_t *keep, size_t from, size_t len, uint64_t seed, uint32_t threshold,
                         size_t b, size_t h, size_t i);

#endif /* POSENC_PHILOX_H */
