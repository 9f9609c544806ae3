"""Which process am I, and the few collective steps shared by training and evaluation.

A run launched with ``accelerate launch`` has N processes. accelerate's ``PartialState`` is a singleton: the first
call decides the process group for the whole program, so every part of the harness gets it from
:func:`process_state`, which sets it up the same way whoever asks first (the CPU when there is no GPU).

**CPU rehearsal of a GPU launch.** accelerate runs FSDP and DeepSpeed on accelerators only; without one, a launch
of those configs would silently become plain data parallel. So on a machine without a GPU a multi-process FSDP or
DeepSpeed launch is rehearsed on the CPU: accelerate is told the processes are GPUs while their device stays the
CPU and the backend gloo. Everything after that is the GPU code path, which is how CI tests the shipped configs
with 2 processes.

**Teardown.** The process group set up here is destroyed when the program exits (:func:`_destroy_at_exit`), the
documented practice. It does not rule out one known abort on the CPU (gloo): rarely (2 of 294 launches of a
4-process FSDP test), a process that has finished its work and written its files aborts as the interpreter shuts
down ("terminate called without an active exception"), because a gloo worker thread still drops its last
reference to a finished collective whose tensors own Python objects and needs the GIL for it. Everything the
run wrote is complete; the launch reports a failure, and `reproduce` run again reuses everything.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
from collections.abc import Sequence
from typing import TypeVar

import torch

from stabledrl_bench.errors import UserError

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


def launch_command(
    config: str,
    processes: int = 2,
    *,
    mixed_precision: str = "no",
    machines: int = 1,
    machine_rank: int = 0,
    port: int = 0,
) -> list[str]:
    """``accelerate launch`` of ``processes`` CPU processes under the shipped ``configs/accelerate/<config>.yaml``
    (full precision and a free port unless told otherwise): how the tests and ``regress --invariance`` rehearse a
    GPU launch. Append the program and its arguments.

    ``machines`` > 1 rehearses a multi-node launch on this host: ``processes`` counts every node's processes (as
    accelerate's ``--num_processes`` does), each node runs this command with its own ``machine_rank``, and they meet
    at ``127.0.0.1:port`` (a port every node knows, so not 0).
    """
    import sys
    from importlib import resources

    path = resources.files("stabledrl_bench.configs") / "accelerate" / f"{config}.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path)]
    command += ["--num_processes", str(processes), "--mixed_precision", mixed_precision]
    if machines > 1:
        command += ["--num_machines", str(machines), "--machine_rank", str(machine_rank)]
        command += ["--main_process_ip", "127.0.0.1"]
    return [*command, "--main_process_port", str(port)]


def _without_deepspeed_cpu_kernels() -> None:
    """DeepSpeed on a machine without a GPU compiles its shared-memory CPU collective (C++ with ninja: about a minute
    on 2 cores, in every fresh environment, and only where a compiler is installed) as its process group starts. Only
    its CPU inference all-reduce uses that kernel, never ZeRO training and never the GPU path this rehearses, so it is
    marked unbuildable (DeepSpeed keeps the dict of buildable ops it probed in one place and reads it there) and the
    rehearsal's collectives are gloo's, as under the other configs."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def process_state():
    """accelerate's ``PartialState`` of this process, set up the same way whoever asks first.

    The first call sets up the process group for the whole program (module docstring).
    """
    from accelerate import PartialState

    if not cpu_rehearsal():
        state = PartialState(cpu=not torch.cuda.is_available())
    else:
        if _env_flag("ACCELERATE_USE_DEEPSPEED"):
            _without_deepspeed_cpu_kernels()
        with _as_gpu_processes():
            state = PartialState()
    if state.num_processes > 1:
        _destroy_at_exit()
    return state


@functools.cache
def _destroy_at_exit() -> None:
    """Destroy the process group before the interpreter shuts down (module docstring); registered once."""

    def destroy() -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    atexit.register(destroy)


def is_main_process() -> bool:
    """Whether this process writes the files of a run (records, logs, plots): rank 0, or the only process."""
    return process_state().is_main_process


def launched() -> bool:
    """Whether this program is one of several processes of a launch (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


# Below this many parameters a job gets one intra-op thread. A tiny-model stage alone gains about 1.6 times from a
# second thread, but two one-thread stages side by side do more work (1.2 times), and a two-thread stage loses two
# thirds of its speed when another program keeps a core busy (OpenMP's threads wait for each other at every
# operation) while a one-thread stage keeps it (benchmarks/bench_threads.py). Above it a comparison's stages are few
# and long, and get the cores as threads; the threshold is a judgment, not a measured optimum (docs/platforms.md).
SMALL_MODEL_PARAMETERS = 20_000_000


def threads_for(parameters: int | None) -> int:
    """The intra-op thread count for a job on a model of ``parameters`` (None: unknown): one for a small model,
    torch's default (the cores) otherwise. A CPU run's bits depend on it, so a job's count follows from its size
    alone, never from how many jobs run beside it (``OMP_NUM_THREADS``, when set, is the default's count)."""
    if parameters is not None and parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or available_cores()


@contextlib.contextmanager
def intra_op_threads(threads: int):
    """torch's intra-op thread count set to ``threads`` inside the block, and put back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` may narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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


def machines() -> int:
    """How many nodes (machines) this launch spans: ``WORLD_SIZE / LOCAL_WORLD_SIZE`` under torchrun (1 otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world // int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def require_shared_folder(folder: str | os.PathLike[str], what: str) -> None:
    """Stop, with one line on every process, when the nodes of a multi-node launch do not see ``folder`` as one
    folder (collective; nothing to check on one node).

    Records, logs and checkpoints are written once, by the global main process, and FSDP's checkpoints are one
    shard per process with a single index that every process reads when it resumes; evaluation reads the trained
    model's ``final/`` on every process. So a run needs its output folder on storage every node shares (a relative
    path resolves in each node's working folder). A node that does not see it would otherwise resume from nothing,
    or wait forever for files it cannot read. The main process writes a token there; every process reads it.
    """
    import secrets
    from pathlib import Path

    if machines() < 2:
        return
    from accelerate.utils import broadcast_object_list

    state = process_state()
    path = Path(folder).resolve()
    token = [secrets.token_hex(8) if state.is_main_process else None]
    broadcast_object_list(token)
    probe = path / f".shared-{token[0]}"
    if state.is_main_process:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text(token[0])
    state.wait_for_everyone()
    seen = probe.is_file() and probe.read_text() == token[0]
    ranks = [rank for rank, ok in enumerate(gather_lists([seen])) if not ok]
    state.wait_for_everyone()
    if state.is_main_process:
        probe.unlink()
    if ranks:
        import socket

        raise UserError(
            f"{what} {folder}: processes {ranks} of this {machines()}-node launch do not see the main process's "
            f"folder ({socket.gethostname()}:{path}); put it on storage every node shares, under the same path"
        )


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
