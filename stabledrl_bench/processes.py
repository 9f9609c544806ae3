"""Which process am I, and the few collective steps shared by training and evaluation.

A run launched with ``accelerate launch`` has N processes. accelerate's ``PartialState`` is a singleton: the first
call decides the process group for the whole program, so every part of the harness gets it from
:func:`process_state`, which sets it up the same way whoever asks first (the CPU when there is no GPU).

**CPU rehearsal of a GPU launch.** accelerate runs FSDP and DeepSpeed on accelerators only; without one, a launch
of those configs would silently become plain data parallel. So on a machine without a GPU a multi-process FSDP or
DeepSpeed launch is rehearsed on the CPU: accelerate is told the processes are GPUs while their device stays the
CPU and the backend gloo. Everything after that is the GPU code path, which is how CI tests the shipped configs
with 2 processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


def cpu_rehearsal() -> bool:
    """A multi-process FSDP or DeepSpeed launch on a machine without a GPU: rehearsed on the CPU (module docstring)."""
    sharded = _env_flag("ACCELERATE_USE_FSDP") or _env_flag("ACCELERATE_USE_DEEPSPEED")
    return launched() and sharded and not torch.cuda.is_available()


@contextlib.contextmanager
def _as_gpu_processes():
    """accelerate's process state, told that CPU processes are GPU processes (device: the CPU, backend: gloo)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        del self, cpu, sagemaker_dp, backend
        return "gloo", DistributedType.MULTI_GPU

    def set_device(self):
        self.device = torch.device("cpu")

    saved = PartialState._prepare_backend, PartialState.set_device
    PartialState._prepare_backend, PartialState.set_device = prepare_backend, set_device
    try:
        yield
    finally:
        PartialState._prepare_backend, PartialState.set_device = saved


def launch_command(config: str, processes: int = 2) -> list[str]:
    """``accelerate launch`` of ``processes`` CPU processes under the shipped ``configs/accelerate/<config>.yaml``
    (full precision, a free port): how the tests and ``regress --invariance`` rehearse a GPU launch. Append the
    program and its arguments."""
    import sys
    from importlib import resources

    path = resources.files("stabledrl_bench.configs") / "accelerate" / f"{config}.yaml"
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(path),
        "--num_processes",
        str(processes),
        "--mixed_precision",
        "no",
        "--main_process_port",
        "0",
    ]


def process_state():
    """accelerate's ``PartialState`` of this process, set up the same way whoever asks first.

    The first call sets up the process group for the whole program (module docstring).
    """
    from accelerate import PartialState

    if not cpu_rehearsal():
        return PartialState(cpu=not torch.cuda.is_available())
    with _as_gpu_processes():
        return PartialState()


def is_main_process() -> bool:
    """Whether this process writes the files of a run (records, logs, plots): rank 0, or the only process."""
    return process_state().is_main_process


def launched() -> bool:
    """Whether this program is one of several processes of a launch (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def my_share(count: int) -> range:
    """The indices of ``count`` items (in order) this process takes: every N-th, starting at its rank."""
    state = process_state()
    return range(state.process_index, count, state.num_processes)


def gather_lists(items: Sequence[T]) -> list[T]:
    """Every process's ``items``, concatenated in rank order (this process's own list when it is alone)."""
    if process_state().num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return list(gather_object(list(items)))


def barrier() -> None:
    """Wait until every process gets here (e.g. until the main process has written a file the others read)."""
    state = process_state()
    if state.num_processes > 1:
        state.wait_for_everyone()


def keyed_generator(*key: object, device: torch.device | str | None = None) -> torch.Generator:
    """A private random stream named by what it is for (e.g. seed, purpose, rollout phase, micro-batch).

    Keyed instead of drawn from a per-process stream: a unit of work gets the same random numbers whichever
    process runs it and however many processes share the job, so a run does not depend on the launch.
    ``device``: where the stream draws (the CPU by default). The samplers draw their noise where the model's logits
    are, so their generator lives on the model's device (the same key gives another stream on a GPU than on the
    CPU); the estimators draw small masks on the CPU and move them, so their masks are the same on every device.
    """
    digest = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=8).digest()
    return torch.Generator(device=device or "cpu").manual_seed(int.from_bytes(digest, "little") >> 1)
