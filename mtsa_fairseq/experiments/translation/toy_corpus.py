"""A synthetic parallel corpus in which attention matters: word-order changes and agreement.

Source sentences are English-like ``DET ADJ* NOUN VERB DET ADJ* NOUN [PREP DET NOUN]``; targets put
the verb last (SOV), mark determiners and adjectives for the noun's gender and number, and inflect the
verb for the subject's number, so every target word depends on words elsewhere in the source."""

from __future__ import annotations

import random
from pathlib import Path

from mtsa_fairseq.experiments.files import write_atomic

NOUNS = {  # source lemma: (target lemma, gender)
    "dog": ("hund", "m"), "cat": ("katze", "f"), "house": ("haus", "n"), "tree": ("baum", "m"),
    "bird": ("vogel", "m"), "car": ("wagen", "m"), "door": ("tuer", "f"), "child": ("kind", "n"),
    "river": ("fluss", "m"), "city": ("stadt", "f"), "book": ("buch", "n"), "table": ("tisch", "m"),
    "lamp": ("lampe", "f"), "horse": ("pferd", "n"), "garden": ("garten", "m"), "street": ("strasse", "f"),
}
ADJECTIVES = {"big": "gross", "small": "klein", "old": "alt", "red": "rot", "quiet": "still", "fast": "schnell"}
VERBS = {"sees": "seh", "likes": "mag", "follows": "folg", "finds": "find", "paints": "mal", "hears": "hoer"}
PREPOSITIONS = {"near": "bei", "behind": "hinter", "under": "unter"}
DETERMINERS = {("m", "sg"): "der", ("f", "sg"): "die", ("n", "sg"): "das", ("pl", "pl"): "die"}


def _noun_phrase(rng: random.Random) -> tuple[list[str], list[str], str]:
    noun = rng.choice(sorted(NOUNS))
    target, gender = NOUNS[noun]
    number = rng.choice(["sg", "pl"])
    adjectives = rng.sample(sorted(ADJECTIVES), rng.choice([0, 0, 1, 1, 2]))
    src = ["the", *adjectives, noun + ("s" if number == "pl" else "")]
    key = ("pl", "pl") if number == "pl" else (gender, "sg")
    suffix = {"m": "er", "f": "e", "n": "es"}[gender] if number == "sg" else "en"
    tgt = [DETERMINERS[key], *(ADJECTIVES[a] + suffix for a in adjectives), target + ("n" if number == "pl" else "")]
    return src, tgt, number


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (source, target) pair."""
    subj_src, subj_tgt, number = _noun_phrase(rng)
    obj_src, obj_tgt, _ = _noun_phrase(rng)
    verb = rng.choice(sorted(VERBS))
    src_verb = verb if number == "sg" else verb[:-1]
    tgt_verb = VERBS[verb] + ("t" if number == "sg" else "en")
    src, tgt = subj_src + [src_verb] + obj_src, subj_tgt + obj_tgt
    if rng.random() < 0.4:
        prep = rng.choice(sorted(PREPOSITIONS))
        pp_src, pp_tgt, _ = _noun_phrase(rng)
        src, tgt = src + [prep] + pp_src, tgt + [PREPOSITIONS[prep]] + pp_tgt
    return " ".join(src), " ".join(tgt + [tgt_verb])


def write_corpus(out_dir: Path, sizes: dict[str, int], seed: int = 1, src: str = "en", tgt: str = "de") -> None:
    """Write ``{split}.{src}`` / ``{split}.{tgt}`` files, e.g. ``sizes={"train": 3000, "valid": 200}``."""
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        pairs = [sentence_pair(rng) for _ in range(n)]
        write_atomic(out_dir / f"{split}.{src}", "".join(s + "\n" for s, _ in pairs))
        write_atomic(out_dir / f"{split}.{tgt}", "".join(t + "\n" for _, t in pairs))
