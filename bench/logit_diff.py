#!/usr/bin/env python3
"""Worst logit difference of each of longhaul's kernel paths against PyTorch on the same bf16
weights (tests/ref/torch_model.py), in fp32 (the reference the issue names) and in fp64 (the
exact value, so that the fp32 reference's own error shows). Runs bench's logits_dump.
  logit_diff.py BUILD_DIR MODEL_DIR [T]"""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import torch  # noqa: E402
import torch_model  # noqa: E402

if len(sys.argv) not in (3, 4):
    sys.exit("usage: logit_diff.py BUILD_DIR MODEL_DIR [T]")
build, model_dir = sys.argv[1], sys.argv[2]
T = int(sys.argv[3]) if len(sys.argv) == 4 else 32
with tempfile.TemporaryDirectory() as tmp:
    out = subprocess.run([os.path.join(build, "bench", "logits_dump"), model_dir,
                          os.path.join(tmp, "logits"), str(T)],
                         check=True, capture_output=True, text=True).stdout.split()
    got = {os.path.basename(p)[len("logits-"):-len(".f32")]: np.fromfile(p, np.float32)
           for p in out}
torch.set_grad_enabled(False)
refs = {}
for name, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
    m = torch_model.load_model_dir(model_dir, dtype)
    for p in m.parameters():  # the policy is bf16 (an F32 file is rounded on load, as here)
        p.copy_(p.to(torch.bfloat16).to(dtype))
    tokens = torch.tensor([(7919 * i) % m.head_weight().shape[0] for i in range(T)])
    refs[name] = m.forward(tokens, [0, T]).double().numpy().ravel()
    del m
scale = np.abs(refs["fp64"]).max()
print(f"{model_dir}: {T} positions, max |logit| {scale:.3f}")
print(f"torch fp32 vs fp64: worst |diff| {np.abs(refs['fp32'] - refs['fp64']).max():.3e}")
for path, g in got.items():
    d32 = np.abs(g - refs["fp32"]).max()
    d64 = np.abs(g - refs["fp64"]).max()
    print(f"longhaul {path:8s} vs torch fp32: worst |diff| {d32:.3e}; vs fp64: {d64:.3e}")
names = list(got)
for i in range(len(names)):
    for j in range(i + 1, len(names)):
        d = np.abs(got[names[i]] - got[names[j]]).max()
        print(f"longhaul {names[i]} vs {names[j]}: worst |diff| {d:.3e}")
