"""What the analysis tools need beyond the core install, and what to say when it is missing.

The plots (compare's depth plot, ranks' heat maps) need matplotlib, the ``compare`` extra; the
tables and the HTML report do not. A command without it writes everything else and names
the extra to install, instead of failing with an ImportError.
"""

from __future__ import annotations

import logging
from typing import Any

from mf_celldump.errors import MissingExtra

logger = logging.getLogger(__name__)
INSTALL_HINT = 'pip install "mf_celldump[compare]"'


def pyplot(what: str) -> Any:
    """matplotlib's pyplot on the file-only Agg backend; ``MissingExtra`` naming ``what`` when it cannot be
    imported."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        logger.debug("matplotlib cannot be imported: %s", err)
        raise MissingExtra(f"{what} needs matplotlib: {INSTALL_HINT}") from None
    return plt
