"""CellDumpCallback without MindFormers training: construction, the compile hook, step bookkeeping,
registration, the MindFormers 2.x callback protocol (stand-in), on a small real network.

Training runs go in subprocesses (MindSpore's execution mode is per process).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

PYTHON = sys.executable

# A small network trained by Model.train with the callback; argv: MODE SCENARIO DUMP_PATH
SMALL_NET = textwrap.dedent('''
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    import mindspore.dataset as ds
    mode, scenario, dump_path = sys.argv[1:4]
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    from mindspore.train import Model
    from mf_celldump import CellDumpCallback
    from mf_celldump.capture.session import find_attached

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 8)
            self.act = nn.ReLU()
            self.fc2 = nn.Dense(8, 2)
        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    def gen():
        rng = np.random.default_rng(0)
        for _ in range(6):
            yield rng.standard_normal(4).astype(np.float32), rng.standard_normal(2).astype(np.float32)

    data = ds.GeneratorDataset(gen, ["x", "y"], shuffle=False).batch(2)
    net = Net()
    original_build = Model.__dict__["build"]
    ranks = [3] if scenario == "otherrank" else "all"
    data_mode = "forward" if scenario.endswith("-forward") else "all"
    cb = CellDumpCallback(dump_path=dump_path, steps=[0, 2], task="tensor", layer_mapping=None, ranks=ranks,
                          data_mode=data_mode)
    assert Model.__dict__["build"] is not original_build, "hook not installed"
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    if scenario.startswith("precompile"):
        # Compile the training graph in Model.build, as MindFormers does before Model.train
        # on Ascend; Model.build's own _init refuses CPU, so compile the first batch here.
        def cpu_init(self, train_dataset=None, valid_dataset=None, sink_size=-1, epoch=1, sink_mode=True):
            helper, network = self._exec_preprocess(is_train=True, dataset=train_dataset,
                                                    dataset_sink_mode=False, sink_size=sink_size)
            for inputs in helper:
                network.compile(*inputs)
                break
            train_dataset.reset()
        Model._init = cpu_init
        if scenario.startswith("precompile-nohook"):
            cb._hook.remove()
        model.build(train_dataset=data, epoch=1, sink_mode=False)
        print("ATTACHED_BEFORE_TRAIN", find_attached(net) is not None)
    model.train(1, data, callbacks=[cb], dataset_sink_mode=False)
    print("HOOK_RESTORED", Model.__dict__["build"] is original_build)
    print("DETACHED", find_attached(net) is None)
    s = cb.summary
    print("SUMMARY", json.dumps({"processed": sorted(s.processed_steps), "entries": s.entries,
                                 "empty": s.empty_steps, "problems": s.problems, "notes": s.notes}))
''')


def _run_small(tmp_path, mode, scenario):
    script = tmp_path / "small_net.py"
    script.write_text(SMALL_NET)
    dump = tmp_path / "dump"
    proc = subprocess.run([PYTHON, str(script), mode, scenario, str(dump)], cwd=tmp_path, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if line.split(" ", 1)[0] in ("SUMMARY", "HOOK_RESTORED", "DETACHED", "ATTACHED_BEFORE_TRAIN")}
    return json.loads(lines["SUMMARY"]), lines, proc.stdout, dump


def _entries(dump, step):
    with open(dump / f"step{step}" / "rank" / "dump.json", encoding="utf-8") as handle:
        return set(json.load(handle)["data"])


# ----------------------------------------------------------------------------------------
def test_import_does_not_import_mindformers(tmp_path):
    code = ("import sys, mf_celldump; cls = mf_celldump.CellDumpCallback; "
            "assert 'mindformers' not in sys.modules, 'mindformers imported'; print(cls.__name__)")
    proc = subprocess.run([PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "CellDumpCallback"
    assert not (tmp_path / "output").exists()


def test_constructor_validates_before_training():
    from mindspore.train import Model

    from mf_celldump import CellDumpCallback, ConfigError

    build = Model.__dict__["build"]
    with pytest.raises(ConfigError, match="did you mean 'tensor'"):
        CellDumpCallback(task="tensr")
    with pytest.raises(ConfigError, match="unknown key 'step'.*'steps'"):
        CellDumpCallback(step=1)
    assert Model.__dict__["build"] is build, "a failed construction must not leave the hook installed"


def test_constructor_accepts_config_and_keywords(tmp_path):
    from mf_celldump import CellDumpCallback, DumpConfig

    cb = CellDumpCallback(DumpConfig.from_dict({"task": "tensor", "steps": "1-2"}), steps=[5],
                          dump_path=str(tmp_path))
    try:
        assert cb.config.task == "tensor"
        assert cb.config.steps.values == frozenset({5})
    finally:
        cb.close()


def test_compile_hook_is_scoped_and_weak():
    from mf_celldump.integrations.compile_hook import ModelCompileHook

    class FakeModel:
        def build(self, train_dataset=None, epoch=1):
            return ("built", train_dataset)

    class Owner:
        def __init__(self):
            self.calls = []

        def on_compile(self, model, dataset):
            self.calls.append((model, dataset))

    original = FakeModel.__dict__["build"]
    owner = Owner()
    hook = ModelCompileHook(owner.on_compile, model_class=FakeModel).install()
    model = FakeModel()
    assert model.build("data") == ("built", "data")
    assert owner.calls == [(model, "data")]
    hook.remove()
    assert FakeModel.__dict__["build"] is original
    assert not hasattr(FakeModel, "infer_train_layout")

    # Context-manager form, and restoration when the owner is garbage-collected.
    with ModelCompileHook(owner.on_compile, model_class=FakeModel):
        assert FakeModel.__dict__["build"] is not original
    assert FakeModel.__dict__["build"] is original
    transient = Owner()
    ModelCompileHook(transient.on_compile, model_class=FakeModel).install()
    assert FakeModel.__dict__["build"] is not original
    del transient
    gc.collect()
    assert FakeModel.__dict__["build"] is original

    # Someone patches over us: removing leaves their patch and ours becomes a pass-through.
    hook = ModelCompileHook(owner.on_compile, model_class=FakeModel).install()
    ours = FakeModel.__dict__["build"]

    def theirs(self, *args, **kwargs):
        return ours(self, *args, **kwargs)

    FakeModel.build = theirs
    hook.remove()
    owner.calls.clear()
    assert FakeModel().build("x") == ("built", "x")
    assert owner.calls == []
    FakeModel.build = original


def test_initial_step_offset_follows_mindformers_monitors():
    from mf_celldump.integrations.mindspore_callback import initial_step_offset

    monitor = type("MFLossMonitor", (), {"__module__": "mindformers.core.callback.callback"})()
    monitor.initial_step = 7
    stranger = type("Other", (), {})()
    stranger.initial_step = 99
    me = object()
    assert initial_step_offset({"list_callback": [me, stranger, monitor], "initial_step": None}, me) == 7
    # MindSpore's own initial_step (fault-tolerance restarts) wins, as in MindFormers' monitors.
    assert initial_step_offset({"list_callback": [monitor], "initial_step": 0}, me) == 0
    assert initial_step_offset({"list_callback": [stranger]}, me) == 0
    dataset = type("Dataset", (), {"get_init_step": lambda self: 4})()
    assert initial_step_offset({"list_callback": [stranger], "train_dataset": dataset}, me) == 4


def test_register_path_command(capsys):
    import argparse

    from mf_celldump.cli import register_path as registration_cli

    parser = argparse.ArgumentParser()
    registration_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["register-path"])
    assert args.func(args) == 0
    path = capsys.readouterr().out.strip()
    assert os.path.isfile(os.path.join(path, "celldump_callback.py"))
    args = parser.parse_args(["register-path", "--yaml"])
    assert args.func(args) == 0
    assert "auto_register: celldump_callback.CellDumpCallback" in capsys.readouterr().out


def test_yaml_entry_type_celldumpcallback_is_found(tmp_path):
    """What run_mindformer.py --register_path does, then MindFormers' own callback builder."""
    code = textwrap.dedent('''
        import os, sys
        from mf_celldump.integrations.registration import registration_dir
        os.environ["REGISTER_PATH"] = registration_dir()
        sys.path.append(registration_dir())
        from mindformers.core import build_callback
        try:
            build_callback({"type": "CellDumpCallback", "steps": "0-1"})
        except ValueError as err:
            print("UNREGISTERED", "CellDumpCallback" in str(err))
        cb = build_callback({"type": "CellDumpCallback", "steps": "0-1", "task": "tensor",
                             "auto_register": "celldump_callback.CellDumpCallback"})
        print("BUILT", type(cb).__name__, sorted(cb.config.steps.values), cb.config.task)
        try:
            build_callback({"type": "CellDumpCallback", "stepz": 1})
        except Exception as err:
            print("BADKEY", type(err).__name__, "did you mean 'steps'" in str(err), str(err).count("CellDumpCallback"))
            print("MESSAGE", str(err)[:40])
        cb.close()
    ''')
    proc = subprocess.run([PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "UNREGISTERED True" in out  # without auto_register (or an import) MindFormers cannot know it
    assert "BUILT CellDumpCallback [0, 1] tensor" in out
    # MindFormers' registry puts the class name in front of our message, which starts with it already:
    # the name appears once
    assert "BADKEY ConfigError True 1" in out and "MESSAGE CellDumpCallback: unknown key 'stepz'" in out, out


def test_registers_itself_when_mindformers_is_already_imported(tmp_path):
    code = ("import mindformers\nfrom mindformers.core import build_callback\n"
            "import mf_celldump.integrations.callback\n"
            "cb = build_callback({'type': 'CellDumpCallback'})\nprint(type(cb).__name__)\ncb.close()\n")
    proc = subprocess.run([PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("CellDumpCallback")


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_model_train_dumps_selected_steps(tmp_path, mode):
    summary, lines, _, dump = _run_small(tmp_path, mode, "plain")
    assert summary["processed"] == [0, 2]
    assert summary["problems"] == []
    assert lines["HOOK_RESTORED"] == "True" and lines["DETACHED"] == "True"
    assert "Cell.fc1.Dense.forward.0" in _entries(dump, 0)
    assert "Cell.fc1.Dense.backward.0" in _entries(dump, 2)
    assert not (dump / "step1").exists()
    assert not list((dump / "_raw").glob("rank*/step*"))


def test_rank_not_selected_captures_nothing_quietly(tmp_path):
    summary, lines, out, dump = _run_small(tmp_path, "pynative", "otherrank")
    assert summary["processed"] == [] and summary["problems"] == []
    assert summary["notes"] == ["rank 0 is not in ranks=3: nothing captured"]
    assert lines["DETACHED"] == "True" and lines["HOOK_RESTORED"] == "True"
    assert not dump.exists()
    assert "Traceback" not in out


def test_graph_compiled_in_model_build_is_still_captured(tmp_path):
    summary, lines, out, dump = _run_small(tmp_path, "graph", "precompile")
    assert lines["ATTACHED_BEFORE_TRAIN"] == "True"
    assert "capture attached at Model.build" in out
    assert summary["processed"] == [0, 2] and summary["entries"] > 0 and summary["empty"] == []
    assert "Cell.fc2.Dense.forward.0" in _entries(dump, 2)


def test_without_the_hook_weight_gradient_hooks_make_mindspore_compile_the_captured_graph(tmp_path):
    """Attached in on_train_begin, after Model.build compiled the graph: registering the parameters'
    gradient hooks changes MindSpore's compile key (its hook version), so the next call compiles again
    and the wrapped constructs are in the graph."""
    summary, lines, out, dump = _run_small(tmp_path, "graph", "precompile-nohook")
    assert lines["ATTACHED_BEFORE_TRAIN"] == "False"
    assert summary["processed"] == [0, 2] and summary["empty"] == [] and summary["problems"] == []
    assert "Cell.fc1.Dense.parameters_grad.0" in _entries(dump, 2)


def test_without_the_hook_a_precompiled_forward_capture_captures_nothing(tmp_path):
    """The control: a forward capture registers no hook, so the graph compiled in Model.build runs as it was,
    without capture ops, and the run says that no cell call reached the capture."""
    summary, lines, out, _ = _run_small(tmp_path, "graph", "precompile-nohook-forward")
    assert lines["ATTACHED_BEFORE_TRAIN"] == "False"
    assert summary["entries"] == 0 and summary["empty"] == [0, 2]
    assert "no cell call reached the capture" in out


# ----------------------------------------------------------------------------------------
# MindFormers 2.x PyNative trainer: not installable here (needs hyper-parallel), so a
# stand-in calls the documented callback methods with the documented arguments.
MF2_STANDIN = textwrap.dedent('''
    import json, sys
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops
    ms.set_device("CPU")
    from mf_celldump import CellDumpCallback

    class TrainerState:
        def __init__(self, global_step, max_steps):
            self.global_step, self.max_steps, self.epoch_step = global_step, max_steps, 2

    class Chunk(nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = nn.Dense(4, 4)
            self.act = nn.GELU()
        def construct(self, x):
            return self.act(self.proj(x))

    # Real chunks hold distinct parameter names; a CellList gives ours distinct prefixes.
    chunks = list(nn.CellList([Chunk() for _ in range(int(sys.argv[2]))]))
    params = [p for c in chunks for p in c.trainable_params()]
    names_before = [p.name for p in params]
    optimizer = nn.SGD(params, 0.01)
    args = {"output_dir": "./output_dir_key"}   # 2.x's TrainConfig keeps the key and ignores it
    state = TrainerState(global_step=2, max_steps=5)   # resumed after 2 steps
    kw = dict(model=chunks, optimizer=optimizer, lr_scheduler=None, train_dataset=None, eval_dataset=None)
    cb = CellDumpCallback(steps="2-3", task="tensor", layer_mapping=None)

    def loss_fn(x):
        for chunk in chunks:
            x = chunk(x)
        return (x * x).mean()
    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)

    cb.on_begin(args, state, **kw)
    cb.on_train_begin(args, state, **kw)
    cb.on_epoch_begin(args, state, **kw)
    while state.global_step < state.max_steps:
        cb.on_step_begin(args, state, **kw)
        loss, grads = grad_fn(ms.Tensor(np.ones((2, 4), np.float32)))
        optimizer(grads)
        state.global_step += 1
        cb.on_step_end(args, state, loss=loss, grad_norm=1.0, **kw)
    cb.on_epoch_end(args, state, **kw)
    cb.on_train_end(args, state, **kw)
    cb.on_end(args, state, **kw)
    assert [p.name for p in params] == names_before, "parameters were renamed"
    summary = {"processed": sorted(cb.summary.processed_steps), "path": cb.summary.dump_path}
    print("SUMMARY", json.dumps(summary))
''')


@pytest.mark.parametrize("chunks", [1, 2])
def test_mindformers2_callback_protocol_standin(tmp_path, chunks):
    script = tmp_path / "mf2.py"
    script.write_text(MF2_STANDIN)
    out_dir = tmp_path / "mf2_output"
    proc = subprocess.run([PYTHON, str(script), str(out_dir), str(chunks)], cwd=tmp_path, timeout=300,
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, LOCAL_DEFAULT_PATH=str(out_dir)))  # MindFormers' output root
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("SUMMARY"))[8:])
    assert summary["processed"] == [2, 3]  # folders by global step of the resumed run
    assert summary["path"] == str(out_dir / "celldump")  # beside MindFormers' own output, not args.output_dir
    assert not (tmp_path / "output_dir_key").exists()
    dump = out_dir / "celldump"
    prefix = "Cell.proj" if chunks == 1 else "Cell.chunk1.proj"
    assert f"{prefix}.Dense.forward.0" in _entries(dump, 3)
    assert f"{prefix}.Dense.backward.0" in _entries(dump, 2)
    assert not (dump / "step4").exists()


def test_a_pipeline_stage_without_the_loss_gives_the_watch_no_loss(tmp_path, caplog):
    """MindFormers 2.x passes ``loss`` 0.0 (or None) with ``has_last=False`` on a pipeline stage that is not
    last: those zeros are no loss (none enters the spike history), and the rank says once that its loss is
    not watched."""
    import mindspore as ms

    from mf_celldump import CellDumpCallback
    from tests.support import capture_net as cn

    cn.set_mode("pynative")
    net = cn.make_net()

    class State:
        def __init__(self):
            self.global_step, self.max_steps, self.skipped_steps = 0, 8, 0

    state = State()
    cb = CellDumpCallback(dump_path=str(tmp_path / "dump"), steps=[0], layer_mapping=None,
                          watch={"loss_spike": 2.0, "spike_window": 2}, process_on_train_end=False)
    cb.on_train_begin({}, state, model=[net])
    with caplog.at_level("WARNING", logger="mf_celldump"):
        for step, (loss, has_last) in enumerate([(1.0, True), (0.0, False), (0.0, False)]):
            cb.on_step_begin({}, state, model=[net])
            net(cn.make_input())
            state.global_step = step + 1
            cb.on_step_end({}, state, model=[net], loss=ms.Tensor(loss), grad_norm=1.0, has_last=has_last)
        history = list(cb._run.watching.watch._losses)
        cb.on_train_end({}, state)
    assert history == [1.0], "a stage's 0.0 entered the loss history"
    assert "pipeline stage without the loss" in caplog.text
    assert caplog.text.count("pipeline stage without the loss") == 1
    assert "loss_spike" not in caplog.text and state.max_steps == 8
