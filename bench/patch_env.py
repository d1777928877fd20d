#!/usr/bin/python3
"""An `exec` environment for bench/patch_trajectories.sh (protocol: include/longhaul/env.h, "The
exec protocol"). Random-weight models give equal rewards in every group under the built-in tasks
(no signal, so no update); here the reward depends on the random text itself: the fraction of the
completion's characters that are ASCII letters or digits (0 for an empty completion). It neither
saturates with length nor needs an eos. The prompts are fixed-form text; the answer is unused."""
import json
import sys

for line in sys.stdin:
    req = json.loads(line)
    if req["type"] == "generate":
        i = req["index"] + (1 << 40 if req["split"] == "test" else 0)
        rep = {"prompt": f"Task {i}: write some letters and digits.\n", "answer": "x"}
    else:
        c = req["completion"]
        r = sum(1 for ch in c if ch.isascii() and ch.isalnum()) / len(c) if c else 0.0
        rep = {"reward": r, "correct": r >= 1.0}
    if "request_id" in req:
        rep["request_id"] = req["request_id"]
    print(json.dumps(rep), flush=True)
