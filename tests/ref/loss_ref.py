"""PyTorch reference of longhaul's policy losses (docs/ALGORITHMS.md, "Policy losses and
advantages") and the fixture that pins src/rl/loss.c to it.

policy_loss() restates the documented formulas in float64 torch, token by token as vectors
(no loop shared with the C code), and the gradient in logp comes from torch.autograd, not
from the documented derivative. The M2PO mask is the greedy rule itself (sort, drop the
largest value and its ties until the mean is <= tau), not the C bisection.
tests/ref/rl_update_ref.py uses the same function for the end-to-end update fixture.

    python3 tests/ref/loss_ref.py OUT_FILE      # tests/fixtures/rl/loss.safetensors

OUT_FILE holds every case concatenated (see tests/ref/README.md, "Policy loss fixture"); the
same inputs always give the same bytes.
"""

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model as tm  # noqa: E402

KINDS = {"ppo": 0, "tis": 1, "mis": 2, "decoupled": 3, "m2po": 4, "seqtis": 5, "vespo": 6,
         "dppo": 7, "oapl": 8, "snis": 9}  # lh_loss_kind
AGGS = {"token": 0, "seq": 1, "const": 2}  # lh_loss_agg
FLOAT_FIELDS = ("eps_low", "eps_high", "C", "lo", "hi", "m2po_tau", "constant", "kl_beta",
                "m2_tau", "seq_cap", "tv_delta", "tv_kl", "oapl_beta1", "oapl_beta2")
STATS = ("loss", "pg_loss", "kl_loss", "clip_frac", "ratio_min", "ratio_mean", "ratio_max",
         "masked_frac", "kl_mu_pi", "m2po_threshold", "ess")
COUNTS = ("n_valid", "n_masked", "n_clipped")


def f32(x):
    """The float a C float field holds, as a Python float."""
    return float(np.float32(x))


def as_f64(x):
    """Values rounded to float32 (what the C side reads), as a float64 tensor."""
    return torch.tensor(np.asarray(x, np.float32), dtype=torch.float64)


def loss_config(kind="ppo", agg="token", prox_mask=0, **kw):
    """lh_loss_defaults() with overrides; float fields rounded to float32 as the C struct
    holds them."""
    cfg = dict(kind=kind, agg=agg, prox_mask=prox_mask, eps_low=0.2, eps_high=0.28, C=2.0,
               lo=0.5, hi=2.0, m2po_tau=0.0, constant=0.0, kl_beta=0.0, m2_tau=0.04,
               seq_cap=8.0, tv_delta=0.2, tv_kl=1e-3, oapl_beta1=1.0, oapl_beta2=1e-3)
    for k, v in kw.items():
        if k not in cfg:
            raise KeyError(k)
        cfg[k] = v
    for k in FLOAT_FIELDS:
        cfg[k] = f32(cfg[k])
    return cfg


def m2po_keep(d, valid, tau):
    """Greedy M2PO on the valid tokens' squared log-ratios d (float32 values): drop the
    largest d, with its ties, until the mean of what is left is <= tau (an empty set
    passes). Returns (keep mask over all tokens, largest kept d or 0)."""
    dv = sorted(float(x) for x in d[valid])
    kept = len(dv)
    while kept > 0 and math.fsum(dv[:kept]) / kept > tau:
        top = dv[kept - 1]
        while kept > 0 and dv[kept - 1] == top:
            kept -= 1
    if kept == 0:
        return np.zeros(len(d), dtype=bool), 0.0
    t = dv[kept - 1]
    return np.asarray(d <= t), t


def m2po_bound(v, tau):
    """t^2 of M2PO's bounds, as Infini-AI-Lab/M2PO solves it: the harmful tokens' squared
    log-ratios v (float32 values) sorted ascending; None (no bound) when their mean is <= tau;
    else the value before the first one whose cap makes the capped sum reach tau per token,
    0 when that is the first."""
    v = sorted(float(x) for x in v)
    n = len(v)
    if n == 0 or math.fsum(v) / n <= tau:
        return None
    target, left = tau * n, 0.0
    for k in range(n):
        left += v[k]
        if v[k] * (n - k - 1) + left >= target:
            return v[k - 1] if k > 0 else 0.0
    return v[-1]


def seq_reduce(x, seq, S):
    return torch.zeros(S, dtype=torch.float64).index_add(0, seq, x)


def policy_loss(cfg, seq_start, w, A, lp, mu, old=None, ref=None, group=None, reward=None):
    """The loss of lh_loss_compute. w, A, mu, old, ref: float64 tensors (N) holding float32
    values; lp: float64 (N), the variable to differentiate (requires_grad is up to the
    caller). Returns (loss, pg_loss, kl_loss) as 0-d tensors and the statistics dict."""
    N = len(w)
    S = len(seq_start) - 1
    lens = torch.tensor([b - a for a, b in zip(seq_start, seq_start[1:])], dtype=torch.long)
    seq = torch.repeat_interleave(torch.arange(S), lens)  # sequence of each token
    zero = torch.zeros(N, dtype=torch.float64)
    valid = w > 0
    wv = torch.where(valid, w, zero)

    # Normaliser n_i of each token.
    if cfg["agg"] == "token":
        n = wv.sum().expand(N)
    elif cfg["agg"] == "seq":
        ws = torch.zeros(S, dtype=torch.float64).index_add(0, seq, wv)
        n = ws[seq] * float((ws > 0).sum())
    else:
        per_seq = torch.zeros(S, dtype=torch.float64).index_add(0, seq, valid.double())
        k = cfg["constant"] if cfg["constant"] > 0 else S * float(per_seq.max() if S else 0)
        n = torch.full((N,), float(k), dtype=torch.float64)
    n = torch.where(valid, n, torch.ones_like(n))  # never used off the valid tokens

    lpd = lp.detach()
    # Per sequence: S = sum of (logp - mu) over valid tokens, the mean advantage, validity.
    S_seq = seq_reduce(torch.where(valid, lpd - mu, zero), seq, S)
    n_tok = seq_reduce(valid.double(), seq, S)
    has = n_tok > 0
    A_seq = seq_reduce(torch.where(valid, A, zero), seq, S) / torch.clamp(n_tok, min=1.0)
    if bool(has.any()):
        ew = torch.exp(S_seq[has] - S_seq[has].max())
        ess = float(ew.sum() ** 2 / (float(has.sum()) * (ew ** 2).sum()))
    else:
        ess = 1.0
    groups = []  # contiguous runs of one id
    for i in range(S):
        if group is not None and groups and group[i] == group[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])

    kind = cfg["kind"]
    if kind in ("m2po", "seqtis", "vespo", "dppo", "oapl", "snis"):
        return candidate_loss(cfg, kind, locals())

    # Kind: base of the ratio, constant weight c, IS mask.
    c = torch.ones(N, dtype=torch.float64)
    keep = torch.ones(N, dtype=torch.bool)
    if kind == "ppo":
        base = mu
    elif kind == "tis":
        base = old
        c = torch.clamp(torch.exp(old - mu), max=cfg["C"])
    elif kind == "mis":
        base = old if old is not None else mu
        q = torch.exp(old - mu) if old is not None else torch.exp(lpd - mu)
        keep = (q >= cfg["lo"]) & (q <= cfg["hi"])
    else:  # decoupled: old holds the proximal log-probs
        base = old
        q = torch.exp(old - mu)
        if cfg["prox_mask"]:
            keep = (q >= cfg["lo"]) & (q <= cfg["hi"])
        else:
            c = torch.clamp(q, max=cfg["C"])

    threshold = 0.0
    if cfg["m2po_tau"] > 0 and N > 0:
        a = old if old is not None else lpd
        d = ((a - mu) ** 2).numpy().astype(np.float32)  # rounded to float, as documented
        k2, threshold = m2po_keep(d, valid.numpy(), cfg["m2po_tau"])
        keep = keep & torch.from_numpy(k2)

    # Clipped objective; the tie r A == clip(r) A takes the unclipped side.
    r = torch.exp(lp - base)
    rc = torch.clamp(r, 1.0 - cfg["eps_low"], 1.0 + cfg["eps_high"])
    clipped = (r * A).detach() > (rc * A).detach()
    obj = torch.where(clipped, rc * A, r * A)
    active = valid & keep
    pg = torch.where(active, -c * w * obj / n, zero).sum()

    kl = kl_term(cfg, valid, w, lp, ref, n, zero)
    stats = common_stats(valid, keep, active & clipped, wv, lpd, mu, threshold, ess)
    return pg + kl, pg, kl, stats


def kl_term(cfg, valid, w, lp, ref, n, zero):
    if cfg["kl_beta"] <= 0:
        return torch.zeros((), dtype=torch.float64)
    x = ref - lp  # k3 on every valid token, masks or not
    return torch.where(valid, cfg["kl_beta"] * w * (torch.exp(x) - x - 1.0) / n, zero).sum()


def common_stats(valid, keep, clipped, wv, lpd, mu, threshold, ess):
    n_valid = int(valid.sum())
    n_masked = int((valid & ~keep).sum())
    n_clipped = int(clipped.sum())
    rho = torch.exp(lpd - mu)[valid]
    W = float(wv.sum())
    kl_mu = float((wv[valid] * (rho - 1.0 - (lpd - mu)[valid])).sum())
    stats = dict(
        n_valid=n_valid, n_masked=n_masked, n_clipped=n_clipped,
        clip_frac=n_clipped / (n_valid - n_masked) if n_valid > n_masked else 0.0,
        masked_frac=n_masked / n_valid if n_valid else 0.0,
        ratio_min=float(rho.min()) if n_valid else 0.0,
        ratio_mean=float(rho.mean()) if n_valid else 0.0,
        ratio_max=float(rho.max()) if n_valid else 0.0,
        kl_mu_pi=kl_mu / W if W > 0 else 0.0,
        m2po_threshold=threshold,
        ess=ess,
    )
    return stats


def candidate_loss(cfg, kind, v):
    """The off-policy candidates (lh_loss_kind M2PO .. SNIS), from the names of policy_loss."""
    N, valid, w, A, lp, lpd, mu, n, zero = (v[k] for k in
                                            ("N", "valid", "w", "A", "lp", "lpd", "mu", "n", "zero"))
    seq, S_seq, A_seq, has, groups = v["seq"], v["S_seq"], v["A_seq"], v["has"], v["groups"]
    old, ref, reward = v["old"], v["ref"], v["reward"]
    beh = old if old is not None else mu
    keep = torch.ones(N, dtype=torch.bool)
    clipped = torch.zeros(N, dtype=torch.bool)
    threshold = 0.0
    if kind == "m2po":
        x = lpd - beh
        harm = valid & (((A > 0) & (x > 0)) | ((A < 0) & (x < 0)))
        t2 = m2po_bound((x ** 2).numpy().astype(np.float32)[harm.numpy()], cfg["m2_tau"])
        r = torch.exp(lp - beh)
        if t2 is None:
            obj, threshold = r * A, math.inf
        else:  # harmful tokens past the bound: r clipped to e^(+-t), no gradient
            t = math.sqrt(t2)
            v32 = torch.from_numpy((x ** 2).numpy().astype(np.float32)).double()
            clipped = harm & (v32 > t2)
            bound = torch.where(A > 0, math.exp(t), math.exp(-t)).double()
            obj, threshold = torch.where(clipped, bound * A, r * A), t2
        pg = torch.where(valid, -w * obj / n, zero).sum()
    elif kind in ("seqtis", "vespo", "snis"):
        if kind == "seqtis":
            c, Aeff = torch.clamp(torch.exp(torch.clamp(S_seq, max=20.0)), max=cfg["seq_cap"])[seq], A
        elif kind == "vespo":
            W = torch.exp(torch.clamp(S_seq, -20.0, 20.0))[seq]
            k = torch.where(A >= 0, 2.0, 3.0).double()
            lam = torch.where(A >= 0, 3.0, 2.0).double()
            c, Aeff = W ** k * torch.exp(lam * (1.0 - W)), A
        else:
            c_seq = torch.ones(len(S_seq), dtype=torch.float64)
            shift = torch.zeros(len(S_seq), dtype=torch.float64)
            for g in groups:
                idx = torch.tensor([i for i in g if has[i]], dtype=torch.long)
                if len(idx) == 0:
                    continue
                p = torch.softmax(S_seq[idx], 0)
                c_seq[idx] = len(idx) * p
                shift[idx] = (p * A_seq[idx]).sum()
            c, Aeff = c_seq[seq], A - shift[seq]
        pg = torch.where(valid, -c * w * Aeff * lp / n, zero).sum()
    elif kind == "dppo":
        x = lp - mu
        dp = torch.exp(lpd) - torch.exp(mu)
        moved = torch.where(A > 0, dp > cfg["tv_delta"], dp < -cfg["tv_delta"])
        keep = ~moved
        pen = cfg["tv_kl"] * w * x ** 2 / n
        pg = (torch.where(valid & keep, -w * A * torch.exp(x) / n, zero).sum() +
              torch.where(valid, pen, zero).sum())
    else:  # oapl
        b1, b2 = cfg["oapl_beta1"], cfg["oapl_beta2"]
        gap = seq_reduce(torch.where(valid, w * (lp - beh), zero), seq, len(S_seq))
        pg = torch.zeros((), dtype=torch.float64)
        n_w = float(has.sum())
        for g in groups:
            ids = [i for i in g if has[i]]
            if not ids:
                continue
            R = torch.tensor([float(reward[i]) for i in ids], dtype=torch.float64)
            V = b1 * torch.log(torch.exp(R / b1).mean())
            res = b2 * gap[ids] - (R - V)
            pg = pg + (res ** 2).sum() / n_w
    kl = kl_term(cfg, valid, w, lp, ref, n, zero)
    stats = common_stats(valid, keep, clipped, v["wv"], lpd, mu, threshold, v["ess"])
    return pg + kl, pg, kl, stats


# ------------------------------------------------------------------------------------------
# the fixture

def random_case(rng, name, cfg, with_old, spread=0.35):
    """3-5 sequences of 0-10 tokens: one empty and one with no loss weight (prompt only) at
    random places, the others a prompt of 1-2 weight-0 tokens then weights 0.5, 1 or 2 with
    an occasional negative (invalid) one. Log-probs: mu < 0, old = mu + N(0, spread),
    logp = old + N(0, 0.25), ref = logp + N(0, 0.3); per-token advantages N(0, 1)."""
    S = int(rng.integers(3, 6))
    empty, prompt_only = rng.choice(S, 2, replace=False)
    seq_start, w = [0], []
    for s in range(S):
        L = 0 if s == empty else int(rng.integers(4, 11))
        prompt = L if s == prompt_only else int(rng.integers(1, 3))
        for i in range(L):
            if i < prompt:
                w.append(0.0)
            else:
                w.append(float(rng.choice([0.5, 1.0, 1.0, 2.0, -1.0],
                                          p=[0.2, 0.3, 0.3, 0.15, 0.05])))
        seq_start.append(seq_start[-1] + L)
    N = seq_start[-1]
    mu = -rng.exponential(1.5, N)
    old = mu + rng.normal(0, spread, N)
    lp = old + rng.normal(0, 0.25, N)
    ref = lp + rng.normal(0, 0.3, N)
    A = rng.normal(0, 1, N)
    # groups: contiguous runs of 1-3 sequences; rewards 0, 0.5 or 1 per sequence
    group, g = [], 0
    while len(group) < S:
        group += [g] * int(rng.integers(1, 4))
        g += 1
    reward = [float(x) for x in rng.choice([0.0, 0.5, 1.0], S)]
    return dict(name=name, cfg=cfg, seq_start=seq_start, w=w, A=A, lp=lp, mu=mu,
                old=old if with_old else None, ref=ref if cfg["kl_beta"] > 0 else None,
                group=group[:S], reward=reward)


def near_edge(case, rel=1e-9):
    """True when a ratio lies within `rel` of a clip or mask bound: float64 exp in torch and
    in libm may differ in the last bit there, so such a random draw is replaced."""
    c = case["cfg"]
    mu = np.asarray(case["mu"], np.float32).astype(np.float64)
    lp = np.asarray(case["lp"], np.float32).astype(np.float64)
    old = None if case["old"] is None else np.asarray(case["old"], np.float32).astype(np.float64)
    base = old if (old is not None and c["kind"] != "ppo") else mu
    ratios = [np.exp(lp - base), np.exp(lp - mu)]
    if old is not None:
        ratios.append(np.exp(old - mu))
    bounds = [1 - c["eps_low"], 1 + c["eps_high"], c["lo"], c["hi"], c["C"]]
    return any(np.any(np.abs(r / b - 1) < rel) for r in ratios for b in bounds)


def random_cases(rng):
    """Every kind (decoupled with and without prox_mask, PPO and MIS with and without old)
    under every aggregation (constant: n_seqs * max_len and an explicit 7.5); across them each
    kind sees every (KL, M2PO) combination and so does each aggregation."""
    variants = [("ppo", 0, False), ("ppo", 0, True), ("tis", 0, True), ("mis", 0, False),
                ("mis", 0, True), ("decoupled", 0, True), ("decoupled", 1, True)]
    aggs = [("token", 0.0), ("seq", 0.0), ("const", 0.0), ("const", 7.5)]
    combos = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (KL, M2PO)
    cases = []
    for v, (kind, pm, with_old) in enumerate(variants):
        for a, (agg, constant) in enumerate(aggs):
            kl, m2 = combos[(v + a) % 4]
            narrow = (v + a) % 2  # alternate the mask range and truncation
            cfg = loss_config(kind, agg, pm, constant=constant,
                              kl_beta=0.05 if kl else 0.0, m2po_tau=0.06 if m2 else 0.0,
                              C=1.5 if narrow else 2.0, lo=0.7 if narrow else 0.5,
                              hi=1.4 if narrow else 2.0)
            name = (f"{kind}{'_mask' if pm else ''}_{'old' if with_old else 'noold'}_{agg}"
                    f"{'7.5' if constant else ''}{'_kl' if kl else ''}{'_m2po' if m2 else ''}")
            while True:
                case = random_case(rng, name, cfg, with_old)
                if not near_edge(case):
                    break
            cases.append(case)
    # the off-policy candidates, each under every aggregation (OAPL has its own), with and
    # without KL; M2PO with and without old, bounded (a small budget) and unbounded
    cand = [("m2po", True, dict(m2_tau=0.01)), ("m2po", False, dict(m2_tau=0.02)),
            ("m2po", True, dict(m2_tau=10.0)), ("seqtis", False, dict(seq_cap=1.5)),
            ("seqtis", True, {}), ("vespo", False, {}), ("dppo", False, dict(tv_delta=0.05)),
            ("dppo", False, dict(tv_delta=0.2, tv_kl=0.05)), ("oapl", True, {}),
            ("oapl", False, dict(oapl_beta1=0.5, oapl_beta2=0.1)), ("snis", False, {})]
    for v, (kind, with_old, kw) in enumerate(cand):
        for a, (agg, constant) in enumerate(aggs):
            kl = (v + a) % 2
            cfg = loss_config(kind, agg, constant=constant, kl_beta=0.05 if kl else 0.0, **kw)
            name = (f"{kind}_{'old' if with_old else 'noold'}_{agg}{'7.5' if constant else ''}"
                    f"{'_kl' if kl else ''}_{v}")
            while True:
                case = random_case(rng, name, cfg, with_old, spread=0.6)
                if not near_edge(case):
                    break
            cases.append(case)
    return cases


def edge_cases():
    """Hand-made cases on the exact boundaries, with dyadic values so every quantity is exact
    in float and double: q = exp(0) = 1 lands exactly on lo or hi (kept: the bounds are
    inclusive), M2PO's kept mean equals tau exactly (kept: <= tau), r = 1 with a zero clip
    width (the tie takes the unclipped side), an empty batch and a batch with no weight."""
    cases = []
    # mu multiples of 1/4; old = mu + off, off in {0 (q = 1), +-0.5, +-1, -0.25}.
    mu = [0.0, -0.5, -1.25, -2.0, -0.75, -1.5, -3.0, -0.25]
    off = [0.0, 0.0, 0.5, -0.5, 0.0, 1.0, -1.0, -0.25]
    ss = [0, 3, 8]
    w = [0.0, 1.0, 2.0, 0.0, 0.5, 1.0, 1.0, 1.0]
    A = [0.0, 1.0, -0.5, 0.0, 1.5, -1.0, 0.75, -2.0]
    old = [m + o for m, o in zip(mu, off)]
    lp_near_old = [o + d for o, d in zip(old, [0, 0.125, -0.125, 0, 0.0625, -0.25, 0.125, 0])]
    ref = [x + 0.25 for x in lp_near_old]
    for name, kind, pm, lo, hi in [("mis_q_at_lo", "mis", 0, 1.0, 2.0),
                                   ("mis_q_at_hi", "mis", 0, 0.5, 1.0),
                                   ("decoupled_mask_q_at_lo", "decoupled", 1, 1.0, 2.0),
                                   ("decoupled_mask_q_at_hi", "decoupled", 1, 0.5, 1.0)]:
        cfg = loss_config(kind, "seq", pm, lo=lo, hi=hi, kl_beta=0.1)
        cases.append(dict(name=name, cfg=cfg, seq_start=ss, w=w, A=A, lp=lp_near_old, mu=mu,
                          old=old, ref=ref))
    # MIS without old: the mask is on rho = pi/mu itself, exactly 1 where logp = mu.
    for name, lo, hi in [("mis_noold_rho_at_lo", 1.0, 2.0), ("mis_noold_rho_at_hi", 0.5, 1.0)]:
        cfg = loss_config("mis", "token", lo=lo, hi=hi)
        cases.append(dict(name=name, cfg=cfg, seq_start=ss, w=w, A=A, lp=old, mu=mu, old=None,
                          ref=None))
    # M2PO: the valid tokens' d = off^2 are 0, 0.25, 0, 1, 1, 0.0625 (mean 0.385); dropping
    # the two 1s together leaves (0 + 0.25 + 0 + 0.0625) / 4 = 0.078125 = tau exactly: kept.
    for name, with_old in [("m2po_mean_eq_tau_old", True), ("m2po_mean_eq_tau_noold", False)]:
        cfg = loss_config("ppo", "const", m2po_tau=0.078125)
        lp = lp_near_old if with_old else old  # without old, d is (logp - mu)^2 = off^2
        cases.append(dict(name=name, cfg=cfg, seq_start=ss, w=w, A=A, lp=lp, mu=mu,
                          old=old if with_old else None, ref=None))
    cfg = loss_config("decoupled", "token", eps_low=0.0, eps_high=0.0, kl_beta=0.05)
    cases.append(dict(name="decoupled_r_one_zero_clip", cfg=cfg, seq_start=ss, w=w, A=A,
                      lp=[o if i % 2 else o + 0.125 for i, o in enumerate(old)], mu=mu, old=old,
                      ref=ref))
    cfg = loss_config("mis", "seq", kl_beta=0.1, m2po_tau=0.05)
    cases.append(dict(name="empty_batch", cfg=cfg, seq_start=[0], w=[], A=[], lp=[], mu=[],
                      old=[], ref=[]))
    cases.append(dict(name="no_weight", cfg=cfg, seq_start=[0, 3, 3, 5], w=[0, 0, -1, 0, 0],
                      A=[1, -1, 1, 1, 1], lp=[-1, -2, -1, -0.5, -3], mu=[-1, -1, -1, -1, -1],
                      old=[-1, -1.5, -1, -1, -1], ref=[-1, -1, -1, -1, -1]))
    return cases


def evaluate(case):
    """Runs the reference on a case (inputs rounded to float32) and fills in the outputs."""
    lp = as_f64(case["lp"]).requires_grad_(True)
    loss, pg, kl, stats = policy_loss(
        case["cfg"], case["seq_start"], as_f64(case["w"]), as_f64(case["A"]), lp,
        as_f64(case["mu"]), None if case["old"] is None else as_f64(case["old"]),
        None if case["ref"] is None else as_f64(case["ref"]), case.get("group"),
        None if case.get("reward") is None else np.asarray(case["reward"], np.float32))
    if len(case["w"]) > 0:
        loss.backward()
    case["dlogp"] = lp.grad if lp.grad is not None else torch.zeros(len(case["w"]))
    case["stats"] = dict(stats, loss=float(loss), pg_loss=float(pg), kl_loss=float(kl))
    return case


def write_fixture(path, cases):
    """Concatenated cases: per case a row of ints and floats and its token range."""
    ints, floats, seq_start, names, group, reward = [], [], [], b"", [], []
    cols = {k: [] for k in ("weight", "adv", "logp", "mu", "old", "ref", "dlogp")}
    for c in cases:
        cfg, N = c["cfg"], len(c["w"])
        ints.append([KINDS[cfg["kind"]], AGGS[cfg["agg"]], cfg["prox_mask"],
                     int(c["old"] is not None), int(c["ref"] is not None),
                     len(c["seq_start"]) - 1, len(seq_start), len(cols["weight"])])
        floats.append([cfg[k] for k in FLOAT_FIELDS])
        seq_start += c["seq_start"]
        S = len(c["seq_start"]) - 1  # per sequence, in the rows of seq_start (last one unused)
        group += list(c.get("group") or range(S)) + [-1]
        reward += list(c.get("reward") or [0.0] * S) + [0.0]
        names += c["name"].encode() + b"\0"
        for k, src in (("weight", "w"), ("adv", "A"), ("logp", "lp"), ("mu", "mu")):
            cols[k] += list(np.asarray(c[src], np.float32))
        cols["old"] += list(np.asarray(c["old"], np.float32)) if c["old"] is not None else [0] * N
        cols["ref"] += list(np.asarray(c["ref"], np.float32)) if c["ref"] is not None else [0] * N
        cols["dlogp"] += c["dlogp"].tolist()
    out = {
        "case.int": torch.tensor(ints, dtype=torch.int32),
        "case.float": torch.tensor(floats, dtype=torch.float32),
        "case.name": torch.tensor(list(names), dtype=torch.uint8),
        "case.stats": torch.tensor([[c["stats"][k] for k in STATS] for c in cases],
                                   dtype=torch.float32),
        "case.counts": torch.tensor([[c["stats"][k] for k in COUNTS] for c in cases],
                                    dtype=torch.int32),
        "seq_start": torch.tensor(seq_start, dtype=torch.int32),
        "group": torch.tensor(group, dtype=torch.int32),
        "reward": torch.tensor(np.asarray(reward, np.float32), dtype=torch.float32),
    }
    for k, v in cols.items():
        out[k] = torch.tensor(np.asarray(v, np.float64), dtype=torch.float32)
    meta = {
        "generator": "tests/ref/loss_ref.py",
        "torch": torch.__version__,
        "case.int": "kind agg prox_mask has_old has_ref n_seqs seq_start_offset token_offset",
        "case.float": " ".join(FLOAT_FIELDS),
        "case.stats": " ".join(STATS),
        "case.counts": " ".join(COUNTS),
        "group": "per sequence, in the rows of seq_start: its group (-1 in a case's last row)",
        "reward": "per sequence, in the rows of seq_start: its reward",
    }
    tm.write_safetensors(path, out, meta)


def main(argv):
    if len(argv) != 1:
        raise SystemExit(f"usage: {sys.argv[0]} OUT_FILE")
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(20240611)
    cases = [evaluate(c) for c in random_cases(rng) + edge_cases()]
    os.makedirs(os.path.dirname(os.path.abspath(argv[0])), exist_ok=True)
    write_fixture(argv[0], cases)
    tot = {k: sum(c["stats"][k] for c in cases) for k in COUNTS}
    print(f"{argv[0]}: {len(cases)} cases, {sum(len(c['w']) for c in cases)} tokens, "
          f"{tot['n_valid']} valid, {tot['n_masked']} masked, {tot['n_clipped']} clipped, "
          f"{os.path.getsize(argv[0])} bytes")
    for c in cases:
        s = c["stats"]
        print(f"  {c['name']:<34} N {len(c['w']):2d} loss {s['loss']:+.6f} valid "
              f"{s['n_valid']:2d} masked {s['n_masked']:2d} clipped {s['n_clipped']:2d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
