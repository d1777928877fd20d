#!/usr/bin/env python3
"""bench/generate.sh's llama.cpp peer: llama-batched-bench (built from source: LLAMA_BATCHED_BENCH)
on an f16 GGUF of the same weights, B sequences of P prompt tokens and N generated tokens each,
T threads. Prints one JSON line in `longhaul bench generate --json`'s terms: prefill tokens/s
(B x P over the prompt forwards), decode tokens/s (B x N over the N decode forwards),
s/step, and the process's peak resident memory.
  peer_llama.py --bin PATH --gguf FILE --batch B --prompt-len P --new N --threads T"""
import argparse
import json
import resource
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--gguf", required=True)
ap.add_argument("--batch", type=int, required=True)
ap.add_argument("--prompt-len", type=int, required=True)
ap.add_argument("--new", type=int, required=True)
ap.add_argument("--threads", type=int, required=True)
a = ap.parse_args()
ctx = a.batch * (a.prompt_len + a.new) + 16
cmd = [a.bin, "-m", a.gguf, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(a.prompt_len),
       "-ntg", str(a.new), "-npl", str(a.batch), "-t", str(a.threads), "--output-format", "jsonl"]
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
if p.returncode:
    sys.exit(f"peer_llama: {' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
if not rows:
    sys.exit(f"peer_llama: no JSON line from {a.bin}: {p.stdout[-2000:]}")
r = rows[-1]
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({
    "command": "llama-batched-bench", "batch": a.batch, "prompt_len": a.prompt_len, "new": a.new,
    "threads": r["n_threads"], "prefill_tokens_per_s": r["speed_pp"],
    "decode_tokens_per_s": r["speed_tg"], "decode_step_s": r["t_tg"] / a.new,
    "prefill_s": r["t_pp"], "decode_s": r["t_tg"], "peak_rss_bytes": rss}))
