"""The installed wheel, checked where the checkout cannot help: `python -I wheel_check.py CHECKOUT`.

Run by `.ci/run` (part "wheel") from an empty folder with the venv's python, the wheel installed
non-editable and neither pandas nor matplotlib importable. It checks that the package imported is
the installed one; that every module and data file of the checkout is in the wheel and every module
imports (a subpackage or a mapping file left out of the wheel fails here, not on a user's machine;
a module only MindFormers loads may lack MindFormers); that every sub-command's --help runs through
the console script; and that a tiny network trains, captured by `attach` in graph mode and in
PyNative, and is processed, without loading the analysis tools or their plotting stack. Each check
runs in its own interpreter (`-I`: no script folder, no PYTHONPATH), so what one imports cannot
hide what another misses. Stand-alone on purpose: it must not import anything from the checkout.
"""

import importlib
import importlib.util
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import tempfile

EXTRAS = ("pandas", "matplotlib")  # the `compare` extra: the training core must not need them
# The `mindformers` extra: a module MindFormers itself loads (the auto_register callback) needs it.
OPTIONAL = ("mindformers",)


def run_self(step, *args):
    """This script's ``step`` in a fresh isolated interpreter; its last stdout line, parsed as JSON."""
    proc = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), step, *args],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"FAIL: wheel check '{step}' exited with {proc.returncode}:\n{proc.stdout[-3000:]}"
                 f"{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_origin(checkout):
    """The package is the installed wheel (not the checkout, not an editable install); no extras."""
    import mf_celldump

    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    where = os.path.realpath(mf_celldump.__file__)
    assert where.startswith(site + os.sep), f"mf_celldump imported from {where}, not from {site}"
    source = os.path.realpath(os.path.join(checkout, "mf_celldump"))
    assert not where.startswith(source + os.sep), f"mf_celldump imported from the checkout: {where}"
    present = [name for name in EXTRAS if importlib.util.find_spec(name) is not None]
    assert not present, f"{present} importable here; this venv must lack the compare extra"
    return {"package": where}


def import_all(checkout):
    """Import every module of the installed package, find every file of the checkout's (the bundled layer
    mappings, the report's assets) in it; list the console script's sub-commands."""
    import mf_celldump
    from mf_celldump.cli import build_parser

    failures, need_optional = [], []
    names = ["mf_celldump"]
    for info in pkgutil.walk_packages(mf_celldump.__path__, "mf_celldump.", onerror=failures.append):
        names.append(info.name)
        try:  # a __main__ module runs its command when imported: found is enough
            if info.name.endswith(".__main__"):
                assert importlib.util.find_spec(info.name) is not None
            else:
                importlib.import_module(info.name)
        except ModuleNotFoundError as err:
            (need_optional if (err.name or "").split(".")[0] in OPTIONAL else failures).append(f"{info.name}: {err}")
        except Exception as err:
            failures.append(f"{info.name}: {type(err).__name__}: {err}")
    assert not failures, f"modules that do not import from the wheel: {failures}"
    sources = {_module_name(os.path.relpath(os.path.join(folder, file), checkout))
               for folder, _, files in os.walk(os.path.join(checkout, "mf_celldump")) for file in files
               if file.endswith(".py")}
    assert len(names) == len(sources), (f"the wheel has {len(names)} modules, the checkout {len(sources)} .py "
                                        f"files; not in the wheel: {sorted(sources - set(names))}")
    files = {os.path.relpath(os.path.join(folder, file), checkout)
             for folder, _, files in os.walk(os.path.join(checkout, "mf_celldump")) for file in files
             if "__pycache__" not in folder}
    installed = os.path.dirname(os.path.dirname(mf_celldump.__file__))
    missing = sorted(path for path in files if not os.path.isfile(os.path.join(installed, path)))
    assert not missing, f"files of the checkout's package not in the wheel (package data?): {missing}"
    return {"modules": len(names), "need_optional": need_optional, "commands": _commands(build_parser())}


def _module_name(path):
    """``mf_celldump/a/__init__.py`` -> ``mf_celldump.a``; ``mf_celldump/a/b.py`` -> ``mf_celldump.a.b``."""
    parts = path[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _commands(parser, prefix=()):
    """Every sub-command path (``["mapping", "check"]``...) of an argparse parser."""
    out = []
    for action in parser._actions:
        for name, sub in (getattr(action, "choices", None) or {}).items() if hasattr(action, "add_parser") else ():
            out.append([*prefix, name])
            out.extend(_commands(sub, (*prefix, name)))
    return out


def helps(commands):
    """``mf-celldump [COMMAND...] --help`` exits 0 for the command and every sub-command."""
    script = shutil.which("mf-celldump")
    assert script and os.path.dirname(os.path.realpath(script)) == os.path.realpath(
        sysconfig.get_paths()["scripts"]), f"mf-celldump console script is {script}, not this venv's"
    for command in [[], *commands]:
        proc = subprocess.run([script, *command, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (command, proc.returncode, proc.stderr[-2000:])


def train(folder):
    """Two steps of a tiny network in each mode, captured and processed; the analysis side stays unloaded."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    import mf_celldump

    x = Tensor(np.random.RandomState(0).randn(2, 4).astype(np.float32))
    for mode in ("graph", "pynative"):
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
        net = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
        loss = nn.WithLossCell(net, nn.MSELoss())
        step = nn.TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 0.1))
        dump = mf_celldump.attach(step, {"dump_path": os.path.join(folder, mode), "jobs": 1})
        for index in range(2):
            with dump.step(index):
                step(x, Tensor(np.zeros((2, 2), np.float32)))
        dump.detach()
        processed = [outcome.step for outcome in mf_celldump.process_captured(dump).processed]
        assert processed == [0, 1], f"{mode}: processed steps {processed}"
        assert os.path.isfile(os.path.join(folder, mode, "step0", "rank", "dump.json")), f"{mode}: no dump.json"
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in EXTRAS
                    or name == "mf_celldump.analysis" or name.startswith("mf_celldump.analysis."))
    assert not loaded, f"training and processing loaded {loaded}"
    return {"trained": ["graph", "pynative"]}


def main():
    step, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 2 else ("all", sys.argv[1:])
    if step != "all":
        print(json.dumps({"origin": check_origin, "imports": import_all, "train": train}[step](*args)))
        return
    checkout = args[0]
    print(f"installed package: {run_self('origin', checkout)['package']}")
    found = run_self("imports", checkout)
    skipped = found["need_optional"]
    print(f"imported {found['modules'] - len(skipped)} of {found['modules']} modules; not installed here: {skipped}")
    helps(found["commands"])
    print(f"--help ran for mf-celldump and its {len(found['commands'])} sub-commands")
    with tempfile.TemporaryDirectory() as folder:
        print(f"trained and processed in {', '.join(run_self('train', folder)['trained'])} mode")
    print("wheel check passed")


if __name__ == "__main__":
    main()
