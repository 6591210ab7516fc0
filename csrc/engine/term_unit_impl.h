/*
 * term_unit_impl.h -- what a term module's functions (csrc/terms.h,
 * term_kinds_impl.h) get and what they are, for one dtype (REAL): the one
 * header a kind's file (term_<name>_impl.h) includes.
 */
#ifndef POSENC_ENGINE_TERM_UNIT_IMPL_H
#define POSENC_ENGINE_TERM_UNIT_IMPL_H

#include <string.h>

#include "engine.h"
#include "gemm_impl.h"
#include "scales_impl.h"

/* What a call's kinds share (built by terms_prepare once per call: the fused attention's
 * backward reads its logits'). */
typedef struct {
    void *data[POSENC_TERM_COUNT];   /* what kind k's prepare built (NULL: nothing) */
    ptrdiff_t reach;   /* a causal attention: the last map index n - 1 + (j - i) its tiles read
                          (a tile's last row's offset); -1: none (every offset) */
    int direct;        /* the rows are few (a decoding step): a kind reads its tables in place
                          and forms no unit data that a tile's GEMM would amortise */
    int fused;         /* direct, one row: the content_row kind's term of the row was formed in
                          its pass over k (terms_content_row): its rows only apply it */
} terms_call;

/* Which keys the rows see, for a kind that reads the content logits (a fused
 * attention's masks): unseen_zero(ctx, x, b, i, cols) sets x[j] = 0 for the keys
 * j < cols that row i (of the unit's rows) of batch row b does not see. */
typedef struct {
    const void *ctx;
    void (*unseen_zero)(const void *ctx, REAL *x, size_t b, size_t i, size_t cols);
} term_seen;

/* What a thread's calls of the kinds share: its GEMM scratch (gemm_impl.h), the unit's q and
 * k as the content reads them (row i at q + i d, key j at k + j d: rotated, or copied from
 * strided inputs), the call's terms_call, and per kind a number the thread keeps between
 * calls of its `unit` (-1 at first: term_unit's tag) and the place of its unit data in the
 * thread's (terms_unit_scratch's layout). */
typedef struct {
    const gemm_scratch *gemm;
    const REAL *q, *k;
    const terms_call *call;
    ptrdiff_t tag[POSENC_TERM_COUNT];
    size_t unit_at[POSENC_TERM_COUNT];   /* kind k's unit data at scratch + unit_at[k] */
    /* the backward's: */
    int whole;                  /* unit data over every offset (the backward's tiles read past
                                   a causal forward's reach: terms_call's reach ignored) */
    const term_seen *seen;      /* a fused attention's masks (which keys each row sees), or NULL */
    void *const *grad;          /* kind k's backward data (grad_prepare), or NULL: none */
    REAL *grad_ws;              /* the thread's backward workspace of the kinds: kind k's at */
    size_t grad_at[POSENC_TERM_COUNT];   /* grad_ws + grad_at[k] (grad_unit_scratch) */
} term_env;

/* What a kind's functions get: the problem, the kernels it runs on, the thread's env (its
 * GEMM scratch also as `gemm`), the term, its unit's arrays, what its prepare built. */
typedef struct {
    const posenc_problem *p;
    const posenc_kernels *kern;
    const term_env *env;
    const gemm_scratch *gemm;
    const void *data;       /* the call's data of the kind (terms_call), or NULL */
    const posenc_term *term;
    const double *array[POSENC_TERM_ARRAYS_MAX];   /* unit (b, h)'s float64 arrays, NULL where
                                                      not given or `real` */
    const REAL *real[POSENC_TERM_ARRAYS_MAX];      /* its `real` ones (terms.h), NULL elsewhere */
    size_t b, h;
    REAL *unit_data;        /* the forward's: what the kind's `unit` formed for (b, h),
                               unit_scratch(p, kern, call) elements (NULL elsewhere) */
    ptrdiff_t *tag;         /* in `unit`: the kind's number in the thread's env (what its unit
                               data holds that a later unit may keep: a head's packed table) */
    void *grad;             /* in the backward's grad_ hooks: the kind's backward data; their
                               unit_data is its part of the thread's backward workspace */
    const uint16_t *g16;    /* in grad_rows of a kind with grad_bf16: G's bfloat16 twin (row r
                               at g16 + r ldg), its float32 values unwritten; NULL elsewhere */
} term_unit;

/* What a backward call tells the kinds whose gradients go through a unit's sums (term_kind's
 * grad_prepare: the vector tables). */
typedef struct {
    const posenc_grads *g;
    ptrdiff_t o_max;        /* the largest offset j - i where G may be nonzero (m - 1, or a
                               causal attention's query_offset) */
    int masked;             /* a reset present: column 0 is its, and the [CLS] row where ... */
    int cls_row0;           /* ... local row 0 is the [CLS] row (query_offset 0) */
    size_t units;           /* the call's (b, h) units */
} term_grad_plan;

/* What a content-reading kind's rows keep for their backward (the fused attention's
 * backward forms a block's logits, then their gradient, on one thread): row r of a call
 * (row i0 + r) at data + r ld, the kind's content_keep(p) elements; range[2 r],
 * range[2 r + 1]: the keys [k0, cols) its content formed there ([0, 0), the engine's
 * setting before a block, where a row's tile sees no key and was not formed). */
typedef struct {
    REAL *data;
    size_t ld;
    size_t *range;
} term_keep;

/*
 * prepare: (optional, NULL) what the kind (k, its place in the list) reads for the whole
 *   call, built once (its map as runs, the buckets a causal attention reaches: call's
 *   reach) into *data; 0, or
 *   POSENC_ENOMEM; release frees it (and what a failed prepare left).
 * unit: what the forward's rows of unit (b, h) read, formed once per unit into
 *   t->unit_data (unit_scratch(p, kern, call) elements of REAL, a thread's; t->tag its
 *   number in the thread: what the data holds of an earlier unit, -1 at first).
 * rows: the term on rows [i0, i0 + rows) of the unit, keys [k0, cols), applied
 *   to P (row r at P + r ldp, key j at column j) with op (POSENC_SET or ADD);
 *   `unit` ran for the unit.  unit and rows read b only through the arrays'
 *   batch offsets: where no array has a batch axis the engine forms a head's
 *   rows once for every batch row (term_batch_free, forward_head_block).
 * grad_rows: rows [i0, i0 + rows) of the logits' gradient (row r at G + r ldg;
 *   zero outside keys [first, cols), which are all it may read) into the
 *   unit's gradients grad[a] (NULL: not wanted), zeroed when the unit began;
 *   called for a unit's rows in order, so that its sums have one order;
 *   scratch: the thread's grad_scratch(p, kern) doubles.
 * grad_block: (instead of grad_rows, NULL elsewhere) a kind whose gradient is a
 *   GEMM over a block of rows (TUPE's dense factor): rows [i0, i0 + rows) of a
 *   gradient S (row r at S + r lds, zero from key cols on and where `limits`
 *   skips, gemm_impl.h; the other kinds' grad_rows' G without an overriding
 *   kind's cells) into the REAL slots the engine keeps for its arrays (slot[a]:
 *   per_unit elements, NULL where not wanted; called for a unit's blocks in
 *   order, the first, i0 = 0, setting them); its arrays have no batch axis and
 *   its gradient is linear in S: the logits' backward hands it sum_b G[b, h] once
 *   per head, and the engine sums the slots over the batch, in order, into batch
 *   row 0's double gradients (terms_block_grads_reduce).
 * content: (a kind that reads the content logits, rows NULL; NULL elsewhere)
 *   rows [i0, i0 + rows) of the unit, keys [k0, cols): C holds their content
 *   logits s q.k (row r at C + r ldc, key j at column j), which the kind turns
 *   into the logits in place; q: the unit's q as the content read it (row i at
 *   q + i d); seen: which keys the rows see (NULL: the kind's own rule), keys
 *   outside [k0, cols) seen by none; `unit` ran for the unit; keep: NULL, or
 *   where the rows keep what their content_grad reads instead of recomputing it.
 * content_keep: the REAL elements a row keeps (term_keep).
 * expand_rows, expand, row_of: (optional, NULL) a kind whose row depends on its
 *   query only through a few values (DIET's segment): its expand_rows(p) distinct
 *   rows of the unit over every key formed by expand into X (row s at X + s m;
 *   `unit` ran for the unit), row i of the unit being row row_of(t, i) of them;
 *   the GEMM's epilogue then adds a row by pointer (forward_impl.h's `expanded`).
 * rows_at: (optional, NULL) a kind whose rows lie in its unit data as a strided
 *   block (a Toeplitz row: values along the offsets, row stride -1): row i0's key 0
 *   at the returned pointer, row i0 + r at + r * *ld; `unit` ran for the unit.  The
 *   GEMM's epilogue then reads them in place (forward_impl.h's `pointer`), and a
 *   product's backward its factor (term_<name>_factor 1: a kind whose rows are
 *   linear in its arrays, so that grad_rows of the effective gradient is its own).
 * overrides: 1 for a kind whose rows replace the other terms' sum on the row at
 *   position 0 (query_offset + i == 0) and on key 0 (TUPE's reset): the engine
 *   applies its rows (with op ADD: set its cells over the sum) after every
 *   other term, hands the other kinds' grad_rows G without these cells and its
 *   own the whole of G (it reads only them); 0 for the others.
 * scaled: 1 for a kind whose rows carry the problem's dense_scale (TUPE's dense
 *   factor): where the scales are not tame the engine's unit problem holds 1 there
 *   and the exact path applies the call's in double, to its rows and its gradients.
 * grad_bf16: 1 for a kind whose grad_rows reads G's bfloat16 twin t->g16 where it is not
 *   NULL (the logits' backward on a bfloat16 G, whose float32 values the engine then
 *   leaves unwritten: backward_g_rows), with the same sums as from G widened; 0 for the
 *   others (the engine widens G for them).
 * vector: 1 (q) or 2 (k) for a kind whose rows are vector_scale times dot products of
 *   one of the unit's inputs with a table (the vector tables: q_i . T[map(j - i)],
 *   k_j . T[...]), 0 for the others: its rows read q or k (never batch-free; its
 *   gradient goes to that input's), the exact path applies vector_scale (or s, which it
 *   shares) to them, and a product takes them as factors beside its one factor module.
 * content_row, fuses: (optional, NULL) with terms_call's fused (a decoding step of one row,
 *   fuses(p) true): row i's content logits s q_i . k_j, keys [c0, cols), into x, and the
 *   kind's term of the row (into its unit data: its rows then apply it) in one pass over k;
 *   pair: 2 d elements of scratch, x + ldx a row of scratch.
 * grad_prepare, grad_release, grad_unit_scratch, grad_begin, grad_sums, grad_end,
 *   grad_reduce: (optional, NULL) a kind whose gradients go through sums of its unit (the
 *   vector tables: G's entries summed into buckets, then GEMMs into dq or dk and its
 *   table).  grad_prepare builds what a backward call reads (*data NULL: the call wants
 *   none of its gradients: the rest are not called), grad_release frees it;
 *   grad_unit_scratch: the REAL elements of a thread's workspace (unit_data in the other
 *   hooks, t->grad its data); per unit: grad_begin, grad_sums for rows [i0, i0 + rows) of
 *   G (row r at G + r ldg, keys [0, cols); a product's effective gradient of the kind's
 *   factor), in order, the reset's cells left out by the kind (the plan's masked,
 *   cls_row0), then grad_end: x's gradient (q's, or k's for a kind that reads k) added
 *   into dx (NULL: not wanted; rows x d), its own into the kind's per-unit slots; after
 *   the units, grad_reduce phase 0: the slots into g's gradients, phase 1 (scales: the
 *   exact path's, else NULL) the scale the sums left out.
 * content_grad: its backward for rows [i0, i0 + rows) of the logits' gradient G
 *   (row r at G + r ldg, zero outside keys [first, cols)): into Gc (the same
 *   layout, keys [first, cols) written) the content logits' gradient, G plus its
 *   path through the term; into dq (row r at dq + r d, set) q's gradient through
 *   the term beside the content's; the term's own into grad[a] as grad_rows;
 *   q, k: the unit's (key j at k + j d), scale: the content's s; scratch: the
 *   thread's grad_scratch(p, kern) doubles; keep: NULL (the content logits recomputed
 *   from q and k), or what `content` kept of these rows (keep row r: row i0 + r).
 */
typedef struct {
    int (*prepare)(const posenc_problem *p, const terms_call *call, int k, void **data);
    void (*release)(void *data);
    void (*unit)(const term_unit *t);
    size_t (*unit_scratch)(const posenc_problem *p, const posenc_kernels *kern,
                           const terms_call *call);
    void (*rows)(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0, size_t rows,
                 size_t k0, size_t cols);
    void (*grad_rows)(const term_unit *t, double *const *grad, const REAL *G, size_t ldg,
                      size_t i0, size_t rows, size_t first, size_t cols, double *scratch);
    size_t (*grad_scratch)(const posenc_problem *p, const posenc_kernels *kern);
    void (*content)(const term_unit *t, const REAL *q, REAL *C, size_t ldc, size_t i0,
                    size_t rows, size_t k0, size_t cols, const term_seen *seen,
                    const term_keep *keep);
    void (*content_grad)(const term_unit *t, double *const *grad, const REAL *q, const REAL *k,
                         double scale, const REAL *G, REAL *Gc, size_t ldg, size_t i0,
                         size_t rows, size_t first, size_t cols, const term_seen *seen, REAL *dq,
                         double *scratch, const term_keep *keep);
    size_t (*content_keep)(const posenc_problem *p);
    size_t (*expand_rows)(const posenc_problem *p);
    void (*expand)(const term_unit *t, REAL *X);
    size_t (*row_of)(const term_unit *t, size_t i);
    const REAL *(*rows_at)(const term_unit *t, size_t i0, ptrdiff_t *ld);
    void (*grad_block)(const term_unit *t, REAL *const *slot, const REAL *S, size_t lds,
                       size_t i0, size_t rows, size_t cols, const block_limits *limits,
                       double *scratch);
    void (*content_row)(const term_unit *t, REAL *x, size_t ldx, REAL *pair, size_t i,
                        size_t c0, size_t cols);
    int (*fuses)(const posenc_problem *p);
    int (*grad_prepare)(const posenc_problem *p, const posenc_kernels *kern,
                        const terms_call *call, const term_grad_plan *plan, int k, void **data);
    void (*grad_release)(void *data);
    size_t (*grad_unit_scratch)(const posenc_problem *p, const posenc_kernels *kern,
                                const void *data);
    void (*grad_begin)(const term_unit *t);
    void (*grad_sums)(const term_unit *t, const REAL *G, size_t ldg, size_t i0, size_t rows,
                      size_t cols);
    void (*grad_end)(const term_unit *t, const REAL *x, REAL *dx);
    void (*grad_reduce)(const posenc_problem *p, const posenc_grads *g, void *data,
                        const call_scales *scales, int phase);
    int overrides;
    int factor;
    int scaled;
    int vector;
    int grad_bf16;
} term_kind;

/* Elements of REAL holding `bytes`, rounded up to 64 bytes: a kind's room in its unit data
 * for what is not REAL (runs, pieces). */
static inline size_t term_reals(size_t bytes)
{
    return posenc_round_up((bytes + sizeof(REAL) - 1) / sizeof(REAL), 64 / sizeof(REAL));
}

/* Row e of a block of G as a kind's grad_rows reads it (row e at G + e ldg): that row, or
 * where the engine handed the kind G's bfloat16 twin (t->g16: grad_bf16), its keys
 * [first, cols) widened into `wide` (m REAL of the kind's scratch, in L1). */
static inline const REAL *term_grad_row(const term_unit *t, const REAL *G, size_t ldg,
                                        size_t e, size_t first, size_t cols, REAL *wide)
{
#ifdef ENGINE_BF16_GEMM
    if (t->g16) {
        posenc_active_convert()->bf16_to_f32(wide + first, t->g16 + e * ldg + first,
                                             cols - first);
        return wide;
    }
#else
    (void)t, (void)first, (void)cols, (void)wide;
#endif
    return G + e * ldg;
}

#endif /* POSENC_ENGINE_TERM_UNIT_IMPL_H */
