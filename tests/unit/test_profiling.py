"""Profiler traces: the step windows, the request file, a CPU trial's traces, the command's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import record_function

from hpcsweep import profile, status
from hpcsweep.config import trial_config_from_dict
from hpcsweep.control import profile_request
from hpcsweep.train import worker as train
from hpcsweep.train.observe.profiling import StepProfiler, Window, profiler_options, request_window, window_from
from hpcsweep.train.trainer import Trainer
from hpcsweep.trial.identity import config_differences

from .sweep_fixtures import make_sweep, metrics
from .trial_dirs import make_trial_dir, read_metrics, trial_config

torch.set_num_threads(1)

TINY = {
    "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
    "trainer.max_steps": 5, "trainer.warmup_steps": 0, "trainer.eval_every": 5, "trainer.eval_batches": 1,
    "trainer.ckpt_every": 0, "trainer.log_every": 5,
}
PERFETTO_EVENT_KEYS = {"ph", "ts", "name", "pid", "tid"}


def step_labels(trace: Path) -> list[str]:
    """The ``step N`` labels of a trace, in order, after checking it is Perfetto's JSON trace format."""
    events = json.loads(trace.read_text())["traceEvents"]
    timed = [e for e in events if e["ph"] == "X"]
    assert timed and all(PERFETTO_EVENT_KEYS <= e.keys() for e in timed)
    return [e["name"] for e in sorted(timed, key=lambda e: e["ts"]) if e["name"].startswith("step ")]


# ----- which steps -------------------------------------------------------------------------------


def test_a_window_is_taken_from_its_start_or_for_its_remaining_steps_and_never_once_passed():
    window = Window(3, 5)
    assert [window_from(window, step) for step in (2, 3, 4, 5, 6)] == [
        None, Window(3, 5), Window(4, 5), Window(5, 5), None]
    assert window_from(None, 3) is None


def test_a_request_covers_the_next_steps_as_many_as_the_trial_has_left():
    assert request_window(4, 3, max_steps=100) == Window(5, 7)
    assert request_window(98, 5, max_steps=100) == Window(99, 100)
    assert request_window(4, 0, max_steps=100) is None


def test_the_profiler_records_cuda_kernels_and_a_memory_snapshot_only_on_cuda():
    cpu, cuda = profiler_options("cpu", memory=True, stacks=False), profiler_options("cuda", memory=True, stacks=True)
    assert (cpu.activities(), cpu.profile_memory, cpu.memory_snapshot, cpu.with_stack) == (
        [torch.profiler.ProfilerActivity.CPU], True, False, False)
    assert (cuda.activities(), cuda.memory_snapshot, cuda.with_stack) == (
        [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], True, True)
    assert not profiler_options("cuda", memory=False, stacks=False).memory_snapshot


@pytest.mark.parametrize("steps", [[3], [4, 3], [0, 2], [3, 9], [1, 2, 3]])
def test_a_bad_profile_window_is_refused_naming_the_key(steps):
    with pytest.raises(ValueError, match=r"trainer.profile_steps=.* is not allowed: null or \[START, END\].*"
                                         r"1 <= START <= END <= trainer.max_steps=8"):
        trial_config_from_dict({"trainer": {"max_steps": 8, "profile_steps": steps}})
    with pytest.raises(ValueError, match="trainer.profile_steps"):
        trial_config_from_dict({"trainer": {"profile_steps": ["a", 2]}})


def test_profile_settings_may_change_when_a_trial_resumes():
    stored = trial_config({})
    now = trial_config({"trainer.profile_steps": [3, 4], "trainer.profile_memory": True, "trainer.profile_stacks": True})
    assert config_differences(stored, now) == []


# ----- the request file --------------------------------------------------------------------------


def test_a_request_file_round_trips_and_a_bad_one_is_refused(tmp_path):
    written = profile_request.write_request(tmp_path, 3)
    assert profile_request.read_request(tmp_path) == written and written.steps == 3
    profile_request.remove_request(tmp_path)
    assert profile_request.read_request(tmp_path) is None
    for text in ("{", '{"id": "a", "steps": 3}', '{"id": "a", "steps": 0, "requested_at": 1}',
                 '{"id": "a", "steps": true, "requested_at": 1}', "[]"):
        with pytest.raises(ValueError):
            profile_request.parse_request(text)
    for steps in (0, profile_request.MAX_REQUEST_STEPS + 1, 2.0, "3", True):
        with pytest.raises(ValueError, match=f"--steps={steps!r} is not allowed: an integer from 1 to 20"):
            profile_request.check_request_steps(steps)


def test_a_done_file_names_the_request_and_a_torn_one_reads_as_none(tmp_path):
    done = profile_request.ProfileDone(id="x", steps=(2, 3), traces=("profile/steps-2-3/rank0.json",), cut_short=True)
    profile_request.write_done(tmp_path, done)
    assert profile_request.read_done(tmp_path) == done
    profile_request.done_path(tmp_path).write_text('{"id": "x"')
    assert profile_request.read_done(tmp_path) is None


# ----- a CPU trial -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiled_trial(tmp_path_factory) -> Path:
    """One trial with ``trainer.profile_steps=[3,4]``, run to the end in this process."""
    trial = make_trial_dir(tmp_path_factory.mktemp("profiled") / "trial", {**TINY, "trainer.profile_steps": [3, 4]})
    assert train.run_trial(trial) == train.EXIT_OK
    return trial


def test_profile_steps_write_a_perfetto_trace_of_exactly_those_steps(profiled_trial):
    assert step_labels(profiled_trial / "profile" / "steps-3-4" / "rank0.json") == ["step 3", "step 4"]
    assert [p.relative_to(profiled_trial).as_posix() for p in (profiled_trial / "profile").rglob("*")] == [
        "profile/steps-3-4", "profile/steps-3-4/rank0.json"]
    report = read_metrics(profiled_trial)
    assert report["status"] == "completed"
    assert report["profile"] == {"steps": [3, 4], "traces": ["profile/steps-3-4/rank0.json"]}


def test_status_shows_where_a_trials_traces_are(profiled_trial):
    text, _ = status.render_status(profiled_trial)
    assert f"profile: {profiled_trial}/profile/steps-3-4/ (Perfetto traces, one per rank)" in text


def test_a_resumed_trial_takes_the_rest_of_a_window_it_stopped_inside(tmp_path, monkeypatch):
    trial = make_trial_dir(tmp_path / "t", {**TINY, "trainer.profile_steps": [3, 5]})
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=4,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    assert step_labels(trial / "profile" / "steps-3-4" / "rank0.json") == ["step 3", "step 4"]
    assert read_metrics(trial)["profile"]["steps"] == [3, 4]
    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(trial) == train.EXIT_OK
    assert step_labels(trial / "profile" / "steps-5-5" / "rank0.json") == ["step 5"]
    assert read_metrics(trial)["profile"] == {"steps": [5, 5], "traces": ["profile/steps-5-5/rank0.json"]}
    assert "profile of steps 3-5: taking steps 5-5, the rest of it" in (trial / "train.log").read_text()


def test_a_trial_that_fails_inside_a_window_writes_the_trace_up_to_its_failing_step(tmp_path, monkeypatch):
    trial = make_trial_dir(tmp_path / "t", {**TINY, "trainer.profile_steps": [2, 5]})
    real_step = Trainer.train_step

    def fails_in_step_4(self):
        if self.step == 3:
            with record_function("the failing part"):
                raise RuntimeError("CUDA out of memory (a stand-in)")
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", fails_in_step_4)
    assert train.run_trial(trial) == train.EXIT_FAILED
    trace = trial / "profile" / "steps-2-4" / "rank0.json"
    assert step_labels(trace) == ["step 2", "step 3", "step 4"]
    assert "the failing part" in {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
    report = read_metrics(trial)
    assert report["status"] == "failed" and "CUDA out of memory (a stand-in)" in report["error"][-1]
    assert report["profile"] == {"steps": [2, 4], "traces": ["profile/steps-2-4/rank0.json"], "failed_step": 4}
    assert "(cut short by a failure in or after step 4)" in (trial / "train.log").read_text()


def test_a_resumed_trial_does_not_take_a_window_it_has_passed(tmp_path, monkeypatch):
    trial = make_trial_dir(tmp_path / "t", {**TINY, "trainer.profile_steps": [1, 2]})
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=3,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(trial) == train.EXIT_OK
    assert [p.name for p in (trial / "profile").iterdir()] == ["steps-1-2"]
    assert "profile of steps 1-2: passed before this run began at step 4, not taken again" in (
        trial / "train.log").read_text()


def test_a_trial_takes_a_request_for_its_next_steps_and_answers_it(tmp_path):
    trial = make_trial_dir(tmp_path / "t", TINY)
    request = profile_request.write_request(trial, 2)
    assert train.run_trial(trial) == train.EXIT_OK
    # Seen at the first step boundary: the next two steps.
    assert step_labels(trial / "profile" / "steps-2-3" / "rank0.json") == ["step 2", "step 3"]
    assert profile_request.read_done(trial) == profile_request.ProfileDone(
        id=request.id, steps=(2, 3), traces=("profile/steps-2-3/rank0.json",))
    assert not profile_request.request_path(trial).exists()
    assert read_metrics(trial)["profile"]["steps"] == [2, 3]


def test_a_request_rank_0_cannot_read_is_dropped_with_a_warning(tmp_path, caplog):
    profiler = StepProfiler(trial_config_from_dict({}).trainer, tmp_path, rank=0, world_size=2,
                            device=torch.device("cpu"), is_reader=True, on_trace=lambda summary: None)
    profile_request.request_path(tmp_path).parent.mkdir()
    profile_request.request_path(tmp_path).write_text('{"steps": 3}')
    assert profiler.asked_steps() == 0
    assert not profile_request.request_path(tmp_path).exists()
    assert "not a profile request (KeyError" in caplog.text
    # Only rank 0 reads: the others ask for nothing, and follow what the stop check agrees on.
    profile_request.write_request(tmp_path, 3)
    other = StepProfiler(trial_config_from_dict({}).trainer, tmp_path, rank=1, world_size=2,
                         device=torch.device("cpu"), is_reader=False, on_trace=lambda summary: None)
    assert (other.asked_steps(), profiler.asked_steps()) == (0, 3)


# ----- the command -------------------------------------------------------------------------------


def running_sweep(path: Path) -> Path:
    """A local sweep whose trial 0 is running at step 4 of 8, and trial 1 completed."""
    make_sweep(path, [(["model.lr=1e-4"], metrics("running", step=4)), (["model.lr=1e-3"], metrics("completed"))])
    return path


def test_the_command_writes_a_request_the_trial_reads(tmp_path, capsys):
    sweep = running_sweep(tmp_path / "sweep")
    assert profile.main([str(sweep), "--trial", "0", "--steps", "3"]) == 0
    assert profile_request.read_request(sweep / "0").steps == 3
    assert f"asked trial #0 to profile its next 3 step(s); traces go to {sweep / '0' / 'profile'}/" in capsys.readouterr().out


@pytest.mark.parametrize("argv, refusal", [
    (["--trial", "7"], "profile refused: no trial #7 in {sweep} (its trials: 0, 1)"),
    (["--trial", "1"], "profile refused: trial #1 is completed, not running: only a running trial reads profile requests"),
])
def test_the_command_refuses_a_trial_that_is_not_there_or_not_running(tmp_path, capsys, argv, refusal):
    sweep = running_sweep(tmp_path / "sweep")
    assert profile.main([str(sweep), *argv]) == profile.EXIT_REFUSED
    assert capsys.readouterr().err.strip() == refusal.format(sweep=sweep)
    assert not list(sweep.glob("*/profile"))


@pytest.mark.parametrize("steps", ["0", "21", "x"])
def test_the_command_refuses_bad_steps_before_it_asks(tmp_path, capsys, steps):
    sweep = running_sweep(tmp_path / "sweep")
    with pytest.raises(SystemExit) as exit_:
        profile.main([str(sweep), "--trial", "0", "--steps", steps])
    assert exit_.value.code == profile.EXIT_REFUSED
    shown = repr(int(steps)) if steps.isdigit() else repr(steps)
    assert f"argument --steps: {shown} is not allowed: an integer from 1 to 20" in capsys.readouterr().err
    assert not (sweep / "0" / "profile").exists()


def test_waiting_ends_with_the_traces_once_all_are_written_or_says_why_not(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "POLL_S", 0.01)
    sweep = running_sweep(tmp_path / "sweep")
    trial = sweep / "0"
    request = profile_request.write_request(trial, 2)
    traces = ("profile/steps-5-6/rank0.json", "profile/steps-5-6/rank1.json")
    profile_request.write_done(trial, profile_request.ProfileDone(id=request.id, steps=(5, 6), traces=traces))
    (trial / "profile" / "steps-5-6").mkdir(parents=True)
    (trial / traces[0]).write_text("{}")
    assert profile.wait_for_traces(trial, request.id, timeout_s=0.1).startswith("no traces after 0.1 s")
    (trial / traces[1]).write_text("{}")
    assert profile.wait_for_traces(trial, request.id, timeout_s=0.1).traces == traces
    assert profile.wait_for_traces(trial, "another request", timeout_s=0.1).startswith("no traces")
    (trial / "metrics.json").write_text(json.dumps(metrics("stopped")))
    assert profile.wait_for_traces(trial, "another request", timeout_s=60) == (
        "the trial ended (stopped) before its traces were written")

