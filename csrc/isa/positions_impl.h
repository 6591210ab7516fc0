/*
 * positions_impl.h -- contextual positions along rows (CoPE, docs/spec.md
 * §3.18; engine/term_cope_impl.h) for one ISA and dtype: included by
 * kernels_impl.h.  The ISA may take a row with its vectors (the hook
 * SUFFIX_INTERP_ROW, isa/avx512.c); the plain C below sums four rows
 * interleaved (one row's sum would wait on each addition).  Its gradient,
 * suffix_interp_grad, one row at a time (hook SUFFIX_INTERP_GRAD_ROW); the
 * gates, row_sigmoid (hook SIGMOID_ROW).
 */

/* g[j] = 1 / (1 + exp(-z[j])), j < len, as exp(-|z|) by row_exp, then 1 / (1 + e)
 * (z >= 0) or e / (1 + e): accurate at both ends; NaN stays NaN (g and z apart). */
static void KNAME(posenc_row_sigmoid)(void *g_, const void *z_, size_t len)
{
    REAL *g = (REAL *)g_;
    const REAL *z = (const REAL *)z_;
#ifdef SIGMOID_ROW
    if (SIGMOID_ROW(g, z, len))
        return;
#endif
    for (size_t j = 0; j < len; ++j)
        g[j] = z[j] < 0 ? z[j] : -z[j];   /* -|z| (NaN stays NaN) */
    KNAME(posenc_row_exp)(g, len, 0.0);
    for (size_t j = 0; j < len; ++j)
        g[j] = (z[j] >= 0 ? (REAL)1 : g[j]) / ((REAL)1 + g[j]);
}

/* e at position x from a row's table t, in REAL (x NaN: row 0 read, w NaN: NaN, with no
 * branch; x >= 0 otherwise, a sum of gates). */
static inline REAL KNAME(posenc_interp)(const REAL *t, REAL x)
{
    const ptrdiff_t f = x >= 0 ? (ptrdiff_t)x : 0;
    const REAL w = x - (REAL)f;
    return w * t[f + (w > 0)] + (1 - w) * t[f];
}

/* One key j of a row: its sum s, its position (REAL)min(s, last) (NaN stays NaN) into
 * pos[j] (pos not NULL) and its e added to x[j] (x not NULL). */
#define SUFFIX_KEY(s, g, x, pos, t, j)                                    \
    do {                                                                  \
        (s) += (double)(g)[j];                                            \
        const REAL at_ = (REAL)((s) > last ? last : (s));                 \
        if (pos)                                                          \
            (pos)[j] = at_;                                               \
        if (x)                                                            \
            (x)[j] += KNAME(posenc_interp)(t, at_);                       \
    } while (0)

/*
 * Rows e < count, keys [k0, cols), from the last key down: s += g[j] in
 * double (row e's gates at g + e ldg), the key's position (REAL)min(s, last)
 * (last a REAL's value; a NaN gate makes the positions NaN from it down)
 * into pos (row e at pos + e ldg; NULL: not kept), and where x is not NULL
 * x[j] += w t[c] + (1 - w) t[f], t row e's table (at table + e ldt), f the
 * position's floor, w = position - f, c = f + (w > 0).  A row's results do
 * not depend on its neighbours.
 */
static void KNAME(posenc_suffix_interp)(void *x_, size_t ldx, void *pos_, const void *g_,
                                        size_t ldg, const void *table_, size_t ldt,
                                        size_t count, size_t k0, size_t cols, double last)
{
    REAL *x = (REAL *)x_, *pos = (REAL *)pos_;
    const REAL *g = (const REAL *)g_, *table = (const REAL *)table_;
    size_t e = 0;
#define ROW_OF(base, ld, r) ((base) ? (base) + (r) * (ld) : NULL)
#ifdef SUFFIX_INTERP_ROW
    for (; e < count; ++e)
        if (!SUFFIX_INTERP_ROW(ROW_OF(x, ldx, e), ROW_OF(pos, ldg, e), g + e * ldg,
                               table + e * ldt, k0, cols, last))
            break;   /* not this dtype: the plain C */
#endif
    for (; e + 4 <= count; e += 4) {
        const REAL *g0 = g + e * ldg, *g1 = g0 + ldg, *g2 = g1 + ldg, *g3 = g2 + ldg;
        const REAL *t0 = table + e * ldt, *t1 = t0 + ldt, *t2 = t1 + ldt, *t3 = t2 + ldt;
        REAL *x0 = ROW_OF(x, ldx, e), *x1 = ROW_OF(x, ldx, e + 1);
        REAL *x2 = ROW_OF(x, ldx, e + 2), *x3 = ROW_OF(x, ldx, e + 3);
        REAL *p0 = ROW_OF(pos, ldg, e), *p1 = ROW_OF(pos, ldg, e + 1);
        REAL *p2 = ROW_OF(pos, ldg, e + 2), *p3 = ROW_OF(pos, ldg, e + 3);
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t j = cols; j-- > k0;) {
            SUFFIX_KEY(s0, g0, x0, p0, t0, j);
            SUFFIX_KEY(s1, g1, x1, p1, t1, j);
            SUFFIX_KEY(s2, g2, x2, p2, t2, j);
            SUFFIX_KEY(s3, g3, x3, p3, t3, j);
        }
    }
    for (; e < count; ++e) {
        const REAL *g0 = g + e * ldg, *t0 = table + e * ldt;
        REAL *x0 = ROW_OF(x, ldx, e), *p0 = ROW_OF(pos, ldg, e);
        double s0 = 0;
        for (size_t j = cols; j-- > k0;)
            SUFFIX_KEY(s0, g0, x0, p0, t0, j);
    }
#undef ROW_OF
}
#undef SUFFIX_KEY

/* A run's sums into dqe: its floor's, and the next entry's (none past the table's span). */
static inline void KNAME(posenc_run_end)(double *dqe, size_t span, ptrdiff_t run, double at_floor,
                                         double at_next)
{
    if (run < 0)
        return;
    dqe[run] += at_floor;
    if ((size_t)run + 1 < span)
        dqe[run + 1] += at_next;
}

/*
 * suffix_interp's gradient along one row, keys [first, cols), for the row's
 * gradient G of the values it added (x), its gates g and the positions it
 * formed (pos), its table t: with f, w, c of each key as suffix_interp's,
 *   dqe[f] += (1 - w) G[j], dqe[c] += w G[j]      (dqe: the table's gradient,
 *                                                  added to; a NaN position: none)
 *   sum_j = sum_{j' <= j} G[j'] (t[c] - t[f])     (dL/dg_j; NaN from a NaN position on)
 *   gc[j] = G[j] + sum_j g[j] (1 - g[j]), G[j] where g (1 - g) is 0,
 * in double.  The positions fall along the keys, so dqe's two entries of a run
 * of keys sharing a floor are summed in registers and added once per run.
 */
static void KNAME(posenc_suffix_interp_grad)(void *gc_, double *dqe, const void *G_,
                                             const void *g_, const void *pos_, const void *t_,
                                             size_t first, size_t cols, double last)
{
    REAL *gc = (REAL *)gc_;
    const REAL *G = (const REAL *)G_, *gates = (const REAL *)g_, *pos = (const REAL *)pos_;
    const REAL *t = (const REAL *)t_;
    const size_t span = (size_t)last + 1;
#ifdef SUFFIX_INTERP_GRAD_ROW
    if (SUFFIX_INTERP_GRAD_ROW(gc, dqe, G, gates, pos, t, first, cols, last))
        return;
#endif
    double sum = 0, at_floor = 0, at_next = 0;
    ptrdiff_t run = -1;
    for (size_t j = first; j < cols; ++j) {
        const double Gj = (double)G[j];
        const REAL x = pos[j];
        if (x == x) {
            const ptrdiff_t f = (ptrdiff_t)x, c = f + (x > (REAL)f);
            const double w = (double)(x - (REAL)f);
            if (f != run) {
                KNAME(posenc_run_end)(dqe, span, run, at_floor, at_next);
                run = f, at_floor = at_next = 0;
            }
            if (c != f) {
                at_floor += (1 - w) * Gj;
                at_next += w * Gj;
            } else {   /* w 0 (a clamped run's keys): one addition on the chain */
                at_floor += (1 - w) * Gj + w * Gj;
            }
            sum += Gj * ((double)t[c] - (double)t[f]);
        } else {
            sum = (double)x;
        }
        const double gate = (double)gates[j], slope = gate * (1 - gate);
        gc[j] = (REAL)(slope != 0 ? Gj + sum * slope : Gj);
    }
    KNAME(posenc_run_end)(dqe, span, run, at_floor, at_next);
}
