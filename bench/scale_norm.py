#!/usr/bin/env python3
"""Copies a model directory with its final RMSNorm weight (model.norm.weight, BF16) set to a
constant, so that the logits of a random-weight model are that many times larger: a random
Qwen2.5-0.5B-shaped model's logits have std ~0.6 and a near-uniform softmax over 151936 ids; a
trained model's reach 15-30. bench/verify_noise.sh measures the honest noise on both.
  scale_norm.py SRC_DIR DST_DIR VALUE"""
import json
import os
import shutil
import struct
import sys

if len(sys.argv) != 4:
    sys.exit("usage: scale_norm.py SRC_DIR DST_DIR VALUE")
src, dst, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
os.makedirs(dst, exist_ok=True)
for name in os.listdir(src):
    if name != "model.safetensors":
        shutil.copy(os.path.join(src, name), dst)
path = os.path.join(dst, "model.safetensors")
shutil.copy(os.path.join(src, "model.safetensors"), path + ".tmp")
with open(path + ".tmp", "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))["model.norm.weight"]
    if t["dtype"] != "BF16":
        sys.exit(f"{src}: model.norm.weight is {t['dtype']}, expected BF16")
    lo, hi = t["data_offsets"]
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bf16 = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    f.seek(8 + n + lo)
    f.write(struct.pack("<H", bf16) * ((hi - lo) // 2))
os.replace(path + ".tmp", path)
