/*
 * softmax_impl.h -- the rows of the fused attention's softmax (SPEC §6,
 * engine/attention_impl.h), for one ISA and dtype: included by
 * kernels_impl.h.  The vector ISAs bring VEXP and VMAX (isa/vector_exp.h);
 * the scalar ISA uses libm's exp.
 */
#include <math.h>

/* max_j x[j], j < len; -inf when len is 0 or every x[j] is -inf; never NaN.
 * A NaN element is passed over, though in the vector part its lane's
 * maximum restarts after it (a NaN makes the row's sum, lse and out NaN
 * whatever the shift; a -inf maximum beside a NaN is the caller's case:
 * attention_softmax_row checks such a row for NaN). */
static double KNAME(posenc_row_max)(const void *x_, size_t len)
{
    const REAL *x = (const REAL *)x_;
    REAL best = (REAL)-INFINITY;
    size_t j = 0;
#ifdef VMAX
    if (len >= VL) {
        VT acc = VLOAD(x);
        for (j = VL; j + VL <= len; j += VL)
            acc = VMAX(acc, VLOAD(x + j));
        if (j < len) {   /* the tail as the row's last VL elements: no masked load */
            acc = VMAX_NUMBERS(acc, VLOAD(x + len - VL));
            j = len;
        }
        best = (REAL)VMAX_LANES(acc);
    }
#endif
    for (; j < len; ++j)
        best = x[j] > best ? x[j] : best;
    return (double)best;
}

/* x[j] = exp(x[j] - shift) in place, j < len (-inf gives 0); returns the sum of the
 * results.  The vector ISAs' exp: VSOFTMAX_EXP (isa/vector_exp.h). */
static double KNAME(posenc_row_exp)(void *x_, size_t len, double shift_)
{
    REAL *x = (REAL *)x_;
    const REAL minus_shift = (REAL)-shift_;
    REAL total = 0;
    size_t j = 0;
#ifdef VEXP
    const VT add = VBCAST(minus_shift);
    /* a tail after full vectors: the row's last VL elements, read before the
     * loop rewrites some of them and stored whole (the rewritten ones again,
     * to the same values): a masked store costs more than an exp (AVX-512
     * on AMD Zen 4: row_exp of 24 floats took 13.6 ns, of 32 7.4 ns) */
    const int last_whole = len > VL && len % VL != 0;
    const VT last = last_whole ? VLOAD(x + len - VL) : VZERO();
    VT acc = VZERO();
    for (; j + VL <= len; j += VL) {
        const VT e = VSOFTMAX_EXP(VLOAD(x + j), add);
        VSTORE(x + j, e);
        acc = VADD(acc, e);
    }
    if (last_whole)
        VSTORE(x + len - VL, VSOFTMAX_EXP(last, add));
    else if (j < len)
        VSTORE_PART(x + j, VSOFTMAX_EXP(VLOAD_PART(x + j, len - j), add), len - j);
    total = VREDUCE(acc);
    for (; j < len; ++j)
        total += x[j];
#else
    for (; j < len; ++j) {
        x[j] = (REAL)exp((double)(x[j] + minus_shift));
        total += x[j];
    }
#endif
    return (double)total;
}

/* softcap (SPEC §7): x[j] = cap tanh(x[j] / cap), j < len; with grad, also
 * grad[j] = 1 - tanh^2 (the backward's factor). */
static void KNAME(posenc_row_softcap)(void *x_, void *grad_, size_t len, double cap)
{
    REAL *x = (REAL *)x_, *grad = (REAL *)grad_;
    size_t j = 0;
#ifdef VTANH
    const VT inverse = VBCAST((REAL)(1.0 / cap)), scale = VBCAST((REAL)cap);
    const VT one = VBCAST((REAL)1), minus_one = VBCAST((REAL)-1);
    for (; j + VL <= len; j += VL) {
        const VT t = VTANH(VMUL(VLOAD(x + j), inverse));
        VSTORE(x + j, VMUL(t, scale));
        if (grad)
            VSTORE(grad + j, VFMA(VMUL(t, minus_one), t, one));
    }
#endif
    for (; j < len; ++j) {
        const double t = tanh((double)x[j] / cap);
        x[j] = (REAL)(cap * t);
        if (grad)
            grad[j] = (REAL)(1.0 - t * t);
    }
}
