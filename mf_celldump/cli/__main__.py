"""``python -m mf_celldump.cli``: the ``mf-celldump`` command without its console script."""

import sys

from mf_celldump.cli import main

if __name__ == "__main__":  # worker processes import this module too (multiprocessing's forkserver/spawn)
    sys.exit(main())
