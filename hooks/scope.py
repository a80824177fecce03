"""Models: the links PoocH answers for, as one object.

PoocH hooks every Chainer function the process runs, so what it snapshots, restores and counts
as resident memory must cover every link whose functions it plans: the ones it was given
(``PoocH(model)``, ``PoocH([gen, dis])``) and any other link that runs inside the ``with``
block (found by the link hook the first time it is called, before it runs). ``Models`` offers
``params()`` and ``namedlinks()`` like a single Chain, each parameter and link once, so every
helper written for one model works on the whole set.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable, Iterator

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import numpy as np


class Models:
    """An ordered set of chainer Links without duplicates (a link given twice, or a link and
    its parent, count once); iterate for the top-level links. The links given are held; a
    link that joins in the block (``add(link, held=False)``) is not: a copy the loop makes
    for each evaluation goes when the loop lets it go (held, every ``copy.deepcopy`` of a
    user's model stayed on the device, 46 KB more per evaluation)."""

    def __init__(self, links: chainer.Link | Iterable[chainer.Link] | None = None) -> None:
        self.links: list[chainer.Link] = []
        self._joined: list[weakref.ref] = []
        self._members: set[int] = set()        # ids of every link inside any top link
        self._current = True                   # False once a joined link is gone
        self._several = False                  # paths carry /<i> once there were several
        if links is None:
            return
        if not isinstance(links, chainer.Link) and (not hasattr(type(links), "__iter__") or
                                                    isinstance(links, (str, bytes, np.ndarray))):
            raise _not_links(links)
        for link in ([links] if isinstance(links, chainer.Link) else list(links)):
            if not isinstance(link, chainer.Link):
                raise _not_links(link, within=links)
            self.add(link)

    def _tops(self) -> list[chainer.Link]:
        stale, self._current = not self._current, True    # (a link going now: stale again)
        joined = [link for link in (ref() for ref in self._joined) if link is not None]
        if stale:
            self._joined = [weakref.ref(link, self._gone) for link in joined]
            self._members = {id(sub) for top in self.links + joined for sub in top.links()}
        return self.links + joined

    def _gone(self, _ref: weakref.ref) -> None:
        self._current = False

    def __iter__(self) -> Iterator[chainer.Link]:
        return iter(self._tops())

    def __len__(self) -> int:
        return len(self._tops())

    def __contains__(self, link: Any) -> bool:
        if not self._current:
            self._tops()
        return id(link) in self._members

    @property
    def name(self) -> str:
        """The given model's class name, or the names joined by '+' for several."""
        return "+".join(type(link).__name__ for link in self.links) or "model"

    def add(self, link: chainer.Link, held: bool = True) -> bool:
        """Cover ``link`` and its children; False if it was covered already."""
        if link in self:
            return False
        if held:
            self.links.append(link)
        else:
            self._joined.append(weakref.ref(link, self._gone))
        self._members.update(id(sub) for sub in link.links())
        self._several = self._several or len(self.links) + len(self._joined) > 1
        return True

    def namedlinks(self) -> Iterator[tuple[str, chainer.Link]]:
        """(path, link) of every link once; paths start with ``/<i>`` once there were several."""
        seen: set[int] = set()
        for i, top in enumerate(self._tops()):
            prefix = f"/{i}" if self._several else ""
            for path, link in top.namedlinks():
                if id(link) not in seen:
                    seen.add(id(link))
                    yield (prefix + path if path != "/" or not prefix else prefix), link

    def params(self) -> Iterator[chainer.Parameter]:
        """Every parameter once (tied weights and shared links counted once)."""
        seen: set[int] = set()
        for top in self._tops():
            for param in top.params():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param


def _not_links(given: object, within: object = None) -> TypeError:
    """What PoocH says of a model that is no Link (an optimizer: the model it updates)."""
    what = type(given).__name__ + (f" in the {type(within).__name__}" if within is not None
                                   else "")
    hint = (": pass the model it updates, optimizer.target"
            if isinstance(given, chainer.Optimizer) else "")
    return TypeError(f"PoocH covers chainer Links (a Link, or a list of them); got "
                     f"{what}{hint}")
