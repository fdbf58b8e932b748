"""Error types: user errors (exit code 2) versus internal failures."""

from __future__ import annotations


class AmpError(ValueError):
    """A problem with the user's input or options.

    The CLI prints it as one line and exits with code 2; nothing is written.
    It is a ValueError, as the seed API's errors for bad levels and dtypes are.
    """


class ConversionError(Exception):
    """The converter produced something it cannot stand behind (a bug or an
    unsupported construct): reported as one line with exit code 3."""


class RunFailure(AmpError):
    """onnxruntime failed to run a model on a sample. ``role`` says which
    model ("reference": the one compared against, "candidate": the one
    judged): the command that knows what each is and where the samples
    came from says so (see :func:`amp_convert.cli.convert_command`)."""

    def __init__(self, detail: str, role: str) -> None:
        super().__init__(f"onnxruntime failed to run the model: {detail}")
        self.detail, self.role = detail, role


class LoadFailure(AmpError):
    """onnxruntime could not load a model. ``role``, where a validation run
    set it, says which model, as for :class:`RunFailure`."""

    def __init__(self, detail: str, role: str | None = None) -> None:
        super().__init__(f"onnxruntime cannot load the model: {detail}")
        self.detail, self.role = detail, role
