"""Exceptions a user can cause. Every message names the node, op, tensor, shape or file at fault."""


class ModelcError(Exception):
    """Base class: anything modelc raises on purpose is one of these."""


class ModelLoadError(ModelcError):
    """The model file or proto cannot be read or is malformed."""


class UnsupportedOpError(ModelcError):
    """The model uses operators (or attribute forms) modelc cannot import."""

    def __init__(self, unsupported):
        # unsupported: dict op_type -> list of node names
        self.unsupported = dict(unsupported)
        lines = [f"  {op}: {len(names)} node(s), e.g. {', '.join(repr(n) for n in names[:3])}"
                 for op, names in sorted(self.unsupported.items())]
        super().__init__(
            f"the model uses {len(self.unsupported)} unsupported operator type(s):\n" + "\n".join(lines))


class ShapeError(ModelcError):
    """An input shape is missing, has the wrong rank, or an op's shapes do not agree."""


class DynamicError(ShapeError):
    """A shape, an If's condition, a Loop's trip count or a sequence position depends on the model's
    input data. The importer sends such a node, and every node after it that reads its results, to
    the model's data-dependent tail (runtime/tail.py) instead of compiling it."""


class InputError(ModelcError):
    """Wrong feeds given to a graph or module: name, shape or dtype."""
