"""`Router.plainly_passthrough`'s trie regex finds exactly what the flat alternation finds."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from proxy.dp.routing import _STATISTICS_PREFIXES, STATISTICS_NAMES, _any_of

WORDS = ["adult", "people", *STATISTICS_NAMES, *_STATISTICS_PREFIXES, "u&", "dp", "create"]
FLAT = re.compile("|".join([re.escape(w) for w in WORDS] + [r"\bdo\b"]))
TRIE = re.compile(_any_of(WORDS, whole_words=["do"]))

# pieces that make near misses likely: prefixes of the words, word characters, separators
PIECES = sorted({w[:i] for w in WORDS + ["do"] for i in range(1, len(w) + 1)}) + list(
    " _.,;()'\"$&\n\tdoéß0"
)


@given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_trie_matches_where_the_flat_alternation_does(text: str) -> None:
    assert (TRIE.search(text) is None) == (FLAT.search(text) is None), text


@given(st.text(max_size=40))
def test_trie_matches_where_the_flat_alternation_does_on_any_text(text: str) -> None:
    assert (TRIE.search(text) is None) == (FLAT.search(text) is None), text


def test_whole_word_do() -> None:
    found = ["do", "do $$", "(do)", "x.do"]
    not_found = ["undo", "done", "_do", "doé", "d o"]
    assert [TRIE.search(t) is not None for t in found + not_found] == [True] * 4 + [False] * 5
