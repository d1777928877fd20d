"""What the benchmark scripts share: a torch peer's thread set-up, and reading the rounds back."""
import json
import os
import sys


def pin_threads(threads):
    """Sizes the peer's thread pools; call it before torch is imported, as its OpenMP pool and
    the BLAS it calls size themselves at start-up. threads 0 keeps the defaults (all cores).

    Debian's torch runs elementwise ops on its OpenMP pool and matmuls on OpenBLAS's own pthread
    pool. With OpenMP's default (active) waiting, idle OpenMP threads spin through every matmul
    and take the cores from BLAS: passive waiting makes training steps ~1.5x faster and batch-1
    decode 3x faster on 2 cores. The caller's OMP_WAIT_POLICY, when set, is kept."""
    if threads > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def runs(out, name, bench):
    """The JSON rows (one per round) that a program printed into OUT/NAME; exits if there are
    none. bench names the benchmark in the message."""
    with open(os.path.join(out, name)) as f:
        rows = [json.loads(l) for l in f.read().splitlines() if l.strip().startswith("{")]
    if not rows:
        sys.exit(f"{bench}: {name}: no JSON line in the output")
    return rows


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
