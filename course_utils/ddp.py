"""Data parallelism with PyTorch DDP: the "x GPUs" of the effective-batch formula, checked on CPU.

Each process (a *rank*) holds a full copy of the model and takes its own slice of the batch. It runs
its slice as micro-batches; during all but the last one, ``no_sync()`` tells DDP not to communicate,
so gradients only add up locally. The last backward pass all-reduces (averages) the gradients across
ranks, once per update. The result is the gradient of the whole batch::

    batch = micro-batch size x accumulation steps x world size

:func:`run_ddp_check` launches ``world_size`` processes with ``torch.multiprocessing`` on this machine
(``gloo`` on CPU, or ``nccl`` with one GPU per process: the only line that changes), waits for them
with a time limit, and compares their gradient with one process's big-batch gradient.

Processes start with the ``forkserver`` method where the platform has it (Linux, macOS): one server
process imports PyTorch once and forks the ranks from it, which is several times faster than
``spawn`` (each rank importing PyTorch on its own). Elsewhere (Windows) they start with ``spawn``.

The worker lives in this module (not in a notebook) because spawned processes must import it.
"""

import contextlib
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_utils import checks, hardware
from course_utils.accumulation import TinyRegressor, accumulated_gradients, compare_gradients, regression_batch

#: Most processes a CPU check may start (each one is a full Python + torch).
_MAX_CPU_PROCESSES = 8
#: The loopback interface gloo should use, by platform (stay on 127.0.0.1).
_LOOPBACK = {"linux": "lo", "darwin": "lo0"}


def accumulate_on_rank(
    model: DistributedDataParallel, x: torch.Tensor, y: torch.Tensor, accumulation_steps: int, use_no_sync: bool = True
) -> None:
    """One update's backward passes on one rank: its slice of the batch, as micro-batches."""
    for i, (xb, yb) in enumerate(zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps))):
        # no_sync() must wrap the forward *and* the backward: DDP decides at forward time (the last one syncs).
        with model.no_sync() if use_no_sync and i < accumulation_steps - 1 else contextlib.nullcontext():
            loss = nn.functional.mse_loss(model(xb), yb) / accumulation_steps
            loss.backward()  # the last one all-reduces: gradients are averaged over the ranks


def ddp_worker(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    batch_size: int,
    accumulation_steps: int,
    backend: str,
    timeout_s: float,
) -> None:
    """Body of one process (``torch.multiprocessing.spawn`` passes ``rank`` first).

    Runs the update twice from the same weights: with ``no_sync()`` (the right way) and without it
    (all-reduce after every micro-batch), counting the all-reduces each time. Saves both gradients.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.set_num_threads(1)  # the ranks share this machine's cores
    if backend == "gloo" and sys.platform in _LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK[sys.platform])  # stay on 127.0.0.1
    address = f"tcp://127.0.0.1:{port}"
    dist.init_process_group(
        backend, init_method=address, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        device = rank_device(rank, backend)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model = TinyRegressor().net.to(device)  # 10 -> 32 -> 1 from one seed: the same weights on every rank
        ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)

        calls = [0]

        def counting_allreduce(state, bucket):  # DDP's default all-reduce, counted
            calls[0] += 1
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(dist.group.WORLD, counting_allreduce)
        x, y = regression_batch(batch_size, in_features=10)  # every rank draws the same batch, keeps its slice
        xs, ys = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
        result = {}
        for use_no_sync in (True, False):
            calls[0] = 0
            ddp.zero_grad(set_to_none=True)
            accumulate_on_rank(ddp, xs, ys, accumulation_steps, use_no_sync)
            grads = [p.grad.detach().cpu() for p in model.parameters()]
            result[use_no_sync] = {"grads": grads, "allreduce_calls": calls[0]}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class _DDPCheck:
    """The outcome of :func:`run_ddp_check`."""

    backend: str
    world_size: int
    micro_batch_size: int
    accumulation_steps: int
    batch_size: int
    same_gradient: bool  # DDP + no_sync gradient == one process's big-batch gradient (allclose)
    ranks_agree: bool  # every rank ends the update holding the same gradient
    max_difference: float  # largest difference from the big-batch gradient (rounding)
    allreduce_calls: int  # gradient all-reduces per update with no_sync (rank 0)
    same_gradient_without_no_sync: bool  # syncing after every micro-batch gives the same gradient...
    allreduce_calls_without_no_sync: int  # ...with this many all-reduces instead
    seconds: float  # wall time, including starting the processes

    def report(self) -> str:
        """The deterministic part, one fact a line (times and rounding digits left out)."""
        return (
            f"backend {self.backend}: {self.world_size} processes x {self.accumulation_steps} micro-batches "
            f"of {self.micro_batch_size} = effective batch of {self.batch_size}\n"
            f"all ranks hold the same gradient: {self.ranks_agree}\n"
            f"same gradient as one process with a batch of {self.batch_size}: {self.same_gradient}\n"
            f"gradient all-reduces per update with no_sync(): {self.allreduce_calls}\n"
            f"without no_sync(): {self.allreduce_calls_without_no_sync} all-reduces, "
            f"same gradient: {self.same_gradient_without_no_sync}"
        )


def rank_device(rank: int, backend: str) -> torch.device:
    """The device of process ``rank``: GPU ``rank`` with ``"nccl"`` (one GPU per process), the CPU with ``"gloo"``."""
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def pick_backend(world_size: int = 2) -> str:
    """The backend :func:`run_ddp_check` should use here: ``"nccl"`` with a CUDA GPU per process, else ``"gloo"``.

    The device question goes through :func:`course_utils.hardware.pick_device`, like every lesson's.
    """
    checks.integer(world_size, "world_size", 1, 64)
    return "nccl" if hardware.pick_device().type == "cuda" and torch.cuda.device_count() >= world_size else "gloo"


def check_ddp_args(world_size: int, batch_size: int, accumulation_steps: int, backend: str, timeout_s: float) -> int:
    """Validate the arguments of :func:`run_ddp_check`; return the micro-batch size."""
    checks.choice(backend, "backend", ("gloo", "nccl"))  # gloo runs on CPUs, nccl on NVIDIA GPUs (one per process)
    checks.integer(batch_size, "batch_size", 1, 1_000_000)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and not gpus:
        raise ValueError("backend 'nccl' needs one CUDA GPU per process and this machine has none; use 'gloo' on CPU")
    checks.integer(world_size, "world_size", 1, _MAX_CPU_PROCESSES if backend == "gloo" else gpus)
    checks.integer(accumulation_steps, "accumulation_steps", 1, batch_size)
    if batch_size % (world_size * accumulation_steps):
        split = f"world_size ({world_size}) x accumulation_steps ({accumulation_steps}) micro-batches"
        raise ValueError(f"batch_size ({batch_size}) must split evenly into {split}")
    checks.positive(timeout_s, "timeout_s", 600)
    return batch_size // (world_size * accumulation_steps)


#: Modules the fork server imports once, so the ranks it forks start without importing them again.
_FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", __name__]


def start_method() -> str:
    """``"forkserver"`` where the platform offers it (fast, and safe with CUDA), else ``"spawn"``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def launch(fn, args: tuple, nprocs: int, timeout_s: float) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` new processes and wait, at most ``timeout_s`` seconds.

    ``fn`` must be importable (defined in a module, not in a notebook). Raises TimeoutError after
    stopping the processes that overran, and RuntimeError with the worker's message if one failed.
    :func:`run_ddp_check` has checked ``nprocs`` and ``timeout_s`` (:func:`check_ddp_args`).
    """
    import torch.multiprocessing as mp

    method = start_method()
    if method == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(_FORKSERVER_PRELOAD)
    deadline = time.perf_counter() + timeout_s
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method=method)
    try:
        while not context.join(timeout=0.1):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the processes did not finish within timeout_s={timeout_s} s; they were stopped")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        raise RuntimeError(f"a worker process failed:\n{err}") from None
    finally:
        for proc in context.processes:  # only the processes this call started
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def run_ddp_check(
    world_size: int = 2,
    batch_size: int = 64,
    accumulation_steps: int = 4,
    backend: str = "gloo",
    timeout_s: float = 60.0,
) -> _DDPCheck:
    """Launch ``world_size`` DDP processes, accumulate, and compare with one process's big-batch gradient.

    Each process runs the update with ``no_sync()`` and, for contrast, without it; the all-reduces
    are counted both ways. Every process is stopped within ``timeout_s`` seconds (TimeoutError), so a
    stuck launch can never hang a class. With ``backend="nccl"`` each process uses one GPU; nothing
    else changes.
    """
    micro = check_ddp_args(world_size, batch_size, accumulation_steps, backend, timeout_s)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddp-check-") as out_dir:
        args = (world_size, free_port(), out_dir, batch_size, accumulation_steps, backend, float(timeout_s))
        launch(ddp_worker, args, world_size, timeout_s)
        results = [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
    seconds = time.perf_counter() - start
    reference = accumulated_gradients(TinyRegressor().net, *regression_batch(batch_size, in_features=10))  # one process
    synced, chatty = results[0][True], results[0][False]
    check = compare_gradients(reference, synced["grads"])
    return _DDPCheck(
        backend=backend,
        world_size=world_size,
        micro_batch_size=micro,
        accumulation_steps=accumulation_steps,
        batch_size=batch_size,
        same_gradient=check.same,
        ranks_agree=all(compare_gradients(synced["grads"], r[True]["grads"], rtol=0, atol=0).same for r in results[1:]),
        max_difference=check.max_difference,
        allreduce_calls=int(synced["allreduce_calls"]),
        same_gradient_without_no_sync=compare_gradients(reference, chatty["grads"]).same,
        allreduce_calls_without_no_sync=int(chatty["allreduce_calls"]),
        seconds=seconds,
    )
