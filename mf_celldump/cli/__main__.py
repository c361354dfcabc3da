"""``python -m mf_celldump.cli``: the ``mf-celldump`` command without its console script."""

import sys

from mf_celldump.cli import main

sys.exit(main())
