/*
 * bf16dot.h -- the bfloat16 content logits on vdpbf16ps (bf16dot.c;
 * docs/low_precision.md §1 design (b)): the fast path that the low-precision
 * engine tries first for a content-only bfloat16 forward.
 */
#ifndef POSENC_BF16DOT_H
#define POSENC_BF16DOT_H

#include "../posenc.h"

/*
 * out (B, H, n, m), bfloat16, C-contiguous = narrow(s q.k^T) of a validated
 * problem of dtype POSENC_BF16 with no positional term (pos_q, table,
 * query_table, key_table all NULL): each logit the
 * float32 sum of vdpbf16ps times s (as float), rounded once to nearest even.
 * Returns -1, having written nothing, when it does not serve the problem
 * (another dtype, a positional term, no posenc_active_bf16_kernels(), or
 * a scale that float cannot hold as a normal number or zero): the caller
 * computes it otherwise.  Else POSENC_OK, or POSENC_ENOMEM.  Results are
 * bitwise identical for any num_threads.
 */
int posenc_bf16_content_forward(const posenc_problem *p, void *out, int num_threads);

#endif /* POSENC_BF16DOT_H */
