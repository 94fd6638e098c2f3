"""DeepSeek-V3's bias update on two gloo ranks under torchrun: each step the bias moves by +-rate from
the tokens per expert summed over both ranks, and both ranks hold the same bias."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .test_trainer_ddp import free_port

RATE = 0.001
STEPS = 4


def test_the_bias_moves_by_the_rate_from_the_counts_of_every_rank_and_stays_equal_on_both(tmp_path):
    script = Path(__file__).resolve().parent.parent / "moe_balance_ranks.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(script), str(tmp_path), str(STEPS), str(RATE)]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    local_would_differ = False
    for step0, step1 in zip(*ranks):
        assert step0["before"] == step1["before"] and step0["after"] == step1["after"]
        summed = torch.tensor(step0["counts"]) + torch.tensor(step1["counts"])
        expected = torch.tensor(step0["before"]) + RATE * torch.sign(summed.float().mean() - summed.float())
        assert torch.equal(torch.tensor(step0["after"]), expected)
        for mine in (step0["counts"], step1["counts"]):
            mine = torch.tensor(mine).float()
            local_would_differ |= not torch.equal(torch.sign(mine.mean() - mine),
                                                  torch.sign(summed.float().mean() - summed.float()))
    # The check above can tell a summed update from a rank's own: the ranks' own counts point elsewhere.
    assert local_would_differ
    assert ranks[0][-1]["after"] != ranks[0][0]["before"]
