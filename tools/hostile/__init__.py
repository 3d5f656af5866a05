"""The hostile review's parts (tools/hostile_review.py runs them): ``cases.yaml`` (every case, as
data), ``steps.py`` (the words a case's setup and checks are written in), ``scenarios.py`` (the
server cases that need code) and ``fixtures.py`` (the workspace and the fake foreign models, shared
with the tests)."""
