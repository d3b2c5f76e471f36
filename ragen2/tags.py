"""The tags of an agent's turn, `<think>..</think><answer>..</answer>`, of a memory note, and the action separator.

A module of its own, free of imports, so that the config can check a separator without loading
the agent layer (and with it torch): a refused config answers in well under a second.
"""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
MEMORY_OPEN, MEMORY_CLOSE = "<memory>", "</memory>"  # a memory note (rollout.memory=summary)
ACTION_SEPARATOR = "||"


def valid_action_sep(sep: str) -> bool:
    """A separator must be non-empty and hold no tag, or the parser could not tell actions from tags."""
    return bool(sep) and not any(tag in sep for tag in TAGS)
