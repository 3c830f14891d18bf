#!/usr/bin/env python3
"""Gradient golden fixtures: tests/fixtures/<case>/grads.safetensors.

    /usr/bin/python3 tests/reference/make_grad_fixtures.py            # all cases
    /usr/bin/python3 tests/reference/make_grad_fixtures.py CASE ...   # only the named cases

Run it after make_fixtures.py (which empties each case directory when it rebuilds it).

For every case directory under tests/fixtures/ that has expected.safetensors, the script
reads the stored weights (either naming, sharded or not, BF16 widened exactly) and ids,
computes the forward of zaya_twin.forward in float64 with autograd, and differentiates

    loss = mean next-token cross-entropy over all B*(T-1) predictions

with respect to every trainable parameter. Trainable = every tensor except
`*.mlp.gate.balancing_biases` (a selection-only buffer). The gradients are written as F32
under the canonical HF 40-block names (experts stacked [E,2I,D] / [E,D,I]) even for the
case stored with the original 80-half-layer names.

Semantics (all follow from the forward's autograd graph):
  * e* = argmax(p + b) is a constant for differentiation; the gradient reaches the router
    through the unbiased mixing weight w = p[e*] only.
  * skip "identity": the skip token's output w*x is differentiated in both w and x.
  * skip "zero": skip tokens contribute nothing through the MoE (no gradient to p[skip]).
  * tied embeddings: the embedding gradient is lookup + LM-head contribution (summed).

Checks (the script aborts if one fails):
  1. The loss recomputed here equals expected.safetensors' loss (1e-6 relative) and the
     experts match.
  2. Central finite differences in float64 (5-point stencil, h = 1e-4) on every trainable
     tensor: the entry with the largest |grad| plus 2 random entries (numpy
     RandomState(1234 + case index)). The routing (experts) must not change under the
     perturbation. Agreement is measured as |fd - ad| / max(|ad|, 1e-3 * max|grad of that
     tensor|) and must be <= 1e-6.
  3. The same autograd in float32 must route identically; its gap to the float64
     gradients is printed and stored in the file metadata (informational).
"""

import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zaya_twin as zt  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
FD_STEP = 1e-4          # finite-difference step h (absolute, float64)
FD_TOL = 1e-6           # required relative agreement
FD_RANDOM_ENTRIES = 2   # random entries per tensor, on top of the argmax-|grad| entry


def is_trainable(name):
    return not name.endswith(".mlp.gate.balancing_biases")


def load_case(case_dir):
    cfg, W = zt.load_model_dir(case_dir)          # canonical names, storage dtypes
    with open(os.path.join(case_dir, "ids.json")) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)
    return cfg, W, ids


def loss_and_grads(cfg, W, ids, dtype=torch.float64):
    """Loss and {name: grad} for every trainable tensor, computed in `dtype`."""
    leaves = {}
    for n, t in W.items():
        t64 = t.to(dtype).detach().clone()   # exact widening (BF16/F32 -> F64)
        if is_trainable(n):
            t64.requires_grad_(True)
        leaves[n] = t64
    out = zt.forward(cfg, leaves, ids, dtype=dtype)
    names = [n for n in sorted(leaves) if is_trainable(n)]
    grads = torch.autograd.grad(out["loss"], [leaves[n] for n in names], allow_unused=True)
    G = {}
    for n, g in zip(names, grads):
        G[n] = torch.zeros_like(leaves[n]) if g is None else g.detach()
    return out, G


def loss_at(cfg, W64, ids):
    with torch.no_grad():
        out = zt.forward(cfg, W64, ids, dtype=torch.float64)
    return float(out["loss"]), out["experts"]


def fd_check(cfg, W, ids, G, experts, rng):
    """Central differences on selected entries of every trainable tensor.

    Returns a list of (name, flat index, autograd, fd, rel) rows."""
    W64 = {n: t.to(torch.float64).clone() for n, t in W.items()}
    rows = []
    for n in sorted(G):
        g = G[n].reshape(-1)
        gmax = float(g.abs().max())
        picks = [int(g.abs().argmax())]
        picks += [int(i) for i in rng.randint(0, g.numel(), FD_RANDOM_ENTRIES)]
        flat = W64[n].view(-1)
        for i in picks:
            w0 = float(flat[i])
            f = {}
            for k in (-2, -1, 1, 2):
                flat[i] = w0 + k * FD_STEP
                f[k], ek = loss_at(cfg, W64, ids)
                assert torch.equal(ek, experts), f"{n}[{i}]: routing changed under the FD step"
            flat[i] = w0
            # 5-point central stencil, truncation error O(h^4)
            fd = (f[-2] - 8 * f[-1] + 8 * f[1] - f[2]) / (12 * FD_STEP)
            ad = float(g[i])
            rel = abs(fd - ad) / max(abs(ad), 1e-3 * gmax, 1e-300)
            rows.append((n, i, ad, fd, rel))
    return rows


def build(case, index):
    case_dir = os.path.join(FIXTURES, case)
    cfg, W, ids = load_case(case_dir)
    out, G = loss_and_grads(cfg, W, ids)
    exp = load_file(os.path.join(case_dir, "expected.safetensors"))
    loss = float(out["loss"])
    ref = float(exp["loss"][0])
    assert abs(loss - ref) <= 1e-6 * abs(ref), f"{case}: loss {loss} != expected {ref}"
    assert torch.equal(out["experts"].to(torch.int32), exp["experts"]), f"{case}: experts differ"

    rng = np.random.RandomState(1234 + index)
    rows = fd_check(cfg, W, ids, G, out["experts"], rng)
    worst = max(rows, key=lambda r: r[4])
    assert worst[4] <= FD_TOL, f"{case}: FD disagreement {worst}"
    n_tensors = len(G)
    # float32 autograd run: how far an fp32 engine's gradients are expected to land
    out32, G32 = loss_and_grads(cfg, W, ids, dtype=torch.float32)
    assert torch.equal(out32["experts"], out["experts"]), f"{case}: float32 routing differs"
    gap32 = max(float((G32[n].double() - G[n]).abs().max()) / max(float(G[n].abs().max()), 1e-30)
                for n in G if float(G[n].abs().max()) > 0)
    gap32_abs = max(float((G32[n].double() - G[n]).abs().max()) for n in G)
    print(f"[{case}] loss {loss:.6f}; {n_tensors} trainable tensors; FD on {len(rows)} entries: "
          f"worst rel {worst[4]:.2e} ({worst[0]}[{worst[1]}] ad {worst[2]:.6e} fd {worst[3]:.6e})")
    print(f"[{case}] float32 autograd vs float64: max abs {gap32_abs:.2e}, "
          f"max (abs / max|grad| per tensor) {gap32:.2e}")

    tensors = {n: g.to(torch.float32).contiguous() for n, g in G.items()}
    path = os.path.join(case_dir, "grads.safetensors")
    save_file(tensors, path, {
        "generator": "tests/reference/make_grad_fixtures.py", "case": case,
        "loss": f"{loss:.10f}",
        "what": "d(mean next-token CE over B*(T-1))/d(param), float64 autograd, stored F32",
        "fd_worst_rel": f"{worst[4]:.3e}", "fd_entries": str(len(rows)),
        "float32_autograd_max_abs_gap": f"{gap32_abs:.3e}",
    })
    # reload check
    back = load_file(path)
    assert sorted(back) == sorted(tensors)
    for n in tensors:
        assert torch.equal(back[n], tensors[n]), n
    size = os.path.getsize(path)
    print(f"[{case}] wrote {path} ({size / 1024:.0f} KiB)")
    return worst[4], size, rows


def all_cases():
    return sorted(d for d in os.listdir(FIXTURES)
                  if os.path.exists(os.path.join(FIXTURES, d, "expected.safetensors")))


def main(argv):
    torch.set_num_threads(1)
    cases = all_cases()
    names = [a for a in argv if not a.startswith("--")] or cases
    worst_all, total = 0.0, 0
    for n in names:
        w, size, _ = build(n, cases.index(n))
        worst_all = max(worst_all, w)
        total += size
    print(f"worst FD relative disagreement over all cases {worst_all:.2e}; "
          f"grads total {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main(sys.argv[1:])
