"""Checkpoints that load in other words than PyTorch's zip reader, judged on text published in public
failure reports (each case names its source) and on what PyTorch itself prints.

A checkpoint that cannot be read (truncated, a broken header) is `checkpoint_corrupted`: the next
attempt resumes from the one before it. A checkpoint that reads fine but is not the one the run
asks for — a resume path with no file, ZeRO state partitioned for another world size, a key the
model wants that the checkpoint never had — is the run's own doing: an older checkpoint has the
same path, partitioning and keys, so no retry can help.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category

CASES = [
    # (source, log, expected category, expected rule)
    ("github.com/Lightning-AI/pytorch-lightning/issues/18413",
     "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2\n"
     "All distributed processes registered. Starting with 2 processes\n"
     "FileNotFoundError: Checkpoint at saved/muti_benchmark_01/last-epoch.ckpt not found. "
     "Aborting training.", Category.CONFIG_ERROR, "config.checkpoint_path"),
    ("github.com/JonasSchult/Mask3D/issues/180",
     "FileNotFoundError: Checkpoint at saved/area5_from_scratch/last-epoch.ckpt not found. "
     "Aborting training.", Category.CONFIG_ERROR, "config.checkpoint_path"),
    ("github.com/GGGHSL/GraphDreamer/issues/6",
     '  File "/workspace/GraphDreamer/venv/GraphDreamer/lib/python3.10/site-packages/'
     'lightning_fabric/plugins/io/torch_io.py", line 81, in load_checkpoint\n'
     '    raise FileNotFoundError(f"Checkpoint file not found: {path}")\n'
     "FileNotFoundError: Checkpoint file not found: examples/gd-if/blue_jay/ckpts/last.ckpt",
     Category.CONFIG_ERROR, "config.checkpoint_path"),
    ("github.com/deepspeedai/DeepSpeed/issues/2898",
     "deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP "
     "world size of 4 but the current world size is 6. Automatic adjustment of ZeRO's optimizer "
     "state partitioning with a new world size is not currently supported.",
     Category.CONFIG_ERROR, "config.zero_world_size"),
    ("github.com/THUDM/GLM/issues/136",
     '  File "/home/zhaojinming/data/miniconda3/envs/glm10b/lib/python3.7/site-packages/deepspeed/'
     'runtime/engine.py", line 2950, in _load_zero_checkpoint\n'
     '    raise ZeRORuntimeException("The checkpoint being loaded used a DP " \\\n'
     "deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP "
     "world size of 256 but the current world size is 2. Automatic adjustment of ZeRO's optimizer "
     "state partitioning with a new world size is not currently supported.\n"
     "g2001:34292:39682 [7] NCCL INFO [Service thread] Connection closed by localRank 7",
     Category.CONFIG_ERROR, "config.zero_world_size"),
    ("github.com/pytorch/pytorch/issues/148252",
     '  File "scratch.py", line 103, in <module>\n'
     "    load_into_bigger_model()  # RuntimeError: Missing key in checkpoint state_dict: "
     "model.2.weight\n"
     '  File "torch/distributed/checkpoint/utils.py", line 192, in reduce_scatter\n'
     "    raise result\n"
     "torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
     "ranks:dict_keys([0])\nTraceback (most recent call last): (RANK 0)",
     Category.CODE_ERROR, "code.checkpoint_keys"),
    ("github.com/NVIDIA/cosmos/issues/69",
     '[rank0]:   File "/root/miniconda3/lib/python3.10/site-packages/lightning/pytorch/trainer/'
     'trainer.py", line 579, in _fit_impl\n'
     "[rank0]:     self._run(model, ckpt_path=ckpt_path)\n"
     "[rank0]: RuntimeError: Missing key in checkpoint state_dict: "
     "module.decoder.layers.self_attention.q_layernorm._extra_state/shard_0_16.",
     Category.CODE_ERROR, "code.checkpoint_keys"),
]


@pytest.mark.parametrize(("source", "log", "category", "rule_id"), CASES,
                         ids=[c[0].split("github.com/")[1] for c in CASES])
def test_a_checkpoint_that_is_not_the_one_asked_for_is_not_retried(
        source: str, log: str, category: Category, rule_id: str) -> None:
    d = triage.classify(triage.Signals(exit_code=1, log=log))
    assert d is not None
    assert (d.category, d.rule_id, d.weak) == (category, rule_id, False), (source, d.signature)
    assert d.retryable is False, source


# torch's reader of its older (pre-zip) format finding no magic number where a checkpoint starts.
CORRUPTED = [
    ("github.com/csuhan/ReDet/issues/60",
     '  File "/opt/Anaconda3/envs/redet/lib/python3.7/site-packages/mmcv/runner/checkpoint.py", line '
     "172, in load_checkpoint\n    checkpoint = torch.load(filename, map_location=map_location)\n"
     '  File "/opt/Anaconda3/envs/redet/lib/python3.7/site-packages/torch/serialization.py", line '
     '605, in _load\n    raise RuntimeError("Invalid magic number; corrupt file?")\n'
     "RuntimeError: Invalid magic number; corrupt file?"),
    ("github.com/yfeng95/DECA/issues/229",
     '  File "/local/data/miniconda3/envs/deca-env/lib/python3.7/site-packages/torch/serialization.py"'
     ', line 757, in _legacy_load\n    raise RuntimeError("Invalid magic number; corrupt file?")\n'
     "RuntimeError: Invalid magic number; corrupt file?"),
]


@pytest.mark.parametrize(("source", "log"), CORRUPTED, ids=[c[0].split("github.com/")[1] for c in CORRUPTED])
def test_a_checkpoint_without_torchs_magic_number_is_corrupted(source: str, log: str) -> None:
    d = triage.classify(triage.Signals(exit_code=1, log=log))
    assert d is not None
    assert (d.category, d.rule_id, d.retryable, d.weak) == (
        Category.CHECKPOINT_CORRUPTED, "checkpoint.unreadable", True, False), source


def test_a_missing_resume_file_is_the_configuration_not_missing_data() -> None:
    """Lightning's own words name the checkpoint; a dataset file that is absent stays data."""
    data = triage.classify(triage.Signals(exit_code=1, log=(
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train/shard-00017.jsonl'")))
    assert data is not None and data.category is Category.DATA_ERROR


def test_what_pytorch_prints_for_a_model_asking_dcp_for_a_key_it_never_saved(
        tmp_path: Path) -> None:
    """Real torch.distributed.checkpoint (no process group: one process, as DCP allows) saving a
    one-layer model and loading into a three-layer one."""
    import traceback

    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    dcp.save({"model": nn.Sequential(nn.Linear(2, 2)).state_dict()}, checkpoint_id=tmp_path)
    bigger = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"model": bigger.state_dict()}, checkpoint_id=tmp_path)
    printed = "".join(traceback.format_exception(raised.value))
    d = triage.classify(triage.Signals(exit_code=1, log=printed))
    assert d is not None
    assert (d.category, d.rule_id, d.retryable) == (Category.CODE_ERROR, "code.checkpoint_keys",
                                                    False), printed[-400:]


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_a_damaged_checkpoint_is_still_read_as_corrupted(tmp_path: Path, zip_format: bool) -> None:
    """The other side of the line, with real torch.load: a zip checkpoint cut to its first bytes
    (PyTorch names the missing central directory) and an older-format one whose magic number is
    damaged are retried from an older checkpoint, whatever the rules say about paths and keys."""
    import traceback

    import torch

    path = tmp_path / "step_200.pt"
    torch.save({"w": torch.zeros(4096)}, path, _use_new_zipfile_serialization=zip_format)
    data = bytearray(path.read_bytes())
    if zip_format:
        del data[100:]
    else:
        data[6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(Exception) as raised:
        torch.load(path, weights_only=False)
    printed = "".join(traceback.format_exception(raised.value))
    d = triage.classify(triage.Signals(exit_code=1, log=printed))
    assert d is not None
    assert (d.category, d.retryable) == (Category.CHECKPOINT_CORRUPTED, True), printed[-400:]
