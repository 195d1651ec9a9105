#!/usr/bin/env bash
# release quattn of the commit in commit.txt, in BIN
DEADLINE=330 benchmarks/gpu-checks/ppaged.sh "$OUT" "$BIN"
