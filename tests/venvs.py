"""Fresh virtual environments for tests that install hpcsweep the way a user does."""

from __future__ import annotations

import site
import subprocess
import venv
from pathlib import Path


def venv_on_these_packages(env_dir: Path, with_pip: bool = False) -> Path:
    """A new venv that sees this interpreter's installed packages but not its hpcsweep; returns its python.

    torch is too big to install again for a test. A folder named in a ``.pth`` file is added to
    ``sys.path`` as is, so the ``.pth`` finder of an editable hpcsweep installed there does not run.
    """
    venv.EnvBuilder(with_pip=with_pip).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    (Path(purelib) / "outer-site-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python
