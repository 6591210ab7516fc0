/*
 * forward_impl.h -- the fused logits kernel, for one dtype (see common_impl.h).
 *
 * Per (b, h) unit and row tile of mr queries: build the positional rows P
 * of the tile (or point at them), then one register-tiled pass of the
 * content GEMM whose epilogue adds or multiplies P: each logit is written
 * once.  Positional terms that do not depend on b (dense factor, scalar
 * table, reset) are computed once per head into V when B > 1.
 */

/* Dense terms are precomputed per head when they are reused over a batch
 * and V fits this budget per thread; otherwise per row tile. */
#define T_V_BUDGET ((size_t)64 << 20)

typedef struct {
    const posenc_problem *p;
    const posenc_kernels *K;
    size_t m_pad;            /* m rounded up to nr */
    int product;
    int v_mode;              /* dense/table/reset of a head precomputed in V */
    int batch_terms;         /* vq, vk or segments present */
    int toeplitz_only;       /* the table is the only positional term */
    int stream;              /* write the logits with non-temporal stores */
    int seg_rows;            /* segments added by the epilogue from expanded rows (no reset) */
    REAL *tv;                /* table Toeplitz values, table_heads x (n + m - 1) */
    posenc_runs vq_runs, vk_runs;
    posenc_seg_runs seg_runs;
    size_t rq, rk;           /* buckets used by vq / vk */
} T(fwd_ctx);

typedef struct {
    T(gemm_scratch) g;
    REAL *k_pack;            /* content B: k^T panels, d x m_pad */
    REAL *P;                 /* positional rows of a tile, mr x m_pad */
    REAL *qa;                /* q-side projections of a tile, mr x rq_pad */
    REAL *vq_pack;           /* vq table as B: d x rq_pad */
    REAL *ka;                /* key-side projections, m x rk */
    REAL *vk_pack;           /* vk table as B: d x rk_pad */
    REAL *V;                 /* per-head positional block, n x m (v_mode) */
    REAL *dense_pack;        /* pos_k^T panels, d_p x m_pad (not v_mode) */
    REAL *seg_expanded;      /* seg_rows: row s = seg_table[h, s, seg_k[b, j]], S x m */
    const REAL **seg_row;    /* seg_rows: the tile's rows of seg_expanded, mr pointers */
    ptrdiff_t v_head, vq_head, dense_head;
} T(fwd_ws);

/* The workspace of one thread: its size in elements; carved into w when w != NULL. */
static size_t T(fwd_ws_layout)(const T(fwd_ctx) *c, T(fwd_ws) *w, REAL *mem)
{
    const posenc_problem *p = c->p;
    const size_t mr = c->K->mr, nr = c->K->nr;
    size_t at = 0;
    if (w) {
        memset(w, 0, sizeof *w);
        T(gemm_scratch_carve)(&w->g, mem, c->K);
        w->v_head = w->vq_head = w->dense_head = -1;
    }
    at += posenc_round_up(T(gemm_scratch_size)(c->K), 16);
    T_WS_TAKE(w, mem, at, k_pack, T(packed_b_size)(p->d, p->m, nr));
    T_WS_TAKE(w, mem, at, P, mr * c->m_pad);
    if (p->vq_table) {
        T_WS_TAKE(w, mem, at, qa, mr * posenc_round_up(c->rq, nr));
        T_WS_TAKE(w, mem, at, vq_pack, T(packed_b_size)(p->d, c->rq, nr));
    }
    if (p->vk_table) {
        T_WS_TAKE(w, mem, at, ka, c->rk * p->m);
        T_WS_TAKE(w, mem, at, vk_pack, T(packed_b_size)(p->d, c->rk, nr));
    }
    if (c->v_mode)
        T_WS_TAKE(w, mem, at, V, p->n * p->m);
    if (p->pos_q)
        T_WS_TAKE(w, mem, at, dense_pack, T(packed_b_size)(p->d_p, p->m, nr));
    if (c->seg_rows) {
        T_WS_TAKE(w, mem, at, seg_expanded, p->n_segments * p->m);
        T_WS_TAKE(w, mem, at, seg_row, (mr * sizeof(const REAL *) + sizeof(REAL) - 1) / sizeof(REAL));
    }
    return posenc_round_up(at, POSENC_ALIGN / sizeof(REAL));
}

/* V = reset(dense_scale pos_q.pos_k^T + table) of head h (TUPE's batch-free term). */
static void T(fwd_build_v)(const T(fwd_ctx) *c, T(fwd_ws) *w, size_t h)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m, dp = p->d_p;
    const REAL *pos_q = (const REAL *)p->pos_q + T(head_of)(p->pos_q_heads, h) * n * dp;
    const REAL *pos_k = (const REAL *)p->pos_k + T(head_of)(p->pos_k_heads, h) * m * dp;
    T(packed_b) pb;
    T(pack_b)(&pb, w->dense_pack, pos_k, 1, (ptrdiff_t)dp, dp, m, K->nr, (REAL)p->dense_scale);
    T(gemm_packed)(K, &w->g, n, pos_q, (ptrdiff_t)dp, 1, (REAL)1, &pb, w->V, (ptrdiff_t)m, 0,
                   NULL, 0, NULL, 0, NULL);
    if (p->table)
        T(rows_table)(K, POSENC_ADD, w->V, m,
                      c->tv + T(head_of)(p->table_heads, h) * (n + m - 1), n, m, 0, n);
    if (p->theta && !c->batch_terms)
        T(rows_reset)(K, w->V, m, (const REAL *)p->theta + T(head_of)(p->theta_heads, h) * 2, m,
                      0, n);
    w->v_head = (ptrdiff_t)h;
}

/*
 * The positional rows of tile [i0, i0 + rows) of unit (b, h): returns the
 * block P (row r at *P + r * *ldp) and the epilogue flag, or NULL.
 */
static const REAL *T(fwd_positional)(const T(fwd_ctx) *c, T(fwd_ws) *w, size_t b, size_t h,
                                     const REAL *q_u, size_t i0, size_t rows, ptrdiff_t *ldp)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m, ld = c->m_pad;
    const int combine_op = c->product ? POSENC_MUL : POSENC_ADD;
    int op = POSENC_SET;

    if (c->v_mode && !c->batch_terms) {
        *ldp = (ptrdiff_t)m;
        return w->V + i0 * m;
    }
    if (c->toeplitz_only) {
        /* row i of the Toeplitz block starts at tv[n - 1 - i]: stride -1 */
        *ldp = -1;
        return c->tv + T(head_of)(p->table_heads, h) * (n + m - 1) + (n - 1 - i0);
    }
    if (c->v_mode) {
        for (size_t r = 0; r < rows; ++r)
            K->row_gather(POSENC_SET, w->P + r * ld, w->V + (i0 + r) * m, 1, m);
        op = combine_op;
    } else {
        if (p->pos_q) {
            const size_t dp = p->d_p;
            const size_t hq = T(head_of)(p->pos_q_heads, h), hk = T(head_of)(p->pos_k_heads, h);
            T(packed_b) pb = {w->dense_pack, dp, m, posenc_round_up(posenc_max(m, 1), K->nr)};
            if (w->dense_head != (ptrdiff_t)hk) {
                T(pack_b)(&pb, w->dense_pack, (const REAL *)p->pos_k + hk * m * dp, 1,
                          (ptrdiff_t)dp, dp, m, K->nr, (REAL)p->dense_scale);
                w->dense_head = (ptrdiff_t)hk;
            }
            T(gemm_packed)(K, &w->g, rows, (const REAL *)p->pos_q + (hq * n + i0) * dp,
                           (ptrdiff_t)dp, 1, (REAL)1, &pb, w->P, (ptrdiff_t)ld, 0, NULL, 0, NULL, 0, NULL);
            op = combine_op;
        }
        if (p->table) {
            T(rows_table)(K, op, w->P, ld, c->tv + T(head_of)(p->table_heads, h) * (n + m - 1),
                          n, m, i0, rows);
            op = combine_op;
        }
    }
    if (p->vq_table) {
        T(tile_vq)(K, &w->g, p, &c->vq_runs, c->rq, w->vq_pack, &w->vq_head, w->qa, h, q_u, op,
                   w->P, ld, i0, rows);
        op = combine_op;
    }
    if (p->vk_table) {
        T(rows_vk)(K, op, w->P, ld, p->vk_map, c->vk_runs.b_min, w->ka, c->rk, n, m, i0, rows);
        op = combine_op;
    }
    if (p->seg_table && !c->seg_rows) {
        const posenc_seg_run *runs = c->seg_runs.runs + c->seg_runs.start[b];
        const size_t S = p->n_segments;
        T(rows_segment)(K, op, w->P, ld, runs, c->seg_runs.start[b + 1] - c->seg_runs.start[b],
                        p->seg_q + b * n,
                        (const REAL *)p->seg_table + T(head_of)(p->seg_heads, h) * S * S, S, i0, rows);
        op = combine_op;
    }
    if (op == POSENC_SET)
        return NULL; /* content only */
    if (p->theta)
        T(rows_reset)(K, w->P, ld, (const REAL *)p->theta + T(head_of)(p->theta_heads, h) * 2, m,
                      i0, rows);
    *ldp = (ptrdiff_t)ld;
    return w->P;
}

/* Rows [r0, r1) of unit (b, h). */
static void T(fwd_unit)(const T(fwd_ctx) *c, T(fwd_ws) *w, size_t b, size_t h, size_t r0,
                        size_t r1, REAL *out)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *K = c->K;
    const size_t n = p->n, m = p->m, d = p->d, u = b * p->H + h;
    const REAL *q_u = (const REAL *)p->q + u * n * d;
    const REAL *k_u = (const REAL *)p->k + u * m * d;
    REAL *out_u = out + u * n * m;
    const int p_flag = c->product ? POSENC_UKR_MUL_P : POSENC_UKR_ADD_P;

    if (c->v_mode && w->v_head != (ptrdiff_t)h)
        T(fwd_build_v)(c, w, h);

    T(packed_b) kb;
    T(pack_b)(&kb, w->k_pack, k_u, 1, (ptrdiff_t)d, d, m, K->nr, (REAL)1);

    if (p->vk_table)
        T(unit_ka)(K, &w->g, p, c->vk_runs.b_min, c->rk, w->vk_pack, w->ka, h, k_u);

    /* DIET segments: the S rows a query can see, expanded over the keys once
     * per unit; each query row of a tile points at its segment's row. */
    const int64_t *seg_q_b = c->seg_rows ? p->seg_q + b * n : NULL;
    if (c->seg_rows) {
        const size_t S = p->n_segments;
        const posenc_seg_run *runs = c->seg_runs.runs + c->seg_runs.start[b];
        const size_t n_runs = c->seg_runs.start[b + 1] - c->seg_runs.start[b];
        const REAL *table = (const REAL *)p->seg_table + T(head_of)(p->seg_heads, h) * S * S;
        for (size_t s = 0; s < S; ++s) {
            const int64_t segment = (int64_t)s;
            T(rows_segment)(K, POSENC_SET, w->seg_expanded + s * m, m, runs, n_runs, &segment, table,
                            S, 0, 1);
        }
    }

    for (size_t i0 = r0; i0 < r1; i0 += K->mr) {
        const size_t rows = posenc_min(K->mr, r1 - i0);
        ptrdiff_t ldp = 0;
        const REAL *P = T(fwd_positional)(c, w, b, h, q_u, i0, rows, &ldp);
        int flags = (P ? p_flag : 0) | (c->stream ? POSENC_UKR_STREAM : 0);
        if (c->seg_rows) {
            for (size_t r = 0; r < rows; ++r)
                w->seg_row[r] = w->seg_expanded + (size_t)seg_q_b[i0 + r] * m;
            flags |= POSENC_UKR_ADD_Q;
        }
        T(gemm_packed)(K, &w->g, rows, q_u + i0 * d, (ptrdiff_t)d, 1, (REAL)p->scale, &kb,
                       out_u + i0 * m, (ptrdiff_t)m, 0, P, ldp, c->seg_rows ? w->seg_row : NULL,
                       flags, NULL);
    }
}

static int T(fwd_prepare)(T(fwd_ctx) *c, const posenc_problem *p, const posenc_kernels *K,
                          const void *out)
{
    const size_t n = p->n, m = p->m, offsets = n + m - 1;
    memset(c, 0, sizeof *c);
    c->p = p;
    c->K = K;
    c->m_pad = posenc_round_up(posenc_max(m, 1), K->nr);
    c->product = p->combine == POSENC_PRODUCT;
    /* Segments ride on the epilogue's second source unless a reset must
     * override them (sum mode only: product mode has no segments). */
    c->seg_rows = p->seg_table && !p->theta && !c->product;
    c->batch_terms = p->vq_table || p->vk_table || (p->seg_table && !c->seg_rows);
    c->v_mode = p->pos_q && p->B > 1 &&
                posenc_mul_size(n * m, sizeof(REAL)) <= T_V_BUDGET;
    c->toeplitz_only = p->table && !p->pos_q && !c->batch_terms && !p->theta;
    /* Logits much larger than the caches go straight to memory: non-temporal
     * stores skip the read-for-ownership of every line.  Needs 64-byte rows. */
    c->stream = ((uintptr_t)out % POSENC_ALIGN) == 0 && (m * sizeof(REAL)) % POSENC_ALIGN == 0 &&
                posenc_mul_size(p->B * p->H * n, m * sizeof(REAL)) >= POSENC_STREAM_BYTES;
    if (p->table) {
        c->tv = (REAL *)posenc_alloc(p->table_heads * offsets, sizeof(REAL));
        if (!c->tv)
            return POSENC_ENOMEM;
        for (size_t ht = 0; ht < p->table_heads; ++ht) {
            const REAL *row = (const REAL *)p->table + ht * p->table_rows;
            for (size_t t = 0; t < offsets; ++t)
                c->tv[ht * offsets + t] = row[p->table_map[t]];
        }
    }
    if (p->vq_table) {
        if (posenc_runs_build(&c->vq_runs, p->vq_map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        c->rq = (size_t)(c->vq_runs.b_max - c->vq_runs.b_min + 1);
    }
    if (p->vk_table) {
        if (posenc_runs_build(&c->vk_runs, p->vk_map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        c->rk = (size_t)(c->vk_runs.b_max - c->vk_runs.b_min + 1);
    }
    if (p->seg_table && posenc_seg_runs_build(&c->seg_runs, p->seg_k, p->B, m))
        return POSENC_ENOMEM;
    return POSENC_OK;
}

static void T(fwd_release)(T(fwd_ctx) *c)
{
    posenc_free(c->tv);
    posenc_runs_free(&c->vq_runs);
    posenc_runs_free(&c->vk_runs);
    posenc_seg_runs_free(&c->seg_runs);
}

int T(posenc_forward)(const posenc_problem *p, void *out_, int num_threads)
{
    REAL *out = (REAL *)out_;
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0)
        return POSENC_OK;
    const posenc_kernels *K = posenc_active_kernels(T_DTYPE);
    T(fwd_ctx) c;
    REAL *arena = NULL;
    int status = T(fwd_prepare)(&c, p, K, out_);
    if (status != POSENC_OK)
        goto done;

    /* Work items: units, each split into row chunks when units are fewer
     * than threads.  Forward values do not depend on the split. */
    const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
    const size_t tiles = (p->n + K->mr - 1) / K->mr;
    size_t chunks = BH >= threads ? 1 : posenc_min((threads + BH - 1) / BH, tiles);
    const size_t tiles_per_chunk = (tiles + chunks - 1) / chunks;
    chunks = (tiles + tiles_per_chunk - 1) / tiles_per_chunk;
    const size_t items = BH * chunks;
    size_t team = posenc_min(threads, items);
    if (posenc_mul_size(BH * p->n, p->m * (p->d + 1)) < POSENC_PARALLEL_MIN_WORK)
        team = 1;   /* a team's start and barrier cost more than the work */

    const size_t ws = T(fwd_ws_layout)(&c, NULL, NULL);
    arena = (REAL *)posenc_alloc(posenc_mul_size(team, ws), sizeof(REAL));
    if (!arena) {
        status = POSENC_ENOMEM;
        goto done;
    }

#pragma omp parallel num_threads((int)team)
    {
        T(fwd_ws) w;
        T(fwd_ws_layout)(&c, &w, arena + (size_t)posenc_thread_id() * ws);
#pragma omp for schedule(static)
        for (ptrdiff_t item = 0; item < (ptrdiff_t)items; ++item) {
            /* head-major order: consecutive items share a head's V */
            const size_t unit = (size_t)item / chunks, chunk = (size_t)item % chunks;
            const size_t h = unit / p->B, b = unit % p->B;
            const size_t r0 = chunk * tiles_per_chunk * K->mr;
            const size_t r1 = posenc_min(p->n, r0 + tiles_per_chunk * K->mr);
            T(fwd_unit)(&c, &w, b, h, r0, r1, out);
        }
        if (c.stream)
            K->store_fence();
    }

done:
    posenc_free(arena);
    T(fwd_release)(&c);
    return status;
}
