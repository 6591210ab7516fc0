/*
 * test_bf16dot.c -- the bfloat16 content logits on vdpbf16ps
 * (engine/bf16dot.c, isa/avx512bf16.c; docs/low_precision.md §1 (b)):
 *
 *   1. Which problems posenc_bf16_content_forward serves: on every ISA but
 *      avx512 with AVX512-BF16, none (-1, out untouched); there, content-only
 *      bfloat16 problems with a scale float holds, and nothing else.
 *   2. The pair panels (pack, pack_pairs, pack_pairs16) against their
 *      formulas, padding and depth ranges included; the softmax's rows
 *      (exp_row against exp, grad_row against exp_row and round_row).
 *   3. The logits against a double reference computed from the bfloat16
 *      inputs, n, m, d over 1, 3, 7, 17, 33, 65, 130 (odd depths, m not a
 *      multiple of nr), s = 1/sqrt(d) and 1, within the bound of check_bound;
 *      inputs unchanged.
 *   4. The microkernel's epilogue with a float32 P added or multiplied.
 *   5. IEEE special values: Inf and NaN inputs give the reference's NaN or
 *      Inf; subnormal bfloat16 results are kept.
 *   6. 1, 2 and 3 threads bitwise equal (units, then row chunks).
 *   7. Logits large enough to be streamed (non-temporal stores) as the others.
 * Without AVX512-BF16 (CPU or compiler) only 1 runs, with a message.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bf16dot.h"
#include "harness.h"
#include "isa/convert_scalar.h"   /* posenc_bf16_from_f32_bits */

static uint16_t bf16_of(double x)   /* truncation: every test value is exact in bfloat16 */
{
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static double value_of(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Random bfloat16 values, magnitudes spread over 2^-4 .. 2^4. */
static uint16_t *random_bf16(size_t len)
{
    uint16_t *x = malloc(sizeof(uint16_t) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t)
        x[t] = bf16_of(ldexp(urand(), (int)lround(4 * urand())));
    return x;
}

static posenc_problem content_problem(size_t B, size_t H, size_t n, size_t m, size_t d,
                                      double scale, const uint16_t *q, const uint16_t *k)
{
    posenc_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = POSENC_BF16;
    p.B = B, p.H = H, p.n = n, p.m = m, p.d = d;
    p.scale = scale;
    p.q = q, p.k = k;
    return p;
}

/*
 * The bound on one logit, with ref = s q.k [+ P or * P] in double from the
 * bfloat16 inputs and mag = s sum_l |q_l k_l| [+ |P| or * |P|]:
 *
 *   |got - ref| <= 2^-8 |ref| + (d + 8) 2^-24 mag + 2^-133
 *
 * The float32 sums of vdpbf16ps (exact products, at most d roundings on the
 * way), the rounding of s to float, the float32 scaling and the epilogue's
 * add or multiply stay within (d + 8) 2^-24 mag; the one rounding to
 * bfloat16 adds 2^-8 of the value (2^-8 (|ref| + that), within the slack);
 * a subnormal bfloat16 result is rounded absolutely, by at most half its
 * least step 2^-133.  (Normal inputs and partial sums here: vdpbf16ps flushes
 * subnormal ones.)  NaN and Inf references must be matched exactly.
 * Returns the number of logits outside it; *worst the largest |got - ref| /
 * bound.
 */
static size_t check_bound(const uint16_t *got, const double *ref, const double *mag, size_t len,
                          size_t d, double *worst)
{
    size_t bad = 0;
    *worst = 0;
    for (size_t t = 0; t < len; ++t) {
        const double g = value_of(got[t]);
        if (isnan(ref[t]) || isinf(ref[t])) {
            bad += isnan(ref[t]) ? !isnan(g) : g != ref[t];
            continue;
        }
        const double bound = ldexp(fabs(ref[t]), -8) + (double)(d + 8) * ldexp(mag[t], -24) +
                             ldexp(1, -133);
        const double err = fabs(g - ref[t]);
        if (!(err <= bound))
            ++bad;
        else if (err / bound > *worst)
            *worst = err / bound;
    }
    return bad;
}

/* ref and mag of every logit of a content problem (scale s). */
static void reference(const uint16_t *q, const uint16_t *k, size_t BH, size_t n, size_t m,
                      size_t d, double s, double *ref, double *mag)
{
    for (size_t u = 0; u < BH; ++u)
        for (size_t i = 0; i < n; ++i)
            for (size_t j = 0; j < m; ++j) {
                double sum = 0, abs_sum = 0;
                for (size_t l = 0; l < d; ++l) {
                    const double prod = value_of(q[(u * n + i) * d + l]) * value_of(k[(u * m + j) * d + l]);
                    sum += prod;
                    abs_sum += fabs(prod);
                }
                ref[(u * n + i) * m + j] = s * sum;
                mag[(u * n + i) * m + j] = fabs(s) * abs_sum;
            }
}

/* 1: served only where it should be; out untouched when not. */
static void test_serves(int have)
{
    uint16_t q[6] = {0}, k[6] = {0}, out[4] = {0x1234, 0x1234, 0x1234, 0x1234};
    const float table[3] = {0};   /* a term module (its table the compute type's) */
    const double rows[3] = {0};
    posenc_problem p = content_problem(1, 1, 2, 2, 3, 1.0, q, k);
    EXPECT(posenc_bf16_content_forward(&p, out, 1) == (have ? POSENC_OK : -1),
           "bf16dot: content bf16 served %d", have);
    posenc_problem refused[5] = {p, p, p, p, p};
    refused[0].dtype = POSENC_F32;
    refused[1].terms[POSENC_TERM_toeplitz].array[0] = (posenc_term_array){table, 0, 0, 3};
    refused[1].terms[POSENC_TERM_toeplitz].array[1] = (posenc_term_array){rows, 0, 0, 3};
    refused[2].scale = 1e300;   /* beyond float */
    refused[3].scale = 1e-45;   /* a float subnormal */
    refused[4].dtype = POSENC_F16;
    for (int t = 0; t < 5; ++t) {
        uint16_t untouched[4] = {0x1234, 0x1234, 0x1234, 0x1234};
        EXPECT(posenc_bf16_content_forward(&refused[t], untouched, 1) == -1 &&
                   untouched[0] == 0x1234 && untouched[3] == 0x1234,
               "bf16dot: problem %d is not served", t);
    }
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (isa == POSENC_ISA_AVX512 || !posenc_isa_supported((posenc_isa)isa))
            continue;
        posenc_set_isa((posenc_isa)isa);
        EXPECT(posenc_active_bf16_kernels() == NULL && posenc_bf16_content_forward(&p, out, 1) == -1,
               "bf16dot: not served under %s", posenc_isa_name((posenc_isa)isa));
    }
}

/* 2: pack against dst[(l / 2) 2 nr + 2 c + l % 2] = src[c rs + l], zeros elsewhere. */
static void test_pack(const posenc_bf16_kernels *kern)
{
    const size_t nr = kern->nr, depths[] = {0, 1, 2, 3, 31, 32, 33, 64, 65, 130};
    const size_t widths[] = {1, 15, 16, 17, nr - 1, nr};
    for (size_t a = 0; a < sizeof depths / sizeof depths[0]; ++a)
        for (size_t b = 0; b < sizeof widths / sizeof widths[0]; ++b) {
            const size_t kc = depths[a], cols = widths[b], rs = kc + 3;
            const size_t len = (cols - 1) * rs + kc, panel = (kc + 1) / 2 * 2 * nr;
            uint16_t *src = random_bf16(len);   /* exactly the rows: a read past them is caught by ASan */
            uint16_t *dst = malloc(sizeof(uint16_t) * (panel ? panel : 1));
            memset(dst, 0xff, sizeof(uint16_t) * (panel ? panel : 1));
            kern->pack(dst, src, (ptrdiff_t)rs, kc, cols);
            size_t bad = 0;
            for (size_t l = 0; l < (kc + 1) / 2 * 2; ++l)
                for (size_t c = 0; c < nr; ++c) {
                    const uint16_t want = l < kc && c < cols ? src[c * rs + l] : 0;
                    bad += dst[(l / 2) * 2 * nr + 2 * c + l % 2] != want;
                }
            EXPECT(bad == 0, "bf16dot pack kc=%zu cols=%zu: %zu wrong", kc, cols, bad);
            free(src);
            free(dst);
        }
}

/* 2a: pack_pairs (float32 rows, rounded) and pack_pairs16 (bfloat16 rows) against their
 * definition: word t * width + c holds elements (2 t, c) and (2 t + 1, c) for the depths
 * in column c's tile's range and c < cols, zero elsewhere, pair rows up to the largest
 * range's end; widths across the 16- and 32-column blocks, tiles of 1, 12, 16 columns
 * and the whole width, ranges whole or cut (odd ends, empty), rows read exactly as long
 * as the ranges reach (ASan).  Normal float32 values: their rounding is the scalar one. */
static void test_pack_pairs(const posenc_bf16_kernels *kern)
{
    const size_t widths[] = {1, 12, 16, 17, 31, 32, 33, 48, 64, 96, 100, 128};
    const size_t depths[] = {1, 2, 3, 31, 64, 65};
    size_t cases = 0, bad_cases = 0;
    for (size_t a = 0; a < sizeof widths / sizeof widths[0]; ++a)
        for (size_t b = 0; b < sizeof depths / sizeof depths[0]; ++b)
            for (int shape = 0; shape < 8; ++shape) {
                const size_t width = widths[a], K = depths[b];
                const size_t tile = shape % 4 == 0 ? 1 : shape % 4 == 1 ? 12 : shape % 4 == 2 ? 16 : width;
                const size_t cols = shape < 4 ? width : width - width / 3;
                const size_t tiles = (width + tile - 1) / tile, rs = cols + shape % 3;
                size_t ranges[2 * 128], end = 0;
                for (size_t t = 0; t < tiles; ++t) {   /* whole for shapes 0 and 4, else cut */
                    const double u0 = (urand() + 1) / 2, u1 = (urand() + 1) / 2;   /* [0, 1) */
                    size_t lo = (shape == 0 || shape == 4) ? 0 : (size_t)(u0 * (double)K);
                    size_t hi = (shape == 0 || shape == 4) ? K : lo + (size_t)(u1 * (double)(K - lo + 1));
                    if (shape == 7 && t % 3 == 1)
                        lo = hi;   /* empty */
                    ranges[2 * t] = lo;
                    ranges[2 * t + 1] = hi;
                    if (t * tile < cols)
                        end = hi > end ? hi : end;
                }
                const size_t len = end ? (end - 1) * rs + cols : 1;
                const size_t pairs = (end + 1) / 2, words = pairs * width + 16;
                float *src = malloc(sizeof(float) * len);
                uint16_t *src16 = malloc(sizeof(uint16_t) * len);
                uint32_t *dst = malloc(sizeof(uint32_t) * words);
                for (size_t e = 0; e < len; ++e) {
                    src[e] = (float)(urand() * ldexp(1.0, (int)lround(4 * urand())));
                    uint32_t u;
                    memcpy(&u, &src[e], sizeof u);
                    src16[e] = posenc_bf16_from_f32_bits(u);
                }
                for (int from16 = 0; from16 < 2; ++from16) {
                    memset(dst, 0xff, sizeof(uint32_t) * words);
                    if (from16)
                        kern->pack_pairs16((uint16_t *)(void *)dst, width, src16, (ptrdiff_t)rs,
                                           ranges, tile, cols);
                    else
                        kern->pack_pairs((uint16_t *)(void *)dst, width, src, (ptrdiff_t)rs, ranges,
                                         tile, cols);
                    size_t bad = 0;
                    for (size_t t = 0; t < pairs; ++t)
                        for (size_t c = 0; c < width; ++c) {
                            uint32_t want = 0;
                            for (size_t e = 0; e < 2 && c < cols; ++e) {
                                const size_t l = 2 * t + e, r = c / tile;
                                if (ranges[2 * r] <= l && l < ranges[2 * r + 1])
                                    want |= (uint32_t)src16[l * rs + c] << (16 * e);
                            }
                            bad += dst[t * width + c] != want;
                        }
                    ++cases;
                    bad_cases += bad != 0;
                    if (bad)
                        fprintf(stderr, "  pack_pairs%s width %zu K %zu shape %d: %zu words wrong\n",
                                from16 ? "16" : "", width, K, shape, bad);
                }
                free(src);
                free(src16);
                free(dst);
            }
    EXPECT(bad_cases == 0, "bf16dot pack_pairs / pack_pairs16: %zu of %zu cases wrong", bad_cases,
           cases);
}

/* 2b: exp_row against exp in double: each element its exp's bfloat16 rounding or a
 * neighbour (within 2^-8 + 4e-6 relative: one rounding and the polynomial's 3.0e-6),
 * the sum within 1e-5 relative of exp's (the polynomial and float32 sums), across the
 * row's vector tails; below float32's normal range within 2^-126; with special
 * values, -inf and huge negative logits give 0, NaN gives NaN (and a NaN sum), an
 * overflowing one +inf; x unchanged. */
static void test_exp_row(const posenc_bf16_kernels *kern)
{
    /* the float32 exp itself: a one-element row's sum is its exp, within 3.0e-6
     * (_dtypes.SOFTMAX_EXP_ERROR) and t's error as a logit's, 2^-23 |x - shift| (t's
     * rounding and log2(e)'s, as float32's subtraction x - shift rounds by 2^-24 |x -
     * shift|) and 2^-23 |shift| (c's, common to a row), from -100 to 0 past the shift */
    size_t off = 0;
    double worst = 0;
    for (int i = 0; i <= 100000; ++i)
        for (int s = 0; s < 3; ++s) {
            const double shift = s == 0 ? 0.0 : s == 1 ? 4.25 : -37.3;
            const float x = (float)(shift - 100.0 * i / 100000.0);
            uint16_t one;
            const double got = kern->exp_row(&one, &x, 1, shift), want = exp((double)x - shift);
            const double slack = 3.0e-6 + 0x1p-23 * (fabs((double)x - shift) + fabs(shift));
            if (want < 1e-37)   /* float32's exp underflows there (the row tests take it) */
                continue;
            const double rel = fabs(got - want) / want;
            worst = rel > worst ? rel : worst;
            off += !(rel <= slack);
        }
    EXPECT(off == 0, "bf16 exp_row's exp: %zu of 3 x 100001 one-element rows off (worst %.3g)",
           off, worst);

    const size_t lens[] = {0, 1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100, 1000};
    for (size_t a = 0; a < 2 * sizeof lens / sizeof lens[0]; ++a) {
        const size_t len = lens[a / 2];
        const int special = a % 2;
        float *x = malloc(sizeof(float) * (len + 1)), *kept = malloc(sizeof(float) * (len + 1));
        uint16_t *got = malloc(sizeof(uint16_t) * (len + 1));
        for (size_t j = 0; j < len; ++j)
            x[j] = (float)((double)((j * 7919u) % 1000u) / 97.0 - 5.0);
        if (special && len > 3) x[1] = -INFINITY, x[3] = -200.0f;
        if (special && len > 16) x[16] = NAN;
        if (special && len > 40) x[40] = 120.0f;   /* exp(120 - 4.25) overflows float32 */
        memcpy(kept, x, sizeof(float) * len);
        const double shift = 4.25;
        const double got_sum = kern->exp_row(got, x, len, shift);
        size_t bad = 0;
        double want_sum = 0;
        for (size_t j = 0; j < len; ++j) {
            const double want = exp((double)kept[j] - shift), have = value_of(got[j]);
            want_sum += want;
            bad += memcmp(x + j, kept + j, sizeof(float)) != 0;
            if (kept[j] != kept[j])
                bad += have == have;
            else if (want > 3.4e38)
                bad += have != INFINITY;
            else
                bad += !(have == want || fabs(have - want) <= (0x1p-8 + 4e-6) * want ||
                         (want < 0x1p-126 && fabs(have - want) <= 0x1p-126));   /* underflow */
        }
        const int sum_ok = want_sum != want_sum ? got_sum != got_sum
                           : want_sum > 3.4e38  ? got_sum == INFINITY
                                                : fabs(got_sum - want_sum) <= 1e-5 * want_sum;
        EXPECT(bad == 0 && sum_ok,
               "bf16 exp_row len=%zu special=%d: %zu elements off, sum %.9g vs %.9g", len,
               special, bad, got_sum, want_sum);
        free(x), free(kept), free(got);
    }
}

/* 3: logits of every size combination within the bound; inputs unchanged. */
/* 2c: grad_row against exp_row and round_row: P16 exp_row's row bit for bit, dS (dP +
 * minus_delta) P in float32 with P the float32 exp (a one-element exp_row's sum), dS16
 * round_row's rounding of dS; -inf scores (masked keys) and a NaN among them; rows across
 * the vector tails between guards; s unchanged. */
static void test_grad_row(const posenc_bf16_kernels *kern)
{
    const size_t lens[] = {0, 1, 5, 15, 16, 17, 31, 33, 100};
    size_t bad_rows = 0;
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; ++a)
        for (int special = 0; special < 2; ++special) {
            const size_t len = lens[a];
            const double lse = special ? -3.5 : 5.25;
            const float minus_delta = (float)(0.75 * urand());
            float s[102], kept[102], ds[102], dp[102], want[102];
            uint16_t p16[104], ds16[104], ref16[102], round16[102];
            for (size_t j = 0; j < len; ++j) {
                s[j] = (float)(4 * urand() + lse - 2);
                dp[j] = (float)urand();
            }
            if (special && len > 3) s[1] = -INFINITY, s[3] = -300.0f;
            if (special && len > 16) dp[16] = NAN;
            memcpy(kept, s, sizeof(float) * len);
            memcpy(ds, dp, sizeof(float) * len);
            for (size_t j = 0; j < len + 2; ++j)
                p16[j] = ds16[j] = 0xdead;
            kern->grad_row(p16 + 1, ds16 + 1, ds, s, len, lse, minus_delta);
            kern->exp_row(ref16, kept, len, lse);
            size_t bad = memcmp(s, kept, sizeof(float) * len) != 0;
            bad += p16[0] != 0xdead || p16[len + 1] != 0xdead || ds16[0] != 0xdead ||
                   ds16[len + 1] != 0xdead;
            for (size_t j = 0; j < len; ++j) {
                uint16_t one;
                const float p = (float)kern->exp_row(&one, &kept[j], 1, lse);
                want[j] = (dp[j] + minus_delta) * p;
                bad += p16[j + 1] != ref16[j];
                bad += !(memcmp(&ds[j], &want[j], sizeof(float)) == 0 ||
                         (ds[j] != ds[j] && want[j] != want[j]));
            }
            kern->round_row(round16, ds, len);
            bad += memcmp(ds16 + 1, round16, sizeof(uint16_t) * len) != 0;
            bad_rows += bad != 0;
            if (bad)
                fprintf(stderr, "  grad_row len %zu special %d: %zu wrong\n", len, special, bad);
        }
    EXPECT(bad_rows == 0, "bf16 grad_row: %zu of %zu rows wrong", bad_rows,
           2 * sizeof lens / sizeof lens[0]);
}

static void test_sizes(void)
{
    const size_t sizes[] = {1, 3, 7, 17, 33, 65, 130};
    const size_t count = sizeof sizes / sizeof sizes[0], B = 2, H = 1;
    double worst_all = 0;
    for (size_t a = 0; a < count; ++a)
        for (size_t b = 0; b < count; ++b)
            for (size_t c = 0; c < count; ++c) {
                const size_t n = sizes[a], m = sizes[b], d = sizes[c], logits = B * H * n * m;
                uint16_t *q = random_bf16(B * H * n * d), *k = random_bf16(B * H * m * d);
                uint16_t *q0 = malloc(sizeof(uint16_t) * B * H * n * d);
                uint16_t *k0 = malloc(sizeof(uint16_t) * B * H * m * d);
                memcpy(q0, q, sizeof(uint16_t) * B * H * n * d);
                memcpy(k0, k, sizeof(uint16_t) * B * H * m * d);
                uint16_t *out = malloc(sizeof(uint16_t) * logits);
                double *ref = malloc(sizeof(double) * logits), *mag = malloc(sizeof(double) * logits);
                for (int unit_scale = 0; unit_scale < 2; ++unit_scale) {
                    const double s = unit_scale ? 1.0 : 1.0 / sqrt((double)d);
                    posenc_problem p = content_problem(B, H, n, m, d, s, q, k);
                    EXPECT(posenc_bf16_content_forward(&p, out, 1) == POSENC_OK, "bf16dot status");
                    reference(q, k, B * H, n, m, d, s, ref, mag);
                    double worst;
                    const size_t bad = check_bound(out, ref, mag, logits, d, &worst);
                    EXPECT(bad == 0, "bf16dot n=%zu m=%zu d=%zu s=%g: %zu logits outside the bound",
                           n, m, d, s, bad);
                    if (worst > worst_all)
                        worst_all = worst;
                }
                EXPECT(memcmp(q, q0, sizeof(uint16_t) * B * H * n * d) == 0 &&
                           memcmp(k, k0, sizeof(uint16_t) * B * H * m * d) == 0,
                       "bf16dot n=%zu m=%zu d=%zu: inputs modified", n, m, d);
                free(q), free(k), free(q0), free(k0), free(out), free(ref), free(mag);
            }
    printf("bf16dot: %zu sizes x 2 scales, largest error %.3f of the bound\n",
           count * count * count, worst_all);
}

/* 4: the microkernel with P, on partial tiles: ADD_P then MUL_P. */
static void test_epilogue(const posenc_bf16_kernels *kern)
{
    const size_t mr = kern->mr, nr = kern->nr, shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {0, 0, 33}};
    for (size_t t = 0; t < 3; ++t)
        for (int mul = 0; mul < 2; ++mul) {
            const size_t rows = shapes[t][0] ? shapes[t][0] : mr;
            const size_t cols = shapes[t][1] ? shapes[t][1] : nr, d = shapes[t][2];
            const size_t ldp = nr + 3, ldc = nr + 1, lda = d + 2;
            uint16_t *a = random_bf16(rows * lda), *kt = random_bf16(cols * d);
            uint16_t *b = malloc(sizeof(uint16_t) * ((d + 1) / 2 * 2 * nr + 1));
            uint16_t *c = malloc(sizeof(uint16_t) * rows * ldc);
            float *P = malloc(sizeof(float) * rows * ldp);
            double ref[64 * 64], mag[64 * 64];
            uint16_t got[64 * 64];
            for (size_t x = 0; x < rows * ldp; ++x)
                P[x] = (float)(2 * urand());
            kern->pack(b, kt, (ptrdiff_t)d, d, cols);
            const float s = 0.375f;
            kern->ukr(d, a, (ptrdiff_t)lda, b, c, (ptrdiff_t)ldc, rows, cols, s, P, (ptrdiff_t)ldp,
                      mul ? POSENC_UKR_MUL_P : POSENC_UKR_ADD_P);
            for (size_t r = 0; r < rows; ++r)
                for (size_t j = 0; j < cols; ++j) {
                    double sum = 0, abs_sum = 0;
                    for (size_t l = 0; l < d; ++l) {
                        const double prod = value_of(a[r * lda + l]) * value_of(kt[j * d + l]);
                        sum += prod;
                        abs_sum += fabs(prod);
                    }
                    const double pv = P[r * ldp + j];
                    ref[r * cols + j] = mul ? s * sum * pv : s * sum + pv;
                    mag[r * cols + j] = mul ? s * abs_sum * fabs(pv) : s * abs_sum + fabs(pv);
                    got[r * cols + j] = c[r * ldc + j];
                }
            double worst;
            EXPECT(check_bound(got, ref, mag, rows * cols, d, &worst) == 0,
                   "bf16dot ukr %s rows=%zu cols=%zu d=%zu", mul ? "MUL_P" : "ADD_P", rows, cols, d);
            free(a), free(kt), free(b), free(c), free(P);
        }
}

/* 5: Inf and NaN inputs; subnormal results (s = 2^-10 on sums near 2^-120). */
static void test_special(void)
{
    const size_t n = 13, m = 35, d = 9, logits = n * m;
    uint16_t *q = random_bf16(n * d), *k = random_bf16(m * d), *out = malloc(sizeof(uint16_t) * logits);
    double ref[13 * 35], mag[13 * 35], worst;
    q[0 * d + 2] = 0x7f80;       /* +Inf: row 0 is +-Inf, or NaN where a key has 0 there */
    k[3 * d + 2] = 0x0000;
    q[5 * d + 4] = 0xff80;       /* -Inf and +Inf in one row: NaN where both meet nonzero keys */
    q[5 * d + 7] = 0x7f80;
    k[9 * d + 1] = 0x7fc1;       /* NaN: column 9 */
    q[11 * d + 0] = 0x7f80;      /* Inf times Inf */
    k[20 * d + 0] = 0xff80;
    posenc_problem p = content_problem(1, 1, n, m, d, 0.25, q, k);
    EXPECT(posenc_bf16_content_forward(&p, out, 1) == POSENC_OK, "bf16dot status");
    reference(q, k, 1, n, m, d, 0.25, ref, mag);
    size_t nans = 0, infs = 0;
    for (size_t t = 0; t < logits; ++t)
        nans += isnan(ref[t]) != 0, infs += isinf(ref[t]) != 0;
    EXPECT(nans > 0 && infs > 0, "bf16dot special: the cases are there");
    EXPECT(check_bound(out, ref, mag, logits, d, &worst) == 0, "bf16dot: Inf and NaN inputs");
    size_t nan_bits_ok = 1;
    for (size_t t = 0; t < logits; ++t)
        if (isnan(ref[t]))
            nan_bits_ok &= (out[t] & 0x7f80) == 0x7f80 && (out[t] & 0x7f) != 0;
    EXPECT(nan_bits_ok, "bf16dot: NaN logits are bfloat16 NaNs");

    /* subnormal results: every product 2^-120 .. 2^-112, times 2^-10 */
    for (size_t t = 0; t < n * d; ++t)
        q[t] = bf16_of(ldexp(1 + fabs(urand()), -60));
    for (size_t t = 0; t < m * d; ++t)
        k[t] = bf16_of(ldexp(1 + fabs(urand()), -63));
    p.scale = ldexp(1, -10);
    EXPECT(posenc_bf16_content_forward(&p, out, 1) == POSENC_OK, "bf16dot status");
    reference(q, k, 1, n, m, d, p.scale, ref, mag);
    size_t subnormal = 0;
    for (size_t t = 0; t < logits; ++t)
        subnormal += (out[t] & 0x7f80) == 0 && (out[t] & 0x7f) != 0;
    EXPECT(subnormal == logits, "bf16dot: %zu of %zu results subnormal", subnormal, logits);
    EXPECT(check_bound(out, ref, mag, logits, d, &worst) == 0, "bf16dot: subnormal results");
    free(q), free(k), free(out);
}

/* 6: above the one-thread threshold: many units; one unit in row chunks. */
static void test_threads(void)
{
    const size_t shapes[][5] = {{3, 2, 130, 130, 17}, {1, 1, 600, 65, 33}};
    for (size_t t = 0; t < 2; ++t) {
        const size_t *z = shapes[t], logits = z[0] * z[1] * z[2] * z[3];
        uint16_t *q = random_bf16(z[0] * z[1] * z[2] * z[4]);
        uint16_t *k = random_bf16(z[0] * z[1] * z[3] * z[4]);
        uint16_t *one = malloc(sizeof(uint16_t) * logits), *many = malloc(sizeof(uint16_t) * logits);
        posenc_problem p = content_problem(z[0], z[1], z[2], z[3], z[4], 0.125, q, k);
        EXPECT(posenc_bf16_content_forward(&p, one, 1) == POSENC_OK, "bf16dot status");
        for (int threads = 2; threads <= 3; ++threads) {
            memset(many, 0, sizeof(uint16_t) * logits);
            EXPECT(posenc_bf16_content_forward(&p, many, threads) == POSENC_OK &&
                       memcmp(one, many, sizeof(uint16_t) * logits) == 0,
                   "bf16dot shape %zu: %d threads bitwise as 1", t, threads);
        }
        free(q), free(k), free(one), free(many);
    }
}

/* 7: logits of POSENC_STREAM_BYTES and more, 64-byte aligned rows: written by
 * non-temporal stores, bitwise as the same call into a misaligned buffer. */
static void test_stream(void)
{
    const size_t n = 4096, m = 4096, d = 3, logits = n * m;
    uint16_t *q = random_bf16(n * d), *k = random_bf16(m * d);
    void *aligned = NULL, *shifted = NULL;
    EXPECT(posix_memalign(&aligned, 64, sizeof(uint16_t) * logits) == 0 &&
               posix_memalign(&shifted, 64, sizeof(uint16_t) * (logits + 1)) == 0,
           "bf16dot: allocation");
    if (!aligned || !shifted) {
        free(aligned), free(shifted), free(q), free(k);
        return;
    }
    posenc_problem p = content_problem(1, 1, n, m, d, 0.5, q, k);
    EXPECT(sizeof(uint16_t) * logits >= POSENC_STREAM_BYTES, "bf16dot: a streamed size");
    EXPECT(posenc_bf16_content_forward(&p, aligned, 2) == POSENC_OK &&
               posenc_bf16_content_forward(&p, (uint16_t *)shifted + 1, 2) == POSENC_OK &&
               memcmp(aligned, (uint16_t *)shifted + 1, sizeof(uint16_t) * logits) == 0,
           "bf16dot: streamed logits bitwise as stored ones");
    free(aligned), free(shifted), free(q), free(k);
}

void test_bf16dot(void)
{
    const posenc_isa isa = posenc_get_isa();
    const int have = posenc_isa_supported(POSENC_ISA_AVX512) &&
                     (posenc_set_isa(POSENC_ISA_AVX512), posenc_active_bf16_kernels() != NULL);
    test_serves(have);
    if (!have) {
        printf("bf16dot: skipped (%s)\n", posenc_isa_supported(POSENC_ISA_AVX512)
                                               ? "no AVX512-BF16 in this CPU or build"
                                               : "no avx512 ISA here");
        posenc_set_isa(isa);
        return;
    }
    posenc_set_isa(POSENC_ISA_AVX512);
    const posenc_bf16_kernels *kern = posenc_active_bf16_kernels();
    printf("bf16dot: %s, tile %zu x %zu\n", kern->name, kern->mr, kern->nr);
    test_pack(kern);
    test_pack_pairs(kern);
    test_exp_row(kern);
    test_grad_row(kern);
    test_sizes();
    test_epilogue(kern);
    test_special();
    test_threads();
    test_stream();
    posenc_set_isa(isa);
}
