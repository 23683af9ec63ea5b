"""Every architecture the registry serves is one of the model classes mypy holds to the engine's protocol."""

import ast
import importlib
import inspect

from tandem.worker.engine.models import protocol
from tandem.worker.engine.models.registry import ARCHITECTURES, model_module


def checked_classes() -> set[type]:
    """The classes named in protocol.MODEL_CLASSES (defined for mypy only), resolved from their modules."""
    tree = ast.parse(inspect.getsource(protocol))
    (node,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "MODEL_CLASSES"
    ]
    assert isinstance(node.value, ast.Tuple)
    classes = set()
    for element in node.value.elts:
        assert isinstance(element, ast.Attribute | ast.Name)
        if isinstance(element, ast.Name):  # the tensor-parallel view, imported by name
            classes.add(getattr(importlib.import_module("tandem.worker.engine.tp.model"), element.id))
        else:
            assert isinstance(element.value, ast.Name)
            module = importlib.import_module(f"tandem.worker.engine.models.{element.value.id}")
            classes.add(getattr(module, element.attr))
    return classes


def test_every_registered_architecture_is_checked_against_the_protocol():
    checked = checked_classes()
    missing = {name for name in ARCHITECTURES if model_module(name).Model not in checked}
    assert not missing, f"add these architectures' Model classes to protocol.MODEL_CLASSES: {sorted(missing)}"


def test_the_check_names_the_tensor_parallel_view_too():
    from tandem.worker.engine.tp.model import TensorParallelModel

    assert TensorParallelModel in checked_classes()
