"""The ``rlpar`` command line (also ``python -m rlpar``).

Each subcommand is two plain functions: ``_add_<name>`` declares its options and points
``run`` at ``_run_<name>``, which does the work and returns the exit status. `build_parser`
lists every subcommand in one place; the benchmarks come from `rlpar.bench.catalogue`::

    rlpar train CONFIG.toml [--set K=V ...]   train an experiment; TensorBoard, checkpoints
            [--seeds 0-4 [--parallel N | --ray ADDR]]  one run per seed, aggregate.md
    rlpar eval RUN_DIR|FILE.rlpar [--episodes N] [--video OUT]
                                              play episodes with a checkpoint's policy
    rlpar agents [CONFIG.toml] [--json]       registered agents and their config keys
    rlpar plot GROUP [GROUP ...] [--out PNG]  learning curves of runs, a band over seeds
    rlpar sweep CONFIG.toml --space SPACE.toml  a hyper-parameter search on Ray Tune
    rlpar bench net [--json] [--quick]        native net vs numpy and torch, threads, train step
    rlpar bench snapshot [--json] [--quick]   snapshot store: pin/unpin, publish vs memcpy
    rlpar bench gil [--json] [--quick]        from which batch releasing the GIL pays off
    rlpar bench runtime [--json] [--quick]    env steps/s of the runtime, 1 and 2 actors
    rlpar bench envs [--json] [--quick]       native envs vs gymnasium (and EnvPool), actor loops
    rlpar bench ray [--json] [--quick]        threads vs Ray backend, same actors (needs rlpar[ray])
    rlpar bench scaling [--threads 1,2,4,8,16] [--json] [--quick]
                                              throughput at 1..N threads: net, snapshot, actors
    rlpar bench soak [--seconds S] [--json]   memory of a long rlpar train, growth per 1M steps
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rlpar.bench.catalogue import BENCHES, Bench
from rlpar.bench.catalogue import load as load_bench

if TYPE_CHECKING:
    from rlpar.app.summary import TrainingSummary

__all__ = ["build_parser", "main"]

_JSON_HELP = "print one JSON object on the last line of stdout"


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2): return the status, don't exit
        return e.code if isinstance(e.code, int) else 1
    return args.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlpar",
        description="Actor-learner reinforcement learning on one shared, GIL-free native net.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )
    _add_train(commands)
    _add_eval(commands)
    _add_agents(commands)
    _add_plot(commands)
    _add_sweep(commands)
    _add_bench(commands)
    return parser


# ------------------------------------------------------------------------------------- bench


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench_parser = commands.add_parser(
        "bench",
        help="measure speed (" + ", ".join(b.name for b in BENCHES) + ")",
        description="Benchmarks. Compared configurations run side by side, alternating; "
        "figures are medians of repeats.",
    )
    benches = bench_parser.add_subparsers(
        dest="bench", required=True, metavar="BENCH", title="benchmarks"
    )
    for bench in BENCHES:
        p = benches.add_parser(bench.name, help=bench.help, description=bench.description)
        if bench.threads:
            p.add_argument(
                "--threads",
                default="1,2,4,8,16",
                metavar="N,N,..",
                help="thread counts to measure (default 1,2,4,8,16)",
            )
        if bench.seconds is not None:
            p.add_argument(
                "--seconds",
                type=float,
                default=bench.seconds,
                metavar="S",
                help=f"wall time of each measured run (default {bench.seconds:g})",
            )
        p.add_argument("--json", action="store_true", help=_JSON_HELP)
        p.add_argument(
            "--quick",
            action="store_true",
            help="tiny repeat counts: checks that it runs, not speed",
        )
        p.set_defaults(run=_run_bench, bench_entry=bench)


def _run_bench(args: argparse.Namespace) -> int:
    bench: Bench = args.bench_entry
    measure = load_bench(bench.measure)
    if bench.threads:
        parse_threads = load_bench(f"{bench.measure.partition(':')[0]}:parse_threads")
        try:
            threads = parse_threads(args.threads)
        except ValueError as exc:
            print(f"rlpar bench {bench.name}: --threads: {exc}", file=sys.stderr)
            return 2
        result = measure(threads, quick=args.quick)
    elif bench.seconds is not None:
        if not args.seconds > 0:
            print(
                f"rlpar bench {bench.name}: --seconds: expected a number > 0, got {args.seconds}",
                file=sys.stderr,
            )
            return 2
        result = measure(seconds=args.seconds, quick=args.quick)
    else:
        result = measure(quick=args.quick)
    if args.json:
        print(json.dumps(result))
    elif bench.table is None:
        print(json.dumps(result, indent=2))
    else:
        print(load_bench(bench.table)(result))
    return 0


# ------------------------------------------------------------------------- train, eval, agents

_OK_STOPS = {"total_env_steps", "target_return", "max_wall_s", "stop"}
_SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


def _add_train(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "train",
        help="train an experiment (TOML file): TensorBoard logs, checkpoints, summary",
        description="Train the experiment in CONFIG.toml. The run gets its own directory "
        "<logdir>/<name>/<timestamp>/ holding the resolved config (config.toml), TensorBoard "
        "event files (watch with `tensorboard --logdir runs`), checkpoints/ and summary.json. "
        "Progress goes to stderr: a live bar on a terminal, a log line every few seconds "
        "otherwise. Exit status: 0 when the run ends by its step budget, target return or "
        "wall-clock limit; 1 when it fails; 2 for a bad command line or config; 130/143 when "
        "stopped by SIGINT/SIGTERM (after a final checkpoint).",
        epilog="example: rlpar train experiments/cartpole_impala.toml "
        "--set runtime.total_env_steps=200000 --set agent.optim.lr=0.001",
    )
    p.add_argument("config", metavar="CONFIG.toml", help="the experiment file")
    _set_option(p)
    p.add_argument(
        "--logdir",
        metavar="DIR",
        help="put the run directory under DIR instead of log.logdir (default: runs)",
    )
    p.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue from this checkpoint (parameters, optimizer, counters, RNG states; "
        "the env and agent come from CONFIG.toml, never from the checkpoint)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary (summary.json) as one JSON object on the last line of stdout",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="make the run directory exactly DIR (it must not exist) instead of "
        "<logdir>/<name>/<timestamp>/",
    )
    _add_seeds_options(p.add_argument_group("several seeds"))
    p.set_defaults(run=_run_train)


def _add_seeds_options(p: argparse._ArgumentGroup) -> None:
    """rlpar train's --seeds and the options that go with it."""
    p.add_argument(
        "--seeds",
        metavar="SEEDS",
        help="train once per seed (runtime.seed), e.g. 0-4 or 0,3,7: each seed's run directory "
        "under one parent <logdir>/<name>/seeds-<timestamp>/, which gets aggregate.json and "
        "aggregate.md (per-seed rows; mean, interquartile mean and 95%% bootstrap CI of the "
        "evaluated return and the time to target). A seed that crashes is reported as crashed",
    )
    p.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="with --seeds: how many seeds train at a time (default 1, each in its own "
        "process; with --ray: as many as the cluster's CPUs take)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="with --seeds: train each seed as a Ray task, on a Ray started on this machine "
        '(no ADDRESS) or on the cluster at ADDRESS ("auto" or host:port). Needs '
        'pip install "rlpar[ray]"',
    )
    p.add_argument(
        "--cpus-per-seed",
        type=float,
        metavar="C",
        help="with --ray: the CPUs each seed's task asks Ray for (default 1)",
    )


def _set_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. runtime.seed=3, agent.optim.lr=1e-3, "
        "agent.net.hidden=[32,32], runtime.max_policy_lag=none. VALUE is read as a TOML value "
        "(else as a string) and checked like the file's",
    )


def _run_train(args: argparse.Namespace) -> int:
    import dataclasses

    from rlpar.app.experiment import load_experiment
    from rlpar.app.train import Training
    from rlpar.checkpoint import CheckpointError
    from rlpar.config import ConfigError

    _setup_logging(args.quiet)
    if args.seeds is not None:
        return _run_seeds(args)
    for given, option in [(args.parallel is not None, "--parallel"), (args.ray, "--ray")]:
        if given:
            return _error("train", f"{option}: expected --seeds with it", 2)
    try:
        exp = load_experiment(args.config, args.overrides)
        if args.logdir is not None:
            exp = dataclasses.replace(exp, log=dataclasses.replace(exp.log, logdir=args.logdir))
        training = Training(exp, resume=args.resume, run_dir=args.run_dir)
    except FileExistsError as e:
        return _error("train", f"--run-dir: expected a directory that does not exist: {e}", 2)
    except CheckpointError as e:
        return _error("train", e, 1)
    except (ConfigError, ValueError) as e:
        return _error("train", e, 2)
    except OSError as e:
        return _error("train", e, 1)
    try:
        summary = training.run(quiet=args.quiet)
    except Exception:
        logging.getLogger("rlpar").exception("rlpar train: the run failed")
        return 1
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(_train_text(summary))
    stopped_by = summary.result.stopped_by
    return 0 if stopped_by in _OK_STOPS else _SIGNAL_EXIT.get(stopped_by, 1)


def _run_seeds(args: argparse.Namespace) -> int:
    from rlpar.app.seeds import parse_seeds, run_seeds
    from rlpar.config import ConfigError

    if args.resume is not None or args.run_dir is not None:
        return _error("train", "--seeds: expected neither --resume nor --run-dir with it", 2)
    log = logging.getLogger("rlpar")
    try:
        seeds = parse_seeds(args.seeds)
        parent, rows, agg = run_seeds(
            args.config,
            args.overrides,
            seeds,
            parallel=args.parallel,
            logdir=args.logdir,
            ray_address=args.ray,
            cpus_per_seed=args.cpus_per_seed,
            on_done=lambda row: log.info("seed %s: %s", row["seed"], _seed_outcome(row)),
        )
    except ConnectionError as e:  # no Ray cluster answers at --ray ADDRESS
        return _error("train", e, 1)
    except (ConfigError, ValueError, OSError) as e:
        return _error("train", e, 2)
    if args.json:
        print(json.dumps({"parent": str(parent.resolve()), "rows": rows, **agg}))
    else:
        print((parent / "aggregate.md").read_text(), end="")
        print(f"runs and aggregate.json: {parent}")
    return 0 if not agg["crashed"] else 1


def _seed_outcome(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error', '')}"
    return f"evaluated return {row['eval_return']}, {row['wall_s']:.1f} s"


def _train_text(summary: TrainingSummary) -> str:
    r = summary.result
    ret = "no episode finished" if r.mean_return is None else f"mean return {r.mean_return:.1f}"
    target = ""
    if r.time_to_target_s is not None:
        target = f"; target {summary.target_return} reached after {r.time_to_target_s:.1f} s"
    lines = [
        f"{ret} after {r.env_steps:,} env steps, {r.learner_steps:,} learner steps, "
        f"{r.episodes:,} episodes in {r.wall_s:.1f} s (stopped by {r.stopped_by}){target}",
        f"run directory: {summary.run_dir}",
    ]
    for e in summary.evaluation:
        lines.append(
            f"evaluated:     {e['policy']} mean return {e['mean_return']:.2f} ± "
            f"{e['std_return']:.2f} over {e['episodes']} episodes"
            + (f" ({e['truncated']} cut at the step cap)" if e.get("truncated") else "")
        )
    if r.checkpoint:
        lines.append(f"checkpoint:    {r.checkpoint}")
    gil = r.gil
    if "actors" in gil:
        a, learner, ceiling = gil["actors"], gil["learner"], gil.get("actor_ceiling")
        room = "no GIL limit" if ceiling is None else f"the GIL serves ~{ceiling:.1f} actors"
        lines.append(
            f"GIL:           actors held {a['held']:.0%}, waited {a['wait']:.0%} to re-take it, "
            f"{a['native']:.0%} native; learner held {learner['held']:.0%} ({room})"
        )
    plan = r.plan
    if plan:
        actor, learner = plan["actor"]["loop"], plan["learner"]["loop"]
        lines.append(f"plan:          actors {actor}, learner {learner}")
    return "\n".join(lines)


def _add_eval(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "eval",
        help="play episodes with a checkpoint's policy; print mean ± std of the return",
        description="Rebuild the env, agent and net from the config inside CHECKPOINT, load "
        "its parameters and play N whole episodes; print the mean ± std of the return. "
        "CHECKPOINT is a .rlpar file, or a run directory (its newest checkpoint). A missing, "
        "damaged or mismatched checkpoint is an error (exit status 1). A checkpoint is data: "
        "an env.setup hook it names (a module to import) runs only if you allow it with "
        "--set env.setup=... or --trust-checkpoint-setup; for a run directory, the hook in "
        "its config.toml (your run's experiment file) is used. Likewise a plug-in agent's "
        "modules: --set 'plugins=[\"my_agent\"]' imports my_agent.py from the working "
        "directory (or --set plugin_path=[...]), a run directory's config.toml names them.",
        epilog="example: rlpar eval runs/cartpole_impala/<timestamp>/checkpoints/"
        "ckpt-000000001234.rlpar --episodes 20",
    )
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a .rlpar checkpoint file or a run directory"
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        metavar="N",
        help="episodes to play (default: 10; with --video, 1)",
    )
    p.add_argument(
        "--video",
        metavar="OUT",
        help="record the episodes played into OUT (.gif or .mp4; needs rlpar[video]) from the "
        'env rendered with render_mode="rgb_array", instead of printing statistics',
    )
    p.add_argument("--fps", type=int, default=30, help="frames per second of --video")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--greedy",
        dest="greedy",
        action="store_true",
        default=True,
        help="the policy's most likely action (default; agents without one sample, with a warning)",
    )
    mode.add_argument(
        "--sample", dest="greedy", action="store_false", help="sample actions from the policy"
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the envs and the sampler")
    _set_option(p)
    p.add_argument(
        "--trust-checkpoint-setup",
        action="store_true",
        help="run the env.setup hook named inside the checkpoint (it imports a module and may "
        "call a function in it; what it runs is printed first). Without this, a hook comes "
        "only from you: --set env.setup=... or a run directory's config.toml",
    )
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(run=_run_eval)


def _run_eval(args: argparse.Namespace) -> int:
    from rlpar.app.evaluate import evaluate

    _setup_logging(quiet=False)
    if args.episodes is None:
        args.episodes = 1 if args.video else 10
    if args.episodes < 1:
        return _error("eval", f"--episodes: expected an integer >= 1, got {args.episodes}", 2)
    if args.video is not None:
        return _run_video(args)
    try:
        result = evaluate(
            args.checkpoint,
            args.episodes,
            args.greedy,
            args.overrides,
            seed=args.seed,
            trust_setup=args.trust_checkpoint_setup,
        )
    except (ValueError, OSError) as e:
        return _error("eval", e, 1)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(
            f"mean return {result.mean_return:.2f} ± {result.std_return:.2f} over "
            f"{result.episodes} episodes (min {result.min_return:g}, max {result.max_return:g}, "
            f"mean length {result.mean_length:.1f}"
            + (f", {result.truncated} cut at the step cap" if result.truncated else "")
            + f"); {result.policy} policy of {result.agent} "
            f"on {result.env}, trained for {result.trained_env_steps:,} env steps"
        )
    return 0


def _add_plot(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "plot",
        help="learning curves from runs' TensorBoard files: mean and band over seeds",
        description="One panel per GROUP: a run directory (one curve) or a folder of run "
        "directories (rlpar train --seeds' parent, or <logdir>/<name>/): the mean over its "
        "seeds with a min-max band, over the x range every seed reached. Needs matplotlib "
        '(pip install "rlpar[plot]").',
    )
    p.add_argument("groups", nargs="+", metavar="GROUP", help="a run directory or a folder of them")
    p.add_argument(
        "--tag", default="eval/return_mean", help="the scalar (default eval/return_mean)"
    )
    p.add_argument("--out", default="curves.png", help="the image to write (default curves.png)")
    p.add_argument(
        "--x", choices=("steps", "seconds"), default="steps", help="x axis: env steps or wall s"
    )
    p.add_argument("--ref", nargs="+", metavar="Y", help="a reference line per group ('none')")
    p.add_argument("--ref-label", default="reference", help="legend of the --ref lines")
    p.set_defaults(run=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from rlpar.app.plot import plot_groups

    try:
        out = plot_groups(args.groups, args.out, args.tag, args.x, args.ref, args.ref_label)
    except (ValueError, OSError) as e:
        return _error("plot", e, 2)
    print(out)
    return 0


def _add_sweep(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "sweep",
        help="a hyper-parameter sweep on Ray Tune (grid / choice / ranges, ASHA early stopping)",
        description="Train CONFIG once per trial of the space in SPACE.toml (config keys as "
        "--set names them, each with grid, choice, uniform, loguniform or randint), each trial a "
        "run directory under <logdir>/<name>/sweep-<timestamp>/, on Ray Tune (a local Ray on "
        "127.0.0.1, or --address). ASHA stops trials whose evaluated return (eval.interval_env_"
        "steps) trails at a rung. Writes results.json, results.md (trials ranked by evaluated "
        'return) and best.toml (CONFIG with the best values). Needs pip install "rlpar[sweep]".',
        epilog="example: rlpar sweep experiments/minatar_breakout_suite.toml "
        "--space experiments/sweeps/minatar_breakout.toml",
    )
    p.add_argument("config", metavar="CONFIG.toml", help="the experiment file")
    p.add_argument("--space", required=True, metavar="SPACE.toml", help="the space to sweep")
    _set_option(p)
    p.add_argument("--logdir", metavar="DIR", help="put the sweep under DIR instead of log.logdir")
    p.add_argument(
        "--address", metavar="HOST:PORT", help="a Ray cluster to run on (default: a local Ray)"
    )
    p.add_argument("--num-cpus", type=int, metavar="N", help="CPUs of the local Ray (default: all)")
    p.add_argument("--json", action="store_true", help="print results.json's trials as JSON")
    p.set_defaults(run=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    from rlpar.app.sweep import run_sweep
    from rlpar.config import ConfigError

    _setup_logging(quiet=False)
    if args.num_cpus is not None and args.num_cpus < 1:
        return _error("sweep", f"--num-cpus: expected an integer >= 1, got {args.num_cpus}", 2)
    try:
        root, rows = run_sweep(
            args.config, args.space, args.overrides, args.logdir, args.address, args.num_cpus
        )
    except ConfigError as e:
        return _error("sweep", e, 2)
    except (ValueError, OSError, ConnectionError) as e:
        return _error("sweep", e, 1)
    if args.json:
        print(json.dumps(rows))
    else:
        print((root / "results.md").read_text(encoding="utf-8"), end="")
        best = root / "best.toml"
        print(f"\n{root}: results.json, results.md" + (f", {best.name}" if best.exists() else ""))
    return 0


def _run_video(args: argparse.Namespace) -> int:
    from rlpar.app.video import record_video

    if args.fps < 1:
        return _error("eval", f"--fps: expected an integer >= 1, got {args.fps}", 2)
    try:
        v = record_video(
            args.checkpoint,
            args.video,
            args.episodes,
            args.greedy,
            args.overrides,
            seed=args.seed,
            trust_setup=args.trust_checkpoint_setup,
            fps=args.fps,
        )
    except (ValueError, OSError) as e:
        return _error("eval", e, 1)
    if args.json:
        print(json.dumps(dataclasses.asdict(v)))
    else:
        rets = ", ".join(f"{r:g}" for r in v.returns)
        print(f"{v.path}: {v.frames} frames, {v.episodes} {v.policy} episodes (returns {rets})")
    return 0


def _add_agents(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "agents",
        help="list the registered agents and their config keys",
        description="Every registered agent (built-in, entry point or register_agent) with "
        "where it comes from and each key of its [agent] table: type, default and meaning. "
        "Given an experiment file, the agents its plugins register too.",
    )
    p.add_argument(
        "config",
        nargs="?",
        metavar="CONFIG.toml",
        help="import this experiment file's plugins first (plugins = [...])",
    )
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(run=_run_agents)


def _run_agents(args: argparse.Namespace) -> int:
    from rlpar.app.experiment import import_plugins
    from rlpar.app.reference import agent_reference, format_agents
    from rlpar.config import ConfigError

    if args.config is not None:
        try:
            import_plugins(args.config)
        except ConfigError as e:
            return _error("agents", e, 2)
    agents = agent_reference()
    print(json.dumps(agents) if args.json else format_agents(agents))
    return 0


def _error(command: str, error: object, status: int) -> int:
    print(f"rlpar {command}: error: {error}", file=sys.stderr)
    return status


def _setup_logging(quiet: bool) -> None:
    """rlpar's messages to stderr (warnings and errors only when ``quiet``), and Python's
    warnings (gymnasium's env checker among them) as lines of the same log, without the
    terminal colour codes gymnasium wraps them in."""
    logger = logging.getLogger("rlpar")
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
    for handler in [h for h in logger.handlers if getattr(h, "_rlpar_cli", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler._rlpar_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    warnings.showwarning = _log_warning


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    text = _ANSI.sub("", str(message)).removeprefix("WARN: ")
    where = Path(filename)
    origin = f"{where.parent.name}/{where.name}:{lineno}"
    logging.getLogger("rlpar").warning("%s (%s, %s)", text, category.__name__, origin)
