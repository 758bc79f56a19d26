"""LaTeX answer markup: the content of the last \\boxed{...} (or \\fbox{...}) of a text."""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """The content of the last balanced \\boxed{...} in `text` (nested braces kept), else None.

    Hand-written: latex2sympy2's extract_boxed_content joins nearby boxes into one answer and
    returns the text unchanged when there is no box, where a grader needs "the last box, or none".
    `\\boxed 5` (no braces) gives the token after it, as LaTeX reads it.
    """
    found = None
    for m in _BOX.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    found = text[i + 1 : j].strip()
                    break
        elif i < len(text) and not text[i].isspace():
            found = re.match(r"[^\s$]+", text[i:]).group(0)  # type: ignore[union-attr]
    return found
