/*
 * backward_rows_impl.h -- the backward's context and workspace (backward_ctx,
 * backward_ws) and its rows, for one dtype (REAL, set by engine_<dtype>.c):
 * G scattered into the bucket matrices Gq and Gk along their diagonals, the
 * positional gradients of one row, a ranged block's limits.  The parts of
 * the backward (backward_vectors_impl.h, backward_product_impl.h,
 * backward_slots_impl.h) and its flow (backward_impl.h) build on these.
 */
#ifndef POSENC_ENGINE_BACKWARD_ROWS_IMPL_H
#define POSENC_ENGINE_BACKWARD_ROWS_IMPL_H

#include "gemm_impl.h"
#include "rope_impl.h"
#include "terms_impl.h"
#include "term_vectors_impl.h"
#include "term_kinds_impl.h"

typedef struct {
    const posenc_problem *p;    /* the call's problem, or scales.unit: every sum unscaled,
                                   scaled after (exact_content_grad, exact_scale_rows) */
    const posenc_kernels *kern;
    const posenc_grads *g;
    call_scales scales;
    const REAL *G;
    size_t m_pad, row_block;
    int masked;                 /* a reset (an overriding term module, TUPE's theta) present:
                                   the [CLS] row and column 0 belong to it */
    int cls_row0;               /* masked and query_offset 0: local row 0 is the [CLS] row */
    int need_content;           /* dq or dk: the GEMMs through Gc */
    int need_query_side;        /* Gq: for dq or the query table's gradient */
    int need_key_side;          /* Gk: for dk or the key table's gradient */
    int need_modules;           /* a term module's gradient by rows (term_kinds_impl.h) */
    int need_blocks;            /* a term module's gradient by blocks (term_kind's grad_block:
                                   TUPE's dense factor; the logits' in phase 2) */
    int content;                /* the kind of a term module that reads the content logits
                                   (cope), whose path dq, dk and its own gradients take, or -1 */
    const term_seen *seen;      /* which keys the rows see, for `content`: a fused attention's
                                   masks, or NULL (the kind's own rule) */
    int reads_g;                /* the positional gradients read G itself (not only the GEMMs) */
    int unit_reads_g;           /* ... in phase 1, beyond the reset's [CLS] row and column 0 */
    terms_call own_terms;       /* built by backward_prepare unless given one */
    const terms_call *terms;    /* what the kinds read: own_terms, or the attention's logits' */
    const vector_call *query, *key;   /* the vector tables' (table NULL: absent) */
    posenc_spans query_spans, key_spans;   /* where Gq and Gk are zero */
    REAL *query_table_slots, *key_table_slots;
    /* need_blocks: the REAL slots of the modules whose gradient goes by blocks (per unit in
     * the fused attention, per head in the logits' backward: terms_grad_blocks) */
    REAL *block_slots[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX];
    const struct masked_keys *masked_keys;   /* a fused attention's, or NULL */
} backward_ctx;

/*
 * A fused attention's masked keys, which no gradient may read (SPEC §6: dS is 0
 * there, its k may be NaN).  dq = dS.k: the packed k's rows of keys masked for every
 * row zeroed (zero_keys: keys [from, to) of batch row b, packed from key `first`), and
 * a tile of rows whose masked keys hold an Inf or NaN redone row by row over the keys
 * each row sees (rows: 1 when it did so).  The factors and the key-side bucket sums,
 * where a key some row of batch row b does not see holds an Inf or NaN in k
 * (unread_nonfinite, over those keys only): row i's keys [0, cols) that it does not
 * see set to 0 in a row x (unseen_zero).  Set by attention_backward (attention_backward_impl.h).
 */
typedef struct masked_keys {
    const void *attention;
    void (*zero_keys)(const void *attention, const packed_b *pb, size_t b, size_t first);
    int (*rows)(const void *attention, gemm_scratch *s, const packed_b *pb, const REAL *G,
                size_t ldg, REAL *dq, size_t ldq, size_t b, size_t i0, size_t rows, size_t first,
                size_t c1, const REAL *k);
    int (*unread_nonfinite)(const void *attention, size_t b, const REAL *k);
    void (*unseen_zero)(const void *attention, REAL *x, size_t b, size_t i, size_t cols);
} masked_keys;

typedef struct {
    gemm_scratch scratch;
    unit_inputs inputs;       /* the unit's q and k as the logits read them (rope_impl.h) */
    REAL *dk_unit;            /* grouped-query attention: a unit's dk, m x d, before it is added
                                 into its key head's (backward_unit_dk) */
    REAL *b_pack;             /* packed B of the backward gemms */
    REAL *query_side;         /* Gq: n x the query map's buckets */
    REAL *key_side;           /* Gk: m x the key map's buckets */
    REAL *reach;              /* the buckets one row of Gq or Gk reaches (vector_table_exact) */
    REAL *vector_grad;        /* scales.exact: X.table of a unit, max(n, m) x d */
    REAL *x_wide;             /* q or k of a unit widened from its twin (x_all_finite) */
    /* product mode (backward_product_impl.h) */
    REAL *k_pack, *content, *query_factor, *key_factor, *query_proj, *query_table_pack;
    REAL *key_proj, *key_table_pack, *key_tile_grad, *content_grad, *row_grad;
    REAL *term_unit;          /* the module factor's unit data (terms_unit) */
    REAL *module_grad;        /* the module factor's effective gradient of a tile, mr x m_pad */
    /* phase 2: S_h, a row block of it */
    REAL *grad_sum;
    REAL *g_block;            /* a row block of G widened from its twin (backward_g_rows) */
    /* Gk's edge columns (scatter_key_side): keys [lo_first, lo_end) of the low
     * edge's column and [hi_first, hi_end) of the high edge's held contiguous */
    REAL *key_edge_sums;      /* 2 x m: the low edge's keys, then the high one's */
    REAL *term_scratch;       /* the term modules' gradient rows: terms_grad_scratch doubles */
    REAL *term_grad;          /* content: a row block's content gradient Gc, row_block x m */
    REAL *term_dq;            /* content: a row block's dq through the term, row_block x d */
    term_keep keep;           /* content, the fused attention's: what a row block's logits kept
                                 (forward_keep), row_block rows */
    size_t lo_first, lo_end, hi_first, hi_end;
    ptrdiff_t cached_query_table;
    term_env env;             /* what the kinds read of the thread (term_kinds_impl.h) */
    int k_unread;             /* a masked key of the unit holds an Inf or NaN in k (masked_keys):
                                 the product's factors zeroed where a row does not see a key */
} backward_ws;

/*
 * G row i (columns [jb, m)) scattered into its query-side buckets:
 * Gq[i, bucket], run by run.  Short runs (log buckets: a few keys per
 * bucket) are summed in place rather than through the ISA's row kernel,
 * whose setup would dominate them.
 */
static void scatter_query_side(const posenc_kernels *kern, const posenc_runs *runs,
                               REAL *side_row, const REAL *src, ptrdiff_t i, ptrdiff_t jb,
                               ptrdiff_t m)
{
    ptrdiff_t js, je, bs;
    for (size_t t = posenc_runs_seek(runs, jb - i);
         t < runs->count && posenc_run_span(&runs->runs[t], i, jb, m, &js, &je, &bs); ++t) {
        REAL *dst = side_row + (bs - runs->b_min);
        const ptrdiff_t step = runs->runs[t].step;
        if (je - js > 16) {
            kern->row_scatter_add(dst, step, src + js, (size_t)(je - js));
        } else if (step == 0) {
            REAL sum = src[js];
            for (ptrdiff_t j = js + 1; j < je; ++j)
                sum += src[j];
            *dst += sum;
        } else {
            for (ptrdiff_t j = js; j < je; ++j, dst += step)
                *dst += src[j];
        }
    }
}

/* An edge column of Gk (side's column `bucket`) and its keys held
 * contiguous in `sums`: keys [from, to) moved in (sums = side) or out. */
static void key_edge_move(const posenc_kernels *kern, REAL *side, size_t ld_side, size_t bucket,
                          REAL *sums, size_t from, size_t to, int in)
{
    if (from >= to)
        return;
    if (in)
        kern->row_gather(POSENC_SET, sums + from, side + from * ld_side + bucket,
                         (ptrdiff_t)ld_side, to - from);
    else   /* set, not added: the sums began from side's entries (row_scatter_add only adds) */
        for (size_t j = from; j < to; ++j)
            side[j * ld_side + bucket] = sums[j];
}

/*
 * Rows [i0, i0 + rows) of an effective gradient (row r at src + r * ld_src)
 * scattered into their key-side buckets: Gk[j, map(j - i)] += src[r, j] (the
 * ISA's tile scatter, the adjoint of term_key_table).  Columns < jb and rows
 * below r0 belong to theta; keys [0, cols).  A bucket's sum runs
 * over i in order.  Keys in an edge of the map (key_edges) for every row go
 * to its column held contiguous (w->key_edge_sums: taken from Gk when a key
 * enters the edge, put back when it leaves or the unit ends,
 * scatter_key_edges_end), by row operations: the same sums in the same order.
 */
static void scatter_key_rows(const backward_ctx *c, backward_ws *w, const REAL *src,
                             size_t ld_src, size_t cols, size_t i0, size_t rows, size_t jb,
                             size_t r0)
{
    const posenc_kernels *kern = c->kern;
    const posenc_problem *p = c->p;
    const size_t ld_side = c->key->buckets, m = p->m;
    size_t lo = jb, hi = cols;
    if (w->key_edge_sums && rows > r0) {
        const key_edges *e = &c->key->edges;
        REAL *lo_sums = w->key_edge_sums, *hi_sums = lo_sums + m;
        key_edges_split(e, i0 + r0, rows - r0, cols, &lo, &hi);
        lo = posenc_max(lo, jb);
        hi = posenc_max(hi, lo);
        /* the edges only grow (lo) and move right (hi) as i0 does: keys below
         * hi leave the high edge, keys up to lo and up to cols enter them */
        key_edge_move(kern, w->key_side, ld_side, e->hi, hi_sums, w->hi_first,
                      posenc_min(w->hi_end, hi), 0);
        w->hi_first = posenc_max(w->hi_first, hi);
        if (lo > jb) {
            if (w->lo_end == 0)   /* the first keys: from jb on (column 0 may be theta's) */
                w->lo_first = w->lo_end = jb;
            key_edge_move(kern, w->key_side, ld_side, e->lo, lo_sums, w->lo_end, lo, 1);
            w->lo_end = posenc_max(w->lo_end, lo);
            for (size_t r = r0; r < rows; ++r)
                kern->row_gather(POSENC_ADD, lo_sums + jb, src + r * ld_src + jb, 1, lo - jb);
        }
        if (hi < cols) {
            const size_t from = posenc_max(w->hi_end, hi);
            key_edge_move(kern, w->key_side, ld_side, e->hi, hi_sums, from, cols, 1);
            w->hi_end = posenc_max(w->hi_end, cols);
            for (size_t r = r0; r < rows; ++r)
                kern->row_gather(POSENC_ADD, hi_sums + hi, src + r * ld_src + hi, 1, cols - hi);
        }
    }
    for (size_t j0 = lo; j0 < hi; j0 += kern->key_block)
        kern->tile_scatter_key(w->key_side, ld_side, c->key->table.map + (p->n - 1 - i0),
                               c->key->runs.b_min, src, ld_src, j0,
                               posenc_min(j0 + kern->key_block, hi), r0, rows);
}

/* scatter_key_rows over rows [i0, i0 + rows) (row 0 skipped with skip_row0):
 * at once, or with edges in tiles of mr rows, whose keys outside the edges
 * are mr + 2 t wide (a clipped map's), where a block's would be rows + 2 t. */
static void scatter_key_side(const backward_ctx *c, backward_ws *w, const REAL *src,
                             size_t ld_src, size_t cols, size_t i0, size_t rows, size_t jb,
                             int skip_row0)
{
    const size_t r0 = (skip_row0 && i0 == 0) ? 1 : 0;
    const size_t step = w->key_edge_sums ? c->kern->mr : posenc_max(rows, 1);
    for (size_t t0 = 0; t0 < rows; t0 += step)
        scatter_key_rows(c, w, src + t0 * ld_src, ld_src, cols, i0 + t0,
                         posenc_min(step, rows - t0), jb, t0 == 0 ? r0 : 0);
}

/* The unit's edge columns put back into Gk (before its GEMMs read it), and
 * the edges emptied for the next unit. */
static void scatter_key_edges_end(const backward_ctx *c, backward_ws *w)
{
    if (!w->key_edge_sums)
        return;
    const size_t m = c->p->m;
    key_edge_move(c->kern, w->key_side, c->key->buckets, c->key->edges.lo, w->key_edge_sums,
                  w->lo_first, w->lo_end, 0);
    key_edge_move(c->kern, w->key_side, c->key->buckets, c->key->edges.hi, w->key_edge_sums + m,
                  w->hi_first, w->hi_end, 0);
    w->lo_first = w->lo_end = w->hi_first = w->hi_end = 0;
}

/* Row i of an effective gradient for the query table (keys [0, cols): m, or those a causal
 * block sees, 0 past them) scattered into its buckets, Gq. */
static void backward_row_query_side(const backward_ctx *c, backward_ws *w, size_t i,
                                    const REAL *grad, size_t cols)
{
    const ptrdiff_t jb = c->masked ? 1 : 0;   /* column 0 belongs to the reset */
    scatter_query_side(c->kern, &c->query->runs, w->query_side + i * c->query->buckets,
                       grad, (ptrdiff_t)i, jb, (ptrdiff_t)cols);
}

/* Tiles of mr rows in a block up to which dq's GEMM starts at `first` (its limits
 * counted from there on the stack); past them it packs k from key 0. */
#define BLOCK_TILES_MAX 128

/* The keys of tile t of a block's rows that its gradients are read at: cols (limits NULL), or
 * the keys the tile sees and a tile of mr past them, where dV's and dk's tiles of keys end. */
static size_t block_width(const block_limits *limits, size_t t, size_t cols, size_t mr)
{
    return limits ? posenc_min(cols, limits->row_keys[2 * t + 1] + mr) : cols;
}

#endif /* POSENC_ENGINE_BACKWARD_ROWS_IMPL_H */
