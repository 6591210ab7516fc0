/*
 * term_kinds_impl.h -- the term modules of csrc/terms.h as the engine runs
 * them, for one dtype (REAL, set by engine_<dtype>.c): one table of
 * functions per kind (term_kind), filled from the list, and the loops over
 * a problem's present modules that the forward, the decoding path and the
 * backward call.  A kind's file (term_<name>_impl.h) defines the functions of
 * term_kind (term_unit_impl.h): term_<name>_unit, _unit_scratch, _rows,
 * _grad_rows, _grad_scratch, _content, _content_grad, _content_keep,
 * _expand_rows, _expand, _row_of, _rows_at, _grad_block, _prepare, _release,
 * _content_row, _fuses and the gradient-sum hooks _grad_prepare, _grad_release,
 * _grad_unit_scratch, _grad_begin, _grad_sums, _grad_end, _grad_reduce (NULL where
 * the kind has none: the rotation's per-token tables, read by rope_impl.h, have none;
 * a kind adds rows or reads the content logits), and its flags _overrides, _scaled,
 * _grad_bf16, and (outside its REAL part, for entry.c and terms.c) _factor, _by_blocks and
 * _vector.
 */
#ifndef POSENC_ENGINE_TERM_KINDS_IMPL_H
#define POSENC_ENGINE_TERM_KINDS_IMPL_H

#include "term_unit_impl.h"

#define POSENC_TERM_FILES
#include "../terms.h"

#define TERM_KIND_(name, ...)                                                      \
    {term_##name##_prepare, term_##name##_release,                               \
     term_##name##_unit, term_##name##_unit_scratch, term_##name##_rows,         \
     term_##name##_grad_rows, term_##name##_grad_scratch, term_##name##_content,  \
     term_##name##_content_grad, term_##name##_content_keep, term_##name##_expand_rows, \
     term_##name##_expand, term_##name##_row_of, term_##name##_rows_at,                \
     term_##name##_grad_block, term_##name##_content_row, term_##name##_fuses,         \
     term_##name##_grad_prepare, term_##name##_grad_release,                           \
     term_##name##_grad_unit_scratch, term_##name##_grad_begin, term_##name##_grad_sums, \
     term_##name##_grad_end, term_##name##_grad_reduce,                                \
     term_##name##_overrides, term_##name##_factor, term_##name##_scaled,              \
     term_##name##_vector, term_##name##_grad_bf16},
static const term_kind term_kinds[POSENC_TERM_COUNT] = {POSENC_TERMS(TERM_KIND_, )};
#undef TERM_KIND_

/* The first kind whose grad_block pointer (what the engine calls) and its file's
 * term_<name>_by_blocks flag (posenc_term_by_blocks: the LP engine's chunks, the fold,
 * outside REAL) disagree, or -1: the two sources of "its gradient goes by blocks",
 * checked by the C tests (posenc_engine's term_kinds_check). */
static int term_kinds_check(void)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if ((term_kinds[k].grad_block != NULL) != (posenc_term_by_blocks(k) != 0))
            return k;
    return -1;
}

/* The calls' data of p's present kinds (c's reach and flags set) into c->data: POSENC_OK
 * or ENOMEM (terms_release frees what was built either way). */
static int terms_prepare(const posenc_problem *p, terms_call *c)
{
    int status = POSENC_OK;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        c->data[k] = NULL;
        if (status == POSENC_OK && posenc_term_present(p, k) && term_kinds[k].prepare)
            status = term_kinds[k].prepare(p, c, k, &c->data[k]);
    }
    return status;
}

static void terms_release(terms_call *c)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (c->data[k]) {
            term_kinds[k].release(c->data[k]);
            c->data[k] = NULL;
        }
}

/* *t set for kind k of p on unit (b, h), its unit data NULL (each field stored as a scalar:
 * a struct built aside and copied whole stalls on the copy's wide loads, and a decoding
 * step builds many). */
static void term_unit_set(term_unit *t, const posenc_problem *p, const posenc_kernels *kern,
                          const term_env *env, int k, size_t b, size_t h)
{
    t->p = p;
    t->kern = kern;
    t->env = env;
    t->gemm = env->gemm;
    t->data = env->call ? env->call->data[k] : NULL;
    t->term = &p->terms[k];
    t->b = b;
    t->h = h;
    t->unit_data = NULL;
    t->tag = NULL;
    t->grad = env->grad ? env->grad[k] : NULL;
    t->g16 = NULL;
    for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
        const posenc_term_array *x = &p->terms[k].array[a];
        const int type = x->data ? posenc_term_array_type(k, a) : POSENC_TERM_INDEX;
        const size_t at = b * x->batch_stride + h * x->head_stride;
        t->real[a] = type == POSENC_TERM_REAL ? (const REAL *)x->data + at : NULL;
        /* (an index array: the engine's) */
        t->array[a] = type == 0 ? (const double *)x->data + at : NULL;
    }
}

/* Whether p has kind k and it adds (a kind with rows; rope_token rotates instead:
 * rope_impl.h). */
static int term_adds(const posenc_problem *p, int k)
{
    return posenc_term_present(p, k) && term_kinds[k].rows != NULL;
}

/* Which of the adding kinds a loop takes: those that add, those that override, or both. */
enum { TERMS_ADDING = 1, TERMS_OVERRIDING = 2, TERMS_EVERY = 3 };

static int term_taken(int k, int which)
{
    return which & (term_kinds[k].overrides ? TERMS_OVERRIDING : TERMS_ADDING);
}

/* The overriding kind p has (term_kind's overrides: TUPE's reset), or -1. */
static int terms_override_kind(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_adds(p, k) && term_kinds[k].overrides)
            return k;
    return -1;
}

/* Whether p has a term module that adds to the logits. */
static int terms_additive(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_adds(p, k))
            return 1;
    return 0;
}

/* Whether kind k reads the same for every batch row: no array of its has a batch axis and
 * it does not read q or k (term_kind's vector; a kind reads b through its arrays and the
 * inputs only: term_unit_impl.h). */
static int term_batch_free(const posenc_problem *p, int k)
{
    if (term_kinds[k].vector)
        return 0;
    for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
        if (p->terms[k].array[a].data && p->terms[k].array[a].batch_stride)
            return 0;
    return 1;
}

/*
 * The adding modules whose rows the GEMM's epilogue reads where they lie (forward_impl.h):
 * *pointer, a kind with rows_at that is the only term in P (alone, or beside *expanded),
 * or -1; *expanded, a kind with expand whose distinct rows the epilogue adds by pointer
 * (where `expandable`: sum mode, tame scales) after P, the last adding module (DIET-ABS's
 * segments after its dense factor in P, DIET-REL's beside *pointer), or -1.  An
 * overriding kind is a module in P applied last: with it neither applies.
 */
static void terms_in_place(const posenc_problem *p, int expandable, int *pointer,
                           int *expanded)
{
    int count = 0, last = -1, with_rows_at = -1, with_expand = -1;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        if (!term_adds(p, k))
            continue;
        ++count;
        last = k;
        if (term_kinds[k].rows_at && with_rows_at < 0)
            with_rows_at = k;
        else if (term_kinds[k].expand && with_expand < 0)
            with_expand = k;
    }
    *pointer = *expanded = -1;
    if (expandable && with_expand >= 0 && with_expand == last && terms_override_kind(p) < 0)
        *expanded = with_expand;
    if (with_rows_at >= 0 && (count == 1 || (count == 2 && *expanded >= 0)))
        *pointer = with_rows_at;
}

/* Whether p has kind k and it reads the content logits (cope). */
static int term_reads_content(const posenc_problem *p, int k)
{
    return posenc_term_present(p, k) && term_kinds[k].content != NULL;
}

/* The kind of p that reads the content logits, or -1 (csrc/terms.h's validation
 * keeps such a kind alone). */
static int terms_content_kind(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_reads_content(p, k))
            return k;
    return -1;
}

/* Whether p has kind k and the kind forms unit data (term_kind's unit). */
static int term_has_unit(const posenc_problem *p, int k)
{
    return posenc_term_present(p, k) && term_kinds[k].unit != NULL;
}

/* Kind k's REAL elements in a thread's unit data (aligned for the next kind's). */
static size_t term_unit_data_size(const posenc_problem *p, const posenc_kernels *kern,
                                  const terms_call *call, int k)
{
    return posenc_round_up(term_kinds[k].unit_scratch(p, kern, call), 16);
}

/* The REAL elements of a thread's unit data for the present modules among kinds [0, to)
 * (terms_unit; a kind's place does not depend on the kinds after it). */
static size_t terms_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call, int to)
{
    size_t total = 0;
    for (int k = 0; k < to; ++k)
        if (term_has_unit(p, k))
            total += term_unit_data_size(p, kern, call, k);
    return total;
}

/* Whether the present modules' unit data is the same for every batch row. */
static int terms_units_batch_free(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_has_unit(p, k) && !term_batch_free(p, k))
            return 0;
    return 1;
}

/* Kind k's unit data in scratch (terms_unit formed the present modules' there). */
static REAL *term_unit_data(const term_env *env, int k, REAL *scratch)
{
    return scratch + env->unit_at[k];
}

/* The unit data of unit (b, h) of each present module among kinds [from, to) formed in
 * scratch (terms_unit_scratch: the present modules' room, in the list's order; the
 * kinds before `from`, whose rows a head block holds, keep theirs unwritten). */
static void terms_unit(const posenc_problem *p, const posenc_kernels *kern, term_env *env,
                       int from, int to, size_t b, size_t h, REAL *scratch)
{
    for (int k = from; k < to; ++k)
        if (term_has_unit(p, k)) {
            term_unit t;
            term_unit_set(&t, p, kern, env, k, b, h);
            t.unit_data = term_unit_data(env, k, scratch);
            t.tag = &env->tag[k];
            term_kinds[k].unit(&t);
        }
}

/* A thread's env for the call c of p (its q and k set per unit by the caller). */
static term_env term_env_of(const posenc_problem *p, const posenc_kernels *kern,
                            const gemm_scratch *gs, const terms_call *c)
{
    term_env e = {gs, NULL, NULL, c, {0}, {0}, 0, NULL, NULL, NULL, {0}};
    size_t at = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        e.tag[k] = -1;
        e.unit_at[k] = at;
        if (term_has_unit(p, k))
            at += term_unit_data_size(p, kern, c, k);
    }
    return e;
}

/* Kind k's distinct rows of unit (b, h) into X (row s at X + s m; scratch: the unit data
 * terms_unit formed). */
static void terms_expand(const posenc_problem *p, const posenc_kernels *kern,
                         const term_env *env, int k, size_t b,
                         size_t h, REAL *scratch, REAL *X)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    t.unit_data = term_unit_data(env, k, scratch);
    term_kinds[k].expand(&t, X);
}

/* Kind k's distinct rows per unit (terms_expand's X holds them, m each). */
static size_t terms_expand_rows(const posenc_problem *p, int k)
{
    return term_kinds[k].expand_rows(p);
}

/* In rows[r] row i0 + r of unit (b, h)'s expanded rows X, from key `first` (r < count). */
static void terms_expanded_rows(const posenc_problem *p, const posenc_kernels *kern,
                                const term_env *env, int k,
                                size_t b, size_t h, const REAL *X, size_t i0, size_t count,
                                size_t first, const REAL **rows)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    for (size_t r = 0; r < count; ++r)
        rows[r] = X + term_kinds[k].row_of(&t, i0 + r) * p->m + first;
}

/* Kind k (present, adding) on rows [i0, i0 + rows) of unit (b, h), keys [k0, cols), into P
 * with op (scratch: terms_unit formed it for the unit). */
static void term_rows(const posenc_problem *p, const posenc_kernels *kern,
                      const term_env *env, int k, int op,
                      REAL *P, size_t ldp, size_t b, size_t h, size_t i0, size_t rows, size_t k0,
                      size_t cols, REAL *scratch)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    t.unit_data = term_unit_data(env, k, scratch);
    term_kinds[k].rows(&t, op, P, ldp, i0, rows, k0, cols);
}

/* The present modules `which` takes among kinds [from, to) on rows [i0, i0 + rows) of unit
 * (b, h), keys [k0, cols), into P: the first with op, the others added (multiplied in a
 * product), an overriding kind's last over them (scratch: terms_unit formed it for the
 * unit).  Returns the op for the next term. */
static int terms_rows(const posenc_problem *p, const posenc_kernels *kern, const term_env *env,
                      int which, int from, int to, int op, REAL *P, size_t ldp, size_t b,
                      size_t h, size_t i0, size_t rows, size_t k0, size_t cols, REAL *scratch)
{
    for (int k = from; k < to; ++k)
        if (term_adds(p, k) && term_taken(k, which)) {
            term_rows(p, kern, env, k, op, P, ldp, b, h, i0, rows, k0, cols, scratch);
            op = p->product ? POSENC_MUL : POSENC_ADD;
        }
    return op;
}

/* Whether p has an adding kind among kinds [from, to). */
static int terms_adding_in(const posenc_problem *p, int from, int to)
{
    for (int k = from; k < to; ++k)
        if (term_adds(p, k))
            return 1;
    return 0;
}

/* The end of the leading run of p's adding kinds that are batch-free (and, with gemm, whose
 * rows are a GEMM: term_kind's grad_block): kinds [0, end) (0: none), which a head block
 * may hold (forward_plan_blocks). */
static int terms_batch_free_prefix(const posenc_problem *p, int gemm)
{
    int end = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        if (!term_adds(p, k))
            continue;
        if ((gemm && !term_kinds[k].grad_block) || !term_batch_free(p, k))
            break;
        end = k + 1;
    }
    return end;
}

/* Kind k's rows of unit (b, h) where they lie (term_kind's rows_at): row i0's key 0 at the
 * returned pointer, row i0 + r at + r * *ld (scratch: terms_unit formed it for the unit). */
static const REAL *term_rows_at(const posenc_problem *p, const posenc_kernels *kern,
                                const term_env *env, int k,
                                size_t b, size_t h, size_t i0, REAL *scratch, ptrdiff_t *ld)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    t.unit_data = term_unit_data(env, k, scratch);
    return term_kinds[k].rows_at(&t, i0, ld);
}

/* The kind of p whose term a decoding step of one row may form in its content pass
 * (term_kind's content_row, where its fuses(p) holds), or -1. */
static int terms_content_row_kind(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (term_adds(p, k) && term_kinds[k].content_row && term_kinds[k].fuses(p))
            return k;
    return -1;
}

/* Row i of unit (b, h): its content logits, keys [c0, cols), into x, and kind k's term of
 * the row with them (terms_content_row_kind; scratch: the unit data terms_unit formed). */
static void terms_content_row(const posenc_problem *p, const posenc_kernels *kern,
                              const term_env *env, int k, size_t b, size_t h, REAL *x, size_t ldx,
                              REAL *pair, size_t i, size_t c0, size_t cols, REAL *scratch)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    t.unit_data = term_unit_data(env, k, scratch);
    term_kinds[k].content_row(&t, x, ldx, pair, i, c0, cols);
}

/* The content-reading kind k of p (terms_content_kind) on rows [i0, i0 + rows) of unit
 * (b, h), keys [k0, cols), of the content logits in C (term_kind's content; scratch: the
 * unit data terms_unit formed, of which k's is the only one: the kind is alone; keep: NULL,
 * or where the rows keep what their gradient reads). */
static void terms_content(const posenc_problem *p, const posenc_kernels *kern,
                          const term_env *env, int k, size_t b,
                          size_t h, const REAL *q, REAL *C, size_t ldc, size_t i0, size_t rows,
                          size_t k0, size_t cols, const term_seen *seen, REAL *scratch,
                          const term_keep *keep)
{
    term_unit t;
    term_unit_set(&t, p, kern, env, k, b, h);
    t.unit_data = scratch;
    term_kinds[k].content(&t, q, C, ldc, i0, rows, k0, cols, seen, keep);
}

/* The REAL elements a row of the content-reading kind k keeps (term_keep). */
static size_t terms_content_keep(const posenc_problem *p, int k)
{
    return posenc_round_up(term_kinds[k].content_keep(p), 16);
}

/* Unit u's gradients of kind k (NULL where not wanted) in g. */
static void terms_unit_grads(const posenc_problem *p, const posenc_grads *g, int k, size_t u,
                             double **grad)
{
    const size_t per_row = g->term_units_per_row ? g->term_units_per_row : p->H;
    const size_t unit = u / p->H * per_row + u % p->H;
    for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
        const posenc_term_array *x = &p->terms[k].array[a];
        grad[a] = g->terms[k][a] && x->data ? (double *)g->terms[k][a] + unit * x->per_unit : NULL;
    }
}

/* Unit u's gradients of kind k in grad (terms_unit_grads); whether g wants one. */
static int term_grads_of(const posenc_problem *p, const posenc_grads *g, int k, size_t u,
                         double **grad)
{
    int wanted = 0;
    terms_unit_grads(p, g, k, u, grad);
    for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
        wanted |= grad[a] != NULL;
    return wanted;
}

/* Whether g wants a gradient of a term module of p that `which` takes, by rows (a
 * content-reading kind counts as adding; a kind whose gradient the engine sums does not:
 * by blocks, terms_block_grads_wanted; a vector table's, backward_slots_impl.h). */
static int terms_grads_wanted(const posenc_problem *p, const posenc_grads *g, int which)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            if ((term_adds(p, k) || term_reads_content(p, k)) && term_taken(k, which) &&
                !posenc_term_summed(k) && p->terms[k].array[a].data && g->terms[k][a])
                return 1;
    return 0;
}

/* Whether every module of p whose grad_rows g's gradients call reads a bfloat16 twin of G
 * itself (term_kind's grad_bf16), at least one doing so. */
static int terms_grad_bf16(const posenc_problem *p, const posenc_grads *g)
{
    int any = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            if (term_adds(p, k) && term_kinds[k].grad_rows && p->terms[k].array[a].data &&
                g->terms[k][a]) {
                if (!term_kinds[k].grad_bf16)
                    return 0;
                any = 1;
            }
    return any;
}

/* Unit u's wanted module gradients by rows zeroed (its first rows follow; the rotation's
 * are written whole at the unit's end, zeroed here for a problem without rows; those the
 * engine sums over the batch go through slots: terms_block_grads_reduce, backward_reduce). */
static void terms_grads_begin(const posenc_problem *p, const posenc_grads *g, size_t u)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        double *grad[POSENC_TERM_ARRAYS_MAX];
        if (posenc_term_summed(k))
            continue;
        terms_unit_grads(p, g, k, u, grad);
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            if (grad[a])
                memset(grad[a], 0, sizeof(double) * p->terms[k].array[a].per_unit);
    }
}

/* Unit u's wanted module gradients by rows times `scale` (a product's factor where the scale
 * is not tame: its effective gradient held q.k unscaled; the vector tables' are scaled in
 * their batch sums). */
static void terms_grads_scale(const posenc_problem *p, const posenc_grads *g, size_t u,
                              double scale)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        double *grad[POSENC_TERM_ARRAYS_MAX];
        if (posenc_term_summed(k))
            continue;
        terms_unit_grads(p, g, k, u, grad);
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            for (size_t t = 0; grad[a] && t < p->terms[k].array[a].per_unit; ++t)
                grad[a][t] *= scale;
    }
}

/* The doubles of a thread's scratch for the present modules' gradient rows. */
static size_t terms_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    size_t most = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if ((term_adds(p, k) || term_reads_content(p, k)) && term_kinds[k].grad_scratch)
            most = posenc_max(most, term_kinds[k].grad_scratch(p, kern));
    return most;
}

/* Rows [i0, i0 + rows) of unit u's logits gradient G through the content-reading kind k
 * (term_kind's content_grad): the content's gradient into Gc, q's through the term into dq,
 * the kind's own gradients (scratch: terms_grad_scratch(p) doubles; keep: NULL, or what the
 * rows' terms_content kept). */
static void terms_content_grad(const posenc_problem *p, const posenc_kernels *kern,
                               const term_env *env,
                               const posenc_grads *g, int k, size_t u, const REAL *q,
                               const REAL *k_u, double scale, const REAL *G, REAL *Gc, size_t ldg,
                               size_t i0, size_t rows, size_t first, size_t cols,
                               const term_seen *seen, REAL *dq, double *scratch,
                               const term_keep *keep)
{
    double *grad[POSENC_TERM_ARRAYS_MAX];
    terms_unit_grads(p, g, k, u, grad);
    term_unit t;
    term_unit_set(&t, p, kern, env, k, u / p->H, u % p->H);
    term_kinds[k].content_grad(&t, grad, q, k_u, scale, G, Gc, ldg, i0, rows, first, cols, seen,
                               dq, scratch, keep);
}

/* Rows [i0, i0 + rows) of unit u's logits gradient G into the gradients of the modules
 * `which` takes (scratch: terms_grad_scratch(p) doubles); G16: G's bfloat16 twin, G's
 * float32 values unwritten (only where every such module has grad_bf16:
 * terms_grad_bf16), or NULL. */
static void terms_grad_rows(const posenc_problem *p, const posenc_kernels *kern,
                            const term_env *env, const posenc_grads *g, int which, size_t u,
                            const REAL *G, const uint16_t *G16, size_t ldg, size_t i0,
                            size_t rows, size_t first, size_t cols, double *scratch)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        if (!term_adds(p, k) || !term_taken(k, which) || !term_kinds[k].grad_rows)
            continue;
        double *grad[POSENC_TERM_ARRAYS_MAX];
        if (term_grads_of(p, g, k, u, grad)) {
            term_unit t;
            term_unit_set(&t, p, kern, env, k, u / p->H, u % p->H);
            t.g16 = G16;
            term_kinds[k].grad_rows(&t, grad, G, ldg, i0, rows, first, cols, scratch);
        }
    }
}

/* Whether g wants the gradient of array a of kind k of p, an adding kind whose gradient
 * goes by blocks (term_kind's grad_block). */
static int term_block_grad(const posenc_problem *p, const posenc_grads *g, int k, int a)
{
    return term_adds(p, k) && term_kinds[k].grad_block && p->terms[k].array[a].data &&
           g->terms[k][a];
}

/* Whether g wants a gradient that goes by blocks (term_block_grad). */
static int terms_block_grads_wanted(const posenc_problem *p, const posenc_grads *g)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            if (term_block_grad(p, g, k, a))
                return 1;
    return 0;
}

/* The REAL slots of the kinds whose gradient goes by blocks: slots[k][a], `units` x the
 * array's per_unit elements where g wants its gradient (NULL elsewhere), unset.  0, or -1
 * out of memory (terms_block_slots_free releases what was allocated). */
static int terms_block_slots_alloc(const posenc_problem *p, const posenc_grads *g, size_t units,
                                   REAL *slots[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX])
{
    int status = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
            slots[k][a] = NULL;
            if (status == 0 && term_block_grad(p, g, k, a)) {
                const size_t per_unit = posenc_max(p->terms[k].array[a].per_unit, 1);
                slots[k][a] = (REAL *)posenc_alloc(
                    posenc_mul_size(posenc_max(units, 1), per_unit), sizeof(REAL));
                status = slots[k][a] ? 0 : -1;
            }
        }
    return status;
}

static void terms_block_slots_free(REAL *slots[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX])
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            posenc_free(slots[k][a]);
}

/* Rows [i0, i0 + rows) of a gradient S of unit (b, h) (row r at S + r lds: term_kind's
 * grad_block, without an overriding kind's cells) into the slots' unit `slot_unit` of the
 * kinds whose gradient goes by blocks (scratch: terms_grad_scratch(p, kern) doubles). */
static void terms_grad_blocks(const posenc_problem *p, const posenc_kernels *kern,
                              const term_env *env,
                              REAL *const slots[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX],
                              size_t slot_unit, size_t b, size_t h, const REAL *S, size_t lds,
                              size_t i0, size_t rows, size_t cols, const block_limits *limits,
                              double *scratch)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        REAL *slot[POSENC_TERM_ARRAYS_MAX];
        int wanted = 0;
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
            slot[a] = slots[k][a] ? slots[k][a] + slot_unit * p->terms[k].array[a].per_unit : NULL;
            wanted |= slot[a] != NULL;
        }
        if (wanted) {
            term_unit t;
            term_unit_set(&t, p, kern, env, k, b, h);
            term_kinds[k].grad_block(&t, slot, S, lds, i0, rows, cols, limits, scratch);
        }
    }
}

/* The slots (units b H + h, b < batches) summed over b, in order, in double, times `scale`
 * for a `scaled` kind (the exact path's dense scale; 1 else), into batch row 0's units of
 * the double gradients (posenc_grads: the other rows' stay unwritten). */
static void terms_block_grads_reduce(const posenc_problem *p, const posenc_grads *g,
                                     REAL *const slots[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX],
                                     size_t batches, double scale)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
            if (!slots[k][a])
                continue;
            const size_t len = p->terms[k].array[a].per_unit, H = p->H;
            const double s = term_kinds[k].scaled ? scale : 1;
            for (size_t h = 0; h < H; ++h) {   /* batch rows in order, each a contiguous run */
                double *out = (double *)g->terms[k][a] + h * len;
                for (size_t e = 0; e < len; ++e)
                    out[e] = (double)slots[k][a][h * len + e];
                for (size_t b = 1; b < batches; ++b) {
                    const REAL *part = slots[k][a] + (b * H + h) * len;
                    for (size_t e = 0; e < len; ++e)
                        out[e] += (double)part[e];
                }
                for (size_t e = 0; e < len && s != 1; ++e)
                    out[e] *= s;
            }
        }
}

/* The wanted gradients of the kinds whose gradient the engine sums over the batch (by
 * blocks, a vector table's slots: posenc_term_summed) zeroed in every unit (an empty
 * problem's). */
static void terms_block_grads_zero(const posenc_problem *p, const posenc_grads *g)
{
    const size_t per_row = g->term_units_per_row ? g->term_units_per_row : p->H;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a)
            if (posenc_term_present(p, k) && posenc_term_summed(k) &&
                p->terms[k].array[a].data && g->terms[k][a])
                for (size_t b = 0; b < p->B; ++b)
                    memset((double *)g->terms[k][a] + b * per_row * p->terms[k].array[a].per_unit,
                           0, sizeof(double) * p->H * p->terms[k].array[a].per_unit);
}

/* The backward data of p's kinds whose gradients go through a unit's sums (term_kind's
 * grad_prepare) into data[k] (NULL: none, or the call wants none of the kind's gradients).
 * POSENC_OK or ENOMEM (terms_grad_release frees what was built either way). */
static int terms_grad_prepare(const posenc_problem *p, const posenc_kernels *kern,
                              const terms_call *call, const term_grad_plan *plan,
                              void *data[POSENC_TERM_COUNT])
{
    int status = POSENC_OK;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        data[k] = NULL;
        if (status == POSENC_OK && term_adds(p, k) && term_kinds[k].grad_prepare)
            status = term_kinds[k].grad_prepare(p, kern, call, plan, k, &data[k]);
    }
    return status;
}

static void terms_grad_release(void *data[POSENC_TERM_COUNT])
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (data[k]) {
            term_kinds[k].grad_release(data[k]);
            data[k] = NULL;
        }
}

/* Whether a kind has backward data (terms_grad_prepare): a unit's sums to form. */
static int terms_grad_any(void *const data[POSENC_TERM_COUNT])
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (data[k])
            return 1;
    return 0;
}

/* The REAL elements of a thread's backward workspace of the kinds with data; where env is
 * given, their places in it (env's grad_at) and data. */
static size_t terms_grad_layout(const posenc_problem *p, const posenc_kernels *kern,
                                void *const data[POSENC_TERM_COUNT], term_env *env)
{
    size_t at = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (data[k]) {
            if (env)
                env->grad_at[k] = at;
            at += posenc_round_up(term_kinds[k].grad_unit_scratch(p, kern, data[k]), 16);
        }
    if (env)
        env->grad = data;
    return at;
}

/* Unit (b, h)'s sums begun, for every kind with data. */
static void terms_grad_begin(const posenc_problem *p, const posenc_kernels *kern,
                             const term_env *env, size_t b, size_t h)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (env->grad[k]) {
            term_unit t;
            term_unit_set(&t, p, kern, env, k, b, h);
            t.unit_data = env->grad_ws + env->grad_at[k];
            term_kinds[k].grad_begin(&t);
        }
}

/* Rows [i0, i0 + rows) of G (row r at G + r ldg, keys [0, cols)) into unit (b, h)'s sums of
 * kind k (k >= 0: a product's factor, G its effective gradient) or of every kind with data
 * (k < 0). */
static void terms_grad_sums(const posenc_problem *p, const posenc_kernels *kern,
                            const term_env *env, int k, size_t b, size_t h, const REAL *G,
                            size_t ldg, size_t i0, size_t rows, size_t cols)
{
    for (int x = k < 0 ? 0 : k; x < (k < 0 ? POSENC_TERM_COUNT : k + 1); ++x)
        if (env->grad[x]) {
            term_unit t;
            term_unit_set(&t, p, kern, env, x, b, h);
            t.unit_data = env->grad_ws + env->grad_at[x];
            term_kinds[x].grad_sums(&t, G, ldg, i0, rows, cols);
        }
}

/* Unit (b, h)'s end for the kinds with data whose rows read input `vector` (1: q, 2: k,
 * term_kind's vector): x's gradient through them added into dx (NULL: not wanted), theirs
 * into their slots.  Whether there was one. */
static int terms_grad_end(const posenc_problem *p, const posenc_kernels *kern,
                          const term_env *env, int vector, size_t b, size_t h, const REAL *x,
                          REAL *dx)
{
    int any = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (env->grad[k] && term_kinds[k].vector == vector) {
            term_unit t;
            term_unit_set(&t, p, kern, env, k, b, h);
            t.unit_data = env->grad_ws + env->grad_at[k];
            term_kinds[k].grad_end(&t, x, dx);
            any = 1;
        }
    return any;
}

/* Whether a kind with data reads input `vector` (terms_grad_end). */
static int terms_grad_reads(void *const data[POSENC_TERM_COUNT], int vector)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (data[k] && term_kinds[k].vector == vector)
            return 1;
    return 0;
}

/* After the units: the kinds' gradients from their slots into g, in the list's order, then
 * (scales: the exact path's) the scales their sums left out. */
static void terms_grad_reduce(const posenc_problem *p, const posenc_grads *g,
                              void *const data[POSENC_TERM_COUNT], const call_scales *scales)
{
    for (int phase = 0; phase < (scales ? 2 : 1); ++phase)
        for (int k = 0; k < POSENC_TERM_COUNT; ++k)
            if (data[k])
                term_kinds[k].grad_reduce(p, g, data[k], scales, phase);
}

#endif /* POSENC_ENGINE_TERM_KINDS_IMPL_H */
