"""The peer of `bench_attention --backend cuda`: PyTorch's scaled_dot_product_attention (its
flash / cuDNN kernels on bf16 tensors, causal, grouped-query heads) on the same shape and GPU,
timed the same way: forward, and forward + backward, medians over --runs after --warmup, each run
ended by a device synchronisation. FLOPs use bench_attention's count (the causal half; backward
2.5x forward). A sliding window has no fused SDPA form, so --window runs an explicit boolean mask
(SDPA then picks its memory-efficient kernel), and the result says so. Prints one JSON object.

    python3 bench/bench_attention_torch.py --batch 1 --seq 4096 --heads 8 --kv-heads 2 --head-dim 128
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def timed(fn, warmup, runs):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    B, T, Hq, Hkv, dh, W = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, a.window
    torch.manual_seed(1234)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, Hq, T, dh, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, Hkv, T, dh, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, Hkv, T, dh, device=dev, dtype=dt, requires_grad=True)
    dout = torch.randn(B, Hq, T, dh, device=dev, dtype=dt)
    mask = None
    if W > 0:
        i = torch.arange(T, device=dev)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W)

    def forward():
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def forward_backward():
        out = forward()
        out.backward(dout)

    pairs = T * (T + 1) / 2 if W <= 0 or W >= T else W * T - W * (W - 1) / 2
    fwd_flops = 4.0 * B * Hq * dh * pairs
    bwd_flops = 2.5 * fwd_flops
    with torch.no_grad():
        fwd = timed(forward, a.warmup, a.runs)
    both = timed(forward_backward, a.warmup, a.runs)
    result = {
        "peer": "torch.nn.functional.scaled_dot_product_attention",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "window_as_mask": W > 0,
        "shape": {"B": B, "T": T, "Hq": Hq, "Hkv": Hkv, "dh": dh, "window": W},
        "forward_ms": fwd * 1e3,
        "forward_backward_ms": both * 1e3,
        "forward_tflops": fwd_flops / fwd / 1e12,
        "forward_backward_tflops": (fwd_flops + bwd_flops) / both / 1e12,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
