"""The peer of `bench_train --backend cuda`: the same training step in Hugging Face transformers'
ZayaForCausalLM on the same GPU, plus torch's bf16 GEMM peak.

The step, as close to zaya's as transformers allows: fp32 master weights, forward and backward
under torch.autocast(bfloat16) (bf16 matmuls, fp32 accumulation), mean next-token cross-entropy
over --micro-batches K (default 1) micro-batches of B x T random tokens whose gradients
accumulate (each micro-batch's mean loss divided by K), global grad-norm clip at 1.0, then one
optimizer step (torch's fused AdamW for every parameter: transformers has no Muon, and the
optimizer is a small part of a step of this size). Timed with a device synchronisation after
each step; median over --steps after --warmup. Prints one JSON object on stdout.

    python3 bench/bench_train_hf.py --config bench/configs/zaya1-base-blocks.json --batch 4 --seq 4096
"""

import argparse
import json
import statistics
import sys
import time

import torch


def bf16_peak_tflops(n=8192, runs=10):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        out.append(2 * n**3 / (s.elapsed_time(e) * 1e-3) / 1e12)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--attn", default="sdpa")
    args = ap.parse_args()

    import transformers
    from transformers import ZayaConfig, ZayaForCausalLM

    with open(args.config) as f:
        cfg_dict = json.load(f)
    cfg_dict.pop("skip_expert_output", None)  # zaya's key; transformers computes "zero"
    cfg_dict.pop("architectures", None)
    cfg_dict.pop("model_type", None)
    config = ZayaConfig(**cfg_dict)
    torch.manual_seed(0)
    try:
        model = ZayaForCausalLM._from_config(config, attn_implementation=args.attn)
    except Exception as e:  # an attention backend this model does not support
        print("attention %s not available (%s); using eager" % (args.attn, e), file=sys.stderr)
        args.attn = "eager"
        model = ZayaForCausalLM._from_config(config, attn_implementation="eager")
    model = model.to("cuda", dtype=torch.float32).train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    B, T, K = args.batch, args.seq, args.micro_batches
    g = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, config.vocab_size, (B, T), generator=g).cuda() for _ in range(K)]

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1)) / K
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup):
        loss = step()
        torch.cuda.synchronize()
        print("warm-up %d: loss %.4f" % (i + 1, float(loss)), file=sys.stderr)
    times = []
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print("step %d: %.1f ms, %.0f tok/s, loss %.4f" % (i + 1, times[-1] * 1e3, K * B * T / times[-1], float(loss)),
              file=sys.stderr)
    peak = bf16_peak_tflops()
    tps = [K * B * T / t for t in times]
    out = {
        "engine": "transformers %s ZayaForCausalLM (attention %s, autocast bf16, fused AdamW)"
                  % (transformers.__version__, args.attn),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "params": params,
        "batch": {"B": B, "T": T, "micro_batches": K, "tokens_per_step": K * B * T},
        "step_seconds": {"median": statistics.median(times), "min": min(times), "max": max(times)},
        "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)},
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "torch_bf16_gemm_peak_tflops": peak,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
