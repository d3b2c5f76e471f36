"""Where ragen2 keeps what it builds or converts once and reuses: `$RAGEN2_CACHE`, else `~/.cache/ragen2`.

A module of its own, free of ragen2 imports, so that the models (warm starts, converted GGUF files) and the
environments (TextWorld's generated games) share one cache without the environments importing the models.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$RAGEN2_CACHE`, else `~/.cache/ragen2`."""
    return Path(os.environ.get("RAGEN2_CACHE") or Path.home() / ".cache" / "ragen2")
