"""Typed data that flows from rollout to diagnostics, filtering and the update."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationOutput:
    """What a generation backend returns for one prompt."""

    token_ids: list[int]  # generated tokens only, stop token included when one was produced
    text: str  # decoded token_ids (special tokens skipped)
    finish_reason: str  # "stop" (stop string or EOS) or "length" (hit the token cap)
    logprobs: list[float] | None = None  # per generated token, after temperature, when the backend gives them


@dataclass
class Turn:
    """One agent turn: the context shown, what the model generated, what the env did."""

    prompt_ids: list[int]  # context the model saw; ends with the assistant prefix "<think>" ("<answer>" without thinking)
    response_ids: list[int]  # tokens the model generated this turn (never re-tokenised)
    response_text: str
    reasoning: str  # text strictly between <think> and </think> ("" when missing, always "" without thinking)
    reasoning_span: tuple[int, int]  # [start, end) token indices of the reasoning inside response_ids
    actions: list[str]  # parsed actions, at most agent.max_actions_per_turn
    format_valid: bool  # the response parsed as <think>..</think><answer>..</answer> (<answer>..</answer> without thinking)
    actions_valid: bool  # every action was accepted by the env
    reward: float  # env rewards of this turn's actions plus any format penalty
    observation: str  # the state text shown in this turn's prompt
    dropped_turns: int = 0  # earlier turns rollout.max_model_len left out of prompt_ids
    # Behaviour log-probs of response_ids under the sampling distribution, when the backend gives them: what
    # off-policy correction compares the trained policy with (ragen2.rl.losses.rollout_correction).
    logprobs: list[float] | None = None
    # The weights' version that generated it (ragen2.rl.rollout_stage.rollout_phase): with partial rollouts
    # (async.partial_rollouts) later turns of an episode may come from newer weights than its first.
    policy_version: int = 0
    # Agent loops: which of the agent's parts made this call (ragen2.serve.endpoint); agent.train_roles trains
    # some roles only. None in ragen2's own rollout loop.
    role: str | None = None
    # A memory turn (rollout.memory=summary): the policy wrote a note instead of acting. `reasoning` and
    # `reasoning_span` then hold the note, what collapse_memory/ scores; actions are [] and nothing was played.
    memory: bool = False


@dataclass
class Trajectory:
    """One episode of one environment instance, and the token sequence it trains on."""

    env_name: str
    seed: int
    group_id: int  # trajectories with the same group_id share the env seed (GRPO groups)
    turns: list[Turn] = field(default_factory=list)
    # Training samples: one per trajectory in full-history mode, one per turn otherwise.
    # Each is (input_ids, loss_mask) with loss_mask 1 on model tokens, 0 on prompt/env tokens.
    samples: list[tuple[list[int], list[int]]] = field(default_factory=list)
    episode_return: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None  # set when the env raised; the episode ended there
    # filter.level=anchor: which turns the update trains on (set on the filter's copies); None trains every turn
    trained_turns: list[bool] | None = None
    # Updates the policy had taken when it sampled this episode (the run's step count then; with partial
    # rollouts, when it sampled its first turn, the oldest): with asynchronous training the update at step s
    # trains on it with staleness s - 1 - policy_version.
    policy_version: int = 0
    tag: str = ""  # the mixture entry it was played for (ragen2.mixture); the env name outside a mixture
