/*
 * posenc.h -- the C API of the posenc engine.  Pure C, no Python.
 *
 * Every method of docs/spec.md §3 is one `posenc_problem`: the content term
 * s * q_i.k_j plus term modules, combined by sum or by product (docs/internals.md
 * §1, the term algebra), and optionally a rotation of q and k (rope): q_i, k_j
 * rotated pair by pair by the angles of their positions before any use, the
 * adjoint applied to dq, dk (RoPE, xPos).
 *
 * Sum:     A = s q.k + reset(modules + query table + key table)
 * Product: A = s q.k * module * query table * key table   (M2, M4M; the module a factor
 *                                                         kind: the toeplitz)
 *
 * with the term modules of csrc/terms.h: the dense factor dense_scale pos_q_i .
 * pos_k_j (TUPE, DIET-ABS), the vector tables vector_scale q_i . query_table[h,
 * map(j - i)] (Shaw, M4, M4M, DeBERTa c2p) and vector_scale k_j . key_table[h,
 * map(j - i)] (M4, M4M, DeBERTa p2c), a term of the offset j - i alone
 * (toeplitz: the scalar table of T5, DIET-REL, TUPE-R, M2 read through its map,
 * ALiBi's and KERPLE's biases), DIET's segments, FoX, the 2-D relative bias,
 * per-token rotary tables, CoPE, and TUPE's [CLS] reset (theta[0] on the row at
 * position 0, theta[1] on column 0 of the others, over the sum).
 *
 * Every bucket map is a 1-D array over the offsets o = j - i in
 * [-(n-1), m-1], stored at index o + n - 1, computed once per call.
 * Every array is C-contiguous; heads axes are H or 1 (shared).  The field
 * names are those of posenc/_engine.py's EngineConfig.
 */
#ifndef POSENC_H
#define POSENC_H

#include <stddef.h>
#include <stdint.h>

#include "terms.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The storage type of a problem's float arrays (maps and ids are int64).
 * POSENC_BF16 and POSENC_F16 (bfloat16, IEEE binary16; their bit patterns,
 * uint16_t) compute in float32 (docs/low_precision.md): products and sums in
 * float32, one rounding to nearest even where a result is stored; the
 * attention's lse is float32 for them (float for F32, double for F64).
 */
typedef enum { POSENC_F32 = 0, POSENC_F64 = 1, POSENC_BF16 = 2, POSENC_F16 = 3 } posenc_dtype;

enum {
    POSENC_OK = 0,
    POSENC_ENOMEM = 1,   /* workspace allocation failed */
    POSENC_EINVAL = 2    /* inconsistent problem (posenc_validate says why) */
};

/* A float32 array of a problem that holds a bfloat16 array's values
 * (engine_lp.c's widened inputs): the bfloat16 GEMM reads its operands from
 * src rather than rounding them again.  Unit u = b units_per_row + h of the
 * float32 array (per_unit elements each) is at src + (b src_units_per_row + h)
 * per_unit.  unwritten: base holds no values (engine_lp.c did not widen it):
 * what reads it outside the GEMMs widens rows from src itself. */
typedef struct {
    const float *base;
    const uint16_t *src;
    size_t units, per_unit, units_per_row, src_units_per_row;
    int unwritten;
} posenc_bf16_shadow;

/*
 * A term module's array (terms.h): element (b, h, t), t < per_unit, at data +
 * b batch_stride + h head_stride + t (elements; a stride 0 on an axis of 1,
 * broadcast).
 */
typedef struct {
    const void *data;             /* NULL: not given */
    size_t batch_stride, head_stride;
    size_t per_unit;              /* its elements per (b, h) unit */
} posenc_term_array;

/* A term module of a problem: present when array[0] is given. */
typedef struct {
    posenc_term_array array[POSENC_TERM_ARRAYS_MAX];
} posenc_term;

/* The kinds of terms.h, as indices into a problem's terms[]. */
#define POSENC_TERM_ENUM_(name, ...) POSENC_TERM_##name,
enum { POSENC_TERMS(POSENC_TERM_ENUM_, ) POSENC_TERM_COUNT };
#undef POSENC_TERM_ENUM_

/* What array a of kind k holds (terms.h's `real`): POSENC_TERM_REAL, the problem's compute
 * type (float64 for a float64 problem, float32 for the others); POSENC_TERM_INDEX, int64;
 * else (0) float64. */
enum { POSENC_TERM_REAL = 1, POSENC_TERM_INDEX = 2 };
static inline int posenc_term_array_type(int k, int a)
{
#define POSENC_TERM_TYPE_(name, valid, why, ARRAYS) {ARRAYS},
#define POSENC_TERM_TYPE_ARRAY_(kind_, name, required, grad, length, real) real,
    static const signed char types[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX] = {
        POSENC_TERMS(POSENC_TERM_TYPE_, POSENC_TERM_TYPE_ARRAY_)};
#undef POSENC_TERM_TYPE_ARRAY_
#undef POSENC_TERM_TYPE_
    return types[k][a];
}

/* Whether array a of kind k holds the problem's compute type (posenc_term_array_type). */
static inline int posenc_term_array_real(int k, int a)
{
    return posenc_term_array_type(k, a) == POSENC_TERM_REAL;
}

/* Where the rows of a 4-D input (B, heads, rows, cols) lie: its batch, head and row
 * strides in elements, its last axis contiguous (a transposed view, as Hugging Face
 * models hand q, k and v: (B, n, H, d) read as (B, H, n, d)); r = 0: the array is
 * C-contiguous (b and h unread).  The engine reads a strided input a unit at a time,
 * its rows copied into the thread's workspace (no copy of the whole array). */
typedef struct {
    ptrdiff_t b, h, r;
} posenc_strides;

typedef struct {
    posenc_dtype dtype;
    int product;                  /* 0: terms added to the content; 1: multiplied (M2, M4M) */
    size_t B, H, n, m, d;
    size_t H_kv;                  /* heads of k (and of the attention's v): H, or a divisor of H
                                     (grouped-query attention, SPEC §7: query head h reads key
                                     head h / (H / H_kv)); 0 is taken as H */
    double scale;                 /* s, on the content term */
    const void *q;                /* (B, H, n, d) */
    const void *k;                /* (B, H_kv, m, d) */
    posenc_strides q_strides, k_strides;   /* where q's and k's rows lie (r = 0: contiguous) */

    double dense_scale;           /* the dense term module's ds (terms.h: TUPE's s, DIET-ABS's 1) */

    double vector_scale;          /* on both vector tables (terms.h's query_table, key_table) */

    /* rotation of q and k (RoPE, docs/methods.md): pairs t < rope_pairs of q_i
     * rotated by row p_q(i) of (rope_cos, rope_sin), of k_j by row p_k(j) of
     * (rope_cos_k, rope_sin_k), which are rope_cos, rope_sin unless xPos gives its
     * own; pair t is (x_t, x_{t + rope_pairs}) (half split) or (x_{2t}, x_{2t+1})
     * (rope_interleaved); p_q(i) = positions_q[b, i] or query_offset + i, p_k(j)
     * = positions_k[b, j] or j.  Only with the content term (no positional term).
     * Per-token tables instead: the rope_token module (terms.h), rope_cos NULL,
     * rope_pairs and rope_interleaved as here. */
    const void *rope_cos, *rope_sin, *rope_cos_k, *rope_sin_k;   /* (rope_positions, rope_pairs) */
    size_t rope_positions, rope_pairs;
    const int64_t *positions_q;   /* (B, n) or NULL */
    const int64_t *positions_k;   /* (B, m) or NULL */
    int rope_interleaved;

    size_t query_offset;          /* query row i sits at position query_offset + i (SPEC §1):
                                     the maps arrive built for j - (query_offset + i); the
                                     engine reads it for TUPE's [CLS] row (position 0) */
    int bf16_gemm;                /* float32 arrays that hold bfloat16 values (engine_lp.c):
                                     the engine may run its GEMMs on posenc_bf16_gemm_kernels,
                                     rounding its own float32 operands (the attention's
                                     probabilities and dS) to bfloat16 */
    size_t bf16_out_heads;        /* 0, or (with bf16_gemm, engine_lp.c) the logits forward's out
                                     is bfloat16, unit (b, h) at out + (b bf16_out_heads + h) n m
                                     elements; the float32 engine returns -1, before writing
                                     anything, where it cannot store so */
    /* with bf16_gemm: the arrays of the problem (and of its attention) that have
     * bfloat16 twins (engine_lp.c) */
    const posenc_bf16_shadow *bf16_shadows;
    size_t bf16_shadow_count;
    /* the term modules (terms.h), by kind: added to the logits like the
     * positional terms above (sum mode, no rotation), or (rope_token) the rotation's
     * per-token tables */
    posenc_term terms[POSENC_TERM_COUNT];
} posenc_problem;

/* Whether p has term module k (csrc/terms.h: its first array given), and any. */
static inline int posenc_term_present(const posenc_problem *p, int k)
{
    return p->terms[k].array[0].data != NULL;
}

/* Whether p rotates q and k: by the (P, r) tables (rope_cos), or per token (the
 * rope_token module: rows of its float64 tables, docs/spec.md §3.16). */
static inline int posenc_rotates(const posenc_problem *p)
{
    return p->rope_cos != NULL || posenc_term_present(p, POSENC_TERM_rope_token);
}

static inline int posenc_terms_any(const posenc_problem *p)
{
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        if (posenc_term_present(p, k))
            return 1;
    return 0;
}

/*
 * The float arrays of a problem besides q and k and the term modules', written once (one
 * list, so that its users cannot drift apart): the low-precision engine's widening
 * (engine_lp.c) and the binding's config fields (module_config.h, hence posenc._engine's
 * EngineConfig) are generated from it.  CONST(name, count): a constant (no head axis, no
 * gradient), `count` elements (the rotation's tables).
 */
#define POSENC_ARRAYS(CONST)                                               \
    CONST(rope_cos, p->rope_positions * p->rope_pairs)                     \
    CONST(rope_sin, p->rope_positions * p->rope_pairs)                     \
    CONST(rope_cos_k, p->rope_positions * p->rope_pairs)                   \
    CONST(rope_sin_k, p->rope_positions * p->rope_pairs)

/* Gradient outputs, each shaped like its input; NULL = not wanted.  Fields: q, k, then the
 * term modules'.  When the two vector tables' gradients
 * (terms[POSENC_TERM_query_table][0], terms[POSENC_TERM_key_table][0]) are the same buffer
 * (one table read on both sides through one map, M4 and M4M), both sides' gradients are
 * summed into it, the query side's first (csrc/engine/term_vectors.h). */
typedef struct {
    void *q, *k;
    /* the term modules' gradients (terms.h), per unit: unit (b, h) of kind k's
     * array a at terms[k][a] + (b term_units_per_row + h) per_unit elements (the
     * array's per_unit)
     * (term_units_per_row: H, or 0 for H; a larger problem's H in a slice of it);
     * an array without a batch axis (batch_stride 0) gets its gradient summed over
     * the batch rows, in order, in batch row 0's units (posenc_backward and
     * posenc_attention_backward: the other rows' units hold partial sums, their own
     * parts or zeros where the engine summed G over the batch first) */
    void *terms[POSENC_TERM_COUNT][POSENC_TERM_ARRAYS_MAX];
    size_t term_units_per_row;
} posenc_grads;

/* Check that a problem is consistent (maps and ids in range, product rules).
 * The engine itself trusts its problem: a caller validates it once, here,
 * before posenc_forward / posenc_backward (the binding does). */
int posenc_validate(const posenc_problem *p, const char **why);

/* A = logits(p), written into out (B, H, n, m), C-contiguous; p validated. */
int posenc_forward(const posenc_problem *p, void *out, int num_threads);

/* Gradients of sum(G * A) with respect to every wanted input; p validated. */
int posenc_backward(const posenc_problem *p, const void *grad_logits,
                    const posenc_grads *g, int num_threads);

/* ------------------------------------------------------- fused attention */

/* The attention arguments of SPEC §6 beside a logits problem. */
typedef struct {
    const void *v;                    /* (B, H_kv, m, dv), the problem's dtype */
    size_t dv;
    const uint8_t *key_padding_mask;  /* (B, m), nonzero = padding; NULL: none */
    int causal;                       /* mask the keys j > query_offset + i */
    double dropout_p;                 /* in [0, 1) */
    uint64_t seed;                    /* of the dropout's Philox-4x32-10 (engine/philox.h) */
    /* the problem's units are (batch_offset + b, head_offset + h) of a larger
     * one, for the dropout's keys: 0 for a whole problem (engine_lp.c's
     * chunks set them) */
    size_t batch_offset, head_offset;
    /* SPEC §7, each off when zeroed */
    int window;                       /* nonzero: key j masked where j < i' - window_left or */
    size_t window_left, window_right; /* j > i' + window_right, i' = query_offset + i; a side
                                         POSENC_UNBOUNDED has no bound */
    const int64_t *document_q;        /* (B, n) and document_k (B, m), both or neither: key j */
    const int64_t *document_k;        /* masked where document_k[b, j] != document_q[b, i] */
    double softcap;                   /* > 0: A <- softcap tanh(A / softcap) before the mask */
    const double *sinks;              /* (H): a logit per head in every row's softmax with no
                                         value (lse includes exp(sinks[h])); NULL: none */
    double *grad_sinks;               /* the backward's output (H): dL/dsinks; NULL: not wanted */
    const void *d_lse;                /* the backward's input (B, H, n), lse's dtype: dL/dlse
                                         (dlse_i/dA_ij = P_ij); NULL: lse unused */
    posenc_strides v_strides;         /* where v's rows lie, and the backward's d_out's */
    posenc_strides d_out_strides;     /* (r = 0: contiguous; posenc_problem's q_strides) */
} posenc_attention;

/* A window side without a bound. */
#define POSENC_UNBOUNDED ((size_t)-1)

/*
 * out (B, H, n, dv) = softmax_j(A + Mask) D v and lse (B, H, n) = log sum_j
 * exp(A + Mask), A = logits(p), without the (B, H, n, m) logits: row tile
 * by row tile of the logits in per-thread scratch (mr x m).  A row whose
 * keys are all masked: out 0, lse -inf.  p validated.
 */
int posenc_attention_forward(const posenc_problem *p, const posenc_attention *a, void *out,
                             void *lse, int num_threads);

/*
 * The gradients of L given d_out = dL/dout (out and lse from the forward)
 * and, where a->d_lse is set, dL/dlse:
 * every wanted gradient of g (as posenc_backward's) and grad_v (B, H, m,
 * dv; NULL = not wanted).  The probabilities are recomputed from q, k and
 * lse row block by row block: per-thread scratch O(row_block m) (row_block
 * = the kernels' kc: 256 floats, 128 doubles), never O(n m).  p validated.
 */
int posenc_attention_backward(const posenc_problem *p, const posenc_attention *a,
                              const void *d_out, const void *out, const void *lse,
                              const posenc_grads *g, void *grad_v, int num_threads);

/* ------------------------------------------------------- dense products */

/*
 * C (M x N, row i at c + i * ldc) = A B [+ bias]: A (M x K), element (i, l)
 * at a[i * a_rs + l * a_cs]; B (K x N), element (l, j) at b[l * b_rs + j *
 * b_cs], b_rs or b_cs 1; bias (N) or NULL; strides in elements; C overlaps
 * neither.  The projections around an attention and their gradients (X W^T,
 * G W, G^T X) on the engine's GEMM, float32 or float64 (POSENC_EINVAL for
 * another dtype).  Bitwise the same for any num_threads.
 */
typedef struct {
    posenc_dtype dtype;
    size_t M, N, K;
    const void *a;
    ptrdiff_t a_rs, a_cs;
    const void *b;
    ptrdiff_t b_rs, b_cs;
    const void *bias;
    void *c;
    ptrdiff_t ldc;
} posenc_matmul_problem;

int posenc_matmul(const posenc_matmul_problem *mm, int num_threads);

/* dst[t] = src[t] (float64) in bfloat16, rounded once to nearest even
 * (posenc_convert.f64_to_bf16 of the active ISA; the float64 gradients of the
 * term modules' arrays become a bfloat16 call's this way), t < count. */
void posenc_narrow_bf16(uint16_t *dst, const double *src, size_t count);

/* Logits of at least this many bytes are written with non-temporal stores
 * when out is 64-byte aligned (they would only evict the caches). */
#define POSENC_STREAM_BYTES ((size_t)32 << 20)

/* ------------------------------------------------------------ ISA dispatch */

typedef enum {
    POSENC_ISA_SCALAR = 0,
    POSENC_ISA_AVX2 = 1,
    POSENC_ISA_AVX512 = 2,
    POSENC_ISA_NEON = 3,
    POSENC_ISA_COUNT = 4
} posenc_isa;

/* Row operations: dst[j] (= | += | *=) src[j * stride]. */
typedef enum { POSENC_SET = 0, POSENC_ADD = 1, POSENC_MUL = 2 } posenc_rowop;

/* Epilogue flags of the microkernel (applied in this order). */
enum {
    POSENC_UKR_ACCUMULATE = 1,  /* c = ab + c      */
    POSENC_UKR_ADD_P = 2,       /* c = c' + p      */
    POSENC_UKR_MUL_P = 4,       /* c = c' * p      */
    POSENC_UKR_STREAM = 8,      /* store c with non-temporal stores (c aligned to 64 bytes) */
    POSENC_UKR_ADD_ROWS = 16,   /* c = c' + rows[r][col]: a second additive source, by row pointers */
    POSENC_UKR_A_ROWS = 32,     /* a is row-major: a[r * lda + l] (else a[l * lda + r]) */
    POSENC_UKR_BF16_OUT = 64    /* posenc_bf16_kernels.ukr_f32 only: c is bfloat16 (ldc in its
                                   elements), each result rounded once as f32_to_bf16 rounds;
                                   not with ACCUMULATE */
};

/*
 * The kernels one ISA provides for one dtype, with their block sizes (as
 * BLIS's contexts own theirs: the engine reads them from here).  Pointers
 * are to float or double according to the table.
 *
 * The microkernel computes an mr x nr tile from a packed B panel
 * b[l * nr + c] (nr_narrow for the narrow one) and A read in place, a[l * lda + r] (a packed panel has
 * lda = mr; a column-major matrix its leading dimension) or, with
 * POSENC_UKR_A_ROWS, a[r * lda + l], l < kc, then applies the epilogue flags
 * and stores c[r * ldc + c] for r < rows, c < cols only.  A must be readable
 * for all mr rows except with POSENC_UKR_A_ROWS, where rows past `rows` are
 * not read.  It reads p and c (when accumulating) before writing c, so p
 * may alias c.  add_rows (ADD_ROWS) holds `rows` row pointers, each already
 * at the tile's first column.
 */
typedef void (*posenc_ukr)(size_t kc, const void *a, ptrdiff_t lda, const void *b, void *c,
                           ptrdiff_t ldc, size_t rows, size_t cols, const void *p, ptrdiff_t ldp,
                           const void *const *add_rows, int flags);

/* A piece of a row of a term read from its table (relative_bias_2d's runs of keys): keys
 * [j, j + len) read entries at, at + 1, ... (step 1) or entry at alone (step 0). */
typedef struct {
    size_t j, len, at, step;
} posenc_piece;

typedef struct {
    const char *name;
    size_t mr, nr;       /* the microkernel's register tile */
    size_t kc;           /* depth of a packed block: the microkernel's A and B panels stay in L1 */
    size_t key_block;    /* keys per call of the tile gathers/scatters: their rows of the
                            projections stay in L1 */
    posenc_ukr ukr;
    /* the same microkernel mr x nr_narrow (one vector): for a B whose N pads less to it */
    size_t nr_narrow;
    posenc_ukr ukr_narrow;
    /* a B panel (either width) from row-major B: dst[l * nr + c] = alpha * src[l * rs + c],
     * c < cols, zero up to nr, l < kc */
    void (*pack_rows)(void *dst, size_t nr, const void *src, ptrdiff_t rs, size_t kc, size_t cols,
                      double alpha);
    /* the same from column-major B (its transpose row-major): dst[l * nr + c] =
     * alpha * src[c * cs + l], c < cols, zero up to nr, l < kc */
    void (*pack_cols)(void *dst, size_t nr, const void *src, ptrdiff_t cs, size_t kc, size_t cols,
                      double alpha);
    /* dst[j] op= src[j * stride], j < len; stride may be 0 or negative */
    void (*row_gather)(int op, void *dst, const void *src, ptrdiff_t stride, size_t len);
    /* dst[j * stride] += src[j]; stride 0 adds the sum of src to dst[0] */
    void (*row_scatter_add)(void *dst, ptrdiff_t stride, const void *src, size_t len);
    /* dst[j] = a[j] * b[j] */
    void (*row_mul)(void *dst, const void *a, const void *b, size_t len);
    /* sums along a block's diagonals: dst[j - r] += src[r * ld + j], r < rows, j0 <= j < m,
     * each element's sum over r in order */
    void (*diagonal_sums)(void *dst, const void *src, size_t ld, size_t rows, size_t j0, size_t m);
    /* key-side table of a row tile: P[r, j] op= key_proj[j, map_r0[j - r] - b_min],
     * j0 <= j < j1, r < rows (j1 - j0 <= key_block) */
    void (*tile_gather_key)(int op, void *P, size_t ldp, const int64_t *map_r0, ptrdiff_t b_min,
                            const void *key_proj, size_t ld_proj, size_t j0, size_t j1, size_t rows);
    /* its adjoint: grad[j, map_r0[j - r] - b_min] += src[r, j], j0 <= j < j1, r0 <= r < rows */
    void (*tile_scatter_key)(void *grad, size_t ld_grad, const int64_t *map_r0, ptrdiff_t b_min,
                             const void *src, size_t ld_src, size_t j0, size_t j1, size_t r0,
                             size_t rows);
    /* query-side table of a row tile: P[r, j] op= query_proj[r, map_r0[j - r] - b_min], j < m */
    void (*tile_gather_query)(int op, void *P, size_t ldp, const int64_t *map_r0, ptrdiff_t b_min,
                              const void *query_proj, size_t ld_proj, size_t m, size_t rows);
    /* orders non-temporal stores (POSENC_UKR_STREAM) before later loads/stores */
    void (*store_fence)(void);
    /* the fused attention's softmax rows: max_j x[j] (-inf for len 0), and
     * x[j] = exp(x[j] - shift) in place returning sum_j x[j], j < len */
    double (*row_max)(const void *x, size_t len);
    double (*row_exp)(void *x, size_t len, double shift);
    /* SPEC §7's softcap: x[j] = cap tanh(x[j] / cap), grad[j] = 1 - tanh^2 (grad may be NULL) */
    void (*row_softcap)(void *x, void *grad, size_t len, double cap);
    /* the decoding path (few query rows): dst[r ld + j] = scale q_r . k_j (q rows of d, k
     * rows of d), and out[r ld_out + i] = sum_j p[r ld_p + j] v[j dv + i], keys in order */
    void (*rows_dot)(void *dst, size_t ld, const void *q, size_t rows, const void *k,
                     size_t keys, size_t d, double scale);
    void (*rows_axpy)(void *out, size_t ld_out, const void *p, size_t ld_p, size_t rows,
                      const void *v, size_t keys, size_t dv);
    /* contextual positions (CoPE), rows e < count, keys [k0, cols) from the last down:
     * s += g[e ldg + j] in double, pos[e ldg + j] = (REAL)min(s, last) (pos may be NULL),
     * x[e ldx + j] += the row's table (table + e ldt) interpolated there (x may be NULL):
     * isa/positions_impl.h */
    void (*suffix_interp)(void *x, size_t ldx, void *pos, const void *g, size_t ldg,
                          const void *table, size_t ldt, size_t count, size_t k0, size_t cols,
                          double last);
    /* a row's pieces (each as row_gather with stride step: dst[j + u] op= table[at + u step]),
     * and their adjoint (as row_scatter_add: table[at + u step] += src[j + u]; step 0 the
     * piece's sum), pieces in order */
    void (*row_pieces)(int op, void *dst, const void *table, const posenc_piece *pieces,
                       size_t count);
    void (*row_pieces_take)(void *table, const void *src, const posenc_piece *pieces,
                            size_t count);
    /* dst[j] op= sign ((a - x[j]) + (b - y[j])), j < len, op POSENC_SET or ADD, sign +-1
     * (FoX's decay from its prefix sums held as two parts) */
    void (*row_difference)(int op, void *dst, double a, double b, const void *x, const void *y,
                           double sign, size_t len);
    /* g[j] = 1 / (1 + exp(-z[j])), j < len, accurate at both ends (CoPE's gates) */
    void (*row_sigmoid)(void *g, const void *z, size_t len);
    /* its gradient along one row: gc[j] (keys [first, cols)) and the table's, added to dqe
     * (double, (size_t)last + 1 entries), from G, the gates g and the positions pos */
    void (*suffix_interp_grad)(void *gc, double *dqe, const void *G, const void *g,
                               const void *pos, const void *table, size_t first, size_t cols,
                               double last);
    /* the fused attention's dropout: the keep decisions of a row, bit for bit
     * engine/philox.h's posenc_dropout_row (keep[j] = 0 or 1, j < len) */
    void (*dropout_row)(uint8_t *keep, size_t len, uint64_t seed, uint32_t threshold, size_t b,
                        size_t h, size_t i);
    /* NULL, or (float32 tables of posenc_bf16_gemm_kernels only) the bfloat16
     * GEMM every GEMM of the engine runs on instead of ukr (gemm_impl.h) */
    const struct posenc_bf16_kernels_s *bf16;
} posenc_kernels;

/*
 * Every entry of posenc_kernels but name and bf16, in the groups by which an
 * ISA's table overrides the scalar one (dispatch.c): a group is taken whole
 * when the ISA sets all of its functions, with the sizes they were written
 * for (an ISA's microkernel with the scalar one's packing would be wrong).
 * GROUP_FN(group, entry) and GROUP_SIZE(group, entry) are the entries of a
 * group of several; FN(entry) a function that is a group of its own.  A
 * field added to posenc_kernels and not here fails to compile (dispatch.c
 * counts them), and tests/c/test_engine.c checks that every entry each ISA
 * sets is the one its composed table runs.
 */
#define POSENC_KERNEL_ENTRIES(GROUP_FN, GROUP_SIZE, FN)                                            \
    GROUP_FN(gemm, ukr) GROUP_FN(gemm, ukr_narrow) GROUP_FN(gemm, pack_rows)                      \
    GROUP_FN(gemm, pack_cols) GROUP_SIZE(gemm, mr) GROUP_SIZE(gemm, nr)                           \
    GROUP_SIZE(gemm, nr_narrow) GROUP_SIZE(gemm, kc)                                              \
    GROUP_FN(key_tile, tile_gather_key) GROUP_FN(key_tile, tile_scatter_key)                      \
    GROUP_SIZE(key_tile, key_block)                                                               \
    FN(row_gather) FN(row_scatter_add) FN(row_mul) FN(diagonal_sums) FN(tile_gather_query)        \
    FN(store_fence) FN(row_max) FN(row_exp) FN(row_softcap) FN(rows_dot) FN(rows_axpy)            \
    FN(row_pieces) FN(row_pieces_take) FN(row_difference) FN(row_sigmoid) FN(suffix_interp)       \
    FN(suffix_interp_grad)                                                                         \
    FN(dropout_row)

/*
 * Rows of conversions between float and the 16-bit floats, bfloat16 and
 * IEEE binary16 (float16), held as their bit patterns (uint16_t); the
 * foundation of the low-precision dtypes (docs/low_precision.md).  One
 * table per ISA; every ISA gives the scalar one's bits exactly:
 *
 *   widening (bf16 or f16 -> float): exact; a float16 NaN keeps its sign
 *     and payload and becomes quiet; a bfloat16 NaN is its bits << 16.
 *   narrowing (float -> bf16 or f16): round to nearest, ties to even, on
 *     the bits (no MXCSR/FPCR flush applies); subnormal results kept;
 *     float16 overflows to +-inf from 65520 up; a NaN keeps its sign and
 *     leading payload bits and becomes quiet (never an infinity).
 *
 * dst[j] = convert(src[j]), j < len; dst and src do not overlap.
 *
 * bf16_sum: count rows of bfloat16 widened and summed in float32, in
 * order: dst[j] = ((s + src[0][j]) + src[1][j]) + ..., s = dst[j] with
 * `accumulate`, else the sum starts from src[0][j] (count >= 1); the
 * float32 additions' bits (a NaN where two meet: some NaN).  The batch's
 * rows of a bfloat16 G in one pass (engine/backward_impl.h).
 *
 * f64_to_bf16: double -> bfloat16 rounded once to nearest even
 * (convert_scalar.h's posenc_bf16_from_f64_bits: not through float, whose
 * rounding first would round twice), subnormal results kept, +-inf past
 * the largest finite; posenc_narrow_bf16's rows.
 */
typedef struct {
    const char *name;
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t len);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t len);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t len);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t len);
    void (*bf16_sum)(float *dst, const uint16_t *const *src, size_t count, size_t len,
                     int accumulate);
    void (*f64_to_bf16)(uint16_t *dst, const double *src, size_t len);
} posenc_convert;

/* The entries of posenc_convert but name (dispatch.c takes each one an ISA sets). */
#define POSENC_CONVERT_ENTRIES(FN) \
    FN(bf16_to_f32) FN(f32_to_bf16) FN(f16_to_f32) FN(f32_to_f16) FN(bf16_sum) FN(f64_to_bf16)

/*
 * The bfloat16 content GEMM of AVX512-BF16 (vdpbf16ps, docs/low_precision.md
 * §1 design (b)): C = narrow(s A.B^T [+ or * P]) in bfloat16 from bfloat16
 * A rows and a packed bfloat16 B, float32 accumulators.
 *
 * pack: one B panel from `cols` (<= nr) rows of B (row c at src + c * rs,
 *   kc elements each) in pairs along the depth:
 *   dst[(l / 2) * 2 nr + 2 c + l % 2] = src[c * rs + l], l < kc, c < cols;
 *   zero for c >= cols and for l = kc when kc is odd (posenc_round_up(kc, 2) x nr).
 * ukr: the mr x nr tile C[r, c] = narrow(s sum_l a[r * lda + l] b(l, c)
 *   [op P[r * ldp + c]]), l < kc (any kc, 0 included), A rows read in place
 *   (never past a[r * lda + kc - 1], nor rows >= rows); the sums in float32
 *   by vdpbf16ps (bfloat16 subnormal inputs and float32 subnormal partial sums
 *   flushed to zero, Intel SDM); then a float32 multiply by scale; with
 *   POSENC_UKR_ADD_P (or MUL_P) in flags a float32 P added (multiplied);
 *   rounded once to nearest even as posenc_convert's f32_to_bf16 (subnormal
 *   results kept); stored for r < rows, c < cols only, with POSENC_UKR_STREAM
 *   (rows of c 64-byte aligned) by non-temporal stores where cols = nr,
 *   which the caller orders with store_fence.
 */
typedef struct posenc_bf16_kernels_s {
    const char *name;
    size_t mr, nr;
    void (*ukr)(size_t kc, const uint16_t *a, ptrdiff_t lda, const uint16_t *b, uint16_t *c,
                ptrdiff_t ldc, size_t rows, size_t cols, float scale, const float *p,
                ptrdiff_t ldp, int flags);
    void (*pack)(uint16_t *dst, const uint16_t *src, ptrdiff_t rs, size_t kc, size_t cols);
    /* orders the microkernel's non-temporal stores before later loads/stores */
    void (*store_fence)(void);

    /* The float32 engine's GEMMs on the same instructions (posenc_bf16_gemm_kernels):
     * operands rounded to bfloat16 (to nearest even; exact for bfloat16 values,
     * subnormals flushed as vdpbf16ps flushes them), float32 results.
     *
     * ukr_f32: the mr x nr tile s A.B of posenc_ukr's contract (its epilogue
     *   flags ACCUMULATE, ADD_P, MUL_P, ADD_ROWS, STREAM; s applied to the
     *   product first), depth kc, from a B panel of pack's layout and A as
     *   bfloat16 rows (POSENC_UKR_A_ROWS: a[r * lda + l], rows >= rows not
     *   read) or as a pair panel (word t * lda + r holds elements 2 t, 2 t + 1
     *   of row r, lda >= mr, posenc_round_up(kc, 2) / 2 pair rows, every row readable).
     * pack_f32: pack's panel from float32 rows of B^T (row c at src + c * rs).
     * pack_pairs: a pair panel `width` (<= 128) wide from float32 rows along the
     *   depth: word t * width + c holds elements (2 t, c) and (2 t + 1, c),
     *   element (l, c) at src[l * rs + c], for the l in column c's range
     *   [ranges[2 (c / tile)], ranges[2 (c / tile) + 1]) (a range per tile of
     *   columns: B's one, or the A tiles' k ranges) and c < cols, zero
     *   elsewhere, pair rows up to the largest range's end; it may write up to
     *   posenc_round_up(width, 16) - width words past the panel's end (scratch the
     *   caller leaves free: gemm_scratch's a_pack). */
    void (*ukr_f32)(size_t kc, const uint16_t *a, ptrdiff_t lda, const uint16_t *b, float *c,
                    ptrdiff_t ldc, size_t rows, size_t cols, float scale, const float *p,
                    ptrdiff_t ldp, const void *const *add_rows, int flags);
    void (*pack_f32)(uint16_t *dst, const float *src, ptrdiff_t rs, size_t kc, size_t cols);
    void (*pack_pairs)(uint16_t *dst, size_t width, const float *src, ptrdiff_t rs,
                       const size_t *ranges, size_t tile, size_t cols);
    /* dst[j] = src[j] rounded as the operands are, j < len */
    void (*round_row)(uint16_t *dst, const float *src, size_t len);
    /* pack_pairs from bfloat16 rows (no rounding) */
    void (*pack_pairs16)(uint16_t *dst, size_t width, const uint16_t *src, ptrdiff_t rs,
                         const size_t *ranges, size_t tile, size_t cols);
    /* exp(x[j] - shift) rounded as round_row rounds into dst only, returning their
     * float32 sum in the float32 kernels' row_exp order; x is left as it is.  The exp
     * is the bfloat16 softmax's own (isa/avx512bf16.c: within 2^-8 of exp after the
     * rounding; the attention bounds take _dtypes.SOFTMAX_EXP_ERROR for it) */
    double (*exp_row)(uint16_t *dst, const float *x, size_t len, double shift);
    /* the attention backward's row on this GEMM: P[j] = exp(s[j] - lse) as exp_row's exp,
     * stored only rounded into p16; ds[j] = (ds[j] + minus_delta) P[j] (dP in, dS out,
     * float32, in that order, P unrounded), stored also rounded into ds16; j < len */
    void (*grad_row)(uint16_t *p16, uint16_t *ds16, float *ds, const float *s, size_t len,
                     double lse, float minus_delta);
} posenc_bf16_kernels;

/* isa/avx512bf16.c, where compiled (POSENC_HAVE_AVX512BF16). */
extern const posenc_bf16_kernels posenc_bf16_kernels_avx512bf16;

/* dispatch.c: the bfloat16 GEMM when it is compiled, the CPU has
 * AVX512-BF16 and the active ISA is avx512; NULL otherwise. */
const posenc_bf16_kernels *posenc_active_bf16_kernels(void);

/* dispatch.c: while posenc_active_bf16_kernels() is not NULL, the float32
 * kernels of the active ISA with `bf16` set to it (the engine's table for a
 * problem with bf16_gemm); NULL otherwise. */
const posenc_kernels *posenc_bf16_gemm_kernels(void);

/* Filled by dispatch.c: scalar first, then the ISA's entries (and, on
 * avx512, AVX512-BF16's where the CPU has it); NULL where not supported. */
const posenc_convert *posenc_convert_for(posenc_isa isa);
const posenc_convert *posenc_active_convert(void);

/* dispatch.c: an ISA's own table as compiled (isa/<isa>.c), before the
 * scalar one fills what it leaves out; NULL where not compiled. */
const posenc_kernels *posenc_kernels_compiled(posenc_isa isa, posenc_dtype dtype);
const posenc_convert *posenc_convert_compiled(posenc_isa isa);

/* Filled by dispatch.c: kernels[isa][dtype], NULL where not compiled/supported. */
const posenc_kernels *posenc_kernels_for(posenc_isa isa, posenc_dtype dtype);
const posenc_kernels *posenc_active_kernels(posenc_dtype dtype);

void posenc_dispatch_init(void);
int posenc_isa_supported(posenc_isa isa);     /* CPU and OS support it, and it is compiled in */
int posenc_isa_compiled(posenc_isa isa);
posenc_isa posenc_get_isa(void);
int posenc_set_isa(posenc_isa isa);           /* 0 ok, -1 unsupported */

/* The CPU and OS (cpu.c, shared with posenc._machine): whether they can run
 * an ISA's instructions, whatever was compiled. */
int posenc_cpu_has(posenc_isa isa);
const char *posenc_isa_name(posenc_isa isa);
int posenc_isa_from_name(const char *name);   /* -1 if unknown */
/* AVX512-BF16 (CPUID.(EAX=7,ECX=1):EAX bit 5) on top of the avx512 ISA's
 * CPU and OS support: the extension a build may add to avx512's kernels. */
int posenc_cpu_has_avx512bf16(void);

/* The most threads a call may ask for (posenc.MAX_THREADS; OMP_NUM_THREADS=100000 is clamped). */
#define POSENC_MAX_THREADS 4096

int posenc_max_threads(void);                 /* OpenMP's default (OMP_NUM_THREADS or all cores) in
                                                 [1, POSENC_MAX_THREADS], 1 without OpenMP */

/* Per-ISA kernel tables (defined in isa/<isa>.c when compiled). */
extern const posenc_kernels posenc_kernels_f32_scalar, posenc_kernels_f64_scalar;
extern const posenc_kernels posenc_kernels_f32_avx2, posenc_kernels_f64_avx2;
extern const posenc_kernels posenc_kernels_f32_avx512, posenc_kernels_f64_avx512;
extern const posenc_kernels posenc_kernels_f32_neon, posenc_kernels_f64_neon;
/* Per-ISA conversion tables (isa/<isa>.c; avx512bf16.c: avx512's with AVX512-BF16). */
extern const posenc_convert posenc_convert_scalar, posenc_convert_avx2, posenc_convert_avx512,
    posenc_convert_avx512bf16, posenc_convert_neon;

#ifdef __cplusplus
}
#endif
#endif /* POSENC_H */
