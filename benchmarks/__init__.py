"""The benchmark suite: ``python -m benchmarks run SPEC [--smoke] [--out DIR]``, ``list``, ``report``.

A spec (``benchmarks/specs/*.yaml``) names systems, stages and the tables it renders; stages are
registered functions in ``benchmarks/stages``; the runner (``benchmarks/suite``) writes every
measurement to ``OUT/results.jsonl`` as it is taken, and ``report`` regenerates the spec's section
of docs/benchmarks.md from that file.
"""
