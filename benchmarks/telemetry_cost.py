"""What per-trial telemetry costs: one sample, and tokens/s with telemetry every second vs off.

    python benchmarks/telemetry_cost.py [--steps 80] [--repeats 5] [--every 1.0]

One sample: the CPU sampler on this machine's real ``/proc`` (the known process tree, and the full
scan it repeats every ``TREE_RESCAN_S``), and an 8-GPU NVML round over the unit tests' fake NVML
(``tests/unit/fake_nvml.py``: the Python cost of the sampler and of refreshing the node's summary,
at the start of a run and after 24 hours of samples every 10 s; the real library's own cost is
measured by ``benchmarks/gpu_check.py`` on a GPU). Throughput: the real ``Trainer.fit`` of the same
trial with ``trainer.telemetry_every_s`` at ``--every`` and at 0, alternating in this one process
so that load from other work hits both alike, timed from the end of step 1 to the end of step N;
the median of the back-to-back pairs' ratios is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import trial_config_from_dict  # noqa: E402
from hpcsweep.telemetry.cpu_sampler import ProcessTreeSampler  # noqa: E402
from hpcsweep.telemetry.node_sampler import NodeSampler  # noqa: E402
from hpcsweep.telemetry.nvml_sampler import NvmlSampler  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from hpcsweep.train.trainer import Trainer  # noqa: E402
from tests.unit.fake_nvml import FakeGpu, FakeNvml  # noqa: E402

DAY_OF_SAMPLES = 24 * 3600 // 10
"""Samples a GPU has after 24 hours at the default ``trainer.telemetry_every_s`` of 10 s."""


def mean_ms(call, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        call()
    return (time.perf_counter() - start) / rounds * 1e3


def sample_costs() -> dict[str, float]:
    """Milliseconds of one CPU reading, one full /proc scan, and one 8-GPU node round (fake NVML)."""
    cpu = ProcessTreeSampler([os.getpid()])
    cpu.read(time.monotonic())
    scanning = ProcessTreeSampler([os.getpid()], rescan_s=0.0)  # lists the whole of /proc at every read
    costs = {"cpu_read_ms": mean_ms(lambda: cpu.read(time.monotonic()), 200),
             "proc_scan_ms": mean_ms(lambda: scanning.read(time.monotonic()), 20)}
    uuids = [f"GPU-{i}" for i in range(8)]
    node = NodeSampler("bench", NvmlSampler.open(FakeNvml([FakeGpu(u) for u in uuids]), uuids), None,
                       ProcessTreeSampler([os.getpid()]))
    costs["nvml_read_8_gpus_ms"] = mean_ms(node.gpus.read, 200)
    costs["node_round_8_gpus_ms"] = mean_ms(node.sample, 50)
    for series in node.gpu_series:  # a day of samples, appended without the summary refresh each would do
        row = dict(zip(series.fields, (90.0, 40.0, 500.0, 1980.0, 70.0, 40.0)))
        for i in range(DAY_OF_SAMPLES):
            series.append(float(i), row)
    costs["node_round_8_gpus_after_a_day_ms"] = mean_ms(node.sample, 5)
    costs["window_payload_ms"] = mean_ms(node.payload, 50)
    node.close()
    return costs


def tokens_per_s(cfg, steps: int) -> tuple[float, int]:
    """Steady-state tokens/s of ``Trainer.fit`` (steps 2..N) and the telemetry samples it took."""
    stamps: dict[int, float] = {}

    def stamp(trainer: Trainer, step: int) -> None:
        stamps[step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, WorldInfo(0, 0, 1, torch.device("cpu"), None), Path(tmp), hooks=[stamp])
        trainer.fit()
        samples = trainer.telemetry.node.rounds if trainer.telemetry.node is not None else 0
        trainer.close()
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (stamps[steps] - stamps[1]), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=float, default=1.0, help="trainer.telemetry_every_s of the runs with telemetry")
    args = parser.parse_args()
    torch.set_num_threads(1)

    costs = sample_costs()
    print(f"one CPU sample (known tree): {costs['cpu_read_ms']:.3f} ms; with the full /proc scan of every 60 s: "
          f"{costs['proc_scan_ms']:.2f} ms ({len([p for p in os.listdir('/proc') if p.isdigit()])} processes)")
    print(f"one 8-GPU NVML read, fake NVML: {costs['nvml_read_8_gpus_ms']:.3f} ms; the node's whole round "
          f"(read + store + summary): {costs['node_round_8_gpus_ms']:.2f} ms, after a day of samples "
          f"({DAY_OF_SAMPLES} a GPU): {costs['node_round_8_gpus_after_a_day_ms']:.2f} ms; a log window's payload: "
          f"{costs['window_payload_ms']:.3f} ms")

    def config(every: float):
        return trial_config_from_dict({"trainer": {"device": "cpu", "max_steps": args.steps, "eval_every": args.steps,
                                                   "ckpt_every": 0, "telemetry_every_s": every}})

    on, off = config(args.every), config(0)
    tokens_per_s(on, args.steps), tokens_per_s(off, args.steps)  # warm-up
    runs: dict[str, list[float]] = {"on": [], "off": []}
    samples = []
    for _ in range(args.repeats):
        rate, taken = tokens_per_s(on, args.steps)
        runs["on"].append(rate)
        samples.append(taken)
        runs["off"].append(tokens_per_s(off, args.steps)[0])
    pair_ratio = statistics.median(a / b for a, b in zip(runs["on"], runs["off"]))
    print(f"deepseek_tiny, batch {on.data.batch_size}x{on.data.seq_len}, {args.steps} steps, {args.repeats} repeats, "
          f"1 thread, wall time")
    print(f"telemetry every {args.every:g} s {statistics.median(runs['on']):9.0f} tokens/s  "
          f"(runs: {', '.join(f'{x:.0f}' for x in runs['on'])}; samples taken: {', '.join(map(str, samples))})")
    print(f"telemetry off      {statistics.median(runs['off']):9.0f} tokens/s  "
          f"(runs: {', '.join(f'{x:.0f}' for x in runs['off'])})")
    print(f"ratio {pair_ratio:.3f} (median of back-to-back pairs)")


if __name__ == "__main__":
    main()
