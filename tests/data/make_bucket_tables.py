"""Write tests/data/bucket_tables.npz: bucket maps computed by HuggingFace transformers.

The expected values of tests/test_buckets.py come from the real reference
implementations, not from posenc:

* ``T5Attention._relative_position_bucket(relative_position, bidirectional,
  num_buckets, max_distance)`` with ``relative_position = offset``;
* DeBERTa-v2's ``make_log_bucket_position(relative_pos, bucket_size,
  max_position)`` followed by ``.to(torch.long)``, as
  ``build_relative_position`` does;

each over the offsets ``OFFSET_MIN..OFFSET_MAX`` (inclusive) for the
configurations listed below.  The file also records the transformers and torch
versions and torch's CPU capability: torch's CPU ``log`` comes from MKL, whose
last bit depends on the instruction set it picks.  (The committed tables are
the same whether MKL takes its AVX-512 or its AVX2 path; that was checked with
``MKL_ENABLE_INSTRUCTIONS=AVX2``.)

Rerun, from the repository root, in a scratch environment outside the repo
(torch exactly 2.13.0: its CPU wheel is on the machine)::

    python -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers numpy
    /tmp/hfvenv/bin/python tests/data/make_bucket_tables.py

The tests need neither torch nor transformers; they only read the npz.
"""

import os

import numpy as np
import torch
import transformers
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
from transformers.models.t5.modeling_t5 import T5Attention

OFFSET_MIN, OFFSET_MAX = -100_000, 100_000

# (num_buckets, max_distance, bidirectional)
T5_CONFIGS = [(32, 128, True), (32, 128, False), (64, 256, True), (32, 50, True), (16, 50, False)]
# (bucket_size, max_position)
DEBERTA_LOG_CONFIGS = [(256, 512), (64, 128), (32, 512)]

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bucket_tables.npz")


def t5_key(num_buckets, max_distance, bidirectional):
    """Name of a t5 table in the npz (tests/test_buckets.py spells it the same)."""
    return f"t5_{num_buckets}_{max_distance}_{'bi' if bidirectional else 'uni'}"


def deberta_log_key(bucket_size, max_position):
    """Name of a deberta_log table in the npz."""
    return f"deberta_log_{bucket_size}_{max_position}"


def smallest_int_dtype(values):
    """The narrowest signed integer dtype holding every value."""
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= values.min() and values.max() <= info.max:
            return dtype
    return np.int64


def main():
    offsets = torch.arange(OFFSET_MIN, OFFSET_MAX + 1, dtype=torch.long)
    tables = {}
    for num_buckets, max_distance, bidirectional in T5_CONFIGS:
        buckets = T5Attention._relative_position_bucket(
            offsets, bidirectional=bidirectional, num_buckets=num_buckets,
            max_distance=max_distance).numpy()
        tables[t5_key(num_buckets, max_distance, bidirectional)] = buckets
    for bucket_size, max_position in DEBERTA_LOG_CONFIGS:
        buckets = make_log_bucket_position(offsets, bucket_size, max_position).to(torch.long).numpy()
        tables[deberta_log_key(bucket_size, max_position)] = buckets
    for name, buckets in tables.items():
        tables[name] = buckets.astype(smallest_int_dtype(buckets))

    np.savez_compressed(
        OUTPUT,
        offset_min=np.int64(OFFSET_MIN),
        offset_max=np.int64(OFFSET_MAX),
        transformers_version=np.str_(transformers.__version__),
        torch_version=np.str_(torch.__version__),
        torch_cpu_capability=np.str_(torch.backends.cpu.get_cpu_capability()),
        **tables,
    )
    print(f"wrote {OUTPUT} ({os.path.getsize(OUTPUT)} bytes): transformers "
          f"{transformers.__version__}, torch {torch.__version__}, {len(tables)} tables")


if __name__ == "__main__":
    main()
