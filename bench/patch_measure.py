#!/usr/bin/python3
"""What the patches between consecutive bf16 policies hold, and what coding them would cost:
the measurements for choosing the policy-patch coding (issue 14; docs/PERFORMANCE.md, "Patch
trajectories and baseline (measurements)").

    patch_measure.py OUT_DIR [--cases A,B] [--levels 3,19] [--dense-levels 3] [--json FILE]

OUT_DIR is what bench/patch_trajectories.sh wrote: OUT_DIR/CASE/vNN.bf16 and tensors.json. For
every consecutive pair (v[k-1], v[k]) and the 8-version pairs (v0, v8) and (v[N-8], v[N]) (a worker
8 versions behind), with a = old and b = new bf16 bit patterns and key(x) the order-preserving
integer image of bf16 (x ^ 0x8000 when the sign bit is clear, ~x when set; include/longhaul/
patch.h), step = key(b) - key(a):

  baseline   what published systems ship (PULSE, slime, TRL, GRAIL): the changed positions as
             LEB128 varints of the gaps (position - previous position - 1, the first from -1) and
             the new 16-bit values verbatim, zstd'd, at each level: the two streams in frames of
             their own (at the first level also one frame of both, within 0.5% of two here);
             a level's figure is the smallest of these at that level or any lower one
  keystep    the same gaps, and the steps as zigzag LEB128 varints instead of the new values,
             each stream zstd'd separately
  densemap   no positions: one int8 per element (the step; -128 escapes to a second stream of
             16-bit new values), zstd'd at --dense-levels (default 3)
  entropies  of the changed bit per element and of the step symbol (-7..7 without 0, and two
             escapes costing 16 more bits), under context sets: none; the old value's exponent
             (8 bits); exponent + whether the position changed in the previous patch; exponent +
             the sign of the position's last step (never, -, +); exponent + both; tensor +
             exponent + both. Each as the static empirical entropy (a lower bound that does not
             pay for learning the model) and as the code length of an ideal adaptive coder that
             starts each patch knowing nothing (Krichevsky-Trofimov estimator per context:
             depends on the counts only). Also the step sign alone per context, and the gaps:
             their empirical entropy and that of their bit length plus the raw bits below it.

For the consecutive pairs the "previous patch" of v[k-1] -> v[k] is v[k-2] -> v[k-1] (none for
k = 1) and the "last step" is the newest nonzero step at that position in v0 .. v[k-1], state
that a decoder following the chain holds. For an 8-version pair (u, u+8) they are the previous
8-version patch (u-8, u), none for u = 0. Bytes per change divide by the changed values of the
pair. Everything is counted in chunks of 2^24 elements, so a 0.5B slab needs a few GB.
Needs numpy; zstd through ctypes from libzstd.so.1 (the library longhaul links).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import numpy as np

CHUNK = 1 << 24
NSYM = 16  # step symbols: 0..6 = -7..-1, 7..13 = +1..+7, 14 = <= -8, 15 = >= +8
ESC_BITS = 16
LN2 = math.log(2.0)

_z = ctypes.CDLL("libzstd.so.1")
_z.ZSTD_compressBound.restype = ctypes.c_size_t
_z.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
_z.ZSTD_compress.restype = ctypes.c_size_t
_z.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_int]
_z.ZSTD_isError.restype = ctypes.c_uint
_z.ZSTD_isError.argtypes = [ctypes.c_size_t]


def zsize(buf, level):
    """bytes of one zstd frame of buf (a contiguous numpy array) at level"""
    buf = np.ascontiguousarray(buf)
    n = buf.nbytes
    cap = _z.ZSTD_compressBound(n)
    dst = ctypes.create_string_buffer(cap)
    r = _z.ZSTD_compress(dst, cap, buf.ctypes.data, n, level)
    if _z.ZSTD_isError(r):
        raise RuntimeError("zstd failed")
    return int(r)


def varint(g):
    """LEB128 bytes of the unsigned integers g (uint64), as one uint8 array"""
    g = g.astype(np.uint64)
    nb = np.ones(len(g), np.int64)
    for j in range(1, 10):
        nb += g >= (np.uint64(1) << np.uint64(7 * j))
    start = np.concatenate(([0], np.cumsum(nb)[:-1]))
    out = np.zeros(int(nb.sum()), np.uint8)
    for j in range(int(nb.max()) if len(nb) else 0):
        m = nb > j
        byte = ((g[m] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= np.where(nb[m] > j + 1, 0x80, 0).astype(np.uint8)
        out[start[m] + j] = byte
    return out


def zigzag(s):
    s = s.astype(np.int64)
    return ((s << 1) ^ (s >> 63)).astype(np.uint64)


def key(x):
    """order-preserving integer image of bf16 bit patterns (uint16): x ^ 0x8000 when the sign
    bit is clear, ~x when it is set"""
    x = x.astype(np.uint16, copy=False)
    return x ^ ((x >> 15) * np.uint16(0x7FFF) | np.uint16(0x8000))


def lgam(counts):
    """sum of lgamma(c + 1/2) - lgamma(1/2) over counts, by distinct value"""
    u, n = np.unique(counts, return_counts=True)
    return sum(int(k) * (math.lgamma(v + 0.5) - math.lgamma(0.5)) for v, k in zip(u, n))


def kt_bits(table):
    """adaptive (Krichevsky-Trofimov) code length in bits of the symbols counted in table
    (contexts x alphabet), each context starting from nothing"""
    K = table.shape[1]
    tot = table.sum(1)
    tot = tot[tot > 0]
    nats = lgam_total(tot, K) - lgam(table[table.sum(1) > 0].ravel())
    return nats / LN2


def lgam_total(tot, K):
    u, n = np.unique(tot, return_counts=True)
    return sum(int(k) * (math.lgamma(v + K / 2) - math.lgamma(K / 2)) for v, k in zip(u, n))


def static_bits(table):
    """empirical (static) entropy in bits: sum over contexts of n * H(context's distribution)"""
    t = table.astype(np.float64)
    tot = t.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.where(t > 0, np.log2(np.where(t > 0, tot / t, 1.0)), 0.0)
    return float((t * lp).sum())


CTX_SETS = ["none", "exp", "exp+prevchg", "exp+lastsign", "exp+prevchg+lastsign",
            "tensor+exp+prevchg+lastsign"]


def kind_of(name):
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return ".".join(parts[3:])
    return name


class Pair:
    """accumulates everything measured for one patch, chunk by chunk: counts in the finest
    context (tensor, exponent, previous change, last sign), from which every coarser context
    set is a sum"""

    def __init__(self, n_tensors):
        self.nt = n_tensors
        self.chg = np.zeros((n_tensors * 1536, 2), np.int64)  # elements, changed
        self.sym = np.zeros(n_tensors * 1536 * NSYM, np.int64)
        self.gaps, self.vals, self.steps, self.dense, self.esc = [], [], [], [], []
        self.last_pos = -1
        self.hist = np.zeros(257, np.int64)

    def add(self, lo, a, b, state, tidbase, dense):
        """a, b: old and new bf16 of elements lo.. ; state per element: 3 * (changed in the
        previous patch) + last step sign (0 none, 1 -, 2 +), int8; tidbase: 1536 * tensor index,
        int32. Returns the changed mask and the steps (int32)."""
        step = np.subtract(key(b), key(a), dtype=np.int32)
        chg = a != b
        ctx = (a >> 7).astype(np.int32)
        ctx &= 0xFF
        ctx *= 6
        ctx += state
        ctx += tidbase
        n = self.nt * 1536
        self.chg[:, 0] += np.bincount(ctx, minlength=n)
        cc = ctx[chg]
        self.chg[:, 1] += np.bincount(cc, minlength=n)
        s = step[chg]
        sym = np.where(s < 0, np.maximum(s, -8) + 7, np.minimum(s, 8) + 6)
        sym = np.where(s <= -8, 14, np.where(s >= 8, 15, sym))
        self.sym += np.bincount(cc * NSYM + sym, minlength=n * NSYM)
        self.hist += np.bincount(np.minimum(np.abs(s), 256), minlength=257)
        pos = np.flatnonzero(chg) + lo
        if len(pos):
            g = np.diff(np.concatenate(([self.last_pos], pos))) - 1
            self.last_pos = int(pos[-1])
            self.gaps.append(g.astype(np.uint64))
            self.vals.append(b[chg].astype("<u2"))
            self.steps.append(s)
        if dense:
            d = np.clip(step, -127, 127)
            escm = (step < -127) | (step > 127)
            d[escm] = -128
            self.dense.append(d.astype(np.int8))
            self.esc.append(b[escm].astype("<u2"))
        return chg, step

    def tables(self):
        """{context set: (binary changed table, step symbol table)}, contexts x alphabet"""
        c = self.chg.reshape(self.nt, 256, 2, 3, 2)
        y = self.sym.reshape(self.nt, 256, 2, 3, NSYM)
        out = {}
        for name, axes in (("none", (0, 1, 2, 3)), ("exp", (0, 2, 3)), ("exp+prevchg", (0, 3)),
                           ("exp+lastsign", (0, 2)), ("exp+prevchg+lastsign", (0,)),
                           ("tensor+exp+prevchg+lastsign", ())):
            cm = c.sum(axis=axes) if axes else c
            ym = y.sum(axis=axes) if axes else y
            cm = cm.reshape(-1, 2)
            out[name] = (np.stack([cm[:, 0] - cm[:, 1], cm[:, 1]], 1), ym.reshape(-1, NSYM))
        return out

    def finish(self, n_elems, levels, dense_levels):
        r = {"elements": n_elems}
        g = np.concatenate(self.gaps) if self.gaps else np.zeros(0, np.uint64)
        vals = np.concatenate(self.vals) if self.vals else np.zeros(0, "<u2")
        steps = np.concatenate(self.steps) if self.steps else np.zeros(0, np.int32)
        nc = len(g)
        r["changed"] = nc
        r["fraction_changed"] = nc / n_elems
        r["full_bf16_bytes"] = 2 * n_elems
        gv = varint(g)
        sv = varint(zigzag(steps))
        both = np.concatenate([gv, vals.view(np.uint8)])
        r["raw_bytes"] = {"gap_varints": int(gv.size), "values": int(vals.nbytes),
                          "step_varints": int(sv.size)}
        base, ks, dm = {}, {}, {}
        for lv in levels:
            zg, zv, zs = zsize(gv, lv), zsize(vals, lv), zsize(sv, lv)
            b = base[str(lv)] = {"separate": zg + zv, "gaps": zg, "values": zv}
            if lv == levels[0]:  # one frame of both: within 0.5% of two on these data
                b["concat"] = zsize(both, lv)
            b["bytes"] = min(b["separate"], b.get("concat", 1 << 62),
                             *(base[str(x)]["bytes"] for x in levels if x < lv))
            ks[str(lv)] = {"bytes": zg + zs, "gaps": zg, "steps": zs}
        if self.dense:
            d = np.concatenate(self.dense)
            esc = np.concatenate(self.esc)
            for lv in dense_levels:
                dm[str(lv)] = {"bytes": zsize(d, lv) + (zsize(esc, lv) if esc.size else 0),
                               "escapes": int(esc.size)}
        r["baseline"] = base
        r["keystep"] = ks
        r["densemap"] = dm
        h = self.hist
        r["step_hist"] = {"1": int(h[1]), "2": int(h[2]), "3-7": int(h[3:8].sum()),
                          "8-255": int(h[8:256].sum()), ">=256": int(h[256])}
        neg = int((steps < 0).sum())
        r["step_sign"] = {"neg": neg, "pos": nc - neg}
        r["step_pm1"] = {"+1": int((steps == 1).sum()), "-1": int((steps == -1).sum())}
        y = self.sym.reshape(self.nt, 256, 2, 3, NSYM).sum(axis=(0, 1, 2))
        sg = np.stack([y[:, 0:7].sum(1) + y[:, 14], y[:, 7:14].sum(1) + y[:, 15]], 1)
        r["sign_vs_last"] = {"never": sg[0].tolist(), "last-": sg[1].tolist(),
                             "last+": sg[2].tolist(), "columns": ["step-", "step+"]}
        tabs = self.tables()
        ent = {}
        for c in CTX_SETS:
            bin_t, st = tabs[c]
            sign_t = np.stack([st[:, 0:7].sum(1) + st[:, 14], st[:, 7:14].sum(1) + st[:, 15]], 1)
            n_esc = int(st[:, 14:].sum())
            e = {"changed_static": static_bits(bin_t), "changed_kt": kt_bits(bin_t),
                 "step_static": static_bits(st) + ESC_BITS * n_esc,
                 "step_kt": kt_bits(st) + ESC_BITS * n_esc,
                 "sign_static": static_bits(sign_t), "sign_kt": kt_bits(sign_t)}
            if nc:
                e["ideal_bytes_per_change"] = (e["changed_kt"] + e["step_kt"]) / 8 / nc
                e["static_bytes_per_change"] = (e["changed_static"] + e["step_static"]) / 8 / nc
            ent[c] = e
        r["entropy_bits"] = ent
        if nc:
            u, cnt = np.unique(g, return_counts=True)
            p = cnt / nc
            bl = np.zeros(len(g), np.int64)
            x = g.copy()
            while True:
                m = x > 0
                if not m.any():
                    break
                bl += m
                x >>= np.uint64(1)
            ub, cb = np.unique(bl, return_counts=True)
            pb = cb / nc
            r["gap_entropy_bits"] = {
                "empirical_per_gap": float(-(p * np.log2(p)).sum()),
                "bitlength_plus_raw_per_gap": float(-(pb * np.log2(pb)).sum()
                                                    + np.maximum(bl - 1, 0).sum() / nc),
                "mean_gap": float(g.mean())}
        ct = self.chg.reshape(self.nt, -1, 2).sum(1)
        yt = self.sym.reshape(self.nt, -1, NSYM).sum(1)
        big = yt[:, 0:5].sum(1) + yt[:, 9:16].sum(1)
        kinds = {}
        for t, k in enumerate(self.kind_of_tid):
            e = kinds.setdefault(self.kind_names[k], {"elements": 0, "changed": 0, "step_gt2": 0})
            e["elements"] += int(ct[t, 0])
            e["changed"] += int(ct[t, 1])
            e["step_gt2"] += int(big[t])
        r["kinds"] = kinds
        return r


def measure_case(d, levels, dense_levels):
    tab = json.load(open(os.path.join(d, "tensors.json")))
    tensors = tab["tensors"]
    N = tab["elements"]
    vers = sorted(int(f[1:-5]) for f in os.listdir(d) if f.startswith("v") and f.endswith(".bf16"))
    assert vers == list(range(len(vers))), f"{d}: versions {vers} not 0..N"
    last = vers[-1]
    path = lambda k: os.path.join(d, f"v{k:02d}.bf16")
    slab = lambda k: np.memmap(path(k), dtype="<u2", mode="r", shape=(N,))
    for k in vers:
        assert os.path.getsize(path(k)) == 2 * N, f"{path(k)}: not {2 * N} bytes"
    offs = np.array([t["offset"] for t in tensors] + [N], np.int64)
    kinds = sorted({kind_of(t["name"]) for t in tensors})
    kind_of_tid = np.array([kinds.index(kind_of(t["name"])) for t in tensors], np.int64)

    def tids(lo, hi):
        first = int(np.searchsorted(offs, lo, "right") - 1)
        out = []
        t = first
        while t < len(tensors) and offs[t] < hi:
            out.append(np.full(min(offs[t + 1], hi) - max(offs[t], lo), 1536 * t, np.int32))
            t += 1
        return np.concatenate(out)

    def new_pair():
        p = Pair(len(tensors))
        p.kind_names = kinds
        p.kind_of_tid = kind_of_tid
        return p

    results = []
    state = np.zeros(N, np.int8)  # 3 * changed in the previous patch + last step sign
    for k in range(1, last + 1):
        t0 = time.time()
        A, B = slab(k - 1), slab(k)
        p = new_pair()
        for lo in range(0, N, CHUNK):
            hi = min(N, lo + CHUNK)
            st = state[lo:hi]
            chg, step = p.add(lo, np.asarray(A[lo:hi]), np.asarray(B[lo:hi]), st, tids(lo, hi),
                              True)
            st %= 3
            st[chg] = np.where(step[chg] > 0, 5, 4)
        r = p.finish(N, levels, dense_levels)
        r.update({"from": k - 1, "to": k, "seconds": time.time() - t0})
        results.append(r)
        print(f"  {os.path.basename(d)} v{k - 1}->v{k}: {r['fraction_changed']:.4%} changed, "
              f"{r['seconds']:.1f} s", file=sys.stderr, flush=True)
    del state
    spans = [(0, 8)] + ([(last - 8, last)] if last >= 16 else [])
    for u, v in spans:
        if v > last:
            continue
        t0 = time.time()
        A, B = slab(u), slab(v)
        P = slab(u - 8) if u >= 8 else None
        p = new_pair()
        for lo in range(0, N, CHUNK):
            hi = min(N, lo + CHUNK)
            a = np.asarray(A[lo:hi])
            if P is None:
                st = np.zeros(hi - lo, np.int8)
            else:
                ps = np.subtract(key(a), key(np.asarray(P[lo:hi])), dtype=np.int32)
                st = np.where(ps > 0, 5, np.where(ps < 0, 4, 0)).astype(np.int8)
            p.add(lo, a, np.asarray(B[lo:hi]), st, tids(lo, hi), True)
        r = p.finish(N, levels, dense_levels)
        r.update({"from": u, "to": v, "seconds": time.time() - t0})
        results.append(r)
        print(f"  {os.path.basename(d)} v{u}->v{v}: {r['fraction_changed']:.4%} changed",
              file=sys.stderr, flush=True)
    return {"case": os.path.basename(d), "elements": N, "versions": last, "pairs": results}


def summarize(case, levels):
    """totals over the consecutive pairs, and each 8-version pair on its own"""
    cons = [p for p in case["pairs"] if p["to"] - p["from"] == 1]
    rows = []

    def row(label, ps):
        nc = sum(p["changed"] for p in ps)
        ne = sum(p["elements"] for p in ps)
        r = {"label": label, "pairs": len(ps), "fraction_changed": nc / ne, "changed": nc}
        if not nc:
            return r
        for lv in levels:
            r[f"baseline_z{lv}"] = sum(p["baseline"][str(lv)]["bytes"] for p in ps) / nc
            r[f"keystep_z{lv}"] = sum(p["keystep"][str(lv)]["bytes"] for p in ps) / nc
        for lv in ps[0]["densemap"]:
            r[f"densemap_z{lv}"] = sum(p["densemap"][lv]["bytes"] for p in ps) / nc
        r[f"full_over_baseline_z{levels[-1]}"] = sum(p["full_bf16_bytes"] for p in ps) / (
            r[f"baseline_z{levels[-1]}"] * nc)
        r[f"gaps_z{levels[-1]}_bits"] = 8 * sum(p["baseline"][str(levels[-1])]["gaps"]
                                               for p in ps) / nc
        h = {k: sum(p["step_hist"][k] for p in ps) for k in ps[0]["step_hist"]}
        r["step_hist"] = {k: v / nc for k, v in h.items()}
        r["ideal"] = {c: sum(p["entropy_bits"][c]["changed_kt"] + p["entropy_bits"][c]["step_kt"]
                             for p in ps) / 8 / nc for c in CTX_SETS}
        r["static"] = {c: sum(p["entropy_bits"][c]["changed_static"]
                              + p["entropy_bits"][c]["step_static"] for p in ps) / 8 / nc
                       for c in CTX_SETS}
        r["bits_changed"] = {c: sum(p["entropy_bits"][c]["changed_kt"] for p in ps) / nc
                             for c in CTX_SETS}
        r["bits_step"] = {c: sum(p["entropy_bits"][c]["step_kt"] for p in ps) / nc
                          for c in CTX_SETS}
        r["bits_sign"] = {c: sum(p["entropy_bits"][c]["sign_kt"] for p in ps) / nc
                          for c in CTX_SETS}
        ge = [p["gap_entropy_bits"] for p in ps if "gap_entropy_bits" in p]
        w = [p["changed"] for p in ps if "gap_entropy_bits" in p]
        r["gap_bits"] = {k: sum(g[k] * x for g, x in zip(ge, w)) / sum(w)
                         for k in ("empirical_per_gap", "bitlength_plus_raw_per_gap")}
        return r

    rows.append(row("consecutive", cons))
    lv = str(levels[-1])
    for p in case["pairs"]:
        if p["to"] - p["from"] > 1:
            r = row(f"v{p['from']}->v{p['to']}", [p])
            # the same span as a chain of consecutive patches: what a worker that fetched
            # every version would have paid, against the one span patch
            chain = [q for q in cons if p["from"] < q["to"] <= p["to"]]
            if r.get("changed") and len(chain) == p["to"] - p["from"]:
                best = min(CTX_SETS, key=lambda c: r["ideal"][c])
                r["chain"] = {
                    "baseline_bytes": sum(q["baseline"][lv]["bytes"] for q in chain),
                    "span_baseline_bytes": p["baseline"][lv]["bytes"],
                    "ideal_bytes": sum(q["entropy_bits"][best]["changed_kt"]
                                       + q["entropy_bits"][best]["step_kt"] for q in chain) / 8,
                    "span_ideal_bytes": (p["entropy_bits"][best]["changed_kt"]
                                         + p["entropy_bits"][best]["step_kt"]) / 8,
                    "context": best}
            rows.append(r)
    return rows


SHORT = {"none": "none", "exp": "exp", "exp+prevchg": "e+pc", "exp+lastsign": "e+ls",
         "exp+prevchg+lastsign": "e+pc+ls", "tensor+exp+prevchg+lastsign": "t+e+pc+ls"}


def print_table(all_rows, levels, dense_level):
    lv0, lv1 = levels[0], levels[-1]
    print(f"{'case':<12} {'pairs':<11} {'changed':>8} {'base z' + str(lv0):>8} "
          f"{'base z' + str(lv1):>8} {'key z' + str(lv1):>8} {'dense z' + str(dense_level):>8} "
          f"{'|s|=1':>6} {'2':>6} {'>2':>6} " + " ".join(f"{SHORT[c]:>9}" for c in CTX_SETS)
          + f" {'ratio':>6}")
    for case, rows in all_rows:
        for r in rows:
            if not r.get("changed"):
                print(f"{case:<12} {r['label']:<11} {0:>8}")
                continue
            h = r["step_hist"]
            dense = r.get(f"densemap_z{dense_level}", float("nan"))
            best = min(r["ideal"].values())
            print(f"{case:<12} {r['label']:<11} {r['fraction_changed']:>8.4%} "
                  f"{r[f'baseline_z{lv0}']:>8.3f} {r[f'baseline_z{lv1}']:>8.3f} "
                  f"{r[f'keystep_z{lv1}']:>8.3f} {dense:>8.3f} {h['1']:>6.1%} {h['2']:>6.1%} "
                  f"{1 - h['1'] - h['2']:>6.1%} "
                  + " ".join(f"{r['ideal'][c]:>9.3f}" for c in CTX_SETS)
                  + f" {r[f'baseline_z{lv1}'] / best:>6.2f}")
    print("bytes per changed value. base: gap varints + new bf16 values, zstd; key: gap varints "
          "+ zigzag steps, zstd'd separately; dense: int8 step map, zstd; |s|: the step's size "
          "in units of the order-preserving image; then the ideal adaptive (KT) coder, changed "
          "bit + step symbol, per context set; ratio: base at the highest level over the best "
          "ideal\n")
    print(f"{'case':<12} {'pairs':<11} {'gaps z' + str(lv1):>8} {'H(gap)':>7} {'H(len)+':>7} "
          + " ".join(f"{'chg ' + SHORT[c]:>12}" for c in CTX_SETS[:5]) + " "
          + " ".join(f"{'step ' + SHORT[c]:>12}" for c in CTX_SETS[:5]) + " "
          + " ".join(f"{'sign ' + SHORT[c]:>12}" for c in CTX_SETS[:5]))
    for case, rows in all_rows:
        for r in rows:
            if not r.get("changed"):
                continue
            print(f"{case:<12} {r['label']:<11} {r[f'gaps_z{lv1}_bits']:>8.3f} "
                  f"{r['gap_bits']['empirical_per_gap']:>7.3f} "
                  f"{r['gap_bits']['bitlength_plus_raw_per_gap']:>7.3f} "
                  + " ".join(f"{r['bits_changed'][c]:>12.3f}" for c in CTX_SETS[:5]) + " "
                  + " ".join(f"{r['bits_step'][c]:>12.3f}" for c in CTX_SETS[:5]) + " "
                  + " ".join(f"{r['bits_sign'][c]:>12.3f}" for c in CTX_SETS[:5]))
    print("bits per changed value: the gap varints zstd'd; the empirical entropy of the gaps and "
          "of their bit length plus the raw bits below the top one; the changed bit (all "
          "elements' bits, per change), the step symbol and the step sign alone, each coded by "
          "the ideal adaptive coder per context set")
    spans = [(case, r) for case, rows in all_rows for r in rows if "chain" in r]
    if spans:
        print(f"\n{'case':<12} {'span':<11} {'base span':>10} {'base chain':>10} "
              f"{'ideal span':>10} {'ideal chain':>11}  (MB; chain: the consecutive patches)")
        for case, r in spans:
            c = r["chain"]
            print(f"{case:<12} {r['label']:<11} {c['span_baseline_bytes'] / 1e6:>10.3f} "
                  f"{c['baseline_bytes'] / 1e6:>10.3f} {c['span_ideal_bytes'] / 1e6:>10.3f} "
                  f"{c['ideal_bytes'] / 1e6:>11.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--cases", default="")
    ap.add_argument("--levels", default="3,19")
    ap.add_argument("--dense-levels", default="3")
    ap.add_argument("--json", default="")
    ap.add_argument("--table-only", action="store_true",
                    help="print the tables of OUT_DIR/measure.json (or --json) again")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    dense_big = [int(x) for x in a.dense_levels.split(",")]
    path = a.json or os.path.join(a.out_dir, "measure.json")
    if a.table_only:
        doc = json.load(open(path))
        print_table([(c["case"], summarize(c, doc["levels"])) for c in doc["cases"]
                     if not a.cases or c["case"] in a.cases.split(",")], doc["levels"],
                    doc.get("dense_levels", [3])[0])
        return
    names = a.cases.split(",") if a.cases else sorted(
        c for c in os.listdir(a.out_dir) if os.path.isfile(os.path.join(a.out_dir, c, "tensors.json")))
    out = {"levels": levels, "dense_levels": dense_big, "cases": []}
    all_rows = []
    for c in names:
        t0 = time.time()
        case = measure_case(os.path.join(a.out_dir, c), levels, dense_big)
        case["seconds"] = time.time() - t0
        case["summary"] = summarize(case, levels)
        out["cases"].append(case)
        all_rows.append((c, case["summary"]))
        print(f"{c}: measured in {case['seconds']:.0f} s", file=sys.stderr, flush=True)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    print_table(all_rows, levels, dense_big[0])
    print(f"json: {path}")


if __name__ == "__main__":
    main()
