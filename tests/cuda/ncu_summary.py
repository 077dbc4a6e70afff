#!/usr/bin/env python3
"""Sums `ncu --csv` rows (gpu__time_duration, dram bytes) per kernel name over a window of
decode launches, so a step's kernel time can be compared with its wall time (the gap is
launch overhead). Usage: ncu_summary.py ncu.csv STEPS"""
import csv, sys
from collections import defaultdict

rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
steps = float(sys.argv[2])
per = defaultdict(lambda: {"n": 0, "ns": 0.0, "bytes": 0.0, "grid": ""})
seen = set()
for r in rows:
    name = r["Kernel Name"].split("(")[0].split("<")[0]
    key = (r["ID"], name)
    k = per[name]
    if key not in seen:
        seen.add(key); k["n"] += 1; k["grid"] = r.get("Grid Size", "")
    unit, val = r["Metric Unit"], float(r["Metric Value"].replace(",", "") or 0)
    if r["Metric Name"] == "gpu__time_duration.sum":
        k["ns"] += val * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
    elif r["Metric Name"] == "dram__bytes_read.sum":
        k["bytes"] += val * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
tot_ns = sum(k["ns"] for k in per.values())
tot_n = sum(k["n"] for k in per.values())
print(f"kernels per step {tot_n/steps:.0f}, kernel time per step {tot_ns/steps/1e3:.1f} us")
print(f"{'kernel':44s} {'per step':>8s} {'us/step':>9s} {'us each':>8s} {'GB/s':>7s} grid")
for name, k in sorted(per.items(), key=lambda kv: -kv[1]["ns"]):
    gbs = k["bytes"] / k["ns"] if k["ns"] else 0
    print(f"{name[:44]:44s} {k['n']/steps:8.1f} {k['ns']/steps/1e3:9.1f} {k['ns']/k['n']/1e3:8.2f} {gbs:7.0f} {k['grid']}")
