"""A hub name that is not local fails in one line while the hub is out of reach, before any hub call.

A mistyped `ragen2 eval tyny` offline once took about a minute: five hub retries, each printed
twice, then "cannot load its tokenizer (OSError: We couldn't connect ...)" and no suggestion.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import constants as hub_constants

from ragen2.cli import main
from ragen2.errors import ConfigError
from ragen2.models.loading import check_model_path

REPO = Path(__file__).resolve().parents[2]
LOCAL_CHOICES = "use tiny, tiny:ENV[,ENV...] (e.g. tiny:countdown), smollm2-135m, a model directory, a .gguf file"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache, no proxy, and the working directory in tmp_path (so no run directory is left around)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch) -> Path:
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def cache_model(cache: Path, name: str) -> None:
    """What a download leaves in the hub cache (the folder is what counts)."""
    (cache / f"models--{name.replace('/', '--')}" / "snapshots" / "abc").mkdir(parents=True)


def test_cli_eval_of_a_mistyped_name_offline_fails_fast_in_one_line(tmp_path):
    cache = tmp_path / "hub"
    cache.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(cache)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "ragen2", "eval", "tyny", "--env", "bandit"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started  # the whole command, interpreter start-up included
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and elapsed < 3, elapsed
    assert len(err) == 1 and err[0].startswith("error: model tyny is not a local model"), err
    assert "Did you mean: tiny?" in err[0] and LOCAL_CHOICES in err[0]
    assert "Traceback" not in result.stderr and "Retrying" not in result.stderr  # no hub request was made


def test_cli_train_offline_names_the_local_choices(offline, capsys, tmp_path):
    assert main(["train", "bandit", "model.path=foo/bar"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: model.path=foo/bar is not a local model, and the hub cannot be reached to look for it "
                   f"(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set); offline, {LOCAL_CHOICES}."]
    assert not (tmp_path / "runs").exists()


def test_a_cached_hub_name_is_known_offline(offline):
    cache_model(offline, "org/name")
    check_model_path("org/name")
    with pytest.raises(ConfigError, match=r"a \.gguf file, or a hub model in the local cache \(org/name\)\. "
                                          r"Did you mean: org/name\?"):
        check_model_path("org/nmae")


def test_no_connection_to_the_hub_counts_as_offline(hub_cache, monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=f"no connection to 127.0.0.1:{port}"):
        check_model_path("tyny")
    assert time.perf_counter() - started < 3


def test_online_the_hub_decides(hub_cache, monkeypatch):
    """With the hub, or the proxy to it, accepting connections, a hub name passes as before."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("http_proxy", "127.0.0.1:1")  # bypassed: no_proxy names the hub's host
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        check_model_path("foo/bar")
        monkeypatch.setattr(hub_constants, "ENDPOINT", "http://hub.invalid")
        monkeypatch.setenv("http_proxy", f"127.0.0.1:{port}")
        check_model_path("foo/bar")
