/*
 * terms.c -- what the engine's files read of the term kinds outside REAL (their
 * files' flags, csrc/terms.h): whether a kind's gradient goes by blocks, whether it is
 * a vector table (term_vectors.h), whether the engine sums its gradient over the batch, for the
 * templates of both dtypes (term_kinds_impl.h's check, attention_impl.h,
 * attention_split_impl.h), the low-precision engine's chunks (engine_lp.c) and
 * the fold (entry.c).  A file of its own below them all, so that the templates
 * do not call up into entry.c, which dispatches down into them.
 */
#include "engine.h"

#define POSENC_TERM_FILES   /* the kinds' flags (their files without REAL) */
#include "../terms.h"

int posenc_term_by_blocks(int k)
{
#define TERM_BY_BLOCKS_(name, ...) term_##name##_by_blocks,
    static const int by_blocks[POSENC_TERM_COUNT] = {POSENC_TERMS(TERM_BY_BLOCKS_, )};
#undef TERM_BY_BLOCKS_
    return by_blocks[k];
}

int posenc_term_vector(int k)
{
#define TERM_VECTOR_(name, ...) term_##name##_vector,
    static const int vector[POSENC_TERM_COUNT] = {POSENC_TERMS(TERM_VECTOR_, )};
#undef TERM_VECTOR_
    return vector[k];
}

int posenc_term_summed(int k)
{
    return posenc_term_by_blocks(k) || posenc_term_vector(k);
}

int posenc_terms_vector(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (posenc_term_vector(k) && posenc_term_present(p, k))
            return 1;
    return 0;
}

int posenc_terms_by_blocks(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (posenc_term_by_blocks(k) && posenc_term_present(p, k))
            return 1;
    return 0;
}
