"""PyTorch peer of `longhaul bench generate`: the same model directory (loaded with
tests/ref/torch_model.py), a batch of B random prompts of P tokens, one batched prefill forward,
then decode steps with a KV cache until every sequence has N new tokens, sampled at temperature
1 with torch.multinomial (no eos stop). Prints one JSON line with the keys longhaul prints.

    python3 bench/peer_generate.py --model DIR --batch 32 --prompt-len 64 --new 64 --threads 2
    python3 bench/peer_generate.py --model DIR --check    # KV-cache decode == full recompute

It is meant as a fair peer, the way one would write a fast eager decoder in torch:
- fp32 weights (converted from the bf16 file): torch 1.13's CPU bf16 matmuls are far slower
  than its fp32 ones, so fp32 is torch's fastest path here; it reads twice the weight bytes
  longhaul reads (weight_bytes reports what the peer reads);
- the KV cache is preallocated, (layers, B, kv_heads, P+N, hd), and each step writes its keys
  and values in place (no torch.cat per step); attention reads a view of the filled prefix;
- the prefill computes the output head for the last position only;
- at batch 1, the products run as torch.mv (gemv), not F.linear (OpenBLAS sgemm packs the whole
  weight matrix even for one row: 3-6x slower);
- torch.inference_mode(), torch.set_num_threads(K), OMP_WAIT_POLICY=PASSIVE (torch's OpenMP
  pool would otherwise spin against the BLAS pool, as in bench/peer_train.py).
Timing, as `longhaul bench generate` counts it: one untimed warmup generation (2 new tokens);
prefill_s is the batched prompt forward; decode_s is the N-1 forwards of one token per sequence
plus all N samplings (the first token comes from the prefill's last row);
prefill_tokens_per_s = B*P / prefill_s, decode_tokens_per_s = B*(N-1) / decode_s (the tokens the
decode forwards make), decode_step_s = decode_s / (N-1). Prompts come from a fixed torch seed
(not longhaul's token stream: the work does not depend on the token values).
"""

import argparse
import json
import math
import os
import sys

import benchlib  # bench/, the script's own folder
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + safetensors)")
    ap.add_argument("--batch", type=int, default=1, help="sequences generated together")
    ap.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the prompts and the sampler")
    ap.add_argument("--check", action="store_true",
                    help="check KV-cache decode against full recompute in float64 and exit")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.prompt_len < 1 or a.new < 2 or a.threads < 0:
        ap.error("--batch >= 1, --prompt-len >= 1, --new >= 2, --threads >= 0")
    return a


A = parse(sys.argv[1:])
benchlib.pin_threads(A.threads)  # before torch is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import torch_model as tm  # noqa: E402


def linear(x, w, b=None):
    """F.linear, except that a single row goes through torch.mv: OpenBLAS's sgemm packs the
    whole weight matrix even for one row, and gemv streams it (3-6x faster at batch 1)."""
    if x.shape[:-1].numel() == 1:
        y = torch.mv(w, x.reshape(-1))
        if b is not None:
            y = y + b
        return y.view(*x.shape[:-1], w.shape[0])
    return F.linear(x, w, b)


def proj(x, lin):
    return linear(x, lin.weight, lin.bias)


class Decoder:
    """A torch_model.Model run with a KV cache for B sequences of up to max_t tokens."""

    def __init__(self, model, B, max_t):
        cfg = model.cfg
        self.m, self.cfg, self.B, self.max_t = model, cfg, B, max_t
        dtype = next(model.parameters()).dtype
        self.H, self.KV, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        shape = (cfg.n_layers, B, self.KV, max_t, self.hd)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        # RoPE tables of positions 0..max_t-1, as the model builds them (rope scaling included).
        self.cos, self.sin = model.rope(tm.Layout([0, max_t]), dtype)
        self.head = model.head_weight()
        self.scale = 1.0 / math.sqrt(self.hd)

    def forward(self, tokens, pos0, all_logits=False):
        """tokens (B, T) at positions pos0..pos0+T-1 of every sequence. Writes their keys and
        values into the cache; returns the logits of the last position (B, V), or of all
        positions (B, T, V) with all_logits."""
        B, T = tokens.shape
        H, KV, hd = self.H, self.KV, self.hd
        G, S = H // KV, pos0 + T
        cos = self.cos[pos0:S][None, :, None, :]
        sin = self.sin[pos0:S][None, :, None, :]
        mask = None
        if T > 1:  # query t (position pos0+t) sees keys 0..pos0+t
            mask = torch.ones(T, S, dtype=torch.bool).triu_(pos0 + 1)
        x = self.m.model.embed_tokens(tokens)
        for li, layer in enumerate(self.m.model.layers):
            at = layer.self_attn
            h = layer.input_layernorm(x)
            q = proj(h, at.q_proj).view(B, T, H, hd)
            k = proj(h, at.k_proj).view(B, T, KV, hd)
            v = proj(h, at.v_proj).view(B, T, KV, hd)
            if getattr(at, "qk_norm", False):
                q, k = at.q_norm(q), at.k_norm(k)
            q = q * cos + tm.rotate_half(q) * sin
            k = k * cos + tm.rotate_half(k) * sin
            self.k[li, :, :, pos0:S] = k.transpose(1, 2)
            self.v[li, :, :, pos0:S] = v.transpose(1, 2)
            kc, vc = self.k[li, :, :, :S], self.v[li, :, :, :S]  # (B, KV, S, hd) views
            qh = q.view(B, T, KV, G, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, hd)
            s = torch.matmul(qh * self.scale, kc.transpose(-1, -2))  # (B, KV, G*T, S)
            if mask is not None:
                s = s.view(B, KV, G, T, S).masked_fill(mask, float("-inf")).view(B, KV, G * T, S)
            o = torch.matmul(torch.softmax(s, dim=-1), vc)  # (B, KV, G*T, hd)
            o = o.view(B, KV, G, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)
            x = x + proj(o, at.o_proj)
            h = layer.post_attention_layernorm(x)
            mlp = layer.mlp
            x = x + proj(F.silu(proj(h, mlp.gate_proj)) * proj(h, mlp.up_proj), mlp.down_proj)
        if not all_logits:
            x = x[:, -1]
        return linear(self.m.model.norm(x), self.head)


def sample(logits, gen):
    """Temperature 1, no filters: one token per row (B, 1)."""
    return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=gen)


def generate(dec, prompts, new, gen):
    """Prefill, then new-1 decode steps; returns (tokens (B, new), prefill_s, decode_s,
    sample_s). As longhaul counts them: prefill_s is the prompt forward alone; decode_s is the
    decode forwards plus all the sampling (the first token's included); sample_s the sampling."""
    B, P = prompts.shape
    out = torch.empty(B, new, dtype=torch.long)
    t0 = time.perf_counter()
    logits = dec.forward(prompts, 0)
    t1 = time.perf_counter()
    tok = sample(logits, gen)
    sample_s = time.perf_counter() - t1
    out[:, :1] = tok
    for i in range(1, new):
        logits = dec.forward(tok, P + i - 1)
        ts = time.perf_counter()
        tok = sample(logits, gen)
        sample_s += time.perf_counter() - ts
        out[:, i:i + 1] = tok
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1, sample_s


def check(model_dir):
    """KV-cache logits (prefill in two chunks, then decode) equal full recompute with
    torch_model.Model, in float64, with 3 sequences (F.linear) and with 1 (torch.mv)."""
    torch.manual_seed(0)
    model = tm.load_model_dir(model_dir, torch.float64)
    V = model.cfg.vocab_size
    P, N = 7, 9
    ok = True
    for B in (3, 1):
        prompts = torch.randint(0, V, (B, P))
        dec = Decoder(model, B, P + N)
        gen = torch.Generator().manual_seed(1)
        worst = 0.0
        scale = 0.0
        with torch.inference_mode():
            got = [dec.forward(prompts[:, :3], 0, all_logits=True),
                   dec.forward(prompts[:, 3:], 3, all_logits=True)]
            seqs = prompts.clone()
            for i in range(N):
                tok = sample(got[-1][:, -1], gen)
                seqs = torch.cat((seqs, tok), 1)
                got.append(dec.forward(tok, seqs.shape[1] - 1, all_logits=True))
            kv_logits = torch.cat(got, 1)  # (B, P+N, V)
            T = seqs.shape[1]
            for b in range(B):
                full = model(seqs[b], [0, T])
                worst = max(worst, float((full - kv_logits[b]).abs().max()))
                scale = max(scale, float(full.abs().max()))
        good = worst <= 1e-10 * max(scale, 1.0)
        print(f"{model_dir}: KV-cache decode vs full recompute (float64, {B} x ({P} prompt + "
              f"{N} new), prefill in 2 chunks): worst logit difference {worst:.2e} (max |logit| "
              f"{scale:.2f}): {'ok' if good else 'FAILED'}")
        ok = ok and good
    return ok


def main():
    if A.threads > 0:
        torch.set_num_threads(A.threads)
    if A.check:
        return 0 if check(A.model) else 1
    model = tm.load_model_dir(A.model, torch.float32)
    cfg = model.cfg
    B, P, N = A.batch, A.prompt_len, A.new
    if P + N > cfg.max_positions:
        raise SystemExit(f"--prompt-len {P} + --new {N} is more than max_position_embeddings "
                         f"{cfg.max_positions}")
    g = torch.Generator().manual_seed(A.seed)
    prompts = torch.randint(0, cfg.vocab_size, (B, P), generator=g)
    params = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        dec = Decoder(model, B, P + N)
        generate(dec, prompts, 2, g)  # warmup: allocator, thread pools, caches
        _, prefill_s, decode_s, sample_s = generate(dec, prompts, N, g)
    print(json.dumps({
        "command": "peer_generate.py",
        "batch": B,
        "prompt_len": P,
        "new": N,
        "threads": torch.get_num_threads(),
        "prefill_tokens_per_s": B * P / prefill_s,
        "decode_tokens_per_s": B * (N - 1) / decode_s,
        "decode_step_s": decode_s / (N - 1),
        "sample_s": sample_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "weight_bytes": 4 * params,
        "weight_dtype": "float32",
        "params": params,
        "sampling": "multinomial, temperature 1",
        "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
