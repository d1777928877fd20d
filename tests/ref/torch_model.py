"""PyTorch reference of longhaul's model: a Llama/Qwen2/Qwen3-family decoder written from scratch
(no transformers), over sequences packed end to end, plus a self-contained safetensors reader
and writer and a loader for Hugging Face model directories (config.json + model.safetensors).

It promises the same numbers as the C model (include/longhaul/model.h) up to rounding:
tests/ref/make_fixture.py builds the fixtures from it and bench/peer_train.py times it.
Works with Debian's python3-torch 1.13 (no scaled_dot_product_attention).

    python3 tests/ref/torch_model.py selftest          # gradcheck + packing checks
    python3 tests/ref/torch_model.py init-model --arch qwen2 --preset p.json --seed 1 --out DIR
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header
# {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, raw data.

_NP_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
}
_TORCH_TO_ST = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
}
_ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1}


def bf16_bits_to_f32(bits):
    """uint16 numpy array of bf16 bit patterns -> float32 numpy array (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 numpy array -> uint16 bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def read_safetensors(path):
    """Returns ({name: torch.Tensor}, metadata dict). BF16 comes back as torch.bfloat16."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: {len(buf)} bytes, shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", buf[:8])
    if 8 + hlen > len(buf):
        raise ValueError(f"{path}: header length {hlen} runs past the end ({len(buf)} bytes)")
    header = json.loads(buf[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt, shape = info["dtype"], [int(s) for s in info["shape"]]
        b, e = (int(o) for o in info["data_offsets"])
        n = int(np.prod(shape)) if shape else 1
        if dt not in _ST_SIZE:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        if e - b != n * _ST_SIZE[dt] or base + e > len(buf):
            raise ValueError(f"{path}: tensor {name}: offsets [{b}, {e}] do not fit "
                             f"{dt}{shape} in {len(buf) - base} data bytes")
        raw = buf[base + b:base + e]
        if dt == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").copy()
            t = torch.from_numpy(bf16_bits_to_f32(bits)).to(torch.bfloat16)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP_DTYPES[dt]).newbyteorder("<")).copy()
            t = torch.from_numpy(arr.astype(_NP_DTYPES[dt]))
        out[name] = t.reshape(shape)
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (torch or numpy) in insertion order, atomically (tmp + rename).
    Tensors keep their dtype (torch.bfloat16 is written as BF16)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(t))
        t = t.detach().cpu().contiguous()
        dt = _TORCH_TO_ST[t.dtype]
        if dt == "BF16":
            raw = f32_to_bf16_bits(t.float().numpy()).astype("<u2").tobytes()
        else:
            raw = t.numpy().astype(np.dtype(_NP_DTYPES[dt]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # data section 8-byte aligned, as HF writes it
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# configuration (Hugging Face config.json, with Hugging Face defaults for missing fields)

class Config:
    def __init__(self, d):
        archs = d.get("architectures") or []
        mtype = d.get("model_type", "")
        if "Qwen2ForCausalLM" in archs or mtype == "qwen2":
            self.arch = "qwen2"
        elif "Qwen3ForCausalLM" in archs or mtype == "qwen3":
            self.arch = "qwen3"
        elif "LlamaForCausalLM" in archs or mtype == "llama":
            self.arch = "llama"
        else:
            raise ValueError(f"config.json: architectures {archs} / model_type {mtype!r}: "
                             "expected Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM")
        # rope_scaling: None, "default", or Llama 3.1's "llama3" (factor, low_freq_factor,
        # high_freq_factor, original_max_position_embeddings)
        self.rope_scaling = None
        rs = d.get("rope_scaling")
        if rs:
            kind = rs.get("rope_type", rs.get("type"))
            if kind == "llama3":
                self.rope_scaling = {k: rs[k] for k in ("factor", "low_freq_factor",
                                                        "high_freq_factor",
                                                        "original_max_position_embeddings")}
            elif kind != "default":
                raise NotImplementedError(f"config.json: rope_scaling {rs} not supported")
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.n_layers = int(d["num_hidden_layers"])
        self.n_heads = int(d["num_attention_heads"])
        kv = d.get("num_key_value_heads")
        self.n_kv_heads = int(kv) if kv is not None else self.n_heads
        hd = d.get("head_dim")
        self.head_dim = int(hd) if hd is not None else self.hidden_size // self.n_heads
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.rms_eps = float(d.get("rms_norm_eps", 1e-6))
        self.tie_embeddings = bool(d.get("tie_word_embeddings", False))
        self.max_positions = int(d.get("max_position_embeddings", 2048))
        # transformers: Qwen2Attention has q/k/v biases and no o_proj bias, whatever
        # attention_bias says; LlamaAttention and Qwen3Attention build q/k/v AND o_proj with
        # bias=attention_bias
        if self.arch == "qwen2":
            self.qkv_bias, self.o_bias = True, False
        else:
            self.qkv_bias = self.o_bias = bool(d.get("attention_bias", False))
        # Qwen3: RMSNorm over each q and k head (weights of size head_dim) before RoPE
        self.qk_norm = self.arch == "qwen3"
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"config.json: num_attention_heads {self.n_heads} is not a multiple "
                             f"of num_key_value_heads {self.n_kv_heads}")
        self.raw = dict(d)

    @staticmethod
    def load(path):
        with open(path) as f:
            return Config(json.load(f))


def tensor_shapes(cfg):
    """{hf name: shape} of every tensor the config implies, in longhaul's order
    (lm_head.weight only when untied)."""
    C, F_, V, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    H, KV = cfg.n_heads, cfg.n_kv_heads
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (H * hd, C)
        if cfg.qkv_bias:
            s[p + "self_attn.q_proj.bias"] = (H * hd,)
        s[p + "self_attn.k_proj.weight"] = (KV * hd, C)
        if cfg.qkv_bias:
            s[p + "self_attn.k_proj.bias"] = (KV * hd,)
        s[p + "self_attn.v_proj.weight"] = (KV * hd, C)
        if cfg.qkv_bias:
            s[p + "self_attn.v_proj.bias"] = (KV * hd,)
        if cfg.qk_norm:
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "self_attn.o_proj.weight"] = (C, H * hd)
        if cfg.o_bias:
            s[p + "self_attn.o_proj.bias"] = (C,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (F_, C)
        s[p + "mlp.up_proj.weight"] = (F_, C)
        s[p + "mlp.down_proj.weight"] = (C, F_)
    s["model.norm.weight"] = (C,)
    if not cfg.tie_embeddings:
        s["lm_head.weight"] = (V, C)
    return s


# ------------------------------------------------------------------------------------------
# model. Module names mirror Hugging Face, so named_parameters() yields the HF tensor names.

def _compute_dtype(dtype):
    """Norms, softmax and log-softmax run in at least fp32."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.to(_compute_dtype(x.dtype))
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(xf.dtype)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, H, KV, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.H, self.KV, self.hd = H, KV, hd
        self.q_proj = nn.Linear(C, H * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(C, KV * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(C, KV * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * hd, C, bias=cfg.o_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_eps)

    def forward(self, x, cos, sin, layout):
        N = x.shape[0]
        q = self.q_proj(x).view(N, self.H, self.hd)
        k = self.k_proj(x).view(N, self.KV, self.hd)
        v = self.v_proj(x).view(N, self.KV, self.hd)
        if self.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if layout.uniform:
            o = causal_gqa_attention(q.view(layout.B, layout.T, self.H, self.hd),
                                     k.view(layout.B, layout.T, self.KV, self.hd),
                                     v.view(layout.B, layout.T, self.KV, self.hd), layout.mask)
            o = o.reshape(N, self.H * self.hd)
        else:
            outs = []
            for b, e in layout.spans:
                outs.append(causal_gqa_attention(q[b:e].unsqueeze(0), k[b:e].unsqueeze(0),
                                                 v[b:e].unsqueeze(0), None)[0])
            o = torch.cat(outs, 0).reshape(N, self.H * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, F_ = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layout):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layout)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x (N, heads, hd); cos/sin (N, hd), Hugging Face rotate-half convention."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def rope_inv_freq(cfg):
    """inv_freq (hd/2) in float64: theta^(-2i/hd), adjusted as transformers'
    _compute_llama3_parameters does when rope_scaling is llama3: wavelengths 2*pi/inv_freq
    above original/low_freq_factor are stretched by factor, those below
    original/high_freq_factor kept, and the band between interpolated smoothly."""
    hd = cfg.head_dim
    inv_freq = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = cfg.rope_scaling
    if rs is None:
        return inv_freq
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(positions, inv_freq, dtype):
    """cos, sin (N, hd) for integer positions (N): angle pos*inv_freq[i], duplicated to hd.
    The angles are computed in float64 and rounded once to `dtype`."""
    ang = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def causal_gqa_attention(q, k, v, mask):
    """q (B, T, H, hd), k/v (B, T, KV, hd) -> (B, T, H, hd). Head h reads kv head h // (H/KV).
    mask: (T, T) bool, True above the diagonal, or None to build it."""
    B, T, H, hd = q.shape
    KV = k.shape[2]
    G = H // KV
    # Heads of a group share one k/v; the scale goes on q (T*hd values, not T*T scores).
    qh = q.permute(0, 2, 1, 3).reshape(B, KV, G * T, hd) * (1.0 / math.sqrt(hd))
    kh = k.permute(0, 2, 3, 1)  # (B, KV, hd, T)
    vh = v.permute(0, 2, 1, 3)  # (B, KV, T, hd)
    s = torch.matmul(qh, kh).view(B, KV, G, T, T)
    s = s.to(_compute_dtype(s.dtype))
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu_(1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype).view(B, KV, G * T, T)
    o = torch.matmul(p, vh).view(B, KV, G, T, hd)
    return o.permute(0, 3, 1, 2, 4).reshape(B, T, H, hd)


class Layout:
    """How a packed batch splits into sequences: spans, positions, and, when every sequence has
    the same length T, the (B, T) view that lets attention run batched."""

    def __init__(self, seq_start, device=None):
        ss = [int(s) for s in (seq_start.tolist() if torch.is_tensor(seq_start) else seq_start)]
        if ss[0] != 0 or any(b >= e for b, e in zip(ss, ss[1:])):
            raise ValueError(f"seq_start {ss}: must start at 0 and increase strictly")
        self.seq_start = ss
        self.spans = list(zip(ss[:-1], ss[1:]))
        self.N = ss[-1]
        lens = {e - b for b, e in self.spans}
        self.uniform = len(lens) == 1
        self.positions = torch.cat([torch.arange(e - b) for b, e in self.spans]).to(device)
        starts = torch.zeros(self.N, dtype=torch.bool)
        starts[ss[:-1]] = True
        self.is_start = starts.to(device)
        if self.uniform:
            self.B, self.T = len(self.spans), lens.pop()
            self.mask = torch.ones(self.T, self.T, dtype=torch.bool, device=device).triu_(1)


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope_cache = {}

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def rope(self, layout, dtype):
        key = (tuple(layout.seq_start), dtype)
        hit = self._rope_cache.get(key)
        if hit is None:
            hit = rope_tables(layout.positions, rope_inv_freq(self.cfg), dtype)
            self._rope_cache = {key: hit}
        return hit

    def forward(self, tokens, layout):
        """tokens (N) long; layout: Layout or seq_start. Returns logits (N, V): row i is the
        prediction made at position i (for token i+1 of the same sequence)."""
        if not isinstance(layout, Layout):
            layout = Layout(layout, tokens.device)
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rope(layout, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, layout)
        x = self.model.norm(x)
        return F.linear(x, self.head_weight())


def token_logprobs(logits, tokens, layout):
    """logprob (N): log_softmax(logits[i-1])[tokens[i]], 0 at sequence starts."""
    if not isinstance(layout, Layout):
        layout = Layout(layout, tokens.device)
    ls = torch.log_softmax(logits[:-1].to(_compute_dtype(logits.dtype)), dim=-1)
    lp = ls.gather(1, tokens[1:, None].long())[:, 0]
    lp = torch.cat((lp.new_zeros(1), lp))
    return lp.masked_fill(layout.is_start, 0.0)


def weighted_ce(logprob, weight):
    """sum(w*-logprob)/sum(w); 0 when all weights are 0."""
    w = weight.to(logprob.dtype)
    tot = w.sum()
    if float(tot) == 0.0:
        return (logprob * 0).sum()
    return -(w * logprob).sum() / tot


# ------------------------------------------------------------------------------------------
# model directories

def load_model_dir(path, dtype=torch.float32):
    """Reads PATH/config.json and PATH/model.safetensors (F32 or BF16) into a Model of `dtype`.
    Every tensor the config implies must be present with its shape; no others are allowed
    (lm_head.weight in a tied model is accepted if it equals the embedding)."""
    cfg = Config.load(os.path.join(path, "config.json"))
    tensors, _ = read_safetensors(os.path.join(path, "model.safetensors"))
    model = Model(cfg).to(dtype)
    want = tensor_shapes(cfg)
    extra = set(tensors) - set(want)
    if cfg.tie_embeddings and "lm_head.weight" in extra:
        if not torch.equal(tensors["lm_head.weight"].float(),
                           tensors["model.embed_tokens.weight"].float()):
            raise ValueError(f"{path}: tied model has an lm_head.weight unlike the embedding")
        extra.discard("lm_head.weight")
    if extra:
        raise ValueError(f"{path}/model.safetensors: unexpected tensors {sorted(extra)}")
    params = dict(model.named_parameters())
    assert set(params) == set(want), (sorted(params), sorted(want))
    with torch.no_grad():
        for name, shape in want.items():
            if name not in tensors:
                raise ValueError(f"{path}/model.safetensors: tensor {name} missing")
            t = tensors[name]
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{path}/model.safetensors: tensor {name}: shape "
                                 f"{list(t.shape)}, config.json says {list(shape)}")
            if not t.is_floating_point():
                raise ValueError(f"{path}/model.safetensors: tensor {name}: dtype {t.dtype}")
            params[name].copy_(t.to(dtype))
    return model


def perturb(model, seed, scale, dtype):
    """Makes every parameter path matter in a reference model that init left near zero or one:
    matrices and embeddings x scale (init is normal(0, 0.02)), norm weights 1 + 0.1*N(0,1),
    biases 0.1*N(0,1) (from a generator seeded with seed). Every value is then rounded to dtype
    (what the fixture stores, so both sides compute from the same numbers)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(scale)
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            p.copy_(p.to(dtype).double())


def model_state(model, dtype=torch.float32):
    """{hf name: tensor} in longhaul's tensor order, for writing model.safetensors."""
    params = dict(model.named_parameters())
    return {n: params[n].detach().to(dtype).contiguous() for n in tensor_shapes(model.cfg)}


def save_model_dir(model, path, config_dict, dtype=torch.float32):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(path, "model.safetensors"), model_state(model, dtype),
                      {"format": "pt"})


def default_config_dict(arch):
    """A Hugging Face config.json for a tiny model of `arch` (what `longhaul init-model`
    writes, give or take fields the reference does not read)."""
    d = {
        "architectures": [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "llama": "LlamaForCausalLM"}[arch]],
        "model_type": arch,
        "vocab_size": 96, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if arch != "qwen2":
        d["attention_bias"] = False
    return d


def init_model_dir(arch, overrides, seed, out, dtype=torch.float32):
    """Python stand-in for `longhaul init-model`: normal(0, 0.02) matrices and embeddings, ones
    for norms, zeros for biases (torch RNG, so not the same numbers as the C init)."""
    d = default_config_dict(arch)
    d.update(overrides)
    cfg = Config(d)
    model = Model(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.02)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    save_model_dir(model, out, d, dtype)
    return model


# ------------------------------------------------------------------------------------------
# self-test

def _selftest():
    torch.manual_seed(0)
    ok = True
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    for arch, tie, kv, extra in (("qwen2", True, 2, {}), ("llama", False, 1, {}),
                                 ("llama", True, 4, {}), ("qwen3", True, 2, {"head_dim": 6}),
                                 ("qwen3", False, 1, {"head_dim": 6, "attention_bias": True}),
                                 ("llama", False, 2, {"rope_scaling": llama3})):
        d = default_config_dict(arch)
        d.update(vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=kv, head_dim=4,
                 tie_word_embeddings=tie, attention_bias=(arch == "llama" and tie))
        d.update(extra)
        cfg = Config(d)
        model = Model(cfg).double()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.5)
                elif name.endswith("bias"):
                    p.normal_(0, 0.1)
                else:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        seq_start = [0, 3, 8, 10]
        layout = Layout(seq_start)
        tokens = torch.randint(0, cfg.vocab_size, (10,))
        w = torch.ones(10, dtype=torch.float64)
        w[layout.is_start] = 0
        w[4] = 0.5
        names = [n for n, _ in model.named_parameters()]
        params = [p for _, p in model.named_parameters()]

        def loss_fn(*ps):
            state = dict(zip(names, ps))
            lp = token_logprobs(_functional_call(model, state, (tokens, layout)), tokens, layout)
            return weighted_ce(lp, w)

        good = torch.autograd.gradcheck(loss_fn, tuple(p.detach().clone().requires_grad_()
                                                       for p in params), eps=1e-6, atol=1e-5)
        # The spec written as plain loops gives the same logits.
        naive = _naive_logits(model, tokens.tolist(), seq_start)
        good = good and np.allclose(model(tokens, layout).detach().numpy(), naive, atol=1e-10)
        # Packing: each sequence alone gives the same logits as inside the pack.
        full = model(tokens, layout)
        for b, e in layout.spans:
            alone = model(tokens[b:e], [0, e - b])
            good = good and torch.allclose(full[b:e], alone, atol=1e-12)
        # Uniform-length batched path equals the per-sequence loop.
        t2 = torch.randint(0, cfg.vocab_size, (12,))
        batched = model(t2, [0, 4, 8, 12])
        looped = torch.cat([model(t2[i:i + 4], [0, 4]) for i in (0, 4, 8)])
        good = good and torch.allclose(batched, looped, atol=1e-12)
        # Safetensors round trip (F32 and BF16).
        tmp = f"/tmp/lh_torch_model_selftest_{os.getpid()}"
        save_model_dir(model, tmp, d, torch.float32)
        m2 = load_model_dir(tmp, torch.float64)
        good = good and all(torch.equal(a.float().double(), b) for a, b in
                            zip(model.parameters(), m2.parameters()))
        save_model_dir(model, tmp, d, torch.bfloat16)
        m3 = load_model_dir(tmp, torch.float32)
        good = good and all(torch.equal(a.to(torch.bfloat16).float(), b) for a, b in
                            zip(model.parameters(), m3.parameters()))
        for fn in os.listdir(tmp):
            os.remove(os.path.join(tmp, fn))
        os.rmdir(tmp)
        print(f"selftest {arch} tied={tie} kv={kv} {extra}: {'ok' if good else 'FAILED'}")
        ok = ok and good
    return ok


def _naive_logits(model, tokens, seq_start):
    """Loop-by-loop numpy forward written straight from the spec, to cross-check Model."""
    cfg = model.cfg
    P = {n: p.detach().double().numpy() for n, p in model.named_parameters()}
    H, KV, hd, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_eps
    out = []

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def inv_freq(i):
        f = cfg.rope_theta ** (-2.0 * i / hd)
        rs = cfg.rope_scaling
        if rs is None:
            return f
        # Llama 3.1 (the original reference code): keep short wavelengths, divide long ones by
        # factor, blend linearly in 1/wavelength between
        lo = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
        hi = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
        wl = 2 * math.pi / f
        if wl < hi:
            return f
        if wl > lo:
            return f / rs["factor"]
        a = (rs["original_max_position_embeddings"] / wl - rs["low_freq_factor"]) / (
            rs["high_freq_factor"] - rs["low_freq_factor"])
        return (1 - a) * f / rs["factor"] + a * f

    def rope(v, pos):
        r = np.empty_like(v)
        for i in range(hd // 2):
            ang = pos * inv_freq(i)
            c, s_ = math.cos(ang), math.sin(ang)
            r[i] = v[i] * c - v[i + hd // 2] * s_
            r[i + hd // 2] = v[i + hd // 2] * c + v[i] * s_
        return r

    for b, e in zip(seq_start[:-1], seq_start[1:]):
        T = e - b
        x = np.stack([P["model.embed_tokens.weight"][int(t)] for t in tokens[b:e]])
        for li in range(cfg.n_layers):
            p = f"model.layers.{li}."
            h = rms(x, P[p + "input_layernorm.weight"])
            proj = {}
            for nm in "qkv":
                y = h @ P[p + f"self_attn.{nm}_proj.weight"].T
                if cfg.qkv_bias:
                    y = y + P[p + f"self_attn.{nm}_proj.bias"]
                proj[nm] = y
            if cfg.qk_norm:  # each head's q and k vector on its own
                for nm, n_heads in (("q", H), ("k", KV)):
                    y = proj[nm].reshape(T, n_heads, hd)
                    proj[nm] = rms(y, P[p + f"self_attn.{nm}_norm.weight"]).reshape(T, -1)
            att = np.zeros((T, H * hd))
            for hh in range(H):
                kh = hh // (H // KV)
                for t in range(T):
                    q = rope(proj["q"][t, hh * hd:(hh + 1) * hd], t)
                    sc = np.array([q @ rope(proj["k"][u, kh * hd:(kh + 1) * hd], u)
                                   for u in range(t + 1)]) / math.sqrt(hd)
                    pr = np.exp(sc - sc.max())
                    pr /= pr.sum()
                    att[t, hh * hd:(hh + 1) * hd] = sum(
                        pr[u] * proj["v"][u, kh * hd:(kh + 1) * hd] for u in range(t + 1))
            x = x + att @ P[p + "self_attn.o_proj.weight"].T
            if cfg.o_bias:
                x = x + P[p + "self_attn.o_proj.bias"]
            h = rms(x, P[p + "post_attention_layernorm.weight"])
            g = h @ P[p + "mlp.gate_proj.weight"].T
            u_ = h @ P[p + "mlp.up_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u_) @ P[p + "mlp.down_proj.weight"].T
        x = rms(x, P["model.norm.weight"])
        head = P["model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]
        out.append(x @ head.T)
    return np.concatenate(out)


def _functional_call(model, state, args):
    """torch 1.13: torch.nn.utils.stateless.functional_call."""
    from torch.nn.utils import stateless
    return stateless.functional_call(model, state, args)


def _main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest")
    im = sub.add_parser("init-model")
    im.add_argument("--arch", choices=["qwen2", "qwen3", "llama"], required=True)
    im.add_argument("--preset", help="JSON file of config.json keys to override")
    im.add_argument("--seed", type=int, default=1)
    im.add_argument("--out", required=True)
    im.add_argument("--bf16", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "selftest":
        return 0 if _selftest() else 1
    overrides = {}
    if a.preset:
        with open(a.preset) as f:
            overrides = json.load(f)
    init_model_dir(a.arch, overrides, a.seed, a.out, torch.bfloat16 if a.bf16 else torch.float32)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
