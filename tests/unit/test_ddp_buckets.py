"""Four gloo ranks: a stop and resume is bit-exact with DDP's gradient buckets fixed at the first forward
(``parallel.fix_buckets``), without ``find_unused_parameters`` and its warning."""

from __future__ import annotations

import pytest
import torch

from .test_trainer_ddp import make_trial, torchrun
from .trial_dirs import read_metrics

torch.set_num_threads(1)

UNUSED_SEARCH_WARNING = "find_unused_parameters=True was specified"


@pytest.fixture(scope="module")
def four_rank_runs(tmp_path_factory):
    # From 3 ranks up the ring all-reduce's summation order depends on an element's place in its
    # bucket: with DDP's default rebuild, the resumed process's first step ran another layout.
    root = tmp_path_factory.mktemp("buckets")
    straight = make_trial(root / "straight", **{"trainer.max_steps": 6, "trainer.eval_every": 6})
    resumed = make_trial(root / "resumed", **{"trainer.max_steps": 6, "trainer.eval_every": 6})
    codes = [torchrun(straight, nproc=4), torchrun(resumed, nproc=4, HPCSWEEP_FAULT="stop,step=3,rank=0"),
             torchrun(resumed, nproc=4)]
    return straight, resumed, codes


def test_four_ranks_stop_and_resume_bit_exactly_with_fixed_buckets(four_rank_runs):
    straight, resumed, codes = four_rank_runs
    assert codes == [0, 1, 0]
    done, reference = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["step"], done["restarts"], done["world_size"], done["deterministic"]) == (
        "completed", 6, 1, 4, True)
    assert done["weights_sha256"] == reference["weights_sha256"]


def test_no_rank_searches_for_unused_parameters(four_rank_runs):
    straight, resumed, _ = four_rank_runs
    for trial in (straight, resumed):
        logs = (trial / "torchrun.err").read_text() + "".join(
            path.read_text() for path in (trial / "logs").glob("rank*.log"))
        assert UNUSED_SEARCH_WARNING not in logs
