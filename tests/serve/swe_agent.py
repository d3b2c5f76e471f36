"""mini-swe-agent on the shipped task (ragen2/coding/tasks/mean) with short prompts, as an `agent.entrypoint` for
tests/serve/test_mini_swe_agent.py: the tiny test policy's context is short. Each episode's record (its commands
as the sandbox ran them, the host's test run) is appended to the JSON-lines file $SWE_LOG."""

import json
import os

from ragen2.coding import RepoTask
from ragen2.coding.mini_swe_agent import run_episode

TASK = RepoTask.load("mean")
CONFIG = {
    "agent": {
        "system_template": "You fix bugs with shell commands. Reply with THOUGHT: and one command in a "
                           "```mswea_bash_command block.",
        "instance_template": "{{task}}",
    },
    "model": {"observation_template": "<returncode>{{output.returncode}}</returncode>\n<output>\n"
                                      "{{output.output}}</output>"},
}
STEP_LIMIT = 3


def play(client, seed: int) -> float:
    result = run_episode(client, TASK, config=CONFIG, step_limit=STEP_LIMIT)
    if os.environ.get("SWE_LOG"):
        with open(os.environ["SWE_LOG"], "a") as f:
            f.write(json.dumps({"seed": seed, "base_url": str(client.base_url), **result.to_dict()}) + "\n")
    return result.reward
