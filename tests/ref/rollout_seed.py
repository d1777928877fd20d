#!/usr/bin/env python3
"""Writes rollout batches in longhaul's byte format (docs/ARCHITECTURE.md, "Rollout batches"),
from the format description alone: the seed corpus of tests/fuzz/fuzz_rollout.c. test_rollout
checks that longhaul encodes the same batch to exactly these bytes and decodes them back.
Usage: rollout_seed.py OUT_DIR"""
import math
import os
import struct
import sys


def encode(b):
    n = b["groups"] * b["group_size"]
    assert len(b["seq_len"]) == n
    has_old = b.get("old") is not None
    tokens = b["tokens"]
    h = bytearray(96)
    h[0:4] = b"LHRB"
    struct.pack_into("<HHIIQqQQfifff", h, 4, 1, 1 if has_old else 0, b["groups"],
                     b["group_size"], len(tokens), b["version"], b["seed"], b["stream_base"],
                     b["temperature"], b["top_k"], b["top_p"], b["min_p"], 0)
    struct.pack_into("<i", h, 64, b["max_new"])
    h[68] = b["split"]
    out = bytearray(h)
    out += struct.pack(f"<{b['groups']}Q", *b["task_index"])
    out += bytes(b["group_ok"])
    out += struct.pack(f"<{n}I", *b["seq_len"])
    out += struct.pack(f"<{n}I", *b["prompt_len"])
    out += struct.pack(f"<{n}f", *b["reward"])
    out += bytes(b["correct"]) + bytes(b["well_formed"]) + bytes(b["finish"])
    out += struct.pack(f"<{len(tokens)}i", *tokens)
    out += struct.pack(f"<{len(tokens)}f", *b["mu"])
    if has_old:
        out += struct.pack(f"<{len(tokens)}f", *b["old"])
    return bytes(out)


# the batch of tests/unit/test_rollout.c, make_batch
BATCH = dict(groups=2, group_size=2, version=41, seed=0x0123456789ABCDEF, stream_base=1000,
             temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, max_new=3, split=0,
             task_index=[7, 1 << 40], group_ok=[1, 0], seq_len=[5, 3, 0, 0],
             prompt_len=[2, 2, 0, 0], reward=[1.0, 0.25, 0.0, 0.0], correct=[1, 0, 0, 0],
             well_formed=[1, 1, 0, 0], finish=[1, 0, 0, 0],
             tokens=[10, 11, 20, 21, 2, 10, 11, 22],
             mu=[0, 0, -0.5, -0.25, -0.125, 0, 0, -1.0],
             old=[0, 0, -0.4, -0.3, -0.1, 0, 0, -1.5])

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], "seed-old.bin"), "wb") as f:
        f.write(encode(BATCH))
    plain = dict(BATCH, old=None)
    with open(os.path.join(sys.argv[1], "seed-plain.bin"), "wb") as f:
        f.write(encode(plain))
    big = dict(BATCH, groups=1, group_size=3, task_index=[5], group_ok=[1], seq_len=[4, 3, 3],
               prompt_len=[2, 2, 2], reward=[0.0, 1.0, 0.5], correct=[0, 1, 0],
               well_formed=[1, 1, 1], finish=[3, 1, 2], tokens=[1, 2, 3, 4, 1, 2, 5, 1, 2, 6],
               mu=[0, 0, -1, -2, 0, 0, -3, 0, 0, -math.log(2)], old=None, split=1, top_k=0,
               top_p=1.0, min_p=0.0, temperature=0.0)
    with open(os.path.join(sys.argv[1], "seed-test-split.bin"), "wb") as f:
        f.write(encode(big))
