"""Warm start from a pretrained base: the demonstrations in the base's own template, loss on its tokens only,
a plain loadable directory, and before / after / random numbers per environment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from chat_templates import QWEN25_TOOLS
from ragen2 import envs
from ragen2 import evaluate as evaluation
from ragen2.agent.tool_calls import parse_tool_turn
from ragen2.agent.parsing import ResponseFormat
from ragen2.cli import main
from ragen2.errors import ConfigError
from ragen2.models import base_warmstart as bws
from ragen2.models import warmstart as ws
from ragen2.models.demos import play_demo
from ragen2.models.loading import check_model_dir, load_policy
from ragen2.models.tiny import TOOLS_CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("one_thread")

# A few SFT steps on a handful of Bandit demonstrations, two evaluation episodes.
FAST = ["--envs", "bandit", "episodes_per_env=8", "steps=3", "warmup_steps=1", "lr=1e-2"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, save_random_policy):
    path = tmp_path_factory.mktemp("base") / "model"
    save_random_policy(path)
    return path


@pytest.mark.parametrize("lora_rank", [4, 0])
def test_base_warm_start_saves_a_plain_model_directory_and_before_after_numbers(base, tmp_path, lora_rank, capsys):
    out = tmp_path / "warm"
    episodes = 2 if lora_rank else 0  # generation is most of the time: one case evaluates
    assert main(["warmstart", "--base", str(base), "--out", str(out), "--lora-rank", str(lora_rank),
                 *FAST, "--eval-episodes", str(episodes)]) == 0
    assert "ready: " in capsys.readouterr().out
    check_model_dir(out, "the warm start")
    assert not (out / "adapter_config.json").exists()  # LoRA is merged: loads without peft
    model, tokenizer = load_policy(str(out), device="cpu")
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(base).chat_template
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and (lora_rank == 0 or all("proj" in k for k in changed))  # LoRA touches the linear layers only
    info = json.loads((out / ws.INFO_FILE).read_text())
    assert info["settings"]["lora_rank"] == lora_rank and info["settings"]["demos"]["steps"] == 3
    assert np.isfinite(info["sft_loss_final"])
    rows = info["eval"]["bandit"]
    assert set(rows) == {"before", "after", "random"}
    if not episodes:
        return
    for m in rows.values():
        assert m["episodes"] == 2 and 0 <= m["success_rate"] <= 1 and 0 <= m["valid_format_rate"] <= 1
        assert {"success_stderr", "valid_format_stderr", "turns"} <= set(m)
    assert rows["random"]["valid_format_rate"] == 1.0


def test_a_finished_warm_start_is_reused_and_architecture_settings_are_refused(base, tmp_path, monkeypatch):
    settings = dict(envs=("bandit",), episodes_per_env=2, steps=1, warmup_steps=1, eval_episodes=0)
    out = bws.warmstart_base(str(base), tmp_path / "warm", lora_rank=2, **settings)
    assert json.loads((out / ws.INFO_FILE).read_text())["eval"]["bandit"] == {"before": {"episodes": 0},
                                                                            "after": {"episodes": 0},
                                                                            "random": {"episodes": 0}}

    def fail(*args, **kwargs):
        raise AssertionError("rebuilt although the directory holds this warm start")

    monkeypatch.setattr(bws, "_build_base", fail)
    assert bws.warmstart_base(str(base), out, lora_rank=2, **settings) == out
    with pytest.raises(ConfigError, match="does not hold a warm start with these settings"):
        bws.warmstart_base(str(base), out, lora_rank=4, **settings)
    with pytest.raises(ConfigError, match="hidden_size .*architecture"):
        bws.make_base_config(str(base), hidden_size=64)
    cached = bws.base_cache_path(bws.make_base_config("smollm2-135m"), tmp_path)
    assert cached.parent == tmp_path and cached.name.startswith("warmstart-smollm2-135m-")


def test_demonstrations_are_rendered_by_the_base_template_and_only_its_tokens_are_scored(base):
    """The mask covers exactly the demonstrated responses (and the EOS that ends each), the rest decodes to the
    base's chat template; and the SFT loss is the cross-entropy of those tokens alone (a hand-made case)."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    episode = play_demo("frozenlake", {}, 3, max_turns=5, max_actions_per_turn=2, rng=np.random.default_rng(0))
    conv = episode.conversation(tokenizer)
    [(ids, mask)] = conv.samples()
    scored = [t for t, m in zip(ids, mask) if m]
    expected = [t for turn in episode.turns for t in tokenizer.encode(turn.response) + [tokenizer.eos_token_id]]
    assert scored == expected
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.apply_chat_template(conv.messages(), tokenize=False)

    model = AutoModelForCausalLM.from_pretrained(base)
    seq, seq_mask = [5, 9, 14, 3, 22, 7, 11], [0, 0, 0, 1, 1, 0, 0]  # two scored tokens: 3 (after 14) and 22
    loss = ws.mixed_loss(model, [[(seq, seq_mask)]], tokenizer.pad_token_id)
    with torch.no_grad():
        log_probs = F.log_softmax(model(torch.tensor([seq])).logits[0], dim=-1)
    assert torch.allclose(loss, -(log_probs[2, 3] + log_probs[3, 22]) / 2, atol=1e-5)


def test_a_base_warm_starts_on_tool_calls_in_a_template_that_shows_the_tools(base, tmp_path, monkeypatch):
    """`--envs searchqa+tools` with --base: the base's template ignores tools= (plain ChatML, as SmolLM2's), so the
    saved tokenizer gets the tools-aware ChatML template; the demonstrations are trained in that layout (schemas in
    the system prompt, the calls trained, the results masked); the held-out evaluation runs tool calls."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert bws.ensure_tools_template(tokenizer, "base") == "tools ChatML"
    assert tokenizer.chat_template == TOOLS_CHAT_TEMPLATE
    episode = play_demo("searchqa", {}, 3, max_turns=5, max_actions_per_turn=1, rng=np.random.default_rng(0),
                        tool_calls=True)
    conv = episode.conversation(tokenizer)
    [(ids, mask)] = conv.samples()
    rendered = tokenizer.apply_chat_template(conv.messages(), tools=episode.tools, tokenize=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered
    assert '"name": "finish"' in rendered and rendered.count("<tool_response>") == len(episode.turns) - 1
    eos = [tokenizer.eos_token_id]
    scored = [t for t, m in zip(ids, mask) if m]
    assert scored == [t for turn in episode.turns for t in tokenizer.encode(turn.response, add_special_tokens=False)
                      + eos]
    to_action = envs.make("searchqa").tool_action
    assert all(parse_tool_turn(turn.response, ResponseFormat(), 1, to_action).valid for turn in episode.turns)

    evaluated = []

    def spy(model, tokenizer, env_name, env_kwargs, cfg, episodes, batch_size=None):
        evaluated.append((env_name, cfg.tool_calls, tokenizer.chat_template))
        return real(model, tokenizer, env_name, env_kwargs, cfg, episodes, batch_size)

    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", spy)
    out = tmp_path / "warm"
    assert main(["warmstart", "--base", str(base), "--out", str(out), "--lora-rank", "4", "--envs", "bandit,searchqa+tools",
                 "episodes_per_env=3", "steps=2", "warmup_steps=1", "--eval-episodes", "1"]) == 0
    info = json.loads((out / ws.INFO_FILE).read_text())
    assert info["chat_template"] == "tools ChatML" and np.isfinite(info["sft_loss_final"])
    assert AutoTokenizer.from_pretrained(out).chat_template == TOOLS_CHAT_TEMPLATE
    assert sorted(set(evaluated)) == [("bandit", False, TOOLS_CHAT_TEMPLATE), ("searchqa", True, TOOLS_CHAT_TEMPLATE)]
    assert set(info["eval"]["searchqa+tools"]) == {"before", "after", "random"}
    assert info["eval"]["searchqa+tools"]["random"]["valid_format_rate"] == 1.0


def test_a_template_that_renders_tools_is_kept_and_a_non_chatml_one_that_ignores_them_is_refused(base):
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = QWEN25_TOOLS
    assert bws.ensure_tools_template(tokenizer, "qwen-like") == "own" and tokenizer.chat_template == QWEN25_TOOLS
    words = Tokenizer(WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))  # a Llama-2-like base
    template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    plain = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    chat_template=template)
    with pytest.raises(ConfigError, match="ignores tools=, and it is not a ChatML model"):
        bws.ensure_tools_template(plain, "llama-like")
