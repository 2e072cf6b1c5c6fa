"""Words as searches compare them (search/, file names): folded (NFKC, no accents, case
folded) and cut into terms (English stems; pairs of characters in Chinese, Japanese and
Korean), the same rules for what is indexed and what is asked."""

# ``Día``, ``DIA``, ``dia`` and ``Día`` written decomposed (NFD) are one word; ``budgets``
# and ``budget`` one term. A script written without spaces has no word edges to find, so
# each run of it is indexed as its pairs of neighbouring characters: a word inside a
# sentence is found as the pairs it is made of. The database's full-text engine then only
# sees plain terms separated by spaces, on SQLite (FTS5) and PostgreSQL (tsvector,
# 'simple' configuration) alike.

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

# A run of word characters; CJK runs are cut into pairs below.
_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile(
    "[\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f]+"
)
MAX_TERM = 64  # longer "words" (a hash, a run of digits) are cut there


@functools.cache
def _stemmer() -> Any:
    import snowballstemmer  # here: a start that indexes and searches nothing needs none

    return snowballstemmer.stemmer("english")


def fold(text: str) -> str:
    """``text`` compatibility-composed, without accents, case folded."""
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare.casefold())


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A folded Latin (or other spaced script's) word's English stem."""
    return str(_stemmer().stemWord(word)) if word.isascii() and word.isalpha() else word


def words(text: str) -> list[str]:
    """The folded words of ``text``, CJK runs apart from the rest (``"会议预算2024"`` is
    ``["会议预算", "2024"]``)."""
    found = []
    for word in _WORD.findall(fold(text)):
        found += [w for w in _split_cjk(word) if w]
    return found


def _split_cjk(word: str) -> list[str]:
    parts, at = [], 0
    for run in _CJK.finditer(word):
        parts += [word[at : run.start()], run.group()]
        at = run.end()
    parts.append(word[at:])
    return parts


def is_cjk(word: str) -> bool:
    return bool(_CJK.fullmatch(word))


def word_terms(word: str) -> list[str]:
    """The terms of one folded word as a query looks for it: its stem, or a CJK run's
    character pairs (a single character stays as it is)."""
    if is_cjk(word):
        if len(word) == 1:
            return [word]
        return [word[i : i + 2] for i in range(len(word) - 1)]
    return [stem(word[:MAX_TERM])]


def terms(text: str) -> list[str]:
    """The terms ``text`` is indexed under, in order: each CJK run's pairs and then its
    last character alone, so that a one-character query (a prefix) finds every place."""
    found = []
    for word in words(text):
        found += word_terms(word)
        if is_cjk(word) and len(word) > 1:
            found.append(word[-1])
    return found


def indexed(text: str) -> str:
    """``text``'s terms, as the full-text column holds them."""
    return " ".join(terms(text))
