#!/usr/bin/env python3
"""Optimizer and bias-balancer golden fixtures (tests/fixtures/optim/, tests/fixtures/balancer/).

    /usr/bin/python3 tests/reference/make_optim_fixtures.py

Uses optim_twin.py (float64). Inputs are drawn from numpy's legacy RandomState, rounded
to F32, and everything is then computed in float64 from those F32 values; the float64
trajectory is carried between steps (not re-rounded) and only the stored results are
rounded to F32. Files are byte-identical from run to run.

tests/fixtures/optim/
  optim.safetensors   F32 tensors, for each parameter NAME (canonical HF names):
                        step0.param.NAME            initial value
                        step{s}.grad.NAME           the gradient given at step s (s = 1..3)
                        step{s}.param.NAME          the value after step s
                        step{s}.muon_momentum.NAME  Muon M after step s (Muon tensors)
                        step{s}.adam_m.NAME / step{s}.adam_v.NAME  AdamW moments (AdamW tensors)
                      plus the isolated Newton-Schulz check:
                        ns.wide.input [6,10], ns.wide.output [6,10]
                        ns.tall.input [10,6], ns.tall.output [10,6]   (transposed path)
  optim.json          hyperparameters, per-tensor routing / weight decay / shape, naming;
                      "model_routing": optimizer + weight-decay flag for every tensor of
                      the fixture model gqa2_sliding_identity_untied (untied lm_head).
tests/fixtures/balancer/
  balancer.safetensors  biases.step0 [L,E+1] F32, counts.step{s} [L,E+1] I64,
                        biases.step{s} [L,E+1] F32, adam_m.step{s} / adam_v.step{s} [L,E] F32
  balancer.json         hyperparameters and the update rule.
"""

import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import optim_twin as ot  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
LR, WD, STEPS = 0.02, 0.1, 3
ROUTING_CASE = "gqa2_sliding_identity_untied"

# (canonical name, shape, init std, init mean, grad std)
PARAMS = [
    ("model.layers.0.self_attn.qkv_proj.q_proj.weight", (6, 10), 0.3, 0.0, 0.05),
    ("model.layers.0.self_attn.o_proj.weight", (10, 6), 0.3, 0.0, 0.05),
    ("model.layers.0.mlp.experts.gate_up_proj", (3, 8, 5), 0.3, 0.0, 0.05),
    ("model.embed_tokens.weight", (12, 4), 0.5, 0.0, 0.02),
    ("model.layers.0.self_attn.qkv_proj.conv_qk_depthwise.weight", (8, 1, 2), 0.4, 0.0, 0.1),
    ("model.layers.0.self_attn.qkv_proj.conv_qk_grouped.weight", (8, 4, 2), 0.4, 0.0, 0.1),
    ("model.layers.0.input_layernorm.weight", (7,), 0.1, 1.0, 0.01),
]


def f32(a):
    """numpy array -> float64 torch tensor holding exactly-F32 values."""
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.float64)


def make_optim():
    rng = np.random.RandomState(20261122)
    params = {n: f32(rng.normal(mean, std, shape)) for n, shape, std, mean, _ in PARAMS}
    grads = []
    for s in range(1, STEPS + 1):
        g = {n: f32(rng.normal(0.0, gstd, shape)) for n, shape, _, _, gstd in PARAMS}
        # edge cases: unused embedding rows (zero grad every step: AdamW gives wd only);
        # an expert that received no tokens at step 1 (zero Muon input: U = 0 -> X = 0).
        g["model.embed_tokens.weight"][[3, 7, 11]] = 0.0
        if s == 1:
            g["model.layers.0.mlp.experts.gate_up_proj"][2] = 0.0
        grads.append(g)

    opt = ot.Optimizer(params)
    out = {f"step0.param.{n}": p for n, p in params.items()}
    cur = params
    for s, g in enumerate(grads, 1):
        cur = opt.step(cur, g, LR, WD)
        for n in cur:
            out[f"step{s}.grad.{n}"] = g[n]
            out[f"step{s}.param.{n}"] = cur[n]
            st = opt.state[n]
            if isinstance(st, ot.Muon):
                out[f"step{s}.muon_momentum.{n}"] = st.M.clone()
            else:
                out[f"step{s}.adam_m.{n}"] = st.m.clone()
                out[f"step{s}.adam_v.{n}"] = st.v.clone()

    # isolated Newton-Schulz (input not normalised; output includes the normalisation)
    for tag, shape in (("wide", (6, 10)), ("tall", (10, 6))):
        U = f32(rng.normal(0.0, 0.7, shape))
        X = ot.newton_schulz5(U)
        out[f"ns.{tag}.input"] = U
        out[f"ns.{tag}.output"] = X

    # sanity: the NS output of a well-conditioned matrix is close to semi-orthogonal,
    # and the per-expert path equals running each expert alone
    for tag in ("wide", "tall"):
        X = out[f"ns.{tag}.output"]
        sv = torch.linalg.svdvals(X)
        assert 0.5 < float(sv.min()) and float(sv.max()) < 1.3, (tag, sv)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    for e in range(3):
        single = ot.Optimizer({"w": params[name][e]}, routing={"w": "muon"}, decay={"w": True})
        w = params[name][e]
        for g in grads:
            w = single.step({"w": w}, {"w": g[name][e]}, LR, WD)["w"]
        assert torch.allclose(w, cur[name][e], rtol=0, atol=1e-15), e
    # AdamW tensors: independent check against torch.optim.AdamW in float64
    for n, p0 in params.items():
        if opt.routing[n] != "adamw":
            continue
        w = torch.nn.Parameter(p0.clone())
        tor = torch.optim.AdamW([w], lr=LR, betas=ot.ADAMW_BETAS, eps=ot.ADAMW_EPS,
                                weight_decay=WD if opt.decay[n] else 0.0)
        for s, g in enumerate(grads, 1):
            w.grad = g[n].clone()
            tor.step()
            err = float((w.detach() - out[f"step{s}.param.{n}"]).abs().max())
            assert err < 1e-14, (n, s, err)
    # step 1 for an expert with zero grad: only weight decay
    assert torch.allclose(out[f"step1.param.{name}"][2], params[name][2] * (1 - LR * WD),
                          rtol=0, atol=1e-15)

    tensors = {k: v.to(torch.float32).contiguous() for k, v in out.items()}
    d = os.path.join(FIXTURES, "optim")
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, "optim.safetensors"),
              {"generator": "tests/reference/make_optim_fixtures.py"})
    meta = {
        "generator": "tests/reference/make_optim_fixtures.py (optim_twin.py, float64)",
        "steps": STEPS, "lr": LR, "weight_decay": WD,
        "muon": {"momentum": ot.MUON_MOMENTUM, "nesterov": ot.MUON_NESTEROV,
                 "ns_steps": ot.MUON_NS_STEPS, "ns_coeffs": list(ot.MUON_NS_COEFFS),
                 "norm_eps": ot.MUON_NORM_EPS, "scale": ot.MUON_SCALE,
                 "rule": "M = mu*M + G; U = G + mu*M; X = NS5(U / (||U||_F + 1e-7)) "
                         "(transposed while orthogonalising if rows > cols); "
                         "W -= lr * (0.2*sqrt(max(rows, cols))*X + wd*W)"},
        "adamw": {"betas": list(ot.ADAMW_BETAS), "eps": ot.ADAMW_EPS,
                  "rule": "m = b1*m + (1-b1)*G; v = b2*v + (1-b2)*G^2; "
                          "W -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd*W)"},
        "weight_decay_rule": "decoupled, uses W before the step; applied to Muon matrices, "
                             "embedding/lm_head and conv weights; not to 1-D tensors",
        "tensors": {n: {"shape": list(shape), "optimizer": opt.routing[n],
                        "weight_decay": WD if opt.decay[n] else 0.0}
                    for n, shape, _, _, _ in PARAMS},
        "muon_per_expert": "[E, r, c] is E independent Muon matrices [r, c], each with its "
                           "own momentum and its own Frobenius normalisation",
        "naming": "step0.param.NAME, step{s}.grad.NAME, step{s}.param.NAME, "
                  "step{s}.muon_momentum.NAME, step{s}.adam_m.NAME, step{s}.adam_v.NAME",
        "edge_cases": ["embedding rows 3, 7, 11 have zero gradient at every step",
                       "gate_up_proj expert 2 has zero gradient at step 1 (U = 0, X = 0)"],
        "newton_schulz": "ns.{wide,tall}.output = NS5(input / (||input||_F + 1e-7)), "
                         "tall inputs transposed while iterating; no 0.2*sqrt scale",
        "precision": "inputs are exact F32 values; computed in float64, state carried in "
                     "float64 between steps, stored rounded to F32",
    }
    # the routing of every tensor of a whole model (the untied case, so lm_head is covered)
    import zaya_twin as zt
    _, Wm = zt.load_model_dir(os.path.join(FIXTURES, ROUTING_CASE))
    meta["model_routing_case"] = ROUTING_CASE
    meta["model_routing"] = {
        n: {"optimizer": ot.route(n, tuple(t.shape)),
            "weight_decay": bool(ot.weight_decay_applies(n, tuple(t.shape)))}
        for n, t in sorted(Wm.items())}
    with open(os.path.join(d, "optim.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    back = load_file(os.path.join(d, "optim.safetensors"))
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"[optim] {len(tensors)} tensors, wrote {d} ({size / 1024:.0f} KiB)")
    return size


def make_balancer():
    rng = np.random.RandomState(20261123)
    L, E = 2, 4
    b0 = torch.zeros(L, E + 1, dtype=torch.float64)
    b0[:, :E] = f32(rng.normal(0.0, 0.01, (L, E)))
    b0[:, E] = -1.0
    counts = [
        [[40, 10, 5, 9, 0], [16, 16, 16, 16, 3]],     # layer 1 already balanced: g = 0
        [[30, 0, 12, 22, 7], [20, 14, 18, 12, 0]],    # an expert with zero tokens
        [[1000, 1, 2, 3, 64], [9, 12, 30, 13, 100]],  # heavy skew, many skips (ignored)
        [[8, 8, 9, 7, 1], [0, 0, 0, 50, 2]],
    ]
    bal = [ot.BiasBalancer(b0[l]) for l in range(L)]
    out = {"biases.step0": b0.to(torch.float32)}
    for s, c in enumerate(counts, 1):
        c = torch.tensor(c, dtype=torch.int64)
        out[f"counts.step{s}"] = c
        out[f"biases.step{s}"] = torch.stack([bal[l].step(c[l]) for l in range(L)]).float()
        out[f"adam_m.step{s}"] = torch.stack([bal[l].m for l in range(L)]).float()
        out[f"adam_v.step{s}"] = torch.stack([bal[l].v for l in range(L)]).float()
        assert torch.all(out[f"biases.step{s}"][:, E] == -1.0)
    # step 1, layer 1 is balanced: no change
    assert torch.equal(out["biases.step1"][1], out["biases.step0"][1])
    d = os.path.join(FIXTURES, "balancer")
    os.makedirs(d, exist_ok=True)
    save_file(out, os.path.join(d, "balancer.safetensors"),
              {"generator": "tests/reference/make_optim_fixtures.py"})
    meta = {
        "generator": "tests/reference/make_optim_fixtures.py (optim_twin.BiasBalancer, float64)",
        "layers": L, "num_experts": E, "steps": len(counts),
        "lr": ot.BALANCER_LR, "betas": list(ot.BALANCER_BETAS), "eps": ot.BALANCER_EPS,
        "weight_decay": 0.0,
        "rule": "per layer, per step: f[e] = cnt[e] / sum_{e<E} cnt[e] (real experts only; the "
                "skip count cnt[E] is ignored); g = f - 1/E; m = b1*m + (1-b1)*g; "
                "v = b2*v + (1-b2)*g^2; b[e] -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) "
                "for e < E; b[E] (skip) never changes",
        "tensors": "biases.step0 [L,E+1] F32; counts.step{s} [L,E+1] I64 (last column = skip); "
                   "biases.step{s} [L,E+1] F32; adam_m.step{s}, adam_v.step{s} [L,E] F32",
        "initial_biases": "real experts ~N(0, 0.01^2) rounded to F32; skip = -1",
        "precision": "computed in float64 from the F32 initial biases, state carried in "
                     "float64, stored rounded to F32",
    }
    with open(os.path.join(d, "balancer.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    back = load_file(os.path.join(d, "balancer.safetensors"))
    assert all(torch.equal(back[k], out[k]) for k in out)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"[balancer] wrote {d} ({size / 1024:.0f} KiB)")
    return size


def main():
    torch.set_num_threads(1)
    total = make_optim() + make_balancer()
    print(f"total {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
