"""Logits of a zaya-written model against Hugging Face transformers' ZayaForCausalLM.

A second reference next to the twin (zaya_twin.py): transformers' own implementation of the
architecture (transformers >= 5.17, model_type "zaya"). Used on the GPU machine, where
transformers is installed; CI does not run it.

    python3 tests/reference/hf_logits_check.py --model DIR --ids IDS.json \
        --zaya cpu=cpu.json:1e-4 --zaya cuda=cuda.json:1e-2

DIR is a model directory written by `zaya init` / `zaya export` (config.json + safetensors);
IDS.json a [B][T] array of token ids; each --zaya NAME=FILE:TOL is the output of
`zaya score` on those ids. The check fails (exit 1) when
||logits_zaya - logits_hf|| / ||logits_hf|| exceeds TOL for any of them, or when transformers
and the twin disagree by more than 1e-4. HF runs in float32 with TF32 off; the twin in float64.
HF's skip-expert semantics are "zero" (spec, project decision 2): the model must say so.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rel_err(a, b):
    a = a.double()
    b = b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--zaya", action="append", default=[], help="NAME=score.json:TOL")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    from transformers import ZayaForCausalLM

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("skip_expert_output", "zero") != "zero":
        sys.exit("hf_logits_check: config.json has skip_expert_output=%r; transformers computes 'zero'"
                 % cfg.get("skip_expert_output"))
    with open(args.ids) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)

    model = ZayaForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model = model.to(args.device).eval()
    with torch.no_grad():
        hf = model(input_ids=ids.to(args.device), use_cache=False).logits.float().cpu()
    print("transformers %s, ZayaForCausalLM on %s: logits %s, |logits| max %.4g"
          % (transformers.__version__, args.device, tuple(hf.shape), float(hf.abs().max())))

    failures = []
    try:
        import zaya_twin
        twin_cfg, weights = zaya_twin.load_model_dir(args.model)
        twin = zaya_twin.forward(twin_cfg, weights, ids, dtype=torch.float64, with_loss=False)["logits"]
    except Exception as e:  # the twin is a cross-check here, not the point of this script
        twin = None
        print("twin: not run (%s: %s)" % (type(e).__name__, e))
    if twin is not None:
        e = rel_err(twin, hf)
        ok = e <= 1e-4
        print("%-6s vs transformers: rel err %.3e (tol 1e-4) %s" % ("twin", e, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("twin")

    for spec in args.zaya:
        name, rest = spec.split("=", 1)
        path, tol = rest.rsplit(":", 1)
        with open(path) as f:
            z = torch.tensor(json.load(f)["logits"], dtype=torch.float32)
        if z.shape != hf.shape:
            print("%-6s shape %s != transformers %s FAIL" % (name, tuple(z.shape), tuple(hf.shape)))
            failures.append(name)
            continue
        e = rel_err(z, hf)
        per_tok = ((z - hf).double().norm(dim=-1) / hf.double().norm(dim=-1).clamp_min(1e-30)).flatten()
        worst = int(per_tok.argmax())
        ok = e <= float(tol) and bool(torch.isfinite(z).all())
        print("%-6s vs transformers: rel err %.3e (tol %s), worst token %d: %.3e, max|diff| %.3e %s"
              % (name, e, tol, worst, float(per_tok[worst]), float((z - hf).abs().max()), "ok" if ok else "FAIL"))
        if not ok:
            failures.append(name)
    if failures:
        print("hf_logits_check: FAILED: " + ", ".join(failures))
        sys.exit(1)
    print("hf_logits_check: all match")


if __name__ == "__main__":
    main()
