"""The same sweep command after Ctrl-C says that an earlier sweep dir of it holds stopped trials, with the
line that resumes it (issue 31, item 9)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

from hpcsweep.sweep.earlier_sweep import earlier_sweep_line, earlier_sweep_of

from .sweep_fixtures import make_sweep, metrics

OVERRIDES = [["model.lr=1e-4"], ["model.lr=3e-4"]]


def test_the_newest_earlier_sweep_of_the_same_trials_with_unfinished_ones_is_found(tmp_path):
    root = tmp_path / "multirun"
    stopped = metrics("stopped", step=295, last_stop_reason="interrupted")
    make_sweep(root / "2026-12-01" / "10-00-00", [(OVERRIDES[0], stopped), (OVERRIDES[1], metrics("not_started", 0))])
    make_sweep(root / "2026-12-02" / "10-00-00", [(OVERRIDES[0], stopped), (OVERRIDES[1], metrics("completed"))])
    make_sweep(root / "2026-12-02" / "11-00-00", [(["model.lr=1e-2"], stopped)])  # another command
    make_sweep(root / "2026-12-02" / "12-00-00", [(o, metrics("completed")) for o in OVERRIDES])  # nothing to resume
    current = root / "2026-12-03" / "09-00-00"
    make_sweep(current, [(o, None) for o in OVERRIDES])  # this sweep's own sweep.json is never its own earlier one

    earlier = earlier_sweep_of(current, OVERRIDES)
    assert earlier is not None and earlier.sweep_dir == root / "2026-12-02" / "10-00-00"
    assert earlier.unfinished == [(0, "stopped", 295)]
    line = earlier_sweep_line(earlier, ["-m", "model.lr=1e-4,3e-4"], str(tmp_path))
    assert line == ("an earlier sweep of this command, multirun/2026-12-02/10-00-00, holds unfinished trials (#0 "
                    "stopped at step 295); this command starts a new sweep from step 0. To resume that one instead: "
                    "python -m hpcsweep -m model.lr=1e-4,3e-4 hydra.sweep.dir=multirun/2026-12-02/10-00-00")
    assert earlier_sweep_of(current, [["model.lr=1e-4"]]) is None  # the trials must be the same, all of them
    assert earlier_sweep_of(tmp_path / "elsewhere" / "a" / "b", OVERRIDES) is None


TINY = ["hydra/launcher=local", "trainer.device=cpu", "trainer.nproc_per_node=1", "trainer.max_steps=2",
        "trainer.warmup_steps=1", "trainer.eval_every=2", "trainer.eval_batches=1", "trainer.ckpt_every=2",
        "trainer.log_every=1", "data.batch_size=2", "data.seq_len=16", "data.synthetic_tokens=20000",
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1"]


def test_the_same_command_again_prints_the_line_that_resumes_the_stopped_sweep(tmp_path):
    typed = ["model.lr=1e-3", *TINY]
    # The trial's overrides as the sweeper records them in sweep.json: values as Hydra reads them, no hydra/ keys.
    recorded = ["model.lr=0.001", *TINY[1:]]
    # As a Ctrl-C of this command leaves its sweep (tests/unit/test_interrupt_resume.py makes a real one).
    earlier = tmp_path / "multirun" / "2000-01-01" / "00-00-00"
    make_sweep(earlier, [(recorded, metrics("stopped", step=1, last_stop_reason="interrupted"))])
    again = subprocess.run([sys.executable, "-m", "hpcsweep", "-m", *typed], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    (new,) = set(tmp_path.glob("multirun/*/*")) - {earlier}
    assert [t["overrides"] for t in json.loads((new / "sweep.json").read_text())["trials"]] == [recorded]
    (line,) = [line for line in (again.stdout + again.stderr).splitlines() if "an earlier sweep" in line]
    resume = shlex.split(line.split("To resume that one instead: ", 1)[1])
    assert resume == ["python", "-m", "hpcsweep", "-m", *typed, "hydra.sweep.dir=multirun/2000-01-01/00-00-00"]
    assert "(#0 stopped at step 1)" in line


def test_a_command_that_pins_its_sweep_dir_gets_no_line(tmp_path, monkeypatch, caplog):
    from hpcsweep.sweep.earlier_sweep import say_if_an_earlier_sweep_stopped

    root = tmp_path / "multirun"
    make_sweep(root / "2026-12-01" / "10-00-00", [(OVERRIDES[0], metrics("stopped", step=3))])
    monkeypatch.chdir(tmp_path)
    for argv, said in ((["-m", "model.lr=1e-4"], True), (["-m", "model.lr=1e-4", "hydra.sweep.dir=mine"], False)):
        caplog.clear()
        monkeypatch.setattr(sys, "argv", ["hpcsweep", *argv])
        with caplog.at_level("WARNING", logger="hpcsweep.sweep.earlier_sweep"):
            say_if_an_earlier_sweep_stopped(root / "2026-12-03" / "09-00-00", [OVERRIDES[0]])
        assert ("an earlier sweep of this command, multirun/2026-12-01/10-00-00" in caplog.text) is said
