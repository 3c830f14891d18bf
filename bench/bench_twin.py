#!/usr/bin/python3
"""Prefill benchmark of the PyTorch twin (tests/reference/zaya_twin.py): the peer for
bench_forward's prefill numbers.

Loads the same model directory as bench_forward (`zaya init --preset zaya-60m --out DIR`),
runs the vectorised twin forward in float32 under torch.inference_mode() with a fixed
thread count (default 2), and reports the median tokens/s of >= 5 timed runs after a
warm-up for each [B,T] shape, as one JSON object on stdout (progress on stderr).

By default it times the batched `fast=True` path (same function, standard batched torch
ops: grouped GQA matmuls with an additive causal mask, sorted per-expert GEMMs) and also the
plain path for reference. Like bench_forward it produces logits for every position and no
loss. --check first verifies on the fixtures in tests/fixtures that the fast path agrees
with the plain path and with expected.safetensors.

Usage: /usr/bin/python3 bench/bench_twin.py --model DIR [--shapes 1x512,4x256] [--runs 7]
       [--threads 2] [--no-plain] [--check]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "reference")
sys.path.insert(0, REF)
import zaya_twin as zt  # noqa: E402
from safetensors_io import load_file  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def check_fixtures(fixtures_dir):
    """fast path vs plain path (float64) and vs the stored expected values, every fixture."""
    results = {}
    for case in sorted(os.listdir(fixtures_dir)):
        d = os.path.join(fixtures_dir, case)
        if not os.path.exists(os.path.join(d, "config.json")):
            continue
        cfg, W = zt.load_model_dir(d)
        with open(os.path.join(d, "ids.json")) as f:
            ids = json.load(f)
        exp = load_file(os.path.join(d, "expected.safetensors"))
        with torch.inference_mode():
            plain = zt.forward(cfg, W, ids, dtype=torch.float64)
            fast = zt.forward(cfg, W, ids, dtype=torch.float64, fast=True)
            fast32 = zt.forward(cfg, W, ids, dtype=torch.float32, fast=True)
        r = {
            "fast_vs_plain_logits": float((fast["logits"] - plain["logits"]).abs().max()),
            "fast_vs_plain_residuals": max(float((a - b).abs().max())
                                           for a, b in zip(fast["residuals"], plain["residuals"])),
            "fast_vs_expected_logits": float((fast["logits"] - exp["logits"].double()).abs().max()),
            "fast32_vs_expected_logits": float((fast32["logits"].double() - exp["logits"].double()).abs().max()),
            "experts_equal": bool(torch.equal(fast["experts"], plain["experts"])
                                  and torch.equal(fast["experts"].to(torch.int32), exp["experts"])
                                  and torch.equal(fast32["experts"], plain["experts"])),
        }
        ok = (r["experts_equal"] and r["fast_vs_plain_logits"] < 1e-10 and r["fast_vs_plain_residuals"] < 1e-10
              and r["fast_vs_expected_logits"] < 1e-5 and r["fast32_vs_expected_logits"] < 1e-3)
        r["ok"] = ok
        results[case] = r
        log(f"check {case}: {'ok' if ok else 'FAIL'} {r}")
    return results


def bench(cfg, W, B, T, runs, fast, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    with torch.inference_mode():
        zt.forward(cfg, W, ids, dtype=torch.float32, fast=fast, with_loss=False)  # warm-up
        secs = []
        for _ in range(runs):
            t0 = time.perf_counter()
            zt.forward(cfg, W, ids, dtype=torch.float32, fast=fast, with_loss=False)
            secs.append(time.perf_counter() - t0)
    tps = [B * T / s for s in secs]
    return {"B": B, "T": T, "fast": fast,
            "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps), "runs": runs},
            "seconds": {"median": statistics.median(secs), "min": min(secs), "max": max(secs)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory written by `zaya init`")
    ap.add_argument("--shapes", default="1x512,4x256")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-plain", action="store_true", help="time only the fast path")
    ap.add_argument("--check", action="store_true", help="verify the fast path on tests/fixtures first")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": args.model}
    if args.check:
        res = check_fixtures(os.path.join(HERE, "..", "tests", "fixtures"))
        out["check"] = res
        if not all(r["ok"] for r in res.values()):
            log("fast path check FAILED")
            print(json.dumps(out, indent=2))
            sys.exit(1)

    cfg, W = zt.load_model_dir(args.model)
    W = {k: v.to(torch.float32).contiguous() for k, v in W.items()}
    out["prefill"] = []
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        for fast in ([True] if args.no_plain else [True, False]):
            r = bench(cfg, W, B, T, args.runs, fast, seed=42 + B * 100000 + T)
            out["prefill"].append(r)
            log(f"twin prefill B={B} T={T} {'fast' if fast else 'plain'}: median "
                f"{r['tokens_per_s']['median']:.0f} tok/s ({1e3 * r['seconds']['median']:.1f} ms; "
                f"min {r['tokens_per_s']['min']:.0f}, max {r['tokens_per_s']['max']:.0f})")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
