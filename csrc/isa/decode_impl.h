/*
 * decode_impl.h -- the decoding path's products (engine/attention_decode_impl.h,
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

/* Rows [0, fours) of dst's column at dst (rows ld apart) against one key kj, four rows
 * per tree. */
static inline void KNAME(decode_four_rows)(REAL *dst, size_t ld, const REAL *q, size_t fours,
                                           const REAL *kj, size_t d, REAL scale)
{
    for (size_t r = 0; r < fours; r += 4) {
        REAL sums[4];
        VREDUCE4(KNAME(decode_lanes)(q + r * d, kj, d), KNAME(decode_lanes)(q + (r + 1) * d, kj, d),
                 KNAME(decode_lanes)(q + (r + 2) * d, kj, d),
                 KNAME(decode_lanes)(q + (r + 3) * d, kj, d), sums);
        for (size_t u = 0; u < 4; ++u)
            dst[(r + u) * ld] = scale * sums[u];
    }
}

/* Keys per block of rows_dot where more rows than its registers hold share the keys:
 * each pair of rows passes over the block while it is in L1. */
#define DECODE_DOT_KEYS 32

/* Vector registers the ISA has (rows_dot holds q's rows in half of them). */
#if defined(__AVX512F__) || defined(__aarch64__)
#define DECODE_VECTOR_REGISTERS 32
#else
#define DECODE_VECTOR_REGISTERS 16
#endif

/*
 * One or two query rows of NV whole vectors (d = NV VL) held in registers over the keys
 * (rows_dot's common shapes: a step's q; q and a key table's row): each key's row is
 * then the only load.  One row: four keys per tree; two rows: two keys.  The same sums
 * as decode_lanes, lane for lane, reduced by VREDUCE's tree.
 */
#define DECODE_REGISTER_ROWS(NV)                                                              \
    static void KNAME(decode_rows_##NV)(REAL *dst, size_t ld, const REAL *q, size_t rows,     \
                                        const REAL *k, size_t keys, REAL scale)               \
    {                                                                                         \
        const size_t d = NV * VL;                                                             \
        VT a[NV], b[NV];                                                                      \
        size_t j = 0;                                                                         \
        for (int v = 0; v < NV; ++v)                                                          \
            a[v] = VLOAD(q + v * VL);                                                         \
        if (rows == 1) {                                                                      \
            for (; j + 4 <= keys; j += 4) {                                                   \
                const REAL *kj = k + j * d;                                                   \
                VT s0 = VZERO(), s1 = VZERO(), s2 = VZERO(), s3 = VZERO();                    \
                for (int v = 0; v < NV; ++v) {                                                \
                    s0 = VFMA(a[v], VLOAD(kj + v * VL), s0);                                  \
                    s1 = VFMA(a[v], VLOAD(kj + d + v * VL), s1);                              \
                    s2 = VFMA(a[v], VLOAD(kj + 2 * d + v * VL), s2);                          \
                    s3 = VFMA(a[v], VLOAD(kj + 3 * d + v * VL), s3);                          \
                }                                                                             \
                REAL sums[4];                                                                 \
                VREDUCE4(s0, s1, s2, s3, sums);                                               \
                for (int u = 0; u < 4; ++u)                                                   \
                    dst[j + u] = scale * sums[u];                                             \
            }                                                                                 \
            for (; j < keys; ++j) {                                                           \
                VT s0 = VZERO();                                                              \
                for (int v = 0; v < NV; ++v)                                                  \
                    s0 = VFMA(a[v], VLOAD(k + j * d + v * VL), s0);                           \
                dst[j] = scale * (REAL)VREDUCE(s0);                                           \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        for (int v = 0; v < NV; ++v)                                                          \
            b[v] = VLOAD(q + d + v * VL);                                                     \
        for (; j + 2 <= keys; j += 2) {                                                       \
            const REAL *k0 = k + j * d, *k1 = k0 + d;                                         \
            VT s0 = VZERO(), s1 = VZERO(), s2 = VZERO(), s3 = VZERO();                        \
            for (int v = 0; v < NV; ++v) {                                                    \
                const VT x0 = VLOAD(k0 + v * VL), x1 = VLOAD(k1 + v * VL);                    \
                s0 = VFMA(a[v], x0, s0);                                                      \
                s1 = VFMA(b[v], x0, s1);                                                      \
                s2 = VFMA(a[v], x1, s2);                                                      \
                s3 = VFMA(b[v], x1, s3);                                                      \
            }                                                                                 \
            REAL sums[4];                                                                     \
            VREDUCE4(s0, s1, s2, s3, sums);                                                   \
            dst[j] = scale * sums[0];                                                         \
            dst[ld + j] = scale * sums[1];                                                    \
            dst[j + 1] = scale * sums[2];                                                     \
            dst[ld + j + 1] = scale * sums[3];                                                \
        }                                                                                     \
        for (; j < keys; ++j) {                                                               \
            VT s0 = VZERO(), s1 = VZERO();                                                    \
            for (int v = 0; v < NV; ++v) {                                                    \
                const VT x = VLOAD(k + j * d + v * VL);                                       \
                s0 = VFMA(a[v], x, s0);                                                       \
                s1 = VFMA(b[v], x, s1);                                                       \
            }                                                                                 \
            dst[j] = scale * (REAL)VREDUCE(s0);                                               \
            dst[ld + j] = scale * (REAL)VREDUCE(s1);                                          \
        }                                                                                     \
    }
DECODE_REGISTER_ROWS(4)
DECODE_REGISTER_ROWS(8)
#undef DECODE_REGISTER_ROWS

/*
 * dst[r * ld + j] = scale sum_l q[r * d + l] k[j * d + l], r < rows, j < keys: each
 * key's row loaded once for all the query rows (in L1), four sums reduced in one tree
 * (VREDUCE4; a horizontal sum each would bound the loop): rows four at a time per key
 * (a grouped-query step), a pair of rows over a pair of keys (DeBERTa's step: q and a
 * key table's row, term_key_table_content_row), a last row one key at a time.  The tree
 * is VREDUCE's, lane for lane: a sum's bits depend on neither its row's place nor its
 * key's.
 */
static void KNAME(posenc_rows_dot)(void *dst_, size_t ld, const void *q_, size_t rows,
                                   const void *k_, size_t keys, size_t d, double scale_)
{
    REAL *dst = (REAL *)dst_;
    const REAL *q = (const REAL *)q_, *k = (const REAL *)k_, scale = (REAL)scale_;
    const size_t nv = d % VL ? 0 : d / VL, held = nv * 2 <= DECODE_VECTOR_REGISTERS / 2 ? 2 : 1;
    if (rows && (nv == 4 || nv == 8) && nv <= DECODE_VECTOR_REGISTERS / 2) {
        /* rows `held` at a time in registers, over blocks of keys that stay in L1 */
        const size_t block = rows <= held ? keys : DECODE_DOT_KEYS;
        for (size_t j0 = 0; j0 < keys; j0 += block) {
            const size_t count = keys - j0 < block ? keys - j0 : block;
            for (size_t r = 0; r < rows; r += held) {
                const size_t these = rows - r < held ? rows - r : held;
                if (nv == 4)
                    KNAME(decode_rows_4)(dst + r * ld + j0, ld, q + r * d, these, k + j0 * d, count, scale);
                else
                    KNAME(decode_rows_8)(dst + r * ld + j0, ld, q + r * d, these, k + j0 * d, count, scale);
            }
        }
        return;
    }
    const size_t fours = rows / 4 * 4, pairs = fours + (rows - fours) / 2 * 2;
    size_t j = 0;
    for (; pairs > fours && j + 2 <= keys; j += 2) {
        const REAL *kj = k + j * d;
        KNAME(decode_four_rows)(dst + j, ld, q, fours, kj, d, scale);
        KNAME(decode_four_rows)(dst + j + 1, ld, q, fours, kj + d, d, scale);
        for (size_t r = fours; r < pairs; r += 2) {
            const REAL *qr = q + r * d;
            REAL sums[4];
            VREDUCE4(KNAME(decode_lanes)(qr, kj, d), KNAME(decode_lanes)(qr + d, kj, d),
                     KNAME(decode_lanes)(qr, kj + d, d), KNAME(decode_lanes)(qr + d, kj + d, d),
                     sums);
            dst[r * ld + j] = scale * sums[0];
            dst[(r + 1) * ld + j] = scale * sums[1];
            dst[r * ld + j + 1] = scale * sums[2];
            dst[(r + 1) * ld + j + 1] = scale * sums[3];
        }
        for (size_t r = pairs; r < rows; ++r)
            for (size_t u = 0; u < 2; ++u)
                dst[r * ld + j + u] = scale * (REAL)VREDUCE(KNAME(decode_lanes)(q + r * d, kj + u * d, d));
    }
    for (; j < keys; ++j) {   /* the keys left: each row by itself past the fours */
        const REAL *kj = k + j * d;
        KNAME(decode_four_rows)(dst + j, ld, q, fours, kj, d, scale);
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
#undef DECODE_VECTOR_REGISTERS
#undef DECODE_DOT_KEYS
