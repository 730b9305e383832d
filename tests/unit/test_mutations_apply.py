"""Every mutation of `make mutants` still applies to the code it breaks, and names catching
tests that exist: a mutation whose original text moved (or now stands twice) is reported as
"cannot apply" only when someone runs the slow runner, and proves nothing meanwhile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.faults.mutations import MUTATIONS, Mutation, apply

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_applies_once_and_names_existing_tests(
    mutation: Mutation, tmp_path: Path
) -> None:
    for path in {edit.path for edit in mutation.edits}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)

    assert apply(mutation, tmp_path) is None

    for catcher in mutation.catchers:
        file, _, test = catcher.partition("::")
        source = (ROOT / file).read_text()
        assert f"def {test.split('[')[0]}(" in source, catcher
