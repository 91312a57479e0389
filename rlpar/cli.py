"""The ``rlpar`` command line (also ``python -m rlpar``).

Each subcommand is two plain functions: ``_add_<name>`` declares its options and points
``run`` at ``_run_<name>``, which does the work and returns the exit status. `build_parser`
lists every subcommand in one place::

    rlpar bench net [--json] [--quick]        native net vs numpy and torch, threads, train step
    rlpar bench snapshot [--json] [--quick]   snapshot store: pin/unpin, publish vs memcpy
    rlpar bench gil [--json] [--quick]        from which batch releasing the GIL pays off
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rlpar import bench

__all__ = ["build_parser", "main"]


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
    _add_bench(commands)
    return parser


# ------------------------------------------------------------------------------------- bench


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench_parser = commands.add_parser(
        "bench",
        help="measure speed (net, snapshot, gil)",
        description="Benchmarks. Compared configurations run side by side, alternating; "
        "figures are medians of repeats.",
    )
    benches = bench_parser.add_subparsers(
        dest="bench", required=True, metavar="BENCH", title="benchmarks"
    )
    _add_bench_net(benches)
    _add_bench_snapshot(benches)
    _add_bench_gil(benches)


def _bench_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on the last line of stdout"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny repeat counts: checks that it runs, not speed"
    )


def _add_bench_net(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser(
        "net",
        help="native net vs numpy and torch twins, thread scaling, training step",
        description="Forward latency of the native net against numpy and torch twins with the "
        "same weights (an MLP and a Nature-DQN conv net), forwards/s of 1 and 2 Python threads "
        "with the GIL released or held, and one RMSProp training step against torch. torch "
        "entries appear only when torch is installed. Takes about a minute.",
    )
    _bench_options(p)
    p.set_defaults(run=_run_bench_net)


def _run_bench_net(args: argparse.Namespace) -> int:
    return _report(bench.bench_net(quick=args.quick), bench.format_net, args.json)


def _add_bench_snapshot(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser(
        "snapshot",
        help="snapshot store: pin/unpin cost, publish vs memcpy",
        description="Pin + unpin while another thread publishes, and publish against a plain "
        "memcpy of the same size (timed natively), plus a pin + release from Python.",
    )
    _bench_options(p)
    p.set_defaults(run=_run_bench_snapshot)


def _run_bench_snapshot(args: argparse.Namespace) -> int:
    return _report(bench.bench_snapshot(quick=args.quick), bench.format_snapshot, args.json)


def _add_bench_gil(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser(
        "gil",
        help="from which batch size releasing the GIL pays off",
        description="For the MLP at batches 1..64: forwards/s of 1 and 2 Python threads with the "
        "GIL released and held, to set the release threshold "
        "(rlpar.set_gil_release_threshold) from data. Takes about half a minute.",
    )
    _bench_options(p)
    p.set_defaults(run=_run_bench_gil)


def _run_bench_gil(args: argparse.Namespace) -> int:
    return _report(
        bench.bench_gil_threshold(quick=args.quick), bench.format_gil_threshold, args.json
    )


def _report(result: dict, table: Callable[[dict], str], as_json: bool) -> int:
    print(json.dumps(result) if as_json else table(result))
    return 0
