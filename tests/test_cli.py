"""The installed ``mf-celldump`` console script: every sub-command is reachable."""

import os
import shutil
import subprocess
import sys

import pytest

from mf_celldump import __version__
from mf_celldump.cli import main


def _script():
    found = shutil.which("mf-celldump") or os.path.join(os.path.dirname(sys.executable), "mf-celldump")
    if not os.path.exists(found):
        pytest.skip("the package is not installed with its console script")
    return found


def test_console_script_lists_subcommands():
    proc = subprocess.run([_script(), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("process", "mapping", "register-path"):
        assert command in proc.stdout
    version = subprocess.run([_script(), "--version"], capture_output=True, text=True, timeout=120)
    assert version.stdout.strip() == f"mf-celldump {__version__}"


def test_process_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    assert main(["process", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_mapping_list_names_the_bundled_files(capsys):
    assert main(["mapping", "list"]) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "mcore_gpt" in out


@pytest.mark.parametrize("command, code", [(["mapping", "show", "llama"], 141), (["mapping", "check", "llama"], 141),
                                           (["mapping", "list"], 141), (["register-path", "--yaml"], 141),
                                           (["--help"], 0)])  # argparse itself ignores a failed help write
def test_a_reader_that_stops_early_ends_the_command_quietly(command, code):
    """`mf-celldump ... | head -3`: no broken-pipe message, exit 141 (128 + SIGPIPE) as for any Unix tool.

    The read end is closed before the child has even imported Python, so its first write meets a
    closed pipe every time (reading a line first would race with outputs smaller than the pipe).
    """
    worktree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [worktree, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "mf_celldump", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=worktree)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == code, err
    assert err == "", err


def test_a_reader_that_reads_a_line_then_closes_gets_no_error_message(tmp_path):
    """The `| head -1` of a long listing: the command stops at the closed pipe, silently."""
    big = tmp_path / "many.yaml"
    big.write_text("".join(f"Class{i}:\n  layer{i}: baseline{i}\n" for i in range(6000)))
    proc = subprocess.Popen([sys.executable, "-m", "mf_celldump", "mapping", "show", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))))
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert first and proc.wait(timeout=120) == 141 and err == "", (first, err)


@pytest.mark.parametrize("command, code", [("check", 1), ("show", 2)])
def test_mapping_with_an_alias_loop_is_one_line_naming_file_and_line(tmp_path, capsys, command, code):
    """``check`` reports an invalid file as its finding (1), ``show`` cannot show it (bad input, 2)."""
    path = tmp_path / "loop.yaml"
    path.write_text("Net: &a {fc1: x, loop: *a}\n", encoding="utf-8")
    assert main(["mapping", command, str(path)]) == code
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:1: alias *a refers to the collection"), lines
