"""``python -m rlpar``: the command line (see `rlpar.app.cli`)."""

import sys

from rlpar.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
