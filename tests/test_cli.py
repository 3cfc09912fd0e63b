import subprocess
import sys


def test_tkcc_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "compiler", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "tkcc" in out.stdout


def test_unknown_command_is_usage_error():
    out = subprocess.run([sys.executable, "-m", "compiler", "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr


def _tkcc(*args):
    return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True)


def test_version_names_the_installed_package():
    from importlib import metadata

    out = _tkcc("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"tkcc {metadata.version('tkcc')}"


def test_plan_show_takes_the_plan_as_apply_spells_it():
    plan = "examples/plans/llama-1b-h200"
    positional, option = _tkcc("plan", "show", plan), _tkcc("plan", "show", "--plan", plan)
    assert positional.returncode == option.returncode == 0, option.stderr
    assert positional.stdout == option.stdout and "plan v" in option.stdout
    for args in (("plan", "show"), ("plan", "show", plan, "--plan", plan)):
        out = _tkcc(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert out.stderr.count("\n") == 1 and "give the plan directory once" in out.stderr


def test_every_recompile_option_says_what_it_does():
    import argparse

    from compiler.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    recompile = sub.choices["recompile"]
    options = [a for a in recompile._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {"plan", "traffic", "budget", "agents", "board", "device", "fleet"}
    assert [a.dest for a in options if not a.help] == []
