"""DSpark (DeepSeek): DFlash backbone with anchor-predicts-next rows, a sequential Markov head, a confidence
head, and Sequential Temperature Scaling of its confidences (engine-free)."""

from spec_plugins.proposers.dspark.calibration import SequentialTemperatureScaling, expected_calibration_error
from spec_plugins.proposers.dspark.heads import (
    MARKOV_HEAD_TYPES,
    ConfidenceHead,
    DSparkDrafter,
    MarkovHead,
    WalkResult,
    markov_walk,
    prefix_survival,
    teacher_forced,
    walk_block,
)
from spec_plugins.proposers.dspark.deepspec import load_deepspec_dspark
from spec_plugins.proposers.dspark.loader import load_dspark
from spec_plugins.proposers.dspark.proposer import DSparkProposer

__all__ = [
    "MARKOV_HEAD_TYPES", "ConfidenceHead", "DSparkDrafter", "DSparkProposer", "MarkovHead", "SequentialTemperatureScaling",
    "WalkResult", "expected_calibration_error", "load_deepspec_dspark", "load_dspark", "markov_walk", "prefix_survival", "walk_block",
    "teacher_forced",
]
