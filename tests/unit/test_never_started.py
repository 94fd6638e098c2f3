"""A trial whose run never started says why in report and status, and status exits non-zero for it; Ctrl-C of
--follow ends quietly with 130 (issue 31: "A trial whose run never started says why", "Exit codes", item 4)."""

from __future__ import annotations

import dataclasses

from hpcsweep import report, status
from hpcsweep.files.sweep_record import TokenPreparationRecord, write_sweep_record
from hpcsweep.results.failure import summarize_error, trial_error_text
from hpcsweep.results.never_started import never_started_line

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
from .sweep_fixtures import make_sweep, metrics

PREP_LAST_LINE = "token preparation failed: the tokenizer in /m has no eos_token to put between documents"


def sweep_waiting_on_a_failed_preparation(sweep_dir, fake_slurm):
    """Two trials Slurm cancelled because their token preparation job (40) failed; neither ever ran."""
    record = make_sweep(sweep_dir, [(["model.lr=1e-4"], None), (["model.lr=1e-3"], None)], launcher="slurm")
    log = sweep_dir / ".token-preparation" / "prepare-40.log"
    log.parent.mkdir()
    log.write_text("2026-01-01 hpcsweep: tokenizing\n" + PREP_LAST_LINE + "\n")
    write_sweep_record(dataclasses.replace(record, token_preparation=TokenPreparationRecord("40", str(log), ["e"])))
    fake_slurm.answer("sacct", "40|FAILED|3|cpu=8,node=1|node1\n41_0|CANCELLED by 0|0||None assigned\n"
                               "41_1|CANCELLED by 0|0||None assigned\n")
    return log


def test_a_trial_cancelled_for_its_failed_token_preparation_says_why(tmp_path, capsys, fake_slurm):
    sweep_dir = tmp_path / "sweep"
    sweep_waiting_on_a_failed_preparation(sweep_dir, fake_slurm)
    why = ("never started: its token preparation job 40 ended FAILED, so the dependency it waited on can never be "
           f"satisfied: {PREP_LAST_LINE}")
    assert status.main([str(sweep_dir), "--follow", "--interval", "3600"]) == status.EXIT_CANCELLED
    out = capsys.readouterr().out
    assert out.count(f"why: {why}") == 2 and "no error recorded" not in out
    assert "--jobs 41 " in fake_slurm.calls("sacct")[0] and "--jobs 40 " in fake_slurm.calls("sacct")[1]
    assert report.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert f"#0 cancelled: {why}" in out and f"#1 cancelled: {why}" in out and "no error recorded" not in out


def test_the_error_the_preparation_wrote_into_metrics_json_comes_first():
    recorded = {"status": "not_started", "step": 0, "error": "never started: token preparation: data.seq_len=64 is "
                "not allowed: at most 34: the corpus holds 701 tokens"}
    assert never_started_line(recorded, "40", "FAILED", "whatever") == recorded["error"]
    assert never_started_line(None, "40", "COMPLETED", None) == ""  # cancelled by a person, after the preparation
    assert never_started_line(None, None, None, None) == ""
    assert never_started_line(None, "40", "TIMEOUT", None).endswith("ended TIMEOUT, so the dependency it waited on "
                                                                    "can never be satisfied")


def test_a_config_refused_where_the_trial_runs_is_its_error_not_no_error_recorded(tmp_path):
    trial_dir = tmp_path / "0"
    trial_dir.mkdir()
    (trial_dir / "hpcsweep.log").write_text(
        "[2026-01-01 00:00:00,000][hpcsweep.sweep.sweep_trials][ERROR] - data.seq_len=64 is not allowed: at most 34: "
        "data.files='corpus/*' holds 701 tokens; the trial did not run\n")
    text = trial_error_text(trial_dir, tmp_path, None, None)
    assert summarize_error(text) == ("data.seq_len=64 is not allowed: at most 34: data.files='corpus/*' holds 701 "
                                     "tokens; the trial did not run")


def test_a_failure_no_log_explains_names_slurms_end_state(tmp_path, capsys, fake_slurm):
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("running", step=2))], launcher="slurm")
    fake_slurm.answer("sacct", "41_0|TIMEOUT|60|cpu=64,node=1|node1\n")
    assert status.main([str(sweep_dir)]) == status.EXIT_FAILED
    assert "error: no log line says why; Slurm ended its task TIMEOUT" in capsys.readouterr().out
    report.main([str(sweep_dir)])
    assert "#0 failed: no log line says why; Slurm ended its task TIMEOUT" in capsys.readouterr().out


def test_ctrl_c_of_follow_ends_quietly_with_130(tmp_path, capsys, monkeypatch):
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("running", step=2))])

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", interrupted)
    assert status.main([str(sweep_dir), "--follow", "--interval", "5"]) == status.EXIT_INTERRUPTED == 130
    captured = capsys.readouterr()
    assert "1 running" in captured.out and "Traceback" not in captured.out + captured.err


def test_every_exit_status_is_in_the_help_and_in_the_results_page():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "user" / "results.md").read_text()
    for code in (0, 1, 2, status.EXIT_NEVER_STARTS, status.EXIT_CANCELLED, status.EXIT_STOPPED, 130):
        assert f"\n  {code}  " in status.EPILOG
        assert f"| {code} |" in page
