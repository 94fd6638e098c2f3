"""status: progress, ETA, squeue parsing, pending reasons, cancelled/stopped trials, exit statuses."""

from __future__ import annotations

import json
import os

import pytest

from hpcsweep import status
from hpcsweep.slurm.job_states import parse_squeue
from hpcsweep.slurm.pending import NEVER_CLEARS
from hpcsweep.status import eta_seconds, format_duration, progress_bar, tokens_per_step

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
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


SACCT_ONE_PENDING = (
    "41_0|RUNNING|60|billing=64,cpu=64,gres/gpu=8,node=1|node1\n"
    "41_1|PENDING|0||None assigned\n"
)


def pending_sweep(sweep_dir):
    make_sweep(
        sweep_dir,
        [(["model.lr=1e-4"], metrics("running", step=4)), (["model.lr=1e-3"], None)],
        launcher="slurm",
    )


def test_pending_reason_shown_and_one_squeue_only_while_queued(tmp_path, capsys, fake_slurm):
    sweep_dir = tmp_path / "sweep"
    pending_sweep(sweep_dir)
    fake_slurm.answer("sacct", SACCT_ONE_PENDING)
    fake_slurm.answer("squeue", "41_0|RUNNING|node1|None\n41_1|PENDING||Priority\n")
    assert status.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    # One state column: Slurm's PENDING says nothing the status does not, so it is not shown again.
    assert "pending  " in out and "PENDING" not in out and "(Priority)" in out and "never starts" not in out
    assert len(fake_slurm.calls("sacct")) == 1 and fake_slurm.calls("scontrol") == []
    assert fake_slurm.calls("squeue") == ["--noheader --array --jobs 41 --format %i|%T|%N|%r"]

    fake_slurm.answer("sacct", SACCT_ONE_PENDING.replace("PENDING|0||None assigned", "RUNNING|5|cpu=64,node=1|node2"))
    assert status.main([str(sweep_dir)]) == 0
    assert len(fake_slurm.calls("sacct")) == 2 and len(fake_slurm.calls("squeue")) == 1  # nothing queued: no squeue
    assert "(Priority)" not in capsys.readouterr().out


@pytest.mark.parametrize(("color", "red"), [("always", True), ("never", False), ("auto", False)])
def test_follow_stops_on_a_reason_that_never_clears(tmp_path, capsys, fake_slurm, color, red):
    sweep_dir = tmp_path / "sweep"
    pending_sweep(sweep_dir)
    fake_slurm.answer("sacct", SACCT_ONE_PENDING)
    fake_slurm.answer("squeue", "41_1|PENDING||PartitionConfig\n")
    # --interval 3600: a second poll would hang the test, so passing proves --follow stopped at once
    code = status.main([str(sweep_dir), "--follow", "--interval", "3600", f"--color={color}"])
    assert code == status.EXIT_NEVER_STARTS
    out = capsys.readouterr().out
    assert len(fake_slurm.calls("sacct")) == 1
    assert f"never starts: PartitionConfig: {NEVER_CLEARS['PartitionConfig']}" in out
    assert "not following: 1 pending trial(s) can never start as submitted; cancel them (scancel 41_1)" in out
    assert (f"{status.RED}(PartitionConfig){status.RESET}" in out) == red
    assert ("\x1b[" in out) == red  # captured stdout is no terminal: auto means no colour


def test_req_node_not_avail_asks_node_states_once(tmp_path, capsys, fake_slurm):
    sweep_dir = tmp_path / "sweep"
    pending_sweep(sweep_dir)
    fake_slurm.answer("sacct", SACCT_ONE_PENDING)
    fake_slurm.answer("squeue", "41_1|PENDING||ReqNodeNotAvail, UnavailableNodes:node3\n")
    fake_slurm.answer("scontrol", "NodeName=node3 CPUAlloc=0 CPUTot=64 State=IDLE+DRAIN Partitions=batch Reason=gpu\n")
    assert status.main([str(sweep_dir)]) == status.EXIT_NEVER_STARTS
    assert "(node3) are DOWN or DRAINED" in capsys.readouterr().out
    assert fake_slurm.calls("scontrol") == ["show nodes --oneliner"]

    fake_slurm.answer("scontrol", "NodeName=node3 CPUAlloc=0 CPUTot=64 State=IDLE+REBOOT_ISSUED Partitions=batch\n")
    assert status.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "(ReqNodeNotAvail, UnavailableNodes:node3)" in out and "never starts" not in out


def test_cancelled_and_stopped_trials_are_not_failures_but_exit_non_zero(tmp_path, capsys, fake_slurm):
    slurm_dir, local_dir, stopped_dir = tmp_path / "slurm", tmp_path / "local", tmp_path / "stopped"
    pending_sweep(slurm_dir)
    fake_slurm.answer("sacct", "41_0|CANCELLED by 0|60|cpu=64,node=1|node1\n41_1|CANCELLED by 1000|0||None assigned\n")
    # all ended: no second poll (--interval 3600 would hang the test)
    assert status.main([str(slurm_dir), "--follow", "--interval", "3600"]) == status.EXIT_CANCELLED == 4
    out = capsys.readouterr().out
    assert "2 trials, 2 cancelled" in out and "failed" not in out and "error" not in out
    assert fake_slurm.calls("squeue") == []

    stopped = metrics("stopped", step=3, last_stop_reason="interrupted")
    make_sweep(local_dir, [(["model.lr=1e-4"], metrics("cancelled")), (["model.lr=1e-3"], stopped)])
    assert status.main([str(local_dir)]) == status.EXIT_CANCELLED  # cancelled outranks stopped
    out = capsys.readouterr().out
    assert "2 trials, 1 cancelled, 1 stopped" in out and "error" not in out
    make_sweep(stopped_dir, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], stopped)])
    assert status.main([str(stopped_dir)]) == status.EXIT_STOPPED == 5


def test_a_stopped_sweep_ends_with_the_line_that_resumes_it_in_its_own_dir(tmp_path, capsys, fake_slurm,
                                                                           monkeypatch):
    # A Ctrl-C'd local sweep: the same command typed again starts a new sweep dir from step 0
    # (docs/user/sweep.md), so the advice pins this dir, absolute, whatever folder status runs from.
    local_dir = tmp_path / "multirun" / "2026-12-03" / "12-40-00"
    stopped = metrics("stopped", step=3, last_stop_reason="interrupted")
    make_sweep(local_dir, [(["model.lr=1e-4"], stopped), (["model.lr=1e-3"], metrics("not_started", step=0))])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert status.main([os.path.relpath(local_dir, elsewhere)]) == status.EXIT_CANCELLED  # ../multirun/...
    resume = (f"resume: run the sweep's command again with hydra.sweep.dir={local_dir} (the 'resume with:' "
              "line it printed when it stopped); the same command without it starts a new sweep from step 0")
    assert capsys.readouterr().out.splitlines()[-1] == resume
    make_sweep(tmp_path / "one-stopped", [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], stopped)])
    assert status.main([str(tmp_path / "one-stopped")]) == status.EXIT_STOPPED
    assert capsys.readouterr().out.splitlines()[-1] == resume.replace(str(local_dir), str(tmp_path / "one-stopped"))
    assert "hydra.sweep.dir=SWEEP_DIR (the same command without it starts a new sweep from step 0)" in " ".join(
        status.EPILOG.split())

    # A Slurm sweep's stopped trials go back into their dirs with retry; a budget that stopped them is raised.
    slurm_dir = tmp_path / "slurm"
    make_sweep(slurm_dir, [(["model.lr=1e-4"], metrics("stopped", step=3, last_stop_reason="budget")),
                           (["model.lr=1e-3"], metrics("skipped_budget", step=0))], launcher="slurm")
    fake_slurm.answer("sacct", "41_0|COMPLETED|60|cpu=64,gres/gpu=8,node=1|node1\n"
                               "41_1|COMPLETED|1|cpu=64,gres/gpu=8,node=1|node2\n")
    assert status.main([str(slurm_dir)]) == status.EXIT_STOPPED
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"resume: python -m hpcsweep.retry {slurm_dir} --status stopped,skipped_budget; raise "
        "hydra.launcher.budget_gpu_hours above the GPU-hours spent, or the budget stops it again")

    # One trial dir resumes with hydra.run.dir (docs/user/sweep.md), not with a sweep dir.
    assert status.main([str(local_dir / "0")]) == status.EXIT_STOPPED
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"resume: run its command again with hydra.run.dir={local_dir / '0'}"

    # Nothing to say while a trial still runs, nor when every trial finished.
    make_sweep(tmp_path / "running", [(["model.lr=1e-4"], metrics("running", step=4)), (["model.lr=1e-3"], stopped)])
    make_sweep(tmp_path / "done", [(["model.lr=1e-4"], metrics("completed"))])
    assert status.main([str(tmp_path / "running")]) == status.EXIT_STOPPED
    assert status.main([str(tmp_path / "done")]) == 0
    assert "resume:" not in capsys.readouterr().out


def test_a_config_is_parsed_once_per_text_across_polls(tmp_path):
    (tmp_path / "config.yaml").write_text("data: {batch_size: 4, seq_len: 32}\ntrainer: {grad_accum: 2}\n")
    parsed = {}
    assert status.read_step_tokens(tmp_path, 2, parsed) == 4 * 32 * 2 * 2
    first = next(iter(parsed.values()))
    assert status.read_step_tokens(tmp_path, 1, parsed) == 4 * 32 * 2
    assert len(parsed) == 1 and next(iter(parsed.values())) is first  # not parsed again
    (tmp_path / "config.yaml").write_text("data: {batch_size: 8, seq_len: 32}\ntrainer: {grad_accum: 2}\n")
    assert status.read_step_tokens(tmp_path, 1, parsed) == 8 * 32 * 2 and len(parsed) == 2
    assert status.read_step_tokens(tmp_path / "missing", 1, parsed) is None


def test_budget_line_counts_every_attempt_and_flags_80_and_100_percent(tmp_path, capsys, fake_slurm):
    import dataclasses

    from hpcsweep.files.sweep_record import ArrayRecord, write_sweep_record

    sweep_dir = tmp_path / "sweep"
    record = make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("completed")),
                                    (["model.lr=1e-3"], metrics("stopped", step=3, last_stop_reason="budget"))],
                        launcher="slurm")
    # Trial 1 was retried as array 52: its first attempt (41_1) still counts against the budget.
    retried = record.trials[1].retried("52_0", "2026-01-01T02:00:00+00:00")
    write_sweep_record(dataclasses.replace(record, trials=[record.trials[0], retried],
                                           arrays=[*record.arrays, ArrayRecord("52", [1])], budget_gpu_hours=10.0))
    fake_slurm.answer("sacct", "41_0|COMPLETED|3600|cpu=64,gres/gpu=4,node=1|node1\n"
                               "41_1|COMPLETED|1800|cpu=64,gres/gpu=4,node=1|node2\n"
                               "52_0|RUNNING|900|cpu=64,gres/gpu=8,node=1|node3\n")
    assert status.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "budget: 8 / 10 GPU-hours spent (80%)  80% OF BUDGET" in out
    assert "attempt 2" in out.splitlines()[-1] and "attempt" not in out.splitlines()[-2]
    assert fake_slurm.calls("sacct")[0].endswith("--jobs 41,52 --format JobID,State,ElapsedRaw,AllocTRES,NodeList")

    fake_slurm.answer("sacct", "41_0|COMPLETED|3600|cpu=64,gres/gpu=4,node=1|node1\n"
                               "41_1|COMPLETED|1800|cpu=64,gres/gpu=4,node=1|node2\n"
                               "52_0|COMPLETED|3600|cpu=64,gres/gpu=8,node=1|node3\n")
    assert status.main([str(sweep_dir), "--color=always"]) == status.EXIT_STOPPED  # trial 1 stopped by the budget
    assert f"{status.RED}budget: 14 / 10 GPU-hours spent (140%)  BUDGET SPENT{status.RESET}" in capsys.readouterr().out


def test_budget_stopped_and_skipped_trials_are_not_failures_and_exit_5(tmp_path, capsys, fake_slurm):
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("stopped", step=3, last_stop_reason="budget")),
                           (["model.lr=1e-3"], metrics("skipped_budget", step=0))], launcher="slurm")
    fake_slurm.answer("sacct", "41_0|COMPLETED|60|cpu=64,gres/gpu=8,node=1|node1\n"
                               "41_1|COMPLETED|1|cpu=64,gres/gpu=8,node=1|node2\n")
    assert status.main([str(sweep_dir)]) == status.EXIT_STOPPED  # not failures, and not completed either
    out = capsys.readouterr().out
    assert "2 trials, 1 stopped, 1 skipped_budget" in out and "(stopped by the budget)" in out
    trial_lines = [line for line in out.splitlines() if line.startswith("#")]
    assert "COMPLETED" not in out  # a stopped trial's job ends COMPLETED: nothing more to say
    assert len({line.index("[") for line in trial_lines}) == 1, "the columns line up"
    assert "budget: 0.136 GPU-hours spent (no budget)" in out
    assert status.budget_text(0.136, 0.2, color=False, stopped=status.stopped_by_budget(
        status.load_sweep(sweep_dir, with_scalars=False).rows)) == "budget: 0.136 / 0.2 GPU-hours spent (68%)  BUDGET SPENT"


def test_slurm_state_is_shown_labelled_only_where_it_says_more_than_the_status(tmp_path, capsys, fake_slurm):
    """``completed      completed`` (local) and ``completed      RUNNING`` (a job still ending) were two
    unlabelled state columns; now the status, and ``slurm STATE`` where it differs in meaning."""
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], metrics("pruned", step=4))],
               launcher="slurm")
    fake_slurm.answer("sacct", "41_0|RUNNING|60|cpu=64,gres/gpu=8,node=1|node1\n"
                               "41_1|COMPLETED|60|cpu=64,gres/gpu=8,node=1|node2\n")
    status.main([str(sweep_dir)])
    first, second = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#")]
    assert " completed      slurm RUNNING [" in first
    assert " pruned        " in second and "slurm" not in second and "COMPLETED" not in second
    assert first.index("[") == second.index("[")

    local = tmp_path / "local"
    make_sweep(local, [(["model.lr=1e-4"], metrics("completed"))])
    status.main([str(local)])
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#")]
    assert line.count("completed") == 1 and "slurm" not in line


def test_a_local_sweep_on_cpus_counts_cpu_hours_in_status_as_in_report(tmp_path, capsys):
    """status said 'budget: 0.118 GPU-hours spent' where report said 'CPU-hours: 0.118' for one sweep."""
    from hpcsweep import report

    sweep_dir = tmp_path / "sweep"
    # A trial that measured its peak on the CPU (ru_maxrss): no GPU.
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("completed", memory_peak={"bytes": 2 ** 30, "source": "ru_maxrss"}))])
    (sweep_dir / "0" / "usage.json").write_text(json.dumps(
        {"runs": [{"started_at": 0.0, "last_at": 3600.0, "units": 2, "ended": True}]}))
    status.main([str(sweep_dir)])
    shown = capsys.readouterr().out
    report.main([str(sweep_dir)])
    reported = capsys.readouterr().out
    assert "CPU-hours spent (no budget)" in shown and "GPU-hours" not in shown
    assert "CPU-hours: " in reported and "GPU-hours" not in reported


def test_the_slurm_config_hint_names_slurm_conf_only_where_no_configuration_is_found():
    from hpcsweep.results.slurm_config import slurm_config_hint

    files = {"/etc/slurm/slurm.conf"}
    assert slurm_config_hint({}, files.__contains__) is None
    assert slurm_config_hint({"SLURM_CONF": "/etc/slurm/slurm.conf"}, files.__contains__) is None
    unset = slurm_config_hint({}, set().__contains__)
    assert unset.startswith("Slurm's configuration was not found: SLURM_CONF is unset and there is no "
                            "/etc/slurm/slurm.conf; set SLURM_CONF")
    assert 'eval "$(scripts/slurm-cluster env)"' in unset
    assert "SLURM_CONF=/gone/slurm.conf is no file" in slurm_config_hint({"SLURM_CONF": "/gone/slurm.conf"},
                                                                          files.__contains__)


@pytest.fixture
def no_slurm_conf(monkeypatch, tmp_path):
    """A shell without the cluster's environment: no SLURM_CONF, and no default slurm.conf."""
    from hpcsweep.results import slurm_config

    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_config, "DEFAULT_CONFS", (str(tmp_path / "etc" / "slurm.conf"),))


def test_status_report_and_retry_without_slurm_conf_say_so(tmp_path, capsys, fake_slurm, no_slurm_conf):
    """'squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host' and 'spending unknown
    (accounting did not answer)' were all status said in a shell without SLURM_CONF."""
    from hpcsweep import report, retry

    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("failed", step=2))], launcher="slurm")
    # No answer set: each fake command fails, as Slurm's do without a configuration.
    status.main([str(sweep_dir)])
    out = capsys.readouterr().out
    assert "(no Slurm states: " in out
    assert "Slurm's configuration was not found: SLURM_CONF is unset" in out and "scripts/slurm-cluster env" in out
    report.main([str(sweep_dir)])
    assert "Slurm's configuration was not found: SLURM_CONF is unset" in capsys.readouterr().err
    assert retry.main([str(sweep_dir)]) == retry.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "retry refused: " in err and "Slurm's configuration was not found: SLURM_CONF is unset" in err


def test_no_hint_where_slurm_conf_names_a_file(tmp_path, capsys, fake_slurm, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [(["model.lr=1e-4"], metrics("failed", step=2))], launcher="slurm")
    status.main([str(sweep_dir)])
    out = capsys.readouterr().out
    assert "(no Slurm states: " in out and "configuration was not found" not in out
