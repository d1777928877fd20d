#!/usr/bin/env python3
"""Runs a command and prints its stdout with the command's peak resident memory added to each
JSON line ("peak_rss_bytes", from the kernel's accounting of the finished child), for
bench/generate.sh.   peak_rss.py CMD [ARG...]"""
import json
import resource
import subprocess
import sys

if len(sys.argv) < 2:
    sys.exit("usage: peak_rss.py CMD [ARG...]")
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
for line in p.stdout.splitlines():
    if line.strip().startswith("{"):
        r = json.loads(line)
        r["peak_rss_bytes"] = rss
        line = json.dumps(r)
    print(line)
sys.exit(p.returncode)
