#!/usr/bin/env python3
"""An independent implementation of docs/PROTOCOL.md's keys, manifests and snapshots, written
from that page alone: Ed25519 in pure Python (RFC 8032, section 6), BLAKE2b-256 from hashlib,
zstd through the `zstd` command (Debian's zstd package). No longhaul code is used.

  sync_ref.py make DIR                 writes the committed fixtures (tests/fixtures/sync)
  sync_ref.py public SECRET            prints the public key line of a secret key file
  sync_ref.py sign SECRET IN OUT       signs an unsigned manifest (JSON) into OUT
  sync_ref.py verify PUBLIC MANIFEST   verifies a signed manifest, prints version and slab
  sync_ref.py snapshot-decode FILE     decodes a snapshot, checks its hash, prints n and hash
  sync_ref.py snapshot-encode N OUT    writes the snapshot of the fixture slab of N values

Every refusal exits 1 with one line "sync_ref: REASON" on stderr."""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

# ------------------------------------------------------------------ Ed25519 (RFC 8032, 5.1, 6)
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _sha512(b):
    return hashlib.sha512(b).digest()


def _add(p, q):
    a = (p[1] - p[0]) * (q[1] - q[0]) % P
    b = (p[1] + p[0]) * (q[1] + q[0]) % P
    c = 2 * p[3] * q[3] * D % P
    d = 2 * p[2] * q[2] % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _mul(s, p):
    q = (0, 1, 1, 0)
    while s > 0:
        if s & 1:
            q = _add(q, p)
        p = _add(p, p)
        s >>= 1
    return q


def _equal(p, q):
    return (p[0] * q[2] - q[0] * p[2]) % P == 0 and (p[1] * q[2] - q[1] * p[2]) % P == 0


def _recover_x(y, sign):
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P)
    if x2 % P == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P != 0:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P != 0:
        return None
    if (x & 1) != sign:
        x = P - x
    return x


_GY = 4 * pow(5, P - 2, P) % P
_GX = _recover_x(_GY, 0)
G = (_GX, _GY, 1, _GX * _GY % P)


def _compress(p):
    zi = pow(p[2], P - 2, P)
    x, y = p[0] * zi % P, p[1] * zi % P
    return int.to_bytes(y | ((x & 1) << 255), 32, "little")


def _decompress(s):
    y = int.from_bytes(s, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


def _expand(seed):
    h = _sha512(seed)
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    return a, h[32:]


def ed25519_public(seed):
    return _compress(_mul(_expand(seed)[0], G))


def ed25519_sign(seed, msg):
    a, prefix = _expand(seed)
    pub = _compress(_mul(a, G))
    r = int.from_bytes(_sha512(prefix + msg), "little") % L
    rs = _compress(_mul(r, G))
    h = int.from_bytes(_sha512(rs + pub + msg), "little") % L
    return rs + int.to_bytes((r + h * a) % L, 32, "little")


def ed25519_verify(pub, msg, sig):
    if len(pub) != 32 or len(sig) != 64:
        return False
    a = _decompress(pub)
    r = _decompress(sig[:32])
    s = int.from_bytes(sig[32:], "little")
    if a is None or r is None or s >= L:
        return False
    h = int.from_bytes(_sha512(sig[:32] + pub + msg), "little") % L
    return _equal(_mul(s, G), _add(r, _mul(h, a)))


# ------------------------------------------------------------------ helpers
class Refused(Exception):
    pass


def blake(b):
    return hashlib.blake2b(b, digest_size=32).digest()


HEX = set("0123456789abcdef")


def unhex(s, n, field):
    if not isinstance(s, str) or len(s) != 2 * n or not set(s) <= HEX:
        raise Refused(f"{field}: expected {2 * n} lowercase hex digits")
    return bytes.fromhex(s)


# ------------------------------------------------------------------ keys
PUB_PREFIX = b"longhaul-ed25519-public-v1 "
SEC_PREFIX = b"longhaul-ed25519-secret-v1 "


def parse_key(data, prefix):
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data.startswith(prefix) or len(data) != len(prefix) + 64:
        raise Refused(f"not a key line starting {prefix.decode()!r}")
    return unhex(data[len(prefix):].decode("ascii", "replace"), 32, "key")


def key_line(prefix, key):
    return prefix + key.hex().encode() + b"\n"


# ------------------------------------------------------------------ manifests
CONTEXT = b"longhaul-manifest-v1\n"
INT_MAX = 2**53 - 1
TOP = {"blobs", "config", "elements", "format", "generation", "key", "parent", "signature", "slab",
       "tokenizer", "version"}


def canonical(v):
    """The canonical JSON of a value: no whitespace, members sorted by name, decimal integers,
    strings without escapes (a manifest's strings never need one), null."""
    if v is None:
        return b"null"
    if isinstance(v, bool):
        raise Refused("booleans do not occur in manifests")
    if isinstance(v, int):
        return str(v).encode()
    if isinstance(v, str):
        if any(c in '"\\' or ord(c) < 0x20 or ord(c) > 0x7e for c in v):
            raise Refused("a string that would need an escape")
        return b'"' + v.encode() + b'"'
    if isinstance(v, list):
        return b"[" + b",".join(canonical(x) for x in v) + b"]"
    if isinstance(v, dict):
        return b"{" + b",".join(canonical(k) + b":" + canonical(v[k]) for k in sorted(v)) + b"}"
    raise Refused(f"a {type(v).__name__} does not occur in manifests")


def no_dup(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise Refused(f"duplicate member {k!r}")
        d[k] = v
    return d


def check_int(v, lo, field):
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= INT_MAX:
        raise Refused(f"{field}: expected an integer in {lo} .. 2^53-1")
    return v


def check_manifest(m, signed):
    """The schema and rules of a manifest; returns it with its blobs sorted by hash."""
    if not isinstance(m, dict):
        raise Refused("not an object")
    if m.get("format") != 1:
        raise Refused(f"format {m.get('format')!r}, expected 1")
    want = TOP if signed else TOP - {"key", "signature"}
    if set(m) != want:
        raise Refused(f"fields {sorted(m)}, expected {sorted(want)}")
    v = check_int(m["version"], 0, "version")
    if m["parent"] is not None and check_int(m["parent"], 0, "parent") >= v:
        raise Refused("parent is not older than version")
    check_int(m["elements"], 1, "elements")
    for f in ("slab", "config"):
        unhex(m[f], 32, f)
    for f in ("tokenizer", "generation"):
        if m[f] is not None:
            unhex(m[f], 32, f)
    if signed:
        unhex(m["key"], 32, "key")
        unhex(m["signature"], 64, "signature")
    blobs = m["blobs"]
    if not isinstance(blobs, list) or not 1 <= len(blobs) <= 64:
        raise Refused("blobs: expected 1 .. 64")
    froms, hashes, snapshots = set(), set(), 0
    for b in blobs:
        if not isinstance(b, dict) or b.get("kind") not in ("snapshot", "patch"):
            raise Refused("a blob is not a snapshot or a patch")
        keys = {"hash", "kind", "size"} | ({"from"} if b["kind"] == "patch" else set())
        if set(b) != keys:
            raise Refused(f"blob fields {sorted(b)}, expected {sorted(keys)}")
        unhex(b["hash"], 32, "blob hash")
        check_int(b["size"], 1, "blob size")
        if b["kind"] == "snapshot":
            snapshots += 1
        else:
            if check_int(b["from"], 0, "from") >= v or b["from"] in froms:
                raise Refused("a patch from a version not older, or two from one")
            froms.add(b["from"])
        if b["hash"] in hashes:
            raise Refused("one hash twice")
        hashes.add(b["hash"])
    if snapshots > 1:
        raise Refused("two snapshots")
    return dict(m, blobs=sorted(blobs, key=lambda b: b["hash"]))


def sign_manifest(m, seed):
    m = check_manifest(dict(m, key=ed25519_public(seed).hex(), signature="0" * 128), True)
    del m["signature"]
    sig = ed25519_sign(seed, CONTEXT + canonical(m))
    return canonical(dict(m, signature=sig.hex()))


def verify_manifest(data, pinned):
    if len(data) > 65536:
        raise Refused("more than 65536 bytes")
    try:
        m = json.loads(data.decode("utf-8"), object_pairs_hook=no_dup)
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(f"not JSON: {e}")
    m = check_manifest(m, True)
    if canonical(m) != data:
        raise Refused("not in canonical form")
    if unhex(m["key"], 32, "key") != pinned:
        raise Refused("signed by another key than the pinned one")
    body = {k: v for k, v in m.items() if k != "signature"}
    if not ed25519_verify(pinned, CONTEXT + canonical(body), bytes.fromhex(m["signature"])):
        raise Refused("the signature does not verify")
    return m


# ------------------------------------------------------------------ snapshots
def zstd(args, data):
    r = subprocess.run(["zstd", "-q", *args], input=data, capture_output=True)
    if r.returncode != 0:
        raise Refused(f"zstd: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def snapshot_decode(blob):
    if len(blob) < 64 or blob[:4] != b"LHSN":
        raise Refused("not a snapshot (magic)")
    fmt, res, n, payload = struct.unpack_from("<HHQQ", blob, 4)
    if fmt != 1 or res != 0 or any(blob[56:64]) or n < 1 or payload != len(blob) - 64:
        raise Refused("bad snapshot header")
    planes = zstd(["-d", "-c"], blob[64:])
    if len(planes) != 2 * n:
        raise Refused(f"the frame holds {len(planes)} bytes, expected {2 * n}")
    slab = bytearray(2 * n)
    slab[1::2] = planes[:n]  # high bytes
    slab[0::2] = planes[n:]  # low bytes
    if blake(bytes(slab)) != blob[24:56]:
        raise Refused("the slab does not hash to the header's hash")
    return bytes(slab)


def snapshot_encode(slab):
    n = len(slab) // 2
    planes = slab[1::2] + slab[0::2]
    with tempfile.TemporaryDirectory() as d:  # from a file, zstd records the content size
        path = os.path.join(d, "planes")
        with open(path, "wb") as f:
            f.write(planes)
        frame = subprocess.run(["zstd", "-q", "-3", "-c", "--no-check", path], check=True,
                               capture_output=True).stdout
    return b"LHSN" + struct.pack("<HHQQ", 1, 0, n, len(frame)) + blake(slab) + bytes(8) + frame


def fixture_slab(n):
    """Value i is the high 16 bits of (i * 2654435761) mod 2^32, little-endian."""
    return b"".join(struct.pack("<H", (i * 2654435761 % 2**32) >> 16) for i in range(n))


# ------------------------------------------------------------------ fixtures
FIXTURE_SEED = blake(b"longhaul test trainer key: never use it for a real run")
FIXTURE_N = 4099


def make(d):
    os.makedirs(d, exist_ok=True)

    def write(name, data):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)

    write("trainer.key", key_line(SEC_PREFIX, FIXTURE_SEED))
    write("trainer.pub", key_line(PUB_PREFIX, ed25519_public(FIXTURE_SEED)))
    slab = fixture_slab(FIXTURE_N)
    snap = snapshot_encode(slab)
    write("snapshot.lhsn", snap)
    m7 = {"format": 1, "version": 7, "parent": 6, "elements": FIXTURE_N,
          "slab": blake(slab).hex(), "config": blake(b"{}").hex(),
          "tokenizer": blake(b"tokenizer").hex(), "generation": blake(b"generation").hex(),
          "blobs": [{"kind": "snapshot", "hash": blake(snap).hex(), "size": len(snap)},
                    {"kind": "patch", "from": 6, "hash": blake(b"patch 6-7").hex(), "size": 123},
                    {"kind": "patch", "from": 3, "hash": blake(b"patch 3-7").hex(), "size": 456}]}
    write("manifest7.json", sign_manifest(m7, FIXTURE_SEED))
    m0 = {"format": 1, "version": 0, "parent": None, "elements": 1,
          "slab": blake(b"\0\0").hex(), "config": blake(b"{}").hex(), "tokenizer": None,
          "generation": None,
          "blobs": [{"kind": "snapshot", "hash": blake(b"s0").hex(), "size": 66}]}
    write("manifest0.json", sign_manifest(m0, FIXTURE_SEED))


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    try:
        if cmd == "make":
            make(args[0])
        elif cmd == "public":
            seed = parse_key(read(args[0]), SEC_PREFIX)
            sys.stdout.buffer.write(key_line(PUB_PREFIX, ed25519_public(seed)))
        elif cmd == "sign":
            seed = parse_key(read(args[0]), SEC_PREFIX)
            m = json.loads(read(args[1]), object_pairs_hook=no_dup)
            with open(args[2], "wb") as f:
                f.write(sign_manifest(m, seed))
        elif cmd == "verify":
            m = verify_manifest(read(args[1]), parse_key(read(args[0]), PUB_PREFIX))
            print(f"version {m['version']} slab {m['slab']}")
        elif cmd == "snapshot-decode":
            slab = snapshot_decode(read(args[0]))
            print(f"elements {len(slab) // 2} slab {blake(slab).hex()}")
        elif cmd == "snapshot-encode":
            with open(args[1], "wb") as f:
                f.write(snapshot_encode(fixture_slab(int(args[0]))))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Refused as e:
        print(f"sync_ref: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
