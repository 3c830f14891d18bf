#!/usr/bin/env python3
"""Golden fixtures for packed sequences with reset_at_document_boundary (spec decision 7):
tests/fixtures/<case>/reset.safetensors.

    /usr/bin/python3 tests/reference/make_reset_fixtures.py [CASE ...]

Definition used here (the twin's own, independent of the C++ code): with the option on, a
packed row behaves as if each document in it were run as its own fresh sequence -- the CCA
convolution, the delayed value, attention and RoPE positions restart at every document start.
So the twin runs zaya_twin.forward on every document separately and concatenates the logits.
The loss is the mean next-token cross-entropy over all B*(T-1) positions of the packed rows
(a document's last token predicts the next document's first token, as in packed training).

Stored (F32 unless noted): "doc_starts" (I32 [B, T]: the start index of each token's
document within its row), "logits" [B, T, V], "loss" [], "experts" (I32 [L, B, T]), and the
gradient of the loss for every trainable tensor under its canonical name (prefix "grad.").
Everything is computed in float64 with autograd. Run after make_fixtures.py.
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zaya_twin as zt  # noqa: E402
from make_grad_fixtures import FIXTURES, is_trainable, load_case  # noqa: E402
from safetensors_io import save_file  # noqa: E402

# Document starts inside each row (row index -> sorted starts > 0). Chosen to put a start at
# position 1 (a one-token document), two adjacent starts, and a long tail document.
STARTS = {0: [1, 2, 5], 1: [3, 4, 9]}
CASES = ["tiny_gqa4_zero", "conv_t3_gqa2", "gqa2_sliding_identity_untied"]


def doc_start_table(B, T):
    table = torch.zeros(B, T, dtype=torch.int32)
    for b in range(B):
        starts = [s for s in STARTS.get(b % 2, []) if s < T]
        cur = 0
        for t in range(T):
            if t in starts:
                cur = t
            table[b, t] = cur
    return table


def packed_forward(cfg, W, ids, table):
    """Logits [B,T,V] and experts [L,B,T]: every document of every row run on its own."""
    B, T = ids.shape
    rows_logits, rows_experts = [], []
    for b in range(B):
        bounds = sorted(set(int(s) for s in table[b].tolist())) + [T]
        parts, experts = [], []
        for s, e in zip(bounds[:-1], bounds[1:]):
            out = zt.forward(cfg, W, ids[b:b + 1, s:e], dtype=torch.float64, with_loss=False)
            parts.append(out["logits"])
            experts.append(out["experts"])
        rows_logits.append(torch.cat(parts, dim=1))
        rows_experts.append(torch.cat(experts, dim=2))
    return torch.cat(rows_logits, dim=0), torch.cat(rows_experts, dim=1)


def build(case):
    case_dir = os.path.join(FIXTURES, case)
    cfg, W, ids = load_case(case_dir)
    B, T = ids.shape
    table = doc_start_table(B, T)
    leaves = {}
    for n, t in W.items():
        t64 = t.to(torch.float64).detach().clone()
        if is_trainable(n):
            t64.requires_grad_(True)
        leaves[n] = t64
    logits, experts = packed_forward(cfg, leaves, ids, table)
    loss = zt.next_token_loss(logits, ids)
    names = [n for n in sorted(leaves) if is_trainable(n)]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    # Sanity: with resets the result must differ from the plain packed forward.
    with torch.no_grad():
        plain = zt.forward(cfg, leaves, ids, dtype=torch.float64)
    diff = float((plain["logits"] - logits).abs().max())
    assert diff > 1e-3, f"{case}: document resets changed nothing (max diff {diff})"
    out = {
        "doc_starts": table,
        "logits": logits.detach().to(torch.float32),
        "loss": loss.detach().to(torch.float32).reshape([]),
        "experts": experts.to(torch.int32),
    }
    for n, g in zip(names, grads):
        out["grad." + n] = (torch.zeros_like(leaves[n]) if g is None else g.detach()).to(torch.float32)
    save_file(out, os.path.join(case_dir, "reset.safetensors"),
              metadata={"generator": "tests/reference/make_reset_fixtures.py",
                        "max_logit_change_vs_no_reset": f"{diff:.6g}"})
    print(f"{case}: B={B} T={T} loss={float(loss):.6f} max change vs no reset {diff:.3g}")


def main():
    for case in sys.argv[1:] or CASES:
        build(case)


if __name__ == "__main__":
    main()
