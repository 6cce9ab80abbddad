from archrun.conformance import check_family_plugin


def test_family_is_installed_and_describes_its_architectures():
    assert check_family_plugin("qwen")
