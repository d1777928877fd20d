"""Checks a Hugging Face directory written by `longhaul export` against its source, with the
PyTorch reference (tests/ref/torch_model.py, no transformers):
  - every weight is BF16 and equals the source's value rounded to bf16 (round to nearest even);
  - shards: model.safetensors.index.json's weight_map names every tensor once, total_size is the
    sum of the tensors' bytes, and each shard holds exactly the tensors the map gives it;
  - the exported model's float64 logits on random sequences equal the source's (with its
    weights rounded to bf16): the directory loads as the same model;
  - config.json gives the same model, tokenizer.json is the source's byte for byte, and
    tokenizer_config.json / generation_config.json name the config's bos/eos tokens.
Usage: /usr/bin/python3 tests/ref/export_check.py SRC_DIR OUT_DIR[:SHARDS] ...
(pairs of a source and its export; SHARDS, default 1, is how many weight files it must have).
Prints each failure; exits 1 if any.
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model as tm  # noqa: E402

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL", msg)


def load_export(out):
    """{name: tensor} of the export, from model.safetensors or the shards of the index."""
    index = os.path.join(out, "model.safetensors.index.json")
    if not os.path.exists(index):
        return tm.read_safetensors(os.path.join(out, "model.safetensors"))[0], 1
    with open(index) as f:
        ix = json.load(f)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        fail("both model.safetensors and an index")
    files = sorted(set(ix["weight_map"].values()))
    tensors, total = {}, 0
    for fname in files:
        part, _ = tm.read_safetensors(os.path.join(out, fname))
        for name, t in part.items():
            if ix["weight_map"].get(name) != fname:
                fail(f"{fname} holds {name}, the index says {ix['weight_map'].get(name)}")
            tensors[name] = t
            total += t.numel() * t.element_size()
    if set(tensors) != set(ix["weight_map"]):
        fail(f"index names {len(ix['weight_map'])} tensors, shards hold {len(tensors)}")
    if ix.get("metadata", {}).get("total_size") != total:
        fail(f"index total_size {ix.get('metadata')} != {total} bytes of tensors")
    return tensors, len(files)


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__)
        return 2
    for i in range(0, len(argv), 2):
        out, _, shards = argv[i + 1].partition(":")
        check(argparse.Namespace(src=argv[i], out=out, shards=int(shards or 1)))
    return 1 if FAILS else 0


def check(a):
    before = len(FAILS)
    src = tm.load_model_dir(a.src, torch.float64)
    with torch.no_grad():
        for p in src.parameters():
            p.copy_(p.to(torch.bfloat16).double())
    tensors, n_files = load_export(a.out)
    if n_files != a.shards:
        fail(f"{n_files} weight files, expected {a.shards}")
    want = tm.model_state(src, torch.float64)
    for name, t in want.items():
        got = tensors.get(name)
        if got is None:
            fail(f"tensor {name} missing")
        elif got.dtype != torch.bfloat16:
            fail(f"tensor {name} is {got.dtype}, expected bfloat16")
        elif not torch.equal(got.double(), t):
            fail(f"tensor {name}: values differ from the source rounded to bf16")
    with tempfile.TemporaryDirectory() as tmp:
        tm.write_safetensors(os.path.join(tmp, "model.safetensors"), tensors, {"format": "pt"})
        with open(os.path.join(a.out, "config.json")) as f:
            cfg_out = json.load(f)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg_out, f)
        got = tm.load_model_dir(tmp, torch.float64)
    g = torch.Generator().manual_seed(7)
    V = src.cfg.vocab_size
    tokens = torch.randint(0, V, (40,), generator=g)
    seq_start = [0, 17, 40]
    with torch.no_grad():
        la, lb = src(tokens, seq_start), got(tokens, seq_start)
    err = float((la - lb).abs().max())
    print(f"logits of the export vs the source (bf16-rounded), float64: max |diff| {err:.3g}")
    if err > 1e-9:
        fail(f"logits differ by {err}")
    with open(os.path.join(a.src, "config.json")) as f:
        cfg_src = json.load(f)
    for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "tie_word_embeddings"):
        if cfg_src.get(k) != cfg_out.get(k):
            fail(f"config.json {k}: {cfg_out.get(k)} vs source {cfg_src.get(k)}")
    if cfg_out.get("torch_dtype") != "bfloat16":
        fail(f"config.json torch_dtype {cfg_out.get('torch_dtype')}")
    with open(os.path.join(a.src, "tokenizer.json"), "rb") as f1, \
            open(os.path.join(a.out, "tokenizer.json"), "rb") as f2:
        if f1.read() != f2.read():
            fail("tokenizer.json differs from the source's")
    with open(os.path.join(a.src, "tokenizer.json")) as f:
        tok = json.load(f)
    id_of = dict(tok["model"]["vocab"])
    id_of.update({t["content"]: t["id"] for t in tok.get("added_tokens", [])})
    with open(os.path.join(a.out, "tokenizer_config.json")) as f:
        tc = json.load(f)
    for key in ("bos", "eos"):
        want_id = cfg_src.get(f"{key}_token_id")
        if isinstance(want_id, list):
            want_id = want_id[0]
        name = tc.get(f"{key}_token")
        if want_id is not None and id_of.get(name) != want_id:
            fail(f"tokenizer_config.json {key}_token {name!r} is id {id_of.get(name)}, "
                 f"config.json says {want_id}")
    for tid, t in tc.get("added_tokens_decoder", {}).items():
        if id_of.get(t["content"]) != int(tid):
            fail(f"added_tokens_decoder {tid}: {t['content']!r}")
    with open(os.path.join(a.out, "generation_config.json")) as f:
        gc = json.load(f)
    eos = cfg_src.get("eos_token_id")
    if eos is not None and gc.get("eos_token_id") not in (eos, [eos]):
        fail(f"generation_config.json eos_token_id {gc.get('eos_token_id')} vs {eos}")
    bad = len(FAILS) - before
    print(f"export_check: {a.out}: {len(want)} tensors, {n_files} file(s): "
          f"{'ok' if not bad else str(bad) + ' failure(s)'}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
