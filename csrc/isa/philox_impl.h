/*
 * philox_impl.h -- the dropout's keep decisions on vectors (posenc_kernels'
 * dropout_row: posenc_dropout_row of engine/philox.h, bit for bit),
 * included by an ISA file (isa/avx2.c, isa/avx512.c), after engine/philox.h
 * (its constants and posenc_dropout_span), that defines
 *   PHILOX_NAME        the function's name
 *   PHILOX_V           a vector of PHILOX_LANES 32-bit lanes
 *   PHILOX_SET1(x)     x in every lane; PHILOX_LANE_INDEX: 0, 1, ... in the lanes
 *   PHILOX_ADD, PHILOX_XOR
 *   philox_mul(a, m, &hi, &lo)     hi:lo = a * m lane by lane, unsigned 32 x 32 -> 64 bits
 *   philox_store(keep, c0 .. c3, limit)   keep[4 l + t] = (word t of lane l >= limit), unsigned
 * Philox-4x32-10 on PHILOX_LANES blocks at once (block l of a step is
 * counter (j / 4 + l, i, h, b): keys j + 4 l .. j + 4 l + 3); the row's last
 * len mod (4 PHILOX_LANES) keys go to the plain C.  Integer arithmetic
 * throughout: the same words as the plain C's.
 */
static void PHILOX_NAME(uint8_t *keep, size_t len, uint64_t seed, uint32_t threshold, size_t b,
                        size_t h, size_t i)
{
    const size_t step = 4 * PHILOX_LANES;
    const PHILOX_V m0 = PHILOX_SET1(PHILOX_M0), m1 = PHILOX_SET1(PHILOX_M1);
    const PHILOX_V limit = PHILOX_SET1(threshold);
    size_t j = 0;
    for (; j + step <= len; j += step) {
        PHILOX_V c0 = PHILOX_ADD(PHILOX_SET1((uint32_t)(j / 4)), PHILOX_LANE_INDEX);
        PHILOX_V c1 = PHILOX_SET1((uint32_t)i), c2 = PHILOX_SET1((uint32_t)h);
        PHILOX_V c3 = PHILOX_SET1((uint32_t)b);
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int round = 0; round < 10; ++round) {
            PHILOX_V hi0, lo0, hi1, lo1;
            philox_mul(c0, m0, &hi0, &lo0);
            philox_mul(c2, m1, &hi1, &lo1);
            c0 = PHILOX_XOR(PHILOX_XOR(hi1, c1), PHILOX_SET1(k0));
            c1 = lo1;
            c2 = PHILOX_XOR(PHILOX_XOR(hi0, c3), PHILOX_SET1(k1));
            c3 = lo0;
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        philox_store(keep + j, c0, c1, c2, c3, limit);
    }
    posenc_dropout_span(keep, j, len, seed, threshold, b, h, i);
}
#define DROPOUT_ROW PHILOX_NAME
