#!/usr/bin/env python3
"""Localises a CUDA-vs-CPU logit difference: for each record of a conformance logits file it
runs the same context on both devices twice, as one prompt batch (prefill GEMMs, tiled
attention) and as one token at a time (one-token mat-vecs, decode attention), and prints the
largest |dlogit| over the CPU's top-40 for each way.
Usage: path_diff.py CLI MODEL LOGITS.jsonl [STRIDE] [extra cli args...]"""
import json, subprocess, sys

cli, model, expect = sys.argv[1:4]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 3
extra = sys.argv[5:]

def top(dev, ids, fed):
    args = [cli, "generate", "-m", model, "-n", "1", "--temp", "0", "--top-logits", "40", "--json",
            "--device", dev, "--kv-type", "f32"] + extra
    if fed:
        args += ["--prompt-ids", str(ids[0]), "--feed-ids", ",".join(map(str, ids[1:]))]
    else:
        args += ["--prompt-ids", ",".join(map(str, ids))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {}
    return {t[0]: t[1] for t in lines[0]["top"]}

recs = [json.loads(l) for l in open(expect) if l.strip()][::n]
for e in recs:
    ids = e["prompt_ids"] + e["gen_ids_fed"]
    row = [f"n_past {e['n_past']:3d} len {len(ids):3d}"]
    for fed in (False, True):
        c, g = top("cpu", ids, fed), top("cuda", ids, fed)
        d = max((abs(g[t] - v) for t, v in c.items() if t in g), default=-1)
        miss = sum(1 for t in c if t not in g)
        row.append(f"{'fed' if fed else 'batch'}: max|d| {d:.4f} missing {miss}")
    print("  ".join(row), flush=True)
