"""How a local sweep starts its trial processes (``hydra.launcher.start_method``).

``forkserver`` (the default): multiprocessing's fork server, started once per sweep, imports
``PRELOAD`` (hydra) and the app's ``TrialHook.preload`` (hpcsweep's: torch, transformers) once,
and every trial process is forked from it, so a trial starts in a fraction of a second instead of
paying those imports (~3.5 s) again. ``spawn``:
each trial starts in a fresh interpreter (``python -m hpcsweep.sweep.local_trial SPEC.json``).
When the fork server cannot start, the sweep says why once and spawns.

Either way a trial is a process of its own, in a session of its own, with the environment the
sweep gives it (it replaces whatever the fork server had), the sweep's ``sys.path`` and cwd, the
CPUs of its slot, the stop signals held until it is ready for them, and SIGTERM once the sweep
dies. Only third-party modules are preloaded, never hpcsweep's nor the app's: a trial imports
those from the sweep's ``sys.path``, as a fresh interpreter would. The preloaded modules read the
sweep's environment when they are imported; what a trial adds (its ``CUDA_VISIBLE_DEVICES``) is
read by CUDA at its first use, after the fork: importing them must not initialise CUDA.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsweep.sweep.local_trial import RunningTrial

log = logging.getLogger(__name__)

START_METHOD_KEY = "hydra.launcher.start_method"
START_METHODS = ("forkserver", "spawn")
DEFAULT_START_METHOD = "forkserver"

PRELOAD = ("omegaconf", "hydra", "cloudpickle")
"""What the fork server imports for every app's trials, besides Hydra's basic launcher
(``hydra_private.BASIC_LAUNCHER_MODULE``) and before the app's hook's ``preload`` (hpcsweep's:
torch and transformers). Third-party only; a module that is missing is skipped."""


def start_method_of(params: Mapping[str, Any]) -> str:
    """``hydra.launcher.start_method`` (default ``forkserver``); ``ValueError`` naming the key."""
    method = params.get("start_method") or DEFAULT_START_METHOD
    if method not in START_METHODS:
        raise ValueError(
            f"{START_METHOD_KEY}={method!r} is not allowed: forkserver (trials forked from a process that "
            "has imported torch once) or spawn (a fresh interpreter per trial)"
        )
    return method


@dataclass
class ForkedTrial:
    """A trial process forked by the fork server, with ``subprocess.Popen``'s exit statuses."""

    process: multiprocessing.process.BaseProcess

    @property
    def pid(self) -> int:
        """The trial process's pid."""
        assert self.process.pid is not None
        return self.process.pid

    def poll(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return self.process.exitcode

    def wait(self) -> int:
        """Wait for the process to end; its exit status."""
        self.process.join()
        assert self.process.exitcode is not None
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process if it is still running."""
        if self.poll() is None:
            os.kill(self.pid, signum)


def reseed_preloaded_numpy() -> None:
    """Seed numpy's global generator afresh, as a fresh import does: else every trial forked from the
    server would draw the same numbers. (Python's ``random`` reseeds itself after a fork.)"""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _release_the_sweeps_alive_pipe() -> None:
    # Each forked process inherits the sweep's end of the fork server's "alive" pipe, so that it
    # could use the server too; while any trial holds it, the server outlives a sweep killed outright.
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def stop_with_the_sweep_from_afar(sweep_pid: int) -> None:
    """SIGTERM for this process once the sweep is gone, though the sweep is not its parent.

    A thread waits on the sweep's pidfd (Linux 5.3 and later): the signal comes as soon as the
    sweep dies. Without pidfds, the kernel's death signal from the parent, the fork server, which
    ends once the sweep and every trial have let go of its alive pipe: seconds later, as it
    winds its imports down.
    """
    from hpcsweep.sweep.local_trial import ask_for_sigterm_when_parent_ends

    try:
        sweep = os.pidfd_open(sweep_pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (OSError, AttributeError):
        # Asked before letting go of the pipe: the server cannot end before the request is in.
        ask_for_sigterm_when_parent_ends()
        _release_the_sweeps_alive_pipe()
        return

    def stop_when_the_sweep_ends() -> None:
        select.select([sweep], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_the_sweep_ends, name="sweep-watch", daemon=True).start()


def run_forked_trial(spec_file: str, env: Mapping[str, str], sweep_pid: int) -> None:
    """The forked trial process: its own session and environment, then ``local_trial.run_spec``."""
    from hpcsweep.sweep.local_trial import run_spec

    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    stop_with_the_sweep_from_afar(sweep_pid)
    reseed_preloaded_numpy()
    sys.exit(run_spec(Path(spec_file)))


def spawn_trial(spec_file: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """A fresh interpreter for the trial of ``spec_file``, in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "hpcsweep.sweep.local_trial", str(spec_file)], env=dict(env), start_new_session=True
    )


class TrialStarter:
    """Starts a sweep's trial processes with its start method; falls back to spawn, saying why once.

    Create it, and start trials, with the stop signals blocked (``stop.stop_signals_blocked``):
    the fork server inherits the mask, and so every process forked from it holds a stop signal
    until it is ready for it.
    """

    def __init__(self, method: str, preload: Sequence[str]) -> None:
        self.context: Any = None
        if method == "forkserver":
            self.context = self._started_server(list(preload))

    def _started_server(self, preload: list[str]) -> Any:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(preload)
        try:
            forkserver.ensure_running()
        except OSError as err:
            self._fall_back(err)
            return None
        return context

    def _fall_back(self, err: BaseException) -> None:
        log.warning("the fork server could not start (%s): each trial starts in a fresh interpreter", err)
        self.context = None

    def start(self, spec_file: Path, env: Mapping[str, str], name: str) -> RunningTrial:
        """Start the trial of ``spec_file`` with ``env`` as its whole environment."""
        if self.context is not None:
            args = (str(spec_file), dict(env), os.getpid())
            process = self.context.Process(target=run_forked_trial, args=args, name=name)
            try:
                process.start()
                return ForkedTrial(process)
            except (OSError, EOFError) as err:  # the server died (while preloading)
                self._fall_back(err)
        return spawn_trial(spec_file, env)
