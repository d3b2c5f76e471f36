#!/usr/bin/env bash
# The GPU checks recorded in docs/benchmarks.md and docs/results.md, in one script (about 8 minutes
# on one H200 for stages 1-4; stage 5 is new and not yet timed):
#   1. the default config (`ragen2 train sokoban`: tiny policy, Sokoban, GRPO, filter and diagnostics on) on
#      CUDA, 1 process, HF backend: step time, generated tokens/s and peak memory
#      (benchmarks/step_throughput.py, Part 1); the same on the machine's CPU cores as the baseline;
#   2. a 25M-parameter policy warm-started from scratch on the GPU, and its held-out success;
#   3. experiments/filter_sokoban_gpu.yaml with that policy: the paper's filter vs none, 3 seeds,
#      all six runs at once on the GPU;
#   4. generation (benchmarks/generation.py) at the paper's batch shape of 8 x 16 episodes: the HF
#      backend against a bare `model.generate`, prefix reuse against none, and a vLLM engine when
#      vLLM imports; on a random model with Qwen2.5-0.5B's layers, and on SmolLM2-135M when
#      SMOLLM2=path/to/SmolLM2-135M-Instruct.Q4_1.gguf is there (the machine cannot download; the
#      98 MB file goes over in two parts, `split -b 60M`, joined with `cat` before this script).
#   5. the default run asynchronous (a rollout worker, async.max_staleness=1) against synchronous on
#      $DEVICE, time per update in the same run (benchmarks/async_step_time.py); both processes share
#      the GPU, and the weights go to the worker over gloo.
# Usage: OUT=results_dir bash benchmarks/gpu_checks.sh
# The variables below shrink it for a rehearsal on a CPU (DEVICE=cpu and small settings);
# DEADLINE_S stops the sweep in time to pack what it has when the whole script must end by then.
set -uo pipefail
OUT=${OUT:-gpu-results}
DEVICE=${DEVICE:-cuda}
POLICY=${POLICY:-/tmp/policy-25m}
POLICY_SETTINGS=${POLICY_SETTINGS:-hidden_size=512 num_layers=8 num_heads=8 num_kv_heads=4 intermediate_size=1536 lr=1e-3 steps=1500}
DEFAULT_STEPS=${DEFAULT_STEPS:-6}
EVAL_EPISODES=${EVAL_EPISODES:-200}
SWEEP_OVERRIDES=${SWEEP_OVERRIDES:-}
SWEEP_JOBS=${SWEEP_JOBS:-6}
SWEEP_THREADS=${SWEEP_THREADS:-2}
SWEEP_DIR=${SWEEP_DIR:-sweeps/filter_sokoban_gpu}
DEADLINE_S=${DEADLINE_S:-100000}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo; echo "=== $1 (at $(( $(date +%s) - start )) s)"; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
$PY -m ragen2 warmstart   # the tiny policy: reused when $RAGEN2_CACHE holds it

stage "1. default run on $DEVICE, 1 process"
$PY benchmarks/step_throughput.py --skip-trl --device "$DEVICE" --steps "$DEFAULT_STEPS" --out "$OUT/default_$DEVICE.json"

stage "2. warm start of a larger policy on $DEVICE (the CPU baseline of 1. runs meanwhile, on 8 threads)"
$PY benchmarks/step_throughput.py --skip-trl --device cpu --threads 8 --steps 3 --out "$OUT/default_cpu.json" \
  > "$OUT/default_cpu.log" 2>&1 &
baseline=$!
# shellcheck disable=SC2086  # POLICY_SETTINGS is a list of KEY=VALUE words
$PY -m ragen2 warmstart --device "$DEVICE" --out "$POLICY" $POLICY_SETTINGS
cp "$POLICY/warmstart.json" "$OUT/policy_warmstart.json"
$PY -m ragen2 eval "$POLICY" --env sokoban --episodes "$EVAL_EPISODES" --device "$DEVICE" --out "$OUT/policy_eval_sokoban.json"
wait $baseline
cat "$OUT/default_cpu.log"

stage "3. filter vs no filter with the larger policy, $SWEEP_JOBS runs at once"
# shellcheck disable=SC2086
timeout $(( DEADLINE_S - ($(date +%s) - start) - 20 )) $PY -m ragen2 sweep experiments/filter_sokoban_gpu.yaml model.path="$POLICY" model.device="$DEVICE" $SWEEP_OVERRIDES \
  --jobs "$SWEEP_JOBS" --threads "$SWEEP_THREADS" --out "$SWEEP_DIR"
cat "$SWEEP_DIR/sweep.md"
tar czf "$OUT/filter_sokoban_gpu.tgz" --exclude=checkpoints "$SWEEP_DIR"
stage "4. generation at 8 x 16 on $DEVICE"
vllm_flag=$($PY -c "import vllm" 2>/dev/null && echo --vllm || echo "")
for model in random-0.5b ${SMOLLM2:-}; do
  # shellcheck disable=SC2086  # vllm_flag is empty or one word
  $PY benchmarks/generation.py --model "$model" --device "$DEVICE" --groups 8 --group-size 16 $vllm_flag \
    --out "$OUT/generation_$(basename "$model").json" || echo "generation benchmark on $model failed"
done
stage "5. async (staleness 1) vs sync, default run on $DEVICE"
$PY benchmarks/async_step_time.py --device "$DEVICE" --steps "$DEFAULT_STEPS" --repeats 2 \
  --out "$OUT/async_$DEVICE.json" || echo "async benchmark failed"
stage "done"
