"""One rank of a 2-rank data-parallel msrun job: gradient accumulation captured in both modes.

    msrun --worker_num=2 ... tests/support/micro_batch_worker.py OUTPUT_DIR

Each rank trains its own micro-batches (seed = rank) through ``nn.GradAccumulationCell``
in PyNative (tensordump backend) and ``mindspore.parallel.nn.GradAccumulation`` in graph
mode (host backend), gradients all-reduced by ``TrainOneStepCell``'s reducer; it checks its
own processed dump against ``mindspore.grad`` per micro-batch (tests/support/micro_batch_net.py)
and writes ``OUTPUT_DIR/result_rank{R}.json``: per case, the entries checked and any that
differ. The test asserts on those files.
"""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

MICRO = 3
CASES = (("pynative", "tensordump", "GradAccumulationCell"), ("graph", "host", "GradAccumulation"))


def _check(out_dir, rank, reference):
    import numpy as np

    from tests.support.processed import read_output

    leaves, arrays = read_output(out_dir, 0, f"rank{rank}")
    bad = []
    for key, want in reference.items():
        if key not in leaves:
            bad.append(f"missing {key}")
        elif not np.allclose(arrays[leaves[key]["data_name"]], want, rtol=1e-5, atol=1e-6):
            bad.append(f"differs {key}")
    first = reference[("Cell.front.inp.Block.forward.0", "output", 0)]
    return {"checked": len(reference), "bad": bad, "first": first.reshape(-1)[:4].tolist()}


def _case(out, rank, mode, backend, wrapper):
    import mindspore as ms
    from mindspore import nn
    from mindspore.parallel.nn import GradAccumulation

    import mf_celldump
    from tests.support import micro_batch_net as mb

    ms.set_context(mode=ms.PYNATIVE_MODE)
    batch = mb.make_batch(MICRO, seed=rank)
    reference = mb.reference(mb.make_model(), batch, MICRO)
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    model = mb.make_model()
    wrapped = (nn.GradAccumulationCell if wrapper == "GradAccumulationCell" else GradAccumulation)(model, MICRO)
    train = nn.TrainOneStepCell(wrapped, nn.SGD(model.trainable_params(), 0.0))
    path = os.path.join(out, mode)
    dump = mf_celldump.attach(train, {"dump_path": path, "task": "tensor", "backend": backend, "parameters": False,
                                      "process_on_train_end": False})
    with dump.step(0):
        train(batch)
    dump.detach()
    report = mf_celldump.process_captured(dump)
    result = _check(path, rank, reference) if report.ok else {"checked": 0, "bad": [report.summary()]}
    return dict(result, distributed=dump.distributed)


def main(out: str) -> int:
    import mindspore as ms
    from mindspore.communication import get_rank, init

    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    results = {"/".join(case): _case(out, rank, *case) for case in CASES}
    with open(os.path.join(out, f"result_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
