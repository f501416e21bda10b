"""The ``sentence_encoding`` task over a directory of ``scripts/prepare_sentence_data.py``: its manifest's ``kind``
decides what a sample holds, ``single`` (a sentence and a class), ``pair`` (SNLI, MultiNLI: premise and hypothesis,
each encoded on its own) or ``relatedness`` (SICK: two sentences and a 1-5 score). Cross-validation data (CR, MPQA,
SUBJ) needs ``--cv-fold K``: ``train`` is every fold but K, ``valid``/``test`` fold K. Batches hold sentences of
similar length, reshuffled every epoch; dev and test batches hold every example. The ``--patience`` count is carried
in the checkpoints, so early stopping survives a resume (docs/experiment.md, Exact resumes). Checkpoints record the
SHA-256 of what their ids mean (the dictionary's words and the label names); loading one for evaluation or a resume
on data whose ids mean other words or classes is refused, whatever the dictionary's size."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.tasks import LegacyFairseqTask, register_task

from ..contracts import IDS_KEY, read_sentence_manifest
from ..criterions.sentence_encoding import SentenceEncodingCriterion  # (importing registers the task's criterion)


class SentenceExampleDataset(FairseqDataset):
    """Examples ``rows`` of one or two token datasets with their labels (class ids or scores)."""

    def __init__(self, inputs: list[Any], labels: torch.Tensor, rows: np.ndarray, pad: int, shuffle: bool):
        self.inputs, self.labels, self.rows, self.pad, self.shuffle = inputs, labels, rows, pad, shuffle
        self.sizes = np.max([np.asarray(side.sizes)[rows] for side in inputs], axis=0).astype(np.int64)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = int(self.rows[index])
        return {"id": index, "inputs": [side[row] for side in self.inputs], "label": self.labels[row]}

    def __len__(self) -> int:
        return len(self.rows)

    def collater(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not samples:
            return {}
        net_input: dict[str, torch.Tensor] = {}
        ntokens = 0
        for side in range(len(self.inputs)):
            tokens = [s["inputs"][side] for s in samples]
            suffix = "" if side == 0 else str(side)
            net_input[f"src_tokens{suffix}"] = data_utils.collate_tokens(tokens, self.pad, left_pad=False)
            net_input[f"src_lengths{suffix}"] = torch.tensor([t.numel() for t in tokens])
            ntokens += sum(t.numel() for t in tokens)
        return {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples), "ntokens": ntokens,
                "net_input": net_input, "target": torch.stack([s["label"] for s in samples])}

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    size = num_tokens  # an example's length: its longer side

    def ordered_indices(self) -> np.ndarray:
        """Shuffled (with fairseq's per-epoch seed) when training, then stably sorted by length."""
        order = np.random.permutation(len(self)) if self.shuffle else np.arange(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    @property
    def can_reuse_epoch_itr_across_epochs(self) -> bool:
        return not self.shuffle  # new batches every epoch when shuffling

    @property
    def supports_prefetch(self) -> bool:
        return False


EARLY_STOPPING_STATE = ("best", "num_runs")  # what fairseq_cli.train.should_stop_early keeps on itself


def _fairseq_early_stopping() -> Any:
    """fairseq-train's ``should_stop_early`` (as ``fairseq-train`` or ``python -m fairseq_cli.train``), or None."""
    module = sys.modules.get("fairseq_cli.train")
    main = sys.modules.get("__main__")
    if module is None and getattr(getattr(main, "__spec__", None), "name", None) == "fairseq_cli.train":
        module = main
    return getattr(module, "should_stop_early", None)


@register_task("sentence_encoding")
class SentenceEncodingTask(LegacyFairseqTask):
    """Sentence classification / pair classification / relatedness over a prepared directory."""

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("data", help="directory written by scripts/prepare_sentence_data.py")
        parser.add_argument("--cv-fold", type=int, metavar="K",
                            help="cross-validation data: hold out fold K as valid/test, train on the others")

    def __init__(self, args: argparse.Namespace, dictionary: Dictionary, manifest: dict[str, Any]):
        super().__init__(args)
        self.dictionary, self.manifest = dictionary, manifest
        self.kind: str = manifest["kind"]
        self.num_classes: int = len(manifest["labels"])
        self.num_train_words: int = int(manifest["num_train_words"])
        folds = int(manifest.get("num_folds") or 0)
        fold = getattr(args, "cv_fold", None)
        if folds and fold is None:
            raise ValueError(f"{args.data} is {folds}-fold cross-validation data: pass --cv-fold K (0..{folds - 1})")
        metric = getattr(args, "best_checkpoint_metric", None)
        logged = SentenceEncodingCriterion.validation_metrics(self.kind)
        if metric is not None and metric not in logged:
            raise ValueError(f"--best-checkpoint-metric {metric}: validation on {args.data} ({self.kind} examples) "
                             f"logs {', '.join(logged)}")
        if fold is not None and not 0 <= fold < folds:
            raise ValueError(f"--cv-fold {fold} is out of range for {args.data} "
                             f"({'no folds' if not folds else f'folds 0..{folds - 1}'})")
        ids = json.dumps({"words": dictionary.symbols, "labels": manifest["labels"]}, ensure_ascii=False)
        self.ids_sha256 = hashlib.sha256(ids.encode("utf-8")).hexdigest()

    def check_ids(self, recorded: str | None) -> None:
        """Refuse a checkpoint whose recorded :data:`IDS_KEY` is not this data's (none recorded: an older checkpoint,
        nothing to check)."""
        if recorded is not None and recorded != self.ids_sha256:
            raise ValueError(f"the checkpoint was trained on other data than {self.args.data}: its word or class ids "
                             "mean other words or classes (dict.txt, the labels in manifest.json)")

    @classmethod
    def setup_task(cls, args: argparse.Namespace, **kwargs: Any) -> SentenceEncodingTask:
        manifest = read_sentence_manifest(args.data)
        return cls(args, Dictionary.load(str(Path(args.data) / "dict.txt")), manifest)

    def _labels(self, split: str) -> torch.Tensor:
        lines = (Path(self.args.data) / f"{split}.label").read_text(encoding="utf-8").split("\n")
        lines = [line for line in lines if line.strip()]
        if self.kind == "relatedness":
            return torch.tensor([float(v) for v in lines], dtype=torch.float32)
        return torch.tensor([int(v) for v in lines], dtype=torch.long)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs: Any) -> None:
        folds = int(self.manifest.get("num_folds") or 0)
        source = "train" if folds else split
        if source not in self.manifest["splits"]:
            have = sorted(self.manifest["splits"])
            raise FileNotFoundError(f"{self.args.data} has no '{split}' split (it has {have})")
        sides = 1 if self.kind == "single" else 2
        inputs = []
        for side in range(sides):
            prefix = str(Path(self.args.data) / f"{source}.input{side}")
            dataset = data_utils.load_indexed_dataset(prefix, self.dictionary, "mmap")
            if dataset is None:
                raise FileNotFoundError(f"missing binary {prefix}.bin/.idx")
            inputs.append(dataset)
        labels = self._labels(source)
        if any(len(side) != len(labels) for side in inputs):
            raise ValueError(f"{self.args.data}: '{source}' has {[len(s) for s in inputs]} sentences but "
                             f"{len(labels)} labels")
        rows = np.arange(len(labels))
        if folds:
            fold_of = np.loadtxt(Path(self.args.data) / "train.fold", dtype=np.int64, ndmin=1)
            held_out = fold_of == self.args.cv_fold
            rows = rows[~held_out] if split == "train" else rows[held_out]
        self.datasets[split] = SentenceExampleDataset(inputs, labels, rows, self.dictionary.pad(),
                                                      shuffle=split == "train")

    def get_batch_iterator(self, dataset: FairseqDataset, *args: Any, **kwargs: Any) -> Any:
        """fairseq's, except that the evaluation splits (not shuffled) are batched with ``required_batch_size_multiple``
        1: fairseq drops a last batch smaller than that multiple (default 8), and dev and test metrics would leave its
        examples out."""
        if isinstance(dataset, SentenceExampleDataset) and not dataset.shuffle:
            if len(args) > 4:  # max_tokens, max_sentences, max_positions, ignore_invalid_inputs, the multiple
                args = (*args[:4], 1, *args[5:])
            else:
                kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, *args, **kwargs)

    @property
    def source_dictionary(self) -> Dictionary:
        return self.dictionary

    @property
    def target_dictionary(self) -> Dictionary:
        return self.dictionary

    def max_positions(self) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        """The task state every checkpoint holds (``task_state``), read back when one is loaded for evaluation."""
        return {**super().state_dict(), IDS_KEY: self.ids_sha256}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_ids(state_dict.get(IDS_KEY))
        super().load_state_dict({key: value for key, value in state_dict.items() if key != IDS_KEY})

    def get_checkpoint_dict(self) -> dict[str, Any]:
        """fairseq's hook for training state in checkpoints, read back on a resume: the ids' digest and the
        early-stopping state (see the module docstring)."""
        stopper = _fairseq_early_stopping()
        state = {key: getattr(stopper, key) for key in EARLY_STOPPING_STATE if hasattr(stopper, key)}
        return {type(self).__name__: {IDS_KEY: self.ids_sha256, **({"early_stopping": state} if state else {})}}

    def set_checkpoint_dict(self, state: dict[str, Any]) -> None:
        """fairseq's hook on resuming from a checkpoint: check the ids, restore the early-stopping state."""
        self.check_ids(state.get(IDS_KEY))
        stopper = _fairseq_early_stopping()
        if stopper is not None:
            for key, value in state.get("early_stopping", {}).items():
                setattr(stopper, key, value)
