"""Records what a workflow job imported, for the test that each rule's conda env has it.

tests/test_workflow.py puts this folder on PYTHONPATH for its tiny run, with
LOCUSFORMER_IMPORTS naming a folder: every Python process started then writes its
command line and the names in sys.modules there when it exits. Without that variable it
does nothing.
"""

import atexit
import json
import os
import sys

_FOLDER = os.environ.get("LOCUSFORMER_IMPORTS")


def _record() -> None:
    path = os.path.join(_FOLDER, f"{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"argv": sys.argv, "modules": sorted(sys.modules)}, f)


if _FOLDER:
    atexit.register(_record)
