"""A naming root for several model chunks (MindFormers 2.0 passes ``model=[chunk, ...]``).

With virtual pipeline stages one rank holds several chunks of the model. One capture
covers all of them so the rank has one raw tree; cells are named ``chunk{i}.<name in
chunk i>``. The container is never called and does not rename parameters (children are
inserted without the attribute hook that would prefix parameter names).
"""

from __future__ import annotations

from mindspore import nn


class ModelChunks(nn.Cell):
    """Holds the chunks as children ``chunk0``, ``chunk1``, ... for naming only."""

    def __init__(self, chunks):
        super().__init__(auto_prefix=False)
        for index, chunk in enumerate(chunks):
            self.insert_child_to_cell(f"chunk{index}", chunk)

    def construct(self, *args, **kwargs):
        raise RuntimeError("ModelChunks only names model chunks for capture; call the chunks themselves")
