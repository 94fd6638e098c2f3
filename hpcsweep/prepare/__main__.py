"""``python -m hpcsweep.prepare --request REQUEST``: the preparation job's entry (see ``hpcsweep.prepare.text_tokens``)."""

import sys

from hpcsweep.prepare.text_tokens import main

if __name__ == "__main__":
    sys.exit(main())
