"""What a `model.path` names, checked in milliseconds and without torch: a mistyped name fails before
the heavy libraries load (seconds) or the hub client retries (a minute offline)."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants as hub_constants

from ragen2.errors import ConfigError, did_you_mean
from ragen2.models.gguf import SMOLLM2_ALIAS, is_gguf

# A hub id: `name` or `org/name` of letters, digits, `-`, `_` and `.` (not a path that starts with . / or ~).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
# How long the hub's host gets to accept a connection before a name that is not local is refused.
HUB_CONNECT_TIMEOUT_S = 1.0


def check_model_name(path: str | None, what: str) -> None:
    """Refuse a hub name that cannot load (see `check_hub_name`); tiny, GGUF and local paths pass here."""
    if path is None or path == "tiny" or path.startswith("tiny:") or is_gguf(path) or not is_hub_name(path):
        return
    check_hub_name(path, what)


def is_hub_name(path: str) -> bool:
    """True for a string that names a hub model (`Qwen/Qwen2.5-0.5B-Instruct`) and no local path."""
    return not Path(path).exists() and _HUB_ID.fullmatch(path) is not None


def check_hub_name(name: str, what: str) -> None:
    """Refuse, in one line, a hub name that is not in the local cache while the hub is out of reach.

    Without this, a mistyped name (`tyny`) offline costs the hub client's minute of retries and
    ends in a message about connections; this takes a second at most and lists what loads offline,
    with the closest name. Online, or for a cached name, nothing is checked: the hub decides.
    """
    cached = cached_hub_models()
    if name in cached:
        return
    reason = hub_unreachable()
    if reason is None:
        return
    shown = ", ".join(cached[:10]) + (", ..." if len(cached) > 10 else "")
    raise ConfigError(
        f"{what} is not a local model, and the hub cannot be reached to look for it ({reason}); offline, use tiny, "
        f"tiny:ENV[,ENV...] (e.g. tiny:countdown), {SMOLLM2_ALIAS}, a model directory, a .gguf file"
        + (f", or a hub model in the local cache ({shown})" if cached else "")
        + "." + did_you_mean(name, ["tiny", SMOLLM2_ALIAS, *cached])
    )


def cached_hub_models() -> list[str]:
    """The hub names the local Hugging Face cache holds (its `models--ORG--NAME` folders): those load offline."""
    cache = Path(hub_constants.HF_HUB_CACHE)
    return sorted(d.name.removeprefix("models--").replace("--", "/") for d in cache.glob("models--*") if d.is_dir())


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (offline mode is set, or its host, or the proxy to it, accepts no
    connection within HUB_CONNECT_TIMEOUT_S), or None when it can."""
    if hub_constants.is_offline_mode():
        return "HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set"
    target = urlparse(hub_constants.ENDPOINT)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(target.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(target.hostname):  # the hub client goes through it, as here
        target = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"no connection to {target.hostname}:{port}: {e}"
    return None
