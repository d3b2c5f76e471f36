"""Where warm-started policies are kept: a directory per settings key (the key in its INFO_FILE), written
atomically, and the copies that ship inside the package.

A module apart from the builds, which hold the demonstrations and the training: both save through it
(`ragen2.models.warmstart` the tiny policy, `ragen2.models.base_warmstart` a pretrained base), and
`ragen2 warmstart` holds a rebuild against the shipped copy (`compare_weights`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ragen2.errors import ConfigError

log = logging.getLogger(__name__)

INFO_FILE = "warmstart.json"

# Warm starts that ship inside the package, one directory each, found by the key in their INFO_FILE. A
# part-way policy lands wherever the CPU's float rounding takes it (the default run's 700 steps: 0.375
# held-out success under ATEN_CPU_CAPABILITY=avx512, 0.195 under avx2, 0.586 under default), so
# the default run's starting policy ships as built once, on an AVX-512 CPU, and is the same policy on
# every machine. `ragen2 warmstart` still rebuilds it, into the cache (docs/models.md).
SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_policy(key: str) -> Path | None:
    """The shipped warm start whose settings have this key, if there is one."""
    if not SHIPPED_DIR.is_dir():
        return None
    return next((path for path in sorted(SHIPPED_DIR.iterdir()) if _stored_key(path) == key), None)


def compare_weights(a: str | Path, b: str | Path) -> float:
    """The largest absolute difference between two saved models' weights (0.0: bit for bit the same)."""
    from safetensors.torch import load_file

    first, second = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    if first.keys() != second.keys():
        return math.inf
    return max(float((first[k] - second[k]).abs().max()) for k in first)


def save_atomically(out: Path, key: str, build: Callable[[Path], None], force: bool = False) -> Path:
    """`build(tmp)` into a temporary sibling of `out`, renamed to `out` when complete; returns `out`.

    Shared by every warm start so that none can leave a half-written directory that looks
    complete. `out` is reused when its INFO_FILE holds `key` (unless `force`); a non-empty
    `out` holding anything else is refused rather than overwritten.
    """
    if out.exists() and not force:
        if _stored_key(out) == key:
            log.debug("warm start: reusing %s", out)
            return out
        if any(out.iterdir()):
            raise ConfigError(
                f"{out} exists and does not hold a warm start with these settings (key {key}); "
                "choose another directory or pass force=True to replace it"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(tmp)
        if force and out.exists():
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)  # atomic; fails when `out` is a non-empty directory
        except OSError:
            if _stored_key(out) != key:
                raise
            log.info("warm start: another process saved %s first; using it", out)
            shutil.rmtree(tmp)
            return out
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("warm start: saved %s", out)
    return out


def _stored_key(path: Path) -> str | None:
    """The settings key of the warm start saved in `path`, or None where there is none."""
    try:
        return json.loads((path / INFO_FILE).read_text())["key"]
    except (OSError, ValueError, KeyError):
        return None
