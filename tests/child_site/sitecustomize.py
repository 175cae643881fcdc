"""Run by Python at the start-up of every process the tests start with ``tests.small_runs.ENV`` (this folder is
on its PYTHONPATH): scikit-learn and matplotlib look not installed, as in a runtime install of the project.

They come with the test extras (``setup.sh dev``) only, and no runtime code imports them (tests/test_dependencies.py),
but keras imports both at TensorFlow's start-up when they are installed (its scikit-learn wrappers and plotting
helpers, each behind ``try: import ... except ImportError``): 1.9 of the 6.8 CPU-s of an ``import tensorflow``
on the 2-core Zen 3 (3 alternating runs each, 2026-11-26), in each of the suite's many CLI subprocesses.
A ``None`` in ``sys.modules`` makes ``import`` raise ``ImportError`` and ``importlib.util.find_spec`` answer
``None``, as for a package that is not installed.
The walk-through's commands (tests/test_walkthrough.py) run as a user's shell runs them, without this folder.
"""

import importlib.machinery
import importlib.util
import os
import sys

# ABSENT_MODULES (comma-separated) adds more, e.g. tensorflow for a process that must run as on the GPU machine.
for _name in ("sklearn", "matplotlib", *filter(None, os.environ.get("ABSENT_MODULES", "").split(","))):
    sys.modules.setdefault(_name, None)

# Python imports only the first sitecustomize on the path: run the one this shadows (a distribution's), if any.
_here = os.path.dirname(os.path.abspath(__file__))
_shadowed = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _shadowed is not None:
    _shadowed.loader.exec_module(importlib.util.module_from_spec(_shadowed))
