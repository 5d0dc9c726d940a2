"""controller.cluster.objects: one way to name an object, for the informer, explain, admission and `tessera check`."""

from __future__ import annotations

from controller.cluster.objects import by_name, display_name, object_ref


def test_refs_and_display_names() -> None:
    claim = {"metadata": {"namespace": "ml", "name": "c"}}
    generated = {"metadata": {"namespace": "ml", "generateName": "pod-gpu-"}}
    assert object_ref(claim) == display_name(claim) == "ml/c"
    assert object_ref({"metadata": {"name": "cls"}}) == "cls"
    assert display_name(generated) == "ml/pod-gpu-"
    assert display_name({"metadata": None}) == "<no name>"
    assert by_name([{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]).keys() == {"a", "b"}
