"""Models: the links PoocH answers for, as one object.

PoocH hooks every Chainer function the process runs, so what it snapshots, restores and counts
as resident memory must cover every link whose functions it plans: the ones it was given
(``PoocH(model)``, ``PoocH([gen, dis])``) and any other link that runs inside the ``with``
block (found by the link hook the first time it is called, before it runs). ``Models`` offers
``params()`` and ``namedlinks()`` like a single Chain, each parameter and link once, so every
helper written for one model works on the whole set.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer


class Models:
    """An ordered set of chainer Links without duplicates (a link given twice, or a link and
    its parent, count once); iterate for the top-level links."""

    def __init__(self, links: chainer.Link | Iterable[chainer.Link] | None = None) -> None:
        self.links: list[chainer.Link] = []
        self._members: set[int] = set()        # ids of every link inside any of ``links``
        if links is None:
            return
        if not isinstance(links, chainer.Link) and not hasattr(type(links), "__iter__"):
            raise TypeError(f"PoocH covers chainer Links; got {type(links).__name__}")
        for link in ([links] if isinstance(links, chainer.Link) else list(links)):
            if not isinstance(link, chainer.Link):
                raise TypeError(f"PoocH covers chainer Links; got {type(link).__name__}")
            self.add(link)

    def __iter__(self) -> Iterator[chainer.Link]:
        return iter(self.links)

    def __len__(self) -> int:
        return len(self.links)

    def __contains__(self, link: Any) -> bool:
        return id(link) in self._members

    @property
    def name(self) -> str:
        """The model's class name, or the names joined by '+' for several."""
        return "+".join(type(link).__name__ for link in self.links) or "model"

    def add(self, link: chainer.Link) -> bool:
        """Cover ``link`` and its children; False if it was covered already."""
        if link in self:
            return False
        self.links.append(link)
        self._members.update(id(sub) for sub in link.links())
        return True

    def namedlinks(self) -> Iterator[tuple[str, chainer.Link]]:
        """(path, link) of every link once; paths start with ``/<i>`` when there are several."""
        seen: set[int] = set()
        for i, top in enumerate(self.links):
            prefix = f"/{i}" if len(self.links) > 1 else ""
            for path, link in top.namedlinks():
                if id(link) not in seen:
                    seen.add(id(link))
                    yield (prefix + path if path != "/" or not prefix else prefix), link

    def params(self) -> Iterator[chainer.Parameter]:
        """Every parameter once (tied weights and shared links counted once)."""
        seen: set[int] = set()
        for top in self.links:
            for param in top.params():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param
