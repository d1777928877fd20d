#!/usr/bin/env python3
"""Prints a SHA-256 digest of the tensors of a safetensors file: every tensor's name, dtype,
shape and data bytes, in name order, so the digest does not depend on the file's layout or its
metadata. With --only PREFIX,... just the tensors whose names start with one of the prefixes.
Used by tests/integration/regress.sh; independent of longhaul's own reader."""
import hashlib
import json
import struct
import sys


def digest(path, only=None):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    body = data[8 + hlen :]
    h = hashlib.sha256()
    for name in sorted(k for k in header if k != "__metadata__"):
        if only and not any(name.startswith(p) for p in only):
            continue
        t = header[name]
        a, b = t["data_offsets"]
        h.update(json.dumps([name, t["dtype"], t["shape"]]).encode())
        h.update(body[a:b])
    return h.hexdigest()


if __name__ == "__main__":
    args = sys.argv[1:]
    only = None
    if len(args) == 3 and args[0] == "--only":
        only = args[1].split(",")
        args = args[2:]
    if len(args) != 1:
        sys.exit("usage: st_digest.py [--only PREFIX,...] FILE.safetensors")
    print(digest(args[0], only))
