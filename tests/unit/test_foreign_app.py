"""A Hydra app that is not hpcsweep sweeps through ``hydra/launcher=hpcsweep_local`` (issue #12).

The app (``tests/foreign_app``) has its own config groups, a mandatory default and a task function
that returns a value; it and hpcsweep are installed with a plain ``pip install`` into a fresh venv
and run as a user runs them. Hydra's basic launcher gives the reference JobReturns.
"""

from __future__ import annotations

import pytest

from ..foreign_sweeps import (
    SWEEPS,
    assert_hydra_job_returns,
    assert_sweep_record,
    comparable,
    install_foreign_app,
    run_foreign_sweep,
)


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory):
    return install_foreign_app(tmp_path_factory.mktemp("foreign-app"))


@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_foreign_app_sweeps_locally_with_hydras_job_returns(foreign_python, tmp_path, sweep):
    overrides, expected = SWEEPS[sweep]
    reference_dir, local_dir = tmp_path / "basic", tmp_path / "hpcsweep-local"
    proc, reference = run_foreign_sweep(foreign_python, tmp_path, reference_dir, [*overrides, "hydra/launcher=basic"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_hydra_job_returns(reference, reference_dir, expected)

    proc, returns = run_foreign_sweep(foreign_python, tmp_path, local_dir, [*overrides, "hydra/launcher=hpcsweep_local"])

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_hydra_job_returns(returns, local_dir, expected)
    assert comparable(returns, local_dir) == comparable(reference, reference_dir)
    assert_sweep_record(local_dir, "local", expected)
