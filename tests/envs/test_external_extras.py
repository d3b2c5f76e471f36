"""A suite whose package is missing says how to install it: the extra, and for the suites that `make` leaves out
of .venv (OpenEnv, verifiers) the environment that has them. The packages are hidden, so this runs in every
environment, whether they are installed or not."""

from __future__ import annotations

import sys

import pytest

from ragen2 import envs
from ragen2.errors import ConfigError


@pytest.mark.parametrize(("name", "package"), [
    ("verifiers:verifiers_arith", "verifiers"),
    ("openenv:openenv_guess:GuessEnvironment", "openenv"),
])
def test_a_missing_package_names_its_extra_and_environment(monkeypatch, name, package):
    suite = name.partition(":")[0]
    monkeypatch.setitem(sys.modules, package, None)  # what `import` sees when it is not installed
    monkeypatch.delitem(sys.modules, f"ragen2.envs.external.{suite}_env", raising=False)
    fix = rf"pip install 'ragen2\[{suite}\]'; .* \.venv-envs has it \(`make test-envs`"
    with pytest.raises(ConfigError, match=rf"needs the {suite} package, which is not installed: {fix}"):
        envs.make(name)
