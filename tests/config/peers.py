"""Imports the Python peers (DeepSpeed, Accelerate) quietly for the config
checks (conformance.py, schema_check.py)."""

import contextlib
import importlib
import logging
import os
import warnings


def import_peers(modules):
    """Imports `modules` with DeepSpeed on the CPU and the peers' chatter off;
    None, or the reason an import failed."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            for name in modules:
                importlib.import_module(name)
    except Exception as error:  # ImportError, or a broken install
        return f"{type(error).__name__}: {error}"
    for name in ("DeepSpeed", "deepspeed", "accelerate"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")
    return None
