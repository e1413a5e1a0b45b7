#!/usr/bin/env python3
"""Turns one criterion run of `cargo bench -p bloomgate-bench --bench filters`
into the Markdown tables of BENCHMARKS.md: ns per key for insert, member and
non-member queries, measured FPR and bits per key, and ratios to sbbf-rs-safe
(time) from the same run.

Usage: python3 scripts/bench_table.py [target/criterion]
"""
import glob
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
times = {}  # (group, filter, op) -> ns per key
for path in glob.glob(os.path.join(root, "**", "new", "benchmark.json"), recursive=True):
    with open(path) as f:
        bench = json.load(f)
    with open(os.path.join(os.path.dirname(path), "estimates.json")) as f:
        est = json.load(f)
    elements = (bench.get("throughput") or {}).get("Elements") or 1
    name, _, op = bench["function_id"].rpartition("/")
    times[(bench["group_id"], name, op)] = est["mean"]["point_estimate"] / elements

figures = {}  # (size, filter) -> (fpr, bits per key)
for path in glob.glob(os.path.join(root, "figures-*.tsv")):
    size = os.path.basename(path)[len("figures-"):-len(".tsv")]
    with open(path) as f:
        for line in f:
            name, fpr, bpk = line.rstrip("\n").split("\t")
            figures[(size, name)] = (float(fpr), float(bpk))


def fmt(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


groups = sorted({g for g, _, _ in times}, key=lambda g: (not g.startswith("n="), len(g), g))
for group in groups:
    size = group.split("=")[-1] if group.startswith("n=") else "0"
    names = []
    for g, n, _ in times:
        if g == group and n not in names:
            names.append(n)
    names.sort(key=lambda n: (not n.startswith("bloomgate"), n))
    base = {op: times.get((group, "sbbf-rs-safe", op)) for op in ("insert", "member", "non-member")}
    print(f"\n### {group}\n")
    ops = sorted({op for g, _, op in times if g == group}, key=lambda o: ["insert", "member", "non-member"].index(o) if o in ["insert", "member", "non-member"] else 9)
    header = "| filter | " + " | ".join(f"{op} ns" for op in ops)
    if any(base.values()):
        header += " | " + " | ".join(f"{op} ÷ sbbf" for op in ops if base.get(op))
    header += " | measured FPR | bits/key |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for n in names:
        row = [times.get((group, n, op)) for op in ops]
        cells = [fmt(v) for v in row]
        if any(base.values()):
            cells += [fmt(times.get((group, n, op)) / base[op]) if times.get((group, n, op)) and base.get(op) else "—" for op in ops if base.get(op)]
        fpr, bpk = figures.get((size, n), (None, None))
        fig_name = n.replace("-batch", "")
        if fpr is None:
            fpr, bpk = figures.get((size, fig_name), (None, None))
        cells += [f"{fpr * 100:.3f}%" if fpr is not None else "—", fmt(bpk) if bpk else "—"]
        print(f"| {n} | " + " | ".join(cells) + " |")
