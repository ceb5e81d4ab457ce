"""A notebook run headless by a real Jupyter kernel (nbclient), shared by the notebook tests.

Importable as ``from e2e_notebook import executed_notebook`` (tests/e2e is on ``sys.path`` for
its test modules, as for ``e2e_programs``)."""
from __future__ import annotations

import os
from typing import Any


def executed_notebook(cells: list[str]) -> Any:
    """A notebook of one code cell per string, executed by a ``python3`` kernel started in the
    current folder; returned with its outputs."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": os.getcwd()}})
    client.execute()
    return nb
