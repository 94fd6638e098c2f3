"""Fresh virtual environments for tests that install hpcsweep the way a user does."""

from __future__ import annotations

import site
import subprocess
import venv
from collections.abc import Iterable
from pathlib import Path


def pth_folders(site_dirs: Iterable[str]) -> list[str]:
    """The folders that the ``.pth`` files of ``site_dirs`` put on ``sys.path``, as ``site`` reads them.

    Comment and ``import`` lines are skipped (an editable install's finder is one), and so is a
    folder holding an ``hpcsweep`` package (an editable install that names its source tree).
    """
    folders = []
    for site_dir in site_dirs:
        for pth in sorted(Path(site_dir).glob("*.pth")):
            for line in pth.read_text().splitlines():
                line = line.rstrip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                # site resolves a relative line against the site dir; an absolute one stays as it is.
                folder = Path(site_dir, line)
                if folder.is_dir() and not (folder / "hpcsweep" / "__init__.py").exists():
                    folders.append(str(folder))
    return folders


def venv_on_these_packages(env_dir: Path, with_pip: bool = False) -> Path:
    """A new venv that sees this interpreter's installed packages but not its hpcsweep; returns its python.

    torch is too big to install again for a test. A folder named in a ``.pth`` file is added to
    ``sys.path`` as is, so the ``.pth`` finder of an editable hpcsweep installed there does not run.
    The folders that this interpreter's own ``.pth`` files name are listed too: a venv layered on
    another (a worktree's ``.venv`` whose ``deps.pth`` names a shared site-packages) has its
    packages there.
    """
    venv.EnvBuilder(with_pip=with_pip).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    site_dirs = site.getsitepackages()
    folders = list(dict.fromkeys([*site_dirs, *pth_folders(site_dirs)]))
    (Path(purelib) / "outer-site-packages.pth").write_text("\n".join(folders) + "\n")
    return python
