"""The device decisions of the lessons' modules (precision, accumulation, ddp, quant, digits) on simulated devices.

Each test runs under a profile from gpu_sim.py (T4, L4, A100, H100, CPU, Apple MPS): torch.cuda's query
functions answer like that device and nothing is computed on it. A test follows a function down to its first
CUDA allocation, where this CPU build of torch raises, and asserts the decisions taken before it: device,
16-bit dtype, loss scaling, matrix sizes, what the memory reading measures, which DDP backend.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from course_utils import accumulation as acc
from course_utils import ddp, hardware, precision
from course_utils.digits import make_mlp
from course_utils.lessons import mixed_precision as precision_widgets
from gpu_sim import Profile

#: What the lessons must decide on each device: (device type, autocast dtype, GradScaler enabled).
#: T4 (compute capability 7.5): float16 + GradScaler; bfloat16 from 8.0; CPU (and a Mac, which runs the
#: lessons on its CPU): bfloat16 autocast, no scaler.
EXPECTED = {
    "T4": ("cuda", torch.float16, True),
    "L4": ("cuda", torch.bfloat16, False),
    "A100": ("cuda", torch.bfloat16, False),
    "H100": ("cuda", torch.bfloat16, False),
    "CPU": ("cpu", torch.bfloat16, False),
    "MPS": ("cpu", torch.bfloat16, False),
}

#: What this CPU build of torch raises (an AssertionError) at the first CUDA allocation.
NOT_COMPILED = "Torch not compiled with CUDA enabled"


# ------------------------------------------------------------------------------------ precision
def test_the_training_loops_decisions(any_device: Profile) -> None:
    """train_mixed_precision's device, default dtype and loss scaling (hardware's rules) on each device."""
    kind, dtype, scaling = EXPECTED[any_device.key]
    device = hardware.pick_device()
    assert device.type == kind
    assert hardware.autocast_dtype(device) == dtype
    assert hardware.needs_loss_scaling(dtype) is scaling
    assert hardware.needs_loss_scaling(torch.float32) is False  # float32 switches both tricks off
    scaler = torch.amp.GradScaler(device.type, enabled=hardware.needs_loss_scaling(dtype))  # as the loop does
    assert scaler.is_enabled() is scaling


def test_training_loop_stops_at_the_first_allocation(cuda_device: Profile) -> None:
    with pytest.raises(AssertionError, match=NOT_COMPILED):
        precision.train_mixed_precision(steps=2)  # model.to("cuda") is its first allocation


def test_training_arguments_follow_the_capability(any_device: Profile) -> None:
    expected = {
        "T4": {"fp16": True},
        "L4": {"bf16": True},
        "A100": {"bf16": True},
        "H100": {"bf16": True},
        "CPU": {"bf16": True, "use_cpu": True},
        "MPS": {"bf16": True, "use_cpu": True},
    }
    assert precision.training_arguments_kwargs() == expected[any_device.key]
    # the library settings the notebook prints for the lesson's dtype
    settings = precision.library_settings(hardware.autocast_dtype())
    flag = "fp16" if any_device.key == "T4" else "bf16"
    assert settings["Hugging Face Accelerate"] == f'Accelerator(mixed_precision="{flag}")'


def test_matmul_timing_decisions(any_device: Profile) -> None:
    device = hardware.pick_device()
    dtype = hardware.autocast_dtype(device)
    cuda = any_device.is_cuda
    size = 4096 if cuda else 2048  # a large multiply on each
    assert not precision._timing_case(size, dtype, device)[3]  # no refusal: the lesson's dtype is always timed
    refusal = precision._timing_case(size, "float16", device)[3]
    assert (not refusal) is cuda  # float16 is timed on a GPU, never at a large side on a CPU
    assert precision_widgets.matmul_sizes(device)[-1] == (8192 if cuda else precision.MAX_CPU_WIDGET_SIZE)
    assert precision_widgets.dtype_name_16(device) == precision.dtype_name(dtype)
    if cuda:
        with pytest.raises(AssertionError, match=NOT_COMPILED):
            precision.time_matmul(256, dtype, device)
        with pytest.raises(AssertionError, match=NOT_COMPILED):
            precision.matmul_report(256, dtype, device)


def test_fraction_of_peak_on_each_gpu(cuda_device: Profile) -> None:
    sheet = hardware.current_datasheet()
    assert sheet is not None and sheet == hardware.datasheet_for(cuda_device.name)
    fp16 = precision.MatmulTiming(4096, "float16", "cuda", 10.0, 13.7)
    bf16 = precision.MatmulTiming(4096, "bfloat16", "cuda", 10.0, 13.7)
    fp32 = precision.MatmulTiming(4096, "float32", "cuda", 100.0, 1.37)
    assert precision.fraction_of_peak(fp16, sheet) == pytest.approx(fp16.tflops / sheet.tensor16_tflops)
    assert precision.fraction_of_peak(fp32, sheet) == pytest.approx(fp32.tflops / sheet.fp32_tflops)
    # a T4 has no bfloat16 tensor cores: no datasheet figure to compare with
    bf16_peak = precision.fraction_of_peak(bf16, sheet)
    assert (bf16_peak is None) is (cuda_device.key == "T4")


# ------------------------------------------------------------------------------------ accumulation
def test_activation_memory_method(any_device: Profile) -> None:
    device = hardware.pick_device()
    kind = acc.memory_method(device)
    assert kind == ("cuda" if any_device.is_cuda else "cpu")
    what = acc.MEMORY_METHODS[kind]
    if any_device.is_cuda:
        # activations only: read after the forward pass, before backward's weight-gradient temporaries
        assert "before backward" in what and "forward pass" in what
    else:
        assert "saved_tensors_hooks" in what


def test_sweep_stops_at_the_first_allocation(cuda_device: Profile) -> None:
    with pytest.raises(AssertionError, match=NOT_COMPILED):
        acc.sweep_micro_batches(sizes=(16, 64))  # the default device is the GPU: model.to("cuda") raises


def cuda_readings(monkeypatch: pytest.MonkeyPatch, forward_workspace: int = 0) -> list[SimpleNamespace]:
    """activation_memory's CUDA reading at micro-batches 1, 8 and 64 of a small MLP, on a simulated allocator.

    The simulated ``memory_allocated`` counter grows as CUDA's would: by the bytes of every new tensor the forward
    pass saves for backward (views of the weights allocate nothing), by ``forward_workspace`` bytes at every forward
    pass, and during backward by one temporary the size of each weight (the weight gradients' temporaries, the same
    whatever the micro-batch).
    """
    model = make_mlp(**{**acc.SWEEP_MLP, "hidden": 32, "depth": 2})
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    counter = {"total": 0, "seen": set()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights and ptr not in counter["seen"]:
            counter["seen"].add(ptr)
            counter["total"] += t.untyped_storage().nbytes()
        return t

    def grow(nbytes: int) -> None:
        counter["total"] += nbytes

    def memory_allocated(device: object = None) -> int:
        counter["seen"] = set()
        return counter["total"]

    for p in model.parameters():
        p.register_hook(lambda grad, n=p.nbytes: grow(n))
    model.register_forward_pre_hook(lambda module, args: grow(forward_workspace))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", memory_allocated)
    monkeypatch.setattr(acc, "memory_method", lambda device=None: "cuda")
    x, y = acc.regression_batch(64)
    rows = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for size in (1, 8, 64):
            nbytes, what = acc.activation_memory(model, x, y, size)
            assert what == acc.MEMORY_METHODS["cuda"]
            rows.append(SimpleNamespace(micro_batch_size=size, activation_bytes=nbytes))
    return rows


def test_cuda_reading_leaves_out_the_backward_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read between forward and backward, the CUDA reading is the saved activations: proportional to the micro-batch.
    Read after backward, each reading would also hold the weight-sized temporaries, and fail the proportion check."""
    rows = cuda_readings(monkeypatch)
    assert acc.proportion_check(rows).holds
    temporaries = sum(p.nbytes for p in make_mlp(**{**acc.SWEEP_MLP, "hidden": 32, "depth": 2}).parameters())
    after_backward = [
        SimpleNamespace(micro_batch_size=r.micro_batch_size, activation_bytes=r.activation_bytes + temporaries)
        for r in rows
    ]
    assert not acc.proportion_check(after_backward).holds


def test_a_fixed_part_in_the_reading_fails_the_proportion_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A counter that is not proportional to the micro-batch (a fixed workspace at every forward pass) fails it."""
    assert not acc.proportion_check(cuda_readings(monkeypatch, forward_workspace=64 * 1024)).holds


# ------------------------------------------------------------------------------------ ddp
def test_ddp_backend_and_rank_devices(any_device: Profile) -> None:
    # every simulated machine has one GPU: a 2-process check uses gloo, a 1-process one nccl on a GPU
    assert ddp.pick_backend(world_size=2) == "gloo"
    assert ddp.pick_backend(world_size=1) == ("nccl" if any_device.is_cuda else "gloo")
    assert ddp.rank_device(0, "nccl") == torch.device("cuda", 0)
    assert ddp.rank_device(1, "gloo") == torch.device("cpu")


def test_ddp_nccl_needs_a_gpu_per_process(any_device: Profile) -> None:
    with pytest.raises(ValueError, match="world_size|one CUDA GPU per process"):
        ddp.check_ddp_args(2, 64, 4, "nccl", 60)  # 2 processes, 1 GPU
    if any_device.is_cuda:
        assert ddp.check_ddp_args(1, 64, 4, "nccl", 60) == 16
    else:
        with pytest.raises(ValueError, match="nccl"):
            ddp.check_ddp_args(1, 64, 4, "nccl", 60)


# ------------------------------------------------------------------------------------ quant, digits
def test_quantization_follows_the_tensor_not_the_machine(any_device: Profile) -> None:
    """quant and digits never pick a device: they work where the tensor is (the CPU in the lessons)."""
    from course_utils import quant
    from course_utils.digits import model_in_format, make_mlp

    x = torch.linspace(-1, 1, 128)
    assert quant.dequantize(quant.quantize_nf4(x, 64)).device == x.device
    assert quant.dequantize(quant.quantize(x, 4, block_size=64)).device == x.device
    clone, _ = model_in_format(make_mlp(), "bfloat16")
    assert {p.device.type for p in clone.parameters()} == {"cpu"}
    assert {p.dtype for p in clone.parameters()} == {torch.float32}  # rounded through bfloat16, stored in float32
