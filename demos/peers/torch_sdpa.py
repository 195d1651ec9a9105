#!/usr/bin/env python3
"""torch SDPA as a peer of `quattn bench`: the same grid, the same row fields, the same FLOP count.

Standalone: python3 with torch and the standard library only; nothing in quattn's build or CI
needs it. torch is imported only when something has to run, so `--dry-run` works without it.

Timing (default mode): for each grid row and each SDPA backend, fp16 CUDA tensors in BHSD layout,
`torch.nn.functional.scaled_dot_product_attention` under `torch.nn.attention.sdpa_kernel(backend)`,
`--warmup` untimed calls, then `--iters` calls each bracketed by CUDA events; the median is
reported. One JSON object per (row, backend) on stdout, with the fields of `quattn bench --json`:
device, adapter, kernel ("torch-sdpa-<backend>"), precision, shape, ms, tflops, skipped.
A backend that refuses a shape (or runs out of memory) gives a row with `skipped` set: the script
never stops on one.

Accuracy (`--accuracy`): one small shape (`--batch --heads --seq --head-dim`), inputs drawn like
quattn's (`quattn::inputs`: N(0,1) with 0.1% outliers of ±8·U(0.5,1)), rounded to fp16; each
backend's fp16 output is compared with an f64 CPU computation on the same fp16 inputs. One JSON
object per (causal, backend) with rel_l2, rel_l1, cos_sim, max_abs, rmse (quattn's
`ErrorMetrics` definitions).

Examples:
  python3 demos/peers/torch_sdpa.py                      # the FlashAttention grid, all backends
  python3 demos/peers/torch_sdpa.py --head-dims 128 --seqs 4096 --causal causal --backends flash
  # decode: batch 8, 32 query heads over 8 KV heads, one query row against 32k keys
  python3 demos/peers/torch_sdpa.py --head-dims 128 --seqs 32768 --tokens 262144 --width 4096 --q-len 1 --kv-heads 8 --causal non-causal
  python3 demos/peers/torch_sdpa.py --accuracy --heads 4 --seq 1024 --head-dim 64
  python3 demos/peers/torch_sdpa.py --dry-run            # print the grid, no torch needed
"""

import argparse
import json
import math
import statistics
import sys
import time
import warnings

BACKENDS = ("flash", "cudnn", "efficient", "math")
# Names of torch.nn.attention.SDPBackend members.
BACKEND_ENUM = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
OUTLIER_FRACTION = 0.001
OUTLIER_SIGMA = 8.0


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {s!r}")
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"need positive integers: {s!r}")
    return v


def backend_list(s):
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in BACKENDS]
    if bad or not v:
        raise argparse.ArgumentTypeError(f"backends are {','.join(BACKENDS)}; got {s!r}")
    return v


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="torch SDPA timed on the quattn bench grid (JSON lines on stdout)")
    p.add_argument("--head-dims", type=int_list, default=[64, 128])
    p.add_argument("--seqs", type=int_list, default=[1024, 4096, 16384])
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seq")
    p.add_argument("--width", type=int, default=2048, help="heads = width / head_dim")
    p.add_argument("--q-len", type=int, default=None, help="query length of every row (decode: 1); the keys then number seq (default: seq)")
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads of every row (GQA, torch's enable_gqa; default: the query heads)")
    p.add_argument("--causal", choices=["both", "causal", "non-causal"], default="both")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--backends", type=backend_list, default=list(BACKENDS))
    p.add_argument("--device", default="cuda", help="torch device (cpu only to try the script without a GPU)")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--dry-run", action="store_true", help="print the grid rows (skipped: 'dry run') without torch")
    acc = p.add_argument_group("accuracy mode")
    acc.add_argument("--accuracy", action="store_true", help="fp16 error of each backend against an f64 CPU reference")
    acc.add_argument("--batch", type=int, default=1)
    acc.add_argument("--heads", type=int, default=4)
    acc.add_argument("--seq", type=int, default=1024)
    acc.add_argument("--head-dim", type=int, default=64)
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if (a.q_len is not None and a.q_len < 1) or (a.kv_heads is not None and a.kv_heads < 1):
        p.error("--q-len and --kv-heads must be >= 1")
    return a


def causals(mode):
    return {"both": [False, True], "causal": [True], "non-causal": [False]}[mode]


def grid(a):
    """The rows of `quattn bench` (demos/src/bench.rs `grid`), in its order."""
    rows = []
    for d in a.head_dims:
        for s in a.seqs:
            for c in causals(a.causal):
                heads = max(a.width // d, 1)
                kv_heads = a.kv_heads or heads
                if heads % kv_heads:
                    raise SystemExit(f"--kv-heads {kv_heads} does not divide {heads} query heads")
                rows.append(shape(max(a.tokens // s, 1), heads, s, d, c, kv_heads=kv_heads, q_len=a.q_len or s))
    return rows


def shape(batch, heads, seq, head_dim, causal, kv_heads=None, q_len=None):
    """A row's shape as `quattn bench` writes it: `seq` is the query length, `kv_seq` the keys.
    Causal masks here are torch's (top-left aligned), quattn's are bottom-right aligned: the two
    agree only when q_len == kv_seq."""
    return {
        "batch": batch,
        "heads": heads,
        "kv_heads": kv_heads or heads,
        "seq": q_len or seq,
        "kv_seq": seq,
        "head_dim": head_dim,
        "causal": causal,
        "layout": "bhsd",
    }


def flops(sh):
    """quattn::metrics::flops: 4·B·H·Sq·Sk·D, halved for causal (D = head_dim = v_head_dim here)."""
    full = 4.0 * sh["batch"] * sh["heads"] * sh["seq"] * sh["kv_seq"] * sh["head_dim"]
    return full / 2 if sh["causal"] else full


def emit(obj):
    print(json.dumps(obj), flush=True)


def row(device, adapter, backend, sh, ms=None, skipped=None):
    return {
        "device": device,
        "adapter": adapter,
        "kernel": f"torch-sdpa-{backend}",
        "precision": "f16",
        "shape": sh,
        "ms": ms,
        "tflops": None if ms is None else flops(sh) / (ms * 1e-3) / 1e12,
        "skipped": skipped,
    }


def one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refusal(err, caught):
    """Why a backend did not run: torch's warnings say why a kernel was not used; the error
    itself only says 'No available kernel'."""
    reasons = [one_line(w.message, 200) for w in caught if "not used because" in str(w.message) or "kernel" in str(w.message).lower()]
    base = one_line(f"{type(err).__name__}: {err}", 200)
    return base + ("; " + " | ".join(dict.fromkeys(reasons)) if reasons else "")


def sdpa_call(torch, backend, q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # GQA through torch's own grouping (enable_gqa), so K and V are read at their size.
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    with sdpa_kernel(getattr(SDPBackend, BACKEND_ENUM[backend])):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)


def run_checked(torch, backend, q, k, v, causal):
    """One call; returns (output, None) or (None, reason)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return sdpa_call(torch, backend, q, k, v, causal), None
        except torch.cuda.OutOfMemoryError as e:
            return None, one_line(f"out of memory: {e}", 200)
        except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
            return None, refusal(e, caught)


def device_names(torch, dev):
    if dev.type == "cuda":
        return "cuda", torch.cuda.get_device_name(dev)
    return dev.type, dev.type


def time_backend(torch, dev, backend, q, k, v, causal, warmup, iters):
    """Median ms of `iters` calls after `warmup`, or raises with the reason."""
    out, why = run_checked(torch, backend, q, k, v, causal)
    if why is not None:
        return None, why
    del out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(warmup):
            sdpa_call(torch, backend, q, k, v, causal)
        samples = []
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
            for start, end in events:
                start.record()
                sdpa_call(torch, backend, q, k, v, causal)
                end.record()
            torch.cuda.synchronize(dev)
            samples = [s.elapsed_time(e) for s, e in events]
        else:
            for _ in range(iters):
                t = time.perf_counter()
                sdpa_call(torch, backend, q, k, v, causal)
                samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples), None


def bench(a):
    import torch

    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: CUDA not available to torch", file=sys.stderr)
        return 2
    device, adapter = device_names(torch, dev)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    for sh in grid(a):
        qdims = (sh["batch"], sh["heads"], sh["seq"], sh["head_dim"])
        kvdims = (sh["batch"], sh["kv_heads"], sh["kv_seq"], sh["head_dim"])
        try:
            q, k, v = (torch.randn(d, generator=gen, device=dev, dtype=torch.float16) for d in (qdims, kvdims, kvdims))
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            for b in a.backends:
                emit(row(device, adapter, b, sh, skipped=one_line(f"allocating inputs: {e}", 200)))
            continue
        for b in a.backends:
            try:
                ms, why = time_backend(torch, dev, b, q, k, v, sh["causal"], a.warmup, a.iters)
            except torch.cuda.OutOfMemoryError as e:
                ms, why = None, one_line(f"out of memory: {e}", 200)
            except Exception as e:  # a peer must never end the run
                ms, why = None, one_line(f"{type(e).__name__}: {e}", 300)
            emit(row(device, adapter, b, sh, ms=ms, skipped=why))
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        del q, k, v
    return 0


def quattn_like_inputs(torch, n, gen):
    """quattn::inputs::normal_with_outliers in distribution (not bit for bit: another RNG)."""
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, generator=gen, dtype=torch.float64) < OUTLIER_FRACTION
    sign = torch.where(torch.rand(n, generator=gen, dtype=torch.float64) < 0.5, 1.0, -1.0)
    mag = OUTLIER_SIGMA * (0.5 + 0.5 * torch.rand(n, generator=gen, dtype=torch.float64))
    return torch.where(mask, sign * mag, x).float()


def reference_f64(torch, q, k, v, causal):
    """O = softmax(QKᵀ/√d) V in f64 on the CPU; causal bottom-right aligned (quattn's contract)."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    sq, sk = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def metrics(torch, x, r):
    """quattn::metrics::ErrorMetrics::compare."""
    x = x.detach().cpu().double().flatten()
    r = r.flatten()
    if torch.isnan(x).any():
        return {k: float("nan") for k in ("rel_l2", "rel_l1", "cos_sim", "max_abs", "rmse")}
    d = x - r
    r2, x2 = r.norm().item(), x.norm().item()
    return {
        "rel_l2": d.norm().item() / r2 if r2 > 0 else 0.0,
        "rel_l1": d.abs().sum().item() / r.abs().sum().item() if r.abs().sum() > 0 else 0.0,
        "cos_sim": (x @ r).item() / (x2 * r2) if x2 > 0 and r2 > 0 else 0.0,
        "max_abs": d.abs().max().item(),
        "rmse": math.sqrt((d * d).mean().item()),
    }


def accuracy(a):
    import torch

    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: CUDA not available to torch", file=sys.stderr)
        return 2
    device, adapter = device_names(torch, dev)
    gen = torch.Generator().manual_seed(a.seed)
    dims = (a.batch, a.heads, a.seq, a.head_dim)
    n = a.batch * a.heads * a.seq * a.head_dim
    q, k, v = (quattn_like_inputs(torch, n, gen).reshape(dims).half() for _ in range(3))
    for causal in causals(a.causal):
        sh = shape(a.batch, a.heads, a.seq, a.head_dim, causal)
        ref = reference_f64(torch, q, k, v, causal)
        for b in a.backends:
            out, why = run_checked(torch, b, q.to(dev), k.to(dev), v.to(dev), causal)
            r = row(device, adapter, b, sh, skipped=why)
            del r["ms"], r["tflops"]
            r["mode"] = "accuracy"
            r["reference"] = "f64 cpu on the same fp16 inputs"
            if out is not None:
                r.update(metrics(torch, out, ref))
            emit(r)
    return 0


def dry_run(a):
    if a.accuracy:
        for c in causals(a.causal):
            for b in a.backends:
                emit({**row("dry-run", "", b, shape(a.batch, a.heads, a.seq, a.head_dim, c), skipped="dry run"), "mode": "accuracy"})
        return 0
    for sh in grid(a):
        for b in a.backends:
            emit(row("dry-run", "", b, sh, skipped="dry run"))
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("error: torch is not installed for this python3", file=sys.stderr)
        return 2
    return accuracy(a) if a.accuracy else bench(a)


if __name__ == "__main__":
    sys.exit(main())
