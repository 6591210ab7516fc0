/*
 * engine.c -- the portable engine: validation, and the forward/backward
 * templates instantiated for float and double.  Compiled at the baseline
 * ISA; all arithmetic-heavy work goes through the dispatched kernel table.
 */
#include "engine.h"

#include <string.h>

/* ------------------------------------------------------------ float */
#define REAL float
#define T(name) name##_f32
#define T_DTYPE POSENC_F32
#include "common_impl.h"
#include "forward_impl.h"
#include "backward_impl.h"
#undef REAL
#undef T
#undef T_DTYPE
#undef T_KC
#undef T_WS_TAKE
#undef T_V_BUDGET

/* ------------------------------------------------------------ double */
#define REAL double
#define T(name) name##_f64
#define T_DTYPE POSENC_F64
#include "common_impl.h"
#include "forward_impl.h"
#include "backward_impl.h"
#undef REAL
#undef T
#undef T_DTYPE

static int check_heads(size_t heads, size_t H) { return heads == H || heads == 1; }

static int map_in_range(const int64_t *map, size_t len, size_t rows)
{
    for (size_t t = 0; t < len; ++t)
        if (map[t] < 0 || (uint64_t)map[t] >= rows)
            return 0;
    return 1;
}

static int ids_in_range(const int64_t *ids, size_t len, size_t S)
{
    for (size_t t = 0; t < len; ++t)
        if (ids[t] < 0 || (uint64_t)ids[t] >= S)
            return 0;
    return 1;
}

int posenc_validate(const posenc_problem *p, const char **why)
{
    const char *reason = NULL;
    const size_t offsets = (p->n && p->m) ? p->n + p->m - 1 : 0;
    if (p->dtype != POSENC_F32 && p->dtype != POSENC_F64)
        reason = "unknown dtype";
    else if (!p->q || !p->k)
        reason = "q and k are required";
    else if (p->pos_q && (!p->pos_k || !check_heads(p->pos_q_heads, p->H) ||
                          !check_heads(p->pos_k_heads, p->H)))
        reason = "dense factor: pos_q and pos_k come together, heads H or 1";
    else if (p->table && (!p->table_map || !check_heads(p->table_heads, p->H) ||
                          !map_in_range(p->table_map, offsets, p->table_rows)))
        reason = "scalar table: heads H or 1, map entries within its rows";
    else if (p->vq_table && (!p->vq_map || !check_heads(p->vq_heads, p->H) ||
                             !map_in_range(p->vq_map, offsets, p->vq_rows)))
        reason = "query-side table: heads H or 1, map entries within its rows";
    else if (p->vk_table && (!p->vk_map || !check_heads(p->vk_heads, p->H) ||
                             !map_in_range(p->vk_map, offsets, p->vk_rows)))
        reason = "key-side table: heads H or 1, map entries within its rows";
    else if (p->seg_table && (!p->seg_q || !p->seg_k || !check_heads(p->seg_heads, p->H) ||
                              !ids_in_range(p->seg_q, p->B * p->n, p->n_segments) ||
                              !ids_in_range(p->seg_k, p->B * p->m, p->n_segments)))
        reason = "segments: ids within the table, heads H or 1";
    else if (p->theta && !check_heads(p->theta_heads, p->H))
        reason = "theta: heads H or 1";
    else if (p->combine == POSENC_PRODUCT && (p->pos_q || p->seg_table || p->theta))
        reason = "product combine takes only table, query-side and key-side factors";
    else if (p->combine == POSENC_PRODUCT && !p->table && !p->vq_table && !p->vk_table)
        reason = "product combine needs at least one factor";
    else if (p->combine != POSENC_SUM && p->combine != POSENC_PRODUCT)
        reason = "unknown combine";
    if (why)
        *why = reason;
    return reason ? POSENC_EINVAL : POSENC_OK;
}

int posenc_forward(const posenc_problem *p, void *out, int num_threads)
{
    return p->dtype == POSENC_F32 ? posenc_forward_f32(p, out, num_threads)
                                  : posenc_forward_f64(p, out, num_threads);
}

int posenc_backward(const posenc_problem *p, const void *grad, const posenc_grads *g,
                    int num_threads)
{
    return p->dtype == POSENC_F32 ? posenc_backward_f32(p, grad, g, num_threads)
                                  : posenc_backward_f64(p, grad, g, num_threads);
}
