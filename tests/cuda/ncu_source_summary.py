#!/usr/bin/env python3
"""Per-opcode instruction mix and warp-stall samples of one kernel launch from an Nsight Compute
source-page export (`ncu -i REPORT --page source --csv --print-source sass > src.csv`, the report
taken with `--set full --import-source yes`): where a kernel's instructions and stalls go, e.g.
the prefill MMQ's integer unpack against its mma (docs/perf/cuda.md, 2026-11-30 night).
The export lists each launch twice (consecutive indices, the same counts).
Usage: ncu_source_summary.py src.csv            (lists the launches: index, instructions, name)
       ncu_source_summary.py src.csv INDEX [N]  (the top N opcodes of launch INDEX, default 24)"""
import collections, csv, re, sys


def sections(path):
    """Yields (kernel name, header, rows) per launch in the export."""
    name, hdr, rows = None, None, []
    for r in csv.reader(open(path)):
        if not r:
            continue
        if r[0] == "Kernel Name":
            if name is not None:
                yield name, hdr, rows
            name, rows = r[1], []
        elif r[0] == "Address":
            hdr = r
        elif name is not None:
            rows.append(r)
    if name is not None:
        yield name, hdr, rows


def num(r, ix, key):
    try:
        return float(r[ix[key]])
    except (KeyError, ValueError):
        return 0.0


def main():
    secs = list(sections(sys.argv[1]))
    if len(sys.argv) < 3:
        for i, (name, hdr, rows) in enumerate(secs):
            ix = {h: k for k, h in enumerate(hdr)}
            n = sum(num(r, ix, "Instructions Executed") for r in rows)
            print(f"{i:3d} {int(n):>12,d} {name[:110]}")
        return
    name, hdr, rows = secs[int(sys.argv[2])]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 24
    ix = {h: k for k, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    tot_i = sum(num(r, ix, "Instructions Executed") for r in rows) or 1.0
    tot_s = sum(num(r, ix, "Warp Stall Sampling (All Samples)") for r in rows) or 1.0
    by_op = collections.defaultdict(lambda: [0.0, 0.0])
    reasons = collections.Counter()
    for r in rows:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0].split(".")[0]
        by_op[op][0] += num(r, ix, "Instructions Executed")
        by_op[op][1] += num(r, ix, "Warp Stall Sampling (All Samples)")
        for s in stall_cols:
            reasons[s] += num(r, ix, s)
    print(f"{name[:110]}\n{int(tot_i):,d} warp instructions, {int(tot_s):,d} stall samples")
    for op, (i, s) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {op:14s} instructions {100 * i / tot_i:5.1f}%   stall samples {100 * s / tot_s:5.1f}%")
    print("stall reasons: " + ", ".join(f"{k[6:]} {100 * v / tot_s:.1f}%" for k, v in reasons.most_common(8)))


if __name__ == "__main__":
    main()
