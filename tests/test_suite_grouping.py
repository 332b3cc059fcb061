"""The suite's own set-up: pytest-xdist's --dist loadgroup (pyproject's addopts) keeps an
xdist_group's tests on one worker, so the grouped files' module fixtures (a SLURM
cluster, a multi-process reference run, the torch and TensorFlow imports) are built
once. With pytest 9.2 that grouping silently stopped (pytest-xdist issue #1386): this
fails then."""

import os

import pytest

pytestmark = pytest.mark.xdist_group("grouping_check")


def test_xdist_groups_reach_the_scheduler(request):
  if "PYTEST_XDIST_WORKER" not in os.environ:
    pytest.skip("not run by pytest-xdist workers (the README's command uses -n auto)")
  assert request.node.nodeid.endswith("@grouping_check"), (
      f"{request.node.nodeid}: --dist loadgroup did not tag the test with its group; "
      "pytest-xdist will split grouped files over workers (see pyproject.toml's pin)")
