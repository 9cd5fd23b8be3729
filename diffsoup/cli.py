"""The ``diffsoup`` command.

    diffsoup demo            solve and differentiate reference stiff problems, then fit a
                             reaction network to synthetic experiments

Run ``diffsoup <command> --help`` for a command's options.
"""

from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    from ._demo import run

    run(n_grid=args.grid)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffsoup",
        description="Differentiable stiff ODE simulation and fitting in JAX (sparse KLU/cuDSS solves).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: diffsoup demo --grid 32",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="solve ROBER and the 2-D Brusselator, differentiate, then fit a network to 60 experiments",
        description="Solve ROBER (Test Set for IVP Solvers) and the 2-D Brusselator on the CPU, print time, "
        "steps, factorizations and correct digits, then the gradient of u(0,0) by adjoint and forward mode, "
        "then fit the rate constants of a reaction network to 60 synthetic experiments (true vs recovered).",
    )
    demo.add_argument("--grid", type=int, default=32, help="Brusselator grid size N (2 N^2 states; default 32)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "grid", 4) < 4:
        parser.error("--grid must be at least 4")
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
