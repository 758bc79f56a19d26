"""RL objectives: advantage functions registered by name (rung.objectives.registry), each in its own module
here. A new objective is one module with a function under `@register_objective(name, **constraints)`,
imported below; a stage may also name any function of that signature by its import path (`module:function`)."""

from rung.objectives import group_relative, signed
from rung.objectives.registry import OBJECTIVES, AdvantageFn, Objective, of_function, register_objective
from rung.objectives.signed import signed_advantages

__all__ = [
    "OBJECTIVES",
    "AdvantageFn",
    "Objective",
    "group_relative",
    "of_function",
    "register_objective",
    "signed",
    "signed_advantages",
]
