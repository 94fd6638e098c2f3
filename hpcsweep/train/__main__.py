"""``python -m hpcsweep.train TRIAL_DIR``: the torchrun worker entry (see ``hpcsweep.train.worker``)."""

import sys

from hpcsweep.model.offline import stay_offline

stay_offline()  # before the worker imports transformers (hpcsweep.model.offline says why)

from hpcsweep.train.worker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
