"""Learning curves from fairseq-train logs and the plateau rule that fixes the Multi30k budget."""

import pytest

from mtsa_fairseq.experiments.translation.curves import plateau, plot_curves, system_of, valid_curve

LOG = """\
2026-11-24 23:20:01 | INFO | train_inner | epoch 001:    100 / 241 loss=9.1, nll_loss=8.8, wps=1400.2, num_updates=100
2026-11-24 23:26:12 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.912 | nll_loss 7.301 | ppl 157.68 \
| bleu 1.23 | wps 2100.3 | wpb 1201.4 | bsz 101.4 | num_updates 241
2026-11-24 23:33:40 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.01 | nll_loss 5.2 | ppl 36.8 \
| bleu 9.87 | wps 2000.1 | wpb 1201.4 | bsz 101.4 | num_updates 482 | best_bleu 9.87
2026-11-24 23:40:00 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.00 | nll_loss 5.2 | ppl 36.8 \
| bleu 9.90 | wps 2000.1 | wpb 1201.4 | bsz 101.4 | num_updates 482 | best_bleu 9.9
"""


def test_valid_curve_reads_every_validation_once_the_last_line_winning():
    assert valid_curve(LOG) == [{"update": 241, "loss": 7.912, "bleu": 1.23},
                                {"update": 482, "loss": 6.0, "bleu": 9.9}]


def test_valid_curve_without_bleu():
    line = "x | INFO | valid | epoch 001 | valid on 'valid' subset | loss 4.5 | nll_loss 3 | num_updates 10\n"
    assert valid_curve(line) == [{"update": 10, "loss": 4.5}]


def _curve(bleus, every=100):
    return [{"update": every * (i + 1), "loss": 1.0, "bleu": b} for i, b in enumerate(bleus)]


@pytest.mark.parametrize("bleus, gain, plateaued", [
    ([10, 20, 30, 34, 35, 35.2, 35.1, 35.3], 0.1, True),  # after 600 of 800: best 35.3 vs 35.2 before
    ([10, 20, 30, 34, 35, 35.2, 35.1, 35.6], 0.4, False),  # still gaining 0.4
    ([10, 20, 30, 34, 35, 36, 35.5, 35.0], -0.5, True),  # past its peak (36 at 600, 35.5 after)
    ([10, 20, 30, 34, 35, 41.92, 40.0, 42.22], 0.3, False),  # exactly 0.3 (in floats 0.2999...) is not below it
])
def test_plateau_rule(bleus, gain, plateaued):
    result = plateau(_curve(bleus))
    assert result["gain"] == pytest.approx(gain) and result["plateaued"] is plateaued
    assert result["last_update"] == 100 * len(bleus)


def test_plateau_needs_two_validations():
    assert plateau(_curve([5]))["plateaued"] is False
    assert plateau([])["gain"] is None


def test_plot_curves_writes_a_png(tmp_path):
    out = tmp_path / "curves.png"
    plot_curves({"transformer seed 1": _curve([1, 2, 3]), "mtsa seed 1": _curve([1, 3, 4])}, out, "probe")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]


def test_each_system_gets_its_own_colour_even_with_spaces_in_its_name():
    assert system_of("MTSA s2t bias 5 seed 3") == "MTSA s2t bias 5"
    assert system_of("MTSA seed 3") == system_of("MTSA seed 1") == "MTSA"
