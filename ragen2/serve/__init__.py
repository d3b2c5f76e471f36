"""The policy behind an OpenAI-compatible endpoint, and agent loops ragen2 did not write trained through it."""
