"""A toy experiment for the suite's tests, independent of experiments/ and its size sweeps.

`toy(wrong=...)` is an `experiments.Experiment` (program, schedules, verification bindings; no
baseline, so it is verified and predicted, not measured): `all_reduce(g) * 2`, scheduled as itself ("AR-C") and, with
`wrong=True`, as `all_reduce(g) * 3` ("wrong", which fails verification). Run as a script, it is
`python -m suite` with the toy in place of experiments/ (`--wrong` first to include the bad one).
"""

from __future__ import annotations

import sys

import dsl
import suite.resolve
import suite.run
from experiments import Experiment
from suite.__main__ import main as suite_main


def toy_program(factor: float = 2.0, schedule: str = "AR-C") -> dsl.Program:
    b = dsl.Builder("toy")
    g = b.input("g", dsl.f32, [dsl.sym("N")], dsl.Local())
    b.output("out", b.all_reduce(g) * factor)
    return b.build(schedule=schedule)


def toy(wrong: bool = False, stages: int = 1) -> Experiment:
    def schedules(dtype=None) -> dict[str, dsl.Program]:
        found = {"AR-C": toy_program()}
        if wrong:
            found["wrong"] = toy_program(3.0, "wrong")
        return found

    def program(dtype=None) -> dsl.Program:
        return toy_program().with_(stages=stages) if stages > 1 else toy_program()

    return Experiment(
        name="toy",
        figure="Fig. 0",
        program=program,
        schedules=schedules,
        verify_bindings=lambda scale: [{"N": 8}, {"N": 16}],
    )


def main() -> None:
    wrong = "--wrong" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--wrong"]
    suite.resolve.load_experiment = lambda name, module=None: toy(wrong=wrong)
    suite_main()


if __name__ == "__main__":
    main()
