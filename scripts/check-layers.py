#!/usr/bin/env python3
"""Checks the module layering of DESIGN.md on the built static libraries: every lh_ symbol a
module's objects use but do not define must be defined by a module it may see (its LH_DEPS_*
in CMakeLists.txt, transitively). A static link resolves a wrong-way call whenever the callee
comes later on the link line, so the link alone does not catch it; this test does.
Usage: check-layers.py LAYERS_FILE LIB_DIR  (LAYERS_FILE: one "module: dep dep ..." per line)"""
import os
import subprocess
import sys


def symbols(lib, undefined):
    args = ["nm", "-g", "-P"] + (["-u"] if undefined else ["--defined-only"]) + [lib]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        if f and not f[0].endswith(":") and f[0].startswith("lh_"):
            names.add(f[0])
    return names


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    deps = {}
    for line in open(sys.argv[1]):
        if ":" in line:
            mod, rest = line.split(":", 1)
            deps[mod.strip()] = [d for d in rest.replace(";", " ").split() if d.startswith("lh_")]
    mods = list(deps)
    defined, used = {}, {}
    for m in mods:
        lib = os.path.join(sys.argv[2], f"liblh_{m}.a")
        defined[m] = symbols(lib, False)
        used[m] = symbols(lib, True) - defined[m]

    def closure(m, seen=None):
        seen = set() if seen is None else seen
        for d in deps[m]:
            d = d[len("lh_"):]
            if d not in seen:
                seen.add(d)
                closure(d, seen)
        return seen

    owner = {s: m for m in mods for s in defined[m]}
    bad = []
    for m in mods:
        allowed = closure(m)
        for s in sorted(used[m]):
            o = owner.get(s)
            if o is not None and o not in allowed:
                bad.append(f"  {m} calls {s}, which belongs to {o}: {m} may see only "
                           f"{', '.join(sorted(allowed)) or 'nothing'}")
    if bad:
        print("check-layers: calls against the module direction:")
        print("\n".join(bad))
        sys.exit(1)
    print(f"check-layers: {len(mods)} modules, every call goes along the direction")


if __name__ == "__main__":
    main()
