"""Replay or sweep simulation seeds: ``python -m txmq.testing.simulate --seed 17`` or
``--seeds 0:5000``."""

from __future__ import annotations

import argparse
import logging
import sys

from txmq.testing._simulation import InvariantViolation, SimConfig, run_seed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int)
    p.add_argument("--seeds", default="0:500", help="range start:end")
    p.add_argument("--steps", type=int, default=SimConfig.steps)
    a = p.parse_args(argv)
    logging.disable(logging.WARNING)  # discards are expected and logged by the broker
    seeds = [a.seed] if a.seed is not None else range(*map(int, a.seeds.split(":")))
    for s in seeds:
        try:
            run_seed(s, SimConfig(steps=a.steps))
        except InvariantViolation as exc:
            print(exc, file=sys.stderr)
            return 1
    print(f"{len(seeds)} seeds passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
