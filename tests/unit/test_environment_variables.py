"""Environment variables carry only what other programs or the people running hpcsweep set: settings travel in
the trial's attempt file, not in ``HPCSWEEP_*`` variables."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

INTERFACE_VARIABLES = {
    "HPCSWEEP_FAULT": "hpcsweep/train/fault.py: inject a crash, hang, stop or stuck save (documented there)",
    "HPCSWEEP_DUMMY_GPUS": "hpcsweep/train/gpu_choices.py: a site's GPUs without hardware (the local cluster's TaskProlog)",
    "HPCSWEEP_BUDGET_POLL_S": "hpcsweep/trial/budget_watch.py: a site's sacct poll interval for budgets",
}
"""Every ``HPCSWEEP_`` variable the package reads, and where it is documented."""
NAMED_VARIABLES = {
    "HPCSWEEP_TRIAL_DIR": "slurm/train.sbatch",
}
"""``HPCSWEEP_`` variables the package only names, for the user to set (status's line that resumes a stopped
batch trial), and the script that reads them."""


def hpcsweep_variables() -> dict[str, set[str]]:
    """Each ``HPCSWEEP_*`` name in the package's source, with the files that name it."""
    found: dict[str, set[str]] = {}
    for path in [*(REPO / "hpcsweep").rglob("*.py"), *(REPO / "hydra_plugins").rglob("*.py")]:
        for name in re.findall(r"HPCSWEEP_[A-Z0-9_]+", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_only_the_documented_interface_variables_are_named_in_the_package():
    unexpected = {name: files for name, files in hpcsweep_variables().items()
                  if name not in INTERFACE_VARIABLES and name not in NAMED_VARIABLES}
    assert unexpected == {}, "a setting travels by environment variable: put it in the attempt (hpcsweep.trial.attempt)"


def test_each_interface_variable_is_documented_where_it_is_read():
    found = hpcsweep_variables()
    for name, where in INTERFACE_VARIABLES.items():
        module = where.split(":")[0]
        assert module in found.get(name, set()), f"{name} is no longer read in {module}"
        assert re.search(rf'{name}"\n"""|``{name}', (REPO / module).read_text()), f"{name} has no docstring in {module}"


def test_each_named_variable_is_read_by_its_script():
    for name, script in NAMED_VARIABLES.items():
        assert f"${{{name}" in (REPO / script).read_text(), f"{script} no longer reads {name}"
