/*
 * terms.h -- the positional term modules: one line of POSENC_TERMS per kind,
 * the one list that registers a kind.  A kind is a C file of its own,
 * csrc/engine/term_<name>_impl.h (its rows on a tile and on the decoding
 * path, and its gradient rows: docs/internals.md, "Term modules"), included
 * below; everything else (the problem's and the gradients' fields, the
 * binding's config fields and gradients, the low-precision engine's slices,
 * the validation) is derived from its line:
 *
 *   TERM(name, valid, why, ARRAYS)
 *     valid     an expression of the problem `p` that must hold when the
 *               term is present (it may call a function of the kind's file
 *               outside its REAL part: entry.c includes the files without REAL)
 *     why       posenc_validate's reason when it does not
 *     ARRAYS    ARRAY(name, array, required, grad, length, real) for each of its
 *               float arrays (at most POSENC_TERM_ARRAYS_MAX), in order; a
 *               term is present when its first (required) array is given;
 *               grad 1: the array has a gradient, 0: a constant (as derived
 *               sums); length: its elements per (b, h) unit, an expression
 *               of `p`, or 0 for the array's own (a table's rows); real 1:
 *               its elements are the problem's compute type (float64 for a
 *               float64 problem, float32 for the others: a table read as the
 *               tile's values, taken as the caller holds it), 2: int64 (an
 *               index array the kernels read as it is: the vector tables'
 *               maps; no gradient), 0: float64
 *
 * The dense factor (TUPE's, DIET-ABS's) comes first: the forward's sums keep the
 * order dense + table + ..., and a head block may hold it alone (term_dense_impl.h).
 * A kind whose rows are NULL adds nothing: it rotates q and k (rope_token, read by
 * csrc/engine/rope_impl.h).  A module's arrays are (B|1, H|1, length), float64
 * whatever the problem's dtype (they are small: a few numbers per token, as FoX's
 * gates and their prefix sums, whose differences must not lose the digits a float32
 * would) but for the `real` ones (posenc_term_array_real: the dense factor's pos_q
 * and pos_k, the Toeplitz table, read as the tile's values); their gradients are
 * float64 per unit, (B, H, length), summed over the batch by the engine where an
 * array has no batch axis (into batch row 0's units, posenc_grads), the caller
 * reducing over the other axes its arrays broadcast.
 * Module terms are added (sum mode, no rotation); a kind's own file says what it
 * computes.  A kind that overrides instead (TUPE's reset: term_kind's `overrides`)
 * comes last in the list: the engine applies its rows after every other term.  A
 * kind whose file defines term_<name>_factor 1 may also be the one module of a
 * product (M2's table: its rows multiply the logits; they are linear in its arrays
 * and given by pointer, term_kind's rows_at).
 */
#ifndef POSENC_TERMS_H
#define POSENC_TERMS_H

#define POSENC_TERM_ARRAYS_MAX 4

#define POSENC_TERMS(TERM, ARRAY)                                                       \
    TERM(dense, term_dense_valid(p),                                                    \
         "dense: pos_q n x d_p and pos_k m x d_p per head, shared by the batch",          \
         ARRAY(dense, pos_q, 1, 1, 0, 1) ARRAY(dense, pos_k, 1, 1, 0, 1))                \
    TERM(toeplitz, term_toeplitz_valid(p),                                              \
         "toeplitz: rows, over the n + m - 1 offsets, integers in [0, R) (a table of R " \
         "entries), shared by the batch and the heads",                                 \
         ARRAY(toeplitz, table, 1, 1, 0, 1)                                             \
         ARRAY(toeplitz, rows, 1, 0, p->n && p->m ? p->n + p->m - 1 : 0, 0))            \
    TERM(segments, term_segments_valid(p),                                              \
         "segments: a table of S x S entries, ids integers in [0, S) shared by the "    \
         "heads", ARRAY(segments, table, 1, 1, 0, 0) ARRAY(segments, query, 1, 0, p->n, 0) \
         ARRAY(segments, key, 1, 0, p->m, 0))                                           \
    TERM(fox, p->query_offset + p->n <= p->m,                                           \
         "fox: every query is among the keys (query_offset + n <= m)",                  \
         ARRAY(fox, gates, 1, 1, p->m, 0) ARRAY(fox, gates_reverse, 0, 1, p->m, 0)      \
         ARRAY(fox, cum, 0, 0, p->m, 0) ARRAY(fox, cum_reverse, 0, 0, p->m, 0))         \
    TERM(relative_bias_2d, term_relative_bias_2d_valid(p),                              \
         "relative_bias_2d: coordinates integers in [0, 2^30) or (-1, -1) (a global "   \
         "token), shared by the heads; one (t_y, t_x) >= 0; a table of T or T + 3 "     \
         "entries (T + 3 with a global token)",                                         \
         ARRAY(relative_bias_2d, bias, 1, 1, 0, 0)                                      \
         ARRAY(relative_bias_2d, coords_q, 1, 0, 2 * p->n, 0)                           \
         ARRAY(relative_bias_2d, coords_k, 1, 0, 2 * p->m, 0)                           \
         ARRAY(relative_bias_2d, distance, 1, 0, 2, 0))                                 \
    TERM(rope_token, term_rope_token_valid(p),                                          \
         "rope_token: per-token rotary tables (no (P, r) tables, no positions), "       \
         "cos and sin n x rope_pairs, cos_k and sin_k m x rope_pairs, 2 rope_pairs <= d", \
         ARRAY(rope_token, cos, 1, 1, 0, 0) ARRAY(rope_token, sin, 1, 1, 0, 0)          \
         ARRAY(rope_token, cos_k, 1, 1, 0, 0) ARRAY(rope_token, sin_k, 1, 1, 0, 0))     \
    TERM(cope, term_cope_valid(p),                                                      \
         "cope: alone (no other positional term), shape (P, causal) with P an integer in " \
         "[1, 2^30] and causal 0 or 1, pos_emb P x d",                                  \
         ARRAY(cope, pos_emb, 1, 1, 0, 0) ARRAY(cope, shape, 1, 0, 2, 0))               \
    TERM(query_table, term_vector_valid(p, POSENC_TERM_query_table),                    \
         "query_table: a table of R x d entries per head (heads H or 1, shared by the "  \
         "batch), map over the n + m - 1 offsets, integers in [0, R), shared",           \
         ARRAY(query_table, table, 1, 1, 0, 1)                                          \
         ARRAY(query_table, map, 1, 0, p->n && p->m ? p->n + p->m - 1 : 0, 2))          \
    TERM(key_table, term_vector_valid(p, POSENC_TERM_key_table),                        \
         "key_table: a table of R x d entries per head (heads H or 1, shared by the "    \
         "batch), map over the n + m - 1 offsets, integers in [0, R), shared",           \
         ARRAY(key_table, table, 1, 1, 0, 1)                                            \
         ARRAY(key_table, map, 1, 0, p->n && p->m ? p->n + p->m - 1 : 0, 2))            \
    TERM(reset, 1, "reset: theta (t0, t1) per unit", ARRAY(reset, theta, 1, 1, 2, 0))

/* POSENC_TERM_IF_<grad>(x): x for an array with a gradient (the X-macros' filter). */
#define POSENC_TERM_IF_1(...) __VA_ARGS__
#define POSENC_TERM_IF_0(...)

#endif /* POSENC_TERMS_H */

/* The kinds' files: their REAL parts for the engine's templates (term_kinds_impl.h),
 * the rest (validation) for entry.c. */
#if defined(POSENC_TERM_FILES) && !defined(POSENC_TERM_FILES_INCLUDED)
#define POSENC_TERM_FILES_INCLUDED
#include "engine/term_dense_impl.h"
#include "engine/term_toeplitz_impl.h"
#include "engine/term_segments_impl.h"
#include "engine/term_fox_impl.h"
#include "engine/term_relative_bias_2d_impl.h"
#include "engine/term_rope_token_impl.h"
#include "engine/term_cope_impl.h"
#include "engine/term_query_table_impl.h"
#include "engine/term_key_table_impl.h"
#include "engine/term_reset_impl.h"
#endif
