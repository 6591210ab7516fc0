/*
 * engine.h -- internals shared by the engine's files (not the public API):
 * the kernels a problem runs on, grouped-query heads, streamed stores and
 * prefetches, and the per-dtype entry points (engine_f32.c, engine_f64.c,
 * engine_lp.c).  It includes the engine's lower layers: memory (alloc.h),
 * bucket runs (runs.h) and spans (spans.h), teams of threads (threads.h).
 */
#ifndef POSENC_ENGINE_H
#define POSENC_ENGINE_H

#include "../posenc.h"
#include "alloc.h"
#include "runs.h"
#include "spans.h"
#include "threads.h"

#include <string.h>

/* The kernels the engine runs a problem of `dtype` on: the active ISA's, or
 * for a float32 problem with bf16_gemm (its arrays hold bfloat16 values)
 * those with the bfloat16 GEMM where the CPU has it (posenc_bf16_gemm_kernels). */
static inline const posenc_kernels *posenc_engine_kernels(const posenc_problem *p,
                                                          posenc_dtype dtype)
{
    const posenc_kernels *bf16 = dtype == POSENC_F32 && p->bf16_gemm ? posenc_bf16_gemm_kernels()
                                                                     : NULL;
    return bf16 ? bf16 : posenc_active_kernels(dtype);
}

/* Grouped-query attention (SPEC §7): the query heads per key head, and the key
 * (and value) unit b H_kv + h / group of query unit u = b H + h. */
static inline size_t posenc_kv_group(const posenc_problem *p)
{
    return p->H_kv ? p->H / p->H_kv : 1;
}

static inline size_t posenc_kv_heads(const posenc_problem *p)
{
    return p->H / posenc_kv_group(p);
}

static inline size_t posenc_kv_unit(const posenc_problem *p, size_t u)
{
    const size_t group = posenc_kv_group(p);
    return (u / p->H) * posenc_kv_heads(p) + (u % p->H) / group;
}

/*
 * Rows [r0, r1) of unit (b, h) of a (B, heads, rows, cols) input x with strides s
 * (posenc.h), elements of `elem` bytes: where x is contiguous, its unit's row 0 (row i
 * at + i cols); else rows [r0, r1) copied into the same rows of dst (rows x cols), and
 * dst.  The one place the engine reads a strided input (q, k, v, d_out).
 */
static inline const void *posenc_unit_rows(void *dst, const void *x, const posenc_strides *s,
                                           size_t heads, size_t rows, size_t cols, size_t elem,
                                           size_t b, size_t h, size_t r0, size_t r1)
{
    if (!s->r)
        return (const char *)x + (b * heads + h) * rows * cols * elem;
    const char *unit =
        (const char *)x + ((ptrdiff_t)b * s->b + (ptrdiff_t)h * s->h) * (ptrdiff_t)elem;
    for (size_t i = r0; i < r1; ++i)
        memcpy((char *)dst + i * cols * elem, unit + (ptrdiff_t)i * s->r * (ptrdiff_t)elem,
               cols * elem);
    return dst;
}

/*
 * Rows of the key/value unit of query unit (b, h) (b H_kv + h / group: posenc_kv_unit)
 * of a (B, H_kv, rows, cols) input x (k or v) with strides s: in place where x is
 * contiguous; else copied into dst (posenc_unit_rows) once for the query heads of a group
 * that read it in turn: *held is 1 + the unit dst holds, 0 for none (a caller that
 * changes dst in place zeroes it).
 */
static inline const void *posenc_kv_rows(void *dst, size_t *held, const void *x,
                                         const posenc_strides *s, const posenc_problem *p,
                                         size_t b, size_t h, size_t rows, size_t cols,
                                         size_t elem)
{
    const size_t group = posenc_kv_group(p), heads = p->H / group, kv = b * heads + h / group;
    if (!s->r)
        return (const char *)x + kv * rows * cols * elem;
    if (*held != kv + 1) {
        posenc_unit_rows(dst, x, s, heads, rows, cols, elem, b, h / group, 0, rows);
        *held = kv + 1;
    }
    return dst;
}

/* Whether p reads q or k strided (posenc_unit_rows copies their units' rows). */
static inline int posenc_inputs_strided(const posenc_problem *p)
{
    return p->q_strides.r != 0 || p->k_strides.r != 0;
}

/* Whether logits `out` of `rows` rows of m items of `itemsize` bytes go
 * straight to memory: logits much larger than the caches are written with
 * non-temporal stores (POSENC_UKR_STREAM: no read-for-ownership of their
 * lines), which need 64-byte aligned rows. */
static inline int posenc_stream_logits(const void *out, size_t rows, size_t m, size_t itemsize)
{
    return (uintptr_t)out % POSENC_ALIGN == 0 && (m * itemsize) % POSENC_ALIGN == 0 &&
           posenc_mul_size(rows, m * itemsize) >= POSENC_STREAM_BYTES;
}

/* Asks the cache for the lines of [at, at + bytes) before they are first
 * read: a tile's operands that come from memory (the rows of q a GEMM reads
 * in place, the keys a causal tile packs next) are requested one tile
 * ahead, where the hardware's prefetcher, which follows long runs, would
 * miss them.  A hint: it never faults and changes no result. */
static inline void posenc_prefetch(const void *at, size_t bytes)
{
#if defined(__GNUC__)
    const uintptr_t end = (uintptr_t)at + bytes;
    for (uintptr_t line = (uintptr_t)at & ~(uintptr_t)63; line < end; line += 64)
        __builtin_prefetch((const void *)line, 0, 3);
#else
    (void)at;
    (void)bytes;
#endif
}

/* The engine of one dtype (engine_f32.c, engine_f64.c; engine_lp.c for
 * bfloat16 and float16): its entry points,
 * with the signatures of posenc_forward and company in posenc.h. */
typedef struct {
    int (*forward)(const posenc_problem *p, void *out, int num_threads);
    int (*backward)(const posenc_problem *p, const void *grad, const posenc_grads *g,
                    int num_threads);
    int (*attention_forward)(const posenc_problem *p, const posenc_attention *a, void *out,
                             void *lse, int num_threads);
    int (*attention_backward)(const posenc_problem *p, const posenc_attention *a,
                              const void *d_out, const void *out, const void *lse,
                              const posenc_grads *g, void *grad_v, int num_threads);
    int (*matmul)(const posenc_matmul_problem *mm, int num_threads);   /* NULL: not served */
    /* the first term kind whose REAL-side grad_block and term_<name>_by_blocks flag
     * (posenc_term_by_blocks) disagree, or -1 (term_kinds_check; the C tests call it);
     * NULL: the engine has no kinds of its own (engine_lp.c) */
    int (*term_kinds_check)(void);
} posenc_engine;

extern const posenc_engine posenc_engine_f32, posenc_engine_f64, posenc_engine_lp;

/* Whether kind k's gradient goes by blocks (csrc/terms.h, a kind's term_<name>_by_blocks:
 * TUPE's dense factor), and whether p has such a kind; in terms.c. */
int posenc_term_by_blocks(int k);
int posenc_terms_by_blocks(const posenc_problem *p);
/* Whether kind k is a vector table (a kind's term_<name>_vector: term_vectors.h), and
 * whether p has one; in terms.c. */
int posenc_term_vector(int k);
int posenc_terms_vector(const posenc_problem *p);
/* Whether the engine sums kind k's gradient over the batch itself, into batch row 0's units
 * (by blocks, or a vector table's slots), rather than per unit (entry.c's fold). */
int posenc_term_summed(int k);

#endif /* POSENC_ENGINE_H */
