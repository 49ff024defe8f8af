# Dashboard machinery: you should not need to edit this file.
"""The throughput chart's geometry: one stacked bar a minute, the jobs done below and the
dead-lettered on top, drawn as inline SVG by templates/overview.html (no script in the page)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .source import ThroughputRow

WIDTH = 1100
HEIGHT = 160
# Room under the bars for the axis labels.
AXIS = 18


@dataclass(frozen=True)
class Bar:
    minute: datetime
    done: int
    failed: int
    cancelled: int
    x: float
    width: float
    done_y: float
    done_height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    peak: int  # the most jobs done or dead-lettered in one minute: the top of the scale
    done: int
    failed: int
    cancelled: int
    width: int = WIDTH
    height: int = HEIGHT
    axis: int = AXIS

    @property
    def plot_height(self) -> int:
        return self.height - self.axis


def throughput_chart(rows: Sequence[ThroughputRow]) -> Chart:
    """Sum every queue's rows minute by minute; the minutes are the ones the rows name."""
    per_minute: dict[datetime, list[int]] = {}
    for row in rows:
        counts = per_minute.setdefault(row.minute, [0, 0, 0])
        counts[0] += row.done
        counts[1] += row.failed
        counts[2] += row.cancelled
    minutes = sorted(per_minute)
    peak = max((done + failed for done, failed, _ in per_minute.values()), default=0)
    plot = HEIGHT - AXIS
    scale = plot / peak if peak else 0.0
    slot = WIDTH / len(minutes) if minutes else 0.0
    bars = []
    for i, minute in enumerate(minutes):
        done, failed, cancelled = per_minute[minute]
        done_height = done * scale
        failed_height = failed * scale
        bars.append(
            Bar(
                minute=minute,
                done=done,
                failed=failed,
                cancelled=cancelled,
                x=round(i * slot + slot * 0.1, 2),
                width=round(slot * 0.8, 2),
                done_y=round(plot - done_height, 2),
                done_height=round(done_height, 2),
                failed_y=round(plot - done_height - failed_height, 2),
                failed_height=round(failed_height, 2),
            )
        )
    return Chart(
        bars=bars,
        peak=peak,
        done=sum(bar.done for bar in bars),
        failed=sum(bar.failed for bar in bars),
        cancelled=sum(bar.cancelled for bar in bars),
    )
