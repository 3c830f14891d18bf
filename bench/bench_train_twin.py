#!/usr/bin/python3
"""Training-step benchmark of the PyTorch twin: the peer for bench_train's tokens/s.

The same step as bench/bench_train.cpp, in float32 PyTorch with autograd:
  * forward: tests/reference/zaya_twin.py's functions; the attention is the twin's batched
    `cca_attention_fast`, the MoE is `moe_train` below (tokens sorted by expert once, one
    GEMM pair per expert, out-of-place so autograd can differentiate it); loss = mean
    next-token cross-entropy over B*(T-1) predictions;
  * backward: loss.backward() into .grad of every trainable tensor (all but the balancing
    biases);
  * global grad-norm clip to 1.0 (torch.nn.utils.clip_grad_norm_);
  * the routed optimizer of tests/reference/optim_twin.py (`route`, `weight_decay_applies`),
    vectorised in float32: Muon (momentum 0.95, Nesterov, 5 Newton-Schulz steps with the
    (3.4445, -4.7750, 2.0315) coefficients, update 0.2*sqrt(max(r,c))*NS(U), decoupled wd)
    on every 2-D hidden matrix and on each expert of the stacked expert tensors, with all
    matrices of one shape orthogonalised together by batched bmm; AdamW (0.9, 0.95, eps
    1e-8, bias-corrected, decoupled wd on >= 2-D tensors) via torch.optim.AdamW(foreach=True);
  * the bias balancer (Adam on f - 1/E per layer, lr 1e-3, (0.9, 0.999)), batched over layers.
Same model directory (`zaya init --preset zaya-60m --seed 1234`), same shapes (B=8, T=256,
one micro-batch), random ids with a fixed seed; 2 warm-up steps, median of >= 5 timed steps;
torch.set_num_threads(THREADS) (default 2). One JSON object on stdout, progress on stderr.

--check first verifies on a fixture of tests/fixtures (float64) that the training forward
(`forward_train`) gives the plain twin's loss and experts and that its autograd gradients match
the plain twin's autograd gradients and the stored grads.safetensors, and that the batched
float64 optimizer step equals optim_twin.Optimizer's.

Usage: /usr/bin/python3 bench/bench_train_twin.py --model DIR [--batch 8] [--seq 256]
       [--steps 7] [--warmup 2] [--threads 2] [--check [CASE]]
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "reference")
sys.path.insert(0, REF)
import optim_twin as ot  # noqa: E402
import zaya_twin as zt  # noqa: E402
from safetensors_io import load_file  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ training forward
def moe_train(cfg, W, layer, x, rho_prev):
    """As zaya_twin.moe (same function), batched and autograd-friendly: tokens sorted by
    expert once, one contiguous GEMM pair per expert, results scattered back with one
    index_select of the inverse permutation."""
    p = f"model.layers.{layer}.mlp."
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    probs, rho = zt.router(cfg, W, layer, x, rho_prev)
    choice = torch.argmax(probs + W[p + "gate.balancing_biases"], dim=-1)   # [B, T]
    w = probs.gather(-1, choice[..., None])                                # [B, T, 1]
    xf, cf = x.reshape(-1, x.shape[-1]), choice.reshape(-1)
    order = torch.argsort(cf, stable=True)
    counts = torch.bincount(cf, minlength=E + 1).tolist()
    xs = xf.index_select(0, order)
    gu_all, dn_all = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"]
    parts, start = [], 0
    for e in range(E):
        n = counts[e]
        if n:
            gu = xs[start:start + n] @ gu_all[e].T                          # [n, 2I]
            parts.append((F.silu(gu[:, :I]) * gu[:, I:]) @ dn_all[e].T)     # [n, D]
        start += n
    if counts[E]:
        skip = xs[start:]
        parts.append(skip if cfg.skip_expert_output == "identity" else torch.zeros_like(skip))
    ys = torch.cat(parts) if len(parts) > 1 else parts[0]
    y = ys.index_select(0, torch.argsort(order))                           # unsort
    return w * y.reshape(x.shape), rho, probs, choice


def forward_train(cfg, W, ids):
    """Loss (mean next-token CE) and the per-layer expert choices [L, B, T]; W must already be
    in the compute dtype (its tensors are the autograd leaves)."""
    e = W["model.embed_tokens.weight"][ids]
    r = (e + W["model.input_hidden_states_bias"]) * W["model.input_hidden_states_scale"]
    rho, experts = None, []
    for k in range(cfg.num_hidden_layers):
        p = f"model.layers.{k}."
        x = zt.rms_norm(r, W[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        a = zt.cca_attention_fast(cfg, W, k, x)
        r = zt.residual_scale(a, r, W, p + "post_attention_residual_scale.")
        x = zt.rms_norm(r, W[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        m, rho, _, choice = moe_train(cfg, W, k, x, rho)
        r = zt.residual_scale(m, r, W, p + "post_mlp_residual_scale.")
        experts.append(choice)
    y = zt.rms_norm(r, W["model.norm.weight"], cfg.rms_norm_eps)
    logits = zt.lm_head(cfg, W, y)
    return zt.next_token_loss(logits, ids), torch.stack(experts)


# ------------------------------------------------------------------ routed optimizer
class BatchedOptimizer:
    """optim_twin's routing (Muon per matrix / per expert, AdamW for the rest), vectorised."""

    def __init__(self, params, wd=0.1, lr=4e-4):
        self.wd = wd
        self.groups = {}  # (rows, cols) -> list of (name, tensor)
        adam_decay, adam_nodecay = [], []
        for n, t in params.items():
            r = ot.route(n, tuple(t.shape))
            if r == "none":
                continue
            if r.startswith("muon"):
                self.groups.setdefault(tuple(t.shape[-2:]), []).append((n, t))
            elif ot.weight_decay_applies(n, tuple(t.shape)):
                adam_decay.append(t)
            else:
                adam_nodecay.append(t)
        self.momentum = {}
        for key, lst in self.groups.items():
            count = sum(t.numel() // (key[0] * key[1]) for _, t in lst)
            self.momentum[key] = torch.zeros((count,) + key, dtype=lst[0][1].dtype)
        self.adam = torch.optim.AdamW(
            [{"params": adam_decay, "weight_decay": wd}, {"params": adam_nodecay, "weight_decay": 0.0}],
            lr=lr, betas=ot.ADAMW_BETAS, eps=ot.ADAMW_EPS, foreach=True)
        self.muon_matrices = sum(m.shape[0] for m in self.momentum.values())

    @staticmethod
    def newton_schulz(U, steps=ot.MUON_NS_STEPS):
        """Batched optim_twin.newton_schulz5: U [n, r, c] -> [n, r, c]."""
        a, b, c = ot.MUON_NS_COEFFS
        X = U / (torch.linalg.matrix_norm(U)[:, None, None] + ot.MUON_NORM_EPS)
        transposed = U.shape[1] > U.shape[2]
        if transposed:
            X = X.transpose(1, 2)
        for _ in range(steps):
            A = torch.bmm(X, X.transpose(1, 2))
            B = torch.baddbmm(A, A, A, beta=b, alpha=c)        # b A + c A A
            X = torch.baddbmm(X, B, X, beta=a)                 # a X + B X
        return X.transpose(1, 2) if transposed else X

    @torch.no_grad()
    def step(self, lr):
        mu = ot.MUON_MOMENTUM
        for key, lst in self.groups.items():
            r, c = key
            G = torch.cat([t.grad.reshape(-1, r, c) for _, t in lst])
            M = self.momentum[key]
            M.mul_(mu).add_(G)
            U = G.add_(M, alpha=mu) if ot.MUON_NESTEROV else M.clone()
            X = self.newton_schulz(U)
            scale = ot.MUON_SCALE * math.sqrt(max(r, c))
            i = 0
            for _, t in lst:
                k = t.numel() // (r * c)
                t.mul_(1 - lr * self.wd).add_(X[i:i + k].reshape(t.shape), alpha=-lr * scale)
                i += k
        for g in self.adam.param_groups:
            g["lr"] = lr
        self.adam.step()


class BatchedBalancer:
    """optim_twin.BiasBalancer for all layers at once (skip bias frozen)."""

    def __init__(self, biases):
        self.b = biases            # list of L [E+1] tensors (model parameters, updated in place)
        L, E = len(biases), biases[0].numel() - 1
        self.E = E
        self.m = torch.zeros(L, E, dtype=torch.float64)
        self.v = torch.zeros(L, E, dtype=torch.float64)
        self.t = 0

    @torch.no_grad()
    def step(self, experts):
        L = experts.shape[0]
        cls = experts.reshape(L, -1) + (self.E + 1) * torch.arange(L)[:, None]
        counts = torch.bincount(cls.reshape(-1), minlength=L * (self.E + 1)).reshape(L, self.E + 1)
        real = counts[:, :self.E].to(torch.float64)
        f = real / real.sum(dim=1, keepdim=True).clamp_min(1)
        g = f - 1.0 / self.E
        b1, b2 = ot.BALANCER_BETAS
        self.t += 1
        self.m.mul_(b1).add_((1 - b1) * g)
        self.v.mul_(b2).add_((1 - b2) * g * g)
        upd = ot.BALANCER_LR * (self.m / (1 - b1 ** self.t)) / ((self.v / (1 - b2 ** self.t)).sqrt() + ot.BALANCER_EPS)
        for k, bias in enumerate(self.b):
            bias[:self.E] -= upd[k].to(bias.dtype)


# ------------------------------------------------------------------ fixture check
def check_fixture(case_dir):
    """float64: forward_train vs the plain twin (loss, experts, autograd grads) and the stored
    grads; the batched optimizer vs optim_twin.Optimizer for one step."""
    cfg, W0 = zt.load_model_dir(case_dir)
    with open(os.path.join(case_dir, "ids.json")) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)

    def leaves():
        return {n: t.to(torch.float64).detach().clone().requires_grad_(ot.route(n, tuple(t.shape)) != "none")
                for n, t in W0.items()}
    Wp, Wf = leaves(), leaves()
    plain = zt.forward(cfg, Wp, ids, dtype=torch.float64)
    plain["loss"].backward()
    loss, experts = forward_train(cfg, Wf, ids)
    loss.backward()
    ref = load_file(os.path.join(case_dir, "grads.safetensors"))
    trainable = [n for n in Wf if Wf[n].requires_grad]
    res = {"case": os.path.basename(case_dir),
           "loss_diff": abs(float(loss) - float(plain["loss"])),
           "experts_equal": bool(torch.equal(experts, plain["experts"])),
           "grad_vs_plain_max_abs": max(float((Wf[n].grad - Wp[n].grad).abs().max()) for n in trainable),
           "grad_vs_fixture_max_abs": max(float((Wf[n].grad - ref[n].double()).abs().max()) for n in trainable)}
    # optimizer: batched (float64 here) vs the reference, one step from the same grads
    params = {n: Wf[n].detach().clone() for n in Wf}
    grads = {n: Wf[n].grad.clone() for n in trainable}
    want = ot.Optimizer(params).step(params, grads, 1e-2, 0.1)
    live = {n: t.clone().requires_grad_(n in grads) for n, t in params.items()}
    for n in grads:
        live[n].grad = grads[n].clone()
    BatchedOptimizer(live, wd=0.1).step(1e-2)
    res["optimizer_vs_reference_max_abs"] = max(float((live[n].detach() - want[n]).abs().max()) for n in params)
    res["ok"] = (res["experts_equal"] and res["loss_diff"] < 1e-12 and res["grad_vs_plain_max_abs"] < 1e-12
                 and res["grad_vs_fixture_max_abs"] < 1e-6 and res["optimizer_vs_reference_max_abs"] < 1e-12)
    log(f"check {res['case']}: {'ok' if res['ok'] else 'FAIL'} {res}")
    return res


# ------------------------------------------------------------------ benchmark
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory written by `zaya init`")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--check", nargs="?", const="gqa2_sliding_identity_untied", default=None,
                    help="verify on tests/fixtures/CASE first (default gqa2_sliding_identity_untied)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": args.model}
    if args.check:
        r = check_fixture(os.path.join(HERE, "..", "tests", "fixtures", args.check))
        out["check"] = r
        if not r["ok"]:
            print(json.dumps(out, indent=2))
            sys.exit(1)
    if not args.model:
        print(json.dumps(out, indent=2))
        return

    cfg, W = zt.load_model_dir(args.model)
    W = {n: t.to(torch.float32).contiguous().requires_grad_(ot.route(n, tuple(t.shape)) != "none")
         for n, t in W.items()}
    trainable = [t for t in W.values() if t.requires_grad]
    opt = BatchedOptimizer(W, wd=0.1, lr=args.lr)
    bal = BatchedBalancer([W[f"model.layers.{k}.mlp.gate.balancing_biases"] for k in range(cfg.num_hidden_layers)])
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)

    def step():
        t0 = time.perf_counter()
        for t in trainable:
            t.grad = None
        loss, experts = forward_train(cfg, W, ids)
        loss.backward()
        t1 = time.perf_counter()
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, args.clip) if args.clip > 0 else torch.tensor(0.0)
        opt.step(args.lr)
        bal.step(experts)
        t2 = time.perf_counter()
        return t2 - t0, t1 - t0, t2 - t1, float(loss), float(gnorm)

    for i in range(args.warmup):
        s = step()
        log(f"twin warm-up step {i + 1}: {1e3 * s[0]:.1f} ms (fwd+bwd {1e3 * s[1]:.1f}, optimizer {1e3 * s[2]:.1f}), "
            f"loss {s[3]:.4f}, grad norm {s[4]:.3f}")
    rows = []
    for i in range(args.steps):
        s = step()
        rows.append(s)
        log(f"twin step {i + 1}: {1e3 * s[0]:.1f} ms (fwd+bwd {1e3 * s[1]:.1f}, optimizer {1e3 * s[2]:.1f}) = "
            f"{B * T / s[0]:.0f} tok/s, loss {s[3]:.4f}, grad norm {s[4]:.3f}")
    tps = [B * T / r[0] for r in rows]
    med = statistics.median
    out.update({"B": B, "T": T, "muon_matrices": opt.muon_matrices,
                "tokens_per_s": {"median": med(tps), "min": min(tps), "max": max(tps), "runs": len(tps)},
                "step_seconds": {"median": med(r[0] for r in rows)},
                "fwd_bwd_seconds": {"median": med(r[1] for r in rows)},
                "optimizer_seconds": {"median": med(r[2] for r in rows)},
                "losses": [r[3] for r in rows]})
    log(f"twin median: {med(tps):.0f} tok/s (min {min(tps):.0f}, max {max(tps):.0f}); fwd+bwd "
        f"{1e3 * out['fwd_bwd_seconds']['median']:.1f} ms, optimizer {1e3 * out['optimizer_seconds']['median']:.1f} ms")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
