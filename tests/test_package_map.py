"""package_map: `importlib.metadata.packages_distributions()` answered from the cache folder while
the environment is unchanged, computed afresh when a package folder changes or the cache is
damaged, and never an error for an unwritable cache."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from arlecli import package_map


class Counting:
    """A stand-in for the real function that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, list[str]]:
        self.calls += 1
        return {"yaml": ["PyYAML"], "arlecli": ["arle"]}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ARLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_second_command_reads_the_answer_the_first_computed(home):
    real = Counting()
    first = package_map._cached(real)
    assert package_map._cached(real) == first == real() and real.calls == 2  # 1 + the comparison's own
    assert (home / "cache" / package_map.CACHE_FILE).is_file()


def test_installing_or_removing_a_package_computes_it_afresh(home, tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    real = Counting()
    package_map._cached(real)
    package_map._cached(real)
    assert real.calls == 1
    (site / "newpkg-1.0.dist-info").mkdir()  # what pip install leaves
    package_map._cached(real)
    assert real.calls == 2
    (site / "newpkg-1.0.dist-info").rmdir()
    package_map._cached(real)
    assert real.calls == 3


@pytest.mark.parametrize(
    "damage", ["{not json", '{"key": 1}', "[]", '{"key": null, "map": {"yaml": "PyYAML"}}', "\x00\xff"]
)
def test_a_damaged_cache_is_computed_afresh(home, damage):
    real = Counting()
    package_map._cached(real)
    cache = home / "cache" / package_map.CACHE_FILE
    cache.write_text(damage, encoding="latin-1")
    assert package_map._cached(real) == {"yaml": ["PyYAML"], "arlecli": ["arle"]}
    assert real.calls == 2


def test_a_cache_entry_of_the_wrong_shape_is_not_believed(home):
    real = Counting()
    package_map._cached(real)
    cache = home / "cache" / package_map.CACHE_FILE
    text = cache.read_text().replace('["PyYAML"]', '"PyYAML"')  # the right key, a value of the wrong type
    cache.write_text(text)
    assert package_map._cached(real)["yaml"] == ["PyYAML"] and real.calls == 2


def test_an_unwritable_cache_only_costs_the_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ARLE_HOME", str(blocker))  # its cache folder cannot be made
    real = Counting()
    assert package_map._cached(real) == {"yaml": ["PyYAML"], "arlecli": ["arle"]}
    assert package_map._cached(real) and real.calls == 2


def test_install_answers_as_the_real_function_does(home, monkeypatch):
    real = importlib.metadata.packages_distributions
    monkeypatch.setattr(importlib.metadata, "packages_distributions", getattr(real, "__wrapped__", real))
    truth = importlib.metadata.packages_distributions()
    package_map.install()
    package_map.install()  # once is enough; twice changes nothing
    patched = importlib.metadata.packages_distributions
    assert patched.arle_cached
    assert patched() == truth and patched() == truth
