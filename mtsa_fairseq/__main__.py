"""``python -m mtsa_fairseq`` prints this package's directory: the value of fairseq's ``--user-dir`` from any working
directory (``--user-dir mtsa_fairseq`` is a relative path: it works from the repository root)."""

import argparse
from pathlib import Path

argparse.ArgumentParser(prog="python -m mtsa_fairseq", description=__doc__.replace("``", "")).parse_args()
print(Path(__file__).resolve().parent)
