#!/usr/bin/env python3
"""Merge JSON-lines rows of `quattn bench --json [--peers]` and `demos/peers/torch_sdpa.py` into
one markdown table: TFLOP/s per (head dim, seq, causal) and kernel, with ratios against torch's
flash (FlashAttention-2) backend measured in the same device call.

usage: python3 benchmarks/table.py FILE.jsonl [FILE.jsonl ...]
"""
import json
import re
import sys
from collections import OrderedDict


def rows(paths):
    for p in paths:
        for line in open(p):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("mode") == "accuracy" or not r.get("tflops"):
                continue
            yield r


def family(r):
    """Kernel family without the head-dim suffix or peer tiling, so each becomes one column."""
    k = r["kernel"]
    if k.startswith("cubek-attention"):
        return "cubek-attention"
    if k.startswith("torch"):
        return k
    return f'{re.sub(r"_d[0-9]+(?=$| )", "", k)} [{r["precision"]}]'


def main(paths):
    table = OrderedDict()
    kernels = OrderedDict()
    for r in rows(paths):
        s = r["shape"]
        key = (s["head_dim"], s["seq"], s["causal"])
        name = family(r)
        table.setdefault(key, {})[name] = r["tflops"]
        kernels[name] = None
    names = list(kernels)
    print("| hd | seq | causal | " + " | ".join(names) + " |")
    print("|---" * (3 + len(names)) + "|")
    for (hd, seq, causal), vals in sorted(table.items()):
        base = vals.get("torch-sdpa-flash")
        cells = []
        for n in names:
            v = vals.get(n)
            if v is None:
                cells.append("–")
            elif base and not n.startswith("torch-sdpa-flash"):
                cells.append(f"{v:.1f} ({v / base:.2f}×)")
            else:
                cells.append(f"{v:.1f}")
        print(f"| {hd} | {seq} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
