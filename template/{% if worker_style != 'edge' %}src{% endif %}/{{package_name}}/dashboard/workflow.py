# Dashboard machinery: you should not need to edit this file.
"""A job's workflow as the job page draws it: its steps in layers, in dependency order.

A step's layer is one more than the deepest of the steps it waits for (the first steps, which
wait for none, are layer 1), so every step comes after all it waits for. The ids of a
workflow increase along every edge (a job can only wait for jobs that exist before it), so one
pass in id order places each step. A wide layer (a fan-out of thousands) shows its first
LAYER_LIMIT steps, the page's own job among them, and counts the others by status; the job
list, filtered by the workflow, lists them all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .source import WorkflowStep

# The steps a layer shows; the rest are counted by status.
LAYER_LIMIT = 50
# How much of a step's result or error the drawing shows (the step's own page shows it all).
BRIEF_CHARACTERS = 160


@dataclass
class Layer:
    """The steps of one layer that the page shows, in id order, and the others' statuses."""

    number: int
    steps: list[WorkflowStep] = field(default_factory=list)
    hidden: Counter[str] = field(default_factory=Counter)


@dataclass
class Drawing:
    """A workflow, layer by layer, and how many of its steps have each status."""

    workflow_id: int
    layers: list[Layer]
    statuses: Counter[str]

    @property
    def size(self) -> int:
        return sum(self.statuses.values())


def draw(workflow_id: int, steps: Sequence[WorkflowStep], current: int) -> Drawing:
    """The layers of `steps` (a workflow's, as workflow() returns them), the step `current`
    shown whatever its layer's width."""
    depth: dict[int, int] = {}
    layers: list[Layer] = []
    for step in sorted(steps, key=lambda s: s.id):
        # a step it waits for that is gone (pruned) puts it in no later layer
        level = 1 + max((depth[d] for d in step.depends_on if d in depth), default=-1)
        depth[step.id] = level
        if level == len(layers):
            layers.append(Layer(level + 1))
        layers[level].steps.append(step)
    for layer in layers:
        shown = layer.steps[:LAYER_LIMIT]
        for step in layer.steps[LAYER_LIMIT:]:
            if step.id == current:
                shown.append(step)
            else:
                layer.hidden[step.status] += 1
        layer.steps = shown
    return Drawing(workflow_id, layers, Counter(step.status for step in steps))


def brief(value: Any) -> str:
    """A result or an error on one line, cut to BRIEF_CHARACTERS."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= BRIEF_CHARACTERS else text[: BRIEF_CHARACTERS - 1] + "…"
