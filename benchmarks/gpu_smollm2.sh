#!/usr/bin/env bash
# SmolLM2-135M-Instruct on one GPU with every weight trained, in one script sized for 8 minutes on one H200
# (DEADLINE_S=480). It has not run on a GPU yet: the times below are estimates.
#   0. joins the model file from its two parts (.gpu-a/, .gpu-b/) and checks its SHA256 (seconds);
#   1. a full fine-tuning warm start on the demonstrations (Bandit and FrozenLake), about 2 minutes with the
#      conversion of the file:  ragen2 warmstart --base FILE.gguf --lora-rank 0 --device cuda --out /tmp/ws-smollm2
#      --eval-episodes 64 episodes_per_env=600 steps=300 lr=5e-5 warmup_steps=20 batch_tokens=4096;
#   2. from that policy, experiments/smollm2_mechanism_gpu.yaml (the entropy bonus alone vs no update, Bandit)
#      and experiments/smollm2_filter_frozenlake_gpu.yaml (the paper's filter vs none), 3 seeds each, at the
#      paper's batch of 8 groups x 16: all twelve runs at once, about 3 minutes, stopped THROUGHPUT_S before the
#      deadline when they run longer (the packed runs then end part-way);
#   3. throughput on the quiet GPU, about 2.5 minutes: benchmarks/generation.py on the model file at 8 x 16 (ragen2's
#      HF backend against a bare `generate`, prefix reuse against none) and benchmarks/step_throughput.py on the
#      filter sweep's training step from the warm start (rollout and step tokens/s, phases, peak memory), with
#      the HF backend and, where `import vllm` works, with vLLM too (`--vllm`, rollout.backend=vllm); where it
#      does not, the script says so and runs the HF rows alone.
# Back in $OUT: smollm2_warmstart.json, smollm2_mechanism_gpu.tgz and smollm2_filter_frozenlake_gpu.tgz (the
# sweep directories without checkpoints: tar xzf them -C /tmp/gpu, then
# python scripts/make_results.py --collect /tmp/gpu/sweeps), generation_smollm2.json, step_smollm2_hf.json
# (and step_smollm2_vllm.json), and the log the command below tees.
# The GPU machine cannot download and receives at most 64 MiB per call, less than the 98 MB model file, so
# benchmarks/gpu_carry.sh, run first where pip works, cuts the file into .gpu-a/ and .gpu-b/ and puts the
# wheels of what that machine lacks (gguf, gymnasium, omegaconf) or has too old (transformers) into .whl/.
# Two calls follow, back to back, while the machine stays warm and keeps the ignored files of the first: the
# first carries .gpu-a and runs `true`; the second carries .gpu-b and .whl and runs
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail
#   DEADLINE_S=480 bash benchmarks/gpu_smollm2.sh 2>&1 | tee $OUT/gpu_smollm2.log
# Rehearsal variables: DEVICE=cpu; WS_SETTINGS and WS_EVAL_EPISODES (a shorter warm start); SWEEP_OVERRIDES
# (e.g. trainer.total_steps=1 rollout.num_groups=2 rollout.group_size=2), SWEEP_JOBS and SWEEP_ROOT (where the
# sweeps run); THROUGHPUT_S; NUM_GROUPS, GROUP_SIZE, STEP_STEPS and GEN_REPEATS (stage 3); STAGES, a subset of
# "warmstart sweeps throughput" (empty: stage 0 alone); GGUF and WS, where the file and the policy go.
set -uo pipefail
OUT=${OUT:-gpu-results}
DEVICE=${DEVICE:-cuda}
GGUF=${GGUF:-/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
WS=${WS:-/tmp/ws-smollm2}
WS_SETTINGS=${WS_SETTINGS:-episodes_per_env=600 steps=300 lr=5e-5 warmup_steps=20 batch_tokens=4096}
WS_EVAL_EPISODES=${WS_EVAL_EPISODES:-64}
SWEEP_OVERRIDES=${SWEEP_OVERRIDES:-}
SWEEP_JOBS=${SWEEP_JOBS:-6}
SWEEP_ROOT=${SWEEP_ROOT:-sweeps}
NUM_GROUPS=${NUM_GROUPS:-8}
GROUP_SIZE=${GROUP_SIZE:-16}
STEP_STEPS=${STEP_STEPS:-3}
GEN_REPEATS=${GEN_REPEATS:-2}
STAGES=${STAGES-warmstart sweeps throughput}
DEADLINE_S=${DEADLINE_S:-480}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # twelve processes share the GPU
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo; echo "=== $1 (at $(( $(date +%s) - start )) s)"; }
wants() { [[ " $STAGES " == *" $1 "* ]]; }
# Seconds left before the deadline once `$1` more are kept back; at least 1 (`timeout 0` would never stop).
budget() { local s=$(( DEADLINE_S - ($(date +%s) - start) - $1 )); echo $(( s > 1 ? s : 1 )); }

stage "0. the model file, from its two parts"
name=$(basename "$GGUF")
mkdir -p "$(dirname "$GGUF")"
cat ".gpu-a/$name.part-aa" ".gpu-b/$name.part-ab" > "$GGUF" || exit 1
want=$(cut -d' ' -f1 ".gpu-b/$name.sha256")
got=$(sha256sum "$GGUF" | cut -d' ' -f1)
if [[ "$want" != "$got" ]]; then echo "$GGUF: sha256 $got, expected $want: run benchmarks/gpu_carry.sh again" >&2; exit 1; fi
echo "$GGUF: $(stat -c %s "$GGUF") bytes, sha256 matches"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if "$PY" -c "import vllm" 2>/dev/null; then vllm=1; echo "vLLM imports: its rows run too"; else vllm=; echo "vLLM does not import here: HF rows only"; fi
THROUGHPUT_S=${THROUGHPUT_S:-$(( vllm ? 300 : 150 ))}   # kept back from the sweeps for stage 3

if wants warmstart; then
  stage "1. full fine-tuning warm start on $DEVICE"
  # shellcheck disable=SC2086  # WS_SETTINGS is a list of KEY=VALUE words
  "$PY" -m ragen2 warmstart --base "$GGUF" --lora-rank 0 --device "$DEVICE" --eval-episodes "$WS_EVAL_EPISODES" \
    --out "$WS" $WS_SETTINGS || exit 1
  cp "$WS/warmstart.json" "$OUT/smollm2_warmstart.json"
fi

if wants sweeps; then
  stage "2. the mechanism and filter sweeps, $SWEEP_JOBS runs each, all at once"
  pids=()
  for spec in smollm2_mechanism_gpu smollm2_filter_frozenlake_gpu; do
    mkdir -p "$SWEEP_ROOT/$spec"
    # shellcheck disable=SC2086  # SWEEP_OVERRIDES is a list of key=value words
    timeout "$(budget $(( THROUGHPUT_S + 20 )))" "$PY" -m ragen2 sweep "experiments/$spec.yaml" model.path="$WS" \
      model.device="$DEVICE" $SWEEP_OVERRIDES --jobs "$SWEEP_JOBS" --threads 1 --out "$SWEEP_ROOT/$spec" \
      > "$SWEEP_ROOT/$spec/sweep.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for spec in smollm2_mechanism_gpu smollm2_filter_frozenlake_gpu; do
    tail -n 5 "$SWEEP_ROOT/$spec/sweep.log"
    grep "^|" "$SWEEP_ROOT/$spec/sweep.md" 2>/dev/null || echo "$spec: stopped by the deadline, no tables (the runs' metrics are packed)"
    tar czf "$OUT/$spec.tgz" --exclude=checkpoints "$SWEEP_ROOT/$spec"
  done
fi

if wants throughput; then
  stage "3. throughput at $NUM_GROUPS x $GROUP_SIZE on $DEVICE"
  # The filter sweep's settings, for a training step like its runs'.
  step_settings=(--preset frozenlake --skip-trl --model "$WS" --device "$DEVICE" --steps "$STEP_STEPS"
    rollout.num_groups="$NUM_GROUPS" rollout.group_size="$GROUP_SIZE" model.lora_rank=0 optim.lr=1e-5
    rollout.max_tokens_per_turn=64 algo.micro_batch_size=4 collapse.num_samples=32)
  timeout "$(budget $(( vllm ? 120 : 60 )))" "$PY" benchmarks/generation.py --model "$GGUF" --device "$DEVICE" \
    --groups "$NUM_GROUPS" --group-size "$GROUP_SIZE" --repeats "$GEN_REPEATS" ${vllm:+--vllm} \
    --out "$OUT/generation_smollm2.json" || echo "generation benchmark failed or ran out of time"
  timeout "$(budget $(( vllm ? 60 : 5 )))" "$PY" benchmarks/step_throughput.py "${step_settings[@]}" \
    --out "$OUT/step_smollm2_hf.json" || echo "step benchmark (HF) failed or ran out of time"
  if [[ -n "$vllm" ]]; then
    timeout "$(budget 5)" "$PY" benchmarks/step_throughput.py "${step_settings[@]}" rollout.backend=vllm \
      --out "$OUT/step_smollm2_vllm.json" || echo "step benchmark (vLLM) failed or ran out of time"
  fi
fi
stage "done"
