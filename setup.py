"""mtsa-fairseq: Multi-mask Tensorized Self-Attention (MTSA), DiSAN and Fast-DiSA for fairseq.

fairseq itself comes from ``fairseq-fixed`` (docs/installation.md, "Why fairseq-fixed"). Set
``MTSA_FAIRSEQ_OWN_FAIRSEQ=1`` to keep a fairseq build of your own instead.
"""

import os

from setuptools import find_packages, setup

requirements = [
    "torch>=2.6", "numpy", "sacrebleu>=2.0", "sentencepiece", "sacremoses", "scipy", "matplotlib", "pyyaml", "submitit",
]
# mtsa-<name with dashes>: mtsa_fairseq/experiments/commands/<name>.py (scripts/<name>.py runs the same from a clone)
COMMANDS = [
    "prepare_data", "train_seeds", "average_checkpoints", "score", "significance", "pipeline", "make_toy_corpus",
    "multi30k_study", "prepare_sentence_data", "sentence_experiment", "sentence_lr_search", "evaluate_sentence",
    "bench_core", "bench_encoders", "bench_transformer", "bench_fairseq_train", "bench_launches", "docs_tables",
]
if os.environ.get("MTSA_FAIRSEQ_OWN_FAIRSEQ") != "1":
    requirements.append("fairseq-fixed==0.12.3.1")

setup(
    name="mtsa-fairseq",
    version="0.1.0",
    description="Multi-mask Tensorized Self-Attention (MTSA), DiSAN and Fast-DiSA as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["mtsa_fairseq", "mtsa_fairseq.*"]),
    # the training and task configs ship with the package (the checkout's configs/ links to them)
    package_data={"mtsa_fairseq.experiments": ["configs/*.yaml", "configs/*/*.yaml", "configs/*/*/*.yaml"]},
    install_requires=requirements,
    extras_require={"test": ["pytest>=8", "ruff>=0.6"], "triton": ["triton>=3.0,<4; platform_system == 'Linux'"]},
    entry_points={"console_scripts": [
        f"mtsa-{name.replace('_', '-')} = mtsa_fairseq.experiments.commands.{name}:main" for name in COMMANDS
    ]},
)
