"""``python -m mf_celldump``: the ``mf-celldump`` command, for a shell where the script is not on PATH."""

import sys

from mf_celldump.cli import main

if __name__ == "__main__":  # worker processes import this module too (multiprocessing's forkserver/spawn)
    sys.exit(main())
