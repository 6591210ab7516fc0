/*
 * term_query_table_impl.h -- the query-side vector table (term_vectors.h), a term module
 * of csrc/terms.h for one dtype (REAL): vector_scale q_i . table[h, map(j - i)].
 * The engine's vector paths compute its rows and gradients (forward_impl.h,
 * backward_vectors_impl.h); the kind's functions are theirs to take over.
 */
#ifndef POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H
#define POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H

#include "term_vectors.h"

#ifdef REAL

#include "term_unit_impl.h"

#define term_query_table_unit NULL
#define term_query_table_unit_scratch NULL
#define term_query_table_rows NULL
#define term_query_table_grad_rows NULL
#define term_query_table_grad_scratch NULL
#define term_query_table_content NULL
#define term_query_table_content_grad NULL
#define term_query_table_content_keep NULL
#define term_query_table_expand_rows NULL
#define term_query_table_expand NULL
#define term_query_table_row_of NULL
#define term_query_table_rows_at NULL
#define term_query_table_grad_block NULL
#define term_query_table_overrides 0
#define term_query_table_scaled 0

#endif /* REAL */

/* A factor of the product mode (M4M), beside the one factor module. */
#define term_query_table_factor 1
/* Its gradient: the engine's slots, summed over the batch (not by blocks). */
#define term_query_table_by_blocks 0
#define term_query_table_vector 1

#endif /* POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H */
