/*
 * decode_impl.h -- the decoding path's products (engine/attention_impl.h,
 * attention_decode_unit), for one ISA and dtype: included by kernels_impl.h.
 * A step has a few query rows against many keys: k and v are streamed once,
 * in place, each key's row loaded once for all the query rows (which stay in
 * L1), instead of being packed into GEMM panels of which a row is used.
 * Every sum runs in one fixed order (lanes, then keys in order): the same
 * bits for any split of the rows or keys among threads.
 */
#include <string.h>

#ifndef VREDUCE4   /* the vector layer's one tree for four sums, or four reductions */
#define VREDUCE4(a, b, c, d, out) \
    ((out)[0] = (REAL)VREDUCE(a), (out)[1] = (REAL)VREDUCE(b), (out)[2] = (REAL)VREDUCE(c), \
     (out)[3] = (REAL)VREDUCE(d))
#define DECODE_OWN_REDUCE4
#endif

/* The lane-wise sum q_r . k_j (its horizontal sum left to the caller). */
static inline VT KNAME(decode_lanes)(const REAL *qr, const REAL *kj, size_t d)
{
    const size_t whole = d / VL * VL, tail = d - whole;
    VT acc = VZERO();
    for (size_t l = 0; l < whole; l += VL)
        acc = VFMA(VLOAD(qr + l), VLOAD(kj + l), acc);
    if (tail)
        acc = VFMA(VLOAD_PART(qr + whole, tail), VLOAD_PART(kj + whole, tail), acc);
    return acc;
}

/*
 * dst[r * ld + j] = scale sum_l q[r * d + l] k[j * d + l], r < rows, j < keys: each
 * key's row loaded once for all the query rows (in L1), the rows four at a time with
 * their four sums reduced in one tree (VREDUCE4: a grouped-query step's rows would
 * otherwise cost a horizontal sum each per key), the rest one by one.  A sum depends
 * only on its row's place and its key.
 */
static void KNAME(posenc_rows_dot)(void *dst_, size_t ld, const void *q_, size_t rows,
                                   const void *k_, size_t keys, size_t d, double scale_)
{
    REAL *dst = (REAL *)dst_;
    const REAL *q = (const REAL *)q_, *k = (const REAL *)k_, scale = (REAL)scale_;
    const size_t fours = rows / 4 * 4;
    for (size_t j = 0; j < keys; ++j) {
        const REAL *kj = k + j * d;
        for (size_t r = 0; r < fours; r += 4) {
            REAL sums[4];
            VREDUCE4(KNAME(decode_lanes)(q + r * d, kj, d), KNAME(decode_lanes)(q + (r + 1) * d, kj, d),
                     KNAME(decode_lanes)(q + (r + 2) * d, kj, d),
                     KNAME(decode_lanes)(q + (r + 3) * d, kj, d), sums);
            for (size_t u = 0; u < 4; ++u)
                dst[(r + u) * ld + j] = scale * sums[u];
        }
        for (size_t r = fours; r < rows; ++r)
            dst[r * ld + j] = scale * (REAL)VREDUCE(KNAME(decode_lanes)(q + r * d, kj, d));
    }
}

/* Keys per block of rows_axpy: the block's v rows stay in L1 while every out row and
 * every register block of it passes over them. */
#define DECODE_AXPY_KEYS 64

/* out[r * ld_out + i] = sum_j p[r * ld_p + j] v[j * dv + i], r < rows, i < dv, the keys
 * j < keys in order.  Each out row is held in registers, 4 vectors at a time, over a
 * block of keys (a chain through memory, load-FMA-store per key, would bound the loop
 * by store forwarding); every element still sums its keys in order, by FMA from 0. */
static void KNAME(posenc_rows_axpy)(void *out_, size_t ld_out, const void *p_, size_t ld_p,
                                    size_t rows, const void *v_, size_t keys, size_t dv)
{
    REAL *out = (REAL *)out_;
    const REAL *p = (const REAL *)p_, *v = (const REAL *)v_;
    for (size_t r = 0; r < rows; ++r)
        memset(out + r * ld_out, 0, sizeof(REAL) * dv);
    for (size_t j0 = 0; j0 < keys; j0 += DECODE_AXPY_KEYS) {
        const size_t block = keys - j0 < DECODE_AXPY_KEYS ? keys - j0 : DECODE_AXPY_KEYS;
        const REAL *vb = v + j0 * dv;
        for (size_t r = 0; r < rows; ++r) {
            const REAL *pr = p + r * ld_p + j0;
            REAL *o = out + r * ld_out;
            size_t i = 0;
            for (; i + 4 * VL <= dv; i += 4 * VL) {
                VT a0 = VLOAD(o + i), a1 = VLOAD(o + i + VL), a2 = VLOAD(o + i + 2 * VL),
                   a3 = VLOAD(o + i + 3 * VL);
                for (size_t j = 0; j < block; ++j) {
                    const VT weight = VBCAST(pr[j]);
                    const REAL *vj = vb + j * dv + i;
                    a0 = VFMA(weight, VLOAD(vj), a0);
                    a1 = VFMA(weight, VLOAD(vj + VL), a1);
                    a2 = VFMA(weight, VLOAD(vj + 2 * VL), a2);
                    a3 = VFMA(weight, VLOAD(vj + 3 * VL), a3);
                }
                VSTORE(o + i, a0);
                VSTORE(o + i + VL, a1);
                VSTORE(o + i + 2 * VL, a2);
                VSTORE(o + i + 3 * VL, a3);
            }
            for (; i + VL <= dv; i += VL) {
                VT a = VLOAD(o + i);
                for (size_t j = 0; j < block; ++j)
                    a = VFMA(VBCAST(pr[j]), VLOAD(vb + j * dv + i), a);
                VSTORE(o + i, a);
            }
            if (i < dv) {
                const size_t tail = dv - i;
                VT a = VLOAD_PART(o + i, tail);
                for (size_t j = 0; j < block; ++j)
                    a = VFMA(VBCAST(pr[j]), VLOAD_PART(vb + j * dv + i, tail), a);
                VSTORE_PART(o + i, a, tail);
            }
        }
    }
}

#ifdef DECODE_OWN_REDUCE4
#undef VREDUCE4
#undef DECODE_OWN_REDUCE4
#endif
