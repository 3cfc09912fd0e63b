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
