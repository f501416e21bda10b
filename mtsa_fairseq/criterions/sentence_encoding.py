"""Loss of the sentence-encoder tasks (formulas: docs/sentence-tasks.md, Task and criterion). Classification
(docs/reference.md §3.1 step 5): mean softmax cross-entropy + ``wd * sum(W^2) / 2`` over the weights (not embeddings,
not biases), added ``nsentences`` times as fairseq divides by the sentences; relatedness (SICK): ``KL(t || p)`` to
Tai et al.'s (2015) sparse target distribution. Logged: accuracy, or MSE and Pearson r, and the L2 term."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from torch import Tensor

SCORES = torch.arange(1, 6, dtype=torch.float32)  # SICK relatedness classes 1..5


def tai_target(scores: Tensor) -> Tensor:
    """Tai et al.'s sparse target distribution ``[B, 5]`` of scores in [1, 5]."""
    floor = scores.floor().clamp(1, 5)
    frac = scores - floor
    target = torch.zeros(scores.shape[0], 5, dtype=scores.dtype, device=scores.device)
    index = (floor - 1).long()
    target.scatter_(1, index[:, None], (1.0 - frac)[:, None])
    upper = (index + 1).clamp(max=4)
    return target.scatter_add(1, upper[:, None], torch.where(index < 4, frac, torch.zeros_like(frac))[:, None])


def _full(t: Tensor) -> Tensor:
    """Half-precision tensors in float32 (losses and sums of squares); others unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def expected_score(logits: Tensor) -> Tensor:
    """``sum_k k * softmax(logits)_k`` for the 5 relatedness classes."""
    probs = torch.softmax(_full(logits), dim=-1)
    return probs @ SCORES.to(probs)


def pearson_from_sums(n: float, sx: float, sy: float, sxx: float, syy: float, sxy: float) -> float:
    """Pearson r from the counts and sums of x, y, x^2, y^2 and xy (0 when either side is constant)."""
    var = (n * sxx - sx * sx) * (n * syy - sy * sy)
    return round((n * sxy - sx * sy) / math.sqrt(var), 4) if var > 0 else 0.0


@register_criterion("sentence_encoding")
class SentenceEncodingCriterion(FairseqCriterion):
    """Cross-entropy (classes) or Tai's KL (relatedness), plus ``--l2-weight`` x sum(W^2) / 2 in training."""

    def __init__(self, task: Any, l2_weight: float = 0.0):
        super().__init__(task)
        self.l2_weight = l2_weight

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--l2-weight", type=float, default=0.0, metavar="WD",
                            help="the code's wd: adds WD * sum(W^2) / 2 over weights (not embeddings or biases)")

    def forward(self, model: Any, sample: dict[str, Any], reduce: bool = True) -> tuple[Tensor, int, dict[str, Any]]:
        logits = _full(model(**sample["net_input"]))
        target = sample["target"]
        n = target.shape[0]
        log: dict[str, Any] = {"ntokens": sample["ntokens"], "nsentences": n, "sample_size": n}
        if model.kind == "relatedness":
            loss = F.kl_div(F.log_softmax(logits, dim=-1), tai_target(target.to(logits)), reduction="sum")
            pred, gold = expected_score(logits).detach().double(), target.double()
            log.update(sse=((pred - gold) ** 2).sum().item(), sx=pred.sum().item(), sy=gold.sum().item(),
                       sxx=(pred * pred).sum().item(), syy=(gold * gold).sum().item(), sxy=(pred * gold).sum().item())
        else:
            loss = F.cross_entropy(logits, target, reduction="sum")
            log["ncorrect"] = (logits.argmax(dim=-1) == target).sum().item()
        log["loss"] = loss.detach().item()
        total = loss
        if self.l2_weight and model.training:
            l2 = sum(_full(w).pow(2).sum() for w in model.regularized_weights()) / 2
            log["l2"] = l2.detach().item() * n
            total = loss + n * self.l2_weight * l2
        return total, n, log

    @staticmethod
    def validation_metrics(kind: str) -> tuple[str, ...]:
        """What :meth:`reduce_metrics` logs in validation on data of ``kind`` (``l2`` is logged in training only)."""
        return ("loss", *(("mse", "pearson") if kind == "relatedness" else ("accuracy",)))

    @staticmethod
    def reduce_metrics(logging_outputs: list[dict[str, Any]]) -> None:
        def total(key: str) -> float:
            return sum(log.get(key, 0) for log in logging_outputs)

        n = total("sample_size")
        if not n:
            return
        metrics.log_scalar("loss", total("loss") / n / math.log(2), n, round=3)
        if any("l2" in log for log in logging_outputs):
            metrics.log_scalar("l2", total("l2") / n, n, round=3)
        if any("ncorrect" in log for log in logging_outputs):
            metrics.log_scalar("accuracy", 100.0 * total("ncorrect") / n, n, round=2)
        if any("sse" in log for log in logging_outputs):
            metrics.log_scalar("mse", total("sse") / n, n, round=4)
            # Pearson r over the whole split, not an average of per-batch values: sum the moments
            # (meters named "_..." are not printed) and derive r from the sums
            for key in ("sx", "sy", "sxx", "syy", "sxy", "sample_size"):
                metrics.log_scalar_sum(f"_{key}", total(key))
            metrics.log_derived("pearson", lambda meters: pearson_from_sums(
                *(meters[f"_{k}"].sum for k in ("sample_size", "sx", "sy", "sxx", "syy", "sxy"))))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
