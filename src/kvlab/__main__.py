"""``python -m kvlab``: the ``kvlab`` command (:func:`kvlab.cli.main`), for an environment whose scripts folder is
not on ``PATH``."""

import sys

from kvlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
