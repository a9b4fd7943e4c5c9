"""`import simfog` (and building the whole CLI) never imports torch: the simulator must run without it."""

import subprocess
import sys

CODE = """
import pkgutil, sys, importlib
import simfog
for m in pkgutil.walk_packages(simfog.__path__, "simfog."):
    importlib.import_module(m.name)
from simfog import cli
cli.build_parser()
print("torch" in sys.modules)
"""


def test_simfog_never_imports_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
