#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel times (a `ncu --metrics gpu__time_duration.sum --csv` log)
by kernel name and prints the kernels that took the most time, with their launch counts and
share of the total. Used by `scripts/gpu_device_checks.sh kernels`.

    python3 bench/kernel_table.py kernels.csv [--top 40]
"""
import argparse
import collections
import csv
import io
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv_log")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.csv_log, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    # ncu prints its own progress lines (==PROF==) and the program's stdout before the CSV.
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{args.csv_log}: no ncu CSV header (a line starting with \"ID\") found")
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    total_ns = collections.Counter()
    launches = collections.Counter()
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"]
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        total_ns[name] += value
        launches[name] += 1
    grand = sum(total_ns.values())
    if grand == 0:
        sys.exit(f"{args.csv_log}: no kernel times found")
    print(f"{sum(launches.values())} kernel launches, {grand / 1e6:.1f} ms of kernel time in all")
    print(f"{'ms':>9} {'share':>6} {'launches':>8}  kernel")
    for name, ns in total_ns.most_common(args.top):
        print(f"{ns / 1e6:9.3f} {100 * ns / grand:5.1f}% {launches[name]:8d}  {name[:150]}")


if __name__ == "__main__":
    main()
