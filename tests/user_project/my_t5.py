"""A user's own T5 attention logits (Raffel et al.), NumPy and PyTorch:
A[b, h, i, j] = scale q_i.k_j + bias[h, bucket(j - i)].

The code under test of this small project; test_my_t5.py checks it against
posenc.reference with posenc.testing.
"""

import numpy as np

from posenc.buckets import t5 as t5_bucket


def bucket_rows(n, m, num_buckets, max_distance, bidirectional):
    """(n, m) bias rows of every (query i, key j): T5's bucket of j - i."""
    offset = np.arange(m)[None, :] - np.arange(n)[:, None]   # key minus query
    return t5_bucket(offset, num_buckets, max_distance, bidirectional)


def t5_logits(q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True, scale=1.0):
    rows = bucket_rows(q.shape[-2], k.shape[-2], num_buckets, max_distance, bidirectional)
    return scale * np.einsum("bhid,bhjd->bhij", q, k) + bias[:, rows]


def t5_grads(G, q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True, scale=1.0):
    """Gradients of sum(G * t5_logits(...)) by argument name."""
    rows = bucket_rows(q.shape[-2], k.shape[-2], num_buckets, max_distance, bidirectional)
    grad_bias = np.zeros((G.shape[1], bias.shape[1]), dtype=G.dtype)
    for h in range(G.shape[1]):
        np.add.at(grad_bias[h], rows, G[:, h].sum(axis=0))
    if bias.shape[0] == 1:      # one bias shared by every head
        grad_bias = grad_bias.sum(axis=0, keepdims=True)
    return {"q": scale * np.einsum("bhij,bhjd->bhid", G, k),
            "k": scale * np.einsum("bhij,bhid->bhjd", G, q),
            "bias": grad_bias}


def t5_logits_torch(q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True,
                    scale=1.0):
    """The same with torch tensors (any device), differentiable by autograd."""
    import torch

    rows = torch.as_tensor(bucket_rows(q.shape[-2], k.shape[-2], num_buckets, max_distance,
                                       bidirectional), device=q.device)
    return scale * q @ k.transpose(-1, -2) + bias[:, rows]
