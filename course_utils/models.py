"""Real and stand-in language models: load in 16, 8 or 4 bits, measure footprints, count LoRA parameters.

The seed's real model is ``Qwen/Qwen2.5-1.5B-Instruct``, loaded from the Hugging Face Hub onto a GPU. Where
that cannot happen (no CUDA GPU, or no Hub), the course uses a *stand-in*: the real SmolLM2-135M
architecture, rebuilt from the config file shipped in ``data/configs`` (exactly 134,515,008 parameters),
with seeded random weights saved once to a cache folder outside the repository. The stand-in then goes
through the very same ``from_pretrained`` call, the same ``BitsAndBytesConfig`` and the same peft calls as
the real model, so every footprint and parameter count is real; only its generated text is noise.

The online/offline decision is made up front and fast (:func:`decide_source`): the Hub client would
otherwise retry for about 46 s before failing, which is a long silence in front of a class.

Sizes of models too big to load here are *computed* on PyTorch's meta device (shapes, no data):
:func:`meta_model` builds one from a shipped config, :func:`footprint_parts` prices its parts at 16, 8
or 4 bits with the same rules bitsandbytes and transformers apply, and :func:`lora_count` runs peft on it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import urlparse

import torch

from course_utils import data_path
from course_utils.hardware import as_device, autocast_dtype, import_bitsandbytes

#: The seed's real model (loaded only with a CUDA GPU and a reachable Hub).
REAL_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
#: Architecture configs shipped in ``data/configs`` (file names).
STANDIN_CONFIG = "smollm2-135m.json"
QWEN25_CONFIG = "qwen2.5-1.5b-instruct.json"
QWEN3_CONFIG = "qwen3-4b-instruct-2507.json"
#: Exact parameter count of the SmolLM2-135M architecture (tied embeddings), the seeds' number.
STANDIN_PARAMS = 134_515_008
#: The seven projection matrices of the seed's Unsloth QLoRA cell.
SEED_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The quantization widths this module knows: 16 (no quantization), 8 (LLM.int8) and 4 (NF4).
BITS = (16, 8, 4)
#: NF4 block size used by bitsandbytes: one float32 scale ("absmax") per 64 weights.
NF4_BLOCKSIZE = 64
#: The dtype the stand-in's random weights are *stored* in on disk (loading casts per device).
STANDIN_STORAGE_DTYPE = torch.bfloat16
#: Where the stand-in's weights are cached when ``COURSE_UTILS_CACHE`` is not set (never inside the repo).
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "course_utils"

_TRUE = {"1", "ON", "YES", "TRUE"}

# peft and transformers import bitsandbytes on their own; its harmless import warning about an optional
# kernel package would land on stderr (see course_utils.hardware.import_bitsandbytes). Silence it up front.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


# --------------------------------------------------------------------------------------------
# Compatibility: the course supports transformers 4.57 (hosted images lag PyPI) up to the pinned 5.x
# --------------------------------------------------------------------------------------------
#: transformers renamed ``torch_dtype=`` to ``dtype=`` in 4.56; older versions only know ``torch_dtype``.
DTYPE_KWARG_SINCE = (4, 56)


def transformers_version() -> tuple[int, int]:
    """(major, minor) of the installed transformers, read from its metadata (nothing heavy is imported)."""
    from importlib.metadata import version  # noqa: PLC0415

    major, minor = (version("transformers").split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def dtype_kwargs(dtype: torch.dtype, version: tuple[int, int] | None = None) -> dict[str, torch.dtype]:
    """The keyword that sets a model's dtype in ``from_pretrained``/``from_config``, for this transformers.

    ``{"dtype": dtype}`` from transformers 4.56 on, ``{"torch_dtype": dtype}`` before (the one place that
    knows about the rename). ``version`` overrides the installed version, for tests.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16, got {type(dtype).__name__}")
    key = "dtype" if (version or transformers_version()) >= DTYPE_KWARG_SINCE else "torch_dtype"
    return {key: dtype}


# --------------------------------------------------------------------------------------------
# Quiet: no progress bars or library warnings on stderr (nbval compares stderr)
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info logs, and known harmless warnings, inside the block.

    transformers 5 draws a "Loading weights" progress bar on stderr in every ``from_pretrained``; peft
    0.21 emits a FutureWarning about a renamed transformers method, and bitsandbytes 0.48 one about a torch
    function on its first 4-bit forward. All are restored afterwards: nothing global is left behind.
    """
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------------------------
# Online or offline? Decide up front, in about a second at most
# --------------------------------------------------------------------------------------------
def hub_offline_env(environ: dict[str, str] | None = None) -> bool:
    """True when ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) asks for offline mode."""
    env = os.environ if environ is None else environ
    return any(env.get(k, "").strip().upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_address(environ: dict[str, str] | None = None) -> tuple[str, int]:
    """(host, port) of the Hub this process would use: ``HF_ENDPOINT`` if set, else huggingface.co:443."""
    env = os.environ if environ is None else environ
    url = urlparse(env.get("HF_ENDPOINT", "").strip() or "https://huggingface.co")
    if not url.hostname:
        raise ValueError(f"HF_ENDPOINT must be a URL such as https://huggingface.co, got {env.get('HF_ENDPOINT')!r}")
    return url.hostname, url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(host: str | None = None, port: int | None = None, timeout_s: float = 1.5) -> bool:
    """Can a TCP connection to the Hub be opened within ``timeout_s`` seconds (DNS lookup included)?

    One connection attempt, no retries. The lookup runs in a worker thread so that even a hanging DNS
    resolver cannot hold the caller longer than the timeout.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not 0 < timeout_s <= 10:
        raise ValueError(f"timeout_s must be in (0, 10] seconds, got {timeout_s}")
    default_host, default_port = hub_address()
    address = (host or default_host, port or default_port)

    answer: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection(address, timeout=timeout_s):
                answer.append(True)
        except Exception:  # noqa: BLE001 - refused, unreachable, unknown host, timeout: all mean "no"
            answer.append(False)

    worker = threading.Thread(target=attempt, name="hub-reachable", daemon=True)  # daemon: never delays exit
    worker.start()
    worker.join(timeout_s + 0.25)
    return bool(answer and answer[0])


def cached_on_disk(model_name: str) -> bool:
    """True when ``model_name``'s config is already in the local Hugging Face cache (usable offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    found = try_to_load_from_cache(model_name, "config.json")
    return isinstance(found, str)


@dataclass(frozen=True)
class Decision:
    """Which model to use, and why: ``source`` is ``"real"`` or ``"standin"``."""

    source: str
    reason: str


def decide_source(model_name: str = REAL_MODEL, *, timeout_s: float = 1.5) -> Decision:
    """Real model or stand-in? Decided in at most ``timeout_s`` seconds, without the Hub client's retries.

    1. No CUDA GPU -> stand-in: the real model is the GPU path (on a CPU it would take minutes to load and run).
    2. ``HF_HUB_OFFLINE`` set -> the real model only if it is already in the local cache, else the stand-in.
    3. Otherwise one quick TCP connection to the Hub decides.
    """
    if not isinstance(model_name, str) or "/" not in model_name:
        raise ValueError(f"model_name must be a Hub id such as {REAL_MODEL!r}, got {model_name!r}")
    if not torch.cuda.is_available():
        return Decision("standin", "no CUDA GPU here: the real model is the GPU path")
    if hub_offline_env():
        if cached_on_disk(model_name):
            return Decision("real", "HF_HUB_OFFLINE is set, and the model is already in the local cache")
        return Decision("standin", "HF_HUB_OFFLINE is set and the model is not in the local cache")
    if not hub_reachable(timeout_s=timeout_s):
        host, port = hub_address()
        return Decision("standin", f"the Hub ({host}:{port}) did not answer within {timeout_s:g} s")
    return Decision("real", "a CUDA GPU is here and the Hub is reachable")


# --------------------------------------------------------------------------------------------
# Configs, the meta device and the stand-in
# --------------------------------------------------------------------------------------------
def load_config(name: str | Path = STANDIN_CONFIG) -> Any:
    """A transformers config from a JSON file in ``data/configs`` (or a path). Keys starting with "_" are notes."""
    from transformers import AutoConfig  # noqa: PLC0415

    from course_utils.configs import read_config  # noqa: PLC0415

    fields = read_config(name)  # a preset name, "name.json" in data/configs, or a path; "_source" notes dropped
    if "model_type" not in fields:
        raise ValueError(f"config {str(name)!r} has no 'model_type': not a transformers architecture config")
    return AutoConfig.for_model(**fields)


def meta_model(config: Any) -> Any:
    """The architecture of ``config`` (a config, or a file name for :func:`load_config`) on the meta device.

    Shapes without data: a 4-billion-parameter model costs no memory. Built under ``torch.device("meta")``,
    which keeps tied weights tied (accelerate's ``init_empty_weights`` unties the lm_head and over-counts).
    """
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    if isinstance(config, (str, Path)):
        config = load_config(config)
    with quiet_transformers(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters, each shared (tied) tensor counted once; 4-bit packed weights at their true size."""
    return sum(_true_numel(p) for p in model.parameters())


def cache_dir() -> Path:
    """Folder for the stand-in's weights: ``$COURSE_UTILS_CACHE``, else ``~/.cache/course_utils``."""
    return Path(os.environ.get("COURSE_UTILS_CACHE", "") or DEFAULT_CACHE)


def _standin_key(config: Any, seed: int) -> str:
    import transformers  # noqa: PLC0415

    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(f"{text}|{seed}|{transformers.__version__}|{torch.__version__}".encode()).hexdigest()[:12]


def ensure_standin(config: Any = STANDIN_CONFIG, *, seed: int = 0, folder: str | Path | None = None) -> Path:
    """Build the stand-in once (random weights from ``seed``, bfloat16, with the offline tokenizer); return its folder.

    Saved with ``save_pretrained`` to a folder under :func:`cache_dir` (outside the repository) and reused
    afterwards, so that the stand-in loads through ``from_pretrained`` exactly like a Hub model. The build
    is written to a temporary folder first and renamed at the end, so an interrupted build leaves no
    half-written model behind. The global random state is left untouched.
    """
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(config, (str, Path)):
        config = load_config(config)
    base = Path(folder) if folder is not None else cache_dir()
    target = base / f"standin-{config.model_type}-seed{seed}-{_standin_key(config, seed)}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        if folder is not None:
            raise
        return ensure_standin(config, seed=seed, folder=Path(tempfile.gettempdir()) / "course_utils")
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        with quiet_transformers(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # bfloat16 on disk is a storage choice (half the bytes of float32, float32's range);
            # load_model casts to the dtype of the device that loads it (float16 on a T4).
            model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(STANDIN_STORAGE_DTYPE))
            model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(data_path("standin", name), tmp / name)
        (tmp / "STANDIN.txt").write_text(
            "Course stand-in: a real architecture with RANDOM weights (seed "
            f"{seed}). Its generated text is noise. Built by course_utils.models.ensure_standin.\n", encoding="utf-8")
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same build first: keep theirs
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class ModelChoice:
    """The model the notebook will use: where it loads from, whether it is the stand-in, and why."""

    name: str
    is_standin: bool
    reason: str

    @property
    def label(self) -> str:
        """Prefix for every printed line, so nobody mistakes stand-in numbers or text for the real model's."""
        return "[STAND-IN: SmolLM2-135M architecture, random weights]" if self.is_standin else f"[{self.name}]"


def choose_model(model_name: str = REAL_MODEL, *, timeout_s: float = 1.5, seed: int = 0) -> ModelChoice:
    """Decide (:func:`decide_source`), build the stand-in if needed (:func:`ensure_standin`), return the choice."""
    decision = decide_source(model_name, timeout_s=timeout_s)
    if decision.source == "real":
        return ModelChoice(model_name, False, decision.reason)
    return ModelChoice(str(ensure_standin(seed=seed)), True, decision.reason)


# --------------------------------------------------------------------------------------------
# Loading in 16, 8 or 4 bits
# --------------------------------------------------------------------------------------------
def check_bits(bits: Any) -> int:
    """Return ``bits`` if it is 16, 8 or 4; raise a clear TypeError/ValueError otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, one of {BITS}, got {type(bits).__name__}")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS} (16 = no quantization, 8 = LLM.int8, 4 = NF4), got {bits}")
    return bits


def quantization_config(bits: int, compute_dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> Any:
    """The ``BitsAndBytesConfig`` for ``bits`` (None for 16), as in the seed.

    4-bit: NF4, the format QLoRA uses, unpacked to ``compute_dtype`` for the maths; by default the 16-bit
    dtype :func:`course_utils.hardware.autocast_dtype` picks for ``device`` (bfloat16 on Ampere+ and on
    CPUs, float16 on a T4). 8-bit: LLM.int8.

    8 and 4 bits need bitsandbytes (transformers 4.x checks its version in the config itself): without it,
    a RuntimeError says so; :func:`bitsandbytes_missing` asks first.
    """
    check_bits(bits)
    if bits == 16:
        return None
    dtype = compute_dtype if compute_dtype is not None else autocast_dtype(as_device(device))
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"compute_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype}")
    _require_bitsandbytes(bits)
    from transformers import BitsAndBytesConfig  # noqa: PLC0415

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,               # store the weights in 4 bits
        bnb_4bit_quant_type="nf4",       # the 4-bit format QLoRA uses
        bnb_4bit_compute_dtype=dtype,    # unpacked to 16-bit for the maths
    )


def bitsandbytes_missing() -> str | None:
    """None when bitsandbytes loads here; otherwise why 8- and 4-bit steps cannot run (one sentence).

    bitsandbytes does not install everywhere (for instance on some Macs). A notebook asks this once and
    prints, in each 4-bit cell, what it skipped and this reason, instead of stopping.
    """
    if import_bitsandbytes() is not None:
        return None
    return ("bitsandbytes is not installed here (or cannot load on this machine), and 8- and 4-bit "
            "weights need it: pip install bitsandbytes, then restart the kernel")


def _require_bitsandbytes(bits: int) -> None:
    missing = bitsandbytes_missing()
    if missing is not None:
        raise RuntimeError(f"loading in {bits} bits needs bitsandbytes: {missing}")


def _name_of(choice: ModelChoice | str | Path) -> str:
    if isinstance(choice, ModelChoice):
        return choice.name
    if isinstance(choice, (str, Path)):
        return str(choice)
    raise TypeError(f"model must be a ModelChoice, a Hub id or a folder, got {type(choice).__name__}")


def load_settings(bits: int = 16, device: torch.device | str | None = None) -> dict[str, Any]:
    """The keyword arguments :func:`load_model` passes to ``from_pretrained`` for ``bits`` on ``device``.

    dtype: :func:`course_utils.hardware.autocast_dtype` of the device (float16 on a T4, bfloat16 from
    compute capability 8.0 and on CPUs), for the model at 16 bits and for the non-quantized parts and the
    NF4 maths at 4 bits. device_map: ``"auto"`` on a CUDA GPU, ``"cpu"`` elsewhere.
    """
    check_bits(bits)
    dev = as_device(device)
    dtype = autocast_dtype(dev)
    return {**dtype_kwargs(dtype), "device_map": "auto" if dev.type == "cuda" else "cpu",
            "quantization_config": quantization_config(bits, dtype)}


def load_model(choice: ModelChoice | str | Path, bits: int = 16, *, device: torch.device | str | None = None) -> Any:
    """Load a causal LM in 16 bits, or quantized to 8 or 4 bits on the fly, with one ``from_pretrained`` call.

    The same call serves the real model (a Hub id) and the stand-in (its cache folder); the arguments
    come from :func:`load_settings` (the device decides the 16-bit dtype). 8 and 4 bits without
    bitsandbytes raise a RuntimeError that says so.
    """
    check_bits(bits)
    name = _name_of(choice)
    settings = load_settings(bits, device)
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(name, **settings)
    model.eval()
    return model


def load_tokenizer(choice: ModelChoice | str | Path) -> Any:
    """The model's tokenizer: the Hub's for the real model, the offline byte-level BPE for the stand-in."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    with quiet_transformers():
        return AutoTokenizer.from_pretrained(_name_of(choice))


def keep_4bit_trainable_on_cpu(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; return how many layers were changed.

    On CPUs with AVX-512-bf16, the first no-grad forward (a ``generate``) of a ``Linear4bit`` repacks its
    weights into a faster inference layout, and a later training step then fails ("a view of a leaf
    Variable that requires grad..."). Switching the repack off keeps the layers trainable, at the cost of
    a slower CPU ``generate``. Harmless elsewhere (the flag only matters on CPU).
    """
    bnb = import_bitsandbytes()
    if bnb is None:
        return 0
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if any(getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False) for m in layers):
        raise RuntimeError("these 4-bit weights were already repacked for CPU inference by an earlier no-grad "
                           "forward (a generate); they can no longer be trained. Load the 4-bit model again "
                           "and call keep_4bit_trainable_on_cpu before generating, or train first.")
    for module in layers:
        module.support_avx512bf16_for_cpu = False
    return len(layers)


# --------------------------------------------------------------------------------------------
# Footprints: what get_memory_footprint() counts, part by part
# --------------------------------------------------------------------------------------------
PART_NAMES = ("embedding table", "attention linears (q, k, v, o)", "MLP linears (gate, up, down)",
              "other linears", "linear biases", "norms", "lm_head", "other parameters", "buffers")


@dataclass(frozen=True)
class Part:
    """One part of a model: how many parameters it has and how many bytes they take at a given width."""

    name: str
    params: int
    bytes: int
    quantized: bool


def _true_numel(param: torch.Tensor) -> int:
    """Number of weights a parameter stands for: a packed 4-bit ``Params4bit`` holds two per byte."""
    state = getattr(param, "quant_state", None)
    if state is not None and getattr(state, "shape", None) is not None:
        return math.prod(state.shape)
    return param.numel()


def _output_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    return getter() if callable(getter) else None


def is_tied(model: torch.nn.Module) -> bool:
    """True when the lm_head shares its weight tensor with the input embedding table."""
    out, inp = _output_embedding(model), getattr(model, "get_input_embeddings", lambda: None)()
    return out is not None and inp is not None and out.weight is inp.weight


def footprint_parts(model: torch.nn.Module, bits: int = 16) -> list[Part]:
    """The model's memory by part, as ``get_memory_footprint()`` would count it when loaded at ``bits``.

    Works on a meta-device model (computed), a 16-bit model (predicting its 4-bit size) or an already
    quantized one. The rules are those of transformers + bitsandbytes: every ``nn.Linear`` is quantized
    except the output head; embeddings, norms and biases stay 16-bit; a tied lm_head adds nothing.
    ``get_memory_footprint()`` counts parameters and buffers only, so quantization scales are not in
    these bytes (see :func:`scale_bytes`).
    """
    check_bits(bits)
    quant_bytes = {16: 2.0, 8: 1.0, 4: 0.5}[bits]
    head = _output_embedding(model)
    seen: set[int] = set()
    params = {n: 0 for n in PART_NAMES}
    nbytes = {n: 0.0 for n in PART_NAMES}

    def add(part: str, count: int, per: float) -> None:
        params[part] += count
        nbytes[part] += count * per

    for mod_name, module in model.named_modules():
        for p_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # a tied tensor is stored (and counted) once
            seen.add(id(param))
            n = _true_numel(param)
            if isinstance(module, torch.nn.Embedding):
                add("embedding table", n, 2)
            elif module is head:
                add("lm_head", n, 2)
            elif isinstance(module, torch.nn.Linear):
                if p_name == "bias":
                    add("linear biases", n, 2)
                elif ".self_attn." in f".{mod_name}." or ".attn." in f".{mod_name}.":
                    add("attention linears (q, k, v, o)", n, quant_bytes)
                elif ".mlp." in f".{mod_name}.":
                    add("MLP linears (gate, up, down)", n, quant_bytes)
                else:
                    add("other linears", n, quant_bytes)
            elif "norm" in type(module).__name__.lower() or "norm" in mod_name.rsplit(".", 1)[-1].lower():
                add("norms", n, 2)
            else:
                add("other parameters", n, 2)
    for buf in model.buffers():
        add("buffers", buf.numel(), buf.element_size())
    quantized = {"attention linears (q, k, v, o)", "MLP linears (gate, up, down)", "other linears"}
    parts = [Part(n, params[n], int(round(nbytes[n])), bits != 16 and n in quantized) for n in PART_NAMES]
    if head is not None and is_tied(model):
        parts[PART_NAMES.index("lm_head")] = Part("lm_head", 0, 0, False)
    return parts


def footprint_bytes(model: torch.nn.Module, bits: int = 16) -> int:
    """Total of :func:`footprint_parts`: ``get_memory_footprint()``'s answer for the model loaded at ``bits``."""
    return sum(p.bytes for p in footprint_parts(model, bits))


def scale_bytes(model: torch.nn.Module, bits: int) -> int:
    """Bytes of quantization scales that ``get_memory_footprint()`` leaves out.

    4-bit NF4: one float32 absmax per block of 64 weights (0.5 bit per weight); 8-bit: one float32 per
    output row. 16-bit: none.
    """
    check_bits(bits)
    if bits == 16:
        return 0
    total = 0
    for part in footprint_parts(model, bits):
        if part.quantized:
            total += part.params
    if bits == 4:
        return math.ceil(total / NF4_BLOCKSIZE) * 4
    head = _output_embedding(model)
    rows = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return rows * 4


def measured_scale_bytes(model: torch.nn.Module) -> int:
    """Bytes of the absmax scales actually stored by the 4-bit layers of a loaded model (0 if none)."""
    total = 0
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None and getattr(state, "absmax", None) is not None:
            total += state.absmax.numel() * state.absmax.element_size()
    return total


def format_bytes(n: float) -> str:
    """Bytes in MB below 1 GB, else in GB (10^6 and 10^9 bytes, as get_memory_footprint users usually print)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def breakdown_table(model: torch.nn.Module, low_bits: int = 4) -> str:
    """A text table: each part's parameters and bytes at 16 bits and at ``low_bits``, with totals."""
    check_bits(low_bits)
    p16, plow = footprint_parts(model, 16), footprint_parts(model, low_bits)
    total_params = sum(p.params for p in p16 if p.name != "buffers")
    t16, tlow = sum(p.bytes for p in p16), sum(p.bytes for p in plow)
    rows = [f"{'part':32}{'parameters':>15}{'share':>8}{'16-bit':>11}{f'{low_bits}-bit':>11}"]
    for a, b in zip(p16, plow):
        if a.params == 0 and a.name != "lm_head":
            continue
        label = "lm_head (tied: shares the table)" if a.name == "lm_head" and a.params == 0 else a.name
        count = f"{a.params:,}" if a.name != "buffers" else "(not params)"
        share = f"{100 * a.params / total_params:.1f}%" if a.name != "buffers" else ""
        mark = "" if b.quantized or low_bits == 16 else " *"
        rows.append(f"{label:32}{count:>15}{share:>8}{format_bytes(a.bytes):>11}{format_bytes(b.bytes):>11}{mark}")
    rows.append(f"{'total':32}{total_params:>15,}{'100%':>8}{format_bytes(t16):>11}{format_bytes(tlow):>11}")
    rows.append(f"* stays 16-bit when the linears go to {low_bits} bits.   {low_bits}-bit / 16-bit = {100 * tlow / t16:.0f} %")
    return "\n".join(rows)


@dataclass(frozen=True)
class ComputedSizes:
    """A model's size from its architecture alone (meta device): nothing was loaded or downloaded."""

    name: str
    params: int
    bytes16: int
    bytes8: int
    bytes4: int
    scales4: int
    embedding_share: float

    def summary(self) -> str:
        """Two lines: the sizes, labelled as computed."""
        return (f"{self.name} (COMPUTED from its architecture on the meta device, not loaded): "
                f"{self.params:,} parameters\n"
                f"  16-bit {format_bytes(self.bytes16)}, 8-bit {format_bytes(self.bytes8)}, "
                f"4-bit {format_bytes(self.bytes4)} ({100 * self.bytes4 / self.bytes16:.0f} % of 16-bit; "
                f"embedding table {100 * self.embedding_share:.0f} % of the parameters)")


def computed_sizes(config: Any, name: str | None = None) -> ComputedSizes:
    """Sizes at 16, 8 and 4 bits of the architecture ``config`` (a config or a file in ``data/configs``)."""
    if name is None:
        name = Path(str(config)).stem if isinstance(config, (str, Path)) else type(config).__name__
    model = meta_model(config)
    parts16 = footprint_parts(model, 16)
    params = sum(p.params for p in parts16 if p.name != "buffers")
    emb = next(p.params for p in parts16 if p.name == "embedding table")
    return ComputedSizes(name, params, footprint_bytes(model, 16), footprint_bytes(model, 8),
                         footprint_bytes(model, 4), scale_bytes(model, 4), emb / params)


# --------------------------------------------------------------------------------------------
# A Llama-shaped model in closed form (for the interactive demo)
# --------------------------------------------------------------------------------------------
def llama_like_parts(hidden_size: int, num_layers: int, vocab_size: int, *, mlp_ratio: float = 8 / 3,
                     kv_fraction: float = 1 / 3, tied: bool = True) -> dict[str, int]:
    """Parameter counts of a Llama-shaped decoder, in closed form (no torch).

    Per layer: q and o are hidden x hidden, k and v hidden x (kv_fraction * hidden), gate/up/down use
    an intermediate size of mlp_ratio * hidden, plus two norms. SmolLM2-135M is hidden 576, 30 layers,
    vocab 49,152, mlp_ratio 1536/576, kv_fraction 1/3, tied: exactly 134,515,008.
    """
    for arg, value, lo, hi in (("hidden_size", hidden_size, 64, 16384), ("num_layers", num_layers, 1, 200),
                               ("vocab_size", vocab_size, 256, 1_000_000)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise ValueError(f"{arg} must be in [{lo}, {hi}], got {value}")
    if not 0.5 <= mlp_ratio <= 8:
        raise ValueError(f"mlp_ratio must be in [0.5, 8], got {mlp_ratio}")
    if not 0 < kv_fraction <= 1:
        raise ValueError(f"kv_fraction must be in (0, 1], got {kv_fraction}")
    inter = round(mlp_ratio * hidden_size)
    kv = round(kv_fraction * hidden_size)
    attention = num_layers * (2 * hidden_size * hidden_size + 2 * hidden_size * kv)
    mlp = num_layers * 3 * hidden_size * inter
    norms = (2 * num_layers + 1) * hidden_size
    embedding = vocab_size * hidden_size
    return {"embedding table": embedding, "attention linears": attention, "MLP linears": mlp, "norms": norms,
            "lm_head": 0 if tied else embedding}


def four_bit_ratio_report(hidden_size: int, num_layers: int, vocab_size: int, tied: bool = True,
                          mlp_ratio: float = 8 / 3) -> str:
    """Text for the demo: a Llama-shaped model's 16-bit and 4-bit sizes and why the ratio is not 25 %."""
    parts = llama_like_parts(hidden_size, num_layers, vocab_size, mlp_ratio=mlp_ratio, tied=tied)
    total = sum(parts.values())
    linears = parts["attention linears"] + parts["MLP linears"]
    b16, b4 = 2 * total, 0.5 * linears + 2 * (total - linears)
    return (f"hidden {hidden_size}, {num_layers} layers, vocabulary {vocab_size:,}, "
            f"{'tied' if tied else 'untied'} lm_head: {total / 1e6:,.0f} M parameters\n"
            f"16-bit {format_bytes(b16)} -> 4-bit {format_bytes(b4)}: {100 * b4 / b16:.0f} % "
            f"(25 % would need every weight in a linear layer)\n"
            f"stays 16-bit: {100 * (total - linears) / total:.0f} % of the parameters "
            f"(embedding table {100 * parts['embedding table'] / total:.0f} %"
            f"{', lm_head ' + format(100 * parts['lm_head'] / total, '.0f') + ' %' if parts['lm_head'] else ''})")


# --------------------------------------------------------------------------------------------
# LoRA: counts from scratch and with peft
# --------------------------------------------------------------------------------------------
def _check_lora_args(r: Any, alpha: Any, targets: Any) -> tuple[str, ...]:
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"r must be an int, got {type(r).__name__}")
    if not 1 <= r <= 1024:
        raise ValueError(f"r (the LoRA rank) must be in [1, 1024], got {r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise TypeError("targets must be a list of module names such as ['q_proj', 'v_proj'], not a string")
    targets = tuple(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be a non-empty list of module names, got {targets!r}")
    return targets


def lora_params_by_hand(model: torch.nn.Module, r: int = 16, targets: Sequence[str] = SEED_TARGETS) -> int:
    """LoRA's trainable count from scratch: r x (d_in + d_out) for every targeted linear (A is r x d_in, B d_out x r)."""
    targets = _check_lora_args(r, 1, targets)
    total, matched = 0, 0
    for name, module in model.named_modules():
        layer = getattr(module, "base_layer", module)  # a layer peft already wrapped: count its base
        if isinstance(layer, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            total += r * (layer.in_features + layer.out_features)
            matched += 1
    if matched == 0:
        raise ValueError(f"none of targets {targets} names a linear layer of this model")
    return total


def lora_config(r: int = 16, alpha: float = 16, targets: Sequence[str] = SEED_TARGETS) -> Any:
    """The peft ``LoraConfig`` of the seed's QLoRA cell: rank r, lora_alpha, no dropout, the given modules."""
    targets = _check_lora_args(r, alpha, targets)
    from peft import LoraConfig  # noqa: PLC0415

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), task_type="CAUSAL_LM")


def add_lora(model: torch.nn.Module, r: int = 16, alpha: float = 16, targets: Sequence[str] = SEED_TARGETS,
             *, prepare_kbit: bool | None = None, seed: int | None = 0) -> Any:
    """Freeze ``model`` and wrap it with LoRA adapters (peft). Returns the peft model.

    The adapters' A matrices start random (B starts at zero); ``seed`` makes that start reproducible
    without touching the global random state (None: use the global state as it is).

    For a 4- or 8-bit model, ``prepare_kbit`` (default: when the model is quantized) first runs peft's
    ``prepare_model_for_kbit_training``, the standard QLoRA step: the non-quantized parts go to float32
    for stable training, and on a GPU gradient checkpointing trades compute for activation memory.
    A quantized model also gets :func:`keep_4bit_trainable_on_cpu`, so evaluating or generating between
    training steps on an AVX-512-bf16 CPU cannot break the next step.
    """
    cfg = lora_config(r, alpha, targets)
    import_bitsandbytes()  # quietly, before peft imports it
    from peft import get_peft_model, prepare_model_for_kbit_training  # noqa: PLC0415

    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    if quantized:
        keep_4bit_trainable_on_cpu(model)  # the CPU repack pitfall: see keep_4bit_trainable_on_cpu
    where = next(model.parameters()).device
    on_gpu = where.type == "cuda"
    with quiet_transformers():
        if quantized if prepare_kbit is None else prepare_kbit:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=on_gpu)
            if on_gpu:
                model.config.use_cache = False  # the generation cache is useless (and warned about) with checkpointing
        if seed is None:
            return get_peft_model(model, cfg)
        devices = [where.index if where.index is not None else torch.cuda.current_device()] if on_gpu else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return get_peft_model(model, cfg)


@dataclass(frozen=True)
class LoraCount:
    """Trainable adapter parameters against the base model (peft's "all params" includes the adapter)."""

    name: str
    trainable: int
    base: int

    @property
    def all_params(self) -> int:
        """What peft's ``print_trainable_parameters`` calls "all params": base + adapter."""
        return self.base + self.trainable

    @property
    def percent(self) -> float:
        """peft's "trainable%": adapter / (base + adapter) x 100."""
        return 100 * self.trainable / self.all_params

    @property
    def percent_of_base(self) -> float:
        """Adapter / base model x 100."""
        return 100 * self.trainable / self.base

    def summary(self) -> str:
        """peft's line, plus the share of the base model."""
        return (f"{self.name}: trainable params: {self.trainable:,} || all params: {self.all_params:,} || "
                f"trainable%: {self.percent:.2f} ({self.percent_of_base:.2f} % of the {self.base:,} base parameters)")


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameters of a model, as peft counts them (4-bit weights at their true count)."""
    trainable = sum(_true_numel(p) for p in model.parameters() if p.requires_grad)
    return trainable, count_parameters(model)


def lora_count(config: Any, r: int = 16, alpha: float = 16, targets: Sequence[str] = SEED_TARGETS,
               name: str | None = None) -> LoraCount:
    """Count the seed's LoRA adapter on the architecture ``config``, on the meta device (no memory, no download)."""
    targets = _check_lora_args(r, alpha, targets)
    if name is None:
        name = Path(str(config)).stem if isinstance(config, (str, Path)) else type(config).__name__
    model = meta_model(config)
    base = count_parameters(model)
    with torch.device("meta"):
        peft_model = add_lora(model, r, alpha, targets, prepare_kbit=False)
    trainable, total = trainable_counts(peft_model)
    assert total == base + trainable
    return LoraCount(name, trainable, base)


# --------------------------------------------------------------------------------------------
# Text: generation and a tiny training set
# --------------------------------------------------------------------------------------------
class _MaskFrom:
    """Logits processor: token ids from ``start`` on can never be chosen (the tokenizer cannot spell them)."""

    def __init__(self, start: int) -> None:
        self.start = start

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.start:] = float("-inf")
        return scores


def generate_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 10) -> str:
    """Greedy continuation of ``prompt`` (prompt included), as in the seed.

    When the tokenizer knows fewer tokens than the model's vocabulary (the stand-in's small offline
    tokenizer), ids it cannot spell are masked out, so the noise at least prints as text.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= 200:
        raise ValueError(f"max_new_tokens must be an int in [1, 200], got {max_new_tokens!r}")
    from transformers import LogitsProcessorList  # noqa: PLC0415

    vocab, spellable = int(model.config.vocab_size), len(tokenizer)
    extra = {"logits_processor": LogitsProcessorList([_MaskFrom(spellable)])} if 0 < spellable < vocab else {}
    device = next(model.parameters()).device
    # Only ids and mask: some tokenizers add token_type_ids, which generate rejects for decoder-only
    # models on transformers 4.x ("model_kwargs are not used by the model").
    inputs = tokenizer(prompt, return_tensors="pt", return_token_type_ids=False).to(device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with quiet_transformers(), torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, **extra)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def training_texts(path: str | Path | None = None) -> list[str]:
    """The small training set shipped for the QLoRA steps: one ``{"text": ...}`` per line of a JSONL file."""
    file = Path(path) if path is not None else data_path("standin", "train.jsonl")
    texts = [json.loads(line)["text"] for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{file} holds no texts")
    return texts


def training_batches(tokenizer: Any, texts: Sequence[str], batch_size: int = 4, max_length: int = 32,
                     device: torch.device | str | None = None) -> list[dict[str, torch.Tensor]]:
    """Fixed, padded batches for causal-LM training: ``input_ids``, ``attention_mask`` and ``labels``.

    Padding positions get label -100, so the loss ignores them. The order is the order of ``texts``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 256:
        raise ValueError(f"batch_size must be an int in [1, 256], got {batch_size!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 2 <= max_length <= 8192:
        raise ValueError(f"max_length must be an int in [2, 8192], got {max_length!r}")
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dev = torch.device(device) if device is not None else torch.device("cpu")
    batches = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start:start + batch_size]), return_tensors="pt", padding=True,
                        truncation=True, max_length=max_length, return_token_type_ids=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        batches.append({"input_ids": enc["input_ids"].to(dev), "attention_mask": enc["attention_mask"].to(dev),
                        "labels": labels.to(dev)})
    return batches


def mean_loss(model: Any, batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """Average loss of ``model`` over ``batches``, in eval mode and without gradients (the model is left in eval mode)."""
    if not batches:
        raise ValueError("batches must be a non-empty list (see training_batches)")
    model.eval()
    with torch.no_grad():
        return sum(float(model(**batch).loss) for batch in batches) / len(batches)


# --------------------------------------------------------------------------------------------
# Unsloth: only where it can run
# --------------------------------------------------------------------------------------------
def on_colab() -> bool:
    """True inside Google Colab (its environment variables, or the google.colab module)."""
    if any(k.startswith("COLAB_") for k in os.environ):
        return True
    import importlib.util  # noqa: PLC0415

    try:
        return importlib.util.find_spec("google.colab") is not None
    except ModuleNotFoundError:
        return False


#: What the peft cells of notebook 01b already showed, for the line that explains a skipped Unsloth cell.
UNSLOTH_SAME_JOB = ("The peft cells above did the same job: a frozen 4-bit base with a LoRA adapter (r=16) on the "
                    "seven projections, its trainable count, and real training steps.")


@dataclass(frozen=True)
class UnslothPlan:
    """Whether the seed's Unsloth cell runs here, why (or why not), and how to run it in a fresh runtime.

    Unsloth is never installed into a running kernel: it patches torch, transformers and peft when it is
    imported, and this kernel has already imported them. ``command`` says what to do instead (None when
    the cell runs, or when no install would help here).
    """

    run: bool
    reason: str
    command: str | None = None

    def message(self) -> str:
        """The lines the notebook prints: the decision, the fresh-runtime command if any, what peft showed."""
        lines = [self.reason]
        if self.command:
            lines.append(self.command)
        if not self.run:
            lines.append(UNSLOTH_SAME_JOB)
        return "\n".join(lines)


def unsloth_install_command(colab: bool | None = None, *, gpu_here: bool = True) -> str:
    """How to get Unsloth: in a *fresh* runtime, install first, restart, then run the notebook.

    ``colab``: the Colab wording (default: :func:`on_colab`). ``gpu_here`` False adds that a CUDA GPU is needed.
    """
    if colab is None:
        colab = on_colab()
    if colab:
        runtime = "a fresh Colab runtime" + ("" if gpu_here else " with a GPU (Runtime > Change runtime type > T4 GPU)")
        return (f"To run it: in {runtime}, run `!pip install unsloth` in the first cell, restart the session "
                "(Runtime > Restart session), then run this notebook.")
    where = "" if gpu_here else " on a machine with a CUDA GPU and internet"
    return (f"To run it{where}: run `pip install unsloth` in a fresh environment before starting Jupyter, then "
            "run this notebook in a new kernel.")


def unsloth_importable() -> bool:
    """True when the ``unsloth`` package is installed (found without importing it)."""
    import importlib.util  # noqa: PLC0415

    try:
        return importlib.util.find_spec("unsloth") is not None
    except (ImportError, ValueError):
        return False


def unsloth_plan(choice: ModelChoice) -> UnslothPlan:
    """Run the seed's Unsloth cell only when Unsloth is installed, a CUDA GPU is here and the Hub is reachable.

    Unsloth downloads ``unsloth/Qwen3-4B-Instruct-2507`` and runs CUDA kernels. It is never pip-installed
    from here (see :class:`UnslothPlan`); when it is missing, the plan carries the command for a fresh runtime.
    """
    if not isinstance(choice, ModelChoice):
        raise TypeError(f"choice must be the ModelChoice from choose_model, got {type(choice).__name__}")
    if not torch.cuda.is_available():
        return UnslothPlan(False, "Unsloth skipped: it needs a CUDA GPU and there is none here.",
                           unsloth_install_command(gpu_here=False))
    if choice.is_standin:
        return UnslothPlan(False, f"Unsloth skipped: it downloads its model from the Hub, which is not available "
                                  f"here ({choice.reason}).")
    if not unsloth_importable():
        return UnslothPlan(False, "Unsloth skipped: it is not installed in this runtime, and installing it into a "
                                  "kernel that has already imported torch, transformers and peft is unsafe.",
                           unsloth_install_command())
    return UnslothPlan(True, "Unsloth is installed, a CUDA GPU is here and the Hub is reachable: running the "
                             "Unsloth cell.")
