#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_tables.c: the Unicode properties the tokenizer needs (letter,
number and White_Space classes for the pre-tokenizer patterns; canonical combining classes,
canonical decompositions and primary compositions for NFC) from Debian's `unicode-data` files.

Usage: python3 scripts/gen_unicode_tables.py [UNICODE_DIR] > src/tokenizer/unicode_tables.c
UNICODE_DIR defaults to /usr/share/unicode (apt-get install unicode-data). Only regenerating
needs the package; the build uses the committed output. Standard library only.
"""
import os
import re
import sys

NCP = 0x110000
BLOCK = 256
# Hangul syllables are decomposed and composed by arithmetic, not by table.
S_BASE, S_COUNT = 0xAC00, 11172

# property flags (keep in sync with src/tokenizer/tok_internal.h)
F_LETTER = 1   # General_Category L*
F_NUMBER = 2   # General_Category N*
F_SPACE = 4    # White_Space
F_DECOMP = 8   # has a canonical decomposition (Hangul syllables included)
F_INERT = 16   # ccc 0, no decomposition, never the second of a composition: NFC leaves it,
               # and nothing after it composes into anything before it


def fail(msg):
    sys.stderr.write("gen_unicode_tables: %s\n" % msg)
    sys.exit(1)


def read_lines(path):
    if not os.path.exists(path):
        fail("%s is missing (apt-get install unicode-data)" % path)
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                yield line


def main():
    udir = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
    ud_path = os.path.join(udir, "UnicodeData.txt")
    version = "unknown"
    ce_path = os.path.join(udir, "CompositionExclusions.txt")
    with open(ce_path, encoding="utf-8") as f:
        m = re.search(r"CompositionExclusions-(\d+\.\d+\.\d+)", f.readline())
        if m:
            version = m.group(1)

    gc = {}
    ccc = [0] * NCP
    decomp1 = {}  # single-level canonical decomposition
    range_start = None
    for line in read_lines(ud_path):
        fields = line.split(";")
        cp = int(fields[0], 16)
        name, cat, cc, dm = fields[1], fields[2], int(fields[3]), fields[5]
        if name.endswith(", First>"):
            range_start = cp
            continue
        if name.endswith(", Last>"):
            for c in range(range_start, cp + 1):
                gc[c] = cat
                ccc[c] = cc
            range_start = None
            continue
        gc[cp] = cat
        ccc[cp] = cc
        if dm and not dm.startswith("<"):
            decomp1[cp] = [int(x, 16) for x in dm.split()]

    space = set()
    for line in read_lines(os.path.join(udir, "PropList.txt")):
        rng, prop = [x.strip() for x in line.split(";")[:2]]
        if prop != "White_Space":
            continue
        a, _, b = rng.partition("..")
        for c in range(int(a, 16), int(b or a, 16) + 1):
            space.add(c)
    if not space:
        fail("no White_Space entries in PropList.txt")

    excluded = set()
    for line in read_lines(ce_path):
        rng = line.split(";")[0].strip()
        a, _, b = rng.partition("..")
        for c in range(int(a, 16), int(b or a, 16) + 1):
            excluded.add(c)

    def full_decomp(c):
        if c not in decomp1:
            return [c]
        out = []
        for d in decomp1[c]:
            out.extend(full_decomp(d))
        return out

    decomp = {c: full_decomp(c) for c in decomp1}
    # Primary composites: canonical pairs that are not fully excluded (script-specific and
    # post-composition-version exclusions, singletons, non-starter decompositions).
    comps = []
    for c, d in decomp1.items():
        if len(d) != 2 or c in excluded or ccc[c] != 0 or ccc[d[0]] != 0:
            continue
        comps.append((d[0], d[1], c))
    comps.sort()
    seconds = {s for _, s, _ in comps}

    # Cross-check against the derived property when the file is there.
    dnp = os.path.join(udir, "DerivedNormalizationProps.txt")
    if os.path.exists(dnp):
        fce = set()
        for line in read_lines(dnp):
            parts = [x.strip() for x in line.split(";")]
            if parts[1] != "Full_Composition_Exclusion":
                continue
            a, _, b = parts[0].partition("..")
            for c in range(int(a, 16), int(b or a, 16) + 1):
                fce.add(c)
        mine = {c for c in decomp1 if c not in {x for _, _, x in comps}}
        if mine != fce:
            fail("composition exclusions differ from Full_Composition_Exclusion: %s"
                 % sorted(mine ^ fce)[:10])

    max_len = max(len(d) for d in decomp.values())
    if max_len > 4:
        fail("a canonical decomposition has %d code points; the C code assumes <= 4" % max_len)

    # Hangul: jamo V and T are seconds of compositions; syllables decompose.
    for c in range(0x1161, 0x1176):
        seconds.add(c)
    for c in range(0x11A8, 0x11C3):
        seconds.add(c)

    props = {}  # (ccc, flags) -> index
    prop_list = []
    cp_prop = bytearray(NCP)
    for c in range(NCP):
        cat = gc.get(c, "Cn")
        flags = 0
        if cat[0] == "L":
            flags |= F_LETTER
        if cat[0] == "N":
            flags |= F_NUMBER
        if c in space:
            flags |= F_SPACE
        if c in decomp or S_BASE <= c < S_BASE + S_COUNT:
            flags |= F_DECOMP
        if ccc[c] == 0 and not flags & F_DECOMP and c not in seconds:
            flags |= F_INERT
        key = (ccc[c], flags)
        if key not in props:
            props[key] = len(prop_list)
            prop_list.append(key)
        cp_prop[c] = props[key]
    if len(prop_list) > 256:
        fail("%d distinct property sets do not fit a byte" % len(prop_list))

    blocks = {}
    block_list = []
    stage1 = []
    for b in range(NCP // BLOCK):
        chunk = bytes(cp_prop[b * BLOCK:(b + 1) * BLOCK])
        if chunk not in blocks:
            blocks[chunk] = len(block_list)
            block_list.append(chunk)
        stage1.append(blocks[chunk])
    if len(block_list) > 65535:
        fail("too many blocks")

    dec_items = sorted(decomp.items())
    pool = []
    dec_index = []
    for c, d in dec_items:
        dec_index.append((c, len(pool), len(d)))
        pool.extend(d)
    if len(pool) >= 1 << 14:
        fail("decomposition pool too large for 14-bit offsets")

    w = sys.stdout.write
    w("/* GENERATED by scripts/gen_unicode_tables.py from Unicode %s (Debian unicode-data):\n"
      " * do not edit. Per code point: General_Category L/N, White_Space, canonical combining\n"
      " * class, NFC flags; canonical decompositions (fully expanded) and primary compositions. */\n"
      % version)
    w('#include "tok_internal.h"\n\n/* clang-format off */\n')
    w("const char lh__tok_unicode_version[] = \"%s\";\n\n" % version)
    w("const lh__tok_uprop lh__tok_uprops[%d] = {\n" % len(prop_list))
    for cc, fl in prop_list:
        w("    {%d, %d},\n" % (cc, fl))
    w("};\n\n")
    w("const uint16_t lh__tok_ustage1[%d] = {\n" % len(stage1))
    for i in range(0, len(stage1), 16):
        w("    " + ", ".join(str(x) for x in stage1[i:i + 16]) + ",\n")
    w("};\n\n")
    w("const uint8_t lh__tok_ustage2[%d] = {\n" % (len(block_list) * BLOCK))
    for chunk in block_list:
        for i in range(0, BLOCK, 32):
            w("    " + ",".join(str(x) for x in chunk[i:i + 32]) + ",\n")
    w("};\n\n")
    w("const lh__tok_decomp lh__tok_decomps[%d] = {\n" % len(dec_index))
    for c, off, n in dec_index:
        w("    {0x%05X, %d, %d},\n" % (c, off, n))
    w("};\n")
    w("const size_t lh__tok_n_decomps = %d;\n\n" % len(dec_index))
    w("const uint32_t lh__tok_decomp_pool[%d] = {\n" % len(pool))
    for i in range(0, len(pool), 8):
        w("    " + ", ".join("0x%05X" % x for x in pool[i:i + 8]) + ",\n")
    w("};\n\n")
    w("const lh__tok_comp lh__tok_comps[%d] = {\n" % len(comps))
    for a, b, c in comps:
        w("    {0x%05X, 0x%05X, 0x%05X},\n" % (a, b, c))
    w("};\n")
    w("const size_t lh__tok_n_comps = %d;\n" % len(comps))
    w("/* clang-format on */\n")


if __name__ == "__main__":
    main()
