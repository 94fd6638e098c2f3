"""Issue 25's figures on a 64-node local cluster, each printed beside its target with PASS or FAIL.

    export HPCSWEEP_CLUSTER_DIR=/tmp/cluster-scale
    scripts/slurm-cluster up --nodes 64 --leaf-switches 8      # as root; `down` afterwards
    eval "$(scripts/slurm-cluster env)"; python benchmarks/scale.py [--parallelism 64] [--parts submit main ...]

It expects that cluster (under topology/tree, with at least --parallelism nodes' worth of room) and
runs these parts, in order:
- **submit:** `python -m hpcsweep -m` of --trials held trials (one per task), cancelled at once: its
  wall time and sbatch calls, at the cluster's MaxArraySize and again at 300 (`slurm-cluster up
  --max-array-size 300` reconfigures the running cluster; the old value is put back after);
- **main:** --trials trials of --steps steps, --trials-per-task to a task, with
  `array_parallelism=--parallelism`. Once that many tasks run: `status` refreshed --refreshes times
  through logging wrappers of sacct/squeue/scontrol/sinfo first on PATH (hpcsweep's own calls), the
  controller's query RPCs counted by `sdiag` before and after (the squeue sampler paused); `squeue`
  sampled every second for the running tasks. After --window-s more the sweep is cancelled, and
  sacct's Start/End give the most tasks that ever ran at once;
- **makespan:** --makespan-trials trials packed the same, --makespan-parallelism at a time, run to
  the end: first Submit to last End (sacct) against the floor, the sum of the tasks' run times over
  the slots plus the queue's own start-up (first Submit to first Start);
- **placement:** the cluster fragmented by sleeping jobs of this script's own on all but
  --free-per-leaf nodes of each leaf (an odd number leaves one node over per leaf), then
  --two-node-trials 2-node trials of whole nodes (`--exclusive`) with `topology.mode=switches`, then the
  same with `topology.mode=off`: each allocation's NodeList (sacct) against `scontrol show
  topology`, and each task's wait (Eligible to Start). The off sweep carries a budget of half the
  switches sweep's GPU-hours, watched every --budget-poll-s seconds: its overshoot, and the sacct
  calls its trials' budget watches made (logged by the same wrappers, which the jobs inherit);
- **pin:** --pin-trials 2-node trials with `topology.mode=pin`, submitted held: the nodes each array
  was pinned to (its ReqNodeList), pairwise disjoint and each under one leaf; then cancelled.

The defaults are what fits this 2-core, 23 GB host: the issue's `--parallelism 64` (64 tasks of
240 MB of private memory each, at once) and `--two-node-trials 200` need a larger one; see
benchmarks/README.md#scale.
Trials are the project's own (tiny model, CPU: the nodes' GPUs are declarations). /proc/loadavg is
sampled throughout: this host's 2 cores are shared, and every figure depends on the load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcsweep.slurm.env import expand_nodelist  # noqa: E402
from hpcsweep.slurm.job_states import expand_task_ids  # noqa: E402
from hpcsweep.slurm.topology import parse_topology  # noqa: E402

SUBMIT_TARGET_S = 2.0
STATUS_TARGET_S = 1.0
MAKESPAN_TARGET = 1.25
SPLIT_ARRAY_SIZE = 300
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
COUNTED = ("sacct", "squeue", "scontrol", "sinfo")
# Controller RPCs a client's query makes (sdiag's message types); the daemons' own traffic is left out.
QUERY_RPCS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE",
              "REQUEST_PARTITION_INFO", "REQUEST_BUILD_INFO", "REQUEST_TOPO_INFO", "REQUEST_JOB_USER_INFO")


def tiny(steps: int, gpus_per_node: int = 1) -> list[str]:
    """A trial of a few steps that neither evaluates nor checkpoints: what a packed task's trials cost
    is then mostly the model's construction (about 0.5 s here)."""
    return [f"trainer.max_steps={steps}", "trainer.eval_every=1000", "trainer.ckpt_every=1000",
            f"trainer.log_every={steps}", "trainer.eval_batches=1", "trainer.warmup_steps=1", "data.batch_size=4",
            "data.seq_len=32", "hydra.launcher.cpus_per_task=1", f"hydra.launcher.gpus_per_node={gpus_per_node}",
            "hydra.launcher.timeout_min=60"]


def lrs(n: int) -> str:
    return "model.lr=" + ",".join(f"{1e-5 * (i + 1):.6g}" for i in range(n))


def run(argv: Sequence[str], **kwargs) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=600, check=False, **kwargs)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)[:200]} ... exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


class Load:
    """/proc/loadavg's 1-minute figure, sampled every few seconds in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def summary(self) -> str:
        s = self.samples or [float(Path("/proc/loadavg").read_text().split()[0])]
        return f"1-min load average min {min(s):.1f}, mean {sum(s) / len(s):.1f}, max {max(s):.1f} ({len(s)} samples)"


class Table:
    """The figures, each beside its target and verdict."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, what: str, figure: str, target: str, ok: bool | None) -> None:
        verdict = "—" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append((what, figure, target, verdict))
        print(f"{verdict:4}  {what}: {figure}  (target: {target})", flush=True)

    def markdown(self) -> str:
        lines = ["| figure | measured | target | |", "|---|---|---|---|"]
        lines += [f"| {w} | {f} | {t} | {v} |" for w, f, t, v in self.rows]
        return "\n".join(lines)


def submit(workdir: Path, overrides: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, Path, dict]:
    """Run `python -m hpcsweep -m OVERRIDES` in workdir; its wall time, sweep dir and sweep.json."""
    workdir.mkdir(parents=True)
    start = time.perf_counter()
    run([sys.executable, "-m", "hpcsweep", "-m", *overrides], cwd=workdir, env=env)
    elapsed = time.perf_counter() - start
    (sweep_file,) = workdir.glob("multirun/*/*/sweep.json")
    return elapsed, sweep_file.parent, json.loads(sweep_file.read_text())


def array_ids(record: dict) -> list[str]:
    return [a["array_job_id"] for a in record["arrays"]]


def task_count(record: dict) -> int:
    return len({t["job_id"] for t in record["trials"]})


def scontrol_config(key: str) -> str:
    out = run(["scontrol", "show", "config"])
    return next(line.split("=", 1)[1].strip() for line in out.splitlines() if line.split("=")[0].strip() == key)


def set_max_array_size(size: int) -> None:
    run([str(REPO / "scripts" / "slurm-cluster"), "up", f"--max-array-size={size}"])
    deadline = time.monotonic() + 60
    while int(scontrol_config("MaxArraySize")) != size:
        if time.monotonic() > deadline:
            raise SystemExit(f"MaxArraySize did not become {size}")
        time.sleep(1)


def measure_submit(table: Table, tmp: Path, trials: int) -> None:
    original = int(scontrol_config("MaxArraySize"))
    for size in (original, SPLIT_ARRAY_SIZE):
        if size != original:
            set_max_array_size(size)
        try:
            elapsed, _, record = submit(tmp / f"submit-{size}", [lrs(trials), *tiny(2, 0),
                                                                 "+hydra.launcher.additional_parameters.hold=true"])
        finally:
            if size != original:
                set_max_array_size(original)
        run(["scancel", *array_ids(record)])
        calls, expected = len(record["arrays"]), math.ceil(trials / size)
        table.add(f"submit, {trials} trials, MaxArraySize={size}", f"{elapsed:.2f} s, {calls} sbatch call(s)",
                  f"<= {SUBMIT_TARGET_S:g} s in {expected} call(s)", elapsed <= SUBMIT_TARGET_S and calls == expected)


def sacct_rows(job_ids: Sequence[str], fields: Sequence[str]) -> list[dict[str, str]]:
    out = run(["sacct", "-X", "--noheader", "--parsable2", "-j", ",".join(job_ids), f"--format={','.join(fields)}"])
    return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]


def wait_ended(job_ids: Sequence[str], tasks: int, timeout: float) -> list[dict[str, str]]:
    fields = ("JobID", "State", "Submit", "Eligible", "Start", "End", "ElapsedRaw", "NodeList", "AllocTRES")
    deadline = time.monotonic() + timeout
    while True:
        rows = sacct_rows(job_ids, fields)
        ended = [r for r in rows if r["State"].split()[0] in TERMINAL and r["End"] not in ("", "Unknown")]
        # A pending array's tasks are one row ("12_[3-9%4]") until they start, or are cancelled so.
        ended_tasks = sum(len(expand_task_ids(r["JobID"])) for r in ended)
        if ended_tasks >= tasks and len(ended) == len(rows):
            return ended
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ended)} of {tasks} tasks ended within {timeout:g} s")
        time.sleep(2)


def timestamp(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def most_at_once(rows: Sequence[dict[str, str]]) -> int:
    """The most allocations that ran at the same time, from sacct's Start and End (an End at the very
    second of another's Start counts as before it: sacct's resolution is one second)."""
    events = sorted([(timestamp(r["Start"]), 1) for r in rows if r["Start"] not in ("", "Unknown", "None")]
                    + [(timestamp(r["End"]), -1) for r in rows if r["Start"] not in ("", "Unknown", "None")])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def counting_path(bin_dir: Path, log: Path) -> str:
    """A PATH whose first folder holds wrappers that log each Slurm command hpcsweep runs, then run it."""
    bin_dir.mkdir()
    for command in COUNTED:
        real = shutil.which(command)
        wrapper = bin_dir / command
        wrapper.write_text(f'#!/bin/sh\necho "{command} $*" >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sdiag_counts() -> dict[str, int]:
    """sdiag's RPC counts by message type."""
    counts: dict[str, int] = {}
    for line in run(["sdiag"]).splitlines():
        name, _, rest = line.strip().partition(" ")
        if name.startswith(("REQUEST_", "MESSAGE_", "RESPONSE_")) and "count:" in rest:
            counts[name] = int(rest.split("count:")[1].split()[0])
    return counts


class RunningSampler:
    """squeue's count of running tasks of the given arrays, every second, in a thread."""

    def __init__(self, job_ids: Sequence[str]) -> None:
        self.job_ids = list(job_ids)
        self.peak = 0
        self.samples = 0
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if self.paused.is_set():
                continue
            proc = subprocess.run(["squeue", "-h", "--array", "-t", "R", "-j", ",".join(self.job_ids), "-o", "%i"],
                                  capture_output=True, text=True, timeout=60, check=False)
            if proc.returncode == 0:
                self.peak = max(self.peak, len(proc.stdout.split()))
                self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def poll_status(table: Table, sweep_dir: Path, tmp: Path, refreshes: int, record: dict,
                sampler: RunningSampler) -> None:
    """`status` refreshed ``refreshes`` times, the squeue sampler paused so that sdiag counts status's RPCs
    (and the running trials' own, if any)."""
    sampler.paused.set()
    time.sleep(1.5)
    try:
        refresh_status(table, sweep_dir, tmp, refreshes, record)
    finally:
        sampler.paused.clear()


def refresh_status(table: Table, sweep_dir: Path, tmp: Path, refreshes: int, record: dict) -> None:
    log = tmp / "slurm-calls.log"
    env = {**os.environ, "PATH": counting_path(tmp / "counting-bin", log)}
    before = sdiag_counts()
    times, cpu = [], []
    for _ in range(refreshes):
        start, cpu_start = time.perf_counter(), children_cpu_s()
        run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir), "--color=never"], env=env)
        times.append(time.perf_counter() - start)
        cpu.append(children_cpu_s() - cpu_start)
    after = sdiag_counts()
    calls = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    by_command = {c: calls.count(c) for c in COUNTED}
    rpcs = {k: after.get(k, 0) - before.get(k, 0) for k in QUERY_RPCS if after.get(k, 0) != before.get(k, 0)}
    sacct_per = by_command["sacct"] / refreshes
    other_per = (by_command["squeue"] + by_command["scontrol"] + by_command["sinfo"]) / refreshes
    trials = len(record["trials"])
    table.add(f"status refresh, {trials}-trial sweep running", f"median {sorted(times)[len(times) // 2]:.2f} s, "
              f"max {max(times):.2f} s over {refreshes}; CPU {sorted(cpu)[len(cpu) // 2]:.2f} s (with its Slurm commands)",
              f"<= {STATUS_TARGET_S:g} s", max(times) <= STATUS_TARGET_S)
    table.add("status: hpcsweep's Slurm calls per refresh",
              ", ".join(f"{c} {n / refreshes:g}" for c, n in by_command.items()),
              "sacct 1, squeue + scontrol <= 1", sacct_per == 1 and other_per <= 1)
    table.add("status: controller query RPCs per refresh (sdiag)",
              (", ".join(f"{k} {v / refreshes:g}" for k, v in sorted(rpcs.items())) or "none")
              + " (the running trials' own included)", "— (one squeue: 1 partition + 1 job query per array)",
              None)


def main_sweep(table: Table, tmp: Path, args: argparse.Namespace) -> None:
    """The big sweep in flight: status polled, the throttle watched for --window-s, then cancelled."""
    overrides = [lrs(args.trials), *tiny(args.steps), f"hydra.launcher.array_parallelism={args.parallelism}",
                 f"hydra.launcher.trials_per_task={args.trials_per_task}"]
    elapsed, sweep_dir, record = submit(tmp / "main", overrides)
    ids, tasks = array_ids(record), task_count(record)
    size = (sweep_dir / "sweep.json").stat().st_size
    print(f"main sweep: {args.trials} trials in {tasks} tasks submitted in {elapsed:.2f} s; sweep.json {size} bytes "
          f"({size / args.trials:.0f} a trial)", flush=True)
    sampler = RunningSampler(ids)
    deadline = time.monotonic() + 600
    while sampler.peak < min(args.parallelism, tasks) and time.monotonic() < deadline:
        time.sleep(1)
    poll_status(table, sweep_dir, tmp, args.refreshes, record, sampler)
    time.sleep(args.window_s)
    run(["scancel", *ids])
    rows = wait_ended(ids, 0, args.timeout_s)
    sampler.stop()
    started = [r for r in rows if r["Start"] not in ("", "Unknown", "None")]
    table.add(f"throttle, array_parallelism={args.parallelism}, {tasks} tasks: most running at once",
              f"squeue {sampler.peak} ({sampler.samples} samples), sacct Start/End {most_at_once(started)} "
              f"({len(started)} tasks started before the cancel)", f"<= {args.parallelism}",
              max(sampler.peak, most_at_once(started)) <= args.parallelism)


def makespan(table: Table, tmp: Path, args: argparse.Namespace) -> None:
    """A sweep run to its end: makespan from sacct against the floor."""
    slots = args.makespan_parallelism
    overrides = [lrs(args.makespan_trials), *tiny(args.steps), f"hydra.launcher.array_parallelism={slots}",
                 f"hydra.launcher.trials_per_task={args.trials_per_task}"]
    _, _, record = submit(tmp / "makespan", overrides)
    tasks = task_count(record)
    rows = wait_ended(array_ids(record), tasks, args.timeout_s)
    completed = sum(r["State"] == "COMPLETED" for r in rows)
    submit_t = min(timestamp(r["Submit"]) for r in rows)
    first_start = min(timestamp(r["Start"]) for r in rows)
    end = max(timestamp(r["End"]) for r in rows)
    busy = sum(int(r["ElapsedRaw"]) for r in rows)
    slots = min(slots, tasks)
    floor = busy / slots + (first_start - submit_t)
    span = end - submit_t
    table.add(f"makespan, {args.makespan_trials} trials in {tasks} tasks, {slots} at a time ({completed} completed)",
              f"{span:.0f} s vs floor {floor:.0f} s ({busy} task-s / {slots} slots + {first_start - submit_t:.0f} s "
              f"start-up): {span / floor:.2f}x", f"<= {MAKESPAN_TARGET}x",
              span / floor <= MAKESPAN_TARGET and completed == tasks)


def leaf_spans(rows: Sequence[dict[str, str]], leaf_of: dict[str, str]) -> list[int]:
    return [len({leaf_of[n] for n in expand_nodelist(r["NodeList"])}) for r in rows
            if r["NodeList"] not in ("", "None assigned")]


def waits(rows: Sequence[dict[str, str]]) -> list[float]:
    return [timestamp(r["Start"]) - timestamp(r["Eligible"]) for r in rows
            if r["Start"] not in ("", "Unknown", "None") and r["Eligible"] not in ("", "Unknown", "None")]


def allocated_gpus(row: dict[str, str]) -> int:
    tres = dict(item.split("=", 1) for item in row["AllocTRES"].split(",") if "=" in item)
    return int(tres.get("gres/gpu", 0))


def gpu_hours(rows: Sequence[dict[str, str]]) -> float:
    return sum(int(r["ElapsedRaw"] or 0) * allocated_gpus(r) / 3600 for r in rows)


def describe_waits(values: Sequence[float]) -> str:
    waited = [w for w in values if w >= 1]
    if not waited:
        return f"0 of {len(values)} waited"
    share = 100 * len(waited) / len(values)
    return (f"{len(waited)} of {len(values)} waited ({share:.0f}%), mean {sum(waited) / len(waited):.0f} s, "
            f"max {max(waited):.0f} s")


def fragment(leaves: dict[str, list[str]], free_per_leaf: int) -> list[str]:
    """Hold all but ``free_per_leaf`` nodes of each leaf with jobs of this benchmark's own (whole
    nodes, sleeping); return their ids once they run. An odd number free per leaf leaves one node over
    in each leaf once its pairs are taken: a 2-node job placed without a switch constraint can take
    two such nodes under two leaves, one placed with `--switches=1` waits for a pair under one."""
    held = [n for nodes in leaves.values() for n in nodes[free_per_leaf:]]
    jobs = [run(["sbatch", "--parsable", f"--nodelist={node}", "--exclusive", "--time=60", "--output=/dev/null",
                 "--wrap", "sleep 3600"]).strip() for node in held]
    deadline = time.monotonic() + 120
    while len(run(["squeue", "-h", "-t", "R", "-j", ",".join(jobs), "-o", "%i"]).split()) < len(jobs):
        if time.monotonic() > deadline:
            raise SystemExit("the blockers did not all start within 120 s")
        time.sleep(1)
    return jobs


def placement(table: Table, tmp: Path, args: argparse.Namespace) -> None:
    tree = parse_topology(run(["scontrol", "show", "topology"]))
    leaf_of = dict(tree.leaf_of)
    leaves: dict[str, list[str]] = {}
    for node, leaf in sorted(leaf_of.items(), key=lambda item: int(item[0].lstrip("node") or 0)):
        leaves.setdefault(leaf, []).append(node)
    # Whole nodes (--exclusive), so that 2-node trials compete for nodes, not for a node's CPUs.
    two_node = [*tiny(args.steps), "trainer.nodes=2", "trainer.nproc_per_node=1",
                "+hydra.launcher.additional_parameters.exclusive=true",
                f"hydra.launcher.trials_per_task={args.two_node_per_task}",
                f"hydra.launcher.array_parallelism={args.two_node_parallelism}"]
    blockers = fragment(leaves, args.free_per_leaf)
    print(f"placement: {len(blockers)} nodes held, {args.free_per_leaf} free in each of {len(leaves)} leaves",
          flush=True)
    try:
        placement_sweeps(table, tmp, args, two_node, leaf_of)
    finally:
        run(["scancel", *blockers])


def placement_sweeps(table: Table, tmp: Path, args: argparse.Namespace, two_node: list[str],
                     leaf_of: dict[str, str]) -> None:
    _, _, on_record = submit(tmp / "switches", [lrs(args.two_node_trials), *two_node, "topology.mode=switches"])
    on_rows = wait_ended(array_ids(on_record), task_count(on_record), args.timeout_s)
    spans = leaf_spans(on_rows, leaf_of)
    table.add(f"placement, {args.two_node_trials} 2-node trials in {len(on_rows)} allocations, topology.mode=switches",
              f"{sum(s == 1 for s in spans)} of {len(spans)} inside one leaf; {describe_waits(waits(on_rows))}",
              "all inside one leaf", len(spans) == len(on_rows) and all(s == 1 for s in spans))
    on_hours = gpu_hours(on_rows)
    budget = round(on_hours / 2, 4)
    # The jobs inherit the counting PATH: every sacct a trial's budget watch makes is logged.
    calls_log = tmp / "budget-calls.log"
    env = {**os.environ, "HPCSWEEP_BUDGET_POLL_S": str(args.budget_poll_s),
           "PATH": counting_path(tmp / "budget-bin", calls_log)}
    _, _, off_record = submit(tmp / "off", [lrs(args.two_node_trials), *two_node, "topology.mode=off",
                                            f"hydra.launcher.budget_gpu_hours={budget}"], env=env)
    off_rows = wait_ended(array_ids(off_record), task_count(off_record), args.timeout_s)
    ran = [r for r in off_rows if r["NodeList"] not in ("", "None assigned")]
    budget_watch_calls(table, calls_log, ran, args.budget_poll_s)
    off_spans = leaf_spans(ran, leaf_of)
    table.add("placement, the same with topology.mode=off (budget-stopped)",
              f"{sum(s > 1 for s in off_spans)} of {len(off_spans)} allocations span 2+ leaves; "
              f"{describe_waits(waits(ran))}", "(comparison)", None)
    spent = gpu_hours(off_rows)
    concurrent = most_at_once(ran)
    gpus_per_trial = max((allocated_gpus(r) for r in ran), default=0)
    step_s = max((int(r["ElapsedRaw"]) for r in ran), default=0) / max(1, args.two_node_per_task * args.steps)
    allowed = concurrent * gpus_per_trial * (args.budget_poll_s + step_s) / 3600
    failed = sum(r["State"].split()[0] not in ("COMPLETED", "CANCELLED") for r in off_rows)
    table.add(f"budget {budget:g} GPU-h (half of the switches sweep's {on_hours:.4f})",
              f"spent {spent:.4f} GPU-h, overshoot {spent - budget:+.4f} GPU-h ({100 * (spent - budget) / budget:+.0f}%); "
              f"{failed} task(s) failed",
              f"overshoot <= {allowed:.4f} GPU-h ({concurrent} running x {gpus_per_trial} GPUs x "
              f"({args.budget_poll_s:g} s watch + {step_s:.1f} s step)); none failed", spent - budget <= allowed and not failed)


def budget_watch_calls(table: Table, calls_log: Path, ran: Sequence[dict[str, str]], poll_s: float) -> None:
    """The sacct calls the budget watches made over the sweep, against one a poll (the running
    trials share one look) and against one per running task a poll (each asking for itself)."""
    lines = calls_log.read_text().splitlines() if calls_log.exists() else []
    calls = sum(line.startswith("sacct ") and "--allocations --duplicates" in line for line in lines)
    span = max(timestamp(r["End"]) for r in ran) - min(timestamp(r["Start"]) for r in ran) if ran else 0.0
    per_task = sum(int(r["ElapsedRaw"]) for r in ran) / poll_s
    table.add(f"budget watch: sacct calls over the sweep's {span:.0f} s ({len(ran)} tasks ran, watch every {poll_s:g} s)",
              f"{calls} calls; one per running task a poll would have been about {per_task:.0f}",
              f"<= {span / poll_s + 1:.0f} (one a poll, + 1)", calls <= span / poll_s + 1)


def pin_mode(table: Table, tmp: Path, args: argparse.Namespace) -> None:
    leaf_of = dict(parse_topology(run(["scontrol", "show", "topology"])).leaf_of)
    _, _, record = submit(tmp / "pin", [lrs(args.pin_trials), *tiny(args.steps), "trainer.nodes=2",
                                        "trainer.nproc_per_node=1", "topology.mode=pin",
                                        "+hydra.launcher.additional_parameters.hold=true"])
    ids = array_ids(record)
    node_sets = []
    for job in ids:
        fields = dict(item.split("=", 1) for item in run(["scontrol", "show", "job", "--oneliner", job]).split()
                      if "=" in item)
        node_sets.append(expand_nodelist(fields["ReqNodeList"]) if fields.get("ReqNodeList", "(null)") != "(null)" else [])
    run(["scancel", *ids])
    pinned = [s for s in node_sets if s]
    all_nodes = [n for s in pinned for n in s]
    disjoint = len(all_nodes) == len(set(all_nodes))
    in_leaf = all(len({leaf_of[n] for n in s}) == 1 for s in pinned)
    table.add(f"pin mode, {args.pin_trials} 2-node trials (held)",
              f"{len(pinned)} of {len(ids)} arrays pinned, {len(set(all_nodes))} distinct nodes, "
              f"{'disjoint' if disjoint else 'OVERLAPPING'}, {'each in one leaf' if in_leaf else 'CROSSING leaves'}",
              f"{args.pin_trials} disjoint 2-node sets", len(pinned) == args.pin_trials and disjoint and in_leaf)


PARTS = {"submit": lambda table, tmp, args: measure_submit(table, tmp, args.trials), "main": main_sweep,
         "makespan": makespan, "placement": placement, "pin": pin_mode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trials-per-task", type=int, default=25)
    parser.add_argument("--parallelism", type=int, default=32)
    parser.add_argument("--window-s", type=float, default=60.0, help="how long the main sweep runs after the polls")
    parser.add_argument("--makespan-trials", type=int, default=200)
    parser.add_argument("--makespan-parallelism", type=int, default=4)
    parser.add_argument("--refreshes", type=int, default=5)
    parser.add_argument("--two-node-trials", type=int, default=24)
    parser.add_argument("--two-node-per-task", type=int, default=2)
    parser.add_argument("--two-node-parallelism", type=int, default=10)
    parser.add_argument("--free-per-leaf", type=int, default=3)
    parser.add_argument("--pin-trials", type=int, default=32)
    parser.add_argument("--budget-poll-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    args = parser.parse_args()
    nodes = len(run(["sinfo", "-h", "-N", "-p", "batch", "-o", "%N"]).split())
    print(f"cluster: {nodes} nodes; started {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC", flush=True)
    load, table, started = Load(), Table(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        for name in args.parts:
            part_start = time.monotonic()
            PARTS[name](table, Path(tmp), args)
            print(f"({name}: {time.monotonic() - part_start:.0f} s)", flush=True)
    print(f"\n{nodes} nodes, {time.monotonic() - started:.0f} s in all; {load.summary()}\n")
    print(table.markdown())
    sys.exit(0 if all(v != "FAIL" for *_, v in table.rows) else 1)


if __name__ == "__main__":
    main()
