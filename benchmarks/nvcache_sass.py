#!/usr/bin/env python3
"""SASS of the compute pipelines NVIDIA's Vulkan driver compiled, read from its shader disk cache.

ncu does not profile Vulkan, and the driver does not hand out its machine code; but with
`__GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH=DIR __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1`
(DIR must exist) it writes every pipeline it compiles to DIR/GLCache/*/*/*.bin. Such a file is
a sequence of zstd frames; the larger frames are NVIDIA's "NVuc" containers, which hold the raw
sm_XX instruction stream. This script splits the frames, finds the code by its last `EXIT`
(which ends every kernel), walks back 16 bytes at a time while `nvdisasm -b SM90` still decodes,
and prints per pipeline: instruction count, highest register, the most frequent opcodes and the
loops (backward branches) with their opcode mix. The disassembly goes to OUT/fNN.sass.

    python3 benchmarks/nvcache_sass.py DIR/GLCache/*/*/*.bin --out /tmp/sass [--arch SM90]

Needs `zstd` and `nvdisasm` (the nvidia-cuda-nvdisasm wheel: `source .ci/install-cuda-tools.sh`
exports QUATTN_NVDISASM).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ZSTD_MAGIC = bytes.fromhex("28b52ffd")
# Low 8 bytes of sm_80+ `EXIT` (opcode 0x94d, no predicate).
EXIT_LO = bytes.fromhex("4d79000000000000")


def frames(data):
    offs = [m.start() for m in re.finditer(re.escape(ZSTD_MAGIC), data)]
    for i, o in enumerate(offs):
        end = offs[i + 1] if i + 1 < len(offs) else len(data)
        out = subprocess.run(["zstd", "-d", "-c"], input=data[o:end], capture_output=True).stdout
        if out:
            yield out


def decodes(nvdisasm, arch, buf, tmp):
    with open(tmp, "wb") as f:
        f.write(buf)
    p = subprocess.run([nvdisasm, "-b", arch, tmp], capture_output=True, text=True)
    return p.returncode == 0 and "error" not in p.stderr, p.stdout


def sass_of(blob, nvdisasm, arch, tmp):
    exits = [m.start() for m in re.finditer(re.escape(EXIT_LO), blob)]
    if not exits:
        return None
    last = exits[-1]
    end = last + 32
    lo, hi, best = 1, last // 16, 0
    while lo <= hi:  # the largest run of instructions before the last EXIT that decodes
        mid = (lo + hi) // 2
        if decodes(nvdisasm, arch, blob[last - 16 * mid:end], tmp)[0]:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return decodes(nvdisasm, arch, blob[last - 16 * best:end], tmp)[1]


def summary(text):
    ins = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))

    def op(t):
        return re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_.]+)", t).group(2)

    regs = [int(r) for r in re.findall(r"\bR(\d+)\b", text)]
    hist = collections.Counter(op(t) for _, t in ins)
    lines = [f"{len(ins)} instructions, highest register R{max(regs) if regs else 0}: "
             + ", ".join(f"{k} {v}" for k, v in hist.most_common(12))]
    for addr, t in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            body = collections.Counter(op(x) for a, x in ins if start <= a <= addr)
            lines.append(f"  loop {start:#x}-{addr:#x}: {sum(body.values())} instructions: "
                         + ", ".join(f"{k} {v}" for k, v in body.most_common(10)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bins", nargs="+")
    ap.add_argument("--out", default="nvcache_sass")
    ap.add_argument("--arch", default="SM90")
    args = ap.parse_args()
    nvdisasm = os.environ.get("QUATTN_NVDISASM") or shutil.which("nvdisasm")
    if not nvdisasm or not shutil.which("zstd"):
        sys.exit("needs nvdisasm (QUATTN_NVDISASM or PATH) and zstd")
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(tempfile.mkdtemp(), "code.bin")
    n = 0
    for path in args.bins:
        data = open(path, "rb").read()
        for blob in frames(data):
            text = sass_of(blob, nvdisasm, args.arch, tmp)
            if not text:
                continue
            name = os.path.join(args.out, f"f{n:02d}.sass")
            open(name, "w").write(text)
            print(f"{name}: {summary(text)}")
            n += 1


if __name__ == "__main__":
    main()
