#!/usr/bin/env bash
# The GPU checks recorded in docs/benchmarks.md, in one script:
#   1. `ragen2 eval` of the tiny policy on CPU and on CUDA (same seeds): success rates and time per episode;
#   2. the scoring benchmark with a Qwen2.5-0.5B-shaped model (random weights) on CUDA;
#   3. a short training run of a ~100M-parameter Qwen2 built from config, on CUDA: tokens/s and timing.
# Usage: OUT=results_dir RAGEN2_CACHE=dir_with_tiny_policy bash benchmarks/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

/usr/bin/time -f "warmstart wall %e s" $PY -m ragen2 warmstart   # reused when cached

for dev in cpu cuda; do
  /usr/bin/time -f "eval sokoban $dev wall %e s" $PY -m ragen2 eval tiny --env sokoban --episodes 200 --device $dev --out "$OUT/eval_sokoban_$dev.json" --no-random
done
$PY -m ragen2 eval tiny --env frozenlake --episodes 200 --device cuda --out "$OUT/eval_frozenlake_cuda.json"

$PY benchmarks/scoring.py --preset qwen2.5-0.5b --device cuda --dtype bfloat16 --out "$OUT/scoring_cuda.json"

$PY - <<'PYEOF'
from ragen2.models.loading import resolve_model_path
from ragen2.models.tiny import build_model
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
model = build_model(tok, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072)
print("parameters:", model.num_parameters())
model.save_pretrained("/tmp/qwen2-100m"); tok.save_pretrained("/tmp/qwen2-100m")
PYEOF
$PY -m ragen2 train sokoban model.path=/tmp/qwen2-100m model.device=cuda trainer.total_steps=4 trainer.eval_every=0 \
  trainer.save_every=0 rollout.group_size=16 logging.progress=false trainer.run_dir="$OUT/run100m"
$PY - "$OUT/run100m" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
for r in rows:
    if "rollout/turns_mean" not in r:
        continue
    episodes = 8 * 16  # rollout.num_groups x rollout.group_size
    tokens = r["rollout/response_tokens_mean"] * r["rollout/turns_mean"] * episodes
    print(f"step {r['step']}: generated tokens/s {tokens / r['timing_s/rollout']:.0f}",
          {k: round(v, 3) for k, v in r.items() if k.startswith(("timing_s/", "system/")) and v is not None})
PYEOF
