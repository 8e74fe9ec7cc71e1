"""The gate's synthetic prompt: filler sentences with an access code planted at a given depth.

Pure functions, no I/O: a probe's text is a function of (seed, number of sentences, depth, code),
so the sizing loop in niah.py can rebuild it at any length and a probe can be reproduced from
its log line. Every probe draws its own seed, and the first line carries a per-probe batch id,
so two probes share no more than the chat template's opening tokens: neither engine's prefix
cache can serve one probe from another (the seed article's 0.9-depth probe once came back from
cache in 0.5 s).

The filler and header have no digits, so the only number in the prompt is the code.
"""

from __future__ import annotations

import random

_SUBJECTS = ["The grey heron", "A quiet librarian", "The old ferry", "A young botanist", "The night clerk",
             "A travelling tinker", "The harbour master", "A retired pilot", "The village baker",
             "A patient gardener", "The lighthouse keeper", "A curious student", "The market trader",
             "A careful surveyor", "The choir director", "A sleepy cat", "The orchard owner",
             "A wandering poet", "The station porter", "A young carpenter"]
_VERBS = ["carried", "painted", "repaired", "counted", "described", "photographed", "measured",
          "cleaned", "borrowed", "returned", "sketched", "inspected", "wrapped", "sorted", "watered",
          "polished", "labelled", "folded", "weighed", "arranged"]
_OBJECTS = ["a basket of apples", "the blue lantern", "an old map of the coast", "the broken clock",
            "a stack of letters", "the wooden bench", "a jar of honey", "the faded curtains",
            "a box of buttons", "the copper kettle", "a bundle of reeds", "the spare oars",
            "a pile of blankets", "the brass compass", "a crate of pears", "the garden gate",
            "a roll of canvas", "the iron railings", "a tin of paint", "the window boxes"]
_PLACES = ["near the river", "behind the mill", "on the hill road", "beside the square", "at the harbour",
           "in the east wing", "under the old bridge", "past the chapel", "by the north gate",
           "along the canal", "inside the greenhouse", "next to the bakery", "at the top of the stairs",
           "below the clock tower", "across the meadow", "in the reading room", "outside the inn",
           "on the upper deck", "beyond the orchard", "at the end of the pier"]
_WHEN = ["before dawn", "after lunch", "late in the evening", "on a windy afternoon", "early on Sunday",
         "during the long rain", "just before supper", "in the first week of spring", "at midday",
         "while the bells rang"]

QUESTION = "What is the access code? Answer with the seven-digit number only."


def sentences(seed: int, n: int) -> list[str]:
    """`n` filler sentences from `seed` (the same seed always gives the same sentences)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                   f"{rng.choice(_PLACES)} {rng.choice(_WHEN)}.")
    return out


def needle(code: str) -> str:
    return f"The access code is {code}. Remember the access code {code}."


def new_code(rng: random.Random) -> str:
    return str(rng.randrange(1_000_000, 10_000_000))


def _letters(seed: int, k: int = 8) -> str:
    """A per-probe id in letters: digits in the header could be mistaken for the code."""
    rng = random.Random(seed ^ 0x5EED)
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(k))


def build(seed: int, n: int, depth: float, code: str) -> str:
    """The user message: a header, `n` filler sentences with the needle after sentence depth*n, the question."""
    filler = sentences(seed, n)
    at = min(n, max(0, round(depth * n)))
    body = filler[:at] + [needle(code)] + filler[at:]
    # A paragraph break every 8 sentences reads like a document rather than one endless line.
    paras = [" ".join(body[i:i + 8]) for i in range(0, len(body), 8)]
    header = (f"Notebook {_letters(seed)}. "
              "Below is a long record of everyday notes. One of them gives an access code.")
    return header + "\n\n" + "\n".join(paras) + "\n\n" + QUESTION
