"""Constants shared by every stage of the bundled-model training: special token, sizes, buckets, domains.

See the module docstring of ``scripts/train_bundled_model.py`` for the bucket rule.
"""

from __future__ import annotations

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192
SEQ_LEN = 256
N_BUCKETS = 10
TRAIN_BUCKETS = 4
HELDOUT_BUCKET = 9
VAL_BUCKET = 8
DOMAINS = ("prose", "code", "qa", "smiles")
