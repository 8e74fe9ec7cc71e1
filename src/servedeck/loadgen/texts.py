"""Real text for prompts, from what every Python install ships (no download, same on every host).

    prose  the documentation topics of `pydoc_data.topics` (the language reference's prose)
    code   the standard library's own top-level .py sources, in name order

Random words say nothing about speculative decoding (n-gram and draft acceptance depend on how
predictable the text is) and little about real tokenisation; these do. A prompt takes a slice
of the corpus starting at a place its seed picks (at a line start for code, a word start for
prose), wrapping round at the end, so a prompt longer than the corpus is still well defined.
"""

from __future__ import annotations

import random
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Literal

Content = Literal["random", "prose", "code"]
CONTENTS: tuple[str, ...] = ("random", "prose", "code")
CODE_MAX_CHARS = 8 * 2**20  # enough for a 1M-token prompt without wrapping, small enough to load fast


@lru_cache(maxsize=None)
def corpus(content: str) -> str:
    """The whole text of `prose` or `code` (cached per process)."""
    if content == "prose":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k].strip() for k in sorted(topics)) + "\n\n"
    if content == "code":
        parts: list[str] = []
        size = 0
        for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            parts.append(f"# {path.name}\n{text}\n")
            size += len(parts[-1])
            if size >= CODE_MAX_CHARS:
                break
        if not parts:
            raise RuntimeError(f"no standard-library sources under {sysconfig.get_paths()['stdlib']}")
        return "".join(parts)
    raise ValueError(f"content must be one of {', '.join(CONTENTS)}, got {content!r}")


def start_of(content: str, rng: random.Random) -> int:
    """A random place to start: the beginning of a line (code) or of a word (prose)."""
    text = corpus(content)
    pos = rng.randrange(len(text))
    stop = "\n" if content == "code" else " \n"
    while 0 < pos < len(text) and text[pos - 1] not in stop:
        pos += 1
    return pos % len(text)


def piece(content: str, start: int, chars: int) -> str:
    """`chars` characters of the corpus from `start`, wrapping round at its end."""
    text = corpus(content)
    out, pos, left = [], start % len(text), max(0, chars)
    while left > 0:
        take = text[pos:pos + left]
        out.append(take)
        left -= len(take)
        pos = 0
    return "".join(out)
