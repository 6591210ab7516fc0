/*
 * philox.c -- Philox-4x32-10 and the dropout's keep decisions (philox.h).
 * Plain C, shared by every ISA, and the reference of the vector rows
 * (posenc_kernels' dropout_row, isa/philox_impl.h): one block of 4 words
 * per 4 keys, 10 rounds of two 32 x 32 -> 64-bit products each.  Block by
 * block it cost more than the attention's GEMMs (content forward+backward,
 * B=8 H=8 n=512 d=64, dropout 0.1: 47 ms without dropout, 116-144 ms with);
 * the AVX2 and AVX-512 rows take 8 and 16 blocks at once.
 */
#include "philox.h"

void posenc_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;   /* the last bump is never used */
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

uint32_t posenc_dropout_threshold(double dropout_p)
{
    /* as posenc/_attention.py: int(dropout_p * 2^32), exact in double */
    const double scaled = dropout_p * 4294967296.0;
    return scaled <= 0 ? 0u : scaled >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)scaled;
}

void posenc_dropout_span(uint8_t *keep, size_t from, size_t len, uint64_t seed, uint32_t threshold,
                         size_t b, size_t h, size_t i)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t counter[4] = {0, (uint32_t)i, (uint32_t)h, (uint32_t)b}, words[4];
    for (size_t j0 = from; j0 < len; j0 += 4) {
        counter[0] = (uint32_t)(j0 / 4);
        posenc_philox4x32_10(counter, key, words);
        const size_t count = len - j0 < 4 ? len - j0 : 4;
        for (size_t t = 0; t < count; ++t)
            keep[j0 + t] = words[t] >= threshold;
    }
}

void posenc_dropout_row(uint8_t *keep, size_t len, uint64_t seed, uint32_t threshold, size_t b,
                        size_t h, size_t i)
{
    posenc_dropout_span(keep, 0, len, seed, threshold, b, h, i);
}
