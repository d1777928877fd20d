"""PyTorch peer of `longhaul bench train`: the same model directory (loaded with
tests/ref/torch_model.py), the same batch (B sequences of T tokens drawn with the same Philox
stream as longhaul, weight 1 except at sequence starts), the same step (forward, backward,
global grad-norm clipping, AdamW with longhaul's defaults), timed the same way (one untimed
warmup step, then N steps). Prints one JSON line.

    python3 bench/peer_train.py --model DIR --batch 8 --seq 256 --steps 3 --threads 2

It is meant as a fair peer: fp32, eager torch as a Hugging Face-style model runs, batched
attention, foreach AdamW reused across steps, gradients set to None instead of zeroed, and
OMP_WAIT_POLICY=PASSIVE so torch's two thread pools do not fight over the cores.
"""

import argparse
import json
import os
import sys

import benchlib  # bench/, the script's own folder
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + safetensors)")
    ap.add_argument("--batch", type=int, required=True, help="sequences per step")
    ap.add_argument("--seq", type=int, required=True, help="tokens per sequence")
    ap.add_argument("--steps", type=int, required=True, help="timed steps after one warmup")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.seq < 2 or a.steps < 1 or a.threads < 0:
        ap.error("--batch >= 1, --seq >= 2, --steps >= 1, --threads >= 0")
    return a


A = parse(sys.argv[1:])
benchlib.pin_threads(A.threads)  # before torch is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import torch_model as tm  # noqa: E402

BENCH_SEED = 0x6C6F6E67  # src/cli/cmd_bench.c: the same tokens as `longhaul bench train`
# lh_adamw_defaults()
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


def philox_word0(seed, stream, positions):
    """First word of Philox4x32-10 at counter (position, stream), key seed, vectorised;
    the same as lh_philox (src/base/philox.c)."""
    m32 = np.uint64(0xFFFFFFFF)
    pos = positions.astype(np.uint64)
    c0, c1 = pos & m32, pos >> np.uint64(32)
    c2 = np.full_like(c0, stream & 0xFFFFFFFF)
    c3 = np.full_like(c0, stream >> 32)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & m32
        hi1, lo1 = p1 >> np.uint64(32), p1 & m32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0


def make_batch(vocab, B, T):
    N = B * T
    words = philox_word0(BENCH_SEED, 0, np.arange(N, dtype=np.uint64))
    tokens = torch.from_numpy((words % np.uint64(vocab)).astype(np.int64))
    weight = torch.ones(N)
    weight[::T] = 0.0
    return tokens, [s * T for s in range(B + 1)], weight


def main():
    if A.threads > 0:
        torch.set_num_threads(A.threads)
    torch.set_grad_enabled(True)
    model = tm.load_model_dir(A.model, torch.float32)
    cfg = model.cfg
    if A.seq > cfg.max_positions:
        raise SystemExit(f"--seq {A.seq} is more than max_position_embeddings {cfg.max_positions}")
    tokens, seq_start, weight = make_batch(cfg.vocab_size, A.batch, A.seq)
    layout = tm.Layout(seq_start)
    targets, w_next = tokens[1:], weight[1:]  # position i predicts token i+1
    w_sum = float(weight.sum())

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=True)
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(tokens, layout)
        # Cross-entropy over every position but the last; weight 0 where token i+1 starts a
        # sequence, so nothing crosses sequences. Equals tm.token_logprobs + tm.weighted_ce.
        ce = F.cross_entropy(logits[:-1], targets, reduction="none")
        loss = (ce * w_next).sum() / w_sum
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        opt.step()
        return float(loss)

    step()  # warmup: allocator, thread pool, caches
    t0 = time.perf_counter()
    for _ in range(A.steps):
        loss = step()
    elapsed = time.perf_counter() - t0
    N = A.batch * A.seq
    print(json.dumps({
        "command": "peer_train.py",
        "tokens_per_s": N * A.steps / elapsed,
        "step_s": elapsed / A.steps,
        "threads": torch.get_num_threads(),
        "batch": A.batch,
        "seq": A.seq,
        "params": sum(p.numel() for p in params),
        "steps": A.steps,
        "loss": loss,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
