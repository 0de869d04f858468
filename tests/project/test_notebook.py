"""docs/examples/field-study.ipynb, executed top to bottom as a reader would run it (a real
server, real devices over gRPC, a real report), in a kernel of this test's own interpreter; and
committed with no outputs (strip with scripts/strip_notebook.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "docs" / "examples" / "field-study.ipynb"
KERNEL = "ldp-survey-test"
WHOSE = "import sys; print(sys.executable)"  # appended to the test's copy: which kernel ran it


def kernel_manager(root: Path) -> AsyncKernelManager:
    """A kernel running this interpreter (the test's venv), never a kernelspec found on the
    system (whose python3 may be another interpreter without this project installed)."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "ldp-survey tests", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    specs = KernelSpecManager(kernel_dirs=[str(root / "kernels")], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def texts(cell, kind: str) -> str:
    """Everything a cell showed as ``kind`` (stream text, or a display MIME type)."""
    found = []
    for output in cell.outputs:
        if output.output_type == "stream" and kind == "stream":
            found.append(output.text)
        elif output.output_type in ("display_data", "execute_result") and kind in output.data:
            found.append(output.data[kind])
    return "\n".join(found)


def cell_with(notebook, fragment: str):
    """The code cell whose source contains ``fragment``."""
    matches = [c for c in notebook.cells if c.cell_type == "code" and fragment in c.source]
    assert len(matches) == 1, fragment
    return matches[0]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(WHOSE))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(root))  # the notebook's working directory lands here
        client = nbclient.NotebookClient(
            notebook,
            km=kernel_manager(root),
            timeout=180,
            resources={"metadata": {"path": str(root)}},
        )
        client.execute()  # raises CellExecutionError if any cell raises
    return notebook, root


@pytest.mark.slow
def test_the_notebook_runs_in_the_tests_own_interpreter(executed):
    notebook, _ = executed
    assert texts(notebook.cells[-1], "stream").strip() == sys.executable


@pytest.mark.slow
def test_the_study_is_planned_served_collected_and_stopped(executed):
    notebook, root = executed
    plan = texts(cell_with(notebook, '"plan", "--k"'), "stream")
    assert "randomized_response(k=4, epsilon=1)" in plan and "power 0.8" in plan
    devices = texts(cell_with(notebook, "devices = plan.rows[0].n"), "stream")
    assert "recruit 3,019 devices" in devices
    assert "aggregator serving on 127.0.0.1:" in texts(cell_with(notebook, "port_file ="), "stream")
    summary = texts(cell_with(notebook, '"simulate"'), "stream")
    assert '"accepted": 6038' in summary and '"duplicate": 0' in summary
    stopped = texts(cell_with(notebook, "server.send_signal"), "stream")
    assert "aggregator exit status: 0" in stopped and "shutting down" in stopped
    assert len(list(root.glob("ldp-field-study-*/reports.sqlite"))) == 1


@pytest.mark.slow
def test_the_estimate_tests_and_figure_are_shown(executed):
    notebook, _ = executed
    table = texts(cell_with(notebook, "mood_estimate = estimate("), "text/html")
    assert "<table" in table and "great" in table and "n = 3,019" in table
    frame = texts(cell_with(notebook, "mood_estimate.to_frame()"), "text/html")
    assert "ci_low" in frame and "truth" in frame
    gof = texts(cell_with(notebook, "gof = goodness_of_fit("), "text/html")
    assert "n = 3,019" in gof and "H0</b>" in gof  # the decision (reject: 99.6% power)
    independent = texts(cell_with(notebook, "independent = independence("), "stream")
    assert "n = 3019" in independent and "p-value" in independent
    figure = cell_with(notebook, "plt.show()")
    assert texts(figure, "image/png"), "the figure was not drawn"


@pytest.mark.slow
def test_the_report_is_written_and_excerpted(executed):
    notebook, root = executed
    cell = cell_with(notebook, '"report"')
    assert "wrote " in texts(cell, "stream") and "field-study-report.html" in texts(cell, "stream")
    excerpt = texts(cell, "text/markdown")
    assert "Field study 2026" in excerpt and "## mood" in excerpt and "| great |" in excerpt
    html = next(root.glob("ldp-field-study-*/field-study-report.html")).read_text()
    assert "<svg" in html and "Is mood uniform?" in html


def test_the_committed_notebook_has_no_outputs():
    """Outputs stay out of git: python scripts/strip_notebook.py docs/examples/field-study.ipynb"""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
        assert "execution" not in cell.metadata
    check = subprocess.run(
        [sys.executable, "scripts/strip_notebook.py", "--check", str(NOTEBOOK)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_the_strip_script_strips_a_run_notebook(executed, tmp_path):
    notebook, _ = executed
    path = tmp_path / "run.ipynb"
    nbformat.write(notebook, path)
    command = [sys.executable, "scripts/strip_notebook.py"]
    assert subprocess.run([*command, "--check", str(path)], cwd=REPO).returncode == 1
    assert subprocess.run([*command, str(path)], cwd=REPO, capture_output=True).returncode == 0
    stripped = nbformat.read(path, as_version=4)
    assert all(c.outputs == [] for c in stripped.cells if c.cell_type == "code")
    assert subprocess.run([*command, "--check", str(path)], cwd=REPO).returncode == 0
