/*
 * bf16dot.c -- the bfloat16 content logits (bf16dot.h) on the kernels of
 * posenc_bf16_kernels (isa/avx512bf16.c): per (b, h) unit, k packed once
 * into pair panels in the thread's workspace, then each row tile of q (read
 * in place) against every panel, the microkernel scaling by s and rounding
 * to bfloat16 as it stores.  Work items as the float engine's forward
 * (forward_impl.h): units, cut into row chunks when there are fewer units
 * than threads.
 */
#include "bf16dot.h"

#include <float.h>
#include <math.h>

#include "engine.h"

typedef struct {
    const posenc_problem *p;
    const posenc_bf16_kernels *kern;
    float scale;
    int stream;              /* POSENC_UKR_STREAM: the logits go straight to memory */
    size_t items, chunks, rows_per_chunk;
    size_t panel_elements;   /* one pair panel: posenc_round_up(d, 2) x nr */
    uint16_t *out;
} bf16dot_work;

/* Whether the problem is a content-only bfloat16 one these kernels serve (q and k
 * contiguous: engine_lp.c gathers strided ones first). */
static int bf16dot_serves(const posenc_problem *p)
{
    const double s = fabs(p->scale);
    return p->dtype == POSENC_BF16 && !posenc_terms_any(p) && !posenc_inputs_strided(p) &&
           !p->rope_cos &&
           (s == 0 || (s >= FLT_MIN && s <= FLT_MAX));
}

/* One thread's items (posenc_run_team; ws: its k panels, m_pad / nr of them). */
static void bf16dot_team(void *arg, void *ws)
{
    const bf16dot_work *w = (const bf16dot_work *)arg;
    const posenc_problem *p = w->p;
    const posenc_bf16_kernels *kern = w->kern;
    const size_t n = p->n, m = p->m, d = p->d, mr = kern->mr, nr = kern->nr;
    uint16_t *k_pack = (uint16_t *)ws;
    size_t packed = SIZE_MAX;   /* the key unit whose keys k_pack holds */
    /* items handed out one at a time: a unit is some 100 us of work, next to
     * which the hand-out costs nothing, and a thread whose core is shared
     * with another process takes fewer of them (the values do not depend on
     * which thread computes an item) */
#pragma omp for schedule(dynamic, 1)
    for (ptrdiff_t item = 0; item < (ptrdiff_t)w->items; ++item) {
        const size_t unit = (size_t)item / w->chunks, chunk = (size_t)item % w->chunks;
        const size_t r0 = chunk * w->rows_per_chunk, r1 = posenc_min(n, r0 + w->rows_per_chunk);
        const uint16_t *q_u = (const uint16_t *)p->q + unit * n * d;
        uint16_t *out_u = w->out + unit * n * m;
        const size_t kv = posenc_kv_unit(p, unit);   /* a group's query heads share it */
        if (packed != kv) {
            const uint16_t *k_u = (const uint16_t *)p->k + kv * m * d;
            for (size_t j0 = 0; j0 < m; j0 += nr)
                kern->pack(k_pack + (j0 / nr) * w->panel_elements, k_u + j0 * d, (ptrdiff_t)d, d,
                           posenc_min(nr, m - j0));
            packed = kv;
        }
        for (size_t i0 = r0; i0 < r1; i0 += mr)
            for (size_t j0 = 0; j0 < m; j0 += nr)
                kern->ukr(d, q_u + i0 * d, (ptrdiff_t)d, k_pack + (j0 / nr) * w->panel_elements,
                          out_u + i0 * m + j0, (ptrdiff_t)m, posenc_min(mr, r1 - i0),
                          posenc_min(nr, m - j0), w->scale, NULL, 0, w->stream);
    }
    if (w->stream)
        kern->store_fence();
}

int posenc_bf16_content_forward(const posenc_problem *p, void *out, int num_threads)
{
    const posenc_bf16_kernels *kern = posenc_active_bf16_kernels();
    if (!kern || !bf16dot_serves(p))
        return -1;
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0)
        return POSENC_OK;
    const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
    const size_t rows = posenc_rows_per_item(BH, p->n, kern->mr, threads);
    const size_t chunks = (p->n + rows - 1) / rows;
    const int stream = posenc_stream_logits(out, BH * p->n, p->m, sizeof(uint16_t));
    bf16dot_work work = {p, kern, (float)p->scale, stream ? POSENC_UKR_STREAM : 0, BH * chunks,
                         chunks, rows, posenc_round_up(p->d, 2) * kern->nr, (uint16_t *)out};
    const size_t panels = posenc_round_up(p->m, kern->nr) / kern->nr;
    const size_t ws_bytes = posenc_mul_size(posenc_mul_size(panels, work.panel_elements),
                                            sizeof(uint16_t));
    if (ws_bytes == SIZE_MAX)
        return POSENC_ENOMEM;
    return posenc_run_team(posenc_team(threads, work.items, p), ws_bytes, bf16dot_team, &work);
}
