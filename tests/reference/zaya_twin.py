"""PyTorch reference twin of the ZAYA1 model (written from docs/zaya1-spec.md A.1-A.8, A.11).

Two independent implementations of the same forward pass:

* `forward(cfg, weights, ids, dtype=torch.float64)` -- vectorised prefill over a whole
  [B, T] batch (F.conv1d for the CCA convolutions, masked batched attention).
* `forward_stepwise(cfg, weights, ids)` -- a deliberately naive token-by-token decoder
  (spec F.2: explicit conv state / delayed-value state / KV cache, Python loops over
  heads, channels-by-formula conv, per-token MoE). It shares no sub-layer code with
  `forward`, so agreement between the two catches bugs in the vectorised code.

`weights` maps canonical (HF 40-block) tensor names to tensors of any dtype; they are
converted to the compute dtype. The original 80-half-layer names are produced / read by
`canonical_to_original` / `original_to_canonical`. `load_model_dir` reads a HF-style
directory (config.json + model.safetensors or a sharded index).

Shape legend: B batch, T time, D hidden, Hq / Hkv heads, dh head dim, C = (Hq+Hkv)*dh
conv channels, R router latent, E experts (class E = skip), I expert intermediate, V vocab.
"""

import json
import math
import os

import torch
import torch.nn.functional as F

# QK-norm clamp on the L2 norm: float32 machine epsilon (spec A.6, HF S4 behaviour).
QK_NORM_EPS = 1.1920929e-07


# ----------------------------------------------------------------------------- config
class ZayaConfig:
    """The subset of a HF `config.json` (model_type "zaya") the forward pass needs."""

    def __init__(self, d):
        self.raw = dict(d)
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(d["num_key_value_heads"])
        self.head_dim = int(d.get("head_dim") or self.hidden_size // self.num_attention_heads)
        self.rms_norm_eps = float(d["rms_norm_eps"])
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", True))
        self.lm_head_bias = bool(d.get("lm_head_bias", False))
        self.moe_intermediate_size = int(d["moe_intermediate_size"])
        self.num_experts = int(d["num_experts"])
        self.num_experts_per_tok = int(d.get("num_experts_per_tok", 1))
        self.router_hidden_size = int(d["router_hidden_size"])
        self.cca_time0 = int(d.get("cca_time0", 2))
        self.cca_time1 = int(d.get("cca_time1", 2))
        self.layer_types = list(d.get("layer_types") or ["hybrid"] * self.num_hidden_layers)
        self.sliding_window = d.get("sliding_window")
        self.skip_expert_output = d.get("skip_expert_output", "zero")
        rp = d.get("rope_parameters") or {}
        if "rope_theta" in rp:  # one flat dict for all layer types
            rp = {t: rp for t in ("hybrid", "hybrid_sliding")}
        self.rope = {}
        for t in ("hybrid", "hybrid_sliding"):
            p = rp.get(t, {})
            assert p.get("rope_type", "default") == "default", p
            self.rope[t] = (float(p.get("rope_theta", d.get("rope_theta", 10000.0))),
                            float(p.get("partial_rotary_factor",
                                        d.get("partial_rotary_factor", 1.0))))
        assert self.num_experts_per_tok == 1
        assert self.num_attention_heads % self.num_key_value_heads == 0
        assert self.skip_expert_output in ("zero", "identity")
        assert len(self.layer_types) == self.num_hidden_layers
        assert all(t in ("hybrid", "hybrid_sliding") for t in self.layer_types)

    @staticmethod
    def load(path):
        with open(path) as f:
            return ZayaConfig(json.load(f))

    def rotary_dim(self, layer):
        """rd = int(dh * partial_rotary_factor) for the layer's type."""
        return int(self.head_dim * self.rope[self.layer_types[layer]][1])

    def rope_theta(self, layer):
        return self.rope[self.layer_types[layer]][0]


# ----------------------------------------------------------------------- sub-layers
def rms_norm(x, w, eps):
    """x: [..., N], w: [N] -> w * x / sqrt(mean(x^2) + eps)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def residual_scale(h, r, W, prefix):
    """Merge sub-layer output h into residual r (bias added before scale). [B,T,D] each."""
    return ((h + W[prefix + "hidden_states_bias"]) * W[prefix + "hidden_states_scale"]
            + (r + W[prefix + "residual_bias"]) * W[prefix + "residual_scale"])


def cca_conv(u, w0, b0, w1, b1, t0, t1, groups):
    """Causal two-stage CCA convolution over time.

    u: [B, T, C] raw concat(q, k). w0: [C, 1, t0] depthwise, w1: [C, C/groups, t1].
    Left zero-pad P = (t0-1)+(t1-1) rows *before* the first conv, so the first conv's
    outputs at padded times equal its bias. Returns z: [B, T, C].
    """
    C = u.shape[-1]
    P = (t0 - 1) + (t1 - 1)
    x = F.pad(u.transpose(1, 2), (P, 0))               # [B, C, T+P]
    y = F.conv1d(x, w0, b0, groups=C)                  # [B, C, T+t1-1]
    z = F.conv1d(y, w1, b1, groups=groups)             # [B, C, T]
    return z.transpose(1, 2)


def rope_cos_sin(T, rd, theta, dtype):
    """cos/sin tables [T, rd/2] for NeoX rotate-half RoPE on `rd` dims."""
    i = torch.arange(rd // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / rd)                # [rd/2]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin, rd):
    """x: [B, T, H, dh]; rotate dims [0, rd) (a = first half, b = second half)."""
    if rd == 0:
        return x
    h = rd // 2
    a, b, rest = x[..., :h], x[..., h:rd], x[..., rd:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]  # [1, T, 1, rd/2]
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)


def cca_attention(cfg, W, layer, x):
    """CCA attention sub-layer. x: [B, T, D] (normed) -> o_proj output [B, T, D]."""
    p = f"model.layers.{layer}.self_attn."
    B, T, _ = x.shape
    Hq, Hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n_rep = Hq // Hkv

    q = x @ W[p + "qkv_proj.q_proj.weight"].T          # [B, T, Hq*dh]
    k = x @ W[p + "qkv_proj.k_proj.weight"].T          # [B, T, Hkv*dh]
    u = torch.cat([q, k], dim=-1)                      # [B, T, C]
    z = cca_conv(u, W[p + "qkv_proj.conv_qk_depthwise.weight"],
                 W[p + "qkv_proj.conv_qk_depthwise.bias"],
                 W[p + "qkv_proj.conv_qk_grouped.weight"],
                 W[p + "qkv_proj.conv_qk_grouped.bias"],
                 cfg.cca_time0, cfg.cca_time1, Hq + Hkv)
    zq = z[..., : Hq * dh].reshape(B, T, Hq, dh)
    zk = z[..., Hq * dh :].reshape(B, T, Hkv, dh)

    # mean paths from pre-conv projections
    qh = q.reshape(B, T, Hq, dh)
    kh = k.reshape(B, T, Hkv, dh)
    qres = 0.5 * (qh + kh.repeat_interleave(n_rep, dim=2))       # [B, T, Hq, dh]
    kres = qres.reshape(B, T, Hkv, n_rep, dh).mean(dim=3)         # [B, T, Hkv, dh]
    Q = zq + qres
    K = zk + kres

    # values: [current | delayed] viewed as [Hkv, dh]
    v_cur = x @ W[p + "qkv_proj.v_proj_current.weight"].T         # [B, T, Hkv*dh/2]
    x_prev = F.pad(x, (0, 0, 1, 0))[:, :T]                        # x_{t-1}, x_{-1} = 0
    v_del = x_prev @ W[p + "qkv_proj.v_proj_delayed.weight"].T    # [B, T, Hkv*dh/2]
    V = torch.cat([v_cur, v_del], dim=-1).reshape(B, T, Hkv, dh)

    # QK-norm (clamped L2 norm), key temperature
    Q = Q * (math.sqrt(dh) / Q.norm(dim=-1, keepdim=True).clamp_min(QK_NORM_EPS))
    K = K * (math.sqrt(dh) / K.norm(dim=-1, keepdim=True).clamp_min(QK_NORM_EPS))
    K = K * W[p + "qk_norm.temp"][None, None, :, None]

    # partial NeoX RoPE
    rd = cfg.rotary_dim(layer)
    cos, sin = rope_cos_sin(T, rd, cfg.rope_theta(layer), x.dtype)
    Q = apply_rope(Q, cos, sin, rd)
    K = apply_rope(K, cos, sin, rd)

    # causal (optionally sliding) GQA attention
    Kr = K.repeat_interleave(n_rep, dim=2)             # [B, T, Hq, dh]
    Vr = V.repeat_interleave(n_rep, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", Q, Kr) / math.sqrt(dh)   # [B, Hq, T, T]
    t = torch.arange(T)
    allowed = t[None, :] <= t[:, None]                 # [T(query), T(key)]
    if cfg.layer_types[layer] == "hybrid_sliding":
        allowed = allowed & (t[:, None] - t[None, :] < cfg.sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    o = torch.einsum("bhts,bshd->bthd", attn, Vr).reshape(B, T, Hq * dh)
    return o @ W[p + "o_proj.weight"].T                # [B, T, D]


def router(cfg, W, layer, x, rho_prev):
    """EDA router. x: [B,T,D]; rho_prev: [B,T,R] or None.

    Returns (probs [B,T,E+1], rho [B,T,R]).
    """
    p = f"model.layers.{layer}.mlp.gate."
    r = x @ W[p + "down_proj.weight"].T + W[p + "down_proj.bias"]          # [B, T, R]
    if layer >= 1:
        r = r + W[p + "router_states_scale"] * rho_prev
    h = rms_norm(r, W[p + "router_mlp.norm.weight"], cfg.rms_norm_eps)
    h = F.gelu(h @ W[p + "router_mlp.fc1.weight"].T + W[p + "router_mlp.fc1.bias"])
    h = F.gelu(h @ W[p + "router_mlp.fc2.weight"].T + W[p + "router_mlp.fc2.bias"])
    s = h @ W[p + "router_mlp.out_proj.weight"].T                        # [B, T, E+1]
    return torch.softmax(s, dim=-1), r


def moe(cfg, W, layer, x, rho_prev):
    """Top-1 MoE with skip class. x: [B,T,D] -> (out [B,T,D], rho, probs, choice [B,T])."""
    p = f"model.layers.{layer}.mlp."
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    probs, rho = router(cfg, W, layer, x, rho_prev)
    choice = torch.argmax(probs + W[p + "gate.balancing_biases"], dim=-1)  # [B, T]
    w = probs.gather(-1, choice[..., None])                               # [B, T, 1]

    # dispatch: each token runs only its selected expert (or the skip path)
    xf, cf = x.reshape(-1, x.shape[-1]), choice.reshape(-1)               # [N, D], [N]
    y = torch.zeros_like(xf)                                              # [N, D]
    for e in range(E):
        sel = (cf == e).nonzero(as_tuple=True)[0]
        if sel.numel() == 0:
            continue
        gu = xf[sel] @ W[p + "experts.gate_up_proj"][e].T                 # [n, 2I]
        act = F.silu(gu[:, :I]) * gu[:, I:]                               # [n, I]
        y[sel] = act @ W[p + "experts.down_proj"][e].T                    # [n, D]
    if cfg.skip_expert_output == "identity":
        sel = (cf == E).nonzero(as_tuple=True)[0]
        y[sel] = xf[sel]
    out = w * y.reshape(x.shape)                                          # zero-skip: y = 0
    return out, rho, probs, choice


# ------------------------------------------------- fast batched variants (benchmarks)
# Same function as `cca_attention` / `moe`, written with standard batched torch ops so the
# twin is a fair performance peer: GQA without repeat_interleave copies (queries grouped per
# KV head and broadcast against the shared keys), an additive causal mask, and a MoE that
# sorts tokens by expert once and runs one contiguous GEMM pair per expert. Selected with
# forward(..., fast=True); bench/bench_twin.py --check verifies it against the plain path
# and the fixtures.
_MASKS = {}


def _causal_mask(T, window, dtype):
    key = (T, window, dtype)
    if key not in _MASKS:
        t = torch.arange(T)
        allowed = t[None, :] <= t[:, None]
        if window:
            allowed = allowed & (t[:, None] - t[None, :] < window)
        m = torch.zeros(T, T, dtype=dtype)
        _MASKS[key] = m.masked_fill_(~allowed, float("-inf"))
    return _MASKS[key]


def cca_attention_fast(cfg, W, layer, x):
    """As `cca_attention`, batched. x: [B, T, D] -> [B, T, D]."""
    p = f"model.layers.{layer}.self_attn."
    B, T, D = x.shape
    Hq, Hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n_rep, Dq = Hq // Hkv, Hq * dh
    xf = x.reshape(B * T, D)
    wqk = torch.cat([W[p + "qkv_proj.q_proj.weight"], W[p + "qkv_proj.k_proj.weight"]])
    u = (xf @ wqk.T).reshape(B, T, -1)                 # [B, T, C] = q || k
    z = cca_conv(u, W[p + "qkv_proj.conv_qk_depthwise.weight"],
                 W[p + "qkv_proj.conv_qk_depthwise.bias"],
                 W[p + "qkv_proj.conv_qk_grouped.weight"],
                 W[p + "qkv_proj.conv_qk_grouped.bias"],
                 cfg.cca_time0, cfg.cca_time1, Hq + Hkv)
    qh = u[..., :Dq].reshape(B, T, Hkv, n_rep, dh)
    kh = u[..., Dq:].reshape(B, T, Hkv, 1, dh)
    qres = 0.5 * (qh + kh)                              # [B, T, Hkv, rep, dh]
    Q = z[..., :Dq].reshape(B, T, Hkv, n_rep, dh) + qres
    K = z[..., Dq:].reshape(B, T, Hkv, dh) + qres.mean(dim=3)

    wv = torch.cat([W[p + "qkv_proj.v_proj_current.weight"], W[p + "qkv_proj.v_proj_delayed.weight"]])
    vv = (xf @ wv.T).reshape(B, T, 2, -1)               # [B, T, 2, Hkv*dh/2]
    v_del = F.pad(vv[:, :, 1], (0, 0, 1, 0))[:, :T]     # Wv_del x_{t-1} (no bias)
    V = torch.cat([vv[:, :, 0], v_del], dim=-1).reshape(B, T, Hkv, dh)

    Q = Q * (math.sqrt(dh) / Q.norm(dim=-1, keepdim=True).clamp_min(QK_NORM_EPS))
    K = K * (W[p + "qk_norm.temp"][None, None, :, None] * math.sqrt(dh)
             / K.norm(dim=-1, keepdim=True).clamp_min(QK_NORM_EPS))
    rd = cfg.rotary_dim(layer)
    cos, sin = rope_cos_sin(T, rd, cfg.rope_theta(layer), x.dtype)
    Q = apply_rope(Q.reshape(B, T, Hq, dh), cos, sin, rd)
    K = apply_rope(K, cos, sin, rd)

    window = cfg.sliding_window if cfg.layer_types[layer] == "hybrid_sliding" else None
    Qg = Q.reshape(B, T, Hkv, n_rep, dh).permute(0, 2, 3, 1, 4)   # [B, Hkv, rep, T, dh]
    Kg = K.permute(0, 2, 1, 3).unsqueeze(2)                       # [B, Hkv, 1, T, dh]
    Vg = V.permute(0, 2, 1, 3).unsqueeze(2)
    scores = torch.matmul(Qg * (1.0 / math.sqrt(dh)), Kg.transpose(-1, -2))  # [B, Hkv, rep, T, T]
    scores += _causal_mask(T, window, x.dtype)
    attn = torch.softmax(scores, dim=-1)
    o = torch.matmul(attn, Vg)                                    # [B, Hkv, rep, T, dh]
    o = o.permute(0, 3, 1, 2, 4).reshape(B * T, Dq)
    return (o @ W[p + "o_proj.weight"].T).reshape(B, T, D)


def moe_fast(cfg, W, layer, x, rho_prev):
    """As `moe`: tokens sorted by expert once, one contiguous GEMM pair per expert."""
    p = f"model.layers.{layer}.mlp."
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    probs, rho = router(cfg, W, layer, x, rho_prev)
    choice = torch.argmax(probs + W[p + "gate.balancing_biases"], dim=-1)  # [B, T]
    w = probs.gather(-1, choice[..., None])                               # [B, T, 1]
    xf, cf = x.reshape(-1, x.shape[-1]), choice.reshape(-1)
    order = torch.argsort(cf, stable=True)
    counts = torch.bincount(cf, minlength=E + 1).tolist()
    xs = xf.index_select(0, order)
    ys = torch.zeros_like(xs) if cfg.skip_expert_output == "zero" else xs.clone()
    gu_all, dn_all = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"]
    start = 0
    for e in range(E):
        n = counts[e]
        if n:
            gu = xs[start:start + n] @ gu_all[e].T                        # [n, 2I]
            act = F.silu(gu[:, :I]).mul_(gu[:, I:])
            torch.mm(act, dn_all[e].T, out=ys[start:start + n])
        start += n
    y = torch.empty_like(xf).index_copy_(0, order, ys)
    return w * y.reshape(x.shape), rho, probs, choice


# --------------------------------------------------------------------------- model
def _cast(weights, dtype):
    return {k: v.to(dtype) for k, v in weights.items()}


def lm_head(cfg, W, y):
    head = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings else W["lm_head.weight"]
    logits = y @ head.T
    if cfg.lm_head_bias:
        logits = logits + W["lm_head.bias"]
    return logits


def next_token_loss(logits, ids):
    """Mean CE over all B*(T-1) next-token predictions."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))


def forward(cfg, weights, ids, dtype=torch.float64, fast=False, with_loss=True):
    """Vectorised forward. ids: LongTensor [B, T] (or nested lists).

    fast=True uses the batched `cca_attention_fast` / `moe_fast` (same function; for
    benchmarks). with_loss=False skips the loss (returned as None).

    Returns dict(logits [B,T,V], experts [L,B,T] int64, loss scalar,
                 residuals: list of L [B,T,D], router_probs: list of L [B,T,E+1]).
    """
    if not isinstance(cfg, ZayaConfig):
        cfg = ZayaConfig(cfg)
    ids = torch.as_tensor(ids, dtype=torch.long)
    W = _cast(weights, dtype)
    e = W["model.embed_tokens.weight"][ids]                              # [B, T, D]
    r = (e + W["model.input_hidden_states_bias"]) * W["model.input_hidden_states_scale"]
    rho = None
    residuals, probs_all, experts = [], [], []
    for k in range(cfg.num_hidden_layers):
        p = f"model.layers.{k}."
        x = rms_norm(r, W[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        a = (cca_attention_fast if fast else cca_attention)(cfg, W, k, x)
        r = residual_scale(a, r, W, p + "post_attention_residual_scale.")
        x = rms_norm(r, W[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        m, rho, probs, choice = (moe_fast if fast else moe)(cfg, W, k, x, rho)
        r = residual_scale(m, r, W, p + "post_mlp_residual_scale.")
        residuals.append(r)
        probs_all.append(probs)
        experts.append(choice)
    y = rms_norm(r, W["model.norm.weight"], cfg.rms_norm_eps)
    logits = lm_head(cfg, W, y)
    loss = next_token_loss(logits, ids) if with_loss else None
    return dict(logits=logits, experts=torch.stack(experts), loss=loss,
                residuals=residuals, router_probs=probs_all)


# ------------------------------------------------- naive token-by-token decoder (check)
def forward_stepwise(cfg, weights, ids, dtype=torch.float64):
    """Independent naive implementation: decode one token at a time with explicit state.

    Per layer state: conv window of the last P raw u rows (zeros at start), previous
    normed input x_{t-1} (zeros at start), and a KV cache. Conv, mean paths, RoPE,
    attention and MoE are written per head / per token with plain loops, following the
    spec formulas. Same return format as `forward`.
    """
    if not isinstance(cfg, ZayaConfig):
        cfg = ZayaConfig(cfg)
    ids = torch.as_tensor(ids, dtype=torch.long)
    W = _cast(weights, dtype)
    B, T = ids.shape
    L, E = cfg.num_hidden_layers, cfg.num_experts
    Hq, Hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n_rep = Hq // Hkv
    t0, t1 = cfg.cca_time0, cfg.cca_time1
    P = (t0 - 1) + (t1 - 1)
    C = (Hq + Hkv) * dh
    eps = cfg.rms_norm_eps

    def norm(v, w):
        ms = sum(float(a) * float(a) for a in v) / v.numel()
        return w * v / math.sqrt(ms + eps)

    def res(h, r, pre):
        return ((h + W[pre + "hidden_states_bias"]) * W[pre + "hidden_states_scale"]
                + (r + W[pre + "residual_bias"]) * W[pre + "residual_scale"])

    def rot(v, pos, rd, theta):
        out = v.clone()
        half = rd // 2
        for i in range(half):
            f = pos * theta ** (-2.0 * i / rd)
            c, s = math.cos(f), math.sin(f)
            out[i] = v[i] * c - v[i + half] * s
            out[i + half] = v[i + half] * c + v[i] * s
        return out

    def gelu(v):
        return torch.tensor([0.5 * a * (1.0 + math.erf(a / math.sqrt(2.0))) for a in v.tolist()],
                            dtype=v.dtype)

    logits_all = torch.zeros(B, T, cfg.vocab_size, dtype=dtype)
    residuals = [torch.zeros(B, T, cfg.hidden_size, dtype=dtype) for _ in range(L)]
    probs_all = [torch.zeros(B, T, E + 1, dtype=dtype) for _ in range(L)]
    experts = torch.zeros(L, B, T, dtype=torch.long)
    for b in range(B):
        conv_state = [torch.zeros(P, C, dtype=dtype) for _ in range(L)]   # oldest first
        x_prev = [torch.zeros(cfg.hidden_size, dtype=dtype) for _ in range(L)]
        kcache = [[] for _ in range(L)]   # per layer: list over time of [Hkv, dh]
        vcache = [[] for _ in range(L)]
        for t in range(T):
            e = W["model.embed_tokens.weight"][ids[b, t]]
            r = (e + W["model.input_hidden_states_bias"]) * W["model.input_hidden_states_scale"]
            rho = None
            for k in range(L):
                pa = f"model.layers.{k}.self_attn."
                pq = pa + "qkv_proj."
                x = norm(r, W[f"model.layers.{k}.input_layernorm.weight"])
                q = W[pq + "q_proj.weight"] @ x
                kk = W[pq + "k_proj.weight"] @ x
                u = torch.cat([q, kk])
                win = torch.cat([conv_state[k], u[None]])                  # [P+1, C]
                conv_state[k] = win[1:].clone()
                # depthwise conv, outputs at times t-(t1-1) .. t  (window index j)
                w0, b0 = W[pq + "conv_qk_depthwise.weight"], W[pq + "conv_qk_depthwise.bias"]
                w1, b1 = W[pq + "conv_qk_grouped.weight"], W[pq + "conv_qk_grouped.bias"]
                ys = []
                for j in range(t1):
                    yj = b0.clone()
                    for tap in range(t0):
                        yj = yj + w0[:, 0, tap] * win[j + tap]
                    ys.append(yj)
                z = b1.clone()
                for c in range(C):
                    g0 = (c // dh) * dh
                    acc = z[c]
                    for tap in range(t1):
                        acc = acc + torch.dot(w1[c, :, tap], ys[tap][g0:g0 + dh])
                    z[c] = acc
                Qs, Ks = [], []
                for h in range(Hq):
                    g = h // n_rep
                    Qs.append(z[h * dh:(h + 1) * dh] + 0.5 * q[h * dh:(h + 1) * dh]
                              + 0.5 * kk[g * dh:(g + 1) * dh])
                for g in range(Hkv):
                    qm = sum(q[h * dh:(h + 1) * dh] for h in range(g * n_rep, (g + 1) * n_rep))
                    qm = qm / n_rep
                    Ks.append(z[(Hq + g) * dh:(Hq + g + 1) * dh] + 0.5 * qm
                              + 0.5 * kk[g * dh:(g + 1) * dh])
                vflat = torch.cat([W[pq + "v_proj_current.weight"] @ x,
                                   W[pq + "v_proj_delayed.weight"] @ x_prev[k]])
                x_prev[k] = x
                rd, theta = cfg.rotary_dim(k), cfg.rope_theta(k)
                temp = W[pa + "qk_norm.temp"]
                for h in range(Hq):
                    nrm = max(math.sqrt(float((Qs[h] * Qs[h]).sum())), QK_NORM_EPS)
                    Qs[h] = rot(Qs[h] * (math.sqrt(dh) / nrm), t, rd, theta)
                kt = torch.zeros(Hkv, dh, dtype=dtype)
                for g in range(Hkv):
                    nrm = max(math.sqrt(float((Ks[g] * Ks[g]).sum())), QK_NORM_EPS)
                    kt[g] = rot(Ks[g] * (math.sqrt(dh) / nrm) * temp[g], t, rd, theta)
                kcache[k].append(kt)
                vcache[k].append(vflat.reshape(Hkv, dh))
                heads = []
                for h in range(Hq):
                    g = h // n_rep
                    srange = range(t + 1)
                    if cfg.layer_types[k] == "hybrid_sliding":
                        srange = [s for s in srange if t - s < cfg.sliding_window]
                    sc = [float(torch.dot(Qs[h], kcache[k][s][g])) / math.sqrt(dh) for s in srange]
                    mx = max(sc)
                    ex = [math.exp(a - mx) for a in sc]
                    tot = sum(ex)
                    o = torch.zeros(dh, dtype=dtype)
                    for wgt, s in zip(ex, srange):
                        o = o + (wgt / tot) * vcache[k][s][g]
                    heads.append(o)
                a = W[pa + "o_proj.weight"] @ torch.cat(heads)
                r = res(a, r, f"model.layers.{k}.post_attention_residual_scale.")
                x = norm(r, W[f"model.layers.{k}.post_attention_layernorm.weight"])
                # router
                pg = f"model.layers.{k}.mlp.gate."
                rl = W[pg + "down_proj.weight"] @ x + W[pg + "down_proj.bias"]
                if k >= 1:
                    rl = rl + W[pg + "router_states_scale"] * rho
                rho = rl
                hh = norm(rl, W[pg + "router_mlp.norm.weight"])
                hh = gelu(W[pg + "router_mlp.fc1.weight"] @ hh + W[pg + "router_mlp.fc1.bias"])
                hh = gelu(W[pg + "router_mlp.fc2.weight"] @ hh + W[pg + "router_mlp.fc2.bias"])
                s = (W[pg + "router_mlp.out_proj.weight"] @ hh).tolist()
                ms = max(s)
                ex = [math.exp(v - ms) for v in s]
                pr = [v / sum(ex) for v in ex]
                bb = W[pg + "balancing_biases"].tolist()
                best = max(range(E + 1), key=lambda i: pr[i] + bb[i])
                wsel = pr[best]
                if best < E:
                    pe = f"model.layers.{k}.mlp.experts."
                    gu = W[pe + "gate_up_proj"][best] @ x
                    I = cfg.moe_intermediate_size
                    act = torch.tensor([gv / (1.0 + math.exp(-gv)) * uv for gv, uv in
                                        zip(gu[:I].tolist(), gu[I:].tolist())], dtype=dtype)
                    m = wsel * (W[pe + "down_proj"][best] @ act)
                elif cfg.skip_expert_output == "identity":
                    m = wsel * x
                else:
                    m = torch.zeros_like(x)
                r = res(m, r, f"model.layers.{k}.post_mlp_residual_scale.")
                residuals[k][b, t] = r
                probs_all[k][b, t] = torch.tensor(pr, dtype=dtype)
                experts[k, b, t] = best
            y = norm(r, W["model.norm.weight"])
            head = (W["model.embed_tokens.weight"] if cfg.tie_word_embeddings
                    else W["lm_head.weight"])
            lg = head @ y
            if cfg.lm_head_bias:
                lg = lg + W["lm_head.bias"]
            logits_all[b, t] = lg
    # loss by explicit log-sum-exp
    tot, n = 0.0, 0
    for b in range(B):
        for t in range(T - 1):
            row = logits_all[b, t].tolist()
            mx = max(row)
            lse = mx + math.log(sum(math.exp(v - mx) for v in row))
            tot += lse - row[int(ids[b, t + 1])]
            n += 1
    return dict(logits=logits_all, experts=experts, loss=torch.tensor(tot / n, dtype=dtype),
                residuals=residuals, router_probs=probs_all)


# ------------------------------------------------------------- tensor-name mapping
_ATTN_MAP = {  # canonical suffix under model.layers.{k}. -> original under model.layers.{2k}.
    "input_layernorm.weight": "input_norm.weight",
    "self_attn.qkv_proj.q_proj.weight": "self_attn.qkv.linear_q.weight",
    "self_attn.qkv_proj.k_proj.weight": "self_attn.qkv.linear_k.weight",
    "self_attn.qkv_proj.v_proj_current.weight": "self_attn.qkv.val_proj1.weight",
    "self_attn.qkv_proj.v_proj_delayed.weight": "self_attn.qkv.val_proj2.weight",
    "self_attn.qkv_proj.conv_qk_depthwise.weight": "self_attn.qkv.conv_qk.0.weight",
    "self_attn.qkv_proj.conv_qk_depthwise.bias": "self_attn.qkv.conv_qk.0.bias",
    "self_attn.qkv_proj.conv_qk_grouped.weight": "self_attn.qkv.conv_qk.1.weight",
    "self_attn.qkv_proj.conv_qk_grouped.bias": "self_attn.qkv.conv_qk.1.bias",
    "self_attn.qk_norm.temp": "self_attn.qkv.temp",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
}
_MOE_MAP = {  # canonical suffix under model.layers.{k}. -> original under model.layers.{2k+1}.
    "post_attention_layernorm.weight": "input_norm.weight",
    "mlp.gate.down_proj.weight": "zaya_block.router.down_proj.weight",
    "mlp.gate.down_proj.bias": "zaya_block.router.down_proj.bias",
    "mlp.gate.router_states_scale": "zaya_block.router.router_states_scale",
    "mlp.gate.router_mlp.norm.weight": "zaya_block.router.rmsnorm_eda.weight",
    "mlp.gate.router_mlp.fc1.weight": "zaya_block.router.router_mlp.0.weight",
    "mlp.gate.router_mlp.fc1.bias": "zaya_block.router.router_mlp.0.bias",
    "mlp.gate.router_mlp.fc2.weight": "zaya_block.router.router_mlp.2.weight",
    "mlp.gate.router_mlp.fc2.bias": "zaya_block.router.router_mlp.2.bias",
    "mlp.gate.router_mlp.out_proj.weight": "zaya_block.router.router_mlp.4.weight",
    "mlp.gate.balancing_biases": "zaya_block.router.balancing_biases",
}
_RS = ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias")


def canonical_to_original(cfg, weights):
    """HF 40-block names -> original 80-half-layer names (experts unstacked)."""
    L, E = cfg.num_hidden_layers, cfg.num_experts
    out = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"):
        if name in weights:
            out[name] = weights[name]
    out["model.layers.0.res_scale.hidden_states_scale"] = weights["model.input_hidden_states_scale"]
    out["model.layers.0.res_scale.hidden_states_bias"] = weights["model.input_hidden_states_bias"]
    out["model.final_norm.weight"] = weights["model.norm.weight"]
    for k in range(L):
        c, a, m = f"model.layers.{k}.", f"model.layers.{2 * k}.", f"model.layers.{2 * k + 1}."
        for src, dst in _ATTN_MAP.items():
            out[a + dst] = weights[c + src]
        for src, dst in _MOE_MAP.items():
            if c + src in weights:
                out[m + dst] = weights[c + src]
        nxt = f"model.layers.{2 * k + 2}.res_scale." if k < L - 1 else "model.res_scale."
        for s in _RS:
            out[m + "res_scale." + s] = weights[c + "post_attention_residual_scale." + s]
            out[nxt + s] = weights[c + "post_mlp_residual_scale." + s]
        for e in range(E):
            ex = m + f"zaya_block.experts.local_experts.{e}."
            out[ex + "linear_fc1.weight"] = weights[c + "mlp.experts.gate_up_proj"][e]
            out[ex + "linear_fc2.weight"] = weights[c + "mlp.experts.down_proj"][e]
    return out


def original_to_canonical(cfg, weights):
    """Inverse of `canonical_to_original` (experts restacked)."""
    L, E = cfg.num_hidden_layers, cfg.num_experts
    out = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"):
        if name in weights:
            out[name] = weights[name]
    out["model.input_hidden_states_scale"] = weights["model.layers.0.res_scale.hidden_states_scale"]
    out["model.input_hidden_states_bias"] = weights["model.layers.0.res_scale.hidden_states_bias"]
    out["model.norm.weight"] = weights["model.final_norm.weight"]
    for k in range(L):
        c, a, m = f"model.layers.{k}.", f"model.layers.{2 * k}.", f"model.layers.{2 * k + 1}."
        for dst, src in _ATTN_MAP.items():
            out[c + dst] = weights[a + src]
        for dst, src in _MOE_MAP.items():
            if m + src in weights:
                out[c + dst] = weights[m + src]
        nxt = f"model.layers.{2 * k + 2}.res_scale." if k < L - 1 else "model.res_scale."
        for s in _RS:
            out[c + "post_attention_residual_scale." + s] = weights[m + "res_scale." + s]
            out[c + "post_mlp_residual_scale." + s] = weights[nxt + s]
        ex = m + "zaya_block.experts.local_experts.{}."
        out[c + "mlp.experts.gate_up_proj"] = torch.stack(
            [weights[ex.format(e) + "linear_fc1.weight"] for e in range(E)])
        out[c + "mlp.experts.down_proj"] = torch.stack(
            [weights[ex.format(e) + "linear_fc2.weight"] for e in range(E)])
    return out


def load_model_dir(path):
    """Read config.json + weights (single file or sharded index; either naming)."""
    from safetensors_io import load_file  # local module (tests/reference)

    cfg = ZayaConfig.load(os.path.join(path, "config.json"))
    index = os.path.join(path, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            weights.update(load_file(os.path.join(path, fn)))
    else:
        weights = load_file(os.path.join(path, "model.safetensors"))
    if "model.final_norm.weight" in weights:
        weights = original_to_canonical(cfg, weights)
    return cfg, weights
