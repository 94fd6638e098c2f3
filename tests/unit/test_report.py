"""report: sacct parsing, statuses, failure lines, sorting, CSV/Markdown/PNG from a synthetic sweep."""

from __future__ import annotations

import csv
import io

import pytest

from hpcsweep import report
from hpcsweep.results.event_reader import ScalarSeries
from hpcsweep.results.failure import OOM_ADVICE, summarize_error
from hpcsweep.results.plot import sweep_figure, wants_log_axis
from hpcsweep.results.table import TrialRow, load_sweep, sort_rows, trial_status
from hpcsweep.slurm.cluster_info import gpus_from_tres
from hpcsweep.slurm.job_states import JobState, expand_task_ids, parse_sacct

from .sweep_fixtures import make_sweep, metrics
from .tb_fixtures import log_scalars, write_hydra_record

SACCT = """\
57_0|COMPLETED|3600|billing=16,cpu=16,gres/gpu=8,gres/gpu:a100=8,mem=200G,node=2|gpu[01-02]
57_1|CANCELLED by 1000|1800|billing=8,cpu=8,gres/gpu:a100=4,node=1|gpu03
57_2|RUNNING|60|billing=1,cpu=1,node=1|node1
57_[3-5,7%2]|PENDING|0||None assigned
"""


def test_parse_sacct():
    states = parse_sacct(SACCT)
    assert states["57_0"] == JobState("57_0", "COMPLETED", 3600, 8, "gpu[01-02]", used_hours=8.0, units=8)
    assert states["57_0"].gpu_hours == 8.0
    assert states["57_1"].state == "CANCELLED" and states["57_1"].failed and states["57_1"].gpus == 4
    assert states["57_2"].gpu_hours == 0.0 and states["57_2"].active
    assert sorted(k for k, s in states.items() if s.state == "PENDING") == ["57_3", "57_4", "57_5", "57_7"]
    assert states["57_7"].nodes == ""


def test_parse_sacct_sums_the_runs_of_a_requeued_task():
    text = (
        "60_0|PREEMPTED|600|cpu=8,gres/gpu=8,node=1|gpu01\n"
        "60_0|REQUEUED|300|cpu=8,gres/gpu=8,node=1|gpu02\n"
        "60_0|COMPLETED|900|cpu=8,gres/gpu=8,node=1|gpu03\n"
    )
    state = parse_sacct(text)["60_0"]
    assert (state.state, state.elapsed_s, state.nodes) == ("COMPLETED", 1800, "gpu03")
    assert state.gpu_hours == 4.0


def test_gpus_and_array_ranges():
    assert gpus_from_tres("cpu=1,node=1") == 0
    assert gpus_from_tres("gres/gpu=2,gres/gpu:a100=2") == 2
    assert expand_task_ids("9_[0-1,4]") == ["9_0", "9_1", "9_4"]
    assert expand_task_ids("9_3") == ["9_3"]


@pytest.mark.parametrize(
    ("metrics_status", "state", "on_slurm", "expected"),
    [
        ("completed", "COMPLETED", True, "completed"),
        ("completed", "TIMEOUT", True, "completed"),
        ("running", "TIMEOUT", True, "failed"),
        ("running", "RUNNING", True, "running"),
        ("running", "PENDING", True, "pending"),  # requeued after preemption
        (None, "PENDING", True, "pending"),
        (None, "COMPLETED", True, "failed"),  # ended without ever reporting
        ("failed", "COMPLETED", True, "failed"),
        (None, None, True, "pending"),
        (None, None, False, "pending"),
        ("running", None, False, "running"),
        ("stopped_early", None, False, "stopped_early"),
    ],
)
def test_trial_status(metrics_status, state, on_slurm, expected):
    job = JobState("1_0", state) if state else None
    assert trial_status(metrics_status, job, on_slurm) == expected


def test_summarize_error():
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: data.seq_len=32 is not allowed\n"
    assert summarize_error(traceback) == "ValueError: data.seq_len=32 is not allowed"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert summarize_error(oom) == OOM_ADVICE
    assert "trainer.grad_checkpointing=true" in OOM_ADVICE and "data.batch_size" in OOM_ADVICE
    slurm = "step 10 loss 3.2\nslurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n"
    assert "DUE TO TIME LIMIT" in summarize_error(slurm)
    assert summarize_error("just a line\n\n") == "just a line"
    assert summarize_error("") == ""


def make_mixed_sweep(tmp_path):
    return make_sweep(
        tmp_path,
        [
            (["model.lr=1e-4", "trainer.max_steps=8"], metrics("completed", best=3.0)),
            (["model.lr=1e-3", "trainer.max_steps=8"], metrics("failed", step=3, best=None,
                                                               error=["Traceback:", "RuntimeError: NCCL timeout"])),
            (["model.lr=3e-3", "trainer.max_steps=8"], metrics("completed", best=2.5)),
            (["model.lr=1e-2", "trainer.max_steps=8"], None),
        ],
    )


def test_rows_sorted_failed_last_with_error(tmp_path):
    make_mixed_sweep(tmp_path)
    sweep = load_sweep(tmp_path)
    rows = sort_rows(sweep.rows, "best_val_loss")
    assert [(r.num, r.status) for r in rows] == [(2, "completed"), (0, "completed"), (3, "pending"), (1, "failed")]
    assert rows[-1].error == "RuntimeError: NCCL timeout"
    # Its own share: 1 h wall x world size 2; allocated: no usage.json, so unknown (not its own share).
    assert rows[0].own_gpu_hours == 2.0 and rows[0].gpu_hours is None
    assert [r.num for r in sort_rows(sweep.rows, "best_val_loss", descending=True)][:2] == [0, 2]


def test_slurm_rows_use_one_query_for_every_array(tmp_path):
    make_sweep(tmp_path, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], None)], launcher="slurm")
    calls = []

    def query(ids):
        calls.append(list(ids))
        return parse_sacct("41_0|COMPLETED|7200|cpu=1,gres/gpu=4,node=1|gpu01\n41_1|PENDING|0||None assigned\n")

    rows = load_sweep(tmp_path, query=query).rows
    assert calls == [["41"]]
    assert rows[0].gpu_hours == 8.0 and rows[0].nodes == "gpu01"
    assert rows[1].status == "pending" and rows[1].slurm_state == "PENDING"


def test_report_cli_csv_markdown_plot(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    make_mixed_sweep(sweep_dir)
    out_csv, out_png = tmp_path / "r.csv", tmp_path / "r.png"
    assert report.main([str(sweep_dir), "--csv", str(out_csv), "--plot", str(out_png), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("| # | model.lr | status |")
    assert "- #1 failed: RuntimeError: NCCL timeout" in text
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [r["num"] for r in rows] == ["2", "0", "3", "1"]
    assert rows[0]["model.lr"] == "3e-3" and rows[0]["trainer.max_steps"] == "8"
    assert out_png.stat().st_size > 1000
    assert report.main([str(sweep_dir)]) == 0
    assert "#1 failed: RuntimeError: NCCL timeout" in capsys.readouterr().out
    assert report.main([str(tmp_path)]) == 2


def test_log_axis_for_positive_values_spanning_a_decade_or_more():
    assert wants_log_axis([1e-4, 3e-3])
    assert wants_log_axis([1e-4, 3e-4, 1e-3])  # exactly one decade
    assert wants_log_axis([3e-5, 3e-4])  # 9.999999999999998 in floating point
    assert not wants_log_axis([1.0, 5.0])
    assert not wants_log_axis([1.0, 9.9])
    assert not wants_log_axis([0.0, 100.0])
    assert not wants_log_axis([-1e-3, 1e-3])
    assert not wants_log_axis([])


def test_figure_uses_a_log_axis_for_a_learning_rate_and_counts_the_curves_it_draws():
    lrs, batches = ["1e-4", "3e-4", "1e-3"], ["8", "16", "32"]
    rows = [
        TrialRow(num=i, overrides={"model.lr": lr, "data.batch_size": bs}, status="completed", best_val_loss=3.0 - i)
        for i, (lr, bs) in enumerate(zip(lrs, batches))
    ]
    scalars = {i: {"val/loss": ScalarSeries(steps=[1, 2], wall_times=[0.0, 1.0], values=[4.0, 3.0 - i])}
               for i in range(3)}
    fig = sweep_figure(rows, scalars, ["model.lr", "data.batch_size"], "best_val_loss", top=5)
    lr_axis, batch_axis, curves = fig.axes
    assert lr_axis.get_xscale() == "log" and batch_axis.get_xscale() == "linear"
    assert curves.get_title() == "top 3 by best_val_loss" and len(curves.lines) == 3
    fig = sweep_figure(rows, {0: scalars[0]}, ["model.lr"], "best_val_loss", top=2)
    assert fig.axes[-1].get_title() == "top 1 by best_val_loss"  # the others have no curve yet
    assert sweep_figure(rows, scalars, ["model.lr"], "best_val_loss", top=2).axes[-1].get_title() == (
        "top 2 by best_val_loss")
    import matplotlib.pyplot as plt  # after sweep_figure chose the Agg backend

    plt.close("all")


def test_the_figure_plots_a_task_score_for_every_trial_pruned_ones_marked_and_its_curves():
    """A search that maximised a task score: its panels show that score (not best_val_loss), pruned
    trials included and marked, and the curves are the score's own (tasks/NAME/METRIC)."""
    rows = [
        TrialRow(num=1, overrides={"model.lr": "1e-3"}, status="completed", best_val_loss=2.5,
                 task_scores={"tasks.capitals.acc": 0.875}),
        TrialRow(num=0, overrides={"model.lr": "1e-4"}, status="completed", best_val_loss=2.0,
                 task_scores={"tasks.capitals.acc": 0.25}),
        TrialRow(num=2, overrides={"model.lr": "1e-2"}, status="pruned", best_val_loss=None,
                 task_scores={"tasks.capitals.acc": 0.5}),
    ]
    scalars = {i: {"tasks/capitals/acc": ScalarSeries(steps=[10, 20], wall_times=[0.0, 1.0], values=[0.25, 0.5]),
                   "val/loss": ScalarSeries(steps=[10, 20], wall_times=[0.0, 1.0], values=[3.0, 2.0])}
               for i in range(3)}
    fig = sweep_figure(rows, scalars, ["model.lr"], "tasks.capitals.acc", top=2)
    lr_axis, curves = fig.axes
    trials, pruned = lr_axis.collections
    assert trials.get_offsets().tolist() == [[1e-3, 0.875], [1e-4, 0.25]]
    assert pruned.get_offsets().tolist() == [[1e-2, 0.5]]
    assert lr_axis.get_ylabel() == "tasks.capitals.acc"
    assert [t.get_text() for t in lr_axis.get_legend().get_texts()] == ["trial", "pruned (value when pruned)"]
    assert curves.get_title() == "top 2 by tasks.capitals.acc" and curves.get_ylabel() == "tasks/capitals/acc"
    assert [list(line.get_ydata()) for line in curves.lines] == [[0.25, 0.5], [0.25, 0.5]]
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ("tasks.capitals.acc", True)),  # the search's objective, in its direction
        (["--sort", "best_val_loss"], ("best_val_loss", False)),
        (["--metric", "val_loss"], ("val_loss", False)),
    ],
)
def test_a_search_report_sorts_and_plots_by_its_objective_unless_told_otherwise(argv, expected):
    from hpcsweep.results.search_report import SearchSummary

    search = SearchSummary("tasks.capitals.acc", "maximize", [], None, {})
    keys = ["best_val_loss", "val_loss", "tasks.capitals.acc"]
    assert report.sort_order(report.parse_args(["sweep", *argv]), search, keys) == expected
    assert report.sort_order(report.parse_args(["sweep"]), None, keys) == ("best_val_loss", False)


def test_top_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "--top", "0"])
    assert "--top=0 is not allowed" in capsys.readouterr().err


def test_tok_s_is_the_mean_over_every_attempt_in_old_and_new_trial_dirs(tmp_path, capsys):
    make_sweep(tmp_path, [(["model.lr=1e-4"], metrics("completed", best=3.0, tokens_per_s=400.0)),
                          (["model.lr=1e-3"], metrics("completed", best=2.0, tokens_per_s=200.0))])
    # Trial 0 is from before run names: events directly in tb/, a first attempt and a resumed one.
    log_scalars(tmp_path / "0" / "tb", "perf/tokens_per_s", [(10, 100.0), (20, 100.0)])
    log_scalars(tmp_path / "0" / "tb", "perf/tokens_per_s", [(30, 400.0)])
    # Trial 1 writes its events into the run named by its overrides.
    write_hydra_record(tmp_path / "1", "model.lr=1e-3")
    log_scalars(tmp_path / "1" / "tb" / "model.lr=1e-3", "perf/tokens_per_s", [(10, 200.0), (20, 200.0)])

    rows = {row.num: row for row in load_sweep(tmp_path).rows}
    assert rows[0].mean_tokens_per_s == pytest.approx(3 / (1 / 100 + 1 / 100 + 1 / 400))
    assert rows[0].tokens_per_s == 400.0  # metrics.json's key keeps its meaning: the latest window
    assert rows[1].mean_tokens_per_s == pytest.approx(200.0)

    assert report.main([str(tmp_path), "--csv", str(tmp_path / "r.csv")]) == 0
    header, *lines, total = capsys.readouterr().out.splitlines()
    column = header.split().index("mean")  # the header "mean tok/s" is two words, its cells one
    assert [line.split()[column] for line in lines] == ["200", "133"]
    assert total.startswith("GPU-hours: 0 allocated in all")  # a local sweep without usage.json files
    table = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [(r["mean_tokens_per_s"][:6], r["tokens_per_s"]) for r in table] == [("200.0", "200.0"), ("133.33", "400.0")]


def test_report_shows_the_memory_plan_against_the_measured_peak(tmp_path, capsys):
    measured = {**metrics("completed", best=1.0), "memory_plan": {"tensors_bytes": int(18.5 * 2**30)},
                "memory_peak": {"bytes": int(16.2 * 2**30), "source": "torch.cuda.max_memory_allocated"}}
    make_sweep(tmp_path, [(["model.lr=1e-4"], measured), (["model.lr=1e-3"], metrics("completed"))])
    assert report.main([str(tmp_path)]) == 0
    header, first, second = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[-1] == "GB(plan/peak)"
    assert first.split()[-1] == "18.5/16.2" and second.split()[-1] == "-"


@pytest.mark.parametrize("command", ["hpcsweep.report", "hpcsweep.status"])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly_with_its_files_written(tmp_path, command):
    """``report ... --markdown --csv report.csv | head -5`` ended in BrokenPipeError with no report.csv."""
    import os
    import subprocess
    import sys

    make_sweep(tmp_path / "sweep", [([f"model.lr={lr}"], metrics("completed", best=2.0 + i))
                                    for i, lr in enumerate(["1e-4", "3e-4", "1e-3"])])
    extra = ["--markdown", "--csv", str(tmp_path / "report.csv")] if command == "hpcsweep.report" else []
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    proc = subprocess.Popen([sys.executable, "-m", command, str(tmp_path / "sweep"), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"BrokenPipeError" not in err and b"Traceback" not in err
    if extra:
        assert len((tmp_path / "report.csv").read_text().splitlines()) == 4
