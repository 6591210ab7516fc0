/*
 * ukr_impl.h -- a register-tiled microkernel, included by kernels_impl.h
 * with UKR_NAME (its name) and UKR_NRV (its width in vectors), for one ISA
 * and dtype (the vector layer's macros; MR from isa/<isa>.c).
 *
 * BLIS style: an MR x (UKR_NRV VL) tile of A.B from a
 * packed B panel and A in any of the layouts of posenc.h, then the epilogue,
 * stored for rows x cols of the tile only (the tails of every GEMM: no
 * temporary tile in the caller).  kc may be 0 (d = 0: content term zero).
 * The last vector of a partial tile goes through the same operations on
 * its first lanes, so every element is rounded as in a full tile.
 */
#define UKR_NR (UKR_NRV * VL)

static void UKR_NAME(size_t kc, const void *a_, ptrdiff_t lda, const void *b_, void *c_,
                     ptrdiff_t ldc, size_t rows, size_t cols, const void *p_, ptrdiff_t ldp,
                     const void *const *add_rows, int flags)
{
    const REAL *a = (const REAL *)a_;
    const REAL *b = (const REAL *)b_;
    REAL *c = (REAL *)c_;
    const REAL *p = (const REAL *)p_;
    VT acc[MR][UKR_NRV];

#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < UKR_NRV; ++v)
            acc[r][v] = VZERO();

    /* One rank-1 update per l; A(r, l) is broadcast straight from memory. */
#define UKR_LOOP(A_AT)                                                  \
    for (size_t l = 0; l < kc; ++l) {                                   \
        VT bv[UKR_NRV];                                                 \
        _Pragma("GCC unroll 8")                                         \
        for (int v = 0; v < UKR_NRV; ++v)                               \
            bv[v] = VLOAD(b + l * UKR_NR + (size_t)v * VL);             \
        _Pragma("GCC unroll 16")                                        \
        for (int r = 0; r < MR; ++r) {                                  \
            VT ar = VBCAST(A_AT);                                       \
            _Pragma("GCC unroll 8")                                     \
            for (int v = 0; v < UKR_NRV; ++v)                           \
                acc[r][v] = VFMA(ar, bv[v], acc[r][v]);                 \
        }                                                               \
    }
    if ((flags & POSENC_UKR_A_ROWS) && rows == MR) {
        /* a full tile apart (rows a fixed stride apart: one moving pointer and
         * MR offsets in registers, where clamped pointers would spill) */
        UKR_LOOP(a[(ptrdiff_t)r * lda + (ptrdiff_t)l])
    } else if (flags & POSENC_UKR_A_ROWS) {
        /* rows past `rows` repeat the last one: read, computed, never stored */
        const REAL *a_row[MR];
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
            a_row[r] = a + (ptrdiff_t)((size_t)r < rows ? (size_t)r : rows - 1) * lda;
        UKR_LOOP(a_row[r][l])
    } else if (lda == MR) {          /* a packed panel: constant offsets */
        UKR_LOOP(a[l * MR + (size_t)r])
    } else {
        UKR_LOOP(a[(ptrdiff_t)l * lda + r])
    }
#undef UKR_LOOP

    /* The epilogue of one vector of lanes: the same operations for a full
     * vector (LOAD, STORE) and for the first n lanes of the last one. */
#define UKR_EPILOGUE(LOAD, STORE)                                       \
    do {                                                                \
        VT x = acc[r][v];                                               \
        if (flags & POSENC_UKR_ACCUMULATE)                              \
            x = VADD(x, LOAD(crow + col));                              \
        if (flags & POSENC_UKR_ADD_P)                                   \
            x = VADD(x, LOAD(prow + col));                              \
        else if (flags & POSENC_UKR_MUL_P)                              \
            x = VMUL(x, LOAD(prow + col));                              \
        if (flags & POSENC_UKR_ADD_ROWS)                                \
            x = VADD(x, LOAD(qrow + col));                              \
        STORE(crow + col, x);                                           \
    } while (0)
#define UKR_FULL_STORE(p, x) \
    ((flags & POSENC_UKR_STREAM) ? VSTREAM((p), (x)) : VSTORE((p), (x)))
#define UKR_PART_LOAD(p) VLOAD_PART((p), cols - col)
#define UKR_PART_STORE(p, x) VSTORE_PART((p), (x), cols - col)
#define UKR_ROW_POINTERS                                                 \
        REAL *crow = c + r * ldc;                                        \
        const REAL *prow = p ? p + r * ldp : NULL;                       \
        const REAL *qrow = (flags & POSENC_UKR_ADD_ROWS) ? (const REAL *)add_rows[r] : NULL
    if (rows == MR && cols == UKR_NR) {   /* a full tile: no bounds to test */
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            UKR_ROW_POINTERS;
#pragma GCC unroll 8
            for (int v = 0; v < UKR_NRV; ++v) {
                const size_t col = (size_t)v * VL;
                UKR_EPILOGUE(VLOAD, UKR_FULL_STORE);
            }
        }
        return;
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        if ((size_t)r >= rows)
            break;
        UKR_ROW_POINTERS;
#pragma GCC unroll 8
        for (int v = 0; v < UKR_NRV; ++v) {
            const size_t col = (size_t)v * VL;
            if (col + VL <= cols)
                UKR_EPILOGUE(VLOAD, UKR_FULL_STORE);
            else if (col < cols)
                UKR_EPILOGUE(UKR_PART_LOAD, UKR_PART_STORE);
        }
    }
#undef UKR_ROW_POINTERS
#undef UKR_EPILOGUE
#undef UKR_FULL_STORE
#undef UKR_PART_LOAD
#undef UKR_PART_STORE
}

#undef UKR_NR
#undef UKR_NAME
#undef UKR_NRV
