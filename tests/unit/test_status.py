"""status: progress, ETA, squeue parsing, exit status on failures."""

from __future__ import annotations

from hpcsweep import status
from hpcsweep.job_states import parse_squeue
from hpcsweep.status import eta_seconds, format_duration, progress_bar, tokens_per_step

from .sweep_fixtures import CONFIG, make_sweep, metrics


def test_progress_bar():
    assert progress_bar(5, 10, width=10) == "[#####.....]"
    assert progress_bar(10, 10, width=4) == "[####]"
    assert progress_bar(None, 10, width=3) == "[...]"


def test_eta_from_throughput():
    step_tokens = tokens_per_step(CONFIG, world_size=2)
    assert step_tokens == 4 * 32 * 1 * 2
    assert eta_seconds(4, 8, tokens_per_s=256.0, step_tokens=step_tokens) == 4.0
    assert eta_seconds(4, 8, tokens_per_s=None, step_tokens=step_tokens) is None
    assert format_duration(3725) == "1h02m" and format_duration(75) == "1m15s" and format_duration(None) == "-"


def test_parse_squeue():
    states = parse_squeue("12_0|RUNNING|node[1-2]\n12_[1-2]|PENDING|\n")
    assert states["12_0"].nodes == "node[1-2]" and states["12_0"].elapsed_s is None
    assert states["12_2"].state == "PENDING"


def test_status_lines_and_exit_codes(tmp_path, capsys):
    ok_dir, failed_dir = tmp_path / "ok", tmp_path / "failed"
    make_sweep(ok_dir, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], metrics("running", step=4))])
    assert status.main([str(ok_dir)]) == 0
    out = capsys.readouterr().out
    assert "2 trials, 1 completed, 1 running" in out
    assert "[##########..........]" in out and "eta   0m01s" in out  # (8-4) steps x 256 tokens / 1000 tok/s

    oom = ["Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory."]
    make_sweep(failed_dir, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], metrics("failed", error=oom))])
    (failed_dir / "1" / "train.log").write_text("step 1 loss 3.0\n")
    assert status.main([str(failed_dir), "--follow", "--interval", "0", "--logs", "1"]) == 1
    out = capsys.readouterr().out
    assert "error: out of memory: set trainer.grad_checkpointing=true or reduce data.batch_size" in out
    assert "train.log <==\nstep 1 loss 3.0" in out
