"""Environment tests. The `code` environment runs programs only inside its OS-level sandbox, which
needs root (CAP_SYS_ADMIN) or, for another user, unprivileged user namespaces (see
ragen2/envs/sandbox/): on a machine that cannot provide it, the tests that run programs are
skipped with the sandbox's own message instead of failing."""

from __future__ import annotations

import functools

import pytest

from ragen2.envs import sandbox

CODE_TEST_FILES = ("test_code_env.py", "test_code_datasets.py", "test_env_properties.py")


@functools.cache
def _sandbox_missing() -> str | None:
    """Why programs cannot run here, or None when they can (the first call starts the sandbox)."""
    try:
        sandbox.prepare()
    except sandbox.SandboxUnavailable as e:
        return str(e)
    return None


def _runs_programs(item: pytest.Item) -> bool:
    if item.path.name not in CODE_TEST_FILES:
        return False
    params = getattr(item, "callspec", None)
    return item.path.name != "test_env_properties.py" or "code" in item.name or (
        params is not None and params.params.get("name") == "code")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "envs" and _runs_programs(item) and _sandbox_missing():
            item.add_marker(pytest.mark.skip(reason=f"the code sandbox is unavailable here: {_sandbox_missing()}"))
