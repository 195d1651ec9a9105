#!/usr/bin/env python3
"""Regenerate BENCHMARKS.md, ACCURACY.md and benchmarks/plots/*.svg from raw run data.

Every number in those files comes from the JSON lines in a run folder
`benchmarks/<date>-<device>-<id>/` (`quattn bench --json`, `quattn selftest --json`,
`demos/peers/torch_sdpa.py`), plus the FMA peak probe's text output; `gpu.csv` names the
device and `run.sh` holds the commands. `benchmarks/current.json` (the manifest) says which run
folder feeds which table.

usage:
    python3 benchmarks/report.py            # rewrite BENCHMARKS.md, ACCURACY.md, plots
    python3 benchmarks/report.py --check    # exit 1 if regenerating would change any of them

Adding a new run:
  1. Put its folder under benchmarks/ (raw files as the tools wrote them, its run.sh and gpu.csv;
     a run folder is never edited afterwards).
  2. In benchmarks/current.json point the tables it replaces at the new folder (`run`, `files`,
     `commit`: the tree that was measured, or `git log --format=%h -1 -- benchmarks/<run>`), or
     add a new entry. `command` overrides the command read from run.sh where that is a loop;
     `build` keeps only the rows tagged with that build where a folder compares two builds.
  3. Run `python3 benchmarks/report.py` and commit the regenerated files with the folder.

Python 3 standard library only.
"""
import argparse
import json
import math
import os
import re
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MANIFEST = os.path.join(HERE, "current.json")
PLOTS = os.path.join(HERE, "plots")

# ---------------------------------------------------------------------------------------------
# Reading run folders


def jsonl(path):
    """The JSON objects of a JSON-lines file; other lines (logs, blank) are ignored."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def run_dir(run):
    return os.path.join(HERE, run)


def run_date(run):
    m = re.match(r"(\d{4}-\d{2}-\d{2})", run)
    return m.group(1) if m else "?"


def run_device(run, rows=()):
    """The GPU from gpu.csv (name, driver), else the adapter named in the rows."""
    p = os.path.join(run_dir(run), "gpu.csv")
    if os.path.exists(p):
        lines = [l.strip() for l in open(p, encoding="utf-8") if l.strip()]
        if len(lines) >= 2:
            cells = [c.strip() for c in lines[1].split(",")]
            dev = cells[0]
            if len(cells) > 1:
                dev += f", driver {cells[1]}"
            return dev
    for r in rows:
        if r.get("adapter"):
            return re.sub(r" \(.*\)$", "", r["adapter"])
    return "?"


def command_for(run, filename):
    """The command lines of run.sh that write `filename`, as a reader would type them."""
    p = os.path.join(run_dir(run), "run.sh")
    if not os.path.exists(p):
        return []
    cmds = []
    loop = None
    for line in open(p, encoding="utf-8"):
        s = line.strip()
        m = re.match(r"^for (\w+) in (.*); do$", s)
        if m:
            loop = m
        elif s.startswith("done"):
            loop = None
        if s.startswith("#") or not re.search(r"(>>?|tee) *\"\$out/" + re.escape(filename) + '"', s):
            continue
        s = s.split(f'"$out/{filename}"')[0]
        s = re.sub(r" *(2>&1)? *\| *tee *$", "", s)
        s = re.sub(r"^step [\w-]+; *", "", s)
        s = re.sub(r"timeout (\d+|\$\(lim \d+\)) +", "", s)
        s = s.replace('"$q"', "quattn").replace('"$qs"', "quattn-spirv")
        s = re.sub(r'"\$bin/([\w-]+)"', r"\1", s)
        s = re.sub(r" *2>>? *\"\$out/[\w.]+\"", "", s)
        s = re.sub(r" *\| *grep .*$", "", s)
        s = re.sub(r"^mkdir -p \S+; *", "", s)
        s = re.sub(r"^(\w+=\S+ )+", "", s)  # environment for the driver's shader cache
        s = re.sub(r" *>>? *$", "", s).strip()
        if loop and "$" + loop.group(1) in s:
            s = f"for {loop.group(1)} in {loop.group(2)}; do {s}; done"
        cmds.append(s)
    return cmds


def kernel_base(name):
    """Kernel name without its head-dim suffix (`fwd_wgmma_f16_d128` -> `fwd_wgmma_f16`)."""
    return re.sub(r"_d[0-9]+(?=$|_| )", "", name)


def fmt_e(x):
    return "–" if x is None else f"{x:.2e}"


def fmt_f(x, nd=1):
    return "–" if x is None else f"{x:.{nd}f}"


# ---------------------------------------------------------------------------------------------
# Speed


PEERS = ("torch-sdpa-flash", "torch-sdpa-cudnn")


def shape_key(s):
    return (s["head_dim"], s["seq"], s["kv_seq"], s["batch"], s["heads"], s["causal"], tuple(s.get("modifiers", ())))


def speed_table(entry):
    """Rows of one speed table: our kernels (and cubek-attention) with the torch peers of the
    same run folder at the same shape."""
    run = entry["run"]
    rows = []
    for fn in entry["files"]:
        for r in jsonl(os.path.join(run_dir(run), fn)):
            if r.get("mode") == "accuracy" or not r.get("tflops") or r.get("skipped"):
                continue
            if entry.get("devices") and r["device"] not in entry["devices"]:
                continue
            # A folder comparing two builds tags each row with its build; `build` picks one.
            if entry.get("build") and r.get("build") != entry["build"]:
                continue
            k = r["kernel"]
            if not k.startswith("torch") and entry.get("exclude") and re.search(entry["exclude"], k):
                continue
            # A folder measuring more than one table: `precisions` and `seqs` keep one's rows.
            if not k.startswith("torch") and entry.get("precisions") and r["precision"] not in entry["precisions"]:
                continue
            if entry.get("seqs") and r["shape"]["seq"] not in entry["seqs"]:
                continue
            rows.append(r)
    # A shape measured more than once in the folder (alternating runs): its fastest sample,
    # the statistic the run scripts compare.
    best = {}
    for r in rows:
        key = (r["kernel"], r["precision"], shape_key(r["shape"]))
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = r
    rows = list(best.values())
    peers = {}
    for r in rows:
        if r["kernel"] in PEERS:
            peers[(shape_key(r["shape"]), r["kernel"])] = r["tflops"]
    out = []
    for r in rows:
        if r["kernel"] in PEERS:
            continue
        key = shape_key(r["shape"])
        fl = peers.get((key, "torch-sdpa-flash"))
        cu = peers.get((key, "torch-sdpa-cudnn"))
        out.append({
            "device": r["device"], "kernel": kernel_base(r["kernel"]), "precision": r["precision"],
            "shape": r["shape"], "tflops": r["tflops"],
            "vs_flash": r["tflops"] / fl if fl else None, "vs_cudnn": r["tflops"] / cu if cu else None,
        })
    for (key, name), v in peers.items():
        shape = next(r["shape"] for r in rows if r["kernel"] == name and shape_key(r["shape"]) == key)
        if not any(shape_key(o["shape"]) == key for o in out):
            continue  # a peer shape none of our kernels ran at
        out.append({"device": "cuda", "kernel": name, "precision": "f16", "shape": shape, "tflops": v,
                    "vs_flash": None, "vs_cudnn": None})
    order = {}
    for o in out:
        order.setdefault(o["kernel"], len(order))
    peer_first = lambda o: (0 if o["kernel"] in PEERS else 1, PEERS.index(o["kernel"]) if o["kernel"] in PEERS else order[o["kernel"]])
    out.sort(key=lambda o: (o["shape"]["head_dim"], o["shape"]["seq"], o["shape"]["kv_seq"], o["shape"]["causal"],
                            tuple(o["shape"].get("modifiers", ()))) + peer_first(o))
    return out, rows


def speed_markdown(entry, out, rows):
    run = entry["run"]
    cmds = entry.get("command") or [c for fn in entry["files"] for c in command_for(run, fn)]
    if isinstance(cmds, str):
        cmds = [cmds]
    lines = [f"### {entry['title']}", ""]
    lines.append(f"Date {run_date(run)} · device {run_device(run, rows)} · commit `{entry['commit']}` · "
                 f"raw data `benchmarks/{run}/` ({', '.join('`' + f + '`' for f in entry['files'])})")
    lines.append("")
    if cmds:
        lines.append("```sh")
        lines.extend(cmds)
        lines.append("```")
        lines.append("")
    if entry.get("note"):
        lines.append(entry["note"])
        lines.append("")
    has_peers = any(o["kernel"] in PEERS for o in out)
    mods = any(o["shape"].get("modifiers") for o in out)
    head = f"| backend | kernel | precision | hd | seq | batch × heads | causal{', modifiers' if mods else ''} | TFLOP/s |"
    sep = "|---|---|---|---|---|---|---|---|"
    if has_peers:
        head += " × torch flash | × cuDNN |"
        sep += "---|---|"
    lines += [head, sep]
    for o in out:
        s = o["shape"]
        bold = o["kernel"] not in PEERS
        t = fmt_f(o["tflops"])
        # q_len x kv_len where they differ (decode shapes), else the one length.
        seq = str(s["seq"]) if s["seq"] == s["kv_seq"] else f"{s['seq']} × {s['kv_seq']}"
        causal = ("yes" if s["causal"] else "no") + "".join(f", {m}" for m in s.get("modifiers", ()))
        cells = [o["device"], f"`{o['kernel']}`", o["precision"], str(s["head_dim"]), seq,
                 f"{s['batch']} × {s['heads']}", causal, f"**{t}**" if bold else t]
        if has_peers:
            cells += [fmt_f(o["vs_flash"], 2), fmt_f(o["vs_cudnn"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    if not has_peers:
        lines.append("")
        lines.append("No torch peer ran in this run folder, so this table has no ratios.")
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# FMA peak probe (text output of `fma_peak_cuda` / `wgsl_fma_peak`)


def probe_rows(run, fn):
    rows = []
    for line in open(os.path.join(run_dir(run), fn), encoding="utf-8"):
        m = re.match(r"^(\S.*?)\s{2,}([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*(.*)$", line.rstrip())
        if m and not line.startswith(("form", "grid", "adapter", "device")):
            rows.append({"form": m.group(1), "ms": float(m.group(2)), "tflops": float(m.group(3)),
                         "rounding": m.group(5).strip()})
    return rows


def probe_header(run, fn):
    """The probe's own description lines: the device or adapter, and the launch geometry."""
    dev, geom = None, None
    for line in open(os.path.join(run_dir(run), fn), encoding="utf-8"):
        m = re.match(r"^(?:device|adapter): *(.*)$", line.strip(), re.I)
        if m and dev is None:
            dev = m.group(1)
        elif "threads" in line and geom is None:
            geom = line.strip()
    return dev, geom


def probe_markdown(entry):
    run = entry["run"]
    heads = [probe_header(run, p["file"]) for p in entry["parts"]]
    device = next((d for d, _ in heads if d), "?")
    device = re.sub(r" \(.*$", "", device)
    lines = [f"### {entry['title']}", ""]
    lines.append(f"Date {run_date(run)} · device {device} · commit `{entry['commit']}` · "
                 f"raw data `benchmarks/{run}/` ({', '.join('`' + p['file'] + '`' for p in entry['parts'])})")
    lines.append("")
    for part in entry["parts"]:
        cmd = part.get("command") or command_for(run, part["file"])
        lines.append("```sh")
        lines.extend([cmd] if isinstance(cmd, str) else cmd)
        lines.append("```")
    lines.append("")
    if entry.get("note"):
        lines += [entry["note"], ""]
    for part, (dev, geom) in zip(entry["parts"], heads):
        lines.append(f"- {part['label']}: {dev or '?'}; {geom or '?'}.")
    lines.append("")
    lines += ["| path | form | TFLOP/s |", "|---|---|---|"]
    for part in entry["parts"]:
        for r in probe_rows(run, part["file"]):
            lines.append(f"| {part['label']} | `{r['form']}` | {r['tflops']:.1f} |")
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# Accuracy


def selftest_summary(rows):
    n = {"pass": 0, "fail": 0, "skip": 0}
    for r in rows:
        if "status" in r:
            n[r["status"]] = n.get(r["status"], 0) + 1
    return n


def accuracy_agg(entry):
    """Worst error per (precision, kernel) over the selftest's cases in one file."""
    rows = jsonl(os.path.join(run_dir(entry["run"]), entry["file"]))
    want_ref = entry.get("emulation", False)
    agg = OrderedDict()
    for d in rows:
        if d.get("status") != "pass" or d.get("accuracy") is None:
            continue
        if (d["strategy"] == "Reference") != want_ref:
            continue
        a = d["accuracy"]
        key = (d["precision"], kernel_base(d["kernel"]))
        w = agg.setdefault(key, {"cases": 0, "rel_l2": 0.0, "cos_sim": 1.0, "max_abs": 0.0, "lse": None,
                                 "tol_rel_l2": a.get("tol_rel_l2"), "tol_cos_sim": a.get("tol_cos_sim"), "vs_emu": None})
        w["cases"] += 1
        w["rel_l2"] = max(w["rel_l2"], a["rel_l2"])
        w["cos_sim"] = min(w["cos_sim"], a["cos_sim"])
        w["max_abs"] = max(w["max_abs"], a["max_abs"])
        if a.get("lse_max_abs") is not None:
            w["lse"] = max(w["lse"] or 0.0, a["lse_max_abs"])
        if d.get("vs_emulation_rel_l2") is not None:
            w["vs_emu"] = max(w["vs_emu"] or 0.0, d["vs_emulation_rel_l2"])
    return agg, rows


def accuracy_markdown(entry, agg, rows, on_hardware=None):
    run = entry["run"]
    cmd = entry.get("command") or command_for(run, entry["file"])
    n = selftest_summary(rows)
    lines = [f"### {entry['title']}", ""]
    lines.append(f"Date {run_date(run)} · device {run_device(run, rows)} · commit `{entry['commit']}` · "
                 f"raw data `benchmarks/{run}/{entry['file']}` · selftest: {n['pass']} passed, "
                 f"{n['fail']} failed, {n['skip']} skipped")
    lines.append("")
    lines.append("```sh")
    lines.extend([cmd] if isinstance(cmd, str) else cmd)
    lines.append("```")
    lines.append("")
    if entry.get("note"):
        lines += [entry["note"], ""]
    if entry.get("emulation"):
        lines.append("| precision | emulation | cases | worst rel-L2 | worst cos-sim | worst max-abs | worst LSE abs err | tolerance rel-L2 / cos-sim | kernels |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
    else:
        lines.append("| precision | kernel | cases | worst rel-L2 | worst cos-sim | worst max-abs | worst LSE abs err | tolerance rel-L2 / cos-sim | worst rel-L2 vs emulation |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
    for (prec, kernel), w in agg.items():
        tol = f"{w['tol_rel_l2']:g} / {w['tol_cos_sim']:g}" if w["tol_rel_l2"] is not None else "–"
        last = fmt_e(w["vs_emu"])
        if entry.get("emulation"):
            last = "on hardware" if prec in (on_hardware or set()) else "not run on hardware"
        lines.append(f"| {prec} | `{kernel}` | {w['cases']} | {w['rel_l2']:.2e} | {w['cos_sim']:.7f} | "
                     f"{w['max_abs']:.2e} | {fmt_e(w['lse'])} | {tol} | {last} |")
    lines.append("")
    return lines


def peer_accuracy_markdown(entry):
    run = entry["run"]
    rows = [r for r in jsonl(os.path.join(run_dir(run), entry["file"])) if not r.get("skipped")]
    cmd = entry.get("command") or command_for(run, entry["file"])
    lines = [f"### {entry['title']}", ""]
    lines.append(f"Date {run_date(run)} · device {run_device(run, rows)} · commit `{entry['commit']}` · "
                 f"raw data `benchmarks/{run}/{entry['file']}`")
    lines += ["", "```sh"] + ([cmd] if isinstance(cmd, str) else cmd) + ["```", ""]
    if rows:
        ref = rows[0].get("reference")
        s = rows[0]["shape"]
        lines.append(f"Reference: {ref}; batch {s['batch']}, heads {s['heads']}, seq {s['seq']}, hd {s['head_dim']}.")
        lines.append("")
    lines += ["| backend | causal | rel-L2 | cos-sim | max-abs |", "|---|---|---|---|---|"]
    for d in rows:
        lines.append(f"| {d['kernel']} | {'yes' if d['shape']['causal'] else 'no'} | {d['rel_l2']:.2e} | "
                     f"{d['cos_sim']:.7f} | {d['max_abs']:.2e} |")
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# SVG plots (hand-written, standard library only)

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#1b9e77", "#d95f02"]
PEER_COLORS = {"torch-sdpa-flash": "#7f7f7f", "torch-sdpa-cudnn": "#3b3b3b"}


def large_markdown(entry):
    """Tensors above 2^31 elements: each path's limit, and the sampled-row check of the 64-bit
    kernels on device tensors (`examples/large_tensors.rs`)."""
    rows = jsonl(os.path.join(run_dir(entry["run"]), entry["file"]))
    out = ["## Tensors above 2^31 elements", "",
           f"Date {run_date(entry['run'])} · device {run_device(entry['run'], rows)} · commit {entry['commit']} · "
           f"raw data `benchmarks/{entry['run']}/{entry['file']}`", "",
           "Each kernel family indexes up to its own limit on the elements Q, K, V or O spans: the CPU kernels and "
           "the native f16/bf16 wgmma and HMMA kernels any size memory holds (64-bit offsets), every other family "
           "2^31 - 1 (README, \"Tensor sizes\"); above it a family refuses at plan time with `Error::TooLarge` and "
           "Auto moves on. The check runs the 64-bit kernels forced on device tensors (`Session::run_cuda`), inputs "
           "hashed from each element's 64-bit index on the device, and compares sampled rows (the last ones among "
           "them, past 2^31 elements) with f64 from the same inputs copied back.", "",
           "| case | kernel | Q / K / V / O elements | largest offset read (O / K) | rows | max abs err O | over max \\|O\\| | LSE abs err | ms | TFLOP/s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "kernel" not in r:
            continue
        e, s, o = r["elements"], r["shape"], r["largest_sampled_offset"]
        case = (f"{r['case']}: b{s['batch']} h{s['q_heads']}/{s['kv_heads']} q{s['q_len']} kv{s['kv_len']} "
                f"d{s['head_dim']} {s['layout'].lower()}{' causal' if s['causal'] else ''}")
        out.append(f"| {case} | `{r['kernel']}` | {e['q']:.3g} / {e['k']:.3g} / {e['v']:.3g} / {e['o']:.3g} | "
                   f"{o['o']:.3g} / {o['k']:.3g} | {r['sampled_rows']} | {fmt_e(r['o_max_abs'])} | {fmt_e(r['o_rel'])} | "
                   f"{fmt_e(r['lse_max_abs'])} | {r['ms']:.1f} | {r['tflops']:.0f} |")
    out += [""]
    if entry.get("note"):
        out += [entry["note"], ""]
    return out


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_ticks(vmax, n=6):
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))
    return [i * step for i in range(int(math.ceil(vmax / step)) + 1)]


def svg_doc(w, h, body):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">\n'
            f'<rect width="{w}" height="{h}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def bar_chart(title, subtitle, out):
    """Grouped bars: one group per shape, one bar per kernel or peer."""
    series = []
    for o in out:
        name = o["kernel"] if o["kernel"] in PEERS else f"{o['kernel']} [{o['precision']}]"
        if name not in series:
            series.append(name)
    series.sort(key=lambda n: (0, PEERS.index(n)) if n in PEERS else (1, 0))
    groups = OrderedDict()
    for o in out:
        s = o["shape"]
        g = f"hd {s['head_dim']} · seq {s['seq'] // 1024}k|{'causal' if s['causal'] else 'non-causal'}"
        name = o["kernel"] if o["kernel"] in PEERS else f"{o['kernel']} [{o['precision']}]"
        groups.setdefault(g, {})[name] = o["tflops"]
    colors, ci = {}, 0
    for n in series:
        if n in PEER_COLORS:
            colors[n] = PEER_COLORS[n]
        else:
            colors[n] = PALETTE[ci % len(PALETTE)]
            ci += 1
    bw = 20
    gw = max(bw * len(series) + 24, 120)
    left, top, plot_h = 70, 64, 320
    legend_h = 18 * len(series) + 10
    w = int(max(left + gw * len(groups) + 30, 640, left + 9.5 * len(title) + 20))
    h = top + plot_h + 64 + legend_h
    vmax = max(v for g in groups.values() for v in g.values())
    ticks = nice_ticks(vmax)
    ymax = ticks[-1]
    y = lambda v: top + plot_h - v / ymax * plot_h
    body = [f'<text x="{left}" y="22" font-size="16" font-weight="bold">{esc(title)}</text>',
            f'<text x="{left}" y="42" fill="#444">{esc(subtitle)}</text>']
    for t in ticks:
        body.append(f'<line x1="{left}" x2="{w - 20}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        body.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    body.append(f'<text transform="translate(18,{top + plot_h / 2}) rotate(-90)" text-anchor="middle">TFLOP/s</text>')
    for gi, (g, vals) in enumerate(groups.items()):
        x0 = left + 12 + gi * gw + (gw - 24 - bw * len(series)) / 2
        for si, n in enumerate(series):
            v = vals.get(n)
            if v is None:
                continue
            x = x0 + si * bw
            body.append(f'<rect x="{x}" y="{y(v):.1f}" width="{bw - 2}" height="{top + plot_h - y(v):.1f}" '
                        f'fill="{colors[n]}"><title>{esc(n)}: {v:.1f}</title></rect>')
            body.append(f'<text x="{x + (bw - 2) / 2:.1f}" y="{y(v) - 3:.1f}" font-size="8" text-anchor="middle">{v:.0f}</text>')
        for li, part in enumerate(g.split("|")):
            body.append(f'<text x="{x0 + bw * len(series) / 2:.1f}" y="{top + plot_h + 18 + 14 * li}" text-anchor="middle">{esc(part)}</text>')
    body.append(f'<line x1="{left}" x2="{w - 20}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    ly = top + plot_h + 58
    for si, n in enumerate(series):
        body.append(f'<rect x="{left}" y="{ly + 18 * si - 10}" width="12" height="12" fill="{colors[n]}"/>')
        body.append(f'<text x="{left + 18}" y="{ly + 18 * si}">{esc(n)}</text>')
    return svg_doc(w, h, body)


def scatter_log(title, subtitle, points, series_labels):
    """x = TFLOP/s (log), y = rel-L2 (log); points: dicts with x, y, label, series."""
    left, top, pw, ph = 80, 64, 640, 400
    w, h = left + pw + 40, top + ph + 70 + 18 * len(series_labels)
    xs = [p["x"] for p in points]
    ys = [p["y"] for p in points]
    x0, x1 = 10 ** math.floor(math.log10(min(xs))), 10 ** math.ceil(math.log10(max(xs)))
    y0, y1 = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys)))
    X = lambda v: left + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * pw
    Y = lambda v: top + ph - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * ph
    body = [f'<text x="{left}" y="22" font-size="16" font-weight="bold">{esc(title)}</text>',
            f'<text x="{left}" y="42" fill="#444">{esc(subtitle)}</text>',
            f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>']
    e = int(math.log10(x0))
    while 10 ** e <= x1:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if x0 <= v <= x1:
                body.append(f'<line x1="{X(v):.1f}" x2="{X(v):.1f}" y1="{top}" y2="{top + ph}" stroke="{"#ccc" if m == 1 else "#eee"}"/>')
                body.append(f'<text x="{X(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{v:g}</text>')
        e += 1
    e = int(math.log10(y0))
    while 10 ** e <= y1:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if y0 <= v <= y1:
                body.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="{"#ccc" if m == 1 else "#eee"}"/>')
                body.append(f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.0e}</text>')
        e += 1
    body.append(f'<text x="{left + pw / 2}" y="{top + ph + 36}" text-anchor="middle">TFLOP/s (log scale)</text>')
    body.append(f'<text transform="translate(20,{top + ph / 2}) rotate(-90)" text-anchor="middle">worst rel-L2 vs f64 (log scale)</text>')
    colors = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series_labels)}
    boxes = [(X(p["x"]) - 6, Y(p["y"]) - 6, X(p["x"]) + 6, Y(p["y"]) + 6) for p in points]
    hit = lambda b: any(b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3] for o in boxes) \
        or b[0] < left or b[2] > left + pw or b[1] < top or b[3] > top + ph
    for p in sorted(points, key=lambda p: (-p["y"], p["x"])):
        cx, cy = X(p["x"]), Y(p["y"])
        body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colors[p["series"]]}" stroke="#222" stroke-width="0.6">'
                    f'<title>{esc(p["label"])}: {p["x"]:.1f} TFLOP/s, rel-L2 {p["y"]:.2e}</title></circle>')
    for p in sorted(points, key=lambda p: (-p["y"], p["x"])):
        cx, cy = X(p["x"]), Y(p["y"])
        tw = 6.0 * len(p["label"])
        best = None
        for dy in (0, -12, 12, -24, 24, -36, 36, -48, 48):
            for side in ("start", "end"):
                tx = cx + 8 if side == "start" else cx - 8
                x0b = tx if side == "start" else tx - tw
                b = (x0b, cy + dy - 5, x0b + tw, cy + dy + 6)
                if not hit(b):
                    best = (side, tx, cy + dy + 4, b)
                    break
            if best:
                break
        if best is None:
            best = ("start", cx + 8, cy + 4, (cx + 8, cy - 5, cx + 8 + tw, cy + 6))
        side, tx, ty, b = best
        boxes.append(b)
        if abs(ty - 4 - cy) > 1:
            lx = b[0] if side == "start" else b[2]
            body.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{lx:.1f}" y2="{ty - 4:.1f}" stroke="#999" stroke-width="0.6"/>')
        body.append(f'<text x="{tx:.1f}" y="{ty:.1f}" font-size="10" text-anchor="{side}">{esc(p["label"])}</text>')
    ly = top + ph + 60
    for i, s in enumerate(series_labels):
        body.append(f'<circle cx="{left + 6}" cy="{ly + 18 * i - 4}" r="5" fill="{colors[s]}" stroke="#222" stroke-width="0.6"/>')
        body.append(f'<text x="{left + 18}" y="{ly + 18 * i}">{esc(s)}</text>')
    return svg_doc(w, h, body)


# ---------------------------------------------------------------------------------------------
# Statements checked against the data (each returns None when its table is absent)


def rng(vals, nd=2):
    lo, hi = min(vals), max(vals)
    return f"{lo:.{nd}f}" if f"{lo:.{nd}f}" == f"{hi:.{nd}f}" else f"{lo:.{nd}f}–{hi:.{nd}f}"


def pick(out, kernel=None, precision=None, hd=None, seq=None, causal=None, prefix=None):
    res = []
    for o in out:
        s = o["shape"]
        if o["kernel"] in PEERS and kernel not in PEERS:
            continue
        if kernel and o["kernel"] != kernel:
            continue
        if prefix and not o["kernel"].startswith(prefix):
            continue
        if precision and o["precision"] != precision:
            continue
        if hd and s["head_dim"] != hd:
            continue
        if seq and s["seq"] != seq:
            continue
        if causal is not None and s["causal"] != causal:
            continue
        res.append(o)
    return res


def findings(speed, probe):
    """Short statements whose numbers are computed from the tables they cite."""
    f = []
    t = speed.get("cuda-f16")
    if t:
        w = pick(t, kernel="fwd_wgmma_f16", hd=128)
        if w and all(o["vs_cudnn"] for o in w):
            f.append(f"- **f16 on Hopper** (`fwd_wgmma_f16`, TMA + wgmma, warp-specialized): "
                     f"{rng([o['vs_cudnn'] for o in w])}× cuDNN and {rng([o['vs_flash'] for o in w])}× torch's "
                     f"FlashAttention-2 backend at hd 128 ({rng([o['tflops'] for o in w], 0)} TFLOP/s); "
                     f"{rng([o['vs_flash'] for o in pick(t, kernel='fwd_wgmma_f16', hd=64)])}× flash at hd 64.")
        m = pick(t, prefix="fwd_portable_mma", hd=128, seq=4096, causal=False)
        c = pick(t, prefix="cubek-attention", hd=128, seq=4096, causal=False)
        if m and c:
            f.append(f"- **Portable CubeCL mma kernel on CUDA** (`{m[0]['kernel']}`): {m[0]['tflops']:.1f} TFLOP/s at hd 128, "
                     f"seq 4k = {m[0]['vs_flash']:.2f}× torch flash and {m[0]['tflops'] / c[0]['tflops']:.1f}× "
                     f"cubek-attention ({c[0]['tflops']:.1f}) measured in the same run; "
                     f"{rng([o['vs_flash'] for o in pick(t, prefix='fwd_portable_mma')])}× flash over the grid.")
    z = speed.get("cuda-int8-vs-f16")
    if z:
        f16 = pick(z, kernel="fwd_wgmma_f16")
        e2e = [o for o in z if o["precision"] == "int8-block" and "kernel only" not in o["kernel"]]
        ko = [o for o in z if o["precision"] == "int8-block" and "kernel only" in o["kernel"]]
        pv = [o for o in z if o["precision"] == "int8-block-pvfp8"]
        pv_e2e = [o for o in pv if "kernel only" not in o["kernel"]]
        pv_ko = [o for o in pv if "kernel only" in o["kernel"]]
        if f16 and e2e and ko:
            s = f16[0]["shape"]
            line = (f"- **INT8 against f16 on Hopper** (one run, hd {s['head_dim']}, seq {s['seq'] // 1024}k): the f16 "
                    f"wgmma kernel runs {f16[0]['tflops']:.1f} TFLOP/s; INT8 Q/K with f16 P·V (`{e2e[0]['kernel']}`) "
                    f"{e2e[0]['tflops']:.1f} end to end (quantizing prepass included) and {ko[0]['tflops']:.1f} kernel only")
            if pv_e2e and pv_ko:
                line += (f", with e4m3 P·V {pv_e2e[0]['tflops']:.1f} and {pv_ko[0]['tflops']:.1f} "
                         f"({pv_ko[0]['tflops'] / f16[0]['tflops']:.2f}× f16)")
            line += (". INT8 halves the Q·Kᵀ tensor time and the Q/K bytes, but with f16 P·V the other half of the "
                     "MMA work stays at the f16 rate, and in every form the softmax between the two products (exp2 "
                     "on the MUFU pipe, the s32→f32 conversion, row reductions) is the critical path.")
            f.append(line)
    i8 = speed.get("cuda-int8")
    if i8:
        e = [o for o in i8 if "kernel only" not in o["kernel"] and o["vs_flash"]]
        if e:
            f.append(f"- **INT8 end to end** (prepass + `fwd_wgmma_int8_*_tma2`): {rng([o['vs_flash'] for o in e])}× torch "
                     f"flash at hd 128, seq 8k–16k ({rng([o['vs_cudnn'] for o in e])}× cuDNN).")
    v = speed.get("vulkan-wgsl")
    if v:
        a = pick(v, precision="f16-acc16-pv16", hd=128, seq=4096, causal=False)
        b = pick(v, precision="f16", hd=128, seq=4096, causal=False)
        if a and b:
            f.append(f"- **WGSL on Vulkan** (the same H100, host clock): the mode that accumulates both products in f16, "
                     f"`f16-acc16-pv16`, runs {a[0]['tflops']:.1f} TFLOP/s at hd 128, seq 4k; the f32-accumulating `f16` "
                     f"{b[0]['tflops']:.1f} ({a[0]['vs_flash']:.2f}× and {b[0]['vs_flash']:.2f}× torch flash).")
    if probe:
        cu = {r["form"]: r["tflops"] for r in probe.get("CUDA", [])}
        vk = {r["form"]: r["tflops"] for r in probe.get("Vulkan (WGSL)", [])}
        f32c = next((v for k, v in cu.items() if k.startswith("f32")), None)
        h2c = next((v for k, v in cu.items() if k.startswith("f16x2")), None)
        h2v = next((v for k, v in vk.items() if k.startswith("vec2<f16> a*b+c")), None)
        f32v = next((v for k, v in vk.items() if k.startswith("f32 a*b+c")), None)
        if f32c and h2c and h2v and f32v:
            vtop = max(vk.values())
            f.append(f"- **Non-tensor ceiling**: the FMA peak probe (register-only multiply-add chains) reaches "
                     f"{f32c:.1f} TFLOP/s in f32 and {h2c:.1f} in packed f16x2 through CUDA, {f32v:.1f} and {h2v:.1f} "
                     f"through Vulkan (best form {vtop:.1f}): packed f16 issues at half the f32 instruction rate, so it "
                     f"does not double the FLOP rate, and {min(h2c, h2v):.0f}–{max(h2c, vtop):.0f} TFLOP/s bounds every "
                     f"portable FMA kernel on this GPU.")
            if v and a:
                f[-1] += f" The best WGSL attention kernel runs at {a[0]['tflops'] / vtop * 100:.0f}% of the Vulkan peak."
    return f


# ---------------------------------------------------------------------------------------------
# Documents


def short_kernel(k):
    """The kernel family for plot labels: `fwd_portable_half_wgpu_f16-acc16` -> `portable_half`."""
    k = k.replace("fwd_", "")
    k = re.sub(r"_(cuda|wgpu-spirv|wgpu)_.*$", "", k)
    return re.sub(r"_(f16|bf16|int8)(_.*)?$", "", k)


def sanitizer_markdown(entry):
    """compute-sanitizer results (`benchmarks/gpu-checks/sanitize.sh` lines: `ok|ERROR tool family
    precision [flags] shapeN`) as one row per kernel case, one column per tool."""
    path = os.path.join(run_dir(entry["run"]), entry["file"])
    tools = ["memcheck", "racecheck", "synccheck", "initcheck"]
    cells = OrderedDict()
    errors = []
    for line in open(path, encoding="utf-8"):
        w = line.split(":")[0].split()
        if len(w) < 5 or w[0] not in ("ok", "ERROR"):
            continue
        case = " ".join(w[2:-1])
        c = cells.setdefault(case, {t: [0, 0] for t in tools})
        c[w[1]][0] += w[0] == "ok"
        c[w[1]][1] += 1
        if w[0] == "ERROR":
            errors.append(line.strip())
    lines = [f"### {entry['title']}", "",
             f"{run_device(entry['run'])} · {run_date(entry['run'])} · commit {entry['commit']} · "
             f"`benchmarks/{entry['run']}/{entry['file']}` (logs in `sanitize/`)", "",
             f"Command: `{entry['command']}`", ""]
    if entry.get("note"):
        lines += [entry["note"], ""]
    lines += ["| family, precision (flags) | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
    for case, c in cells.items():
        lines.append(f"| {case} | " + " | ".join(f"{c[t][0]}/{c[t][1]} clean" if c[t][1] else "–" for t in tools) + " |")
    n_ok = sum(v[0] for c in cells.values() for v in c.values())
    n = sum(v[1] for c in cells.values() for v in c.values())
    lines += ["", f"{n_ok} of {n} runs clean." + (" Errors:" if errors else ""), ""]
    lines += [f"- `{e}`" for e in errors]
    return lines + ([""] if errors else [])


def soak_markdown(entries):
    """The summary lines `quattn soak` prints, per device."""
    lines = []
    for e in entries:
        path = os.path.join(run_dir(e["run"]), e["file"])
        summary = [l.rstrip() for l in open(path, encoding="utf-8") if l.startswith("soak:")]
        lines += [f"{e['device']}: {run_device(e['run'])} · {run_date(e['run'])} · commit {e['commit']} · "
                  f"`benchmarks/{e['run']}/{e['file']}`; command `{e['command']}`", "", "```"] + summary + ["```", ""]
    return lines



def build(manifest):
    files = OrderedDict()
    speed, speed_md, plots_md = {}, [], []
    for e in manifest["speed"]:
        out, rows = speed_table(e)
        speed[e["id"]] = out
        speed_md += speed_md_entry(e, out, rows)
        if e.get("plot", True) and len(out) > 1:
            name = f"speed-{e['id']}.svg"
            files[os.path.join(PLOTS, name)] = bar_chart(
                e["title"], f"{run_device(e['run'], rows)} · {run_date(e['run'])} · commit {e['commit']}", out)
            plots_md.append(f"- [{e['title']}](benchmarks/plots/{name})")
    probe, probe_md = {}, []
    if manifest.get("probe"):
        p = manifest["probe"]
        for part in p["parts"]:
            probe[part["label"]] = probe_rows(p["run"], part["file"])
        probe_md = probe_markdown(p)
    acc, acc_md = {}, []
    hw = set()
    for e in manifest["accuracy"]:
        if not e.get("emulation"):
            agg, _ = accuracy_agg(e)
            hw |= {prec for prec, _ in agg}
    for e in manifest["accuracy"]:
        agg, rows = accuracy_agg(e)
        acc[e["id"]] = agg
        acc_md += accuracy_markdown(e, agg, rows, hw)
    peer_md = peer_accuracy_markdown(manifest["peer_accuracy"]) if manifest.get("peer_accuracy") else []

    # Accuracy-vs-speed plot: each point one mode/kernel at the common shape of its series.
    to = manifest.get("tradeoff")
    if to:
        pts, labels = [], []
        for ser in to["series"]:
            shp = ser["shape"]
            label = f"{ser['label']} (hd {shp['head_dim']}, seq {shp['seq']}, {'causal' if shp['causal'] else 'non-causal'})"
            labels.append(label)
            a = acc[ser["accuracy"]]
            for sid in ser["speed"]:
                for o in pick(speed[sid], hd=shp["head_dim"], seq=shp["seq"], causal=shp["causal"]):
                    if o["kernel"] in PEERS or "kernel only" in o["kernel"]:
                        continue
                    w = a.get((o["precision"], o["kernel"]))
                    if w is None:
                        continue
                    pts.append({"x": o["tflops"], "y": w["rel_l2"], "series": label,
                                "label": f"{o['precision']} · {short_kernel(o['kernel'])}"})
        if pts:
            files[os.path.join(PLOTS, "accuracy-vs-speed.svg")] = scatter_log(
                to["title"], "x: TFLOP/s from the speed tables · y: worst rel-L2 against f64 over the selftest's cases",
                pts, labels)
            plots_md.insert(0, f"- [{to['title']}](benchmarks/plots/accuracy-vs-speed.svg)")

    b = ["# Benchmarks", "",
         "<!-- Generated by `python3 benchmarks/report.py` from the run folders named in "
         "benchmarks/current.json; edit those, not this file. -->", "",
         "Forward attention speed of quattn's kernels next to torch SDPA (FlashAttention-2 backend and cuDNN) "
         "and cubek-attention. Each table comes from one run folder; ratios are taken only against peers measured "
         "in that same folder, at the same shape.", "",
         "## Summary", ""]
    b += findings(speed, probe) + [""]
    b += ["## Method", "",
          "- TFLOP/s use FlashAttention's FLOP count, 4 · batch · heads · seq_q · seq_kv · head_dim, halved for "
          "causal masks (`quattn_core::AttentionShape::flops`), for every kernel, peers included.",
          "- CUDA timings are medians after warm-up, on device-resident inputs: CUDA events for the native kernels "
          "and torch (calls queued back to back, each between its own pair of events, one synchronization at the end), "
          "CubeCL's profiler for the portable kernels and cubek-attention. wgpu (Vulkan) timings are on the host clock, over batches of "
          "launches per synchronization, because the wgpu timestamp queries undercount some kernels.",
          "- \"end to end\" INT8 rows include the quantizing prepass; \"(kernel only)\" rows time the attention "
          "kernel on already quantized operands.",
          "- fp16 inputs unless the precision says otherwise (bf16, int8-*: INT8 Q/K with f16 V); BHSD layout.",
          "- Clocks: the tensor-core kernels at long sequences reach the H200's 700 W limit, and the board lowers "
          "its clocks once its power average catches up, about a second into a sustained run. A measurement of 20 to "
          "50 calls, as in these tables (peers included), runs mostly before that. Sampled every 20 ms on the H200 "
          "(`benchmarks/2026-11-29-h200-y/power/`, seq 16k, hd 128, non-causal), 20 calls against 300: the f16 wgmma "
          "kernel 674 against 594 TFLOP/s (clocks 1980 against a median of 1590 MHz), the FP8 wgmma kernel 941 "
          "against 877 (1860 MHz), the INT8 kernels up to 7% slower (1830–1845 MHz, 200 calls); FP8 at hd 64 682 against 684. "
          "So a ratio between two rows of one table can carry a difference in power state as well as in kernels "
          "(cuDNN fp16 672 from a cool board and 598 under the cap in one call, `power/peers/`); the notes say where "
          "that matters.",
          "- Variant comparisons in the native checks (`examples/wgmma_fp8_check.rs`) time every launch of a shape in "
          "turn, round after round, and take each one's median, so that all see the same power state (timed in blocks "
          "of back-to-back calls, the clock drop above favours the kernel timed first). Their rates are those under "
          "the cap (FP8 at hd 128, seq 16k: about 875 TFLOP/s against the table's short-run 930).",
          "", "## Plots", ""] + plots_md + ["", "## Speed", ""] + speed_md
    b += NOT_RUN_MD
    if probe_md:
        b += ["## FMA peak probe", ""] + probe_md
    b += ["## Raw data", "",
          "Each table names its run folder under `benchmarks/`: the JSON lines as the tools wrote them, `run.sh` "
          "(the exact commands) and `gpu.csv`. Folders no table cites, and the history of these numbers, are in "
          "the same directory and in git history. `benchmarks/current.json` maps tables to folders; "
          "`python3 benchmarks/report.py` rebuilds this file, ACCURACY.md and the plots from them.", ""]

    a = ["# Accuracy", "",
         "<!-- Generated by `python3 benchmarks/report.py` from the run folders named in "
         "benchmarks/current.json; edit those, not this file. -->", "",
         "Errors of every precision mode against an independent f64 reference (`quattn::reference::attention_f64`: "
         "naive two-pass softmax in f64), on random N(0,1) inputs with 0.1% outliers of ±8σ·U(0.5,1) "
         "(`quattn::inputs`), rounded to the precision's input type first so kernel and reference start from the "
         "same numbers. Each row is the worst case over the `quattn selftest --quick` shape classes the kernel "
         "accepts (single-query, GQA, ragged, causal, BSHD, head dims 32–256); native kernels take hd 64 and 128 "
         "only, hence their smaller case counts.", "",
         "- rel-L2, cos-sim, max-abs: `quattn::metrics::ErrorMetrics` of the output; LSE error: the largest absolute "
         "error of the returned log-sum-exp.",
         "- tolerance: `Tolerance::for_precision`, the bound each case must meet (rel-L2 at most, cos-sim at least).",
         "- vs emulation: rel-L2 between the kernel and the CPU emulation of its own mode (`quattn::emulation`, "
         "which rounds where a kernel of that mode rounds); it must also stay within the mode's tolerance.",
         "- The emulation table is the number formats themselves against f64. \"not run on hardware\" marks modes "
         "that exist only as emulations: no kernel in these tables runs them yet. For nvfp4 and nvfp4-v4 the "
         "sm_120a block-scaled MMA kernel (`fwd_nvfp4_*`) exists, compiled and SASS-checked but never run: "
         "`tests/nvfp4_mma_emulation.rs` evaluates its MMAs from per-lane registers through the PTX fragment and "
         "scale-byte layout, in its tile order, and holds the result to these tolerances and to the emulation "
         "within one output ulp; its quantization prepass runs on the H100 and matches the codec byte for byte.", "",
         "A plot of these errors against the speed tables of BENCHMARKS.md: "
         "[accuracy vs speed](benchmarks/plots/accuracy-vs-speed.svg).", ""]
    a += acc_md + peer_md
    if manifest.get("large"):
        a += large_markdown(manifest["large"])
    a += ["## AMD (HIP): not run on hardware", "",
          "The HIP MFMA kernels (`native/hip/`, gfx942 and gfx950) have no rows here: no AMD GPU has run them. "
          "CI holds their CPU mirror, which moves every operand through the MFMA lane layout the kernels use, "
          "to the f64 reference with `Tolerance::for_precision` of f16, bf16 and FP8 e4m3 (both P formats), and "
          "for FP8 on gfx950 to the emulation of its mode (`tests/hip_mfma_emulation.rs`).", ""]
    if manifest.get("sanitizer") or manifest.get("soak"):
        a += ["## Sanitizers and soak", ""]
        if manifest.get("sanitizer"):
            entries = manifest["sanitizer"]
            for e in entries if isinstance(entries, list) else [entries]:
                a += sanitizer_markdown(e)
        if manifest.get("soak"):
            a += ["### Soak: 10,000 mixed calls in one process", "",
                  "Each call is a generator case (`quattn selftest --fuzz`'s shapes, precisions and inputs) run "
                  "round-robin; every call's output must be bit-identical to its case's first, and host RSS, device "
                  "memory and the CubeCL pool are read after the warm-up and at the end.", ""]
            a += soak_markdown(manifest["soak"])
    a += ["## NaN policy", "",
          "Through the host entry points (`Session::run`, `upload`/`download`), on every backend and kernel family "
          "(`quattn::nonfinite`; tested by `tests/nan_policy.rs` on the CPU and llvmpipe, by `quattn selftest --fuzz` "
          "on GPUs): a query row whose softmax sees a NaN or ±inf (its own Q row, or the K or V row of a key it sees "
          "after the causal mask) is NaN in its whole O row and its LSE; every other row is bit for bit what it is "
          "with those values replaced by 0 (in the INT8 and FP8 modes they count as 0 in their block's scales); a row "
          "that sees no key is O = 0, LSE = -inf. A finite input the plan's element type cannot hold is "
          "`Error::InputOverflow`; rows whose inputs are finite and whose output is not (an f16 accumulator or an "
          "f32 score overflowed) are `Error::Overflow`. The device-tensor entry points read the caller's buffers as "
          "they are: only the portable FP8 kernel applies the rule there (README, \"NaN policy\").", "",
          "PyTorch's SDPA computes with IEEE arithmetic instead: a NaN in one V channel reaches only that channel of "
          "the rows that see the key, a -inf score drops its key like a mask, a NaN in a masked-out position still "
          "makes rows NaN; its `is_causal` mask is top-left aligned, so no row is empty when q_len > kv_len, and since "
          "2.5 its math path returns 0 for rows whose every key is masked.", ""]
    a += ["## Raw data", "",
          "Each table names its run folder under `benchmarks/` (`run.sh` holds the commands). Earlier runs stay in "
          "that directory and in git history; `python3 benchmarks/report.py` rebuilds this file from the folders "
          "`benchmarks/current.json` names.", ""]
    files[os.path.join(ROOT, "BENCHMARKS.md")] = "\n".join(b).rstrip("\n") + "\n"
    files[os.path.join(ROOT, "ACCURACY.md")] = "\n".join(a).rstrip("\n") + "\n"
    return files


# Kernels compiled and disassembled for a target no lent machine has: their instruction and
# resource budget from the SASS (`cargo test -p quattn-native --test compile_nvfp4 -- --nocapture`
# prints these lines; `quattn kernels --arch sm_120a` the same report), no timing.
NOT_RUN_MD = [
    "## Not run on hardware", "",
    "### sm_120a (RTX 50xx): NVFP4 attention on the block-scaled mma.sync", "",
    "No sm_120 device was available, so these kernels have no timing. Per consumer warp (16 query rows) and "
    "64-key K/V tile, from NVRTC 13.0's SASS (`OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X` is "
    "`mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64`):", "",
    "| variant | Q·Kᵀ MMAs / tile | P·V MMAs / tile | registers | spills | shared memory | K/V stages |",
    "|---|---|---|---|---|---|---|",
    "| `fwd_nvfp4_bf16_d128` (V bf16) | 16 OMMA.SF (m16n8k64) | 64 HMMA.16816.F32.BF16 | 156 | 0 | 69,168 B | 3 |",
    "| `fwd_nvfp4_f16_d128` (V f16) | 16 OMMA.SF | 64 HMMA.16816.F32 | 156 | 0 | 69,168 B | 3 |",
    "| `fwd_nvfp4_fp4_d128` (P, V NVFP4) | 16 OMMA.SF | 16 OMMA.SF | 183 | 0 | 36,912 B | 3 |",
    "| `fwd_nvfp4_bf16_d64` | 8 OMMA.SF | 32 HMMA | 126 | 0 | 37,680 B | 3 |",
    "| `fwd_nvfp4_fp4_d64` | 8 OMMA.SF | 16 OMMA.SF | 144 | 0 | 20,016 B | 3 |",
    "| f16 Q·Kᵀ for comparison (m16n8k16, hd 128) | 64 HMMA | 64 HMMA | | | | |", "",
    "- One block-scaled MMA covers 64 elements of the head dim where an f16 `m16n8k16` covers 16: Q·Kᵀ issues "
    "4× fewer tensor-core instructions, and the scales ride in the instruction (no dequantization code). The "
    "FA4-on-sm120 design note this follows expects NVFP4 at 2× MXFP8 and 4× Ada FP8 tensor throughput; with "
    "V in 16 bits, P·V (64 HMMA per tile) is then the larger share of the MMA work, which is what the FP4 P·V "
    "variant removes.",
    "- Shared memory: 3 stages of K codes (rows padded to 80 B against bank conflicts), K scales and V rows "
    "(bf16, padded to 272 B) fit 69 KB of the 99 KB an sm_120 CTA may use; with FP4 V, 37 KB.",
    "- Loads: a producer warp issues one bulk copy (`cp.async.bulk`, mbarrier completion) per K and V row; four "
    "consumer warps wait on per-stage full barriers and release empty barriers; the conditional rescale "
    "(threshold 2^8) and the cubic exp2 on every second score are compile-time options (`_rs_poly2` variants: "
    "157 registers; MUFU.EX2 in the SASS: 18 against 34 without the polynomial).", "",
]


def speed_md_entry(e, out, rows):
    return speed_markdown(e, out, rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if regenerating would change an output")
    args = ap.parse_args()
    with open(MANIFEST, encoding="utf-8") as f:
        manifest = json.load(f)
    files = build(manifest)
    stale = []
    for path, text in files.items():
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not args.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if os.path.isdir(PLOTS):
        for name in sorted(os.listdir(PLOTS)):
            path = os.path.join(PLOTS, name)
            if name.endswith(".svg") and path not in files:
                stale.append(os.path.relpath(path, ROOT))
                if not args.check:
                    os.remove(path)
    if args.check:
        if stale:
            print("out of date (run python3 benchmarks/report.py): " + ", ".join(stale), file=sys.stderr)
            return 1
        print("BENCHMARKS.md, ACCURACY.md and benchmarks/plots are up to date")
        return 0
    for s in stale:
        print("wrote " + s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
