"""Which link is running: a LinkHook keeping the stack of link paths being called, so each
recorded op is labelled with the innermost link that called it (``OpRecord.label``), and a
link that joins the model mid-training is noticed before it runs."""
from __future__ import annotations

from typing import Any, Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks.scope import Models


class LinkNames(chainer.LinkHook):
    """Keeps the stack of link paths being called, for op labels."""

    name = "PoochLinkNames"

    def __init__(self, model: Any, on_new_link: Callable[[chainer.Link], None]) -> None:
        self.model = model
        self.on_new_link = on_new_link
        self.paths: dict[int, str] = {}
        self.refresh()
        self.stack: list[str] = []

    def refresh(self) -> None:
        """Re-read the model's link paths (after a link joined it)."""
        if self.model is not None:
            self.paths = {id(link): path.lstrip("/") for path, link in self.model.namedlinks()}

    def forward_preprocess(self, args: Any) -> None:
        # (by identity too: a link that joined and went, its id given to a new one)
        if id(args.link) not in self.paths or (isinstance(self.model, Models)
                                               and args.link not in self.model):
            self.on_new_link(args.link)     # before the link runs: nothing of it changed yet
        self.stack.append(self.paths.get(id(args.link), type(args.link).__name__))

    def forward_postprocess(self, args: Any) -> None:
        if self.stack:
            self.stack.pop()
