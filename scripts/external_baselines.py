"""The random-agent and solver baselines of docs/environments.md's table of other suites' games.

For each game: the uniform-random agent's held-out success (ragen2.evaluate.random_agent, the row
`ragen2 eval` prints) and the success of the game's solver or walkthrough, where it has one, on
the same held-out seeds.

    python scripts/external_baselines.py textarena 20
    python scripts/external_baselines.py gym 200
    python scripts/external_baselines.py textworld 4
"""

from __future__ import annotations

import argparse
import json
import time

from ragen2 import envs
from ragen2.agent.rollout import RolloutConfig
from ragen2.evaluate import random_agent

GAMES: dict[str, list[tuple[str, dict]]] = {
    "textarena": [(f"textarena:{game}", {}) for game in (
        "Sudoku-v0-very-easy", "Sudoku-v0-easy", "TowerOfHanoi-v0", "GuessTheNumber-v0", "FifteenPuzzle-v0",
        "LightsOut-v0", "Mastermind-v0", "FrozenLake-v0", "Sokoban-v0", "Blackjack-v0", "Bandit-v0",
        "Secretary-v0", "Minesweeper-v0-small", "PegJump-v0", "RushHour-v0", "TicTacToe-v0", "ConnectFour-v0")],
    "gym": [(f"gym:{game}", {}) for game in ("Blackjack-v1", "FrozenLake-v1", "CliffWalking-v1", "Taxi-v4")],
    "textworld": [("textworld:coin_collector", {"level": 5}), ("textworld:treasure_hunter", {"level": 1}),
                  ("textworld:cooking", {"recipe": 1, "take": 1})],
}


def solver_success(name: str, kwargs: dict, episodes: int) -> float | None:
    """Success rate of the env's `solve()` plan over the held-out seeds; None when it has no solver."""
    wins, solved_any = 0, False
    for seed in envs.eval_seeds(episodes):
        env = envs.make(name, **kwargs)
        env.reset(seed=seed)
        plan = env.solve()
        if plan is None:
            continue
        solved_any = True
        info: dict = {"success": False}
        for action in plan:
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        wins += bool(info.get("success"))
    return wins / episodes if solved_any else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=sorted(GAMES))
    p.add_argument("episodes", type=int, help="Held-out seeds per game.")
    args = p.parse_args()
    for name, kwargs in GAMES[args.suite]:
        start = time.time()
        random = random_agent(name, kwargs, args.episodes, RolloutConfig())
        print(json.dumps({
            "env": name, "kwargs": kwargs, "episodes": args.episodes,
            "random_success": round(random["eval/success_rate"], 3), "random_return": round(random["eval/return_mean"], 3),
            "solver_success": solver_success(name, kwargs, args.episodes), "seconds": round(time.time() - start, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
