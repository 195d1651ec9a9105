#!/usr/bin/env python3
"""ACCURACY.md's tables from `quattn selftest --json` and `torch_sdpa.py --accuracy` output:
worst error per (device, precision, kernel) over the selftest's shapes.

usage: python3 benchmarks/accuracy_table.py selftest.jsonl [torch_acc.jsonl]
"""
import json
import sys
from collections import OrderedDict


def selftest(path):
    agg = OrderedDict()
    for line in open(path):
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        # Rows without attention metrics (the prepass operand checks) have no error to tabulate.
        if d["status"] != "pass" or d.get("accuracy") is None:
            continue
        a = d["accuracy"]
        dev = d["device"] if d["strategy"] != "Reference" else "cpu (emulation)"
        w = agg.setdefault((dev, d["precision"], d["kernel"].rsplit("_d", 1)[0]), [0, 0.0, 1.0, 0.0, 0.0, None])
        w[0] += 1
        w[1] = max(w[1], a["rel_l2"])
        w[2] = min(w[2], a["cos_sim"])
        w[3] = max(w[3], a["max_abs"])
        w[4] = max(w[4], a["lse_max_abs"] or 0.0)
        if d.get("vs_emulation_rel_l2") is not None:
            w[5] = max(w[5] or 0.0, d["vs_emulation_rel_l2"])
    print("| device | precision | kernel | cases | worst rel-L2 | worst cos-sim | worst max-abs | worst LSE abs err | worst rel-L2 vs emulation |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (dev, prec, kernel), w in agg.items():
        emu = "–" if w[5] is None else f"{w[5]:.2e}"
        print(f"| {dev} | {prec} | `{kernel}` | {w[0]} | {w[1]:.2e} | {w[2]:.7f} | {w[3]:.2e} | {w[4]:.2e} | {emu} |")


def torch(path):
    print("| backend | causal | rel-L2 | cos-sim | max-abs |")
    print("|---|---|---|---|---|")
    for line in open(path):
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d.get("skipped"):
            continue
        causal = "yes" if d["shape"]["causal"] else "no"
        print(f"| {d['kernel']} | {causal} | {d['rel_l2']:.2e} | {d['cos_sim']:.7f} | {d['max_abs']:.2e} |")


if __name__ == "__main__":
    selftest(sys.argv[1])
    if len(sys.argv) > 2:
        print()
        torch(sys.argv[2])
