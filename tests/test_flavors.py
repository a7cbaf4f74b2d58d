"""The flavor registry (trt_spec/repository/flavors/): the flavors it finds are the spec's choices,
a module that defines FLAVOR is a flavor, an unknown name is refused by name, and each flavor's
repository holds every model with the flavor's engine models."""

from __future__ import annotations

import textwrap
from typing import get_args

import pytest
from conftest import EXAMPLES

from trt_spec.errors import RepositoryError
from trt_spec.plan import make_plan
from trt_spec.repository import flavors
from trt_spec.runtime import tensors as T
from trt_spec.spec import TritonSpec, load_spec


def test_the_registry_finds_the_spec_choices():
    choices = get_args(TritonSpec.model_fields["flavor"].annotation)
    assert sorted(flavors.FLAVORS) == sorted(choices) == ["llmapi", "tensorrtllm", "torch"]


def test_an_unknown_flavor_is_refused_by_name_with_the_choices():
    with pytest.raises(RepositoryError, match=r"flavor must be one of llmapi, tensorrtllm, torch; got 'vllm'"):
        flavors.get("vllm")


def test_a_module_defining_flavor_is_a_flavor(tmp_path, monkeypatch):
    # What "adding a flavor is one module" rests on: discovery by module, no list to edit.
    (tmp_path / "toy.py").write_text(
        textwrap.dedent(
            """
            from trt_spec.repository.flavors import Flavor

            class ToyFlavor(Flavor):
                name = "toy"
                summary = "a test flavor"

            FLAVOR = ToyFlavor()
            """
        )
    )
    monkeypatch.setattr(flavors, "__path__", [*flavors.__path__, str(tmp_path)])
    found = flavors._discover()
    assert sorted(found) == ["llmapi", "tensorrtllm", "torch", "toy"]
    assert found["toy"].summary == "a test flavor"


# The engine route's flavors; llmapi writes Triton's llmapi model instead (tests/test_llmapi_flavor.py).
@pytest.mark.parametrize("name", sorted(set(flavors.FLAVORS) - {"llmapi"}))
def test_each_flavor_writes_every_model_with_its_engines(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = make_plan(load_spec(EXAMPLES / "pystdlib-demo.yaml"))
    settings = flavors.settings_from_plan(plan, flavor=name)
    models = flavors.model_configs(settings)
    assert set(models) == set(T.MODEL_NAMES)
    backends = {models[T.TARGET].backend, models[T.DRAFT].backend}
    assert backends == ({"python"} if name == "torch" else {"tensorrtllm"})
    assert settings.draft_logits == flavors.get(name).gives_draft_logits(settings.acceptance)
