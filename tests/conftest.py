"""Shared test configuration.

* ``shared_models`` fixture: the folder ../shared/models beside the checkout. Tests that need it
  skip with a visible reason where it is absent (a user's own clone) and fail instead when
  ``TENSORFUSE_REQUIRE_SHARED=1`` (which .ci/run sets).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SHARED_MODELS = ROOT.parent / "shared" / "models"


def shared_models_dir() -> pathlib.Path:
    """../shared/models, or skip (fail under TENSORFUSE_REQUIRE_SHARED=1) when absent."""
    if not (SHARED_MODELS / "models.json").exists():
        msg = f"{SHARED_MODELS} is absent: the shared real models are not available in this clone"
        if os.environ.get("TENSORFUSE_REQUIRE_SHARED") == "1":
            pytest.fail(msg + " (TENSORFUSE_REQUIRE_SHARED=1)")
        pytest.skip(msg)
    return SHARED_MODELS


def shared_model_entries() -> list[dict]:
    """Entries of models.json, or [] when absent (the tests then skip via the fixture)."""
    p = SHARED_MODELS / "models.json"
    return json.loads(p.read_text())["models"] if p.exists() else []


@pytest.fixture
def shared_models() -> pathlib.Path:
    return shared_models_dir()
