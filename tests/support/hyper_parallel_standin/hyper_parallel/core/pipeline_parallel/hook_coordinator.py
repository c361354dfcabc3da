"""Stand-in of ``hyper_parallel/core/pipeline_parallel/hook_coordinator.py``."""

from hyper_parallel._standin import HookRole, needs_cards  # noqa: F401  (2.1 imports HookRole from here)

HookCoordinator = needs_cards("HookCoordinator", "hyper_parallel/core/pipeline_parallel/hook_coordinator.py")
