"""ragen2: multi-turn RL for LLM agents that sees reasoning collapse coming and prevents it."""

__version__ = "0.1.0"
