"""What task scores cost a trial: one scoring of an lm-eval task on 1 rank against 2 ranks.

    python benchmarks/task_scoring.py [--rounds 6] [--examples 64] [--hidden 256] [--layers 4]

Two processes (gloo, one thread each) hold the same model, a DeepseekV3 of the fact fixture
(``tests/task_fixtures.py``) widened to ``--hidden``/``--layers``, and a multiple-choice task of
``--examples`` questions (4 choices each, every context its own). Alternating in these two processes, round by round:

- ``before``: lm-eval's ``simple_evaluate`` on rank 0 alone, as the trainer called it before issue 39
  (it records the environment too: ``pip list`` and other commands in subprocesses);
- ``1 rank``: ``TaskScorer`` on rank 0 alone (``world_size=1``), rank 1 waiting;
- ``2 ranks``: ``TaskScorer`` on both ranks, each its share, gathered on rank 0.

A contender's time is the slowest rank's wall time of the call (every rank waits for the slowest in
the trainer's next collective), and its CPU time (``time.process_time``, subprocesses not counted);
the first round is left out; medians over the rest, and the ratios, are printed. The scores of every
contender must agree, or the script fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

CONTENDERS = ("before", "1 rank", "2 ranks")


def write_task(folder: Path, examples: int) -> Path:
    """The fact task with ``examples`` questions, each after another fact, so that no two contexts are
    alike (lm-eval runs a context shared by several requests once)."""
    from tests.task_fixtures import COLORS, TASK, facts, question, task_yaml

    folder.mkdir(parents=True, exist_ok=True)
    known = facts()
    rows = []
    for i in range(examples):
        (name, color), (before, its) = known[i % len(known)], known[(i // len(known) + i + 1) % len(known)]
        rows.append({"question": f"{question(before)} {its}. {question(name)}", "choices": list(COLORS),
                     "label": COLORS.index(color)})
    data = folder / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / f"{TASK}.yaml").write_text(task_yaml(TASK, data))
    return folder


def worker(rank: int, root: str, port: int, rounds: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from hpcsweep.config import TasksConfig
    from hpcsweep.train.scores.task_scorer import TaskScorer, scores_from_results
    from tests.task_fixtures import TASK

    model_dir, task_dir = Path(root) / "model", Path(root) / "tasks"
    cfg = TasksConfig(names=[TASK], include_path=str(task_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    alone = TaskScorer(cfg, str(model_dir)) if rank == 0 else None
    shared = TaskScorer(cfg, str(model_dir), rank=rank, world_size=2)

    def before():
        if rank != 0:
            return None
        from lm_eval.tasks import TaskManager

        lm = HFLM(pretrained=model, tokenizer=alone.tokenizer, batch_size=cfg.batch_size)
        results = simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(task_dir),
                                  include_defaults=False), random_seed=None, numpy_random_seed=None,
                                  torch_random_seed=None, log_samples=False, verbosity="WARNING")
        return scores_from_results(results["results"])

    calls = {"before": before, "1 rank": lambda: alone.score(model) if rank == 0 else None,
             "2 ranks": lambda: shared.score(model)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    scores: dict[str, object] = {}
    with torch.no_grad():
        for _ in range(rounds):
            for name in CONTENDERS:
                dist.barrier()
                wall, cpu = time.perf_counter(), time.process_time()
                result = calls[name]()
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
                if result is not None:
                    scores[name] = result
    gathered = [None, None]
    dist.all_gather_object(gathered, times)
    if rank == 0:
        Path(out).write_text(json.dumps({"times": gathered, "scores": scores}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--port", type=int, default=29611)
    args = parser.parse_args(argv)
    from tests.task_fixtures import make_fact_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_fact_model(root / "model", hidden_size=args.hidden, num_hidden_layers=args.layers,
                        intermediate_size=2 * args.hidden, moe_intermediate_size=args.hidden // 2)
        write_task(root / "tasks", args.examples)
        out = root / "times.json"
        mp.spawn(worker, args=(str(root), args.port, args.rounds, str(out)), nprocs=2)
        found = json.loads(out.read_text())
    per_rank, scores = found["times"], found["scores"]
    if len({json.dumps(s, sort_keys=True) for s in scores.values()}) != 1:
        print(f"scores differ: {scores}")
        return 1
    print(f"{args.examples} examples x 4 choices, hidden {args.hidden}, {args.layers} layers, "
          f"{args.rounds - 1} rounds after the first; scores {scores['2 ranks']}")
    medians = {}
    for name in CONTENDERS:
        # A round's time: the slowest rank's (rank 1 idles through the 1-rank contenders).
        walls = [max(r[name][i][0] for r in per_rank) for i in range(1, args.rounds)]
        cpus = [max(r[name][i][1] for r in per_rank) for i in range(1, args.rounds)]
        medians[name] = statistics.median(walls), statistics.median(cpus)
        print(f"{name:8s} wall {medians[name][0]:.3f} s  CPU {medians[name][1]:.3f} s (slowest rank, median)")
    one, two, old = medians["1 rank"], medians["2 ranks"], medians["before"]
    print(f"2 ranks / 1 rank: wall {two[0] / one[0]:.2f}x, CPU {two[1] / one[1]:.2f}x; "
          f"1 rank / before: wall {one[0] / old[0]:.2f}x, CPU {one[1] / old[1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
