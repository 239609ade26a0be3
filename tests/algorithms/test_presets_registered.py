"""Every preset names registered components: `resolve` checks only the components a config sets
beside its preset (so reading a config imports no torch), which is safe because of this test."""
import pytest

from algorithms.advantages import ADVANTAGES
from algorithms.filters import FILTERS
from algorithms.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from algorithms.presets import ALGORITHMS, DISPLAY_NAMES, KL_PLACEMENTS, REGISTRIES, resolve
from algorithms.registry import UnknownComponentError
from harness.config.schema import AlgorithmConfig

BY_KIND = {"advantage": ADVANTAGES, "policy_loss": POLICY_LOSSES, "aggregation": AGGREGATIONS,
           "filter": FILTERS, "kl_estimator": KL_ESTIMATORS}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_preset_component_is_registered(name):
    preset = ALGORITHMS[name]
    for kind, registry in BY_KIND.items():
        assert preset[kind] in registry, f"{name}: {kind} {preset[kind]!r} is not registered"
    assert preset["kl_placement"] in KL_PLACEMENTS
    assert set(REGISTRIES) == set(BY_KIND)


@pytest.mark.parametrize("kind", sorted(BY_KIND))
def test_a_component_set_beside_the_preset_is_checked(kind):
    with pytest.raises(UnknownComponentError, match="valid:"):
        resolve(AlgorithmConfig(name="grpo", **{kind: "no_such_component"}))


def test_display_names_name_presets():
    assert set(DISPLAY_NAMES) <= set(ALGORITHMS), sorted(set(DISPLAY_NAMES) - set(ALGORITHMS))
