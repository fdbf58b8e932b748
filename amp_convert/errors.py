"""Error types: user errors (exit code 2) versus internal failures."""

from __future__ import annotations


class AmpError(ValueError):
    """A problem with the user's input or options (the kinds below say which).

    The CLI prints it as one line and exits with code 2; nothing is written.
    It is a ValueError, as the seed API's errors for bad levels and dtypes are.
    An option named in a message is written as its field, in backquotes
    (`` `data_max` ``); ``field`` is the first one named, or None. The CLI
    writes the flag in its place.
    """

    kind = "input"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UsageError(AmpError):
    """An option's value is bad, or two options contradict each other."""

    kind = "usage"


class InputError(AmpError):
    """The input model, or a file given with it (samples, config), is bad or cannot be read."""

    kind = "input"


class ConversionError(Exception):
    """The converter produced something it cannot stand behind (a bug or an
    unsupported construct): reported as one line with exit code 3."""

    kind = "conversion"


class InternalError(ConversionError):
    """amp-convert failed in a way no input should cause (a bug): exit code 3."""

    kind = "internal"


class ModelFailure(AmpError):
    """onnxruntime failed on a model (``detail``: its first line). ``role``
    says which model, where validation set it ("reference": the one compared
    against, "candidate": the one judged): the command that knows what each
    is, and where the samples came from, says so (see
    :func:`amp_convert.cli.convert_command`)."""

    failed = "failed on the model"

    def __init__(self, detail: str, role: str | None = None) -> None:
        super().__init__(f"onnxruntime {self.failed}: {detail}")
        self.detail, self.role = detail, role


class RunFailure(ModelFailure):
    """onnxruntime failed to run a model on a sample."""

    failed = "failed to run the model"


class LoadFailure(ModelFailure):
    """onnxruntime could not load a model."""

    failed = "cannot load the model"


class TwinFailure(LoadFailure):
    """onnxruntime could not load a model's emulation twin (see
    :mod:`amp_convert.emulate`) though it loads the model as written: the
    twin is amp-convert's construction, so the failure is not the model's."""

    failed = "cannot load the emulation twin of the model"


class RefusedAsWritten(LoadFailure):
    """onnxruntime refuses a low-precision model as written (a type or graph
    error, a crash), where validation would run something else (its
    emulation twin, or a copy exposing its tensors) that it loads: the real
    run would not happen, so the model cannot pass. ``provider``: the one
    it was loaded on (cuda or cpu)."""

    failed = "cannot load the model as written"

    def __init__(self, detail: str, role: str | None = None, provider: str = "cpu") -> None:
        super().__init__(detail, role)
        self.provider = provider


class NeitherLoads(LoadFailure):
    """onnxruntime could load neither model: the reference (``detail``),
    checked where the candidate (``other``: its failure) did not load. The
    reference's failure: convert names its input; compare names both files."""

    def __init__(self, detail: str, other: str) -> None:
        super().__init__(detail, "reference")
        self.other = other
