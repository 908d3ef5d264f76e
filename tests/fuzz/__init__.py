"""Differential random-graph testing and frontend fuzzing (issue 9).

- :mod:`fuzz.graphgen`: a seeded generator of random valid ONNX graphs, the comparison with
  onnxruntime (``ORT_DISABLE_ALL``) at O0, O2 and O3, and a shrinker.
- :mod:`fuzz.isolate`: runs one job in a child process (forkserver) so that an abort, a signal or
  a hang is counted instead of ending the run.
- :mod:`fuzz.mutate`: byte-level and structural mutations of ONNX models.
- ``random_graphs.py`` and ``fuzz_models.py``: the command-line scripts (any count, any seed).
"""
