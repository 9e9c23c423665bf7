"""The limits a bundle must keep, stated once: the loader refuses a bundle past them with a coded error before it
spends memory or time on it, and the compiler refuses to emit one (NCC_LIMIT). They are this project's choices,
set far above what any model it compiles needs (BERT-base's longest stream holds about 60,000 instructions) and
low enough that a hostile bundle cannot make the loader allocate more than a few hundred MB for its program.
"""

from __future__ import annotations

MAX_RANKS = 1024  # ranks in one bundle (trn2 at LNC 1: 128 per trn2.48xlarge, up to 8 instances)
MAX_INSTRUCTIONS_PER_STREAM = 1 << 21
MAX_INSTRUCTIONS = 1 << 23  # in all streams of all ranks
MAX_MANIFEST_BYTES = 64 << 20  # manifest.json and debug.json, each
MAX_JSON_DEPTH = 32  # nesting of the manifest's JSON values (the flags and stats of today nest 3 deep)
MAX_TENSOR_DIMS = 32
MAX_TENSOR_ELEMENTS = 1 << 40  # of a model input or output: the product of its dims, computed without overflow
# a listing file read by `asm`: a bundle's streams as text and its weights in base64 (4/3 of their bytes), so a
# model of 4.5 GB of weights; a larger file is refused before it is read
MAX_LISTING_BYTES = 6 << 30
