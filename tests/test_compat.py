"""The tested trainer versions (rung.compat); tests/test_trl_seam.py checks what rung uses of them."""

from __future__ import annotations

import pytest

from rung import compat
from rung.errors import InputError


def test_installed_versions_are_the_tested_ones():
    compat.check()


def test_an_untested_version_is_refused_in_one_line_naming_the_seam():
    with pytest.raises(InputError) as e:
        compat.check({"trl": "1.17.0", "transformers": "5.23.1"})
    assert str(e.value).startswith(
        "trl 1.17.0 is outside the tested 1.16.x: rung overrides private methods of its trainers "
        "(rung/train/trl_seam.py lists them)"
    )
    assert "\n" not in str(e.value)
    compat.check({"trl": "1.16.3", "transformers": "5.23.0"})
