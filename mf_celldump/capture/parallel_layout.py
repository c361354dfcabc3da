"""The tensor-parallel layout where capture knows it, recorded in the manifest (``details["parallel"]``).

Processing copies it into every ``dump.json`` head (``layout.naming.PARALLEL_KEY``), so
``mf-celldump compare`` merges a tensor-parallel dump without being told ``--target-tp``.
Sources, first found wins: the ``replica_groups`` setting (``model_parallel=T``, the user's
own word), MindFormers' ``parallel_config`` on the model's config (``model_parallel`` or
``tensor_model_parallel_size``); MindSpore's auto-parallel mode is recorded beside it, since a
network split by MindSpore's parallel pass dumps each rank's slices without cells saying how.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)


def _mindformers_tp(model: Any) -> Optional[int]:
    """``model.config.parallel_config.model_parallel`` or ``model.config.tensor_model_parallel_size``."""
    config = getattr(model, "config", None)
    for owner, name in ((getattr(config, "parallel_config", None), "model_parallel"),
                        (config, "tensor_model_parallel_size"), (getattr(config, "parallel_config", None),
                                                                 "tensor_model_parallel_size")):
        value = getattr(owner, name, None) if owner is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def parallel_layout(model_parallel: int, model: Any, parallel_mode: str) -> Optional[Dict[str, Any]]:
    """``{"tensor_parallel": T, "source": ..., "parallel_mode": ...}``, or None when nothing is known."""
    out: Dict[str, Any] = {}
    if model_parallel > 1:
        out = {"tensor_parallel": model_parallel, "source": "replica_groups"}
    else:
        found = _mindformers_tp(model)
        if found is not None and found > 1:
            out = {"tensor_parallel": found, "source": "MindFormers parallel_config"}
    if parallel_mode and parallel_mode != "stand_alone":
        out["parallel_mode"] = parallel_mode
    return out or None
