"""peagle.bench.steps: the engines take turns, ``steps`` steps each, round after round, and each step is timed."""
from peagle.bench.steps import step_times


class Engine:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def step(self):
        self.log.append(self.name)


def test_engines_take_turns_and_every_step_is_timed():
    log, seen = [], []
    engines = {0: Engine("plain", log), 7: Engine("k7", log)}
    times = step_times(engines, rounds=2, steps=3, each=lambda k, s: seen.append(k))
    assert log == ["plain"] * 3 + ["k7"] * 3 + ["plain"] * 3 + ["k7"] * 3  # a burst of load lands on both alike
    assert seen == [0] * 3 + [7] * 3 + [0] * 3 + [7] * 3
    assert {k: len(v) for k, v in times.items()} == {0: 6, 7: 6} and all(t >= 0 for v in times.values() for t in v)
