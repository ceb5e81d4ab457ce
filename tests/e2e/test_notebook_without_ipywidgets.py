"""A notebook user without ipywidgets sees no warning from us or from what we import: a real
Jupyter kernel (nbclient) where ``import ipywidgets`` fails (it is installed here, so the first
cell blocks it, as if it were not) runs a program on the embedded model, then ``run_batch`` with
a progress bar. transformers (imported when the Engine starts) imports ``tqdm.auto``, which in
such a kernel warned ``TqdmWarning: IProgress not found`` into the cell."""
from __future__ import annotations

import pytest
from e2e_notebook import executed_notebook

pytestmark = pytest.mark.slow
nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")

CELLS = [
    'import sys\nsys.modules["ipywidgets"] = None  # import ipywidgets now raises ImportError\n'
    'print("tqdm.auto imported:", "tqdm.auto" in sys.modules)',
    'import sgdsl as sgl\n\n@sgl.function\ndef qa(s, question):\n'
    '    s += sgl.user(question)\n'
    '    s += sgl.assistant(sgl.gen("answer", max_tokens=4, temperature=0))\n\n'
    'state = qa.run(question="Name a color.")\nprint("answer:", state["answer"])',
    'states = qa.run_batch([{"question": "Hi"}, {"question": "Name a fruit."}], progress_bar=True)\n'
    'print(len(states), "done")',
    'print("imported:", "tqdm.auto" in sys.modules, "transformers" in sys.modules)',
]


@pytest.fixture(scope="module")
def executed():
    return executed_notebook(CELLS)


def _texts(cell) -> list[str]:
    out = []
    for o in cell.outputs:
        out.append(o.get("text") or "")
        out.extend(str(v) for v in o.get("data", {}).values())
    return out


def test_no_warning_in_any_cell(executed):
    stderr = [o.text for c in executed.cells for o in c.outputs
              if o.output_type == "stream" and o.name == "stderr"]
    assert stderr == []
    assert not [t for c in executed.cells for t in _texts(c) if "Warning" in t or "IProgress" in t]


def test_the_program_ran_and_its_imports_happened_in_this_kernel(executed):
    first, program, batch, imports = (" ".join(_texts(c)) for c in executed.cells)
    assert "tqdm.auto imported: False" in first  # so the run below is what imported it
    assert "answer:" in program and "2 done" in batch
    assert "run_batch: 100% 2/2" in batch  # the progress line shown without ipywidgets
    assert "imported: True True" in imports
