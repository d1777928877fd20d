"""Perturbs a model directory in place so greedy decoding is not degenerate: what the parity
fixtures do (torch_model.perturb: matrices and embeddings x SCALE, norm weights 1 + 0.1*N(0,1),
biases 0.1*N(0,1)), then writes model.safetensors back in F32. config.json and tokenizer.json
are kept. Used by tests/integration/export.sh on models `longhaul init-model` wrote.

    /usr/bin/python3 tests/ref/perturb_model.py MODEL_DIR... [--seed S] [--scale X]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model as tm  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--scale", type=float, default=5.0)
    a = ap.parse_args(argv)
    for d in a.dirs:
        perturb_dir(d, a.seed, a.scale)
    return 0


def perturb_dir(path, seed, scale):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    model = tm.load_model_dir(path, torch.float64)
    tm.perturb(model, seed, scale, torch.float32)
    tm.write_safetensors(os.path.join(path, "model.safetensors"),
                         tm.model_state(model, torch.float32), {"format": "pt"})
    config["torch_dtype"] = "float32"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
