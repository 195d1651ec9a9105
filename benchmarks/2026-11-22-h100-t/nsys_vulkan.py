#!/usr/bin/env python3
"""Prints the Vulkan GPU workload ranges of an nsys SQLite export (table names vary between
nsys versions, so every table whose name mentions VULKAN is listed with its row count, and
those with start/end columns with their durations in ms, in start order).

usage: python3 nsys_vulkan.py trace.sqlite
"""
import sqlite3
import sys

c = sqlite3.connect(sys.argv[1])
tables = [r[0] for r in c.execute("select name from sqlite_master where type='table'")]
print("tables:", ", ".join(tables))
for t in tables:
    if "VULKAN" not in t.upper():
        continue
    cols = [r[1] for r in c.execute(f"pragma table_info({t})")]
    n = c.execute(f"select count(*) from {t}").fetchone()[0]
    print(f"{t}: {n} rows, columns {cols}")
    if "start" in cols and "end" in cols and n:
        d = [r[0] / 1e6 for r in c.execute(f"select end - start from {t} order by start")]
        print("  durations (ms):", " ".join(f"{x:.3f}" for x in d[:80]))
        big = sorted(d)[-20:]
        print("  largest 20 (ms):", " ".join(f"{x:.3f}" for x in big))
