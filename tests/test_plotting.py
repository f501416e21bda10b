"""The experiment tooling's figures: quiet even after fairseq's import has opened the root logger to DEBUG."""

import subprocess
import sys

FIGURE = """
import logging
from fairseq import options  # noqa: F401  (its import sets the root logger to DEBUG, with a stderr handler)
assert logging.getLogger().level == logging.DEBUG
from mtsa_fairseq.experiments.plotting import pyplot
plt = pyplot()
fig, ax = plt.subplots()
ax.plot([0, 1], [0, 1], label="a line")
ax.set_title("a title")
ax.legend()
fig.savefig(sys.argv[1])
"""


def test_a_figure_after_fairseq_logs_nothing_from_matplotlib(tmp_path):
    png = tmp_path / "figure.png"
    proc = subprocess.run([sys.executable, "-c", "import sys\n" + FIGURE, str(png)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "matplotlib" not in proc.stderr, proc.stderr[:500]
