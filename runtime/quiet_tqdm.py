"""``tqdm.auto``, imported once without its notebook warning.

transformers, accelerate and xgrammar import ``tqdm.auto`` when they are imported. In a Jupyter
kernel without ipywidgets that import warns ``TqdmWarning: IProgress not found`` into whichever
cell first starts an Engine (the Local backend's first program). tqdm then falls back to its text
bars, which is all those libraries need (run_batch's own progress display handles a kernel
without ipywidgets itself: sgdsl.notebook.progress). Importing ``tqdm.auto`` here first, with only
that warning filtered for the duration of the import, leaves every other warning and the user's
own filters as they were.
"""
from __future__ import annotations

import sys
import warnings

_MESSAGE = "IProgress not found"


def import_tqdm_auto_quietly() -> None:
    """Import ``tqdm.auto`` (a no-op once imported) with its "IProgress not found" silenced."""
    if "tqdm.auto" in sys.modules:
        return
    from tqdm.std import TqdmWarning  # noqa: PLC0415 - tqdm.std alone never warns

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MESSAGE, category=TqdmWarning)
        import tqdm.auto  # noqa: F401, PLC0415
