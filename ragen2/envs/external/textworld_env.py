"""TextWorld games as ragen2 environments: `make("textworld:coin_collector", level=5)`.

TextWorld makes a game file from a challenge's settings and a seed (what `tw-make` does);
making one takes seconds, so each (challenge, settings, seed) game is generated on first
use and cached as a file. The game itself lists the admissible commands and a walkthrough
from the current state (`policy_commands`), which is `solve()`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, ClassVar

import textworld
import textworld.challenges
from textworld.generator import compile_game

from ragen2.cache import default_cache_dir
from ragen2.envs.external.base import ExternalEnv, Outcome, unknown_game
from ragen2.errors import ConfigError

# ragen2's names for TextWorld's challenges.
CHALLENGES: dict[str, str] = {
    "coin_collector": "tw-coin_collector",
    "treasure_hunter": "tw-treasure_hunter",
    "cooking": "tw-cooking",
    "simple": "tw-simple",
}
# Settings a challenge requires that tw-make has no default for.
_REQUIRED_DEFAULTS: dict[str, dict[str, Any]] = {
    "coin_collector": {"level": 1},
    "treasure_hunter": {"level": 1},
    "simple": {"rewards": "dense", "goal": "detailed"},
}


def cache_dir() -> Path:
    """Where generated games are kept: $RAGEN2_TEXTWORLD_CACHE, else textworld/ in ragen2's cache
    ($RAGEN2_CACHE or ~/.cache/ragen2, where the policies and converted models are kept too)."""
    return Path(os.environ.get("RAGEN2_TEXTWORLD_CACHE") or default_cache_dir() / "textworld")


def _settings(challenge: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The challenge's settings as tw-make would parse them from `--key value` flags."""
    _, _, add_arguments = textworld.challenges.CHALLENGES[CHALLENGES[challenge]]
    parser = argparse.ArgumentParser(prog=f"textworld:{challenge}", add_help=False, exit_on_error=False)
    add_arguments(parser)
    argv: list[str] = []
    for key, value in {**_REQUIRED_DEFAULTS.get(challenge, {}), **kwargs}.items():
        if isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        else:
            argv += [f"--{key}", str(value)]
    try:
        known, unknown = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ConfigError(f"textworld:{challenge} settings {kwargs}: {e}") from e
    if unknown:
        raise ConfigError(f"textworld:{challenge} has no setting {unknown[0].lstrip('-')!r}; see tw-make {CHALLENGES[challenge]} --help")
    return vars(known)


def game_file(challenge: str, settings: dict[str, Any], seed: int) -> Path:
    """The cached game for (challenge, settings, seed), generated and compiled when missing."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:12]
    path = cache_dir() / f"{challenge}-{digest}-{seed}.z8"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # renamed into place: concurrent runs never see half a file
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = str(Path(tmp) / path.name)
        _, make, _ = textworld.challenges.CHALLENGES[CHALLENGES[challenge]]
        compile_game(make(settings, options), options)
        # The .json next to the game file holds what TextWorld knows beyond the story file (the walkthrough,
        # the admissible commands): it goes first, so a game file is only ever seen with its .json.
        for suffix in (".json", ".z8"):
            os.replace(Path(tmp) / path.with_suffix(suffix).name, path.with_suffix(suffix))
    return path


class TextWorldEnv(ExternalEnv):
    """One TextWorld challenge; every seed is its own generated game.

    ## Observation
    The game's text: the objective and the room at reset, then the response to each command.

    ## Actions
    A command such as `go north` or `take coin`; `valid_actions()` lists the game's
    admissible commands (case and extra spaces ignored).

    ## Rewards
    The points the command scored (TextWorld's score increase); the game's maximum is in its text.

    ## Episode end
    Terminated when the game is won or lost; truncated after `max_actions` commands.

    ## Info
    - `action_is_valid` (bool), `success` (bool: the game is won).
    """

    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(self, challenge: str, max_actions: int = 50, **settings: Any) -> None:
        if challenge not in CHALLENGES:
            raise unknown_game("textworld", challenge, f"{challenge} is not a TextWorld challenge; challenges: "
                               f"{', '.join(CHALLENGES)}", CHALLENGES)
        super().__init__(max_actions)
        self.challenge = challenge
        self.settings = _settings(challenge, settings)
        self._game: Any = None
        self._state: Any = None
        self.instruction = (
            f"You are playing a TextWorld text adventure ({challenge.replace('_', ' ')}). The first observation "
            "gives your objective and the room you are in; each later one is the game's response to your command.\n"
            "Commands are short imperative phrases such as: go north, open door, take coin, look, inventory.\n"
            "Answer as <think>...</think><answer>Command1 || Command2</answer>: one or more commands separated by ||."
        )

    def _start(self, seed: int) -> str:
        if self._game is not None:
            self._game.close()
        infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True, score=True)
        path = game_file(self.challenge, self.settings, seed)
        with warnings.catch_warnings():  # jericho cannot score TextWorld's games itself; TextWorld's wrapper does
            warnings.simplefilter("ignore")
            self._game = textworld.start(str(path), request_infos=infos)
            self._state = self._game.reset()
        return _text(self._state.feedback)

    def _moves(self) -> list[str]:
        return list(self._state["admissible_commands"])

    def _apply(self, move: str) -> Outcome:
        before = self._state["score"]
        self._state, score, done = self._game.step(move)
        won = bool(self._state["won"])
        return Outcome(_text(self._state.feedback) or "Nothing happens.", float(score - before), bool(done), won)

    def _solution(self) -> list[str] | None:
        return list(self._state["policy_commands"])


def _text(feedback: str) -> str:
    """The game's response without the interpreter's trailing `>` prompt and status line."""
    return re.sub(r"\n>[^\n]*\Z", "", feedback.rstrip()).strip()


def make(challenge: str, **cfg: Any) -> TextWorldEnv:
    return TextWorldEnv(challenge, **cfg)
