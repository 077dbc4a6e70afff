#!/usr/bin/env python3
"""Logits conformance with the records fed the way the reference produced them.

The reference made each `<model>.logits.jsonl` record by decoding `prompt_ids` as one batch
and then each of `gen_ids_fed` ONE AT A TIME. check.py feeds prompt + fed tokens as one
batch, which differs where single-token products round differently from batched ones
(e.g. F16 weights: the reference sums one-token F16 dots in FP16). This script feeds them
incrementally (`moeinfer-cli generate --prompt-ids P --feed-ids G`) and applies the README's
logits rule unchanged: per file/variant >= 90 % of records within 0.5 of the 20 reference
logits, all within 3.0 (5.0 for kv_q8_0_fa), every reference id in our top-40, top-1 equal
where the reference's top-1/top-2 gap is > 0.5; for F16 files passing either the default or
the exact_f32 variant suffices (as in check.py).

usage: incremental_logits.py PATH/TO/moeinfer-cli [DATA_DIR] [--only SUBSTR] [--device cpu]
                             [--extra "more CLI args"] [--timeout S]
Exit 0 only if every selected file passes.
"""
import argparse, glob, json, os, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("cli")
ap.add_argument("data", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "..", "..", "..", "shared", "conformance"))
ap.add_argument("--only", default="")
ap.add_argument("--device", default="cpu")
ap.add_argument("--extra", default="", help="extra CLI args, space separated")
ap.add_argument("--timeout", type=int, default=120)
a = ap.parse_args()

VARIANT_ARGS = {"": ["--kv-type", "f32"], "exact_f32": ["--kv-type", "f32"],
                "kv_f16": ["--kv-type", "f16"], "kv_q8_0_fa": ["--kv-type", "q8_0"]}
TIE, NEAR, ALL = 0.5, 0.5, 3.0


def jl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def first_line(model, prompt, fed, vargs, top=40):
    cmd = [a.cli, "generate", "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", "1",
           "--temp", "0", "--top-logits", str(top), "--json", "--device", a.device] + vargs + a.extra.split()
    if fed:
        cmd += ["--feed-ids", ",".join(map(str, fed))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    out = [json.loads(l) for l in r.stdout.splitlines() if l.strip().startswith("{")]
    if not out:
        raise RuntimeError("no output")
    return out[0]


fails, checks, worst = [], 0, 0.0
models = sorted(glob.glob(os.path.join(a.data, "models", "*.gguf")))
if not models:
    print(f"no models under {a.data}")
    sys.exit(1)
for m in models:
    stem = os.path.basename(m)[:-5]
    if a.only and a.only not in stem:
        continue
    per_variant = {}
    for lg in sorted(glob.glob(os.path.join(a.data, "expect", stem + ".*logits.jsonl"))):
        variant = os.path.basename(lg)[len(stem) + 1: -len("logits.jsonl")].strip(".")
        tag = stem + (f".{variant}" if variant else "")
        if variant not in VARIANT_ARGS:
            per_variant[tag] = [f"{tag}: unknown variant {variant}"]; continue
        vargs, limit = VARIANT_ARGS[variant], (5.0 if variant == "kv_q8_0_fa" else ALL)
        vf, errs = [], []
        for e in jl(lg):
            checks += 1
            where = f"{tag} n_past {e['n_past']}"
            try:
                o = first_line(m, e["prompt_ids"], e["gen_ids_fed"], vargs)
            except Exception as ex:
                vf.append(f"{where}: {ex}"); errs.append(99.0); continue
            if o.get("n_past") != e["n_past"]:
                vf.append(f"{where}: cli reported n_past {o.get('n_past')}")
            top, want = {t[0]: t[1] for t in o["top"]}, e["top"]
            if want[0][1] - want[1][1] > TIE and o["top"][0][0] != want[0][0]:
                vf.append(f"{where}: top-1 {o['top'][0][0]} want {want[0][0]}")
            miss = [tid for tid, _ in want if tid not in top]
            if miss:
                vf.append(f"{where}: ids {miss[:3]} missing from top-40"); errs.append(99.0); continue
            d = max(abs(top[tid] - v) for tid, v in want)
            errs.append(d); worst = max(worst, d)
        if errs:
            within = sum(1 for d in errs if d <= NEAR) / len(errs)
            print(f"{tag}: {within:.0%} of {len(errs)} records within {NEAR}, max |d| {max(errs):.3f}")
            if within < 0.9 or max(errs) > limit:
                vf.append(f"{tag}: {within:.0%} of {len(errs)} records within {NEAR}, max |d| {max(errs):.3f} "
                          f"(need >= 90% and max <= {limit})")
        per_variant[tag] = vf
    # F16 weights: matching either the default run or the exact-F32 run is correct maths
    if stem in per_variant and stem + ".exact_f32" in per_variant:
        if not per_variant[stem] or not per_variant[stem + ".exact_f32"]:
            per_variant[stem] = per_variant[stem + ".exact_f32"] = []
    for vf in per_variant.values():
        fails.extend(vf)
for f in fails[:25]:
    print(f)
print(f"{len(fails)} failures over {checks} checks; worst |dlogit| {worst:.3f}")
sys.exit(0 if checks and not fails else 1)
