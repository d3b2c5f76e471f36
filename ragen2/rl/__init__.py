"""Reinforcement learning for multi-turn agents.

``advantages`` holds the advantage estimators (GAE, GRPO, Dr.GRPO, RLOO,
REINFORCE++) and ``losses`` the clipped policy and value losses, KL estimators,
entropy and loss aggregation, all as pure tensor functions with their shapes
documented. docs/algorithms.md maps each ``algo.name`` to these pieces.
"""
