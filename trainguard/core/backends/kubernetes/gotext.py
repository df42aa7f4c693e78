"""Two pieces of Go's text formatting that kubectl's output depends on, ported exactly.

`tabwrite` aligns cells as text/tabwriter does (kubectl describe's layout); `human_duration` is
apimachinery's `duration.HumanDuration` (kubectl's ages). What is printed belongs to ``describe``.
"""

from __future__ import annotations

from collections.abc import Sequence

_TAB_PADDING = 2


def human_duration(seconds: float) -> str:
    """Go's `duration.HumanDuration`, as kubectl prints ages ("45s", "3m12s", "5h", "2d4h")."""
    total = int(seconds)
    if total < -1:
        return "<invalid>"
    if total < 0:
        return "0s"
    if total < 120:
        return f"{total}s"
    minutes, hours = total // 60, total // 3600
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def tabwrite(lines: Sequence[str]) -> str:
    """Align tab-separated cells as Go's tabwriter (minwidth 0, padding 2, spaces) does.

    A column is aligned over a block of consecutive lines that all have a tab-terminated cell in
    it; a line without that cell ends the block, exactly as in text/tabwriter's `format`.
    """
    rows = [line.split("\t") for line in lines]
    out: list[str] = []

    def emit(first: int, last: int, widths: list[int]) -> None:
        for row in rows[first:last]:
            cells = [cell.ljust(widths[i]) if i < len(widths) else cell for i, cell in enumerate(row[:-1])]
            out.append("".join(cells) + row[-1])

    def block(first: int, last: int, widths: list[int]) -> None:
        column, line, start = len(widths), first, first
        while line < last:
            if column >= len(rows[line]) - 1:
                line += 1
                continue
            emit(start, line, widths)
            start, width = line, 0
            while line < last and column < len(rows[line]) - 1:
                width = max(width, len(rows[line][column]) + _TAB_PADDING)
                line += 1
            block(start, line, [*widths, width])
            start = line
        emit(start, last, widths)

    block(0, len(rows), [])
    return "\n".join(out) + "\n"
