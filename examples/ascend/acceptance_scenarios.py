"""Small-network scenarios of the acceptance run: one defect each that the MindFormers runs cannot show.

Each ``scenario_*(workdir, emulate)`` trains or attaches a small network of
``tests/support`` in graph mode, processes what it captured and returns the checks of
``acceptance_checks.py`` over it. On an NPU (``emulate=False``) MindSpore's own Ascend
primitives run; with ``emulate=True`` the CPU emulation of ``tests/support/ascend_emulation.py``
stands in for them, with the same flags. ``acceptance.py`` runs each scenario in a process
of its own (MindSpore keeps TensorDump settings once per process); the defect-injection
test (``tests/test_acceptance_defects.py``) runs them in one pytest process, each with a
fresh emulator. Scenarios that need parallelism the host lacks say so in a SKIP line.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import acceptance_checks as ac  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import JitConfig, Tensor, nn, ops  # noqa: E402

import mf_celldump  # noqa: E402
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives  # noqa: E402
from mf_celldump.config import DumpConfig  # noqa: E402
from mf_celldump.integrations.run import TrainingRun  # noqa: E402
from tests.support import capture_net as cn  # noqa: E402
from tests.support import formats as fmt  # noqa: E402
from tests.support import low_precision_net as lp  # noqa: E402
from tests.support import micro_batch_net as mb  # noqa: E402
from tests.support import pipeline_schedules as ps  # noqa: E402
from tests.support import redistribution_net as rn  # noqa: E402

Checks = List[ac.Check]
SKIP = "SKIP"  # a check text starting with this is neither PASS nor FAIL: the host cannot run it
STEPS, SELECTED = 5, "1,3"
MICRO = 4
TENSOR = {"task": "tensor", "backend": "tensordump"}
STATISTICS = {"task": "statistics", "backend": "kbk_statistics"}
# The emulated device: files trail the steps (latency, some written header first and data later).
RACE = {"latency": 0.004, "slow_every": 5, "slow_seconds": 0.05}
PROBED_SLOTS = (fmt.SLOT_ARG, fmt.SLOT_KWARG, fmt.SLOT_OUTPUT)  # a cell's values (not weights) have a gradient hook
# How long processing waits for MindSpore's writer (None: mf_celldump's default, 600 s); the defect-injection
# test shortens it, since a re-injected defect may leave a step that never completes.
WAIT_S: Optional[float] = None


@dataclass
class Device:
    """The Ascend primitives of one scenario: MindSpore's own, or a fresh emulator's (``emulate``)."""

    emulate: bool
    options: dict = field(default_factory=dict)
    emulator: object = None

    def __enter__(self) -> Device:
        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU" if self.emulate else "Ascend")
        if self.emulate:
            from tests.support.ascend_emulation import AscendEmulator

            self.emulator = AscendEmulator(**self.options)
            self._saved = AscendPrimitives.__dict__["from_mindspore"]
            emulator = self.emulator
            AscendPrimitives.from_mindspore = classmethod(lambda cls: emulator.primitives())
        return self

    def tensordump(self) -> Callable:
        """A TensorDump of the user's own code (not capture's)."""
        return self.emulator.tensordump() if self.emulate else ops.TensorDump()

    def sync(self) -> None:
        """The device synchronisation a training loop does after each step."""
        if self.emulate:
            self.emulator.synchronize()
        else:
            ms.runtime.synchronize()

    def drain(self) -> None:
        if self.emulate:
            self.emulator.drain()
        else:
            ms.runtime.synchronize()

    def __exit__(self, *exc) -> None:
        if self.emulate:
            AscendPrimitives.from_mindspore = self._saved
            self.emulator.close()


@contextlib.contextmanager
def logged() -> Iterator[io.StringIO]:
    """mf_celldump's log records (warnings and up) of the block, as text."""
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("mf_celldump")
    logger.addHandler(handler)
    try:
        yield text
    finally:
        logger.removeHandler(handler)


def train(dump_path: str, config: dict, step_cell, network, x, steps: int, first: int = 0, attach_at: int = 0,
          wait_timeout: Optional[float] = None):
    """A TrainingRun over ``steps`` steps from global step ``first`` (attached to ``network``, else the step
    cell, for ``attach_at``); its summary."""
    wait = WAIT_S if wait_timeout is None else wait_timeout
    run = TrainingRun(DumpConfig.coerce(dict(config, dump_path=dump_path)), wait_timeout=wait)
    run.ensure_attached(step_cell if network is None else network, initial_step=attach_at)
    for step in range(first, first + steps):
        run.begin_step(step)
        step_cell(x)
        run.end_step()
    return run.finish()


def _error(call: Callable[[], object]) -> Optional[str]:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - any failure is the check's evidence
        return f"{type(err).__name__}: {err}"
    return None


def pynative_reference(dump_path: str, emulate: bool) -> None:
    """The capture net in PyNative with MindSpore's own TensorDump: the values graph capture must reproduce."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU" if emulate else "Ascend")
    net = cn.make_net()
    train(dump_path, dict(TENSOR, steps=SELECTED), cn.train_one_step_cell(net), None, cn.make_input(), STEPS)


def keyed(reference: Dict[tuple, np.ndarray]) -> Dict[tuple, np.ndarray]:
    """A test reference keyed (entry, io, index) as ``acceptance_checks.read_step`` keys leaves (index as text)."""
    return {(entry, io, str(index)): value for (entry, io, index), value in reference.items()}


def _reference_arrays(dump_path: str, step: int) -> Dict[tuple, np.ndarray]:
    leaves, arrays = ac.read_step(dump_path, step)
    return {key: arrays[leaf["data_name"]] for key, leaf in leaves.items() if leaf.get("data_name") in arrays}


# -- the steps filter, asynchronous writes, statistics -----------------------------------------------------
def scenario_steps(workdir: str, emulate: bool) -> Checks:
    """steps "1,3" of 5; on the emulated device files trail the steps (a race with processing)."""
    reference, dump = os.path.join(workdir, "pynative"), os.path.join(workdir, "graph")
    pynative_reference(reference, emulate)
    with Device(emulate, dict(RACE)):
        net = cn.make_net()
        summary = train(dump, dict(TENSOR, steps=SELECTED), cn.train_one_step_cell(net), None, cn.make_input(),
                        STEPS)
    checks = [ac.check_step_folders(dump, [1, 3]), ac.check_no_problem("graph tensor", summary.problems),
              ac.check_no_raw_left(dump)]
    for step in (1, 3):
        got, want = ac.read_step(dump, step)[1], ac.read_step(reference, step)[1]
        checks += [ac.check_no_missing_file(got, want, step), ac.check_no_foreign_file(got, want, step),
                   ac.check_same_values(got, want, step, 1e-5, 1e-6)]
    return checks


def scenario_past(workdir: str, emulate: bool) -> Checks:
    """Attached before the first step is known (compile time), then resumed at global step 100: steps "1,3"
    are all in the past, so MindSpore's filter must hold no step (never the empty list, which is all)."""
    dump = os.path.join(workdir, "past")
    with Device(emulate):
        net = cn.make_net()
        summary = train(dump, dict(TENSOR, steps=SELECTED), cn.train_one_step_cell(net), None, cn.make_input(), 3,
                        first=100, wait_timeout=5.0)
    return [ac.check_nothing_written(dump), ac.check_no_problem("past", summary.problems, ac.EMPTY_FILTER)]


def scenario_statistics(workdir: str, emulate: bool) -> Checks:
    """The statistics task, steps "1,3": forward and backward rows named as ours, values of PyNative's tensors."""
    reference, dump = os.path.join(workdir, "pynative"), os.path.join(workdir, "statistics")
    pynative_reference(reference, emulate)
    with Device(emulate, dict(RACE)):
        net = cn.make_net()
        summary = train(dump, dict(STATISTICS, steps=SELECTED), cn.train_one_step_cell(net), None, cn.make_input(),
                        STEPS)
    checks = [ac.check_step_folders(dump, [1, 3]), ac.check_no_problem("statistics", summary.problems, ac.TD_FLAG)]
    for step in (1, 3):
        checks.append(ac.check_statistics(ac.read_step(dump, step)[0], _reference_arrays(reference, step), 1e-5,
                                          ac.TD_FLAG))
    return checks


def scenario_statistics_resumed(workdir: str, emulate: bool) -> Checks:
    """The statistics task in a run resumed at global step 100, steps "101": MindSpore's dump iteration counts
    from 0 in every process, so capture pins it to the global step; step 101 holds step 1's statistics."""
    reference, dump = os.path.join(workdir, "pynative"), os.path.join(workdir, "resumed")
    pynative_reference(reference, emulate)
    with Device(emulate):
        net = cn.make_net()
        summary = train(dump, dict(STATISTICS, steps="101"), cn.train_one_step_cell(net), None, cn.make_input(), 3,
                        first=100, attach_at=100)
    return [ac.check_step_folders(dump, [101], ac.KBK_ITERATION),
            ac.check_no_problem("resumed statistics", summary.problems, ac.KBK_ITERATION),
            ac.check_statistics(ac.read_step(dump, 101)[0], _reference_arrays(reference, 1), 1e-5, ac.KBK_ITERATION)]


def scenario_bf16(workdir: str, emulate: bool) -> Checks:
    """bfloat16 and float16 at cell boundaries: statistics equal float64 statistics of the exact values."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU" if emulate else "Ascend")
    want = keyed({key: array for key, (_, array) in lp.reference(lp.make_net(), lp.make_input()).items()})
    dump = os.path.join(workdir, "bf16")
    with Device(emulate):
        net = lp.make_net()
        step_cell = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.0))
        summary = train(dump, dict(STATISTICS, steps="0", parameters=False), step_cell, step_cell, lp.make_input(), 1)
    return [ac.check_no_problem("bf16 statistics", summary.problems, ac.BF16),
            ac.check_statistics(ac.read_step(dump, 0)[0], want, 2e-6, ac.BF16)]


# -- micro-batches, redistribution, 'in' pairing -------------------------------------------------------------
def process(captured):
    """Process what ``captured`` wrote (waiting for MindSpore's writer up to ``WAIT_S``)."""
    return mf_celldump.process_captured(captured, **({} if WAIT_S is None else {"timeout": WAIT_S}))


def _attach_once(dump_path: str, network, config: dict, run: Callable[[], object]):
    """Attach, one captured step 0 of ``run``, detach; (dump, error)."""
    dump = mf_celldump.attach(network, dict({"parameters": False}, **config, dump_path=dump_path,
                                            process_on_train_end=False))
    try:
        with dump.step(0):
            run()
    finally:
        dump.detach()
    return dump


def scenario_micro_batches(workdir: str, emulate: bool) -> Checks:
    """Gradient accumulation over 4 micro-batches: backward.k holds micro-batch k's gradients (mindspore.grad
    of that micro-batch alone). On the emulated device the accumulation runs in the order MindSpore's
    scheduler gives it (tests/support/pipeline_schedules.py); on an NPU MindSpore's GradAccumulationCell."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU" if emulate else "Ascend")
    want = keyed(mb.reference(mb.make_model(), mb.make_batch(MICRO), MICRO))
    dump = os.path.join(workdir, "micro")
    if not emulate:  # MindSpore orders micro-batches only under (semi-)auto parallel (launched by msrun)
        from mindspore.communication import init

        init()
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    with Device(emulate, {"latency": 0.001, "parallel": True}) as device:
        model = mb.make_model()
        if emulate:
            network = mb.ScheduledGradAccumulation(model, MICRO, ps.grad_accumulation(MICRO), 1,
                                                   folder=os.path.join(workdir, "source"))
        else:
            network = nn.TrainOneStepCell(nn.GradAccumulationCell(model, MICRO), nn.SGD(model.trainable_params(), 0.0))
        captured = _attach_once(dump, network, TENSOR, lambda: network(mb.make_batch(MICRO)))
        device.drain()
    report = process(captured)
    leaves, arrays = ac.read_step(dump, 0)
    return [ac.check_no_problem("micro-batches", report.all_problems, ac.MICRO_BATCHES),
            ac.check_micro_batches(leaves, arrays, want)]


def scenario_redistribution(workdir: str, emulate: bool) -> Checks:
    """Values fed to 2 and 3 consumers that each need a redistribution (MindSpore's parallel pass dumps them once
    per consumer): one call each, the gradient the sum of the parts. Emulated (RedistributedValue); on NPUs the
    tensor-parallel MindFormers run meets it."""
    if not emulate:
        return [(True, f"{SKIP} [{ac.REDISTRIBUTION}] small-network redistribution is emulated only; on NPUs "
                       "the tp2 run covers it (needs 2 NPUs)")]
    from tests.support.ascend_emulation import RedistributedValue

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    want = rn.reference(rn.make_net(), rn.make_input())
    mapping, dump = os.path.join(workdir, "fans.yaml"), os.path.join(workdir, "redistribution")
    with open(mapping, "w", encoding="utf-8") as handle:
        handle.write(rn.MAPPING)
    with Device(emulate, {"parallel": True, "latency": 0.001}) as device:
        values = {name: RedistributedValue(device.emulator, layouts) for name, layouts in rn.LAYOUTS.items()}
        net = rn.make_net({name: [v.consumer(i) for i in range(len(v.layouts))] for name, v in values.items()})
        config = dict(TENSOR, layer_mapping=[mapping], parameters=False, process_on_train_end=False,
                      dump_path=dump)
        captured = mf_celldump.attach(net, config)
        cells = {s.name: s.cell_id for s in captured.cells}
        for name, value in values.items():
            value.bind(*(fmt.raw_stem(fmt.Key(cells[name], d, fmt.SLOT_ARG, fmt.KIND_TENSOR, (0,), None), ".")
                         for d in (fmt.FORWARD, fmt.BACKWARD)))
        with captured.step(0):
            ms.grad(net, weights=net.trainable_params())(rn.make_input())
        captured.detach()
        device.drain()
    report = process(captured)
    leaves, arrays = ac.read_step(dump, 0)
    return [ac.check_no_problem("redistribution", report.all_problems, ac.REDISTRIBUTION),
            ac.check_redistribution(leaves, arrays, "fan2", want["fan2"]["input"], want["fan2"]["gradient"]),
            ac.check_redistribution(leaves, arrays, "fan3", None, None),
            ac.check_one_value_from_copies(leaves, arrays, "fan2", want["fan2"]["input"])]


def _parallel_pass_run(workdir: str, name: str, config: dict, row_dtype) -> tuple:
    """One captured step of tests/support/parallel_pass_net.py under the emulated parallel pass:
    (error or None, leaves, arrays, problems)."""
    from tests.support import parallel_pass_net as pn
    from tests.support.ascend_emulation import ForwardCommunication, RedistributedValue

    mapping, dump = os.path.join(workdir, "pass.yaml"), os.path.join(workdir, name)
    with open(mapping, "w", encoding="utf-8") as handle:
        handle.write(pn.MAPPING)
    sep = "-" if config["backend"] == "kbk_statistics" else "."
    with Device(True, {"parallel": True, "latency": 0.001}) as device:
        values = {cell: RedistributedValue(device.emulator, layouts) for cell, layouts in pn.LAYOUTS.items()}
        comm = ForwardCommunication(device.emulator, 2)
        net = pn.make_net({cell: [v.consumer(i) for i in range(len(v.layouts))] for cell, v in values.items()},
                          comm.allreduce(), row_dtype)
        captured = mf_celldump.attach(net, dict(config, layer_mapping=[mapping], parameters=False,
                                                process_on_train_end=False, dump_path=dump))
        cells = {s.name: s.cell_id for s in captured.cells}

        def stem(cell, direction, slot):
            wide = "-wbfloat16" if cell == "widened" and sep == "-" else ""  # the statistics' float32 copy
            return fmt.raw_stem(fmt.Key(cells[cell], direction, slot, fmt.KIND_TENSOR, (0,), None), sep) + wide

        for cell, value in values.items():
            value.bind(stem(cell, fmt.FORWARD, fmt.SLOT_ARG), stem(cell, fmt.BACKWARD, fmt.SLOT_ARG))
        comm.bind(stem("row", fmt.FORWARD, fmt.SLOT_OUTPUT))

        def one_step():
            with captured.step(0):
                ms.grad(net, weights=net.trainable_params())(pn.make_input())

        error = _error(one_step)
        captured.detach()
        device.drain()
    if error is not None:
        return error, {}, {}, []
    report = process(captured)
    return (None,) + ac.read_step(dump, 0) + (report.all_problems,)


def scenario_parallel_pass(workdir: str, emulate: bool) -> Checks:
    """What MindSpore's parallel pass does beyond per-consumer copies (parallel_tensordump.cc): copies after our
    cast back, 'out' dumps re-pointed before a forward AllReduce, copies of one shape from different regions,
    'out' gradient hooks lost for users outside the consumers. Emulated (RedistributedValue,
    ForwardCommunication); on NPUs the tp2 run meets them, values unchecked."""
    labels = (ac.WIDENED_IN, ac.FORWARD_COMM, ac.REGIONS, ac.OUTSIDE_USER)
    if not emulate:
        return [(True, f"{SKIP} [{label}] emulated only; on NPUs the tp2 run meets it (needs 2 NPUs)")
                for label in labels]
    from tests.support import parallel_pass_net as pn

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    want = pn.reference(pn.make_net(), pn.make_input(), 2)
    checks = []
    widened = {("Cell.widened.Widened.forward.0", "input", "0"): want["widened"]["input"],
               ("Cell.widened.Widened.backward.0", "output", "0"): want["widened"]["gradient"]}
    outside = {("Cell.outside.Outside.backward.0", "output", "0"): want["outside"]["gradient"]}
    error, leaves, _, problems = _parallel_pass_run(workdir, "statistics", STATISTICS, ms.float32)
    checks.append(ac.check_no_problem("statistics under the parallel pass", problems + [error] * bool(error),
                                      ac.WIDENED_IN))
    checks.append(ac.check_statistics(leaves, widened, 2e-6, ac.WIDENED_IN))
    checks.append(ac.check_statistics(leaves, outside, 2e-6, ac.OUTSIDE_USER, directions=("backward",)))
    error, leaves, arrays, problems = _parallel_pass_run(workdir, "tensor", TENSOR, ms.float32)
    checks.append(ac.check_no_problem("tensor under the parallel pass", problems + [error] * bool(error),
                                      ac.REGIONS))
    checks.append(ac.check_regions(leaves, arrays, "Cell.regions.Regions", want["regions"]["takes"]))
    checks.append(ac.check_whole_gradient(leaves, arrays, "Cell.outside.Outside", want["outside"]["gradient"],
                                          ac.OUTSIDE_USER))
    error, _, _, _ = _parallel_pass_run(workdir, "refused", STATISTICS, ms.bfloat16)
    checks.append(ac.check_refused("statistics of a bfloat16 AllReduce output in 'out' mode", error,
                                   "MakeOutModeDumpBeforeFwdComm", ac.FORWARD_COMM))
    return checks


def scenario_in_pairing(workdir: str, emulate: bool) -> Checks:
    """A layer mapping's 'in' mode under (semi-)auto parallel: MindSpore names those dumps ``_in``; every gradient
    hook is 'in' (named ``_in`` too), which the parallel pass leaves on the producer side, where every user's
    share of the gradient is summed (an 'out' hook it would clone onto the consumers only)."""
    if not emulate:
        return [(True, f"{SKIP} [{ac.IN_PAIRING}] needs (semi-)auto parallel: the tp2 run covers it (2 NPUs)")]
    mapping, dump = os.path.join(workdir, "mapping.yaml"), os.path.join(workdir, "in_modes")
    with open(mapping, "w", encoding="utf-8") as handle:
        handle.write("Net:\n  gate: gate([in, _, in], [in])\n  shared: shared([in], [out])\n")
    with Device(emulate, {"parallel": True}) as device:
        net = cn.make_net()
        step_cell = cn.train_one_step_cell(net)
        captured = _attach_once(dump, step_cell, dict(TENSOR, layer_mapping=[mapping]),
                                lambda: step_cell(cn.make_input()))
        device.drain()
        names = [os.path.basename(p) for p in device.emulator.written_files]
    forward_in, hooks = set(), {}  # probes dumped 'in'; a probe's gradient -> named '_in' (an 'in' hook)
    for parsed in filter(None, map(fmt.parse_raw_tensor_name, names)):
        key = parsed.key
        probe = (key.cell_id, key.slot, key.path)
        if key.direction == fmt.FORWARD and parsed.in_mode:
            forward_in.add(probe)
        elif key.direction == fmt.BACKWARD and key.kind == fmt.KIND_TENSOR and key.slot in PROBED_SLOTS:
            hooks[probe] = parsed.in_mode
    consumer_side = sorted(probe for probe, in_mode in hooks.items() if not in_mode)
    report = process(captured)
    return [ac.check_no_problem("in modes", report.all_problems, ac.IN_PAIRING),
            (bool(forward_in) and bool(hooks) and not consumer_side,
             f"[{ac.IN_PAIRING}] {len(forward_in)} forward dumps in 'in' mode; every gradient hook 'in' "
             f"({len(hooks) - len(consumer_side)} of {len(hooks)}; an 'out' one the pass clones per consumer)")]


# -- control flow ---------------------------------------------------------------------------------------------
LAYERS = 3


class Layer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = nn.Dense(4, 4)

    def construct(self, x):
        return ops.tanh(self.lin(x)) * 0.5 + x


class LayerLoop(nn.Cell):
    """MindFormers' layer loop: a constant-range loop over a CellList (MindSpore unrolls it)."""

    def __init__(self):
        super().__init__()
        self.num_layers = LAYERS
        self.layers = nn.CellList([Layer() for _ in range(LAYERS)])

    def construct(self, x):
        h = x
        for i in range(self.num_layers):
            h = self.layers[i](h)
        return (h * h).sum()


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale training cell (``if not overflow: ... self.optimizer(grads)``) with an overflow check
    that runs on CPU; on an NPU MindSpore's own is used."""

    def start_overflow_check(self, pre_cond, compute_input):
        return Tensor([0] * 8, ms.int32), compute_input

    def get_overflow_status(self, status, compute_output):
        return ops.stack([ops.logical_not(ops.isfinite(grad).all()) for grad in compute_output]).any()


def scenario_control_flow(workdir: str, emulate: bool) -> Checks:
    """The layer loop unrolls (every layer captured); the optimizer runs under ``if not overflow``, a branch where
    TensorDump is unsupported: the weight gradients are recorded before it, where autodiff gives them."""
    dump = os.path.join(workdir, "control_flow")
    with Device(emulate, {"latency": 0.001}) as device:
        net = LayerLoop()
        cell = CpuLossScaleCell if emulate else nn.TrainOneStepWithLossScaleCell
        step_cell = cell(net, nn.SGD(net.trainable_params(), 0.0), scale_sense=Tensor(1.0, ms.float32))
        held: Dict[str, object] = {}
        error = _error(lambda: held.setdefault("dump", _attach_once(
            dump, step_cell, dict(TENSOR, parameters=True), lambda: step_cell(Tensor(np.ones((2, 4), np.float32))))))
        device.drain()
    if error is not None:
        return [(False, f"[{ac.CONTROL_FLOW}] {ac.check_ran('control flow', error)[1]}")]
    process(held["dump"])
    leaves = ac.read_step(dump, 0)[0]
    layers = [i for i in range(LAYERS) if (f"Cell.layers.{i}.Layer.forward.0", "output", "0") in leaves]
    return [ac.check_count("control flow: layers of the unrolled loop captured", len(layers), LAYERS,
                           ac.CONTROL_FLOW),
            ac.check_weight_gradients_before_the_branch(leaves, dump)]


# -- what MindSpore keeps once per process --------------------------------------------------------------------
def _files_under(folder: str, want: Optional[int] = None, timeout: float = 30.0) -> int:
    """Files under ``folder``; with ``want``, waiting up to ``timeout`` s for MindSpore's writer thread."""
    deadline = time.monotonic() + timeout
    while True:
        count = sum(len(files) for _, _, files in os.walk(folder))
        if want is None or count >= want or time.monotonic() > deadline:
            return count
        time.sleep(0.2)


def scenario_step_filter(workdir: str, emulate: bool) -> Checks:
    """A TensorDump of the user's own step cell, every step; capture of step "1" attached for 3 steps, then 3
    steps more: after detach the user's TensorDump writes again on every step (the filter is process-wide)."""
    user, dump = os.path.join(workdir, "user"), os.path.join(workdir, "filter")
    with Device(emulate, {"latency": 0.001}) as device:
        user_dump = device.tensordump()
        net = cn.make_net()
        train_cell = cn.train_one_step_cell(net)

        class UserStep(nn.Cell):
            def __init__(self):
                super().__init__()
                self.train = train_cell

            def construct(self, x):
                loss = self.train(x)
                return ops.depend(loss, user_dump(os.path.join(user, "finish_step"), ops.zeros((1,), ms.float32)))

        step_cell, x = UserStep(), cn.make_input()
        summary = train(dump, dict(TENSOR, steps="1"), step_cell, train_cell, x, 3)
        device.drain()
        before = _files_under(user, 1)  # the captured step's file
        for _ in range(3):
            step_cell(x)
            device.sync()
        device.drain()
    after = _files_under(user, before + 3, timeout=5.0 if emulate else 30.0) - before
    return [ac.check_no_problem("step filter", summary.problems, ac.STEP_FILTER),
            ac.check_count("the user's TensorDump files of the 3 steps after detach", after, 3, ac.STEP_FILTER)]


def scenario_second_kind(workdir: str, emulate: bool) -> Checks:
    """A statistics capture, then a tensor capture in the same process: MindSpore read MS_KERNEL_LAUNCH_SKIP
    once, so no TensorDump would write; the tensor capture must be refused at attach, not wait in silence."""
    with Device(emulate) as device:
        net = cn.make_net()
        step_cell = cn.train_one_step_cell(net)
        first = train(os.path.join(workdir, "first"), dict(STATISTICS, steps="0"), step_cell, None, cn.make_input(), 1)
        device.drain()
        step_cell = cn.train_one_step_cell(cn.make_net())
        error = _error(lambda: _attach_once(os.path.join(workdir, "second"), step_cell, TENSOR,
                                            lambda: step_cell(cn.make_input())))
    return [ac.check_no_problem("statistics capture", first.problems, ac.SECOND_KIND),
            ac.check_refused("tensor capture after a statistics capture", error, "new process", ac.SECOND_KIND)]


# -- big dumps, the GE backend, the TensorDump channel, the MindSpore version --------------------------------
SLICE_ENV = {"MS_DUMP_SLICE_SIZE": "1", "MS_DUMP_WAIT_TIME": "60"}


@contextlib.contextmanager
def environment(values: Dict[str, Optional[str]]) -> Iterator[None]:
    """``os.environ`` changed for the block (None: unset): what attach reads on an NPU."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


def scenario_slicing(workdir: str, emulate: bool) -> Checks:
    """Attach without MS_DUMP_SLICE_SIZE advises the settings; with them a dump larger than the device channel
    takes in one piece completes (emulated channel limit 1 MiB, tensor 2 MiB; on an NPU 64 MiB with the
    settings acceptance.py exports)."""
    from tests.support.ascend_emulation import DeviceSettings

    unset = {"MS_DUMP_SLICE_SIZE": None, "MS_DUMP_WAIT_TIME": None}
    with Device(emulate, {"environ": {}}), environment(unset), logged() as log:
        mf_celldump.attach(cn.Big(), dict(TENSOR, dump_path=os.path.join(workdir, "advised"))).detach()
    advice = ac.check_said("attach without MS_DUMP_SLICE_SIZE", log.getvalue(), "export MS_DUMP_SLICE_SIZE=",
                           ac.SLICING)
    rows = 512 if emulate else 16384
    value = np.arange(rows * 1024, dtype=np.float32).reshape(rows, 1024) / 1000.0
    dump = os.path.join(workdir, "big")
    options = {"environ": dict(SLICE_ENV), "device": DeviceSettings(mbuf_limit_bytes=1 << 20)} if emulate else {}
    with Device(emulate, options) as device:
        held: Dict[str, object] = {}
        net = cn.Big()
        error = _error(lambda: held.__setitem__("dump", _attach_once(dump, net, dict(TENSOR, data_mode="forward"),
                                                                      lambda: net(Tensor(value)))))
        device.drain()
    if error is not None:
        return [advice, (False, f"[{ac.SLICING}] {ac.check_ran('big dump', error)[1]}")]
    process(held["dump"])
    leaves, arrays = ac.read_step(dump, 0)
    leaf = leaves.get(("Cell.double.Doubles.forward.0", "output", "0"), {})
    done = leaf.get("data_name") in arrays and np.array_equal(arrays[leaf["data_name"]], value * 2.0)
    return [advice, (done, f"[{ac.SLICING}] a {value.nbytes >> 20} MiB tensor written whole and exact")]


def scenario_ge_check(workdir: str, emulate: bool) -> Checks:
    """The statistics task has no kernel-by-kernel dump under GE: refused at attach however GE is chosen (a cell's
    JitConfig backend, a rank-table launch), not only by jit_level O2."""
    checks = []
    cases = (("cell JitConfig(jit_level='O1', backend='GE')", JitConfig(jit_level="O1", backend="GE"), {}),
             ("RANK_TABLE_FILE launch", None, {"RANK_TABLE_FILE": "/cluster/rank_table.json"}))
    for case, jit_config, environ in cases:
        with Device(emulate, {"environ": dict(environ)}), environment(dict(environ)):
            net = cn.make_net()
            if jit_config is not None:
                net.set_jit_config(jit_config)
            config = dict(STATISTICS, dump_path=os.path.join(workdir, "ge"))
            error = _error(lambda net=net, config=config: mf_celldump.attach(net, config).detach())
        checks.append(ac.check_refused(f"statistics with {case}", error, "GE backend does not have", ac.GE_CHECK))
    return checks


def scenario_channel(workdir: str, emulate: bool) -> Checks:
    """Graph TensorDump writes nothing unless MindSpore's backend policy is "ge" (the channel is not opened):
    refused at attach. On an NPU the policy is "ge"; only the emulation can set another."""
    if not emulate:
        return [(True, f"{SKIP} [{ac.CHANNEL}] an NPU's backend policy is always 'ge'")]
    from tests.support.ascend_emulation import DeviceSettings

    with Device(emulate, {"device": DeviceSettings(backend_policy="ms")}):
        error = _error(lambda: mf_celldump.attach(cn.make_net(), dict(TENSOR, dump_path=os.path.join(
            workdir, "channel"))).detach())
    return [ac.check_refused("tensor capture under backend policy 'ms'", error, "OpenTsd", ac.CHANNEL)]


def scenario_version(workdir: str, emulate: bool) -> Checks:
    """MindSpore older than 2.7 (other TensorDump step semantics) is refused at attach, before anything is written."""
    saved = ms.__version__
    ms.__version__ = "2.6.0"
    try:
        with Device(emulate):
            error = _error(lambda: mf_celldump.attach(cn.make_net(), {"dump_path": os.path.join(workdir, "old")}))
    finally:
        ms.__version__ = saved
    return [ac.check_refused("MindSpore 2.6.0", error, "needs MindSpore 2.7.0 or later", ac.VERSION)]


SCENARIOS = {name[len("scenario_"):]: value for name, value in list(globals().items())
             if name.startswith("scenario_")}
