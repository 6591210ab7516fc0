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

/* out[r * ld_out + i] = sum_j p[r * ld_p + j] v[j * dv + i], r < rows, i < dv, the keys
 * j < keys in order (the out rows stay in L1 while v streams). */
static void KNAME(posenc_rows_axpy)(void *out_, size_t ld_out, const void *p_, size_t ld_p,
                                    size_t rows, const void *v_, size_t keys, size_t dv)
{
    REAL *out = (REAL *)out_;
    const REAL *p = (const REAL *)p_, *v = (const REAL *)v_;
    for (size_t r = 0; r < rows; ++r)
        memset(out + r * ld_out, 0, sizeof(REAL) * dv);
    for (size_t j = 0; j < keys; ++j) {
        const REAL *vj = v + j * dv;
        for (size_t r = 0; r < rows; ++r) {
            const VT weight = VBCAST(p[r * ld_p + j]);
            REAL *o = out + r * ld_out;
            size_t i = 0;
            for (; i + VL <= dv; i += VL)
                VSTORE(o + i, VFMA(weight, VLOAD(vj + i), VLOAD(o + i)));
            if (i < dv)
                VSTORE_PART(o + i, VFMA(weight, VLOAD_PART(vj + i, dv - i), VLOAD_PART(o + i, dv - i)),
                            dv - i);
        }
    }
}
