"""rung's hooks into TRL's private trainer methods: a TRL release that changes them is caught."""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer, RLOOTrainer

from rung import compat
from rung.errors import InputError
from rung.rl import rollouts, sampling


@pytest.mark.parametrize("trainer", [GRPOTrainer, RLOOTrainer])
@pytest.mark.parametrize("method", sorted(compat.OVERRIDDEN))
def test_overridden_methods_keep_their_signatures(trainer, method):
    expected = compat.OVERRIDDEN[method]
    assert list(inspect.signature(getattr(trainer, method)).parameters)[: len(expected)] == expected
    # rung really overrides it (the list is not stale)
    assert any(method in vars(mixin) for mixin in (sampling.CurriculumSampling, rollouts.Rollouts))


def test_installed_versions_are_the_tested_ones():
    compat.check()


def test_an_untested_version_is_refused_in_one_line_naming_the_methods():
    with pytest.raises(InputError) as e:
        compat.check({"trl": "1.17.0", "transformers": "5.23.1"})
    assert str(e.value).startswith(
        "trl 1.17.0 is outside the tested 1.16.x: rung overrides GRPOTrainer._calculate_rewards"
    )
    assert "\n" not in str(e.value)
    compat.check({"trl": "1.16.3", "transformers": "5.23.0"})
