"""What validation found, as data: the configuration it ran with, the
per-output statistics, the per-node errors and pinned choices, the verdict
and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field

from .branch_runs import BranchRuns, unrun_note
from .metrics import ErrorStats
from .offenders import NodeError
from .pin import Selection
from .segments import PART_BYTES
from .sequence_stats import ElementSummary, SequenceStats
from .tolerance import Tolerance

# The values a pinned choice is made from must stay finite and keep their
# direction (cosine); their largest element error is not judged: near the
# choice only ties can move, and the outputs built from it are judged whole.
SELECTION_INPUT_CHECKS = ("shape", "nonfinite", "cosine")


@dataclass
class ValidationConfig:
    provider: str = "auto"
    emulate: str = "auto"
    per_node: bool | None = None  # None: on unless the graph has more than PER_NODE_LIMIT float tensors
    top: int = 10
    tolerance: Tolerance | None = None  # None: the default for the low dtype
    pin_choices: bool = True  # candidate reads the reference's TopK / NMS / ... choices (pin.py)
    dtype: str | None = None  # the conversion's low dtype, whose default tolerance applies; None: the candidate's
    # A low-precision candidate is loaded as written too (as_written.py): the auto search's
    # trials skip it, and its chosen model is loaded so (Validator.as_written).
    load_check: bool = True
    # The provider the conversion aimed at (ConvertOptions.target_provider): a kernel the CPU provider
    # lacks is expected of a model aimed at another, where the run on the CPU is emulated.
    target_provider: str = "cuda"
    # Per output name, the tolerance fields that differ from ``tolerance`` (tolerance.parse_tolerances).
    tolerances: dict[str, dict[str, float | str]] = field(default_factory=dict)
    # A reference whose weights pass this runs in parts (segments.py), each within it in weights and in
    # the bytes of one sample's compared tensors: memory stays near one model's weights.
    part_bytes: int = PART_BYTES


@dataclass
class PinnedSelection:
    """A choice the candidate read from the reference, and how often its own agreed."""

    selection: Selection
    agreement: ErrorStats  # reference's choice against the candidate's own, element by element

    def as_dict(self) -> dict:
        a = self.agreement
        return {
            "name": self.selection.name,
            "node": self.selection.node,
            "op_type": self.selection.op_type,
            "inputs": list(self.selection.inputs),
            "agreement": a.equal_fraction if a.count else None,  # over the samples that chose as many elements
            "samples": a.samples,
            "shape_mismatch": a.shape_mismatch,
        }


@dataclass
class ValidationResult:
    provider: str
    provider_note: str
    emulated: bool
    emulation_note: str
    dtype: str
    tolerance: Tolerance
    samples: int
    outputs: list[ErrorStats | SequenceStats | ElementSummary]  # a sequence output's elements follow it (SequenceStats.records)
    nodes: list[NodeError] = field(default_factory=list)
    top: int = 10
    seconds: float = 0.0
    per_node_note: str = ""
    # A reference that is itself low precision may run through its emulation twin too.
    reference_emulated: bool = False
    reference_emulation_note: str = "the reference has no fp16/bf16 tensors"
    pinned: list[PinnedSelection] = field(default_factory=list)
    selection_inputs: list[ErrorStats] = field(default_factory=list)  # judged like outputs
    pin_note: str = ""
    kernel_note: str = ""  # what loading the candidate as written found that validation stands behind
    per_output: dict[str, Tolerance] = field(default_factory=dict)  # outputs judged by a tolerance of their own
    inputs: dict | None = None  # what the samples were (InputSource.describe), where the caller says
    branches: list[BranchRuns] = field(default_factory=list)  # the main graph's Ifs, where their conditions were read

    @property
    def branch_note(self) -> str:
        """The If branches no sample ran (:func:`~amp_convert.branch_runs.unrun_note`)."""
        return unrun_note(self.branches)

    def tolerance_for(self, name: str) -> Tolerance:
        """The tolerance output ``name`` is judged by (a sequence's elements, ``out[3]``, by their output's)."""
        return self.per_output.get(name) or self.per_output.get(name.split("[", 1)[0]) or self.tolerance

    @property
    def passed(self) -> bool:
        outputs_pass = all(not o.verdict(self.tolerance_for(o.name)) for o in self.outputs)
        return outputs_pass and all(not o.verdict(self.tolerance, SELECTION_INPUT_CHECKS) for o in self.selection_inputs)

    def _output_dict(self, o: ErrorStats | SequenceStats | ElementSummary) -> dict:
        tol = self.tolerance_for(o.name)
        d = o.as_dict(tol)
        if tol is not self.tolerance:
            d["tolerance"] = tol.as_dict()
        return d

    def ranked(self) -> list[NodeError]:
        """Low nodes whose rounding reaches the outputs, most first (ties: earlier first)."""
        ranked = [n for n in self.nodes if n.can_round and n.rank_error > 0]
        ranked.sort(key=lambda n: (-n.rank_error, n.index))
        return ranked

    def offenders(self) -> list[NodeError]:
        return self.ranked()[: self.top]

    def as_dict(self) -> dict:
        return {
            "provider": self.provider,
            "provider_note": self.provider_note,
            "emulated": self.emulated,
            "emulation_note": self.emulation_note,
            "reference_emulated": self.reference_emulated,
            "reference_emulation_note": self.reference_emulation_note,
            "dtype": self.dtype,
            "samples": self.samples,
            "tolerance": self.tolerance.as_dict(),
            "passed": self.passed,
            "outputs": [self._output_dict(o) for o in self.outputs],
            "offenders": [n.as_dict() for n in self.offenders()],
            "nodes": [n.as_dict() for n in self.nodes],
            "per_node_note": self.per_node_note,
            "kernel_note": self.kernel_note,
            "branches": [b.as_dict() for b in self.branches],
            "branch_note": self.branch_note,
            "pinned": {
                "note": self.pin_note,
                "selections": [p.as_dict() for p in self.pinned],
                "inputs": [o.as_dict(self.tolerance, SELECTION_INPUT_CHECKS) for o in self.selection_inputs],
            },
            "seconds": round(self.seconds, 4),
        }
