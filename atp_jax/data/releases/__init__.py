"""Readers of the datasets' official releases: each reads one repository's own files, as a clone gives them.

A :class:`Release` says where a dataset's split lives in a checkout of its repository and how to read it
into :class:`~atp_jax.tables.table.Example` records; each dataset's reader is its own module (``wtq``,
``tatqa``, ``fetaqa``), attached to the dataset by its ``DatasetSpec(release=...)`` line in
:mod:`atp_jax.data.registry`. The readers give the same records as the project-schema JSONL converted from
the same files (ids, questions, answers, cells and ``meta``), so a run reads either interchangeably.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from atp_jax.data.order_filter import ORDER_KEYWORDS
from atp_jax.tables.table import Example

__all__ = ["Release", "order_keyword_flag"]


def order_keyword_flag(question: str) -> bool:
    """``meta.order_kw``: the question holds one of the paper's order keywords (a flag; nothing is dropped)."""
    return bool(ORDER_KEYWORDS.search(question))


@dataclasses.dataclass(frozen=True)
class Release:
    """A dataset's official repository as a reader sees it.

    Attributes:
        repository: ``owner/name`` on GitHub, for messages.
        folder: the folder a clone makes (``git clone`` names it after the repository), looked for inside a
            data directory as well as the data directory itself.
        split_files: split name -> the file inside the checkout that holds it.
        read: ``read(checkout, split) -> [Example]``.
        extra_files: ``extra_files(checkout, split) -> [path inside the checkout]``: the files ``read`` reads
            besides the split's own (a run's manifest hashes them all); None when it reads only that one.
    """

    repository: str
    folder: str
    split_files: Mapping[str, str]
    read: Callable[[Path, str], list[Example]]
    extra_files: Callable[[Path, str], list[str]] | None = None

    def split_file(self, split: str) -> str:
        """The file holding ``split``; ``ValueError`` naming the splits the release has."""
        if split not in self.split_files:
            raise ValueError(
                f"the {self.repository} release has no split {split!r}; use one of {', '.join(self.split_files)}"
            )
        return self.split_files[split]

    def checkout(self, data_dir: str | Path, split: str) -> Path | None:
        """The checkout under ``data_dir`` that holds ``split``: ``data_dir`` itself or ``data_dir/<folder>``;
        None when neither does (or the split is unknown)."""
        if split not in self.split_files:
            return None
        for candidate in (Path(data_dir), Path(data_dir) / self.folder):
            if (candidate / self.split_files[split]).is_file():
                return candidate
        return None

    def files(self, checkout: Path, split: str) -> list[str]:
        """Every file (inside ``checkout``) that reading ``split`` reads: what a run's records depend on."""
        extra = self.extra_files(checkout, split) if self.extra_files else []
        return [self.split_file(split), *extra]
