"""``python -m hpcsweep.train TRIAL_DIR``: the torchrun worker entry (see ``hpcsweep.train.worker``)."""

import sys

from hpcsweep.train.worker import main

if __name__ == "__main__":
    sys.exit(main())
