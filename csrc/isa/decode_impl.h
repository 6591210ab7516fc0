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

/* dst[r * ld + j] = scale sum_l q[r * d + l] k[j * d + l], r < rows, j < keys. */
static void KNAME(posenc_rows_dot)(void *dst_, size_t ld, const void *q_, size_t rows,
                                   const void *k_, size_t keys, size_t d, double scale_)
{
    REAL *dst = (REAL *)dst_;
    const REAL *q = (const REAL *)q_, *k = (const REAL *)k_, scale = (REAL)scale_;
    const size_t whole = d / VL * VL, tail = d - whole;
    for (size_t j = 0; j < keys; ++j) {
        const REAL *kj = k + j * d;
        for (size_t r = 0; r < rows; ++r) {
            const REAL *qr = q + r * d;
            VT acc = VZERO();
            for (size_t l = 0; l < whole; l += VL)
                acc = VFMA(VLOAD(qr + l), VLOAD(kj + l), acc);
            if (tail)
                acc = VFMA(VLOAD_PART(qr + whole, tail), VLOAD_PART(kj + whole, tail), acc);
            dst[r * ld + j] = scale * (REAL)VREDUCE(acc);
        }
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
