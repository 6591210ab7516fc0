/*
 * attention_split_impl.h -- a decoding step's keys split among threads, for
 * one dtype (REAL, set by engine_<dtype>.c): past ATTENTION_SPLIT_KEYS keys
 * each chunk of keys is a work item of the decoding path
 * (attention_decode_impl.h), which leaves its rows unnormalised with their
 * max and sum; the chunks are merged in chunk order, so the bits do not
 * depend on the team.
 */
#ifndef POSENC_ENGINE_ATTENTION_SPLIT_IMPL_H
#define POSENC_ENGINE_ATTENTION_SPLIT_IMPL_H

#include "attention_decode_impl.h"

/* A decoding step over more keys than this splits them into chunks of this many, each a
 * work item (so that one key/value head's step runs on several threads), merged in
 * chunk order: the same bits for any team. */
#define ATTENTION_SPLIT_KEYS 2048

/* Whether a decoding step splits its keys (c->split, c->chunks): past ATTENTION_SPLIT_KEYS
 * keys, without dropout (its keep decisions are drawn per row over all keys), a rotation
 * or a term whose rows are a GEMM from key 0 (TUPE's dense factor: each chunk would redo
 * its keys before the chunk's),
 * or a term that reads the content logits (cope: a row's positions sum over all its keys). */
static void attention_split(attention_ctx *c)
{
    const posenc_problem *p = c->p;
    c->split = 0;
    c->chunks = 1;
    if (c->decode && !c->dropout && !posenc_rotates(p) && !posenc_terms_by_blocks(p) &&
        c->logits.content < 0 &&
        p->m > ATTENTION_SPLIT_KEYS) {
        c->split = ATTENTION_SPLIT_KEYS;
        c->chunks = (p->m + ATTENTION_SPLIT_KEYS - 1) / ATTENTION_SPLIT_KEYS;
    }
}

/*
 * A split call's rows (c->split): chunk parts merged in chunk order, per query row of
 * the call: M the largest part max (and the sink), sum = sum_s e^(max_s - M) sum_s
 * (+ e^(sink - M)), out = sum_s e^(max_s - M) part_s / sum, lse = M + log sum; a NaN
 * part makes the row NaN, and so does a NaN sink in a row that sees a key; a row with
 * every key masked gives 0 (lse: the sink, or -inf), as the unsplit rows do.  The same
 * order for any team: the same bits.
 */
static void attention_merge_chunks(const attention_ctx *c, const decode_target *t, REAL *weights)
{
    const posenc_problem *p = c->p;
    const size_t S = c->chunks, dv = c->a->dv, rows = p->B * p->H * p->n;
    for (size_t q = 0; q < rows; ++q) {
        const double *st = t->part_stats + q * S * 2;
        const size_t h = q / p->n % p->H;
        const double sink = c->a->sinks ? c->a->sinks[h] : -INFINITY;
        double top = -INFINITY;   /* the parts' max, then the sink's */
        int nan = 0;
        for (size_t s = 0; s < S; ++s) {
            if (st[2 * s] != st[2 * s] || st[2 * s + 1] != st[2 * s + 1])
                nan = 1;
            else if (st[2 * s] > top)
                top = st[2 * s];
        }
        nan |= sink != sink && top != -INFINITY;   /* a NaN sink and a key seen */
        REAL *out = t->out + q * dv;
        if (nan || top == -INFINITY) {   /* NaN, or every key masked: lse the sink (or -inf) */
            const REAL fill = nan ? (REAL)NAN : (REAL)0;
            for (size_t e = 0; e < dv; ++e)
                out[e] = fill;
            t->lse[q] = nan ? (REAL)NAN : (REAL)sink;
            continue;
        }
        if (sink > top)
            top = sink;
        double sum = c->a->sinks ? exp(c->a->sinks[h] - top) : 0.0;
        for (size_t s = 0; s < S; ++s) {
            const double f = st[2 * s] == -INFINITY ? 0.0 : exp(st[2 * s] - top);
            weights[s] = (REAL)f;
            sum += f * st[2 * s + 1];
        }
        if (dv) {
            c->kern->rows_axpy(out, dv, weights, S, 1, t->part + q * S * dv, S, dv);
            const REAL scale = (REAL)(1.0 / sum);
            c->kern->row_gather(POSENC_MUL, out, &scale, 0, dv);
        }
        t->lse[q] = (REAL)(top + log(sum));
    }
}

#endif /* POSENC_ENGINE_ATTENTION_SPLIT_IMPL_H */
