/*
 * backward_impl.h -- gradients of sum(G * A) for one dtype (see common_impl.h).
 *
 * Phase 1, parallel over (b, h) units, each owned by one thread:
 *   dq = s Gc.k (+ Gq.vq),  dk = s Gc^T.q (+ Gk.vk),
 *   where Gc is G (sum) or G times the positional factors (product), Gq
 *   (n x buckets) and Gk (m x buckets) are G scattered into buckets along
 *   each bucket's diagonals, and the unit's partial table / segment / theta
 *   / vector-table gradients go to a slot of their own.  The GEMMs through
 *   Gq and Gk skip, tile by tile, the buckets (or rows) a tile cannot reach
 *   (posenc_spans): with DeBERTa's 2k buckets about a third of their work.
 * Phase 2, parallel over heads: the dense factor's gradients from
 *   S_h = sum_b G[b, h]:  dpos_q = ds S_h.pos_k,  dpos_k = ds S_h^T.pos_q.
 * Phase 3: the slots are summed in a fixed (h, b) order.
 * No sum ever depends on which thread ran what: the gradients are bitwise
 * identical for any number of threads.
 */

typedef struct {
    const posenc_problem *p;
    const posenc_kernels *K;
    const posenc_grads *g;
    const REAL *G;
    size_t m_pad, rb, offsets;
    int product, masked;
    int need_gc, need_gq, need_gk, need_diag;
    REAL *tv;
    posenc_runs vq_runs, vk_runs;
    posenc_spans vq_spans, vk_spans;   /* where Gq and Gk are zero */
    posenc_seg_runs seg_runs;
    size_t rq, rk;
    REAL *diag_slots, *seg_slots, *theta_slots, *vq_slots, *vk_slots;
    REAL *dense_q_slots, *dense_k_slots;
} T(bwd_ctx);

typedef struct {
    T(gemm_scratch) g;
    REAL *bbuf;       /* packed B of the backward gemms */
    REAL *Gq;         /* n x rq */
    REAL *Gk;         /* m x rk */
    /* product mode */
    REAL *k_pack, *Cs, *Fq, *Fk, *qa, *vq_pack, *ka, *vk_pack, *Gk_tile, *Gc, *row;
    /* dense phase */
    REAL *S;
    ptrdiff_t vq_head;
} T(bwd_ws);

static size_t T(bwd_ws_layout)(const T(bwd_ctx) *c, T(bwd_ws) *w, REAL *mem)
{
    const posenc_problem *p = c->p;
    const size_t mr = c->K->mr, nr = c->K->nr, n = p->n, m = p->m, d = p->d;
    const size_t rq_pad = posenc_round_up(posenc_max(c->rq, 1), nr);
    size_t at = 0;
    if (w) {
        memset(w, 0, sizeof *w);
        T(gemm_scratch_carve)(&w->g, mem, c->K);
        w->vq_head = -1;
    }
    at += posenc_round_up(T(gemm_scratch_size)(c->K), 16);
    const size_t kmax = posenc_max(posenc_max(n, m), posenc_max(posenc_max(c->rq, c->rk), c->rb));
    T_WS_TAKE(w, mem, at, bbuf, T(packed_b_size)(kmax, posenc_max(d, p->d_p), nr));
    if (c->need_gq) T_WS_TAKE(w, mem, at, Gq, n * c->rq);
    if (c->need_gk) T_WS_TAKE(w, mem, at, Gk, m * c->rk);
    if (c->product) {
        T_WS_TAKE(w, mem, at, k_pack, T(packed_b_size)(d, m, nr));
        T_WS_TAKE(w, mem, at, Cs, mr * c->m_pad);
        T_WS_TAKE(w, mem, at, row, c->m_pad);
        T_WS_TAKE(w, mem, at, Gc, c->rb * c->m_pad);
        if (p->vq_table) {
            T_WS_TAKE(w, mem, at, Fq, mr * c->m_pad);
            T_WS_TAKE(w, mem, at, qa, mr * rq_pad);
            T_WS_TAKE(w, mem, at, vq_pack, T(packed_b_size)(d, c->rq, nr));
        }
        if (p->vk_table) {
            T_WS_TAKE(w, mem, at, Fk, mr * c->m_pad);
            T_WS_TAKE(w, mem, at, ka, m * c->rk);
            T_WS_TAKE(w, mem, at, vk_pack, T(packed_b_size)(d, c->rk, nr));
            T_WS_TAKE(w, mem, at, Gk_tile, mr * c->m_pad);
        }
    }
    if (p->pos_q && (c->g->pos_q || c->g->pos_k))
        T_WS_TAKE(w, mem, at, S, c->rb * m);
    return posenc_round_up(at, POSENC_ALIGN / sizeof(REAL));
}

/*
 * G row i (columns [jb, m)) scattered into its q-side buckets: Gq[i, bucket],
 * run by run.  Short runs (log buckets: a few keys per bucket) are summed
 * in place rather than through the ISA's row kernel, whose setup would
 * dominate them.
 */
static void T(scatter_vq)(const posenc_kernels *K, const posenc_runs *runs, REAL *Gq_row,
                          const REAL *src, ptrdiff_t i, ptrdiff_t jb, ptrdiff_t m)
{
    ptrdiff_t js, je, bs;
    for (size_t t = posenc_runs_seek(runs, jb - i);
         t < runs->count && posenc_run_span(&runs->runs[t], i, jb, m, &js, &je, &bs); ++t) {
        REAL *dst = Gq_row + (bs - runs->b_min);
        const ptrdiff_t step = runs->runs[t].step;
        if (je - js > 16) {
            K->row_scatter_add(dst, step, src + js, (size_t)(je - js));
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

/*
 * Rows [i0, i0 + rows) of an effective gradient (row r at src + r * lds)
 * scattered into their k-side buckets: Gk[j, map(j - i)] += src[r, j] (the
 * ISA's tile scatter, the adjoint of rows_vk).  Columns < jb and, with
 * skip_row0, row 0 belong to theta.  A bucket's sum runs over i in order.
 */
static void T(scatter_vk)(const posenc_kernels *K, REAL *Gk, size_t ldgk, const int64_t *map,
                          ptrdiff_t b_min, const REAL *src, size_t lds, size_t n, size_t m,
                          size_t i0, size_t rows, size_t jb, int skip_row0)
{
    const size_t r0 = (skip_row0 && i0 == 0) ? 1 : 0;
    K->tile_scatter_key(Gk, ldgk, map + (n - 1 - i0), b_min, src, lds, jb, m, r0, rows);
}

/* The positional gradients of one row from its effective gradients. */
typedef struct {
    const REAL *for_vq, *for_table, *for_segment;   /* the k side goes tile by tile */
} T(row_grads);

static void T(bwd_row_positional)(const T(bwd_ctx) *c, T(bwd_ws) *w, size_t u, size_t b,
                                  size_t i, const T(row_grads) *rg)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m;
    const ptrdiff_t jb = c->masked ? 1 : 0;   /* column 0 belongs to theta */
    if (c->need_gq && rg->for_vq)
        T(scatter_vq)(K, &c->vq_runs, w->Gq + i * c->rq, rg->for_vq, (ptrdiff_t)i, jb, (ptrdiff_t)m);
    if (c->need_diag && rg->for_table && m > (size_t)jb)
        K->row_scatter_add(c->diag_slots + u * c->offsets + (n - 1 - i) + jb, 1, rg->for_table + jb,
                           m - jb);
    if (p->seg_table && c->g->seg_table && rg->for_segment) {
        const size_t S = p->n_segments;
        REAL *slot = c->seg_slots + u * S * S + (size_t)p->seg_q[b * n + i] * S;
        for (size_t t = c->seg_runs.start[b]; t < c->seg_runs.start[b + 1]; ++t) {
            const posenc_seg_run *run = &c->seg_runs.runs[t];
            const size_t js = posenc_max(run->j_begin, (size_t)jb);
            if (js < run->j_end)
                K->row_scatter_add(slot + run->segment, 0, rg->for_segment + js, run->j_end - js);
        }
    }
}

/* Product mode: rebuild the factors of tile [i0, i0 + rows) and form the
 * effective gradients: Gc = G prod(F), G_x = G (s C) prod(F without x). */
static void T(bwd_product_tile)(const T(bwd_ctx) *c, T(bwd_ws) *w, size_t u, size_t b, size_t h,
                                const T(packed_b) *kb, size_t blk0, size_t i0, size_t rows)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m, d = p->d, ld = c->m_pad;
    const REAL *q_u = (const REAL *)p->q + u * n * d;
    const REAL *G_u = c->G + u * n * m;

    T(gemm_packed)(K, &w->g, rows, q_u + i0 * d, (ptrdiff_t)d, 1, (REAL)p->scale, kb, w->Cs,
                   (ptrdiff_t)ld, 0, NULL, 0, NULL, 0, NULL);
    if (p->vq_table)
        T(tile_vq)(K, &w->g, p, &c->vq_runs, c->rq, w->vq_pack, &w->vq_head, w->qa, h, q_u,
                   POSENC_SET, w->Fq, ld, i0, rows);
    if (p->vk_table)
        T(rows_vk)(K, POSENC_SET, w->Fk, ld, p->vk_map, c->vk_runs.b_min, w->ka, c->rk, n, m, i0, rows);

    const REAL *tv = p->table ? c->tv + T(head_of)(p->table_heads, h) * c->offsets : NULL;
    enum { FACTOR_TABLE, FACTOR_VQ, FACTOR_VK };
    for (size_t r = 0; r < rows; ++r) {
        const size_t i = i0 + r;
        const REAL *g_row = G_u + i * m;
        const REAL *factor[3];
        int kind[3], wanted[3], nf = 0;
        if (tv) {
            factor[nf] = tv + (n - 1 - i); kind[nf] = FACTOR_TABLE; wanted[nf++] = c->need_diag;
        }
        if (p->vq_table) {
            factor[nf] = w->Fq + r * ld; kind[nf] = FACTOR_VQ; wanted[nf++] = c->need_gq;
        }
        if (p->vk_table) {
            factor[nf] = w->Fk + r * ld; kind[nf] = FACTOR_VK; wanted[nf++] = c->need_gk;
        }
        if (c->need_gc) {
            REAL *gc = w->Gc + (i - blk0) * ld;
            K->row_mul(gc, g_row, factor[0], m);
            for (int f = 1; f < nf; ++f)
                K->row_gather(POSENC_MUL, gc, factor[f], 1, m);
        }
        /* one effective gradient per factor: G (s C) times the other factors */
        for (int x = 0; x < nf; ++x) {
            if (!wanted[x])
                continue;
            /* the k side is scattered tile by tile: its rows are kept */
            REAL *eff = kind[x] == FACTOR_VK ? w->Gk_tile + r * ld : w->row;
            K->row_mul(eff, g_row, w->Cs + r * ld, m);
            for (int f = 0; f < nf; ++f)
                if (f != x)
                    K->row_gather(POSENC_MUL, eff, factor[f], 1, m);
            if (kind[x] != FACTOR_VK) {
                T(row_grads) rg = {NULL, NULL, NULL};
                if (kind[x] == FACTOR_TABLE) rg.for_table = eff;
                else rg.for_vq = eff;
                T(bwd_row_positional)(c, w, u, b, i, &rg);
            }
        }
    }
    if (c->need_gk)
        T(scatter_vk)(K, w->Gk, c->rk, p->vk_map, c->vk_runs.b_min, w->Gk_tile, ld, n, m, i0, rows, 0, 0);
}

static void T(bwd_unit)(const T(bwd_ctx) *c, T(bwd_ws) *w, size_t u)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const posenc_grads *g = c->g;
    const size_t n = p->n, m = p->m, d = p->d, b = u / p->H, h = u % p->H;
    const REAL *q_u = (const REAL *)p->q + u * n * d;
    const REAL *k_u = (const REAL *)p->k + u * m * d;
    const REAL *G_u = c->G + u * n * m;
    REAL *dq_u = g->q ? (REAL *)g->q + u * n * d : NULL;
    REAL *dk_u = g->k ? (REAL *)g->k + u * m * d : NULL;
    const REAL s = (REAL)p->scale, vs = (REAL)p->vec_scale;

    if (c->need_gq) memset(w->Gq, 0, sizeof(REAL) * n * c->rq);
    if (c->need_gk) memset(w->Gk, 0, sizeof(REAL) * m * c->rk);

    T(packed_b) kb;
    if (c->product) {
        T(pack_b)(&kb, w->k_pack, k_u, 1, (ptrdiff_t)d, d, m, K->nr, (REAL)1);
        if (p->vk_table)
            T(unit_ka)(K, &w->g, p, c->vk_runs.b_min, c->rk, w->vk_pack, w->ka, h, k_u);
    }

    for (size_t blk0 = 0; blk0 < n; blk0 += c->rb) {
        const size_t rows_blk = posenc_min(c->rb, n - blk0);
        const REAL *Gc = G_u + blk0 * m;
        size_t ldg = m;
        if (c->product) {
            for (size_t i0 = blk0; i0 < blk0 + rows_blk; i0 += K->mr)
                T(bwd_product_tile)(c, w, u, b, h, &kb, blk0, i0,
                                    posenc_min(K->mr, blk0 + rows_blk - i0));
            Gc = w->Gc;
            ldg = c->m_pad;
        } else {
            for (size_t i = blk0; i < blk0 + rows_blk; ++i) {
                const REAL *g_row = G_u + i * m;
                if (c->masked && g->theta) {
                    REAL *theta_slot = c->theta_slots + u * 2;
                    if (i == 0)
                        K->row_scatter_add(theta_slot, 0, g_row, m);
                    else
                        theta_slot[1] += g_row[0];
                }
                if (c->masked && i == 0)
                    continue;      /* row 0 belongs to theta */
                T(row_grads) rg = {g_row, g_row, g_row};
                T(bwd_row_positional)(c, w, u, b, i, &rg);
            }
            if (c->need_gk)
                T(scatter_vk)(K, w->Gk, c->rk, p->vk_map, c->vk_runs.b_min, G_u + blk0 * m, m, n, m,
                              blk0, rows_blk, c->masked ? 1 : 0, c->masked);
        }
        if (dq_u && c->need_gc)
            T(gemm)(K, &w->g, w->bbuf, rows_blk, d, m, Gc, (ptrdiff_t)ldg, 1, k_u, (ptrdiff_t)d, 1,
                    s, dq_u + blk0 * d, (ptrdiff_t)d, 0, NULL);
        if (dk_u && c->need_gc)
            T(gemm)(K, &w->g, w->bbuf, m, d, rows_blk, Gc, 1, (ptrdiff_t)ldg, q_u + blk0 * d,
                    (ptrdiff_t)d, 1, s, dk_u, (ptrdiff_t)d, blk0 > 0, NULL);
    }

    if (c->need_gq) {
        const size_t hv = T(head_of)(p->vq_heads, h);
        const REAL *vq = (const REAL *)p->vq_table + (hv * p->vq_rows + (size_t)c->vq_runs.b_min) * d;
        if (dq_u)
            T(gemm)(K, &w->g, w->bbuf, n, d, c->rq, w->Gq, (ptrdiff_t)c->rq, 1, vq, (ptrdiff_t)d, 1,
                    vs, dq_u, (ptrdiff_t)d, 1, c->vq_spans.by_row);
        if (g->vq_table)
            T(gemm)(K, &w->g, w->bbuf, c->rq, d, n, w->Gq, 1, (ptrdiff_t)c->rq, q_u, (ptrdiff_t)d, 1,
                    vs, c->vq_slots + u * c->rq * d, (ptrdiff_t)d, 0, c->vq_spans.by_bucket);
    }
    if (c->need_gk) {
        const size_t hv = T(head_of)(p->vk_heads, h);
        const REAL *vk = (const REAL *)p->vk_table + (hv * p->vk_rows + (size_t)c->vk_runs.b_min) * d;
        if (dk_u)
            T(gemm)(K, &w->g, w->bbuf, m, d, c->rk, w->Gk, (ptrdiff_t)c->rk, 1, vk, (ptrdiff_t)d, 1,
                    vs, dk_u, (ptrdiff_t)d, 1, c->vk_spans.by_row);
        if (g->vk_table)
            T(gemm)(K, &w->g, w->bbuf, c->rk, d, m, w->Gk, 1, (ptrdiff_t)c->rk, k_u, (ptrdiff_t)d, 1,
                    vs, c->vk_slots + u * c->rk * d, (ptrdiff_t)d, 0, c->vk_spans.by_bucket);
    }
}

/* Phase 2: the dense factor's gradients of head h, block by block of S_h. */
static void T(bwd_dense_head)(const T(bwd_ctx) *c, T(bwd_ws) *w, size_t h)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m, dp = p->d_p, H = p->H;
    const REAL ds = (REAL)p->dense_scale;
    const REAL *pos_q = (const REAL *)p->pos_q + T(head_of)(p->pos_q_heads, h) * n * dp;
    const REAL *pos_k = (const REAL *)p->pos_k + T(head_of)(p->pos_k_heads, h) * m * dp;
    REAL *slot_q = c->dense_q_slots + h * n * dp;
    REAL *slot_k = c->dense_k_slots + h * m * dp;
    for (size_t blk0 = 0; blk0 < n; blk0 += c->rb) {
        const size_t rows = posenc_min(c->rb, n - blk0);
        for (size_t b = 0; b < p->B; ++b) {
            const REAL *G_blk = c->G + ((b * H + h) * n + blk0) * m;
            for (size_t r = 0; r < rows; ++r)
                K->row_gather(b == 0 ? POSENC_SET : POSENC_ADD, w->S + r * m, G_blk + r * m, 1, m);
        }
        if (c->masked) {   /* row 0 and column 0 belong to theta */
            for (size_t r = 0; r < rows; ++r) {
                if (blk0 + r == 0)
                    memset(w->S, 0, sizeof(REAL) * m);
                w->S[r * m] = 0;
            }
        }
        if (c->g->pos_q)
            T(gemm)(K, &w->g, w->bbuf, rows, dp, m, w->S, (ptrdiff_t)m, 1, pos_k, (ptrdiff_t)dp, 1,
                    ds, slot_q + blk0 * dp, (ptrdiff_t)dp, 0, NULL);
        if (c->g->pos_k)
            T(gemm)(K, &w->g, w->bbuf, m, dp, rows, w->S, 1, (ptrdiff_t)m, pos_q + blk0 * dp,
                    (ptrdiff_t)dp, 1, ds, slot_k, (ptrdiff_t)dp, blk0 > 0, NULL);
    }
}

/* Phase 3: out[head_of(h)] += slot[b, h] in (h, b) order; out zeroed first. */
static void T(bwd_reduce)(const T(bwd_ctx) *c)
{
    const posenc_problem *p = c->p;
    const posenc_grads *g = c->g;
    const size_t B = p->B, H = p->H, n = p->n, m = p->m, d = p->d;
    if (g->table) {
        REAL *out = (REAL *)g->table;
        memset(out, 0, sizeof(REAL) * p->table_heads * p->table_rows);
        for (size_t h = 0; h < H; ++h)
            for (size_t b = 0; b < B; ++b) {
                const REAL *slot = c->diag_slots + (b * H + h) * c->offsets;
                REAL *dst = out + T(head_of)(p->table_heads, h) * p->table_rows;
                for (size_t t = 0; t < c->offsets; ++t)
                    dst[p->table_map[t]] += slot[t];
            }
    }
    const struct { void *out; size_t heads, rows, width; ptrdiff_t row0; REAL *slots; size_t slot_rows; } vec[2] = {
        {g->vq_table, p->vq_heads, p->vq_rows, d, c->vq_runs.b_min, c->vq_slots, c->rq},
        {g->vk_table, p->vk_heads, p->vk_rows, d, c->vk_runs.b_min, c->vk_slots, c->rk},
    };
    for (int v = 0; v < 2; ++v) {
        if (!vec[v].out)
            continue;
        REAL *out = (REAL *)vec[v].out;
        const size_t width = vec[v].width, block = vec[v].slot_rows * width;
        /* one table on both sides: the key side adds to the query side's sums */
        if (v == 0 || vec[1].out != vec[0].out)
            memset(out, 0, sizeof(REAL) * vec[v].heads * vec[v].rows * width);
        for (size_t h = 0; h < H; ++h)
            for (size_t b = 0; b < B; ++b) {
                const REAL *slot = vec[v].slots + (b * H + h) * block;
                REAL *dst = out + (T(head_of)(vec[v].heads, h) * vec[v].rows + (size_t)vec[v].row0) * width;
                for (size_t t = 0; t < block; ++t)
                    dst[t] += slot[t];
            }
    }
    if (g->seg_table) {
        const size_t SS = p->n_segments * p->n_segments;
        REAL *out = (REAL *)g->seg_table;
        memset(out, 0, sizeof(REAL) * p->seg_heads * SS);
        for (size_t h = 0; h < H; ++h)
            for (size_t b = 0; b < B; ++b)
                for (size_t t = 0; t < SS; ++t)
                    out[T(head_of)(p->seg_heads, h) * SS + t] += c->seg_slots[(b * H + h) * SS + t];
    }
    if (g->theta) {
        REAL *out = (REAL *)g->theta;
        memset(out, 0, sizeof(REAL) * p->theta_heads * 2);
        for (size_t h = 0; h < H; ++h)
            for (size_t b = 0; b < B; ++b)
                for (size_t t = 0; t < 2; ++t)
                    out[T(head_of)(p->theta_heads, h) * 2 + t] += c->theta_slots[(b * H + h) * 2 + t];
    }
    const struct { void *out; size_t heads, rows; REAL *slots; } dense[2] = {
        {g->pos_q, p->pos_q_heads, n, c->dense_q_slots},
        {g->pos_k, p->pos_k_heads, m, c->dense_k_slots},
    };
    for (int v = 0; v < 2; ++v) {
        if (!dense[v].out)
            continue;
        REAL *out = (REAL *)dense[v].out;
        const size_t block = dense[v].rows * p->d_p;
        memset(out, 0, sizeof(REAL) * dense[v].heads * block);
        for (size_t h = 0; h < H; ++h) {
            REAL *dst = out + T(head_of)(dense[v].heads, h) * block;
            for (size_t t = 0; t < block; ++t)
                dst[t] += dense[v].slots[h * block + t];
        }
    }
}

/* Every wanted output zeroed: the gradients of an empty problem. */
static void T(bwd_zero)(const posenc_problem *p, const posenc_grads *g)
{
    const size_t BH = p->B * p->H;
    const struct { void *ptr; size_t count; } outs[] = {
        {g->q, BH * p->n * p->d},
        {g->k, BH * p->m * p->d},
        {g->pos_q, p->pos_q_heads * p->n * p->d_p},
        {g->pos_k, p->pos_k_heads * p->m * p->d_p},
        {g->table, p->table_heads * p->table_rows},
        {g->vq_table, p->vq_heads * p->vq_rows * p->d},
        {g->vk_table, p->vk_heads * p->vk_rows * p->d},
        {g->seg_table, p->seg_heads * p->n_segments * p->n_segments},
        {g->theta, p->theta_heads * 2},
    };
    for (size_t t = 0; t < sizeof outs / sizeof outs[0]; ++t)
        if (outs[t].ptr && outs[t].count)
            memset(outs[t].ptr, 0, sizeof(REAL) * outs[t].count);
}

static void T(bwd_release)(T(bwd_ctx) *c)
{
    posenc_free(c->tv);
    posenc_runs_free(&c->vq_runs);
    posenc_runs_free(&c->vk_runs);
    posenc_spans_free(&c->vq_spans);
    posenc_spans_free(&c->vk_spans);
    posenc_seg_runs_free(&c->seg_runs);
    posenc_free(c->diag_slots);
    posenc_free(c->seg_slots);
    posenc_free(c->theta_slots);
    posenc_free(c->vq_slots);
    posenc_free(c->vk_slots);
    posenc_free(c->dense_q_slots);
    posenc_free(c->dense_k_slots);
}

static int T(bwd_prepare)(T(bwd_ctx) *c, const posenc_problem *p, const posenc_kernels *K,
                          const REAL *G, const posenc_grads *g)
{
    const size_t n = p->n, m = p->m, BH = p->B * p->H, offsets = n + m - 1;
    memset(c, 0, sizeof *c);
    c->p = p;
    c->K = K;
    c->g = g;
    c->G = G;
    c->offsets = offsets;
    c->m_pad = posenc_round_up(m, K->nr);
    c->rb = T_KC;   /* a row block's dk update is one packed depth: see bwd_unit */
    c->product = p->combine == POSENC_PRODUCT;
    c->masked = p->theta != NULL;
    c->need_gc = g->q || g->k;
    c->need_gq = p->vq_table && (g->q || g->vq_table);
    c->need_gk = p->vk_table && (g->k || g->vk_table);
    c->need_diag = p->table && g->table;
    if (p->table && c->product) {
        c->tv = (REAL *)posenc_alloc(p->table_heads * offsets, sizeof(REAL));
        if (!c->tv)
            return POSENC_ENOMEM;
        for (size_t ht = 0; ht < p->table_heads; ++ht)
            for (size_t t = 0; t < offsets; ++t)
                c->tv[ht * offsets + t] = ((const REAL *)p->table)[ht * p->table_rows + (size_t)p->table_map[t]];
    }
    if (p->vq_table) {
        if (posenc_runs_build(&c->vq_runs, p->vq_map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        c->rq = (size_t)(c->vq_runs.b_max - c->vq_runs.b_min + 1);
        if (c->need_gq && posenc_spans_build(&c->vq_spans, &c->vq_runs, p->vq_map, n, m, 0,
                                             c->masked ? 1 : 0, K->mr))
            return POSENC_ENOMEM;
    }
    if (p->vk_table) {
        if (posenc_runs_build(&c->vk_runs, p->vk_map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        c->rk = (size_t)(c->vk_runs.b_max - c->vk_runs.b_min + 1);
        if (c->need_gk && posenc_spans_build(&c->vk_spans, &c->vk_runs, p->vk_map, n, m, 1, 0, K->mr))
            return POSENC_ENOMEM;
    }
    if (p->seg_table && g->seg_table && posenc_seg_runs_build(&c->seg_runs, p->seg_k, p->B, m))
        return POSENC_ENOMEM;
#define T_SLOTS(field, wanted, count)                                     \
    do {                                                                  \
        if (wanted) {                                                     \
            c->field = (REAL *)posenc_alloc((count), sizeof(REAL));       \
            if (!c->field)                                                \
                return POSENC_ENOMEM;                                     \
            memset(c->field, 0, sizeof(REAL) * (count));                  \
        }                                                                 \
    } while (0)
    T_SLOTS(diag_slots, c->need_diag, posenc_mul_size(BH, offsets));
    T_SLOTS(seg_slots, p->seg_table && g->seg_table, posenc_mul_size(BH, p->n_segments * p->n_segments));
    T_SLOTS(theta_slots, p->theta && g->theta, BH * 2);
    T_SLOTS(vq_slots, p->vq_table && g->vq_table, posenc_mul_size(BH, c->rq * p->d));
    T_SLOTS(vk_slots, p->vk_table && g->vk_table, posenc_mul_size(BH, c->rk * p->d));
    T_SLOTS(dense_q_slots, p->pos_q && g->pos_q, posenc_mul_size(p->H, n * p->d_p));
    T_SLOTS(dense_k_slots, p->pos_q && g->pos_k, posenc_mul_size(p->H, m * p->d_p));
#undef T_SLOTS
    return POSENC_OK;
}

int T(posenc_backward)(const posenc_problem *p, const void *grad, const posenc_grads *g,
                       int num_threads)
{
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0) {
        T(bwd_zero)(p, g);
        return POSENC_OK;
    }
    const posenc_kernels *K = posenc_active_kernels(T_DTYPE);
    T(bwd_ctx) c;
    REAL *arena = NULL;
    int status = T(bwd_prepare)(&c, p, K, (const REAL *)grad, g);
    if (status != POSENC_OK)
        goto done;

    const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
    size_t team = posenc_min(threads, BH);
    if (posenc_mul_size(BH * p->n, p->m * (p->d + 1)) < POSENC_PARALLEL_MIN_WORK)
        team = 1;   /* a team's start and barrier cost more than the work */
    const size_t ws = T(bwd_ws_layout)(&c, NULL, NULL);
    arena = (REAL *)posenc_alloc(posenc_mul_size(team, ws), sizeof(REAL));
    if (!arena) {
        status = POSENC_ENOMEM;
        goto done;
    }
    const int phase1 = c.need_gc || c.need_gq || c.need_gk || c.need_diag ||
                       (p->seg_table && g->seg_table) || (p->theta && g->theta);
    const int dense = p->pos_q && (g->pos_q || g->pos_k);

#pragma omp parallel num_threads((int)team)
    {
        T(bwd_ws) w;
        T(bwd_ws_layout)(&c, &w, arena + (size_t)posenc_thread_id() * ws);
        if (phase1) {
#pragma omp for schedule(static)
            for (ptrdiff_t u = 0; u < (ptrdiff_t)BH; ++u)
                T(bwd_unit)(&c, &w, (size_t)u);
        }
        if (dense) {
#pragma omp for schedule(static)
            for (ptrdiff_t h = 0; h < (ptrdiff_t)p->H; ++h)
                T(bwd_dense_head)(&c, &w, (size_t)h);
        }
    }
    T(bwd_reduce)(&c);

done:
    posenc_free(arena);
    T(bwd_release)(&c);
    return status;
}
