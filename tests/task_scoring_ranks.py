"""Run by ``tests/unit/test_task_scores.py`` under torchrun (2 gloo ranks): score the fact task on the
model folder ARGV[2] with the tasks of ARGV[3], each rank its share, then on rank 0 alone; write what each
rank saw to ARGV[1]/rankR.json."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from hpcsweep.config import TasksConfig
from hpcsweep.train.scores.task_scorer import TaskScorer
from tests.task_fixtures import TASK

torch.set_num_threads(1)
out, model_dir, task_dir = (Path(arg) for arg in sys.argv[1:4])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = TasksConfig(names=[TASK], include_path=str(task_dir))
model = AutoModelForCausalLM.from_pretrained(str(model_dir))
model.train()
beats = []
shared = TaskScorer(cfg, str(model_dir), rank=rank, world_size=world)
scores = shared.score(model, heartbeat=lambda: beats.append(rank))
requests = len(shared.tasks["tasks"][TASK].instances)
alone = TaskScorer(cfg, str(model_dir)).score(model) if rank == 0 else None
(out / f"rank{rank}.json").write_text(json.dumps({
    "scores": scores, "alone": alone, "requests": requests, "beats": len(beats), "training": model.training,
    "pid": os.getpid()}))
dist.destroy_process_group()
