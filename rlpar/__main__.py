"""``python -m rlpar``: the command line (see `rlpar.cli`)."""

import sys

from rlpar.cli import main

if __name__ == "__main__":
    sys.exit(main())
