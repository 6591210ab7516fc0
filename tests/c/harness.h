/*
 * harness.h -- what the C tests share: a seeded generator, the EXPECT
 * counters, synthetic problems of every term kind (configs), the naive
 * double-precision logits of docs/spec.md, and tolerant comparisons.
 */
#ifndef POSENC_TEST_HARNESS_H
#define POSENC_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>

#include "posenc.h"

extern int failures, checks;

/* POSENC_CTEST_QUICK set (the valgrind run): the sizes past the one-thread
 * threshold's first (n m >= 10^4) left out, and a third of the attention's
 * combinations; every configuration and case still runs. */
extern int quick;
int skip_size(size_t n, size_t m);

#define EXPECT(cond, ...)                         \
    do {                                          \
        ++checks;                                 \
        if (!(cond)) {                            \
            ++failures;                           \
            fprintf(stderr, "FAIL: " __VA_ARGS__); \
            fputc('\n', stderr);                  \
        }                                         \
    } while (0)

typedef struct {
    const char *name;
    int dense, table, query_table, key_table, segments, theta, product;
    int map;   /* 0 clipped j-i, 1 clipped i-j, 2 irregular */
    size_t query_offset;   /* SPEC §1: moves TUPE's [CLS] row (the maps here are synthetic) */
    int rope;  /* the rotation: 1 half-split pairs of all of d, positions query_offset + i and j;
                  2 interleaved pairs of part of d, given positions, the keys' own tables */
    int mqa;   /* k and v with one head for all H query heads (SPEC §7, multi-query) */
} config;

extern const config configs[];
extern const size_t config_count;

enum { MAX_ARRAYS = 16 };

/* The problem's inputs in double; f32 copies made on demand. */
typedef struct {
    posenc_problem p;
    size_t len[MAX_ARRAYS];
    double *f64[MAX_ARRAYS];
    float *f32[MAX_ARRAYS];
    int64_t *maps[3];
    double *toeplitz;                /* the toeplitz module's rows: maps[0] in float64 */
    double *segment_q, *segment_k;   /* the segments module's ids (B, n), (B, m) */
    int64_t *positions_q, *positions_k;
} problem_data;

enum { X_Q, X_K, X_PQ, X_PK, X_TABLE, X_QUERY_TABLE, X_KEY_TABLE, X_SEGMENT_TABLE, X_THETA, X_G,
       X_V, X_D_OUT, X_ROPE_COS, X_ROPE_SIN, X_ROPE_COS_K, X_ROPE_SIN_K, X_COUNT };

double urand(void);   /* uniform in [-1, 1) */
/* run(kern, isa, f64, ctx) for every ISA this CPU has and both dtypes (float32, then
 * float64), that ISA set; the active ISA restored after. */
void for_each_kernels(void (*run)(const posenc_kernels *kern, posenc_isa isa, int f64, void *ctx),
                      void *ctx);
double *fill(problem_data *pd, int slot, size_t len);
int64_t *make_map(int kind, size_t n, size_t m, size_t rows);
void build(problem_data *pd, const config *c, size_t B, size_t H, size_t n, size_t m, size_t d,
           int shared);
void point(problem_data *pd, posenc_dtype dtype);
void release(problem_data *pd);
double naive_logit(const problem_data *pd, size_t b, size_t h, size_t i, size_t j);
double *widen(const void *src, size_t len, posenc_dtype dtype);
/* Module gradient t's (GRAD_PQ, GRAD_PK, GRAD_TABLE, GRAD_QUERY_TABLE, GRAD_KEY_TABLE,
 * GRAD_SEGMENTS, GRAD_THETA) of sum(G * A) (G: X_G's), summed over the batch, H x length:
 * pos_q's grad[h n d_p + i d_p + l] (query head h's), pos_k's, the table's grad[h R +
 * map(j - i)] (in a product times the other factors), a vector table's grad[h R d +
 * map(j - i) d + l] (vector_scale q_i[l] or k_j[l], in a product times the other factors), the segments table's grad[h S S + s_q S + s_k]
 * (the reset's row and column 0 take none of these), theta's grad[2 h] (the row at position
 * 0), grad[2 h + 1] (key 0 of the others). */
void naive_module_grad(const problem_data *pd, int t, double *grad);
double max_abs(const double *x, size_t len);
void compare_above(const char *what, const double *a, const double *b, size_t len, double rtol,
                   int bitwise, double floor);
void compare(const char *what, const double *a, const double *b, size_t len, double rtol,
             int bitwise);
/* The gradients the tests take, in grad_names' order: q and k (posenc_grads), and at
 * GRAD_PQ, GRAD_PK, GRAD_TABLE, GRAD_QUERY_TABLE, GRAD_KEY_TABLE, GRAD_SEGMENTS and
 * GRAD_THETA the dense, toeplitz, vector tables', segments and reset modules' arrays
 * (X_PQ's data, X_PK's, X_TABLE's, X_QUERY_TABLE's, X_KEY_TABLE's, X_SEGMENT_TABLE's,
 * X_THETA's), float64 per unit (B, H, length) whatever the dtype. */
enum { GRAD_COUNT = 9, GRAD_PQ = 2, GRAD_PK = 3, GRAD_TABLE = 4, GRAD_QUERY_TABLE = 5,
       GRAD_KEY_TABLE = 6, GRAD_SEGMENTS = 7, GRAD_THETA = 8 };
int grad_module(int t);                                  /* its term kind, or -1 */
int grad_array(int t);                                   /* its array of the kind */
extern const char *const grad_names[GRAD_COUNT];
const void *grad_input(const problem_data *pd, int t);   /* NULL: no such gradient */
size_t grad_len(const problem_data *pd, int t);          /* its elements */
/* Those of them a backward writes: all, or a module's whose gradient the engine sums over
 * the batch batch row 0's (posenc_term_summed; posenc_grads: the batch's sum, the other rows
 * unwritten). */
size_t grad_written_len(const problem_data *pd, int t);
size_t grad_size(int t, size_t es);                      /* an element's bytes (es: the dtype's) */
posenc_grads grads_of(void *const g[GRAD_COUNT]);
double *widen_grad(const void *g, size_t len, int t, posenc_dtype dtype);

void test_philox(void);
void test_dropout_rows(void);
void test_softmax_rows(void);
void test_attention(void);
void test_convert(void);
void test_lp(void);
void test_bf16dot(void);
void test_terms(void);

#endif /* POSENC_TEST_HARNESS_H */
