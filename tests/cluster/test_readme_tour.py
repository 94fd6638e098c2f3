"""The README's and the docs' own commands, verbatim, from a fresh venv on a copy of the repo.

Every command of README.md and of every page under docs/ is read out of the page, so the test
follows the docs and the docs cannot drift from what works. ``docs/README.md`` ("How the docs are
tested") states the rules a page follows; in short:

- a command is a line of an indented code block that follows a blank line (fenced blocks never run);
- a block of ``$ command`` lines is a transcript: the lines after each command are output it must
  print, ``…`` standing for any text; any other command must exit 0;
- ``SWEEP_DIR`` is the latest sweep the tour ran; a command naming it runs once every job the tour
  submitted has ended;
- ``<!-- tour: local -->`` before a block runs it with no Slurm controller reachable, and
  ``<!-- tour: skip: REASON -->`` leaves it out, with its reason.

The pages run in the order of ``PAGES``, the README first, on the local cluster with the launcher
defaults a user gets. At the end every job the tour submitted is COMPLETED and every trial it made
completed (or pruned, in a search).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ..venvs import venv_on_these_packages
from .conftest import REPO, TERMINAL_STATES, read_json, slurm, wait_for

# The order a newcomer reads them in: docs/README.md's tables.
PAGES = (
    "README.md",
    "docs/README.md",
    "docs/user/sweep.md",
    "docs/user/search.md",
    "docs/user/fine-tune.md",
    "docs/user/your-text.md",
    "docs/user/instruction-tuning.md",
    "docs/user/preference-tuning.md",
    "docs/user/lora-and-export.md",
    "docs/user/moe.md",
    "docs/user/task-scores.md",
    "docs/user/budget-and-retry.md",
    "docs/user/failures.md",
    "docs/user/results.md",
    "docs/user/mlflow.md",
    "docs/user/wandb.md",
    "docs/user/efficiency.md",
    "docs/user/telemetry.md",
    "docs/user/profiling.md",
    "docs/user/step-time.md",
    "docs/user/sbatch.md",
    "docs/user/containers.md",
    "docs/user/gpus.md",
    "docs/user/memory-plan.md",
    "docs/user/parallel.md",
    "docs/user/hydra-app.md",
    "docs/operator/local-cluster.md",
    "docs/operator/site-templates.md",
    "docs/operator/nccl.md",
    "docs/operator/topology.md",
    "docs/operator/scale.md",
)
# Enough for one command's trials on 2 cores under a load of 15 (the first sweep alone took over 15 min).
COMMAND_TIMEOUT_S = 2400
JOBS_TIMEOUT_S = 3600
MARK = re.compile(r"^<!-- tour: (local|skip: (?P<reason>\S.*?)) -->$")
SWEEP_DIR = "SWEEP_DIR"


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a page: what to type, the output it must print, and how the tour runs it."""

    page: str
    text: str
    expected: tuple[str, ...] = ()
    transcript: bool = False
    local: bool = False
    skip_reason: str | None = None


def code_blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """Each indented code block after a blank line, outside fences, with the tour mark before it."""
    blocks: list[tuple[str | None, list[str]]] = []
    lines = text.splitlines()
    fenced, mark, i = False, None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and line.strip() and i > 0 and not lines[i - 1].strip():
            block = []
            while i < len(lines) and line.startswith("    ") and line.strip():
                block.append(line[4:])
                i += 1
                line = lines[i] if i < len(lines) else ""
            blocks.append((mark, block))
            mark = None
            continue
        elif not fenced and MARK.match(line.strip()):
            mark = line.strip()
        elif line.strip():
            mark = None
        i += 1
    return blocks


def page_commands(page: str, text: str) -> list[Command]:
    """The commands of one page, continuation lines joined and comments dropped, in page order."""
    commands = []
    for mark, block in code_blocks(text):
        matched = MARK.match(mark) if mark else None
        local = bool(matched) and matched.group(1) == "local"
        reason = matched.group("reason") if matched else None
        joined = "\n".join(block).replace("\\\n", " ")
        block_lines = [re.sub(r"\s+", " ", line).strip() for line in joined.splitlines()]
        if block_lines[0].startswith("$ "):
            for line in block_lines:
                if line.startswith("$ "):
                    commands.append(Command(page, line[2:], transcript=True, local=local, skip_reason=reason))
                else:
                    last = commands[-1]
                    commands[-1] = dataclasses.replace(last, expected=(*last.expected, line))
        else:
            for line in block_lines:
                commands.append(Command(page, re.sub(r"\s+#\s.*$", "", line), local=local, skip_reason=reason))
    return commands


def documented_commands() -> list[Command]:
    return [command for page in PAGES for command in page_commands(page, (REPO / page).read_text())]


def output_pattern(expected: str) -> re.Pattern[str]:
    """An expected output line as a pattern: ``…`` stands for any text."""
    return re.compile(".*?".join(re.escape(piece) for piece in expected.split("…")))


def test_pages_are_parsed_as_the_docs_say():
    text = (
        "x\n\n    a b \\\n        c  # note\n    d\n  - item\n    continued, not code\n\n"
        "<!-- tour: skip: needs a GPU -->\n\n    e\n\n```\n    not run\n```\n\n"
        "    $ f\n    out … put\n    $ g\n"
    )
    assert page_commands("p", text) == [
        Command("p", "a b c"), Command("p", "d"), Command("p", "e", skip_reason="needs a GPU"),
        Command("p", "f", expected=("out … put",), transcript=True), Command("p", "g", transcript=True),
    ]
    assert output_pattern("a … b").search("[log] a 123 b;")
    assert not output_pattern("a … b").search("b a")


def test_every_docs_page_is_toured_and_every_skip_says_why():
    pages = {str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")}
    assert pages <= set(PAGES), f"pages the tour does not read: {sorted(pages - set(PAGES))}"
    commands = documented_commands()
    first = [c.text for c in commands if c.page == "README.md"][:2]
    assert first == ["pip install torch==2.13.0 -e . && python -m hpcsweep -m model.lr=1e-4,3e-4", "scripts/test.sh"]
    for command in commands:
        assert command.skip_reason is None or len(command.skip_reason.split()) >= 3, command
        assert not (command.transcript and command.skip_reason), f"a shown output must be checked: {command}"
    # The tour runs most of what the user guide shows, not only the README.
    ran = [c for c in commands if c.skip_reason is None and c.page.startswith("docs/user/")]
    assert len(ran) >= 15, ran


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the repo as a clone has it, with a fresh venv whose bin/ comes first on PATH. The model
    folder and text the README's fine-tuning names are made by the README's own command
    (``scripts/make-example-model``), run verbatim like the rest."""
    root = tmp_path_factory.mktemp("tour")
    repo = root / "hpcsweep"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "multirun", "outputs", "slurm-*.out"))
    venv_on_these_packages(root / "venv", with_pip=True)
    return repo


def user_env(checkout: Path, slurm_env: dict[str, str], local: bool) -> dict[str, str]:
    """A shell's environment with the venv activated; without Slurm when ``local``."""
    base = dict(os.environ if local else slurm_env)
    if local:
        base.pop("SLURM_CONF", None)
    venv_bin = checkout.parent / "venv" / "bin"
    base.update(VIRTUAL_ENV=str(venv_bin.parent), PATH=f"{venv_bin}{os.pathsep}{base.get('PATH', '')}")
    base.pop("PYTHONPATH", None)
    return base


def base_job_id(job_id: str) -> str:
    return job_id.split("_")[0].split(".")[0]


def job_states(env: dict[str, str]) -> dict[str, str]:
    """``JobID -> State`` of every job (array tasks one by one) accounting knows."""
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "--allusers", "--starttime=2020-01-01",
                "--format=JobID,State")
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def queued_jobs(env: dict[str, str]) -> set[str]:
    return {base_job_id(line.strip()) for line in slurm(env, "squeue", "-h", "-o", "%i").splitlines() if line.strip()}


class Tour:
    """Runs a page's commands as a user types them, and keeps what the tour made."""

    def __init__(self, checkout: Path, slurm_env: dict[str, str]):
        self.checkout, self.slurm_env = checkout, slurm_env
        self.jobs_before = {base_job_id(j) for j in job_states(slurm_env)}
        self.sweeps: list[Path] = []
        self.sweep_dir: Path | None = None

    def own_states(self) -> dict[str, str]:
        return {j: s for j, s in job_states(self.slurm_env).items() if base_job_id(j) not in self.jobs_before}

    def wait_for_jobs(self) -> dict[str, str]:
        """Wait until every job the tour submitted has left the queue and ended in accounting."""
        def ended():
            if queued_jobs(self.slurm_env) - self.jobs_before:
                return None
            states = self.own_states()
            # A list, so that "no job yet" is an answer too.
            return [states] if all(s.split()[0] in TERMINAL_STATES for s in states.values()) else None

        return wait_for(ended, timeout=JOBS_TIMEOUT_S, what="the tour's jobs to end", interval=2)[0]

    def note_new_sweeps(self) -> None:
        for sweep in sorted(p.parent for p in self.checkout.glob("multirun/*/*/sweep.json")):
            if sweep not in self.sweeps:
                self.sweeps.append(sweep)
                self.sweep_dir = sweep

    def run(self, command: Command) -> None:
        text = command.text
        expected = command.expected
        if SWEEP_DIR in text or any(SWEEP_DIR in line for line in expected):
            assert self.sweep_dir is not None, f"{command.page}: {text} names SWEEP_DIR before any sweep ran"
            self.wait_for_jobs()
            here = str(self.sweep_dir.relative_to(self.checkout))
            text = text.replace(SWEEP_DIR, here)
            expected = tuple(line.replace(SWEEP_DIR, here) for line in expected)
        env = user_env(self.checkout, self.slurm_env, command.local)
        done = subprocess.run(["bash", "-c", text], cwd=self.checkout, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        out = done.stdout + done.stderr
        where = f"{command.page}: `{text}` exited {done.returncode}:\n{out[-4000:]}"
        if not command.transcript:
            assert done.returncode == 0, where
        for line in expected:
            assert any(output_pattern(line).search(printed) for printed in out.splitlines()), f"no `{line}` in {where}"
        if re.search(r"python -m hpcsweep -m ", text) and not command.transcript:
            chose = ": running locally" if command.local else "launcher: slurm ("
            assert chose in out, where
        self.note_new_sweeps()


def assert_trial_ended_well(trial_dir: Path, statuses=("completed",)) -> None:
    metrics = read_json(trial_dir / "metrics.json")
    assert metrics["status"] in statuses, (trial_dir, metrics.get("status"), metrics.get("error"))
    if metrics["status"] == "completed":
        assert metrics["step"] == metrics["max_steps"]
        assert len(metrics["weights_sha256"]) == 64


def test_every_documented_command_runs_verbatim(checkout, slurm_env):
    tour = Tour(checkout, slurm_env)
    commands = [c for c in documented_commands() if c.skip_reason is None]
    for command in commands:
        tour.run(command)

    states = tour.wait_for_jobs()
    tour.note_new_sweeps()  # sweep.sbatch's driver makes its sweep after its command returned
    assert states, "the tour submitted nothing to Slurm"
    assert {s for s in states.values()} == {"COMPLETED"}, states
    # The README's sweeps and the guide's: the first local, then Slurm, the packed, the search, the budget.
    assert len(tour.sweeps) >= 6, tour.sweeps
    for sweep in tour.sweeps:
        record = read_json(sweep / "sweep.json")
        searched = (sweep / "search").is_dir()
        assert record["trials"], sweep
        for trial in record["trials"]:
            assert_trial_ended_well(checkout / trial["trial_dir"], ("completed", "pruned") if searched else ("completed",))
    # The README's first sweep: two local trials that trained differently.
    first = read_json(tour.sweeps[0] / "sweep.json")["trials"]
    assert len(first) == 2
    assert len({read_json(checkout / t["trial_dir"] / "metrics.json")["weights_sha256"] for t in first}) == 2
    # The README's Slurm sweep is one array of 2-node trials on the cluster's nodes.
    slurm_sweep = next(s for s in tour.sweeps if read_json(s / "sweep.json")["trials"][0].get("job_id"))
    trials = read_json(slurm_sweep / "sweep.json")["trials"]
    assert len(trials) == 3 and len({base_job_id(t["job_id"]) for t in trials}) == 1
    for trial in trials:
        environment = read_json(checkout / trial["trial_dir"] / "environment.json")
        assert environment["slurm"]["nodelist"].startswith("node"), environment["slurm"]
    # The single runs (the fine-tune guide's) trained to the end in outputs/<date>/<time>.
    single_runs = [p.parent for p in checkout.glob("outputs/*/*/metrics.json")]
    assert single_runs
    for trial_dir in single_runs:
        assert_trial_ended_well(trial_dir)
    # train.sbatch's trial ran on two nodes.
    (sbatch_trial,) = checkout.glob("outputs/sbatch-*")
    metrics = read_json(sbatch_trial / "metrics.json")
    assert metrics["status"] == "completed" and metrics["world_size"] == 2
    assert len({rank["node"] for rank in metrics["ranks"]}) == 2
