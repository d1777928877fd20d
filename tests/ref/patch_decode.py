#!/usr/bin/env python3
"""An independent decoder of longhaul's policy patches, written from docs/PROTOCOL.md ("Policy
patches") alone: applies a patch to a bf16 policy and checks both BLAKE2b-256 hashes.
Usage: patch_decode.py PARENT PATCH [OUT]
PARENT is a model directory (its model.safetensors, bf16: tensors concatenated in file order
are the slab) or a raw slab file (.bf16, little-endian uint16). Prints the versions, the changes
and "ok"; exits 1 with a message when a hash or the stream is wrong. OUT gets the child slab."""
import hashlib
import json
import os
import struct
import sys

TOP, FREQ_INC, FREQ_MAX = 1 << 24, 32, 1 << 16
GAP_SYMS, TOP_BITS, STEP_EXACT, BUCKETS, LANES = 64, 1, 8, 256, 4
STEP_SYMS = 2 * (STEP_EXACT + 13)


def read_slab(path):
    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            data = f.read()
        (hlen,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + hlen])
        body = data[8 + hlen:]
        tensors = sorted((v["data_offsets"], k, v["dtype"]) for k, v in header.items()
                         if k != "__metadata__")
        parts = []
        for (a, b), name, dtype in tensors:
            if dtype != "BF16":
                sys.exit(f"{path}: tensor {name} is {dtype}, expected BF16")
            parts.append(body[a:b])
        raw = b"".join(parts)
    else:
        with open(path, "rb") as f:
            raw = f.read()
    return list(struct.unpack(f"<{len(raw) // 2}H", raw))


def key(b):
    return (~b & 0xFFFF) if b & 0x8000 else b | 0x8000


def from_key(k):
    return k & 0x7FFF if k & 0x8000 else ~k & 0xFFFF


class Decoder:
    def __init__(self, buf):
        self.buf, self.pos, self.overrun = buf, 0, 0
        self.range, self.code = 0xFFFFFFFF, 0
        for _ in range(5):
            self.code = ((self.code << 8) | self.byte()) & 0xFFFFFFFF

    def byte(self):
        if self.pos < len(self.buf):
            self.pos += 1
            return self.buf[self.pos - 1]
        self.overrun += 1
        return 0

    def point(self, total):
        r = self.range // total
        v = self.code // r
        if v >= total:
            raise ValueError("a corrupted stream")
        return r, v

    def take(self, r, c, f):
        self.code -= r * c
        self.range = r * f
        while self.range < TOP:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self.byte()) & 0xFFFFFFFF

    def symbol(self, table):
        f = table.freq
        r, v = self.point(table.total)
        s, c = 0, 0
        while c + f[s] <= v:
            c += f[s]
            s += 1
        self.take(r, c, f[s])
        table.adapt(s)
        return s

    def raw(self, bits):
        x = 0
        while bits > 0:
            w = min(bits, 16)
            bits -= w
            r, v = self.point(1 << w)
            self.take(r, v, 1)
            x = (x << w) | v
        return x


class Table:
    """An adaptive frequency table: every symbol starts at 1; a coded symbol gains FREQ_INC; when
    the total passes FREQ_MAX - FREQ_INC all are halved, rounding up."""

    def __init__(self, n):
        self.freq, self.total = [1] * n, n

    def adapt(self, s):
        self.freq[s] += FREQ_INC
        self.total += FREQ_INC
        if self.total > FREQ_MAX - FREQ_INC:
            self.freq = [(f + 1) >> 1 for f in self.freq]
            self.total = sum(self.freq)


def top_bits(length):
    return min(length - 1, TOP_BITS)


class Model:
    def __init__(self):
        self.gap_len = [Table(GAP_SYMS) for _ in range(BUCKETS)]
        self.gap_top = [Table(1 << top_bits(L)) if L else None for L in range(GAP_SYMS + 1)]
        self.step = [Table(STEP_SYMS) for _ in range(BUCKETS)]

    def gap(self, d, e):
        length = d.symbol(self.gap_len[e]) + 1
        t = top_bits(length)
        rest = length - 1 - t
        x = 1 << t
        if t:
            x |= d.symbol(self.gap_top[length])
        if rest:
            x = (x << rest) | d.raw(rest)
        return x - 1

    def step_of(self, d, e):
        s = d.symbol(self.step[e])
        c = s >> 1  # the magnitude's class
        a = c + 1
        if c >= STEP_EXACT:
            low = c - STEP_EXACT + 3  # a has low + 1 bits
            a = (1 << low) | d.raw(low)
            if a <= STEP_EXACT:
                raise ValueError("a long step of at most 8")
        return -a if s & 1 else a


def decode_section(slab, off, count, buf, want, sec):
    d, m = Decoder(buf), Model()
    # counters per (lane, exponent); element i of the section is in lane i % LANES
    rem, seen, got = [0] * (LANES * BUCKETS), [False] * (LANES * BUCKETS), 0
    for i in range(off, off + count):
        old = slab[i]
        k = (old >> 7) & 0xFF
        c = ((i - off) % LANES) * BUCKETS + k
        if rem[c]:
            rem[c] -= 1
            continue
        if not seen[c]:
            seen[c] = True
            rem[c] = m.gap(d, k)
            if rem[c]:
                rem[c] -= 1
                continue
        if got == want:
            sys.exit(f"section {sec}: more changes than the {want} declared")
        nk = key(old) + m.step_of(d, k)
        if not 0 <= nk <= 0xFFFF:
            sys.exit(f"section {sec}: a step outside bf16")
        slab[i] = from_key(nk)
        got += 1
        rem[c] = m.gap(d, k)
    if got != want or any(rem) or d.overrun > 4:
        sys.exit(f"section {sec}: {got} changes of {want}, or a bad stream")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    slab = read_slab(sys.argv[1])
    patch = open(sys.argv[2], "rb").read()
    if patch[:4] != b"LHPA":
        sys.exit("not a policy patch")
    version, flags, n_sections, reserved, n = struct.unpack_from("<HHIIQ", patch, 4)
    frm, to = struct.unpack_from("<qq", patch, 24)
    parent_hash, child_hash = patch[40:72], patch[72:104]
    if version != 2 or flags or reserved or any(patch[104:128]):
        sys.exit(f"format {version} or reserved fields set")
    if n != len(slab):
        sys.exit(f"the patch is for {n} values, the policy has {len(slab)}")
    raw = struct.pack(f"<{n}H", *slab)
    if hashlib.blake2b(raw, digest_size=32).digest() != parent_hash:
        sys.exit("the policy is not the patch's parent (BLAKE2b differs)")
    at, payload, total = 0, 128 + 40 * n_sections, 0
    for s in range(n_sections):
        off, count, changed, nbytes = struct.unpack_from("<QQQQ", patch, 128 + 40 * s)
        coding = patch[128 + 40 * s + 32]
        if off != at or any(patch[128 + 40 * s + 33:128 + 40 * s + 40]):
            sys.exit(f"section {s}: bad table entry")
        if coding == 1:
            try:
                decode_section(slab, off, count, patch[payload:payload + nbytes], changed, s)
            except (ValueError, IndexError) as e:
                sys.exit(f"section {s}: {e}")
        elif coding != 0 or changed or nbytes:
            sys.exit(f"section {s}: coding {coding}")
        at += count
        payload += nbytes
        total += changed
    if at != n or payload != len(patch):
        sys.exit("the sections do not cover the policy, or the length is wrong")
    raw = struct.pack(f"<{n}H", *slab)
    if hashlib.blake2b(raw, digest_size=32).digest() != child_hash:
        sys.exit("the result does not hash to the patch's child")
    if len(sys.argv) == 4:
        with open(sys.argv[3], "wb") as f:
            f.write(raw)
    print(f"patch_decode: version {frm} -> {to}: {total} of {n} values changed; both hashes ok")


if __name__ == "__main__":
    main()
