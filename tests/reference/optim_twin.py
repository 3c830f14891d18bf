"""Reference optimizers for zaya training (spec project decisions 4/5, §B, §C.3-C.5).

Everything here runs in float64 on torch tensors; the state is kept in float64 too.

* `route(name, shape)` -> "muon" | "muon_per_expert" | "adamw" | "none": which optimizer
  owns a canonical (HF 40-block) tensor, and `weight_decay_applies(name, shape)`.
* `newton_schulz5(U)`: the Muon orthogonalisation of one 2-D matrix, including the
  Frobenius normalisation and the tall-matrix transpose.
* `Muon`, `AdamW`: one state object per parameter tensor; `step(W, G, lr, wd)` returns
  the new W (inputs are not modified).
* `Optimizer`: routes a {name: tensor} parameter set to Muon / AdamW per `route`.
* `BiasBalancer`: the Adam-style selection-bias controller of §B / decision 4.
"""

import math

import torch

# --------------------------------------------------------------------------- constants
MUON_MOMENTUM = 0.95
MUON_NESTEROV = True
MUON_NS_STEPS = 5
MUON_NS_COEFFS = (3.4445, -4.7750, 2.0315)
MUON_NORM_EPS = 1e-7
MUON_SCALE = 0.2            # update = MUON_SCALE * sqrt(max(rows, cols)) * NS(U)

ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8

BALANCER_LR = 1e-3
BALANCER_BETAS = (0.9, 0.999)
BALANCER_EPS = 1e-8

# suffixes of the 2-D hidden matrices that Muon owns (canonical names)
_MUON_MATRICES = (
    ".self_attn.qkv_proj.q_proj.weight",
    ".self_attn.qkv_proj.k_proj.weight",
    ".self_attn.qkv_proj.v_proj_current.weight",
    ".self_attn.qkv_proj.v_proj_delayed.weight",
    ".self_attn.o_proj.weight",
    ".mlp.gate.down_proj.weight",
    ".mlp.gate.router_mlp.fc1.weight",
    ".mlp.gate.router_mlp.fc2.weight",
    ".mlp.gate.router_mlp.out_proj.weight",
)
_MUON_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")  # [E, r, c]


# ----------------------------------------------------------------------------- routing
def route(name, shape):
    """Optimizer owning a canonical tensor.

    "muon"            2-D hidden matrix (one Muon matrix)
    "muon_per_expert" stacked experts [E, r, c]: E independent Muon matrices [r, c]
    "adamw"           embedding, untied lm_head, conv weights (3-D), every 1-D tensor
    "none"            balancing_biases (owned by BiasBalancer, never by the optimizer)
    """
    if name.endswith(".mlp.gate.balancing_biases"):
        return "none"
    if name.endswith(_MUON_EXPERTS):
        assert len(shape) == 3, (name, shape)
        return "muon_per_expert"
    if name.endswith(_MUON_MATRICES):
        assert len(shape) == 2, (name, shape)
        return "muon"
    return "adamw"


def weight_decay_applies(name, shape):
    """Decoupled wd on Muon matrices, embedding / lm_head, conv weights; none on 1-D."""
    if route(name, shape) == "none":
        return False
    return len(shape) >= 2


# -------------------------------------------------------------------------------- Muon
def newton_schulz5(U, steps=MUON_NS_STEPS, coeffs=MUON_NS_COEFFS, eps=MUON_NORM_EPS):
    """Approximate orthogonalisation of a 2-D matrix U [rows, cols] (float64).

    X = U / (||U||_F + eps); if rows > cols, X = X^T; `steps` times:
        A = X X^T;  B = b A + c A A;  X = a X + B X
    transpose back if transposed. Returns a new [rows, cols] tensor.
    """
    assert U.dim() == 2
    a, b, c = coeffs
    X = U.to(torch.float64) / (U.to(torch.float64).norm() + eps)
    transposed = U.shape[0] > U.shape[1]
    if transposed:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if transposed:
        X = X.T
    return X.contiguous()


class Muon:
    """Muon state for one parameter tensor: 2-D, or [E, r, c] treated as E matrices."""

    def __init__(self, shape, momentum=MUON_MOMENTUM, nesterov=MUON_NESTEROV):
        self.M = torch.zeros(shape, dtype=torch.float64)
        self.momentum = momentum
        self.nesterov = nesterov
        self.t = 0

    def _update(self, G, M):
        """One matrix: updates M in place, returns the orthogonalised direction."""
        mu = self.momentum
        M.mul_(mu).add_(G)                        # M <- mu M + G
        U = G + mu * M if self.nesterov else M.clone()
        X = newton_schulz5(U)
        rows, cols = G.shape
        return MUON_SCALE * math.sqrt(max(rows, cols)) * X

    def step(self, W, G, lr, wd):
        W = W.to(torch.float64)
        G = G.to(torch.float64)
        self.t += 1
        if W.dim() == 2:
            D = self._update(G, self.M)
        else:
            D = torch.stack([self._update(G[e], self.M[e]) for e in range(W.shape[0])])
        return W - lr * (D + wd * W)


# ------------------------------------------------------------------------------- AdamW
class AdamW:
    """AdamW state for one tensor; bias-corrected, decoupled weight decay."""

    def __init__(self, shape, betas=ADAMW_BETAS, eps=ADAMW_EPS):
        self.m = torch.zeros(shape, dtype=torch.float64)
        self.v = torch.zeros(shape, dtype=torch.float64)
        self.betas = betas
        self.eps = eps
        self.t = 0

    def step(self, W, G, lr, wd):
        W = W.to(torch.float64)
        G = G.to(torch.float64)
        b1, b2 = self.betas
        self.t += 1
        self.m.mul_(b1).add_((1 - b1) * G)
        self.v.mul_(b2).add_((1 - b2) * G * G)
        m_hat = self.m / (1 - b1 ** self.t)
        v_hat = self.v / (1 - b2 ** self.t)
        return W - lr * (m_hat / (v_hat.sqrt() + self.eps) + wd * W)


# ----------------------------------------------------------------- routed optimizer
class Optimizer:
    """Muon + AdamW over a {name: tensor} set, routed by `route`.

    `routing` optionally overrides the name-based routing: {name: "muon" |
    "muon_per_expert" | "adamw"}; `decay` likewise {name: bool}.
    """

    def __init__(self, params, routing=None, decay=None):
        self.routing = {n: (routing or {}).get(n) or route(n, tuple(p.shape))
                        for n, p in params.items()}
        self.decay = {n: (decay or {}).get(n, weight_decay_applies(n, tuple(p.shape)))
                      for n, p in params.items()}
        self.state = {}
        for n, p in params.items():
            r = self.routing[n]
            if r == "none":
                continue
            self.state[n] = Muon(p.shape) if r.startswith("muon") else AdamW(p.shape)

    def step(self, params, grads, lr, wd):
        """Returns the new {name: float64 tensor}; `params` is not modified."""
        out = {}
        for n, p in params.items():
            if n not in self.state:
                out[n] = p.to(torch.float64).clone()
                continue
            out[n] = self.state[n].step(p, grads[n], lr, wd if self.decay[n] else 0.0)
        return out


# ------------------------------------------------------------------------ bias balancer
class BiasBalancer:
    """Adam-style controller on one layer's selection biases b [E+1] (last = skip).

    Per step, from int64 counts cnt [E+1] (tokens whose e* was each class, global batch):
        f[e] = cnt[e] / sum_{e<E} cnt[e]          (real experts only)
        g[e] = f[e] - 1/E
        m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  m_hat, v_hat bias-corrected
        b[e] <- b[e] - lr * m_hat / (sqrt(v_hat) + eps)      for e < E
    The skip bias b[E] is never changed (frozen at its value, -1 by default).
    """

    def __init__(self, biases, lr=BALANCER_LR, betas=BALANCER_BETAS, eps=BALANCER_EPS):
        self.b = biases.to(torch.float64).clone()
        E = self.b.numel() - 1
        self.E = E
        self.m = torch.zeros(E, dtype=torch.float64)
        self.v = torch.zeros(E, dtype=torch.float64)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0

    def step(self, counts):
        counts = torch.as_tensor(counts, dtype=torch.int64)
        assert counts.numel() == self.E + 1
        real = counts[:self.E]
        total = int(real.sum())
        assert total > 0, "no token chose a real expert: load fractions undefined"
        f = real.to(torch.float64) / total
        g = f - 1.0 / self.E
        b1, b2 = self.betas
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        m_hat = self.m / (1 - b1 ** self.t)
        v_hat = self.v / (1 - b2 ** self.t)
        self.b[:self.E] -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
        return self.b.clone()
