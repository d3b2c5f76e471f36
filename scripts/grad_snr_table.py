"""Task vs KL vs entropy gradient norms per reward-variance bucket on the tiny Sokoban setup.

RAGEN-2 (§5, Fig. 3): bucket a batch's prompts into RV quantiles; the task-gradient norm
should rise with RV while the KL and entropy gradient norms stay flat. This script measures
it with `ragen2.rl.grad_snr.grad_snr_probe`, the way the trainer does:

1. Train `--train-steps` GRPO steps with the trainer (algo.kl_coef > 0, so it keeps the
   initial policy as the frozen KL reference). The policy has to move away from its
   reference first: at the reference's own weights the k3 KL is flat, value and gradient
   exactly 0, which is why the trainer never probes step 1.
2. Resume that run, sample one fresh batch of `--groups` x `--group-size` episodes with the
   trainer's rollout phase, and probe it with the advantages of each of `--estimators`
   (the trainer's advantage phase on every group: no filtering, the low-RV groups are the
   point). The KL and entropy terms do not involve advantages and are measured once; the
   loss aggregation is the preset's for every estimator, so only the advantages differ.
   The comparison matters: the RV bound holds for A = R - mean(R) (Dr.GRPO, RLOO up to a
   factor G/(G-1)), while GRPO divides by the group's std, which rescales every group with
   any variance to unit-size advantages.
3. Print a markdown table; `--update-docs PATH` also writes it between the
   `<!-- grad-snr-table:begin -->` / `<!-- grad-snr-table:end -->` markers of PATH.

    python scripts/grad_snr_table.py [--model tiny] [--groups 24] [--group-size 8] [--train-steps 2] [overrides ...]
    python scripts/grad_snr_table.py --update-docs docs/filtering.md
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
import time
from pathlib import Path

from scipy.stats import spearmanr

from ragen2.rl.grad_snr import TERMS, grad_snr_probe, group_reward_variance
from ragen2.config import Config, load_config
from ragen2.rl import advantage_stage, rollout_stage, trainer, update_stage
from ragen2.rl.run import setup

BEGIN, END = "<!-- grad-snr-table:begin -->", "<!-- grad-snr-table:end -->"
ESTIMATORS = ("grpo", "drgrpo", "rloo")  # outcome advantages: no critic needed


def probe_after_training(args: argparse.Namespace, run_dir: Path) -> tuple[dict[str, dict[str, float]], Config]:
    """Steps 1 and 2 of the module docstring: {estimator: probe metrics}, and the probing config."""
    model = [] if args.model == "tiny" else [f"model.path={args.model}"]
    common = [*model, f"model.device={args.device}", f"trainer.run_dir={run_dir}", f"trainer.seed={args.seed}",
              f"trainer.total_steps={args.train_steps}", f"algo.kl_coef={args.kl_coef}", "collapse.enable=false",
              "trainer.eval_every=0", "logging.progress=false", "logging.tensorboard=false", *args.overrides]
    trainer.train(load_config(args.preset, [*common, f"rollout.num_groups={args.train_groups}"]))

    config = load_config(args.preset, [*common, f"rollout.num_groups={args.groups}",
                                       f"rollout.group_size={args.group_size}", f"grad_snr.num_buckets={args.buckets}"])
    a = config.algo
    run = setup(config, resume_dir=run_dir)
    results = {}
    with run.tracker:
        trajectories, _ = rollout_stage.rollout_phase(run, args.train_steps + 1)
        present = [t for t in trajectories if t.samples]
        group_rv = group_reward_variance(trajectories, config.filter.ddof)
        for i, estimator in enumerate(args.estimators):
            run.config = dataclasses.replace(config, algo=dataclasses.replace(a, name=estimator))
            batch = advantage_stage.advantage_phase(run, present)
            results[estimator] = grad_snr_probe(
                run.policy, batch, group_rv, reference=run.reference, kl_estimator=a.kl_estimator,
                num_buckets=config.grad_snr.num_buckets, micro_batch_size=a.micro_batch_size, agg=update_stage.loss_agg(config),
                kl_coef=a.kl_coef, entropy_coef=a.entropy_coef, terms=TERMS if i == 0 else ("task",),
            )
    return results, config


def markdown(results: dict[str, dict[str, float]], config: Config, args: argparse.Namespace, seconds: float) -> str:
    """The table and the plain facts it shows (rank correlations with RV, spread of each norm)."""
    first = results[args.estimators[0]]
    buckets = sorted({int(k.split("/")[1].removeprefix("bucket")) for k in first})

    def column(metrics: dict[str, float], part: str) -> list[float]:
        return [metrics[f"grad_snr/bucket{b}/{part}"] for b in buckets]

    rv = column(first, "rv_mean")
    norms = {f"‖g_task‖ {name}": column(m, "task_norm") for name, m in results.items()}
    norms |= {"‖g_KL‖": column(first, "kl_norm"), "‖g_entropy‖": column(first, "entropy_norm")}
    a = config.algo
    scaled = {f"{a.kl_coef:g}·‖g_KL‖": column(first, "kl_norm_scaled"),
              f"{a.entropy_coef:g}·‖g_entropy‖": column(first, "entropy_norm_scaled")}
    overrides = f", overrides {' '.join(f'`{o}`' for o in args.overrides)}" if args.overrides else ""
    lines = [
        f"Policy `{Path(args.model).name}`, {config.env.name}, after {args.train_steps} GRPO step(s) (P = "
        f"{args.train_groups}, lr {config.optim.lr:g}; KL reference = the initial policy); probe batch P = "
        f"{args.groups} groups x G = {args.group_size}, aggregation `{update_stage.loss_agg(config)}`, KL estimator "
        f"`{a.kl_estimator}`, seed {args.seed}{overrides} ({seconds:.0f} s on the CPU it ran on).",
        "",
        "| RV bucket | mean RV | groups | " + " | ".join([*norms, *scaled]) + " |",
        "|---" * (3 + len(norms) + len(scaled)) + "|",
    ]
    for i, b in enumerate(buckets):
        cells = [f"{values[i]:.4g}" for values in norms.values()] + [f"{values[i]:.3g}" for values in scaled.values()]
        lines.append(f"| {b} | {rv[i]:.3g} | {column(first, 'num_groups')[i]:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, values in norms.items():
        spread = f" (max/min {max(values) / min(values):.3g})" if min(values) > 0 else ""
        varies = len(set(values)) > 1 and len(set(rv)) > 1
        rho = f"{spearmanr(rv, values).statistic:+.2f}" if varies else "undefined (a constant column)"
        lines.append(f"- {name}: {min(values):.4g} to {max(values):.4g} across buckets{spread}; Spearman "
                     f"correlation with the buckets' mean RV {rho}.")
    return "\n".join(lines)


def write_into(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write the table between")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="Model directory or 'tiny' (the cached warm-started policy).")
    p.add_argument("--device", default="auto")
    p.add_argument("--preset", default="sokoban-grpo", help="Preset of the training run (and the probe's aggregation).")
    p.add_argument("--estimators", nargs="+", default=["grpo", "drgrpo"], choices=ESTIMATORS,
                   help="Advantage estimators to probe the batch with (KL and entropy are measured once).")
    p.add_argument("--groups", type=int, default=24, help="P of the probed batch.")
    p.add_argument("--group-size", type=int, default=8, help="G of the probed batch.")
    p.add_argument("--buckets", type=int, default=6, help="RV quantile buckets (the paper: 6).")
    p.add_argument("--train-steps", type=int, default=2, help="Trainer steps before probing (>= 1, see above).")
    p.add_argument("--train-groups", type=int, default=8, help="P of the training steps.")
    p.add_argument("--kl-coef", type=float, default=0.001, help="algo.kl_coef of the run (only > 0 matters here).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--update-docs", default=None, metavar="PATH", help="Also write the table into PATH.")
    p.add_argument("overrides", nargs="*", help="Config overrides for training and probing, e.g. rollout.max_turns=3.")
    args = p.parse_args()
    if args.train_steps < 1 or args.kl_coef <= 0:
        p.error("--train-steps must be >= 1 and --kl-coef > 0, or the KL gradient is exactly 0 (see --help)")
    logging.basicConfig(level=logging.WARNING)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grad_snr_table-") as tmp:
        results, config = probe_after_training(args, Path(tmp) / "run")
    text = markdown(results, config, args, time.perf_counter() - start)
    print(text)
    if args.update_docs:
        write_into(Path(args.update_docs), text)


if __name__ == "__main__":
    main()
