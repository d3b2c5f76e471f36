"""`python -m ragen2.config > docs/config.md`: print the key reference."""

from ragen2.config.reference import config_markdown

print(config_markdown(), end="")
