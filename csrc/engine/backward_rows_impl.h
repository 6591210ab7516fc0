/*
 * backward_rows_impl.h -- the backward's context and workspace (backward_ctx,
 * backward_ws), for one dtype (REAL, set by engine_<dtype>.c), and a ranged
 * block's limits.  The parts of the backward (backward_product_impl.h,
 * backward_slots_impl.h) and its flow (backward_impl.h) build on these.
 */
#ifndef POSENC_ENGINE_BACKWARD_ROWS_IMPL_H
#define POSENC_ENGINE_BACKWARD_ROWS_IMPL_H

#include "gemm_impl.h"
#include "rope_impl.h"
#include "scales_impl.h"
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
    void *grad_data[POSENC_TERM_COUNT];   /* the kinds' whose gradients go through a unit's
                                             sums (terms_grad_prepare: the vector tables) */
    int sums;                   /* one of them has data: a unit's sums to form */
    int need_modules;           /* a term module's gradient by rows (term_kinds_impl.h) */
    int need_blocks;            /* a term module's gradient by blocks (term_kind's grad_block:
                                   TUPE's dense factor; the logits' in phase 2) */
    int content;                /* the kind of a term module that reads the content logits
                                   (cope), whose path dq, dk and its own gradients take, or -1 */
    const term_seen *seen;      /* which keys the rows see, for `content`: a fused attention's
                                   masks, or NULL (the kind's own rule) */
    int reads_g;                /* the positional gradients read G itself (not only the GEMMs) */
    int unit_reads_g;           /* ... in phase 1, beyond the reset's [CLS] row and column 0 */
    int g16_rows;               /* ... there only through modules that read a bfloat16 twin of
                                   G (term_kind's grad_bf16): backward_g_rows leaves it unwidened */
    terms_call own_terms;       /* built by backward_prepare unless given one */
    const terms_call *terms;    /* what the kinds read: own_terms, or the attention's logits' */
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
    REAL *vector_grad;        /* scales.exact: x's gradient through the kinds' sums of a unit,
                                 max(n, m) x d (terms_grad_end) */
    REAL *term_grad_ws;       /* the kinds' backward workspace (terms_grad_layout) */
    /* product mode (backward_product_impl.h) */
    REAL *k_pack, *content, *content_grad;
    REAL *term_unit;          /* the factor kinds' unit data (terms_unit) */
    REAL *factor[POSENC_TERM_COUNT];        /* a factor kind's rows of a tile, mr x m_pad (the
                                               module's read where they lie: NULL) */
    REAL *factor_grad[POSENC_TERM_COUNT];   /* a wanted factor's effective gradient of a
                                               tile, mr x m_pad */
    /* phase 2: S_h, a row block of it */
    REAL *grad_sum;
    REAL *g_block;            /* a row block of G widened from its twin (backward_g_rows) */
    REAL *term_scratch;       /* the term modules' gradient rows: terms_grad_scratch doubles */
    REAL *term_grad;          /* content: a row block's content gradient Gc, row_block x m */
    REAL *term_dq;            /* content: a row block's dq through the term, row_block x d */
    term_keep keep;           /* content, the fused attention's: what a row block's logits kept
                                 (forward_keep), row_block rows */
    term_env env;             /* what the kinds read of the thread (term_kinds_impl.h) */
    int k_unread;             /* a masked key of the unit holds an Inf or NaN in k (masked_keys):
                                 the product's factors zeroed where a row does not see a key */
} backward_ws;

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
