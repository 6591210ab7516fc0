/*
 * entry.c -- the engine's entry points: validation (posenc_validate, run
 * once by the caller) and the dispatch to the dtype-specialised engines
 * (engine_lp.c serves bfloat16 and float16 through the float32 one).
 */
#include "engine.h"

#define POSENC_TERM_FILES   /* the kinds' validation (their files without REAL) */
#include "../terms.h"

/* Every index (map entries) in [0, count). */
static int in_range(const int64_t *index, size_t len, size_t count)
{
    for (size_t t = 0; t < len; ++t)
        if (index[t] < 0 || (uint64_t)index[t] >= count)
            return 0;
    return 1;
}

/* The rotation (rope_*) of a problem whose rope_cos is set is consistent: its
 * tables, the pairs within d, every position (given, or the defaults query_offset
 * + i and j) within the tables, and the content term alone beside it. */
static int rope_valid(const posenc_problem *p)
{
    const size_t P = p->rope_positions;
    if (!p->rope_sin || !p->rope_cos_k || !p->rope_sin_k || 2 * p->rope_pairs > p->d ||
        p->product)
        return 0;
    if (p->positions_q ? !in_range(p->positions_q, p->B * p->n, P)
                       : p->n > 0 && (p->query_offset >= P || p->n > P - p->query_offset))
        return 0;
    return p->positions_k ? in_range(p->positions_k, p->B * p->m, P) : p->m <= P;
}

/* The term modules of p (csrc/terms.h): each present one with its required arrays, without
 * the rotation, in a product only factor kinds (one beside the vector tables), and its own
 * condition; NULL, or why not. */
static const char *terms_invalid(const posenc_problem *p)
{
    int factors = 0;   /* a product's modules */
#define TERM_ARRAY_(kind, name, required, grad, length, real) \
    if ((required) && !t->array[a].data) \
        return #kind ": its " #name " array is required"; \
    if (t->array[a].data && (size_t)(length) != 0 && t->array[a].per_unit != (size_t)(length)) \
        return #kind ": its " #name " array has the wrong length"; \
    ++a;
#define TERM_CHECK_(name, valid, reason, ARRAYS) \
    { \
        const posenc_term *t = &p->terms[POSENC_TERM_##name]; \
        int a = 0, given = 0; \
        for (int x = 0; x < POSENC_TERM_ARRAYS_MAX; ++x) \
            given |= t->array[x].data != NULL; \
        if (given) { \
            ARRAYS \
            (void)a; \
            if ((p->product && !term_##name##_factor) || p->rope_cos || \
                (POSENC_TERM_##name != POSENC_TERM_rope_token && \
                 posenc_term_present(p, POSENC_TERM_rope_token))) \
                return #name ": a term module goes without the (P, r) rotation, beside " \
                             "rope_token alone, and in a product only as its factor"; \
            if (p->product && !term_##name##_vector && ++factors > 1) \
                return #name ": a product takes one factor module beside the vector tables"; \
            if (!(valid)) \
                return reason; \
        } \
    }
    POSENC_TERMS(TERM_CHECK_, TERM_ARRAY_)
#undef TERM_CHECK_
#undef TERM_ARRAY_
    return NULL;
}

int posenc_validate(const posenc_problem *p, const char **why)
{
    const char *reason = NULL;
    if (p->dtype != POSENC_F32 && p->dtype != POSENC_F64 && p->dtype != POSENC_BF16 &&
        p->dtype != POSENC_F16)
        reason = "unknown dtype";
    else if (!p->q || !p->k)
        reason = "q and k are required";
    else if (p->H_kv && (p->H_kv > p->H || p->H % p->H_kv))
        reason = "grouped-query attention: the key heads H_kv divide the query heads H";
    else if (p->product && !posenc_terms_any(p))
        reason = "product mode needs at least one factor";
    else if ((p->positions_q || p->positions_k) && !p->rope_cos)
        reason = "positions are the rotation's: they need its tables";
    else if (p->rope_cos && !rope_valid(p))
        reason = "rotation: tables cos, sin (and the keys') of rope_positions x rope_pairs, "
                 "2 rope_pairs <= d, every position within the tables, no positional term";
    else
        reason = terms_invalid(p);
    if (why)
        *why = reason;
    return reason ? POSENC_EINVAL : POSENC_OK;
}

/* The engine of a dtype. */
static const posenc_engine *engine_of(posenc_dtype dtype)
{
    return dtype == POSENC_F32   ? &posenc_engine_f32
           : dtype == POSENC_F64 ? &posenc_engine_f64
                                 : &posenc_engine_lp;
}

int posenc_forward(const posenc_problem *p, void *out, int num_threads)
{
    return engine_of(p->dtype)->forward(p, out, num_threads);
}

/* Elements of a fold's block (terms_grads_fold): a thread's item. */
#define FOLD_BLOCK ((size_t)4096)

typedef struct {
    double *grad;
    size_t B, row, len;   /* batch rows `row` elements apart; each row's first len summed */
} fold_arg;

/* Blocks of [0, len): grad[e] += grad[b row + e], b = 1 .. B - 1 in order (an element's
 * sum the same whatever the team). */
static void fold_team_fn(void *arg_, void *ws)
{
    const fold_arg *arg = (const fold_arg *)arg_;
    const ptrdiff_t blocks = (ptrdiff_t)((arg->len + FOLD_BLOCK - 1) / FOLD_BLOCK);
    (void)ws;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (ptrdiff_t k = 0; k < blocks; ++k) {
        double *sum = arg->grad + (size_t)k * FOLD_BLOCK;
        const size_t len = posenc_min(FOLD_BLOCK, arg->len - (size_t)k * FOLD_BLOCK);
        for (size_t b = 1; b < arg->B; ++b) {
            const double *add = sum + b * arg->row;
            for (size_t e = 0; e < len; ++e)
                sum[e] += add[e];
        }
    }
}

/* The gradients of the term arrays without a batch axis (batch_stride 0) summed over the
 * batch rows, in order, into batch row 0's units (posenc_grads' terms); but for a kind
 * whose gradient the engine sums itself (posenc_term_summed: by blocks, a vector table's
 * slots: the batch's sum in batch row 0 already, the other rows unwritten). */
static int terms_grads_fold(const posenc_problem *p, const posenc_grads *g, int num_threads)
{
    const size_t per_row = g->term_units_per_row ? g->term_units_per_row : p->H;
    for (int k = 0; k < POSENC_TERM_COUNT && p->B > 1; ++k)
        for (int a = 0; a < POSENC_TERM_ARRAYS_MAX; ++a) {
            const posenc_term_array *x = &p->terms[k].array[a];
            if (!x->data || x->batch_stride || !g->terms[k][a] || posenc_term_summed(k))
                continue;
            const fold_arg arg = {(double *)g->terms[k][a], p->B, per_row * x->per_unit,
                                  p->H * x->per_unit};
            const size_t team = posenc_team_for((size_t)(num_threads > 0 ? num_threads : 1),
                                                (arg.len + FOLD_BLOCK - 1) / FOLD_BLOCK,
                                                posenc_mul_size(p->B, arg.len));
            const int status = posenc_run_team(team, 0, fold_team_fn, (void *)&arg);
            if (status != POSENC_OK)
                return status;
        }
    return POSENC_OK;
}

int posenc_backward(const posenc_problem *p, const void *grad, const posenc_grads *g,
                    int num_threads)
{
    const int status = engine_of(p->dtype)->backward(p, grad, g, num_threads);
    return status == POSENC_OK ? terms_grads_fold(p, g, num_threads) : status;
}

int posenc_attention_forward(const posenc_problem *p, const posenc_attention *a, void *out,
                             void *lse, int num_threads)
{
    return engine_of(p->dtype)->attention_forward(p, a, out, lse, num_threads);
}

int posenc_attention_backward(const posenc_problem *p, const posenc_attention *a,
                              const void *d_out, const void *out, const void *lse,
                              const posenc_grads *g, void *grad_v, int num_threads)
{
    const int status =
        engine_of(p->dtype)->attention_backward(p, a, d_out, out, lse, g, grad_v, num_threads);
    return status == POSENC_OK ? terms_grads_fold(p, g, num_threads) : status;
}

int posenc_matmul(const posenc_matmul_problem *mm, int num_threads)
{
    const posenc_engine *engine = engine_of(mm->dtype);   /* no matmul: bfloat16, float16 */
    if (!engine->matmul || (mm->b_rs != 1 && mm->b_cs != 1))
        return POSENC_EINVAL;
    return engine->matmul(mm, num_threads);
}
