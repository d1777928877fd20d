#!/usr/bin/env python3
"""Writes a longhaul qwen2 model directory (bf16 or f32 safetensors) as an f16 GGUF (version 3)
that llama.cpp loads, for bench/generate.sh's llama.cpp peer: the same weights (bf16 values
widened, then rounded to f16; the init-model weights are small, so no value overflows), norms
and biases in f32, a tied head, and no tokenizer ("none": llama-batched-bench feeds token ids).
Numpy only. `longhaul export --gguf` may replace it (the script takes its GGUF from GGUF=).
  gguf_write.py MODEL_DIR OUT.gguf
"""
import json
import struct
import sys

import numpy as np

ALIGN = 32


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 1 << 26:
            sys.exit(f"{path}: header of {n} bytes, expected under 64 MiB")
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            if t["dtype"] == "BF16":
                v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif t["dtype"] == "F32":
                v = np.frombuffer(raw, np.float32)
            else:
                sys.exit(f"{path}: tensor {name}: dtype {t['dtype']}, expected BF16 or F32")
            yield name, v.reshape(t["shape"])


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        sys.exit(f"unexpected tensor {hf}")
    i, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    if rest not in table:
        sys.exit(f"unexpected tensor {hf}")
    return f"blk.{i}.{table[rest]}"


def s(b):
    b = b.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(k, v):
    return s(k) + struct.pack("<II", 4, v)


def kv_f32(k, v):
    return s(k) + struct.pack("<If", 6, v)


def kv_str(k, v):
    return s(k) + struct.pack("<I", 8) + s(v)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_write.py MODEL_DIR OUT.gguf")
    src, out = sys.argv[1:]
    c = json.load(open(f"{src}/config.json"))
    if c.get("model_type") != "qwen2":
        sys.exit(f"{src}/config.json: model_type {c.get('model_type')}, expected qwen2")
    tensors = []
    for name, v in read_safetensors(f"{src}/model.safetensors"):
        # weights (2-D) in f16, the rest in f32, as llama.cpp's converter writes them
        v = v.astype(np.float16 if v.ndim == 2 else np.float32)
        tensors.append((gguf_name(name), v))
    kvs = [
        kv_str("general.architecture", "qwen2"),
        kv_str("general.name", "longhaul-bench"),
        kv_u32("general.file_type", 1),  # mostly f16
        kv_u32("qwen2.context_length", c["max_position_embeddings"]),
        kv_u32("qwen2.embedding_length", c["hidden_size"]),
        kv_u32("qwen2.block_count", c["num_hidden_layers"]),
        kv_u32("qwen2.feed_forward_length", c["intermediate_size"]),
        kv_u32("qwen2.attention.head_count", c["num_attention_heads"]),
        kv_u32("qwen2.attention.head_count_kv", c["num_key_value_heads"]),
        kv_f32("qwen2.rope.freq_base", c["rope_theta"]),
        kv_f32("qwen2.attention.layer_norm_rms_epsilon", c["rms_norm_eps"]),
        kv_u32("qwen2.vocab_size", c["vocab_size"]),
        kv_str("tokenizer.ggml.model", "none"),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    off = 0
    for name, v in tensors:
        head += s(name) + struct.pack("<I", v.ndim)
        head += b"".join(struct.pack("<Q", d) for d in reversed(v.shape))  # ggml: innermost first
        head += struct.pack("<IQ", 1 if v.dtype == np.float16 else 0, off)
        off += (v.nbytes + ALIGN - 1) // ALIGN * ALIGN
    with open(out, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGN))
        for _, v in tensors:
            f.write(v.tobytes())
            f.write(b"\0" * (-v.nbytes % ALIGN))


if __name__ == "__main__":
    main()
