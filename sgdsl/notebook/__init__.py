"""Jupyter support: the HTML view of a ProgramState (``html.py`` over ``view_model.py``), its
live refresh while streaming (``live.py``), and progress bars for ``run_batch`` (``progress.py``)."""
from sgdsl.notebook.html import render_html
from sgdsl.notebook.live import live_display

__all__ = ["live_display", "render_html"]
