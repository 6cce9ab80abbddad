"""The first test of every family: the entry point is installed and describes what it lists.

Name test files uniquely (test_<family>_*.py): families' tests/ folders are not packages.
Next: a tiny model of the architecture (docs/testing.md, "Tiny HF fixtures"), whose logits archrun
must reproduce.
"""

from archrun.conformance import check_family_plugin
from archrun_myfamily import ARCHITECTURE, HINTS


def test_family_is_installed_and_describes_its_architectures():
    assert check_family_plugin("myfamily") == sorted(HINTS) == [ARCHITECTURE]
