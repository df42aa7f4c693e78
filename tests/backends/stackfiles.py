"""Stack files as a job could leave them in `stacks/`: py-spy dumps of any size, and indexes naming them."""

from __future__ import annotations

import json
from pathlib import Path


def py_spy_dump(size_bytes: int, where: str = "all_reduce (torch/distributed/distributed_c10d.py:2050)") -> str:
    """A `py-spy dump` of a rank with as many threads of 100 frames as fill ``size_bytes``; its main
    thread's innermost frame is ``where``."""
    head = ['Process 4242: python train.py', 'Python v3.11.9 (/usr/bin/python3.11)', '',
            'Thread 4242 (active): "MainThread"', f"    {where}",
            "    train_step (train.py:40)", "    main (train.py:80)", "    <module> (train.py:99)"]
    lines, n = head, 0
    size = sum(len(line) + 1 for line in lines)
    while size < size_bytes:
        block = [f'Thread {1000 + n} (idle): "pin_memory_{n}"'] + [
            f"    wait_{i} (threading.py:{300 + i})" for i in range(100)]
        lines.extend(block)
        size += sum(len(line) + 1 for line in block)
        n += 1
    return "\n".join(lines)[:size_bytes]


def write_index(folder: Path, ranks: dict[int, str | None], source: str = "py-spy") -> None:
    """``stacks/index.json`` naming each rank's file (None: recorded absent)."""
    entries = {str(rank): ({"file": name, "source": source, "pid": 4242} if name else {"absent": "the process ended"})
               for rank, name in ranks.items()}
    (folder / "stacks").mkdir(parents=True, exist_ok=True)
    (folder / "stacks" / "index.json").write_text(json.dumps({"started_at": 1.0, "ranks": entries}), "utf-8")
