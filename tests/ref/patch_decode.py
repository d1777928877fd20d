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

PROB_BITS, PROB_ONE, PROB_SHIFT, TOP = 12, 1 << 12, 5, 1 << 24
GAP_BITS, STEP_BITS, BUCKETS, LANES = 64, 17, 256, 4


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

    def bit(self, probs, i):
        p = probs[i]
        bound = (self.range >> PROB_BITS) * p
        if self.code < bound:
            self.range = bound
            probs[i] = p + ((PROB_ONE - p) >> PROB_SHIFT)
            b = 0
        else:
            self.code -= bound
            self.range -= bound
            probs[i] = p - (p >> PROB_SHIFT)
            b = 1
        while self.range < TOP:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self.byte()) & 0xFFFFFFFF
        return b


class Model:
    def __init__(self):
        half = PROB_ONE // 2
        self.gap_len = [[half] * GAP_BITS for _ in range(BUCKETS)]
        self.gap_bits = [[half] * GAP_BITS for _ in range(GAP_BITS)]
        self.sign = [half] * BUCKETS
        self.step_len = [[half] * STEP_BITS for _ in range(BUCKETS)]
        self.step_bits = [[half] * STEP_BITS for _ in range(STEP_BITS)]


def number(d, len_probs, bits_probs, max_len):
    n = 1
    while n < max_len and d.bit(len_probs, n - 1):
        n += 1
    x = 1
    for j in range(n - 2, -1, -1):
        x = (x << 1) | d.bit(bits_probs[n - 1], j)
    return x


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
            rem[c] = number(d, m.gap_len[k], m.gap_bits, GAP_BITS) - 1
            if rem[c]:
                rem[c] -= 1
                continue
        if got == want:
            sys.exit(f"section {sec}: more changes than the {want} declared")
        neg = d.bit(m.sign, k)
        mag = number(d, m.step_len[k], m.step_bits, STEP_BITS)
        nk = key(old) + (-mag if neg else mag)
        if not 0 <= nk <= 0xFFFF:
            sys.exit(f"section {sec}: a step outside bf16")
        slab[i] = from_key(nk)
        got += 1
        rem[c] = number(d, m.gap_len[k], m.gap_bits, GAP_BITS) - 1
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
    if version != 1 or flags or reserved or any(patch[104:128]):
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
            decode_section(slab, off, count, patch[payload:payload + nbytes], changed, s)
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
