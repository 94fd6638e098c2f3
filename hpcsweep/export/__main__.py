"""``python -m hpcsweep.export SWEEP_DIR (--best | --trial N) --out DIR [--merge]``."""

import sys

from hpcsweep.export.cli import main

sys.exit(main())
