"""An agent behind the endpoint that drops its own history for a note it wrote (memory_agent.py) trains on exactly
the contexts it was served: each call's completion is trained right after the prompt it was sampled from, and
nothing else is trained."""

from __future__ import annotations

from pathlib import Path

from ragen2.config import load_config
from ragen2.rl.advantage_stage import advantage_phase
from ragen2.rl.rollout_stage import rollout_phase
from ragen2.rl.run import setup

AGENT = Path(__file__).parent / "memory_agent.py"


def test_an_agent_that_compresses_its_history_trains_on_the_served_contexts(tool_policy, tmp_path, one_thread):
    config = load_config("agent", [
        f"agent.entrypoint={AGENT}:play", f"model.path={tool_policy}", "model.device=cpu", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_turns=6", "rollout.max_tokens_per_turn=48", "trainer.eval_every=0",
        f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false", "logging.progress=false",
        "algo.mini_batch_size=4", "algo.micro_batch_size=4", "collapse.num_samples=8",
    ])
    run = setup(config)
    try:
        trajectories, metrics = rollout_phase(run, 1)
        batch = advantage_phase(run, [t for t in trajectories if t.samples])
    finally:
        run.agent.close()
        run.lock.release()
    for t in trajectories:
        roles = [turn.role for turn in t.turns]
        note = roles.index("memory")
        assert note >= 1 and "solver" in roles[note + 1:]  # worked, wrote a note, went on from it
        after = t.turns[note + 1]
        sequence = t.turns[note].prompt_ids + t.turns[note].response_ids
        assert after.prompt_ids[: len(sequence)] != sequence  # the history was dropped: a new context
        # Every completion is trained once, right after exactly the prompt it was served with.
        trained = [i for ids, mask in t.samples for i, m in zip(ids, mask) if m]
        assert trained == [i for turn in t.turns for i in turn.response_ids]
        for turn in t.turns:
            n, r = len(turn.prompt_ids), len(turn.response_ids)
            homes = [ids for ids, mask in t.samples
                     if ids[:n] == turn.prompt_ids and ids[n : n + r] == turn.response_ids and mask[n : n + r] == [1] * r]
            assert len(homes) == 1
        home = next(ids for ids, _ in t.samples if ids[: len(after.prompt_ids)] == after.prompt_ids)
        assert home[: len(t.turns[0].prompt_ids)] != t.turns[0].prompt_ids  # a sequence of the new context alone
    assert int(batch.mask.sum()) == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    assert metrics["rollout/memory/calls_mean"] == 1.0
