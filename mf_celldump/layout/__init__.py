"""msprobe's dump layout, the output contract, in one place below processing, mapping and compare.

``naming`` builds and parses entry names, tensor file names and ``step{N}``/``rank{R}``
folders; ``reader`` reads a ``dump.json`` (ours or msprobe's, MindSpore or PyTorch)
entry by entry; ``slots`` walks the tensors inside an entry body. Processing writes this
layout; ``mapping`` and ``compare`` read it, only through these modules.
"""
