#!/usr/bin/env bash
# The checks that need a GPU, run on the GPU machine from the repository root over a build
# packed by scripts/gpu_pack.sh (.devcarry/). Steps (default: all): 
#   tests  zaya_gpu_tests (every op, model gradients, 50 training steps against the CPU backend)
#   hf     logits of a random model written by zaya against transformers' ZayaForCausalLM
#   nccl   the NCCL communicator with one rank (zaya_nccl_check, MPI singleton)
#   dp     GPU data parallelism (MPI, host-staged): tests/dp/dp_equivalence.sh with cuda-fp32 (1, 2
#          and 3 ranks sharing the GPU, a 2-rank checkpoint resumed by 3; the CPU tolerances) and
#          context parallelism (tests/dp/cp_equivalence.sh: one process against a group of 2;
#          chunks of 8 queries on the warp kernels, of 64 on the GEMM path)
#   train  `zaya train --backend cuda` on the built-in recipe: stop, resume, finish, generate
#   serve  `zaya serve --backend cuda` against `--backend cpu`: a batch of echo + logprobs
#          requests (the chunked prefill that returns every position's logits, then decode)
#   bench  bench_train (ZAYA1-base-shaped blocks; again with device-grouped MoE GEMMs, with
#          the LM head in exact fp32, with TF32 Newton-Schulz, with the tensor-core flash
#          attention, with bf16 Newton-Schulz iterates, and with the three opt-in kernels
#          together), its transformers peer, bench_decode (batch 1, 16; again
#          with device-grouped MoE GEMMs, and with per-expert GEMMs instead of the few-rows GEMVs)
#   accum  the same step with 4 micro-batches per optimizer step (gradient accumulation), zaya
#          and its transformers peer
#   decode_long  bench_decode at batch 1 after an 8,192-token prompt, the decode attention's keys
#          split over blocks (the default) and unsplit
#   attention  bench_attention (the GEMM path and the tensor-core flash kernels, head_dim 128
#          and 64, and a sliding window) against torch's scaled_dot_product_attention
#   kernels  Nsight Compute's time for every kernel of one bench_train step, summed by name
#   fit    the full 8.3B zaya1-base, training steps on this one GPU (no sharding): memory and speed,
#          keeping every activation and (FIT_SEQ entries "T:r") recomputing them
# Logs and JSON results go to $OUT/logs.tgz ($OUT default /tmp/zaya-gpu-out), re-packed after
# every step, so a call that runs out of time still returns what finished. Each step runs
# under STEP_TIMEOUT seconds (default 420), or STEP_TIMEOUT_<step> for that step alone. BENCH_VARIANTS
# names the bench step's variants to run (default all). Run it without a pipeline after it (no `| tail`):
# a call killed at its limit loses a pipeline's output. Exit status: number of failed steps.
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/zaya-gpu-out}
LOGS=/tmp/zaya-gpu-logs  # every log and JSON; packed into $OUT/logs.tgz at the end
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
BIN=$ROOT/.devcarry/bin
if [[ -f $ROOT/.devcarry/pack.tar.xz && ! -x $BIN/zaya ]]; then
  tar -C "$ROOT/.devcarry" -xJf "$ROOT/.devcarry/pack.tar.xz"
  # The demo corpus the built-in recipe trains on (data/ is not part of the working tree).
  if [[ -d $ROOT/.devcarry/data && ! -d $ROOT/data/npm ]]; then mkdir -p "$ROOT/data" && cp -r "$ROOT/.devcarry/data/npm" "$ROOT/data/"; fi
fi
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(tests hf nccl)

# The tests find their fixtures under the source directory they were built in (/work/main).
if [[ ! -e /work/main/tests/fixtures ]]; then mkdir -p /work && ln -sfn "$ROOT" /work/main; fi

libdir_of() {  # first directory holding $1 among the usual places of the CUDA machine
  local f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [[ -e $d/$1 ]] && { echo "$d"; return; }
  done
  f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$1" -print 2>/dev/null | head -1)
  [[ -n $f ]] && dirname "$f"
}
LIBS=$ROOT/.devcarry/lib
for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
  d=$(libdir_of $l)
  if [[ -n $d ]]; then LIBS=$LIBS:$d; else echo "gpu_device_checks: $l not found"; fi
done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI: use the machine's own (its mpirun and components match its libmpi) when it has one.
if [[ -e /usr/lib/x86_64-linux-gnu/libmpi.so.40 ]]; then
  rm -f "$ROOT"/.devcarry/lib/libmpi.so.* "$ROOT"/.devcarry/lib/libopen-rte.so.* "$ROOT"/.devcarry/lib/libopen-pal.so.*
else
  export OPAL_PREFIX=$ROOT/.devcarry/openmpi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$LOGS/gpu.txt"
ldd "$BIN/zaya" | grep "not found" && echo "gpu_device_checks: missing libraries (above)"

failed=0
step_tests() {
  "$BIN/zaya_gpu_tests" --gtest_output=xml:"$LOGS/gpu_tests.xml" 2>&1 | tee "$LOGS/gpu_tests.log" | \
    grep -E "^\[  (FAILED|  OK|PASSED) |Failure|error|skipped|rel|max|differ|disagree" | head -150
  return "${PIPESTATUS[0]}"
}
step_hf() {
  local d=/tmp/zaya-hf
  rm -rf $d && mkdir -p $d
  # Every architectural path HF has: sliding and full layers, GQA 4:2, partial RoPE, a tied head,
  # four experts plus the skip class, with HF's skip semantics ("zero").
  cat > $d/config.json <<'JSON'
{"model_type": "zaya", "architectures": ["ZayaForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
 "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "moe_intermediate_size": 96, "num_experts": 4, "num_experts_per_tok": 1, "router_hidden_size": 32,
 "layer_types": ["hybrid", "hybrid_sliding", "hybrid"], "sliding_window": 8,
 "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                     "hybrid_sliding": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
 "tie_word_embeddings": true, "max_position_embeddings": 512, "skip_expert_output": "zero",
 "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
JSON
  "$BIN/zaya" init --config $d/config.json --out $d/model --seed 7 || return 1
  python3 -c "import random, json; random.seed(3); print(json.dumps([[random.randrange(3, 1000) for _ in range(40)] for _ in range(3)]))" > $d/ids.json
  "$BIN/zaya" score --model $d/model --ids-file $d/ids.json --out $d/cpu.json || return 1
  "$BIN/zaya" score --model $d/model --ids-file $d/ids.json --out $d/cuda.json --backend cuda || return 1
  cp $d/model/config.json "$LOGS/hf_config.json"
  PYTHONUNBUFFERED=1 python3 tests/reference/hf_logits_check.py --model $d/model --ids $d/ids.json \
    --zaya cpu=$d/cpu.json:1e-4 --zaya cuda=$d/cuda.json:1e-2 2>&1 | tee "$LOGS/hf_check.log"
  return "${PIPESTATUS[0]}"
}
step_nccl() {
  [[ -x $BIN/zaya_nccl_check ]] || { echo "no zaya_nccl_check"; return 1; }
  ZAYA_COMM_TIMEOUT=60 "$BIN/zaya_nccl_check" 2>&1 | tee "$LOGS/nccl.log"
  return "${PIPESTATUS[0]}"
}
step_dp() {
  local W=/tmp/zaya-dp dp=$BIN/zaya_dp_check
  export OMP_NUM_THREADS=4
  # The CTest check (1/2/3 ranks, a 2-rank checkpoint resumed by 3), fp32 GEMMs: CPU tolerances.
  tests/dp/dp_equivalence.sh mpirun "$dp" $W cuda-fp32 2>&1 | tee "$LOGS/dp.log" | grep -E "dp_check:|dp_equivalence"
  [[ ${PIPESTATUS[0]} == 0 ]] || return 1
  # Context parallelism on the GPU (one process against a group of 2 sharing the GPU).
  tests/dp/cp_equivalence.sh mpirun "$dp" /tmp/zaya-cp cuda-fp32 2>&1 | tee "$LOGS/cp.log" |
    grep -E "dp_check: (trained|equivalent)|cp_equivalence"
  [[ ${PIPESTATUS[0]} == 0 ]] || return 1
  # Informational: the same run on the CPU backend, and bf16 GEMMs with 2 ranks against 1.
  $dp train $W/cpu --backend cpu && $dp compare $W/cpu $W/np1 | tee -a "$LOGS/dp.log"
  $dp train $W/bf16_np1 --backend cuda && mpirun --oversubscribe -x LD_LIBRARY_PATH -x OMP_NUM_THREADS -np 2 \
    $dp train $W/bf16_np2 --backend cuda && $dp compare $W/bf16_np1 $W/bf16_np2 | tee -a "$LOGS/dp.log"
  return 0
}
step_train() {
  local R=/tmp/zaya-train
  rm -rf $R
  "$BIN/zaya" train --backend cuda --set run_dir=$R --stop-after 20 2>&1 | tail -8 || return 1
  "$BIN/zaya" train --backend cuda --set run_dir=$R 2>&1 | tee "$LOGS/train.log" | grep -vE "^step [0-9]+/" | tail -25
  [[ ${PIPESTATUS[0]} == 0 ]] || return 1
  grep -E "^step [0-9]+/" "$LOGS/train.log" | tail -3
  "$BIN/zaya" generate --backend cuda --model $R/model --prompt "The" --max-tokens 24 --temperature 0 2>&1 | tail -3
}
step_serve() {
  # Two servers on one random model, the CPU's and the GPU's (SERVE_OTHER=cpu checks the step
  # itself without a GPU); the prompts' scores must agree within the bf16 tolerance (1e-2
  # relative). Generated ids are printed, not compared: greedy picks may differ under bf16.
  local d=/tmp/zaya-serve other=${SERVE_OTHER:-cuda} rc pids=()
  rm -rf $d && mkdir -p $d
  "$BIN/zaya" init --preset zaya-tiny --out $d/model --seed 5 > /dev/null || return 1
  for be in cpu $other; do
    "$BIN/zaya" serve --model $d/model --backend $be --port 0 > $d/url_$be.txt 2> $d/serve_$be.log &
    pids+=($!)
  done
  for be in cpu $other; do
    for _ in $(seq 300); do grep -q http $d/url_$be.txt && break; sleep 0.2; done
  done
  python3 - $d cpu $other <<'PY'
import json, random, sys, urllib.request
d, first, second = sys.argv[1:4]
random.seed(4)
prompts = [[random.randrange(3, 500) for _ in range(150)], [5, 6, 7]]
body = {"prompt": prompts, "max_tokens": 8, "echo": True, "logprobs": 3, "temperature": 0}
out = {}
for be in (first, second):
    url = open(f"{d}/url_{be}.txt").read().split()[-1]
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    out[be] = json.load(urllib.request.urlopen(req, timeout=300))
worst = 0.0
for a, b in zip(out[first]["choices"], out[second]["choices"]):
    n = len(prompts[a["index"]])
    for x, y in zip(a["logprobs"]["token_logprobs"][1:n], b["logprobs"]["token_logprobs"][1:n]):
        worst = max(worst, abs(x - y) / max(1.0, abs(x)))
    print(f"choice {a['index']}: {first} ids {a['token_ids']}, {second} ids {b['token_ids']}")
print(f"serve {first} vs {second}: worst relative difference of the prompts' logprobs {worst:.2e} (limit 1e-2)")
sys.exit(0 if worst <= 1e-2 else 1)
PY
  rc=$?
  kill "${pids[@]}" 2> /dev/null
  wait
  cp $d/serve_*.log "$LOGS/" 2> /dev/null
  return $rc
}
# bench_train on step_bench's config with environment settings (NAME=1 ...), logged as
# bench_train_cuda_SUFFIX.{json,log}; a failure prints the log's end and does not stop the step.
bench_train_variant() {
  local suffix=$1 cfg=bench/configs/zaya1-base-blocks.json
  env "${@:2}" "$BIN/bench_train" --backend cuda --config $cfg --batch ${BENCH_B:-4} --seq ${BENCH_T:-4096} \
    --warmup 2 --steps 5 --skip-peaks > "$LOGS/bench_train_cuda_$suffix.json" 2> "$LOGS/bench_train_cuda_$suffix.log" &&
    grep -E "median|memory|gemm engine" "$LOGS/bench_train_cuda_$suffix.log" || tail -3 "$LOGS/bench_train_cuda_$suffix.log"
}
step_bench() {
  local cfg=bench/configs/zaya1-base-blocks.json B=${BENCH_B:-4} T=${BENCH_T:-4096}
  [[ -n ${SKIP_HF:-} ]] || PYTHONUNBUFFERED=1 python3 bench/bench_train_hf.py --config $cfg --batch $B --seq $T --warmup 2 --steps 5 \
    > "$LOGS/bench_train_hf.json" 2> "$LOGS/bench_train_hf.log" || tail -5 "$LOGS/bench_train_hf.log"
  [[ -n ${SKIP_HF:-} ]] || python3 -c "import json; d=json.load(open('$LOGS/bench_train_hf.json')); print('hf', d['tokens_per_s'], 'bf16 peak', d['torch_bf16_gemm_peak_tflops'], 'mem', d['peak_memory_bytes'])"
  if ! "$BIN/bench_train" --backend cuda --config $cfg --batch $B --seq $T --warmup 2 --steps 5 \
    > "$LOGS/bench_train_cuda.json" 2> "$LOGS/bench_train_cuda.log"; then
    tail -3 "$LOGS/bench_train_cuda.log"
    cuda-gdb -batch -ex run -ex bt --args "$BIN/bench_train" --backend cuda --config $cfg --batch $B --seq $T \
      --warmup 0 --steps 1 --skip-peaks > "$LOGS/bench_train_gdb.log" 2>&1
    grep -E "^#|signal|Error" "$LOGS/bench_train_gdb.log" | head -30
    return 1
  fi
  grep -E "median|MFU|memory|gemm engine|Newton-Schulz:" "$LOGS/bench_train_cuda.log"
  # The same step with one setting changed each, against the defaults (docs/benchmarks.md):
  # BENCH_VARIANTS picks which of them run (default: all, in this order).
  local v
  for v in ${BENCH_VARIANTS:-grouped exact_head ns_tf32 flash ns_bf16_iterates candidates}; do
    case $v in
      grouped) bench_train_variant grouped ZAYA_MOE_DEVICE_GROUPED=1 ;;  # the MoE's experts as device-grouped GEMMs
      exact_head) bench_train_variant exact_head ZAYA_LM_HEAD_EXACT=1 ;;  # the LM head in exact fp32, not 3xTF32
      ns_tf32) bench_train_variant ns_tf32 ZAYA_NS_TF32=1 ;;  # Newton-Schulz on TF32, not bf16 operands
      flash) bench_train_variant flash ZAYA_ATTN_FLASH=1 ;;  # the tensor-core flash attention (forward, backward)
      ns_bf16_iterates) bench_train_variant ns_bf16_iterates ZAYA_NS_BF16_ITERATES=1 ;;  # NS iterates in bf16 (no packing)
      # The opt-in kernels together: what the step would be if they all became the defaults.
      candidates) bench_train_variant candidates ZAYA_ATTN_FLASH=1 ZAYA_MOE_DEVICE_GROUPED=1 ZAYA_NS_BF16_ITERATES=1 ;;
      *) echo "unknown bench variant $v" ;;
    esac
  done
  # Attention's own time with the flash kernels, from the synchronised per-op profile.
  ZAYA_ATTN_FLASH=1 "$BIN/bench_train" --backend cuda --config $cfg --batch $B --seq $T --warmup 1 --steps 2 \
    --skip-peaks --profile > "$LOGS/bench_train_profile_flash.json" 2> "$LOGS/bench_train_profile_flash.log" &&
    grep -iE "attention" "$LOGS/bench_train_profile_flash.log" | head -4
  # Per-op breakdown (each op synchronised: slower than the timed run above).
  "$BIN/bench_train" --backend cuda --config $cfg --batch $B --seq $T --warmup 1 --steps 2 --skip-peaks --profile \
    > "$LOGS/bench_train_profile.json" 2> "$LOGS/bench_train_profile.log" && \
    grep -A22 "per-op breakdown" "$LOGS/bench_train_profile.log"
  for b in 1 16; do
    "$BIN/bench_decode" --backend cuda --config $cfg --batch $b --prompt 128 --tokens 64 --rounds 3 \
      > "$LOGS/bench_decode_b$b.json" 2> "$LOGS/bench_decode_b$b.log" || { tail -3 "$LOGS/bench_decode_b$b.log"; return 1; }
    tail -1 "$LOGS/bench_decode_b$b.log"
    # Device-grouped experts: no host synchronisation per MoE layer (decode is launch-bound).
    ZAYA_MOE_DEVICE_GROUPED=1 "$BIN/bench_decode" --backend cuda --config $cfg --batch $b --prompt 128 --tokens 64 \
      --rounds 3 > "$LOGS/bench_decode_grouped_b$b.json" 2> "$LOGS/bench_decode_grouped_b$b.log" &&
      tail -1 "$LOGS/bench_decode_grouped_b$b.log" || tail -3 "$LOGS/bench_decode_grouped_b$b.log"
    # Per-expert GEMMs (the offsets copied to the host at each MoE layer) against the default
    # device GEMVs of calls of up to 16 tokens.
    ZAYA_MOE_PER_EXPERT=1 "$BIN/bench_decode" --backend cuda --config $cfg --batch $b --prompt 128 --tokens 64 \
      --rounds 3 > "$LOGS/bench_decode_per_expert_b$b.json" 2> "$LOGS/bench_decode_per_expert_b$b.log" &&
      echo "per expert: $(tail -1 "$LOGS/bench_decode_per_expert_b$b.log")" || tail -3 "$LOGS/bench_decode_per_expert_b$b.log"
    # Batch 1: the dense linears as BLASLt GEMMs (x converted to bf16 first) against the default
    # few-rows GEMVs of up to 4 rows (gpu_gemv.h).
    if [[ $b == 1 ]]; then
      ZAYA_LINEAR_GEMM=1 "$BIN/bench_decode" --backend cuda --config $cfg --batch $b --prompt 128 --tokens 64 \
        --rounds 3 > "$LOGS/bench_decode_linear_gemm_b$b.json" 2> "$LOGS/bench_decode_linear_gemm_b$b.log" &&
        echo "linear GEMMs: $(tail -1 "$LOGS/bench_decode_linear_gemm_b$b.log")" ||
        tail -3 "$LOGS/bench_decode_linear_gemm_b$b.log"
    fi
  done
}
step_decode_long() {
  # Decode at batch 1 after an 8,192-token prompt: the attention forward with each query tile's
  # keys split over blocks (the backend's choice) and unsplit (ZAYA_ATTN_KEY_SPLITS=1), the same
  # binary in the same call.
  local cfg=bench/configs/zaya1-base-blocks.json splits
  for splits in 0 1; do
    ZAYA_ATTN_KEY_SPLITS=$splits "$BIN/bench_decode" --backend cuda --config $cfg --batch 1 --prompt 8192 --tokens 32 \
      --rounds 3 > "$LOGS/bench_decode_long_splits$splits.json" 2> "$LOGS/bench_decode_long_splits$splits.log" ||
      { tail -3 "$LOGS/bench_decode_long_splits$splits.log"; return 1; }
    echo "key splits $splits (0: the backend's choice): $(tail -1 "$LOGS/bench_decode_long_splits$splits.log")"
  done
}
step_accum() {
  # Four micro-batches per optimizer step (4 x B x T tokens), both engines: Muon's Newton-Schulz
  # (a fixed cost per step) spread over more tokens, as in training with gradient accumulation.
  local cfg=bench/configs/zaya1-base-blocks.json B=${BENCH_B:-4} T=${BENCH_T:-4096}
  if [[ -z ${SKIP_HF:-} ]]; then
    PYTHONUNBUFFERED=1 python3 bench/bench_train_hf.py --config $cfg --batch $B --seq $T --micro-batches 4 \
      --warmup 1 --steps 3 > "$LOGS/bench_train_hf_mb4.json" 2> "$LOGS/bench_train_hf_mb4.log" &&
      python3 -c "import json; d=json.load(open('$LOGS/bench_train_hf_mb4.json')); print('hf, 4 micro-batches', d['tokens_per_s'])" ||
      tail -3 "$LOGS/bench_train_hf_mb4.log"
  fi
  "$BIN/bench_train" --backend cuda --config $cfg --batch $B --seq $T --micro-batches 4 --warmup 1 --steps 3 \
    > "$LOGS/bench_train_cuda_mb4.json" 2> "$LOGS/bench_train_cuda_mb4.log" &&
    grep -E "median|MFU|Newton-Schulz:" "$LOGS/bench_train_cuda_mb4.log" || tail -3 "$LOGS/bench_train_cuda_mb4.log"
}
step_attention() {
  local shape i=0
  for shape in "--head-dim 128" "--head-dim 64 --heads 16 --kv-heads 4" "--head-dim 128 --window 1024"; do
    i=$((i + 1))
    "$BIN/bench_attention" --backend cuda --batch ${BENCH_B:-4} --seq ${BENCH_T:-4096} $shape \
      > "$LOGS/bench_attention_$i.json" 2> "$LOGS/bench_attention_$i.log" || { tail -3 "$LOGS/bench_attention_$i.log"; return 1; }
    python3 bench/bench_attention_torch.py --batch ${BENCH_B:-4} --seq ${BENCH_T:-4096} $shape \
      > "$LOGS/bench_attention_torch_$i.json" 2> "$LOGS/bench_attention_torch_$i.log" || tail -3 "$LOGS/bench_attention_torch_$i.log"
    echo "shape: $shape"
    cat "$LOGS/bench_attention_$i.log"
    python3 - "$LOGS/bench_attention_$i.json" "$LOGS/bench_attention_torch_$i.json" <<'PY'
import json, sys
z = json.load(open(sys.argv[1]))
try:
    t = json.load(open(sys.argv[2]))
except Exception as e:
    sys.exit(f"torch peer: no result ({e})")
print(f"torch   forward {t['forward_ms']:8.3f} ms ({t['forward_tflops']:6.1f} TFLOP/s)  forward+backward "
      f"{t['forward_backward_ms']:8.3f} ms ({t['forward_backward_tflops']:6.1f} TFLOP/s)")
for name, p in z["paths"].items():
    if "forward_ms" in p:
        print(f"{name}: {t['forward_ms'] / p['forward_ms']:.2f}x torch's speed forward, "
              f"{t['forward_backward_ms'] / p['forward_backward_ms']:.2f}x forward+backward")
PY
  done
}
step_kernels() {
  # Every kernel of one training step timed by Nsight Compute (each kernel replayed alone, clocks
  # left as they are), summed by kernel name: where the per-op profile's time goes inside an op.
  local cfg=bench/configs/zaya1-base-blocks.json
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  [[ -x $ncu ]] || { echo "no ncu on this machine"; return 1; }
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$BIN/bench_train" --backend cuda --config $cfg --batch ${BENCH_B:-4} --seq ${BENCH_T:-4096} --warmup 0 --steps 1 \
    --skip-peaks > "$LOGS/kernels.csv" 2> "$LOGS/kernels.log" || { tail -5 "$LOGS/kernels.log"; return 1; }
  python3 bench/kernel_table.py --top 80 "$LOGS/kernels.csv" > "$LOGS/kernels.txt"; head -45 "$LOGS/kernels.txt"
}
step_fit() {
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
  local T rc=1 run
  # "T" keeps every activation; "T:r" recomputes them (bench_train --recompute), which frees
  # most of the activation memory for longer sequences.
  for run in ${FIT_SEQ:-4096 8192:r 16384:r}; do
    T=${run%:r}
    local flag="" tag=$T
    if [[ $run == *:r ]]; then flag=--recompute; tag=${T}_recompute; fi
    echo "zaya1-base, batch 1 x $T tokens ${flag:+(activations recomputed)}:"
    if "$BIN/bench_train" --backend cuda --preset zaya1-base --batch 1 --seq $T --warmup 1 --steps 3 --skip-peaks $flag \
      > "$LOGS/fit_$tag.json" 2> "$LOGS/fit_$tag.log"; then
      grep -E "^model|median|memory|step [0-9]" "$LOGS/fit_$tag.log"
      rc=0
    else
      tail -4 "$LOGS/fit_$tag.log"
    fi
  done
  return $rc
}
export -f $(compgen -A function step_) libdir_of bench_train_variant
export BIN LOGS ROOT
for s in "${steps[@]}"; do
  echo "=== $s"
  t0=$(date +%s)
  limit_var=STEP_TIMEOUT_$s  # a step's own limit (STEP_TIMEOUT_bench=240), else STEP_TIMEOUT
  if timeout "${!limit_var:-${STEP_TIMEOUT:-420}}" bash -c "step_$s"; then
    echo "=== $s: ok ($(( $(date +%s) - t0 )) s)"
  else
    echo "=== $s: FAILED or timed out ($(( $(date +%s) - t0 )) s)"
    failed=$((failed + 1))
  fi
  tar -C "$LOGS" -czf "$OUT/logs.tgz" .
done
exit $failed
