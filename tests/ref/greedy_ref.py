"""Builds one greedy-decoding fixture for tests/unit/test_generate_parity.c from a bf16 model
directory written by `longhaul init-model --dtype bf16`: a rescaled copy of the model (config.json
+ BF16 model.safetensors, the exact bits the engine runs on) and expected.json with four prompts
and the 32-token greedy continuation float64 torch computes for each.

    python3 tests/ref/greedy_ref.py MODEL_DIR OUT_DIR [--seed 7] [--new 32]

expected.json = {"prompts": [[ids], ...], "greedy": [[32 ids], ...], "min_margin": m,
                 "margins": [[...], ...], "logprob_model": [[...], ...], "new": 32}
where margins[i][t] is the gap between the best and the second-best logit at step t of prompt i
and logprob_model[i][t] = log_softmax(logits)[greedy[i][t]]. Every step's margin is above
MIN_MARGIN, so fp32-vs-fp64 noise (under 1e-4 on these logits) cannot flip a greedy choice; a
prompt that fails is replaced by the next one from the same deterministic stream. The same
inputs always give the same bytes.
"""

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model as tm  # noqa: E402

PROMPT_LENS = (3, 7, 13, 20)
MATRIX_SCALE = 20.0  # init is normal(0, 0.02); x20: the greedy token has p ~ 0.3-0.5
MIN_MARGIN = 1e-3
MAX_TRIES = 200


def greedy(model, prompt, new):
    """Greedy continuation by full recompute in float64: (tokens, margins, logprobs)."""
    seq = list(prompt)
    toks, margins, lps = [], [], []
    with torch.no_grad():
        for _ in range(new):
            logits = model(torch.tensor(seq, dtype=torch.long), [0, len(seq)])[-1]
            top2 = torch.topk(logits, 2)
            t = int(top2.indices[0])
            toks.append(t)
            margins.append(float(top2.values[0] - top2.values[1]))
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            seq.append(t)
    return toks, margins, lps


def fp32_check(model, prompts, outs):
    """The same bits in float32 torch: must pick the same tokens (else the margins are not
    worth their name). Returns the worst |logit| difference from float64 along the way."""
    m32 = tm.Model(model.cfg).float()
    m32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    worst = 0.0
    with torch.no_grad():
        for prompt, toks in zip(prompts, outs):
            seq = torch.tensor(prompt + toks, dtype=torch.long)
            l64 = model(seq, [0, len(seq)])[len(prompt) - 1:-1]
            l32 = m32(seq, [0, len(seq)])[len(prompt) - 1:-1]
            worst = max(worst, float((l64 - l32.double()).abs().max()))
            if l32.argmax(-1).tolist() != toks:
                raise SystemExit("float32 torch picks other greedy tokens than float64")
    return worst


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args(argv)

    model = tm.load_model_dir(a.model_dir, torch.float64)
    cfg = model.cfg
    if max(PROMPT_LENS) + a.new > cfg.max_positions:
        raise SystemExit(f"prompts of {max(PROMPT_LENS)} + {a.new} new tokens do not fit "
                         f"max_position_embeddings {cfg.max_positions}")
    tm.perturb(model, a.seed, MATRIX_SCALE, torch.bfloat16)

    g = torch.Generator().manual_seed(a.seed + 1)
    prompts, outs, margins, lps = [], [], [], []
    for n in PROMPT_LENS:
        for attempt in range(MAX_TRIES):
            prompt = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
            toks, mg, lp = greedy(model, prompt, a.new)
            if min(mg) > MIN_MARGIN:
                break
            print(f"  prompt of {n} tokens, try {attempt}: margin {min(mg):.2e} at step "
                  f"{mg.index(min(mg))}, drawing another", file=sys.stderr)
        else:
            raise SystemExit(f"no prompt of {n} tokens with margins > {MIN_MARGIN} in "
                             f"{MAX_TRIES} tries")
        prompts.append(prompt)
        outs.append(toks)
        margins.append(mg)
        lps.append(lp)

    os.makedirs(a.out_dir, exist_ok=True)
    shutil.copyfile(os.path.join(a.model_dir, "config.json"),
                    os.path.join(a.out_dir, "config.json"))
    gen_cfg = os.path.join(a.model_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        shutil.copyfile(gen_cfg, os.path.join(a.out_dir, "generation_config.json"))
    tm.write_safetensors(os.path.join(a.out_dir, "model.safetensors"),
                         tm.model_state(model, torch.bfloat16), {"format": "pt"})
    # The file must hold exactly the values the reference used.
    check = tm.load_model_dir(a.out_dir, torch.float64)
    for (n1, p1), (_, p2) in zip(model.named_parameters(), check.named_parameters()):
        if not torch.equal(p1, p2):
            raise SystemExit(f"{a.out_dir}: tensor {n1} did not round-trip through BF16")

    mm = min(min(m) for m in margins)
    err32 = fp32_check(model, prompts, outs)
    expected = {"new": a.new, "prompts": prompts, "greedy": outs, "min_margin": mm,
                "fp32_max_logit_err": err32,
                "margins": [[round(x, 6) for x in m] for m in margins],
                "logprob_model": [[round(x, 7) for x in lp] for lp in lps]}
    with open(os.path.join(a.out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    distinct = [len(set(o)) for o in outs]
    print(f"{a.out_dir}: prompts of {[len(p) for p in prompts]} tokens, min margin {mm:.4f} "
          f"(float32 torch: same tokens, worst logit error {err32:.1e}), "
          f"distinct tokens per continuation {distinct}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
