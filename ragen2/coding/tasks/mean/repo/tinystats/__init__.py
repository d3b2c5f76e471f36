"""Small statistics helpers."""

from tinystats.core import mean, spread

__all__ = ["mean", "spread"]
