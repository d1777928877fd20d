#!/usr/bin/python3
"""The bf16 policy slab of a longhaul model directory, for the patch benchmark (docs/PERFORMANCE.md,
"Patch trajectories and baseline").

    patch_slab.py MODEL_DIR OUT.bf16 [--table OUT.json]

A policy version is the bf16 slab in the Hugging Face tensor order of the model's table
(include/longhaul/patch.h). The table is computed from config.json exactly as
src/model/params.c (param_specs, walk) lays out the slab, and checked against the safetensors
header: every tensor must be there with that shape, in that order, at that offset (longhaul's
lh_model_save writes the data in table order). F32 weights are rounded to bf16 to nearest, ties
to even, NaN kept quiet, bit for bit as lh_bf16_from_f32 (src/tensor/kernels.c); BF16 weights are
copied. OUT.bf16 is the raw little-endian uint16 slab, written atomically (temporary + rename),
converted in chunks so a 0.5B-parameter model needs little memory.
"""
import json
import os
import struct
import sys

import numpy as np

CHUNK = 1 << 24  # elements per conversion chunk


def tensor_table(cfg):
    """[(name, shape, offset, numel)] in slab order, as lh_model_tensors gives it."""
    mt = cfg.get("model_type", "qwen2")
    C = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or C // H
    F = cfg["intermediate_size"]
    V = cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    tie = cfg.get("tie_word_embeddings", False)
    if mt == "qwen2":
        qkv_bias, o_bias, qk_norm = True, False, False
    elif mt in ("qwen3", "llama"):
        b = bool(cfg.get("attention_bias", False))
        qkv_bias, o_bias, qk_norm = b, b, mt == "qwen3"
    else:
        raise SystemExit(f"patch_slab: model_type {mt!r} not known")
    q, kv = H * hd, KV * hd
    layer = [("model.layers.%d.input_layernorm.weight", (C,)),
             ("model.layers.%d.self_attn.q_proj.weight", (q, C)),
             ("model.layers.%d.self_attn.k_proj.weight", (kv, C)),
             ("model.layers.%d.self_attn.v_proj.weight", (kv, C))]
    if qkv_bias:
        layer += [("model.layers.%d.self_attn.q_proj.bias", (q,)),
                  ("model.layers.%d.self_attn.k_proj.bias", (kv,)),
                  ("model.layers.%d.self_attn.v_proj.bias", (kv,))]
    if qk_norm:
        layer += [("model.layers.%d.self_attn.q_norm.weight", (hd,)),
                  ("model.layers.%d.self_attn.k_norm.weight", (hd,))]
    layer.append(("model.layers.%d.self_attn.o_proj.weight", (C, q)))
    if o_bias:
        layer.append(("model.layers.%d.self_attn.o_proj.bias", (C,)))
    layer += [("model.layers.%d.post_attention_layernorm.weight", (C,)),
              ("model.layers.%d.mlp.gate_proj.weight", (F, C)),
              ("model.layers.%d.mlp.up_proj.weight", (F, C)),
              ("model.layers.%d.mlp.down_proj.weight", (C, F))]
    specs = [("model.embed_tokens.weight", (V, C))]
    for li in range(L):
        specs += [(n % li, s) for n, s in layer]
    specs.append(("model.norm.weight", (C,)))
    if not tie:
        specs.append(("lm_head.weight", (V, C)))
    out, off = [], 0
    for name, shape in specs:
        n = int(np.prod(shape))
        out.append((name, shape, off, n))
        off += n
    return out


def bf16_from_f32(u):
    """uint32 bit patterns -> uint16 bf16, as lh_bf16_from_f32."""
    u = u.astype(np.uint32, copy=False)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def read_header(path):
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(hlen))
    return 8 + hlen, head


def check_layout(table, head, path):
    """dtype of the weights; exits unless the file holds the table in order at its offsets."""
    tensors = {k: v for k, v in head.items() if k != "__metadata__"}
    if set(tensors) != {t[0] for t in table}:
        raise SystemExit(f"{path}: tensor names differ from the table computed from config.json")
    dtypes = {v["dtype"] for v in tensors.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in ("F32", "BF16"):
        raise SystemExit(f"{path}: dtypes {sorted(dtypes)}: expected all F32 or all BF16")
    dt = next(iter(dtypes))
    size = 4 if dt == "F32" else 2
    in_file = sorted(tensors, key=lambda k: tensors[k]["data_offsets"][0])
    for (name, shape, off, n), fname in zip(table, in_file):
        t = tensors[name]
        if fname != name or tuple(t["shape"]) != shape or t["data_offsets"] != [off * size,
                                                                                (off + n) * size]:
            raise SystemExit(f"{path}: {name}: not at its table offset {off} with shape {shape} "
                             f"(file order has {fname} there)")
    return dt


def convert(model_dir, out_path, table_path=None):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    table = tensor_table(cfg)
    st = os.path.join(model_dir, "model.safetensors")
    data_at, head = read_header(st)
    dt = check_layout(table, head, st)
    total = table[-1][2] + table[-1][3]
    tmp = out_path + ".tmp"
    src = np.memmap(st, dtype=np.uint32 if dt == "F32" else np.uint16, mode="r", offset=data_at,
                    shape=(total,))
    with open(tmp, "wb") as f:
        for i in range(0, total, CHUNK):
            part = np.asarray(src[i:i + CHUNK])
            (bf16_from_f32(part) if dt == "F32" else part).astype("<u2").tofile(f)
        f.flush()
        os.fsync(f.fileno())
    del src
    os.replace(tmp, out_path)
    if table_path:
        doc = {"config": cfg, "elements": total, "source_dtype": dt,
               "tensors": [{"name": n, "shape": list(s), "offset": o, "numel": c}
                           for n, s, o, c in table]}
        with open(table_path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(table_path + ".tmp", table_path)
    return total


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--table"):
        raise SystemExit("usage: patch_slab.py MODEL_DIR OUT.bf16 [--table OUT.json]")
    convert(argv[1], argv[2], argv[4] if len(argv) == 5 else None)


if __name__ == "__main__":
    main(sys.argv)
