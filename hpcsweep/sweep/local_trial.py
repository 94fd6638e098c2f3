"""One trial of a local sweep in a process of its own: the sweep starts it, it runs the trial, and
says how it ended in a file.

A trial process starts from the sweep's environment, not from the last trial's: the variables a
trial sets (NCCL, ``OMP_NUM_THREADS``, the stop file), its threads and its CUDA context end with
it. It runs the trial exactly as Hydra's basic launcher runs it in a sweep (``run_job``: the
``.hydra`` dir, the job's logs and callbacks, its ``JobReturn``).

The process is forked from the sweep's fork server, which has imported torch once, or is a
fresh interpreter, ``python -m hpcsweep.sweep.local_trial SPEC.json`` (``hpcsweep.sweep.fork_server``).
The sweep's Hydra context is pickled once per sweep (``write_sweep_context``), each trial's spec
is a small JSON file, and what the app's hook made of the trial's config when the sweep checked it
is pickled beside it: the task function runs that (``TrialHook.running_checked``).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Union

import cloudpickle

from hpcsweep.files.atomic import atomic_write_bytes, atomic_write_json

CONTEXT_FILE = "hydra_context.pkl"


@dataclass(frozen=True)
class Returned:
    """The trial ran: Hydra's JobReturn for it (failed or not)."""

    job_return: Any


@dataclass(frozen=True)
class Stopped:
    """The trial stopped (a stop signal, with a checkpoint where the app makes one): ``what`` says how."""

    what: str
    code: int


@dataclass(frozen=True)
class NotStarted:
    """A stop signal came before the trial's task function was called."""

    reason: str


@dataclass(frozen=True)
class Exited:
    """The process ended without saying how the trial ended (a crash, a kill, an exit of the task)."""

    returncode: int
    detail: str = ""


TrialOutcome = Union[Returned, Stopped, NotStarted, Exited]


class RunningTrial(Protocol):
    """What the sweep needs of a started trial process (``subprocess.Popen`` has it)."""

    pid: int

    def poll(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal), else None."""

    def wait(self) -> int:
        """Wait for the process to end; its exit status."""

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process if it is still running."""


StartTrial = Callable[[Path, Mapping[str, str], str], RunningTrial]
"""Starts the process of a trial spec with an environment and a name (``fork_server.TrialStarter.start``)."""


def write_sweep_context(folder: Path, hydra_context: Any, config: Any, task_function: Any) -> Path:
    """Pickle what every trial process of the sweep needs from Hydra, once; return the file."""
    from hydra.core.singleton import Singleton

    path = folder / CONTEXT_FILE
    atomic_write_bytes(path, cloudpickle.dumps((hydra_context, config, task_function, Singleton.get_state())))
    return path


@dataclass
class TrialProcess:
    """A started trial process, and where it leaves its outcome."""

    num: int
    process: RunningTrial
    outcome_file: Path

    def outcome(self) -> TrialOutcome:
        """How the trial ended; call once the process has exited."""
        returncode = self.process.wait()
        try:
            with open(self.outcome_file, "rb") as handle:
                return pickle.load(handle)
        except FileNotFoundError:
            return Exited(returncode)
        # What the trial returned may not load here (an exception class with another signature).
        except (pickle.UnpicklingError, AttributeError, ImportError, TypeError, EOFError) as err:
            return Exited(returncode, f"its outcome could not be read back: {err}")


def start_trial(
    start: StartTrial,
    context_file: Path,
    overrides: Sequence[str],
    num: int,
    cpus: Sequence[int],
    env: Mapping[str, str],
    checked: Any = None,
) -> TrialProcess:
    """Start Hydra job ``num`` with ``overrides`` in a new process on ``cpus``, with ``env`` on top of ours;
    the task function runs ``checked``, what the app's hook made of the trial's config in the sweep.

    The process gets a session of its own: a Ctrl-C reaches it once, from the sweep, which passes
    on every stop signal; if the sweep dies without passing one on (SIGKILL), the trial process
    is sent SIGTERM (``stop_with_the_sweep``; forked, ``fork_server.stop_with_the_sweep_from_afar``).
    ``start`` forks it or starts a fresh interpreter. Call with the stop signals blocked
    (``stop.stop_signals_blocked``): the process starts with them blocked and holds a signal until
    it knows what to do with it.
    """
    folder = context_file.parent
    spec_file, outcome_file = folder / f"trial-{num}.json", folder / f"trial-{num}.outcome"
    checked_file = folder / f"trial-{num}.checked"
    outcome_file.unlink(missing_ok=True)
    atomic_write_bytes(checked_file, cloudpickle.dumps(checked))
    atomic_write_json(spec_file, {
        "context_file": str(context_file),
        "checked_file": str(checked_file),
        "overrides": list(overrides),
        "num": num,
        "cpus": list(cpus),
        "sys_path": sys.path,
        "outcome_file": str(outcome_file),
        "sweep_pid": os.getpid(),
    })
    process = start(spec_file, {**os.environ, **env}, f"trial-{num}")
    return TrialProcess(num, process, outcome_file)


def let_held_stop_signals_in() -> str | None:
    """Unblock the stop signals held since the process began; the reason of one that was held, else None.

    The signals stay blocked from the sweep's ``start_trial`` until here, so that one sent while
    this process imports means: do not start the trial. Afterwards their usual handlers apply
    (the app's own, once its task function installs them).
    """
    from hpcsweep.control import stop

    held: list[str] = []

    def refuse(signum: int, frame: Any) -> None:
        held.append(stop.stop_reason(signum))

    with stop.stop_signals_routed_to(refuse):
        stop.unblock_stop_signals()  # a held signal's handler runs in this call (CPython checks signals here)
    return held[0] if held else None


def run_trial_here(spec: Mapping[str, Any]) -> TrialOutcome:
    """Run the trial of ``spec`` in this process as Hydra's basic launcher does; how it ended.

    An app that returns a ``hpcsweep.control.outcome.Outcome`` whose process must leave (hpcsweep's,
    after a stop) has stopped: its message and exit code (``hpcsweep.control.exit_codes``) go to the sweep.
    """
    from hydra.core.singleton import Singleton

    from hpcsweep.control import exit_codes, stop
    from hpcsweep.control.outcome import leaving_outcome
    from hpcsweep.search.trial_slot import search_slot
    from hpcsweep.sweep.hooks import hook_of
    from hpcsweep.sweep.hydra_private import basic_launcher

    with open(spec["context_file"], "rb") as handle:
        hydra_context, config, task_function, singleton_state = pickle.load(handle)
    with open(spec["checked_file"], "rb") as handle:
        checked = pickle.load(handle)
    Singleton.set_state(singleton_state)
    launcher = basic_launcher()
    launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)
    num = int(spec["num"])
    refused = let_held_stop_signals_in()
    if refused is not None:
        return NotStarted(refused)
    try:
        # A search's slot runs with the parameters its study chooses now (the overrides as they are otherwise).
        with search_slot(config, list(spec["overrides"]), num) as slot:
            with hook_of(task_function).running_checked(slot.checked_here(checked)):
                (job_return,) = launcher.launch([slot.overrides], num)
            stopped = leaving_outcome(job_return)
            if stopped is None:  # a stopped trial has not ended: its study trial stays RUNNING
                slot.ran(job_return)
    except KeyboardInterrupt:  # an app without stop handlers, interrupted
        return Stopped(f"{stop.INTERRUPTED}: trial #{num} was interrupted", exit_codes.EXIT_INTERRUPTED)
    if stopped is not None:
        return Stopped(stopped.message, exit_codes.carry_out(stopped))
    return Returned(job_return)


def outcome_bytes(outcome: TrialOutcome) -> bytes:
    """``outcome`` pickled; a return value that cannot be pickled becomes the trial's failure."""
    from hydra.core.utils import JobStatus

    try:
        return cloudpickle.dumps(outcome)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        assert isinstance(outcome, Returned)
        job_return = outcome.job_return
        job_return.status = JobStatus.FAILED
        job_return._return_value = RuntimeError(f"the trial's return value cannot be sent to the sweep: {err}")
        return cloudpickle.dumps(Returned(job_return))


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when the thread that started it ends."""


def ask_for_sigterm_when_parent_ends() -> bool:
    """Have the kernel send this process SIGTERM once its parent is gone (Linux); whether it was set.

    A trial process is in a session of its own, so a sweep killed outright (SIGKILL, an OOM kill)
    would leave it training with nobody to collect it; SIGTERM stops it as a Slurm stop does, with
    a checkpoint. The parent is the sweep, which starts trials from its main thread, which lives as
    long as the sweep (or, for a forked trial without pidfds, the fork server, which ends after the
    sweep). Elsewhere than Linux nothing is set.
    """
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_with_the_sweep(sweep_pid: int) -> None:
    """SIGTERM for this process, started by the sweep itself, once the sweep is gone, even already."""
    import signal

    # The sweep may have died before the request took effect: this process has another parent then.
    if ask_for_sigterm_when_parent_ends() and os.getppid() != sweep_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def fresh_thread_count(env: Mapping[str, str], cpus: int) -> int:
    """The intra-op threads torch takes when imported fresh: ``OMP_NUM_THREADS`` (its first entry), else ``cpus``."""
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else max(1, cpus)


def size_preloaded_threads() -> None:
    """Give a preloaded torch the thread pool a fresh import would have on this process's CPUs.

    OpenMP sized it in the fork server, from the server's CPUs; a trial runs on its slot's, with
    its own ``OMP_NUM_THREADS``. A trial that imported torch itself needs nothing.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(fresh_thread_count(os.environ, len(os.sched_getaffinity(0))))


def run_spec(spec_file: Path) -> int:
    """The trial process once it stops with the sweep: its CPUs, the sweep's import path, the trial,
    then its outcome file; the process's exit status."""
    spec = json.loads(spec_file.read_text())
    if spec["cpus"]:
        os.sched_setaffinity(0, spec["cpus"])
    size_preloaded_threads()
    sys.path[:] = spec["sys_path"]
    outcome = run_trial_here(spec)
    atomic_write_bytes(Path(spec["outcome_file"]), outcome_bytes(outcome))
    return outcome.code if isinstance(outcome, Stopped) else 0


def main(argv: Sequence[str]) -> int:
    """A trial process in a fresh interpreter: ``run_spec`` once it stops with the sweep that started it."""
    spec_file = Path(argv[0])
    stop_with_the_sweep(int(json.loads(spec_file.read_text())["sweep_pid"]))
    return run_spec(spec_file)


if __name__ == "__main__":
    # Through the module's own name: the outcome classes pickled here must be the sweep's, not __main__'s.
    from hpcsweep.sweep.local_trial import main as trial_main

    sys.exit(trial_main(sys.argv[1:]))
