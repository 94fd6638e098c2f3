"""``python -m hpcsweep.profile SWEEP_DIR --trial N --steps K``: ask a running trial to profile its next K steps.

The request goes through the trial dir, as a stop file does (``hpcsweep.control.profile_request``),
not through a signal that NCCL or Slurm may use: rank 0 of the trial reads it at its next step
boundary, and every rank profiles the same steps and writes its own Chrome/Perfetto trace under
``TRIAL_DIR/profile/steps-START-END/`` (``hpcsweep.train.observe.profiling``). ``--wait`` waits, up to
``--timeout`` seconds, until every rank's trace is written and prints their paths. A trial that is
not in the sweep or not running, or a ``--steps`` out of range, is refused with one line (exit 2)
and nothing is asked. SWEEP_DIR may also be one trial dir (trial 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hpcsweep.control import profile_request
from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.sweep_record import missing_sweep_message
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.results.table import load_sweep, resolve_trial_dir

EXIT_NOT_SERVED = 1
"""``--wait``: the trial ended, or the timeout passed, before its traces were written."""
EXIT_REFUSED = 2
POLL_S = 0.5


def request_steps(text: str) -> int:
    """``--steps`` as an integer a request may ask for (argparse's type: its error is the refusal)."""
    try:
        steps: int | str = int(text)
    except ValueError:
        steps = text
    try:
        return profile_request.check_request_steps(steps)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--steps=")) from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcsweep.profile",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json), or one trial dir")
    parser.add_argument("--trial", type=int, required=True, metavar="N", help="the trial's number (status shows it)")
    parser.add_argument("--steps", type=request_steps, default=2, metavar="K",
                        help=f"profile the next K steps, 1 to {profile_request.MAX_REQUEST_STEPS} (default %(default)s)")
    parser.add_argument("--wait", action="store_true", help="wait until every rank's trace is written, print their paths")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="--wait: give up after S seconds (default %(default)s)")
    return parser.parse_args(argv)


def running_trial_dir(sweep_dir: Path, num: int) -> Path:
    """The dir of trial ``num`` of the sweep, which must be running; ``ValueError`` saying why not otherwise."""
    sweep = load_sweep(sweep_dir, with_scalars=False)
    found = [(row, trial) for row, trial in zip(sweep.rows, sweep.record.trials) if trial.num == num]
    if not found:
        numbers = ", ".join(str(t.num) for t in sweep.record.trials)
        raise ValueError(f"no trial #{num} in {sweep_dir} (its trials: {numbers})")
    ((row, trial),) = found
    if row.status != "running" or (row.step or 0) >= (row.max_steps or 0):
        state = "at its last step" if row.status == "running" else row.status
        raise ValueError(f"trial #{num} is {state}, not running: only a running trial reads profile requests")
    return resolve_trial_dir(sweep_dir, trial)


def traces_written(trial_dir: Path, request_id: str) -> profile_request.ProfileDone | None:
    """The answer to request ``request_id`` once every trace it names is on disk; None until then."""
    done = profile_request.read_done(trial_dir)
    if done is None or done.id != request_id or not all((trial_dir / t).exists() for t in done.traces):
        return None
    return done


def ended_status(trial_dir: Path) -> str | None:
    """The trial's status once metrics.json says it no longer runs; None while it does."""
    status = (read_metrics(TrialFiles(trial_dir).metrics) or {}).get("status")
    return None if status == "running" else str(status)


def wait_for_traces(trial_dir: Path, request_id: str, timeout_s: float) -> profile_request.ProfileDone | str:
    """The answer to the request, or why there is none: the trial ended, or the timeout passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = traces_written(trial_dir, request_id)
        if done is not None:
            return done
        ended = ended_status(trial_dir)
        if ended is not None:
            # Its last trace may have landed between the two reads.
            return traces_written(trial_dir, request_id) or f"the trial ended ({ended}) before its traces were written"
        if time.monotonic() > deadline:
            return f"no traces after {timeout_s:g} s (the request waits in {profile_request.request_path(trial_dir)})"
        time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    """Ask for the profile; 0 once asked (with ``--wait``: once written), ``EXIT_REFUSED`` when refused."""
    args = parse_args(argv)
    missing = missing_sweep_message(args.sweep_dir)
    if missing:
        print(missing, file=sys.stderr)
        return EXIT_REFUSED
    try:
        trial_dir = running_trial_dir(args.sweep_dir, args.trial)
    except ValueError as err:
        print(f"profile refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    request = profile_request.write_request(trial_dir, args.steps)
    print(f"asked trial #{args.trial} to profile its next {args.steps} step(s); traces go to {TrialFiles(trial_dir).profile}/")
    if not args.wait:
        return 0
    done = wait_for_traces(trial_dir, request.id, args.timeout)
    if isinstance(done, str):
        print(f"trial #{args.trial}: {done}", file=sys.stderr)
        return EXIT_NOT_SERVED
    start, end = done.steps
    short = f" (fewer than asked: the trial stopped at step {end})" if done.cut_short else ""
    print(f"trial #{args.trial} profiled steps {start}-{end}{short}:")
    for trace in done.traces:
        print(f"  {trial_dir / trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
