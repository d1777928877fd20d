"""Builds the end-to-end fixture of lh_rl_update (src/rl/update.c) for
tests/unit/test_rl_parity.c from a tiny model directory written by `longhaul init-model`: a
perturbed copy of the model (config.json + F32 model.safetensors) and reference.safetensors
with a packed RL batch and, for each scenario, what one update does in float64 torch: the
weights, AdamW's first moments and the step's statistics.

    python3 tests/ref/rl_update_ref.py MODEL_DIR OUT_DIR [--seed 4321]

The update is written from docs/ALGORITHMS.md ("One step", item 4): the sequences are split at
group boundaries into M minibatches; each is a forward, the policy loss (loss_ref.policy_loss,
itself pinned to the C loss by tests/fixtures/rl/loss.safetensors), a backward,
torch.nn.utils.clip_grad_norm_ and a torch.optim.AdamW step (weight decay on 2-D tensors only).
The old/proximal log-probs are the batch's `old` for TIS and masked IS when it has one, else
those of the weights before the first minibatch (the same forward when M = 1); decoupled PPO
always takes the proximal ones.

Every token's ratio keeps a margin from the clip and mask bounds, and every gradient norm one
from the clip threshold, so float32-vs-float64 noise cannot flip a branch. AdamW divides each
gradient element by its own magnitude, so an element whose gradient is nearly 0 would turn
float32 noise into a visible weight change: every element is at least GRAD_FLOOR of the
step's largest. A batch that misses a margin is replaced by the next one from the same
deterministic stream. The same inputs always give the same bytes.
"""

import argparse
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loss_ref as lr  # noqa: E402
import torch_model as tm  # noqa: E402
from make_fixture import MATRIX_SCALE  # noqa: E402

GROUPS, GROUP_SIZE = 4, 2
PROMPT_LENS = (2, 4)  # inclusive range; the prompt has loss weight 0
COMPLETION_LENS = (3, 8)
ADAM = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
RATIO_MARGIN = 1e-3  # |log r - log bound| for every kept token, every minibatch
NORM_MARGIN = 1e-2  # |norm / grad_clip - 1|
GRAD_FLOOR = 1e-6  # every gradient element >= GRAD_FLOOR * the step's largest, in magnitude
MAX_TRIES = 100

# name, loss settings, minibatches, whether the batch carries `old`, grad_clip. Across them:
# KL on and off, PPO-clipped and IS-masked tokens, steps whose gradient norm is clipped and
# steps whose norm is not (the moments of an unclipped step show the gradient's scale).
SCENARIOS = [
    ("ppo_m1", dict(kind="ppo", agg="token", kl_beta=0.1), 1, False, 10.0),
    # The batch's old must be ignored: decoupled PPO compares against the weights before the
    # update, from an extra forward since the second minibatch runs on updated weights.
    ("decoupled_m2", dict(kind="decoupled", agg="seq", kl_beta=0.05), 2, True, 1.0),
    ("tis_batch_old_m2", dict(kind="tis", agg="const", kl_beta=0.1, C=1.5), 2, True, 2.0),
    ("mis_m1", dict(kind="mis", agg="token", lo=0.7, hi=1.4), 1, False, 3.0),
]
SETUP = ("kind", "agg", "prox_mask", "minibatches", "batch_old")
HPARAMS = ("eps_low", "eps_high", "C", "lo", "hi", "kl_beta", "lr", "beta1", "beta2", "eps",
           "weight_decay", "grad_clip")
STATS = ("loss", "pg_loss", "kl_loss", "clip_frac", "ratio_mean", "grad_norm")
COUNTS = ("n_updates", "n_valid", "n_masked", "n_clipped")


def make_batch(model, rng):
    """GROUPS groups of GROUP_SIZE sequences: random tokens, weight 1 on the completion, one
    advantage per sequence, +a and -a within a group (a = 0.5 + |N(0, 1)|, as GRPO gives both
    signs). With lp0 the log-probs under the starting weights: old = lp0 + N(0, 0.3) (a staler
    policy in the trainer's numerics), mu = old + N(0, 0.15) (the sampler), ref = lp0 +
    N(0, 0.2)."""
    V = model.cfg.vocab_size
    seq_start, tokens, weight, adv = [0], [], [], []
    for s in range(GROUPS * GROUP_SIZE):
        if s % GROUP_SIZE == 0:
            a = 0.5 + abs(float(rng.normal(0, 1)))
        p = int(rng.integers(PROMPT_LENS[0], PROMPT_LENS[1] + 1))
        c = int(rng.integers(COMPLETION_LENS[0], COMPLETION_LENS[1] + 1))
        tokens += rng.integers(0, V, p + c).tolist()
        weight += [0.0] * p + [1.0] * c
        adv += [a if s % 2 == 0 else -a] * (p + c)
        seq_start.append(seq_start[-1] + p + c)
    tokens = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        lp0 = tm.token_logprobs(model(tokens, seq_start), tokens, seq_start).numpy()
    N = len(tokens)
    old = lp0 + rng.normal(0, 0.3, N)
    return dict(tokens=tokens, seq_start=seq_start,
                group=[s // GROUP_SIZE for s in range(GROUPS * GROUP_SIZE)],
                weight=lr.as_f64(weight), adv=lr.as_f64(adv), old=lr.as_f64(old),
                mu=lr.as_f64(old + rng.normal(0, 0.15, N)),
                ref=lr.as_f64(lp0 + rng.normal(0, 0.2, N)))


def minibatches(group, M):
    """Sequence ranges [s0, s1): the k-th ends at the first group boundary at or after
    n_seqs * (k + 1) / M."""
    n = len(group)
    out, s0 = [], 0
    for k in range(M):
        s1 = n if k + 1 == M else n * (k + 1) // M
        while 0 < s1 < n and s1 > s0 and group[s1] == group[s1 - 1]:
            s1 += 1
        if s1 > s0:
            out.append((s0, s1))
            s0 = s1
    return out


def logprobs(model, batch, s0, s1):
    ss = batch["seq_start"]
    a, b = ss[s0], ss[s1]
    layout = [x - a for x in ss[s0:s1 + 1]]
    t = batch["tokens"][a:b]
    return tm.token_logprobs(model(t, layout), t, layout)


def margin_ok(cfg, lp, base, mu, old, valid):
    """Every valid token's ratio r = exp(lp - base) at least RATIO_MARGIN (in log) from the
    clip bounds and, for masked IS, q = exp(old - mu) as far from lo and hi."""
    logs = [((lp - base)[valid], [1 - cfg["eps_low"], 1 + cfg["eps_high"]])]
    if cfg["kind"] == "mis" or (cfg["kind"] == "decoupled" and cfg["prox_mask"]):
        logs.append(((old - mu)[valid], [cfg["lo"], cfg["hi"]]))
    return all(float((x - np.log(b)).abs().min()) > RATIO_MARGIN
               for x, bounds in logs for b in bounds if len(x))


def rl_update(model, batch, cfg, M, batch_old, grad_clip):
    """One lh_rl_update in float64 torch. Returns (stats, first moments by name) or None when
    a margin is violated."""
    params = dict(model.named_parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"])
    kind, ss = cfg["kind"], batch["seq_start"]
    need_old = kind != "ppo"
    given = batch["old"] if batch_old and kind in ("tis", "mis") else None
    parts = minibatches(batch["group"], M)
    prox = None
    if need_old and given is None and len(parts) > 1:
        with torch.no_grad():
            prox = logprobs(model, batch, 0, len(batch["group"]))
    tot = dict(loss=0.0, pg_loss=0.0, kl_loss=0.0, n_valid=0, n_masked=0, n_clipped=0,
               ratio_sum=0.0, norms=[])
    for s0, s1 in parts:
        a, b = ss[s0], ss[s1]
        opt.zero_grad(set_to_none=True)
        lp = logprobs(model, batch, s0, s1)
        old = None  # lh_rl_update's choice of the old / proximal log-probs
        if need_old and given is not None:
            old = given[a:b]
        elif need_old and prox is not None:
            old = prox[a:b]
        elif need_old:
            old = lp.detach()
        layout = [x - a for x in ss[s0:s1 + 1]]
        w, mu = batch["weight"][a:b], batch["mu"][a:b]
        base = mu if kind == "ppo" else old
        if not margin_ok(cfg, lp.detach(), base, mu, old, w > 0):
            return None
        loss, pg, kl, st = lr.policy_loss(cfg, layout, w, batch["adv"][a:b], lp, mu, old,
                                          batch["ref"][a:b] if cfg["kl_beta"] > 0 else None)
        loss.backward()
        g = torch.cat([p.grad.flatten() for p in model.parameters()]).abs()
        if float(g.min()) < GRAD_FLOOR * float(g.max()):
            return None
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        if abs(norm / grad_clip - 1) < NORM_MARGIN:
            return None
        opt.step()
        tot["loss"] += float(loss)
        tot["pg_loss"] += float(pg)
        tot["kl_loss"] += float(kl)
        for k in ("n_valid", "n_masked", "n_clipped"):
            tot[k] += st[k]
        tot["ratio_sum"] += st["ratio_mean"] * st["n_valid"]
        tot["norms"].append(norm)
    kept = tot["n_valid"] - tot["n_masked"]
    stats = dict(loss=tot["loss"], pg_loss=tot["pg_loss"], kl_loss=tot["kl_loss"],
                 clip_frac=tot["n_clipped"] / kept if kept else 0.0,
                 ratio_mean=tot["ratio_sum"] / tot["n_valid"],
                 grad_norm=sum(tot["norms"]) / len(tot["norms"]), n_updates=len(parts),
                 n_valid=tot["n_valid"], n_masked=tot["n_masked"], n_clipped=tot["n_clipped"],
                 norms=tot["norms"])
    moments = {n: opt.state[params[n]]["exp_avg"] for n in tm.tensor_shapes(model.cfg)}
    return stats, moments


def build(model_dir, seed):
    """(model, batch, [(scenario, stats, weights, moments)]) for the first batch whose every
    scenario keeps its margins."""
    rng = np.random.default_rng(seed)
    start = tm.load_model_dir(model_dir, torch.float64)
    tm.perturb(start, seed, MATRIX_SCALE, torch.float32)
    for attempt in range(MAX_TRIES):
        batch = make_batch(start, rng)
        results = []
        for name, loss_kw, M, batch_old, clip in SCENARIOS:
            model = tm.load_model_dir(model_dir, torch.float64)
            model.load_state_dict(start.state_dict())
            cfg = lr.loss_config(**loss_kw)
            out = rl_update(model, batch, cfg, M, batch_old, clip)
            if out is None:
                print(f"  batch {attempt}: {name} misses a margin (a branch or a gradient "
                      "element near 0), drawing another", file=sys.stderr)
                break
            results.append(((name, cfg, M, batch_old, clip), out[0],
                            tm.model_state(model, torch.float64), out[1]))
        else:
            return start, batch, results
    raise SystemExit(f"no batch keeps every margin in {MAX_TRIES} tries")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=4321)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)

    start, batch, results = build(a.model_dir, a.seed)
    os.makedirs(a.out_dir, exist_ok=True)
    shutil.copyfile(os.path.join(a.model_dir, "config.json"),
                    os.path.join(a.out_dir, "config.json"))
    tm.write_safetensors(os.path.join(a.out_dir, "model.safetensors"),
                         tm.model_state(start, torch.float32), {"format": "pt"})

    ref = {
        "tokens": batch["tokens"].to(torch.int32),
        "seq_start": torch.tensor(batch["seq_start"], dtype=torch.int32),
        "group": torch.tensor(batch["group"], dtype=torch.int32),
    }
    for k in ("weight", "adv", "mu", "old", "ref"):
        ref[k] = batch[k].float()
    names = b"".join(r[0][0].encode() + b"\0" for r in results)
    ref["scenarios"] = torch.tensor(list(names), dtype=torch.uint8)
    for (name, cfg, M, batch_old, clip), stats, weights, moments in results:
        ref[f"{name}.setup"] = torch.tensor(
            [lr.KINDS[cfg["kind"]], lr.AGGS[cfg["agg"]], cfg["prox_mask"], M, int(batch_old)],
            dtype=torch.int32)
        hp = dict(cfg, grad_clip=clip, **ADAM)
        ref[f"{name}.hparams"] = torch.tensor([hp[k] for k in HPARAMS], dtype=torch.float32)
        ref[f"{name}.stats"] = torch.tensor([stats[k] for k in STATS], dtype=torch.float32)
        ref[f"{name}.counts"] = torch.tensor([stats[k] for k in COUNTS], dtype=torch.int32)
        for t, v in weights.items():
            ref[f"{name}.param.{t}"] = v.float()
        for t, v in moments.items():
            ref[f"{name}.adam_m.{t}"] = v.float()
        moved = max(float((weights[t] - p).abs().max())
                    for t, p in tm.model_state(start, torch.float64).items())
        print(f"{name}: loss {stats['loss']:+.6f} kl {stats['kl_loss']:.6f} valid "
              f"{stats['n_valid']} masked {stats['n_masked']} clipped {stats['n_clipped']} "
              f"ratio_mean {stats['ratio_mean']:.6f} grad norms "
              + " ".join(f"{x:.4f}" for x in stats["norms"])
              + f" (clip {clip}), largest weight change {moved:.4f}")
    meta = {
        "generator": "tests/ref/rl_update_ref.py",
        "torch": torch.__version__,
        "seed": a.seed,
        "setup": " ".join(SETUP),
        "hparams": " ".join(HPARAMS),
        "stats": " ".join(STATS),
        "counts": " ".join(COUNTS),
    }
    tm.write_safetensors(os.path.join(a.out_dir, "reference.safetensors"), ref, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
