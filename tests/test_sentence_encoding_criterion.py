"""The sentence-encoder criterion (mtsa_fairseq/criterions/sentence_encoding.py): Tai et al.'s target distribution,
the L2 term and split-level Pearson r."""

import math

import numpy as np
import pytest
import torch
from fairseq import metrics
from scipy import stats
from test_sentence_encoder import build, make_dictionary

from mtsa_fairseq.criterions.sentence_encoding import (
    SentenceEncodingCriterion,
    expected_score,
    pearson_from_sums,
    tai_target,
)


def test_tai_target_distribution_and_expected_score():
    scores = torch.tensor([1.0, 5.0, 3.6, 2.0, 4.25], dtype=torch.float64)
    target = tai_target(scores)
    expected = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0.4, 0.6, 0], [0, 1, 0, 0, 0],
                             [0, 0, 0, 0.75, 0.25]], dtype=torch.float64)
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(target @ torch.arange(1.0, 6, dtype=torch.float64), scores)
    logits = torch.log(expected.clamp_min(1e-30)).float()
    torch.testing.assert_close(expected_score(logits).double(), scores, atol=1e-5, rtol=0)


class CriterionTask:
    def __init__(self):
        self.source_dictionary = make_dictionary()


def test_l2_term_is_added_in_training_only():
    torch.manual_seed(0)
    model = build("mtsa_encoder", "single", 3, embed_dim=8, encoder_hidden_dim=4, classifier_hidden_dim=5).double()
    model.train()
    sample = {"net_input": {"src_tokens": torch.tensor([[4, 5, 6], [7, 8, 1]])}, "target": torch.tensor([0, 2]),
              "ntokens": 5}
    plain, with_l2 = SentenceEncodingCriterion(CriterionTask()), SentenceEncodingCriterion(CriterionTask(), 1e-2)
    torch.manual_seed(1)
    loss0, n, log0 = plain(model, sample)
    torch.manual_seed(1)
    loss1, _, log1 = with_l2(model, sample)
    l2 = sum((w.double() ** 2).sum() for w in model.regularized_weights()) / 2
    assert n == 2
    torch.testing.assert_close(loss1 - loss0, 2 * 1e-2 * l2)
    assert log1["loss"] == pytest.approx(log0["loss"])  # the logged loss is the data loss
    model.eval()
    assert with_l2(model, sample)[0].item() == pytest.approx(plain(model, sample)[0].item())


def test_pearson_is_computed_over_the_whole_split_not_per_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=40), rng.normal(size=40)
    batches = [slice(0, 7), slice(7, 25), slice(25, 40)]
    logs = [{"sample_size": s.stop - s.start, "loss": 0.0, "sse": float(((x[s] - y[s]) ** 2).sum()),
             "sx": x[s].sum(), "sy": y[s].sum(), "sxx": (x[s] ** 2).sum(), "syy": (y[s] ** 2).sum(),
             "sxy": (x[s] * y[s]).sum()} for s in batches]
    with metrics.aggregate(new_root=True) as agg:
        for log in logs:  # fairseq reduces every validation batch separately
            SentenceEncodingCriterion.reduce_metrics([log])
        values = agg.get_smoothed_values()
    assert values["pearson"] == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-4)
    assert values["mse"] == pytest.approx(np.mean((x - y) ** 2), abs=1e-4)
    assert not any(k.startswith("_") for k in values)
    assert pearson_from_sums(3, 3, 3, 3, 5, 4) == 0.0  # constant x
    assert math.isclose(pearson_from_sums(3, 6, 6, 14, 14, 14), 1.0)
