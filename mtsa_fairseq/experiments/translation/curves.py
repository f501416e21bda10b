"""Learning curves of translation runs: validation loss and BLEU from fairseq-train's log (with ``--eval-bleu``:
``| valid | ... | loss 3.51 | ... | bleu 35.12 | ... | num_updates 2880``; of an update a resumed run validated twice,
the last line counts), the plateau rule that fixes a study's budget on validation data, and one plot of every run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mtsa_fairseq.experiments.plotting import pyplot, save_figure
from mtsa_fairseq.experiments.tables import markdown_table

_VALID = re.compile(r"\| valid \| .*")
_FIELD = re.compile(r"\| (loss|bleu|num_updates) ([0-9.]+)")
PLATEAU_FRACTION = 0.75  # the last quarter of the updates ...
PLATEAU_GAIN = 0.3  # ... gains less than this much BLEU over the best before it


def valid_curve(log_text: str) -> list[dict[str, float]]:
    """``[{"update", "loss", "bleu"}, ...]`` by update, from fairseq's validation log lines (``bleu`` absent
    when the run did not use ``--eval-bleu``)."""
    points: dict[int, dict[str, float]] = {}
    for line in _VALID.findall(log_text):
        fields = dict(_FIELD.findall(line))
        if "num_updates" not in fields or "loss" not in fields:
            continue
        update = int(float(fields["num_updates"]))
        point: dict[str, float] = {"update": update, "loss": float(fields["loss"])}
        if "bleu" in fields:
            point["bleu"] = float(fields["bleu"])
        points[update] = point
    return [points[u] for u in sorted(points)]


def run_curve(run_dir: Path) -> list[dict[str, float]]:
    """:func:`valid_curve` of a run directory's ``train.log`` (empty if it has none)."""
    log = Path(run_dir) / "train.log"
    return valid_curve(log.read_text(errors="replace")) if log.is_file() else []


def plateau(curve: list[dict[str, float]]) -> dict[str, Any]:
    """The budget rule: with U the last validated update, the best BLEU after ``0.75 U`` minus the best up to
    it. ``plateaued`` when that gain is below 0.3 BLEU (needs BLEU at two updates or more)."""
    points = [(p["update"], p["bleu"]) for p in curve if "bleu" in p]
    if len(points) < 2:
        return {"last_update": points[-1][0] if points else None, "gain": None, "plateaued": False}
    last = points[-1][0]
    cut = PLATEAU_FRACTION * last
    before = [b for u, b in points if u <= cut]
    after = [b for u, b in points if u > cut]
    if not before:
        return {"last_update": last, "gain": None, "plateaued": False}
    gain = round(max(after) - max(before), 2)  # BLEU is logged to 2 decimals: 42.22 - 41.92 is 0.30, not 0.2999...
    return {"last_update": last, "best_before": max(before), "best_after": max(after), "gain": gain,
            "plateaued": gain < PLATEAU_GAIN}


def budget(curves: list[list[dict[str, float]]]) -> int | None:
    """The study's budget from the probe's curves: the first update every curve validated at which every curve up to
    it is on a plateau (:func:`plateau`; later validations never move it); None while there is none."""
    validated = [{p["update"] for p in curve if "bleu" in p} for curve in curves]
    for update in sorted(set.intersection(*validated)) if validated else []:
        if all(plateau([p for p in curve if p["update"] <= update])["plateaued"] for curve in curves):
            return update
    return None


def curves_table(report: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """A curves report (``{"runs": {label: {"curve": [...]}}}``) as one row per validated update: every run's
    validation BLEU, then every run's validation loss (— where a run has not validated that update)."""
    name = names or {}
    runs = {name.get(label, label): {p["update"]: p for p in run["curve"]} for label, run in report["runs"].items()}
    header = ["update", *(f"{label} valid BLEU" for label in runs), *(f"{label} valid loss" for label in runs)]
    rows = []
    for update in sorted(set().union(*runs.values())):
        points = [curve.get(update, {}) for curve in runs.values()]
        rows.append([f"{update:,}", *(f"{p['bleu']:.2f}" if "bleu" in p else "—" for p in points),
                     *(f"{p['loss']:.3f}" if "loss" in p else "—" for p in points)])
    return markdown_table(header, rows, align="r" * len(header))


def plateau_table(report: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Per run of a curves report the budget rule at its last validation (:func:`plateau`)."""
    name = names or {}
    header = ["run", "last validation U", f"best BLEU up to {PLATEAU_FRACTION} U", "best after", "gain",
              f"on a plateau (gain < {PLATEAU_GAIN})"]
    rows = []
    for label, run in report["runs"].items():
        verdict = run["plateau"]
        cells = [name.get(label, label), "—" if verdict["last_update"] is None else f"{verdict['last_update']:,}"]
        if verdict["gain"] is None:
            cells += ["—", "—", "—", "no (too few validations)"]
        else:
            cells += [f"{verdict['best_before']:.2f}", f"{verdict['best_after']:.2f}", f"{verdict['gain']:+.2f}",
                      "yes" if verdict["plateaued"] else "not yet"]
        rows.append(cells)
    return markdown_table(header, rows, align="lrrrrl")


def system_of(label: str) -> str:
    """The system of a run label ``"<system> seed <n>"``, whose system name may hold spaces."""
    return label.rsplit(" seed ", 1)[0]


def plot_curves(runs: dict[str, list[dict[str, float]]], path: Path, title: str) -> None:
    """Validation BLEU and loss against updates, one line per run (``runs``: label -> curve), a colour per system."""
    fig, (bleu_ax, loss_ax) = pyplot().subplots(1, 2, figsize=(13, 4.5))
    styles = {}
    for label, curve in runs.items():
        color = styles.setdefault(system_of(label), f"C{len(styles)}")
        updates = [p["update"] for p in curve]
        bleu_ax.plot([p["update"] for p in curve if "bleu" in p], [p["bleu"] for p in curve if "bleu" in p],
                     color=color, alpha=0.8, lw=1, label=label)
        loss_ax.plot(updates, [p["loss"] for p in curve], color=color, alpha=0.8, lw=1, label=label)
    bleu_ax.set_ylabel("validation BLEU (sacreBLEU, beam search)")
    loss_ax.set_ylabel("validation loss (label-smoothed, base 2)")
    for ax in (bleu_ax, loss_ax):
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
