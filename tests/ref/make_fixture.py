"""Builds one parity fixture for tests/unit/test_parity.c from a model directory written by
`longhaul init-model`: a perturbed copy of the model (config.json + F32 model.safetensors) and
reference.safetensors with a packed batch and what float64 torch computes for it (logits,
log-probs, loss, every gradient, and the losses along five AdamW steps).

    python3 tests/ref/make_fixture.py MODEL_DIR OUT_DIR [--seed 1234]

The same inputs always give the same bytes (fixed seeds, deterministic float64 CPU math).
"""

import argparse
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model as tm  # noqa: E402

# Three sequences of different lengths; per sequence, how many leading tokens are "prompt"
# (weight 0; the first token always is) and how many trailing tokens weigh 0.5.
SEQS = [  # (length, prompt tokens, half-weight tail)
    (7, 3, 0),
    (13, 5, 3),
    (4, 1, 1),
]
ADAM = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
ADAM_STEPS = 5
MATRIX_SCALE = 5.0  # init is normal(0, 0.02); x5 gives logits far from uniform


def parse_seqs(text):
    """"150:20:10,70:5:0" -> [(150, 20, 10), (70, 5, 0)]"""
    return [tuple(int(x) for x in part.split(":")) for part in text.split(",")]


def make_batch(vocab, seed, seqs):
    g = torch.Generator().manual_seed(seed + 1)
    seq_start, tokens, weight = [0], [], []
    for length, prompt, half in seqs:
        tokens += torch.randint(0, vocab, (length,), generator=g).tolist()
        w = [0.0] * prompt + [1.0] * (length - prompt - half) + [0.5] * half
        weight += w
        seq_start.append(seq_start[-1] + length)
    return (torch.tensor(tokens, dtype=torch.long), seq_start,
            torch.tensor(weight, dtype=torch.float64))


def loss_of(model, tokens, layout, weight):
    logits = model(tokens, layout)
    lp = tm.token_logprobs(logits, tokens, layout)
    return logits, lp, tm.weighted_ce(lp, weight)


def adam_losses(model, tokens, layout, weight):
    """Loss before each of ADAM_STEPS AdamW steps and after the last, with global grad-norm
    clipping before each step; weight decay on 2-D tensors only."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAM["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"])
    losses, norms = [], []
    for _ in range(ADAM_STEPS):
        opt.zero_grad(set_to_none=True)
        _, _, loss = loss_of(model, tokens, layout, weight)
        losses.append(float(loss))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                          ADAM["grad_clip"])))
        opt.step()
    with torch.no_grad():
        losses.append(float(loss_of(model, tokens, layout, weight)[2]))
    return losses, norms


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seqs", type=parse_seqs, default=SEQS,
                    help="length:prompt:half,... (default: the three short SEQS)")
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)

    model = tm.load_model_dir(a.model_dir, torch.float64)
    cfg = model.cfg
    tm.perturb(model, a.seed, MATRIX_SCALE, torch.float32)
    os.makedirs(a.out_dir, exist_ok=True)
    shutil.copyfile(os.path.join(a.model_dir, "config.json"),
                    os.path.join(a.out_dir, "config.json"))
    tm.write_safetensors(os.path.join(a.out_dir, "model.safetensors"),
                         tm.model_state(model, torch.float32), {"format": "pt"})

    tokens, seq_start, weight = make_batch(cfg.vocab_size, a.seed, a.seqs)
    if max(e - b for b, e in zip(seq_start, seq_start[1:])) > cfg.max_positions:
        raise SystemExit(f"{a.model_dir}: a sequence is longer than max_position_embeddings")
    layout = tm.Layout(seq_start)

    model.zero_grad(set_to_none=True)
    logits, lp, loss = loss_of(model, tokens, layout, weight)
    loss.backward()
    params = dict(model.named_parameters())
    ref = {
        "tokens": tokens.to(torch.int32),
        "seq_start": torch.tensor(seq_start, dtype=torch.int32),
        "loss_weight": weight.float(),
        "logits": logits.detach().float(),
        "logprob": lp.detach().float(),
        "loss": loss.detach().float().reshape(1),
    }
    for name in tm.tensor_shapes(cfg):
        ref["grad." + name] = params[name].grad.float()

    losses, norms = adam_losses(model, tokens, layout, weight)
    assert abs(losses[0] - float(loss)) <= 1e-12 * abs(float(loss))
    ref["adam.hparams"] = torch.tensor([ADAM[k] for k in
                                        ("lr", "beta1", "beta2", "eps", "weight_decay",
                                         "grad_clip")], dtype=torch.float32)
    ref["adam.losses"] = torch.tensor(losses, dtype=torch.float32)
    ref["adam.grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    meta = {
        "generator": "tests/ref/make_fixture.py",
        "torch": torch.__version__,
        "seed": a.seed,
        "arch": cfg.arch,
        "note": "float64 torch rounded to f32; logits row i is the prediction at position i; "
                "adam.losses[k] is the loss after k AdamW steps (k = 0..5); adam.grad_norms[k] "
                "the global gradient norm before clipping at step k",
    }
    tm.write_safetensors(os.path.join(a.out_dir, "reference.safetensors"), ref, meta)

    p = torch.softmax(logits.detach()[:-1], -1)
    ent = float(-(p * p.log()).sum(-1).mean())
    print(f"{a.out_dir}: {cfg.arch} tied={cfg.tie_embeddings} H={cfg.n_heads} "
          f"KV={cfg.n_kv_heads} N={len(tokens)} loss {float(loss):.6f} "
          f"(uniform {torch.log(torch.tensor(float(cfg.vocab_size))):.4f}, mean entropy "
          f"{ent:.4f}), logit std {float(logits.std()):.3f}, adam losses "
          + " ".join(f"{x:.5f}" for x in losses) + ", grad norms "
          + " ".join(f"{x:.4f}" for x in norms))
    if not losses[-1] < losses[0]:
        raise SystemExit("AdamW did not lower the loss: the fixture would not test progress")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
