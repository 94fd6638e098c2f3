"""Time parse + choose on the 1,024-node fat tree of the unit tests (64 leaves x 16 nodes).

    python benchmarks/topology.py [--runs 20]

Prints the best of N runs in milliseconds and whether it is under the 50 ms budget.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcsweep.slurm.topology import choose_nodes, parse_topology  # noqa: E402
from tests.unit.test_topology import FAT_TREE_TEXT  # noqa: E402

BUDGET_MS = 50.0


def fragmented(free_fraction: float, seed: int = 0) -> list[str]:
    """A random free set: each node free with probability ``free_fraction``."""
    rng = random.Random(seed)
    return [node for node in parse_topology(FAT_TREE_TEXT).leaf_of if rng.random() < free_fraction]


def one_run(free: list[str], n: int) -> float:
    """Seconds for one parse of the literal plus one choice of ``n`` nodes among ``free``."""
    start = time.perf_counter()
    tree = parse_topology(FAT_TREE_TEXT)
    placement = choose_nodes(tree, free, n)
    elapsed = time.perf_counter() - start
    assert placement is not None and len(placement.nodes) == n
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    cases = [(0.4, 8), (0.4, 64), (0.6, 200), (0.9, 512)]
    worst = 0.0
    for fraction, n in cases:
        free = fragmented(fraction)
        best_ms = 1000 * min(one_run(free, n) for _ in range(args.runs))
        worst = max(worst, best_ms)
        print(f"free {fraction:.0%}, {n:4d} nodes: best of {args.runs}: {best_ms:6.2f} ms")
    verdict = "under" if worst < BUDGET_MS else "OVER"
    print(f"slowest case {worst:.2f} ms: {verdict} the {BUDGET_MS:.0f} ms budget")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
