"""benchmarks/engine_bias.py: the statistic that says whether engine processes differ, on hand-made tables."""

import importlib.util
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("engine_bias", Path(__file__).parents[1] / "benchmarks" / "engine_bias.py")
engine_bias = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_bias)


def test_engine_effect_is_found_and_round_effect_is_not():
    rng = np.random.default_rng(1)
    rounds = np.array([[100.0], [130.0], [90.0], [120.0], [110.0], [95.0]])  # the machine's speed per round
    noise = rng.normal(0, 2.0, size=(6, 4))
    biased = rounds + np.array([0.0, 10.0, 20.0, 30.0]) + noise  # each engine keeps its own offset
    assert engine_bias.permutation_p(biased, trials=2000) < 0.01
    fair = rounds + noise  # only the rounds differ: shuffling engines within a round changes nothing real
    assert engine_bias.permutation_p(fair, trials=2000) > 0.05


def test_group_f_is_between_over_within():
    table = np.array([[1.0, 3.0], [1.0, 3.0], [1.0, 3.0]])
    assert engine_bias.group_f(table) == float("inf")  # no spread inside an engine
    table = np.array([[1.0, 2.0], [3.0, 2.0]])
    assert engine_bias.group_f(table) == 0.0  # equal engine means
