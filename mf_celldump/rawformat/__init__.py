"""The raw capture format: the one owner of everything written under ``{dump_path}/_raw``.

Capture writes it while training runs (``writer.RawWriter``); processing reads it
(``scan``, ``records``, ``kbk_csv``) and turns it into msprobe's layout. Its parts:

* ``keys``: what identifies a captured value (``ProbeKey``), value kinds;
* ``names``: folder and file names of the raw tree, raw tensor file names;
* ``manifest``: the per-rank manifest, with its version checked on read;
* ``records``: ``records.jsonl`` lines (statistics, non-tensor values);
* ``markers``: step-complete and step-processed markers;
* ``kbk_csv``: MindSpore's kernel-by-kernel ``statistic.csv`` files;
* ``spec``: the tables of docs/raw-format.md, generated from the above.
"""
