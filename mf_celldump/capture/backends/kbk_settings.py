"""The settings of MindSpore's kernel-by-kernel statistics dump, checked before training starts.

Each check mirrors a rule of MindSpore's parser or runtime that would otherwise fail
late or silently (DJP = ``mindspore/ccsrc/tools/data_dump/dump_json_parser.cc``,
``debug/data_dump/`` up to 2.7.0). Errors are ``BackendSetupError`` naming the value
and what would work.
"""

from __future__ import annotations

import json
import logging
import os
from typing import List, MutableMapping, Tuple

from mf_celldump.capture.backends.compile_backend import CompileBackend
from mf_celldump.errors import BackendSetupError
from mf_celldump.userinput import IndexSelection

logger = logging.getLogger(__name__)

# Our statistics names -> statistic_category names MindSpore computes on the device
# (DJP ParseStatisticCategory: with stat_calc_mode "device" only these four; other valid
# names are dropped with a warning, unknown names raise).
DEVICE_CATEGORIES = {"max": "max", "min": "min", "mean": "avg", "norm": "l2norm"}
# The first statistics config parsed in this process (DJP Parse() runs once: already_parsed_).
PARSED_CONFIG_ENV = "MF_CELLDUMP_KBK_CONFIG"


def iteration_setting(steps: IndexSelection, first_step: int) -> str:
    """``iteration`` for the config: "all", or global steps and ranges from ``first_step`` on ("1|3|10-20").

    DJP ParseIteration refuses an empty value ("iteration only supports digits, {'-', '|'},
    or just "all""), and IsDumpIter/IsIterInRange accept ``N`` and ``N-M`` items.
    """
    if steps.selects_all:
        return "all"
    parts = []
    for lo, hi in steps.spans:
        lo = max(lo, first_step)
        if lo <= hi:
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    if not parts:
        raise BackendSetupError(f"steps={steps.describe()} selects no step from step {first_step} on")
    return "|".join(parts)


def device_statistics(wanted) -> Tuple[List[str], List[str]]:
    """(our statistics names available, MindSpore's category names) for the configured statistics."""
    available = [name for name in wanted if name in DEVICE_CATEGORIES]
    missing = [name for name in wanted if name not in DEVICE_CATEGORIES]
    if not available:
        raise BackendSetupError(
            f"statistics={list(wanted)}: the statistics task in Ascend graph mode computes only max, min, mean and "
            "norm (MindSpore's device statistics); add one of them, or use task: tensor")
    if missing:
        logger.warning("statistics %s are not available in Ascend graph mode (MindSpore computes only max, min, "
                       "mean and norm on the device); they are left out of this dump", ", ".join(missing))
    return available, [DEVICE_CATEGORIES[name] for name in available]


def check_dump_path(kbk_dir: str, dump_path: str) -> None:
    """DJP ParseDumpPath: absolute, and only ASCII letters, digits, '-', '_' and '/'."""
    bad = sorted({c for c in kbk_dir if not (c.isascii() and (c.isalnum() or c in "-_/"))})
    if bad or not kbk_dir.startswith("/"):
        found = ", ".join(repr(c) for c in bad) or "a relative path"
        raise BackendSetupError(
            f"dump_path {dump_path!r} cannot hold MindSpore's statistics dump: MindSpore accepts only an absolute "
            f"path of letters, digits, '-', '_' and '/' ({kbk_dir!r} has {found}); choose another dump_path, or "
            "use task: tensor")


def check_dump_environment(environ: MutableMapping[str, str]) -> None:
    """Refuse dump settings of someone else: MindSpore keeps one of each per process."""
    preset = environ.get("MINDSPORE_DUMP_CONFIG")
    if preset and preset != _parsed_config(environ):
        raise BackendSetupError(
            f"MINDSPORE_DUMP_CONFIG is already set ({preset}): MindSpore reads one dump configuration per process, "
            "so the statistics task cannot add its own; unset it, or use task: tensor")
    skip = environ.get("MS_KERNEL_LAUNCH_SKIP")
    if skip and skip != "TensorDump":
        # actor_common.cc IsSkippedLaunch compares the whole value with the op type (or "all").
        raise BackendSetupError(
            f"MS_KERNEL_LAUNCH_SKIP is set to {skip!r}; the statistics task needs it to be exactly 'TensorDump' "
            "(MindSpore compares the whole value with one op type); unset it, or use task: tensor")


def _parsed_config(environ: MutableMapping[str, str]) -> str:
    pid, _, path = environ.get(PARSED_CONFIG_ENV, "").partition(":")
    return path if pid == str(os.getpid()) else ""


def remember_dump_config(environ: MutableMapping[str, str], config_path: str, config: dict) -> None:
    """Record the config MindSpore will parse, or refuse one that differs from what it parsed already."""
    parsed = _parsed_config(environ)
    if parsed and (parsed != config_path or _read_json(parsed) != config):
        raise BackendSetupError(
            f"MindSpore reads its dump configuration once per process and this process already uses {parsed}; "
            f"statistics with other settings ({config_path}) need a new process")
    environ[PARSED_CONFIG_ENV] = f"{os.getpid()}:{config_path}"


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def check_not_ge(choice: CompileBackend) -> None:
    """Under GE (graph sink) there is no kernel-by-kernel dump; MindSpore only warns (DJP ParseKernels)."""
    if choice.is_ge:
        raise BackendSetupError(
            f"the statistics task in Ascend graph mode uses MindSpore's kernel-by-kernel dump, which the GE backend "
            f"does not have, and MindSpore would compile with GE: {choice.reason}. Set jit_level O0 or O1 (context "
            "jit_config, or the network's JitConfig; launch with msrun rather than a rank table), or use task: tensor")
