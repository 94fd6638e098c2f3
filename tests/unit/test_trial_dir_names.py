"""Every stage takes a trial dir's file names from ``hpcsweep.files.trial_files``: none joins a literal."""

from __future__ import annotations

import re
from pathlib import Path

from hpcsweep.files import trial_files
from hpcsweep.files.trial_files import TrialFiles

REPO = Path(__file__).resolve().parents[2]
NAMES = ("metrics.json", "config.yaml", "environment.json", "train.log", "checkpoints", "tb", "usage.json")
JOINED_LITERAL = re.compile(r"""/\s*["'](%s)["']""" % "|".join(re.escape(name) for name in NAMES))


def test_no_module_joins_a_trial_file_name_itself():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "hpcsweep").rglob("*.py"))
        if path != Path(trial_files.__file__)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if JOINED_LITERAL.search(line)
    ]
    assert found == [], "take these names from hpcsweep.files.trial_files.TrialFiles:\n" + "\n".join(found)


def test_the_layout_names_each_file_once(tmp_path):
    files = TrialFiles(tmp_path)
    assert files.rank_log(0) == files.train_log == tmp_path / "train.log"
    assert files.rank_log(3) == tmp_path / "logs" / "rank3.log"
    assert (files.metrics, files.config, files.environment) == (
        tmp_path / "metrics.json", tmp_path / "config.yaml", tmp_path / "environment.json"
    )
    assert (files.checkpoints, files.tb) == (tmp_path / "checkpoints", tmp_path / "tb")
