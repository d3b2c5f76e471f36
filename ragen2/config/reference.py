"""The key reference, written from the dataclasses: rows for `ragen2 train --help` and the page docs/config.md.

Generated rather than written by hand so that it never drifts from the code; a test compares
docs/config.md with `config_markdown()`. `python -m ragen2.config > docs/config.md` rewrites it.
"""

from __future__ import annotations

import dataclasses

import yaml

from ragen2.config.build import leaves
from ragen2.config.presets import preset_pattern
from ragen2.config.sections import Config


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML, help) for every key: feeds --help and docs/config.md."""
    rows = []
    for key, f in leaves(cls, prefix):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        rows.append((key, shown, f.metadata.get("help", "")))
    return rows


def _cell(text: str) -> str:
    """Text for a Markdown table cell: `|` escaped (GitHub renders `\\|` as `|`, code spans included)."""
    return text.replace("|", "\\|")


def config_markdown() -> str:
    """docs/config.md, generated from the dataclasses so it never drifts from the code."""
    lines = [
        "# Configuration",
        "",
        "Generated from `ragen2/config/sections.py` (`python -m ragen2.config > docs/config.md`); a test keeps it "
        "current.",
        "",
        "Set keys as `key=value` after the preset: `ragen2 train frozenlake-ppo algo.clip_high=0.3`.",
        f"Presets: {preset_pattern()}.",
        "`ragen2 train` with no preset runs `default` (ragen2/configs/default.yaml, FrozenLake from a part-way "
        "policy); the defaults below, with no preset at all (`load_config()`), are Sokoban's run.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | `{_cell(d)}` | {_cell(h)} |" for k, d, h in describe()]
    return "\n".join(lines) + "\n"
