from archrun.compile import FamilyHints
from archrun.plugins import installed_plugins, make_plugin_manager


def test_family_is_installed_and_describes_its_architectures():
    assert "glm4moe" in installed_plugins()
    pm = make_plugin_manager(names=["glm4moe"])
    archs = [a for lst in pm.hook.archrun_families() for a in lst]
    assert archs
    for arch in archs:
        assert isinstance(pm.hook.archrun_describe_family(architecture=arch), FamilyHints)
    assert pm.hook.archrun_describe_family(architecture="no-such-arch") is None
