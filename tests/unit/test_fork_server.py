"""The fork server local trials start from: its setting, what it preloads, its thread sizing, its fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hpcsweep.sweep.fork_server import PRELOAD, start_method_of
from hpcsweep.sweep.hooks import TrialHook
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials
from hpcsweep.sweep.local_trial import fresh_thread_count


def test_the_start_method_defaults_to_the_fork_server_and_refuses_others_naming_the_key():
    assert start_method_of({}) == start_method_of({"start_method": None}) == "forkserver"
    assert start_method_of({"start_method": "spawn"}) == "spawn"
    with pytest.raises(ValueError) as refused:
        start_method_of({"start_method": "fork"})
    assert str(refused.value) == (
        "hydra.launcher.start_method='fork' is not allowed: forkserver (trials forked from a process that has "
        "imported torch once) or spawn (a fresh interpreter per trial)"
    )


@pytest.mark.parametrize(("env", "cpus", "threads"), [
    ({}, 3, 3),
    ({"OMP_NUM_THREADS": "1"}, 8, 1),
    ({"OMP_NUM_THREADS": "4,2"}, 8, 4),
    ({"OMP_NUM_THREADS": ""}, 2, 2),
    ({"OMP_NUM_THREADS": "0"}, 2, 2),
    ({"OMP_NUM_THREADS": "many"}, 5, 5),
    ({}, 0, 1),
])
def test_a_forked_trial_gets_the_threads_a_fresh_torch_would_take(env, cpus, threads):
    assert fresh_thread_count(env, cpus) == threads


def test_an_app_without_a_preload_gets_hydra_alone():
    assert TrialHook.preload == () and "torch" not in PRELOAD and "hydra" in PRELOAD


def test_hpcsweeps_preload_holds_no_hpcsweep_or_app_code_and_initialises_no_cuda():
    # As the fork server imports them: a fresh interpreter, each module in turn.
    probe = textwrap.dedent("""
        import json, sys
        for name in sys.argv[1:]:
            __import__(name)
        import torch
        ours = sorted(m for m in sys.modules if m.split(".")[0] in ("hpcsweep", "hydra_plugins", "foreign_app"))
        print(json.dumps({"ours": ours, "cuda": torch.cuda.is_initialized(), "torch": "torch" in sys.modules,
                          "transformers": "transformers.models.llama.modeling_llama" in sys.modules}))
    """)
    preload = [*PRELOAD, *HpcsweepTrials.preload]
    proc = subprocess.run([sys.executable, "-c", probe, *preload], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"ours": [], "cuda": False, "torch": True, "transformers": True}


def test_a_fork_server_that_cannot_start_falls_back_to_fresh_interpreters_saying_why_once(tmp_path):
    # A preloaded module that kills the server while it imports: the first trial's start finds it gone.
    (tmp_path / "kills_the_server.py").write_text("import os\nos._exit(3)\n")
    script = textwrap.dedent("""
        import logging, subprocess, sys
        from pathlib import Path
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        from hpcsweep.sweep.fork_server import TrialStarter
        from hpcsweep.control.stop import stop_signals_blocked

        with stop_signals_blocked():
            starter = TrialStarter("forkserver", preload=["kills_the_server"])
            started = [starter.start(Path(sys.argv[1]), {"PATH": "/usr/bin:/bin"}, f"trial-{n}") for n in (0, 1)]
        print([type(p).__name__ for p in started], [p.wait() != 0 for p in started])
    """)
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    proc = subprocess.run([sys.executable, "-c", script, str(spec)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Both trials started as fresh interpreters (which refuse this empty spec: they did run).
    assert proc.stdout.splitlines()[-1] == "['Popen', 'Popen'] [True, True]"
    (warning,) = [line for line in proc.stderr.splitlines() if "fork server" in line]
    assert warning.startswith("WARNING the fork server could not start (")
    assert warning.endswith("): each trial starts in a fresh interpreter")
