"""``python -m hpcsweep.train TRIAL_DIR``: the torchrun worker entry (see ``hpcsweep.train.worker``)."""

import os
import sys

from hpcsweep.model.offline import stay_offline
from hpcsweep.train.observe.rank_logging import quiet_cpp_warnings_off_rank_0

stay_offline()  # before the worker imports transformers (hpcsweep.model.offline says why)
# Before the worker imports torch (hpcsweep.train.observe.rank_logging says why).
quiet_cpp_warnings_off_rank_0(os.environ)

from hpcsweep.train.worker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
