/*
 * forward_impl.h -- the fused logits kernel, for one dtype (REAL, set by
 * engine_<dtype>.c).
 *
 * Per (b, h) unit and row tile of mr queries: build the positional rows P
 * of the tile (or point at them), then one register-tiled pass of the
 * content GEMM whose epilogue adds or multiplies P: each logit is written
 * once.  Positional terms that do not depend on b (the dense factor, the
 * scalar table, the reset: batch-free term modules) are computed once per
 * head into a head block when B > 1.
 */
#ifndef POSENC_ENGINE_FORWARD_IMPL_H
#define POSENC_ENGINE_FORWARD_IMPL_H

#include "gemm_impl.h"
#include "rope_impl.h"
#include "scales_impl.h"
#include "term_kinds_impl.h"

/* Dense terms are precomputed per head when they are reused over a batch
 * and the head block fits this budget per thread; otherwise per row tile. */
#define HEAD_BLOCK_BUDGET ((size_t)64 << 20)

typedef struct {
    const posenc_problem *p;  /* the call's problem, or scales.unit (forward_tile_exact) */
    const posenc_kernels *kern;
    call_scales scales;
    size_t m_pad;             /* m rounded up to nr */
    int head_blocks;          /* term modules' rows of a head precomputed in a head block */
    int module_blocks;        /* every term module's rows in the head block (batch-free) */
    int block_kinds;          /* head_blocks: the kinds [0, block_kinds) in the head block (every
                                 kind's with module_blocks, else the leading GEMM-formed ones:
                                 TUPE's dense factor in a decoding step, DIET-ABS's) */
    int modules_end;          /* the adding modules in P are among kinds [0, modules_end): all,
                                 or those before `expanded` (the last) */
    size_t out_heads;         /* units per batch row of out: H, or p->bf16_out_heads */
    size_t out_size;          /* bytes of an element of out: REAL's, or bfloat16's */
    int batch_terms;          /* a term module in P outside the head block present */
    int pointer;              /* the term module whose rows the epilogue reads where they lie
                                 (term_kind's rows_at: a Toeplitz row), the only term in P beside
                                 `expanded`, or -1 */
    int stream;               /* write the logits with non-temporal stores */
    int expanded;             /* the adding module whose rows the epilogue adds by pointer from
                                 its distinct rows (term_kind's expand; alone or beside `pointer`,
                                 no reset, sum mode, tame scales), or -1 */
    terms_call call;          /* the kinds' data for the call (terms_prepare: forward_prepare);
                                 call.direct: a decoding step's few rows, k read in place (no k
                                 panels) and the kinds' tables too; call.fused: the decoding
                                 path forms `content_row`'s term with the content logits */
    int content_row;          /* call.fused: the kind whose content_row it is, or -1 */
    int causal;               /* a causal attention's: a tile of rows [i0, i0 + rows) reads keys
                                 [0, query_offset + i0 + rows) only (attention_span) */
    int modules;              /* a term module present that adds rows (term_kinds_impl.h; in P
                                 unless it is `expanded`) */
    int content;              /* the kind of a term module that reads the content logits (cope),
                                 applied to each tile after its GEMM, or -1 */
    int units_batch_free;     /* the modules' unit data the same for every batch row
                                 (terms_units_batch_free): a thread forms it once per head */
    const term_seen *seen;    /* which keys the rows see, for `content`: a fused attention's
                                 masks, or NULL (the kind's own rule: the logits) */
} forward_ctx;

typedef struct {
    gemm_scratch scratch;
    unit_inputs inputs;       /* the unit's q and k as the terms read them (rope_impl.h) */
    REAL *k_pack;             /* content B: k^T panels, d x m_pad */
    REAL *P;                  /* positional rows of a tile, mr x m_pad */
    term_env env;             /* what the kinds read of the thread: its q and k the unit's */
    REAL *head_block;         /* per-head positional block, n x m (head_blocks) */
    REAL *expanded;           /* `expanded`'s distinct rows of the unit, m each */
    const REAL **expanded_row;   /* `expanded`: the tile's rows of them, mr pointers */
    double *exact;            /* scales.exact: a tile's logits and batch-free terms, 2 x mr x m_pad */
    REAL *term_unit;          /* modules, content: the unit's data of the term modules (terms_unit) */
    term_keep keep;           /* content, the fused attention's backward: where a block's rows keep
                                 what their gradient reads (keep.data NULL: nothing kept), its
                                 row 0 the unit's row keep_row0 */
    size_t keep_row0;
    ptrdiff_t cached_head_block;   /* the head held, or -1 */
    ptrdiff_t cached_term_unit;   /* units_batch_free: the head whose unit data term_unit holds
                                     (every batch row's), or -1 */
} forward_ws;

/* Whether a unit's q and k are read as values where the bfloat16 GEMM's problem gives
 * only their twins (engine_lp.c): by a content-reading kind, or by the decoding path
 * (call.direct: rows_dot, the kinds' direct rows), which has no GEMM; widened into the
 * workspace's q_rot, k_rot (unit_inputs_widen). */
static int forward_inputs_widened(const forward_ctx *c)
{
    return c->kern->bf16 && (c->content >= 0 || c->call.direct);
}

/* The workspace of one thread: its size in elements; carved into w when w != NULL. */
static size_t forward_ws_layout(const forward_ctx *c, forward_ws *w, REAL *mem)
{
    const posenc_problem *p = c->p;
    const size_t mr = c->kern->mr, nr = c->kern->nr;
    size_t at = 0;
    if (w) {
        memset(w, 0, sizeof *w);
        gemm_scratch_carve(&w->scratch, mem, c->kern, c->p);
        w->env = term_env_of(c->p, c->kern, &w->scratch, &c->call);
        w->cached_head_block = w->cached_term_unit = -1;
    }
    at += posenc_round_up(gemm_scratch_size(c->kern), 16);
    if (!c->call.direct)
        WS_TAKE(w, mem, at, k_pack, packed_b_size(p->d, p->m, nr));
    WS_TAKE(w, mem, at, P, mr * c->m_pad);
    if (unit_inputs_copied(p, forward_inputs_widened(c))) {
        WS_TAKE(w, mem, at, inputs.q_rot, p->n * p->d);
        WS_TAKE(w, mem, at, inputs.k_rot, p->m * p->d);
    }
    if (c->head_blocks)
        WS_TAKE(w, mem, at, head_block, p->n * p->m);
    if (c->expanded >= 0) {
        WS_TAKE(w, mem, at, expanded, terms_expand_rows(p, c->expanded) * p->m);
        WS_TAKE(w, mem, at, expanded_row, (mr * sizeof(const REAL *) + sizeof(REAL) - 1) / sizeof(REAL));
    }
    if (c->scales.exact)
        WS_TAKE(w, mem, at, exact, 2 * mr * c->m_pad * (sizeof(double) / sizeof(REAL)));
    if (c->modules || c->content >= 0)
        WS_TAKE(w, mem, at, term_unit, terms_unit_scratch(p, c->kern, &c->call, POSENC_TERM_COUNT));
    return posenc_round_up(at, POSENC_ALIGN / sizeof(REAL));
}

/*
 * The head block of head h: the rows of the term modules [0, block_kinds) (every one with
 * module_blocks: TUPE's dense factor, table and reset over them; else the leading GEMM-formed
 * ones), the batch-free terms.  Under a causal attention only what its tiles read, row tile
 * by row tile of mr: a tile holding row i (starting at or before i, at most mr rows) reads
 * keys up to query_offset + i + mr, whatever its start (the backward's row blocks start off
 * the forward's grid).  Each element is computed as in the whole block.
 */
static void forward_head_block(const forward_ctx *c, forward_ws *w, size_t h)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t n = p->n, m = p->m, step = c->causal ? kern->mr : n;
    terms_unit(p, kern, &w->env, 0, c->block_kinds, 0, h, w->term_unit);   /* batch row 0's
                                                                              stands for all */
    w->cached_term_unit = -1;
    for (size_t i0 = 0; i0 < n; i0 += step) {
        const size_t rows = posenc_min(step, n - i0);
        const size_t cols = c->causal ? posenc_min(m, p->query_offset + i0 + rows + kern->mr) : m;
        terms_rows(p, kern, &w->env, TERMS_EVERY, 0, c->block_kinds, POSENC_SET,
                   w->head_block + i0 * m, m, 0, h, i0, rows, 0, cols, w->term_unit);
    }
    w->cached_head_block = (ptrdiff_t)h;
}

/*
 * Head blocks (forward_head_block, n x m per thread) where B > 1, the scales are tame and a
 * block fits `budget` bytes: of the leading adding kinds whose rows are batch-free
 * (terms_batch_free_prefix: with `modules`, every one of them, TUPE's dense factor, table and
 * reset; else those whose rows are a GEMM: TUPE's dense factor in a decoding step, DIET-ABS's
 * beside its segments).  The tiles add the kinds after them (a vector table's term, a module
 * with a batch axis) to the block's rows, or, where the block holds every term in P
 * (module_blocks), read its rows in place.
 */
static void forward_plan_blocks(forward_ctx *c, size_t budget, int modules)
{
    const posenc_problem *p = c->p;
    const int fits = p->B > 1 && !c->scales.exact && !p->product &&
                     posenc_mul_size(p->n * p->m, sizeof(REAL)) <= budget;
    c->modules_end = c->expanded >= 0 ? c->expanded : POSENC_TERM_COUNT;
    const int in_p = c->pointer < 0 && terms_adding_in(p, 0, c->modules_end);   /* rows in P */
    c->block_kinds = fits && in_p ? posenc_min(terms_batch_free_prefix(p, !modules), c->modules_end)
                                  : 0;
    c->head_blocks = c->block_kinds > 0;
    c->batch_terms = in_p && terms_adding_in(p, c->block_kinds, c->modules_end);
    c->module_blocks = c->head_blocks && !c->batch_terms && c->expanded < 0;
}

/*
 * The positional rows of tile [i0, i0 + rows) of unit (b, h), keys [k0, cols) (the
 * tiles: k0 = 0; a decoding step's split keys: its chunk's; entries before k0 may
 * be left unwritten, or written: TUPE's dense term is computed from key 0): returns the
 * block P (row r at *P + r * *ldp, key j at column j), or NULL when there is none.
 */
static const REAL *forward_positional(const forward_ctx *c, forward_ws *w, size_t b, size_t h,
                                      const REAL *q_u, size_t i0, size_t rows, size_t k0,
                                      size_t cols, ptrdiff_t *ldp)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t m = p->m, ld = c->m_pad;
    int op = POSENC_SET;

    if (c->head_blocks && !c->batch_terms) {
        *ldp = (ptrdiff_t)m;
        return w->head_block + i0 * m;
    }
    if (c->pointer >= 0)   /* a Toeplitz row: stride -1 */
        return term_rows_at(p, kern, &w->env, c->pointer, b, h, i0, w->term_unit, ldp);
    if (c->head_blocks) {   /* the leading kinds' rows (TUPE's dense factor) */
        for (size_t r = 0; r < rows; ++r)
            kern->row_gather(POSENC_SET, w->P + r * ld + k0, w->head_block + (i0 + r) * m + k0, 1,
                             cols - k0);
        op = p->product ? POSENC_MUL : POSENC_ADD;
    }
    /* the term modules (csrc/terms.h) not in the head block nor `expanded`, in the list's
     * order (a product's factor module, then the vector tables), an overriding one last */
    if (c->modules && !c->module_blocks) {
        const int from = c->head_blocks ? c->block_kinds : 0, to = c->modules_end;
        w->env.q = q_u;
        op = terms_rows(p, kern, &w->env, TERMS_ADDING, from, to, op, w->P, ld, b, h, i0, rows,
                        k0, cols, w->term_unit);
        op = terms_rows(p, kern, &w->env, TERMS_OVERRIDING, from, to, op, w->P, ld, b, h, i0,
                        rows, k0, cols, w->term_unit);
    }
    if (op == POSENC_SET)
        return NULL; /* content only */
    *ldp = (ptrdiff_t)ld;
    return w->P;
}

/* What unit (b, h) needs before its row tiles [r0, r1): its inputs (q's
 * rows [r0, r1), k: w->inputs), the head block, s k^T packed into k_packed
 * (the content scale rides on the packed keys; without pack_keys its shape
 * only, the caller packs the panels), the term modules' unit data (the key
 * table's projections) and expanded rows. */
static void forward_unit_setup(const forward_ctx *c, forward_ws *w, size_t b, size_t h, size_t r0,
                               size_t r1, packed_b *k_packed, int pack_keys)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t m = p->m, d = p->d;
    unit_inputs_at(p, &w->scratch, &w->inputs, b, h, r0, r1);
    if (forward_inputs_widened(c))
        unit_inputs_widen(&w->scratch, &w->inputs, p->n, m, d, r0, r1);
    const REAL *k_u = w->inputs.k;
    w->env.q = w->inputs.q;
    w->env.k = k_u;

    if (c->head_blocks && w->cached_head_block != (ptrdiff_t)h)
        forward_head_block(c, w, h);
    if (pack_keys)
        pack_b(kern, &w->scratch, k_packed, w->k_pack, k_u, 1, (ptrdiff_t)d, d, m, (REAL)p->scale);
    else   /* the caller packs k's panels as its tiles reach them (causal_keys_reach) */
        *k_packed = packed_b_shape(kern, w->k_pack, d, m, (REAL)p->scale);
    if (((c->modules && !c->module_blocks) || c->content >= 0) &&
        !(c->units_batch_free && w->cached_term_unit == (ptrdiff_t)h)) {
        /* the kinds a head block holds are read there: their unit data is not formed */
        terms_unit(p, kern, &w->env, c->head_blocks ? c->block_kinds : 0, POSENC_TERM_COUNT, b, h,
                   w->term_unit);
        w->cached_term_unit = c->units_batch_free ? (ptrdiff_t)h : -1;
    }
    if (c->expanded >= 0)
        terms_expand(p, kern, &w->env, c->expanded, b, h, w->term_unit, w->expanded);
}

/* X[r * cols + j] (op) factor P[r * ld + j], r < rows, j < cols, in double (op ADD or MUL). */
static void exact_apply(int op, double *X, double factor, const REAL *P, size_t ld, size_t rows,
                        size_t cols)
{
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j) {
            const double term = factor * (double)P[r * ld + j];
            X[r * cols + j] = op == POSENC_MUL ? X[r * cols + j] * term : X[r * cols + j] + term;
        }
}

/* The rows of w's keep from the unit's row i0 on, in *at; NULL where nothing is kept. */
static const term_keep *forward_keep(const forward_ws *w, size_t i0, term_keep *at)
{
    if (!w->keep.data)
        return NULL;
    *at = w->keep;
    at->data += (i0 - w->keep_row0) * at->ld;
    at->range += 2 * (i0 - w->keep_row0);
    return at;
}

static void exact_scale_by(double *X, double scale, size_t count)
{
    for (size_t t = 0; t < count; ++t)
        X[t] *= scale;
}

/* The adding term modules of unit (b, h) that are vector kinds (vectors 1: the vector
 * tables) or not (0) one at a time into X (rows x cols, in double) with op (ADD, or MUL: a
 * product's factor), in the list's order, through w->P (unscaled: c->p is the unit
 * problem): a vector kind's rows times vs, a `scaled` kind's times the call's dense scale. */
static void exact_modules(const forward_ctx *c, forward_ws *w, int op, double *X, int vectors,
                          double vs, size_t b, size_t h, size_t i0, size_t rows, size_t cols)
{
    const posenc_problem *p = c->p;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_adds(p, k) && term_taken(k, TERMS_ADDING) &&
            (term_kinds[k].vector != 0) == vectors) {
            term_rows(p, c->kern, &w->env, k, POSENC_SET, w->P, c->m_pad, b, h, i0, rows, 0,
                      cols, w->term_unit);
            exact_apply(op, X, vectors ? vs : term_kinds[k].scaled ? c->scales.dense_scale : 1,
                        w->P, c->m_pad, rows, cols);
        }
}

/*
 * forward_tile when a scale is not tame (scale = inf, 1e308, ...): every
 * term computed unscaled (c->p has unit scales), then scaled and combined
 * in double in the reference's order, so that the IEEE results are its:
 *   sum:      s q.k + vs (query term + key term) + ds dense + module + module ...,
 *             as s (q.k + query term + key term) + ... when vs = s (Shaw, M4, DeBERTa);
 *             with a reset: ... + reset(ds dense + module + ...) (TUPE: its table)
 *   product:  ((s q.k) module) (vs query term)) (vs key term)  (M2: the module its table)
 */
static void forward_tile_exact(const forward_ctx *c, forward_ws *w, size_t b, size_t h,
                               const packed_b *k_packed, size_t i0, size_t rows, size_t cols,
                               REAL *C, ptrdiff_t ldc)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t d = p->d, ld = c->m_pad, count = rows * cols;
    const REAL *q_u = w->inputs.q;
    /* the vector terms go inside s (q.k + ...) when they share its scale */
    const int inside = !p->product && c->scales.vector_scale == c->scales.scale;
    double *X = w->exact, *V = w->exact + count;
    REAL *P = w->P;
    packed_b keys = *k_packed;
    keys.N = cols;
    gemm_packed(kern, &w->scratch, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &keys, C, ldc, 0, NULL, 0,
                NULL, 0, NULL);
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j)
            X[r * cols + j] = (double)C[(ptrdiff_t)r * ldc + (ptrdiff_t)j];
    if (!inside)
        exact_scale_by(X, c->scales.scale, count);
    if (p->product)   /* the module factor first (M2's table) */
        exact_modules(c, w, POSENC_MUL, X, 0, 1, b, h, i0, rows, cols);
    /* the vector terms: into X (product, or inside s), else vs (...) into V */
    double *vector_sum = p->product || inside ? X : V;
    const double vs = p->product || inside ? 1 : c->scales.vector_scale;
    if (vector_sum == V && posenc_terms_vector(p))
        memset(V, 0, sizeof(double) * count);
    exact_modules(c, w, p->product ? POSENC_MUL : POSENC_ADD, vector_sum, 1, vs, b, h, i0, rows,
                  cols);
    if (p->product) {
        /* done: ((s q.k) module) query term) key term */
    } else {
        if (inside)
            exact_scale_by(X, c->scales.scale, count);
        else if (posenc_terms_vector(p))
            for (size_t t = 0; t < count; ++t)
                X[t] += V[t];
        const int reset = terms_override_kind(p);
        if (reset >= 0) {   /* the batch-free terms, TUPE's v: the modules (its dense factor and
                             * table), then the reset's cells over v (TUPE eq. (9)) */
            memset(V, 0, sizeof(double) * count);
            exact_modules(c, w, POSENC_ADD, V, 0, 1, b, h, i0, rows, cols);
            terms_rows(p, kern, &w->env, TERMS_OVERRIDING, 0, POSENC_TERM_COUNT, POSENC_SET, P,
                       ld, b, h, i0, rows, 0, cols, w->term_unit);
            for (size_t r = 0; r < rows && cols > 0; ++r) {
                const int cls = p->query_offset + i0 + r == 0;
                for (size_t j = 0; j < (cls ? cols : 1); ++j)
                    V[r * cols + j] = (double)P[r * ld + j];
            }
            for (size_t t = 0; t < count; ++t)
                X[t] += V[t];
        } else {
            exact_modules(c, w, POSENC_ADD, X, 0, 1, b, h, i0, rows, cols);
        }
    }
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j)
            C[(ptrdiff_t)r * ldc + (ptrdiff_t)j] = (REAL)X[r * cols + j];
    term_keep keep;
    if (c->content >= 0)   /* the content logits s q.k, rounded once */
        terms_content(p, kern, &w->env, c->content, b, h, q_u, C, (size_t)ldc, i0, rows, 0,
                      cols, c->seen, w->term_unit, forward_keep(w, i0, &keep));
}

/*
 * The logits of rows [i0, i0 + rows) and keys [first, cols) of unit (b, h)
 * into C (row r at C + r ldc, key j at column j).  first: 0, or (a fused
 * attention whose rows see no key before it) a multiple of k_packed's nr
 * with k_packed in one depth block (d <= kc) and a tame scale; the
 * positional rows are then formed from key 0 on where a term has no
 * shortcut (forward_positional) and read from `first` on.
 */
static void forward_tile(const forward_ctx *c, forward_ws *w, size_t b, size_t h,
                         const packed_b *k_packed, size_t i0, size_t rows, size_t first,
                         size_t cols, REAL *C, ptrdiff_t ldc)
{
    if (c->scales.exact) {
        forward_tile_exact(c, w, b, h, k_packed, i0, rows, cols, C, ldc);
        return;
    }
    const posenc_problem *p = c->p;
    const size_t n = p->n, d = p->d;
    const REAL *q_u = w->inputs.q;
    ptrdiff_t ldp = 0;
    const REAL *P = forward_positional(c, w, b, h, q_u, i0, rows, 0, cols, &ldp);
    int flags = (P ? (p->product ? POSENC_UKR_MUL_P : POSENC_UKR_ADD_P) : 0) |
                (c->stream ? POSENC_UKR_STREAM : 0) |
                (c->out_size != sizeof(REAL) ? POSENC_UKR_BF16_OUT : 0);
    if (c->expanded >= 0) {
        terms_expanded_rows(p, c->kern, &w->env, c->expanded, b, h, w->expanded, i0, rows,
                            first, w->expanded_row);
        flags |= POSENC_UKR_ADD_ROWS;
    }
    if (i0 + rows < n)   /* the next tile's rows of q, which the microkernel reads in place */
        gemm_prefetch(&w->scratch, q_u + (i0 + rows) * d,
                      (posenc_min(n, i0 + 2 * rows) - i0 - rows) * d);
    packed_b keys = *k_packed;
    if (first)
        packed_b_skip(&keys, first);
    keys.N = cols - first;   /* the columns [first, cols) of the packed panels */
    gemm_packed(c->kern, &w->scratch, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &keys, C + first, ldc,
                0, P ? P + first : NULL, ldp, c->expanded >= 0 ? w->expanded_row : NULL, flags, NULL);
    term_keep keep;
    if (c->content >= 0)   /* a term that reads the content logits: after them */
        terms_content(p, c->kern, &w->env, c->content, b, h, q_u, C, (size_t)ldc, i0, rows,
                      first, cols, c->seen, w->term_unit, forward_keep(w, i0, &keep));
}

/* Rows [r0, r1) of unit (b, h). */
static void forward_unit(const forward_ctx *c, forward_ws *w, size_t b, size_t h, size_t r0,
                         size_t r1, REAL *out)
{
    const size_t m = c->p->m, mr = c->kern->mr;
    char *out_u = (char *)out + (b * c->out_heads + h) * c->p->n * m * c->out_size;
    packed_b k_packed;
    forward_unit_setup(c, w, b, h, r0, r1, &k_packed, 1);
    for (size_t i0 = r0; i0 < r1; i0 += mr)
        forward_tile(c, w, b, h, &k_packed, i0, posenc_min(mr, r1 - i0), 0, m,
                     (REAL *)(void *)(out_u + i0 * m * c->out_size), (ptrdiff_t)m);
}

/* c for p (out: the logits, for the stream decision; NULL: the attention's), causal: a causal
 * attention's tiles (attention_span; the kinds' data reach only the offsets they read).
 * POSENC_OK or ENOMEM (forward_release frees what was built either way). */
static int forward_prepare(forward_ctx *c, const posenc_problem *p, const posenc_kernels *kern,
                           const void *out, int causal)
{
    const size_t n = p->n, m = p->m;
    memset(c, 0, sizeof *c);
    c->p = call_scales_init(&c->scales, p);
    c->kern = kern;
    c->m_pad = posenc_round_up(posenc_max(m, 1), kern->nr);
    c->modules = terms_additive(p);
    /* a module's rows read where they lie (a Toeplitz row), and a module's distinct rows on
     * the epilogue's second source, where no other term needs P */
    terms_in_place(p, !c->scales.exact && !p->product, &c->pointer, &c->expanded);
    c->content = terms_content_kind(p);
    c->units_batch_free = terms_units_batch_free(p);
    forward_plan_blocks(c, HEAD_BLOCK_BUDGET, 1);
    c->out_heads = p->bf16_out_heads ? p->bf16_out_heads : p->H;
    c->out_size = p->bf16_out_heads ? sizeof(uint16_t) : sizeof(REAL);
    c->stream = posenc_stream_logits(out, p->B * p->H * n, m, c->out_size) && !c->scales.exact &&
                c->content < 0;   /* a content-reading term reads the tile back */
    c->causal = causal;
    c->content_row = -1;
    /* a causal tile's last row reads the offsets up to query_offset + mr - 1 (at most m - 1) */
    c->call.reach = causal && n && m ? (ptrdiff_t)(n - 1 + posenc_min(m - 1, p->query_offset + kern->mr - 1))
                           : -1;
    return terms_prepare(p, &c->call);
}

static void forward_release(forward_ctx *c)
{
    terms_release(&c->call);
}

/* Work items: units, each split into row chunks when units are fewer than
 * threads.  Forward values do not depend on the split. */
typedef struct {
    const forward_ctx *c;
    size_t items, chunks, rows_per_chunk;
    REAL *out;
} forward_work;

/* One thread's part of the work (posenc_run_team). */
static void forward_team(void *arg, void *ws)
{
    const forward_work *fw = (const forward_work *)arg;
    const forward_ctx *c = fw->c;
    const posenc_problem *p = c->p;
    forward_ws w;
    forward_ws_layout(c, &w, (REAL *)ws);
#pragma omp for schedule(static)
    for (ptrdiff_t item = 0; item < (ptrdiff_t)fw->items; ++item) {
        /* head-major order: consecutive items share a head's block */
        const size_t unit = (size_t)item / fw->chunks, chunk = (size_t)item % fw->chunks;
        const size_t h = unit / p->B, b = unit % p->B;
        const size_t r0 = chunk * fw->rows_per_chunk;
        forward_unit(c, &w, b, h, r0, posenc_min(p->n, r0 + fw->rows_per_chunk), fw->out);
    }
    if (c->stream)
        c->kern->store_fence();
}

static int forward(const posenc_problem *p, void *out, int num_threads)
{
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0)
        return POSENC_OK;
    const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
    forward_ctx c;
    int status = forward_prepare(&c, p, posenc_engine_kernels(p, REAL_DTYPE), out, 0);
    /* bfloat16 out: the microkernel's one store, in one depth block, of the tiles
     * forward_tile (not forward_tile_exact) computes, which no term reads back */
    if (status == POSENC_OK && p->bf16_out_heads &&
        (!c.kern->bf16 || c.scales.exact || p->d > c.kern->kc || c.content >= 0))
        status = -1;
    if (status == POSENC_OK) {
        const size_t rows = posenc_rows_per_item(BH, p->n, c.kern->mr, threads);
        const size_t chunks = (p->n + rows - 1) / rows;
        forward_work work = {&c, BH * chunks, chunks, rows, (REAL *)out};
        status = posenc_run_team(posenc_team(threads, work.items, p),
                                 forward_ws_layout(&c, NULL, NULL) * sizeof(REAL), forward_team,
                                 &work);
    }
    forward_release(&c);
    return status;
}

#endif /* POSENC_ENGINE_FORWARD_IMPL_H */
