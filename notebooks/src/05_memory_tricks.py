# %% [markdown]
# # Three more memory tricks, measured
#
# Notebook 04 measured a LoRA step of SmolLM2-135M far above its weights-only estimate, 0.54 GB, as the team's own
# run did (1.88 GB). Close that gap, then measure three more memory tricks: gradient checkpointing, 8-bit AdamW
# and `torch.compile`. A CPU is enough; a GPU is used if present.

# %% [markdown]
# **You will be able to**
# - predict a training step's peak memory, and check it against a measurement;
# - measure what each trick saves and costs;
# - read a step's peak with PyTorch's counters;
# - run a memory-efficient `TrainingArguments`;
# - find a step's bottleneck, and the trick that removes it.

# %% [setup] extras=["peft", "transformers"]
# %% [markdown]
# ## Why: where did the rest go?
#
# The estimate counted weights, gradients and optimizer states. A step also holds the **activations saved
# for backward** (forward results that backward needs again; they grow with batch and sequence length),
# temporary buffers, and the program itself. The tricks' usual claims, each tested below:

# %%
from course_utils import tricks
from course_utils.lessons import memory_tricks as lesson

for key, trick in tricks.TRICKS.items():
    if key != "baseline":
        print(f"{trick.label:<32} {trick.claim}")

# %% [markdown]
# ## How it works: everything a training step holds
#
# At its **peak moment** (the instant when the most memory is in use) a step holds:
#
# 1. the **baseline**: the process after `import torch, transformers`;
# 2. **weights**: 4 bytes per float32 number;
# 3. **optimizer states**: AdamW 8 bytes per trained number, 8-bit AdamW about 2;
# 4. **gradients**: 4 bytes per trained number;
# 5. **activations saved for backward**;
# 6. **temporary buffers**, mainly the gradient of the logits (scores over the vocabulary).
#
# `course_utils.step_memory` counts each part. Notebook 04's step: LoRA rank 8 on `q_proj` and `v_proj` of
# SmolLM2-135M, float32 base, AdamW, batch 8 × 128 tokens. Its parts at the peak moment, and their sum:

# %%
from course_utils import step_memory
from course_utils.hardware import pick_device

DEVICE = pick_device()  # one decision for the estimate and the measurement: the GPU if there is one
STEP = {"method": "lora", "lora_rank": 8, "targets": ("q_proj", "v_proj"), "batch": 8, "seq": 128}
est = step_memory.estimate_step("smollm2-135m", **STEP, device=step_memory.estimate_device_for(DEVICE))
print(f"at the peak moment, the {est.peak_moment.split(' (')[0]}:")
for part, nbytes in est.parts():
    print(f"  {part.split(' (')[0]:<38} {nbytes / 1e9:6.3f} GB")
print(f"  {'predicted peak (sum)':<38} {est.peak_gb:6.3f} GB")

# %% [markdown]
# ### Predict before you measure
#
# **Write down your guess**: will the measured peak land within 5 % of that sum? The measurement runs a
# warm-up step, then measures the next: on a CPU in a fresh process, reading its peak **resident memory** (the
# RAM it occupies); on a GPU, PyTorch's **allocator counter** (bytes held by its tensors), which the estimate
# then predicts.

# %% tags=["nbval-ignore-output"] nbval_reason="a measured peak, different on every machine and run."
from course_utils.measure import measure_training_step
from course_utils.progress import status

status("Measuring the step …")
m = measure_training_step("smollm2-135m", **STEP, device=DEVICE, timeout_s=280)
print(step_memory.comparison_line(est.peak_bytes, m.peak_bytes))

# %%
from course_utils.sweeps import TOLERANCE_PCT

error_pct = step_memory.error_percent(est.peak_bytes, m.peak_bytes)
print(f"sum of the parts and measured peak agree within {TOLERANCE_PCT:g} %: {abs(error_pct) <= TOLERANCE_PCT}")

# %% [markdown]
# The baseline and the runtime are the two parts not counted from tensors: constants measured once on a
# reference CPU ("Going deeper" checks them on another).
#
# ## Interactive demo: what is my bottleneck?
#
# The planner names the biggest parts of a GPU step's peak and the tricks that make it fit the card:

# %%
_ = lesson.bottleneck_view("smollm2-135m", "full", batch=16, seq=512, budget_gb=16.0, show_chart=False, limit=2)

# %% [markdown]
# Time factors come from the arithmetic: forward 1, backward 2; checkpointing adds a forward: 4/3, near the
# claimed "~30 %". Accumulation splits the same arithmetic into steps with fixed costs: "x1.00 or more".

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget (nbval has no widget front end)."
lesson.bottleneck_planner()

# %% [markdown]
# Try: SmolLM2 "full fine-tuning (float32)" at 16 × 512 on 8 GB, then tick checkpointing; Qwen2.5-1.5B "LoRA,
# base in float32" at 1024 tokens on 16 GB, then "QLoRA, base in 4 bits".
#
# ## Benefits and trade-offs: each trick on a real step
#
# One full fine-tuning step per trick, batch 4 × 256, on a **miniature of SmolLM2**: 4 of its 30 layers, a
# vocabulary of 8,192.

# %% [markdown] slide="notes"
# With the full vocabulary a small step is all embedding and loss; the small one makes it a big model's
# step in miniature.

# %% [markdown]
# **Predict first**: which trick lowers the peak most here? Which one speeds the step up?

# %%
from course_utils.architecture import Architecture
from course_utils.configs import read_config

MINI = read_config("smollm2-135m")
MINI.update(num_hidden_layers=4, vocab_size=8192)
BASE = {"method": "full", "batch": 4, "seq": 256}
print(f"{Architecture.from_config(MINI).params:,} parameters")

# %% [markdown]
# ### Your turn: read a step's peak
#
# On a GPU, PyTorch's allocator counts the bytes its tensors hold and keeps the most since its last reset:
# `torch.cuda.reset_peak_memory_stats()` resets it, `torch.cuda.max_memory_allocated()` reads the peak and
# `torch.cuda.memory_allocated()` what is held now. Write `step_peak`: reset the peak counter, run `step()` once,
# return the peak in bytes. The check replays the miniature's predicted step, with and without checkpointing, on
# a stand-in `counter` that earlier work has left at a larger peak: the same on every machine.

# %%
import torch


def step_peak(step, counter=torch.cuda):
    """Reset the peak counter, run step() once, read the peak: the most bytes tensors held during the step."""
    raise NotImplementedError  # your code here


lesson.check_step_peak(step_peak)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def step_peak(step, counter=torch.cuda):
#     counter.reset_peak_memory_stats()      # 1. forget earlier peaks
#     step()                                 # 2. train one step
#     return counter.max_memory_allocated()  # 3. the most bytes tensors held since the reset
# ```
#
# Without the reset it reports the earlier, larger peak; read before `step()` it reports the weights and states
# alone; what is held after the step (`memory_allocated`) misses the activations, freed by then.
#
# </details>
#
# A CPU has no allocator counter: there the course's tracker, `peak.track_peak`, resets and reads the process's
# peak resident memory ("Going deeper" measures each trick so, in code). `tricks.measure_tricks` measures each
# trick in a fresh process, next to its estimate. A step that fails gets a *skipped* row. 16-bit means bfloat16 (float16 on a T4). `torch.compile` is skipped on a CPU, where
# compiling takes minutes (`TRY_COMPILE_ON_CPU = True` tries it); a tiny model shows it below.

# %% tags=["nbval-ignore-output"] nbval_reason="measured peaks and timings, different on every machine and run."
TRY_COMPILE_ON_CPU = False
status("Measuring each trick …")
results = tricks.measure_tricks(MINI, BASE, ["baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"],
                                timeout_s=280, device=DEVICE, skip_slow_bf16=True)
results += tricks.measure_tricks(MINI, BASE, ["compile"], device=DEVICE, compile_on_cpu=TRY_COMPILE_ON_CPU)
print(tricks.results_text(results))
bf16 = results[2]  # the 16-bit row: skipped, or measured in which dtype
print("16-bit row:", tricks.verdict(bf16, None, short=True) if bf16.skipped else bf16.measurement.autocast)

# %% [markdown]
# ### Where the peak happens
#
# A trick helps only if it shrinks what is alive *at the peak*. PyTorch's profiler records each tensor of the
# baseline step by kind; the estimator predicts the same step. **Predict:** forward, backward or optimizer step?

# %% tags=["nbval-ignore-output"] nbval_reason="a measured timeline, different on every machine and run."
import matplotlib.pyplot as plt
from course_utils import timeline, timeline_measure

predicted = timeline.predicted_timeline(tricks.estimate_step_for(BASE, MINI, DEVICE))
try:
    measured = timeline_measure.measure_timeline(MINI, **BASE, device=DEVICE, timeout_s=120)
except (RuntimeError, TimeoutError) as err:  # an older torch without the profiler's memory export
    measured = None
    print(f"prediction only: {err}")
lesson.timeline_chart(predicted, measured, title="The baseline step")
plt.show()
print(lesson.timeline_text(predicted, measured))

# %% [markdown]
# Activations pile up layer by layer; the peak comes as backward starts, when the loss's gradient over the
# vocabulary joins them. Each trick, predicted:

# %%
timelines = lesson.trick_timelines(MINI, BASE, DEVICE)
lesson.timeline_grid(timelines)
plt.show()

# %% [markdown]
# **Text description of the chart.** One panel per trick, stacked by kind as above; x marks each peak.
# Checkpointing flattens the green activations; 8-bit AdamW thins the purple states to a quarter; accumulation
# shrinks the green and keeps red gradients alive throughout.
#
# - **16-bit autocast** keeps a 16-bit copy of every weight until backward. Its "2× speed" is about GPUs'
#   tensor cores (units for 16-bit matrix maths; NVIDIA datasheets: T4 65 TFLOP/s fp16 vs 8.1 fp32). A CPU has
#   none: without bfloat16 instructions it emulates 16-bit maths, much slower, and the row is skipped; with
#   them, matrix multiplies gain, but every weight is converted each step. The line under the table says which.
#
# The whole 30-layer model at batch 8 × 512 on a GPU, estimated:

# %%
AT_SCALE = {"method": "full", "batch": 8, "seq": 512}
for key in ("baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"):
    e = tricks.estimate_step_for(tricks.trick_kwargs(key, AT_SCALE), "smollm2-135m", device="cuda")
    print(f"{tricks.TRICKS[key].label:<32} {e.peak_gb:5.2f} GB")

# %% [markdown]
# Saved activations dominate here: checkpointing more than halves the peak, as claimed. 8-bit AdamW saves
# 0.8 GB (6 bytes × 134.5 M parameters); 42 GB for a 7-billion-parameter model.
#
# ### Your turn: what does checkpointing keep?
#
# With checkpointing each of SmolLM2's 30 layers keeps only its input: batch × tokens × 576 (hidden size)
# numbers. In float32 at batch 8 × 512, how many **GB** (10⁹ bytes) do the 30 inputs take?

# %%
kept_gb = ...  # your answer, in GB
lesson.check_checkpointed_inputs(kept_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# One layer's input: 8 × 512 tokens × 576 numbers × 4 bytes = 9,437,184 bytes. Thirty of them: 283,115,520
# bytes, so `kept_gb = 0.283`. The estimator counts the same:
#
# ```python
# arch = Architecture.from_config("smollm2-135m")
# step_memory.saved_activations(arch, 8, 512, method="full", checkpointing=True).by_kind["checkpointed layer inputs"]
# ```
#
# Without checkpointing the same step saves 6.31 GB; with it, 1.12 GB, because the float32 log-softmax over
# the vocabulary (0.81 GB) is outside the layers and stays. That is the 9.54 → 4.34 GB above.
#
# </details>
#
# ### torch.compile, up close
#
# `torch.compile(model)`: **TorchDynamo** captures the Python forward as a graph of tensor operations at
# its first call; **Inductor** turns the graph and its backward into fused kernels (several element-wise
# operations in one loop), C++ on a CPU, Triton on a GPU. Later calls with the same shapes reuse them.
#
# The demo: a 256 → 1024 → 256 MLP trained with AdamW. **Predict**: how much slower is the first compiled
# step than later ones? What does a new batch size do?

# %%
import os
import shutil
import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        h = self.up(x)
        return self.down(h * torch.sigmoid(h))  # SiLU, as two element-wise operations


def train_step(net, batch):
    x, y = torch.randn(batch, 256, device=DEVICE), torch.randn(batch, 256, device=DEVICE)
    loss = F.mse_loss(net(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


# %% [markdown]
# Compile it, in an empty cache:

# %%
_ = torch.manual_seed(0)
model = MLP().to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
compiled = torch.compile(model)  # shares model's weights; nothing is compiled until its first call
compiler = shutil.which("g++") or shutil.which("clang++")  # Inductor builds its kernels with it
if compiler is None:
    compiled = None
    print("No C++ compiler (g++ or clang++) on this machine: the torch.compile demo is skipped.")
old_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # put back at the end of the demo
cache_dir = tempfile.mkdtemp(prefix="inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
torch._dynamo.reset()
counters.clear()

# %% tags=["nbval-ignore-output"] nbval_reason="timings, different on every machine and run."
import statistics
import time

from course_utils.units import format_seconds


def timed(net, batch):
    start = time.perf_counter()
    train_step(net, batch)
    return time.perf_counter() - start


graphs = []  # graphs compiled so far, after each new batch size
if compiled is not None:
    status("Compiling …")
    times = {"eager": statistics.median(timed(model, 64) for _ in range(10))}
    times["compiled, 1st step"] = timed(compiled, 64)
    times["compiled, later"] = statistics.median(timed(compiled, 64) for _ in range(10))
    graphs.append(counters["stats"]["unique_graphs"])
    times["compiled, batch 48"] = timed(compiled, 48)
    graphs.append(counters["stats"]["unique_graphs"])
    times["compiled, batch 40"] = timed(compiled, 40)
    graphs.append(counters["stats"]["unique_graphs"])
    for what, seconds in times.items():
        print(f"{what:<18} {format_seconds(seconds):>8}")
    speed = times["eager"] / times["compiled, later"]
    if speed > 3 or speed < 0.5:
        why = "too far apart to trust (a busy machine?): rerun the cell"
    elif speed > 1.1:
        why = "faster: fusing saved more than the overhead"
    elif speed < 0.9:
        why = "slower: guards and the wrapper cost more than fusing saves"
    else:
        why = "even: matrix multiplies dominate either way"
    print(f"compiled: {speed:.2f}x eager's speed, {why}")

# %% [markdown]
# Dynamo's counters tell what was compiled; the eager model, sharing the weights, checks the result:

# %%
if compiled is not None:
    print("graphs after batch 64, 48, 40:", graphs, "- one recompile, then none:", graphs == [1, 2, 2])
    _ = torch.manual_seed(1)
    x, y = torch.randn(64, 256, device=DEVICE), torch.randn(64, 256, device=DEVICE)
    weights = list(model.parameters())
    eager_loss, eager_kept = tricks.saved_for_backward(lambda: F.mse_loss(model(x), y), weights)
    compiled_loss, compiled_kept = tricks.saved_for_backward(lambda: F.mse_loss(compiled(x), y), weights)
    print("same loss within 1e-4:", abs(eager_loss.item() - compiled_loss.item()) <= 1e-4)
    print(f"kept for backward: eager {eager_kept / 1e6:.2f} MB, compiled {compiled_kept / 1e6:.2f} MB")
torch._dynamo.reset()  # forget the compiled graphs, then put the cache setting back as it was
if old_cache is None:
    del os.environ["TORCHINDUCTOR_CACHE_DIR"]
else:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_cache
shutil.rmtree(cache_dir, ignore_errors=True)

# %% [markdown]
# After the recompile Dynamo marked the batch dimension *dynamic* (a symbol), so batch 40 compiled
# nothing. `torch.compile(model, dynamic=True)` does that from the start; padding batches to one shape also
# avoids recompiles. The fused kernels kept less for backward: they recompute cheap element-wise results.
#
# The "1.2-1.5×" claim is about GPUs, where each unfused element-wise operation reads and writes its whole
# tensor in memory, slow next to the arithmetic (T4 datasheet: 8.1 TFLOP/s fp32, 320 GB/s); fusing saves
# that traffic. The line above says which case applied here.
#
# ## In practice: a memory-efficient `TrainingArguments`
#
# A common recipe switches several tricks on in the Hugging Face `Trainer`'s settings, tried as written:

# %%
import transformers
from course_utils.quiet import quiet_libraries

with quiet_libraries():  # on some CPUs bitsandbytes, imported on the way, prints a notice about an optional package
    from transformers import TrainingArguments

recipe = dict(
    output_dir="./out",
    per_device_train_batch_size=2,
    gradient_accumulation_steps=8,   # effective batch = 16 (single GPU)
    bf16=True,
    gradient_checkpointing=True,
    optim="adamw_8bit",              # requires bitsandbytes
    num_train_epochs=3,
    learning_rate=2e-4,
    warmup_ratio=0.03,
    lr_scheduler_type="cosine",
    save_steps=500, eval_steps=500, logging_steps=50,
    torch_compile=False,             # try True after baseline works
)
print("effective batch:", recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"])
major = transformers.__version__.split(".")[0]
try:
    TrainingArguments(**recipe)
    print(f"transformers {major}.x accepts the recipe as written")
except (TypeError, ValueError) as err:
    print(f"transformers {major}.x: {type(err).__name__}: {err}")

# %% [markdown]
# Libraries move: transformers 5 removed `warmup_ratio`, and `bf16=True` needs bfloat16 hardware
# (`eval_steps` also needs `eval_strategy="steps"`). The helper adapts the recipe to this machine for a
# 2-step demo, listing its changes:

# %%
out_dir = tempfile.mkdtemp(prefix="course05-")
args, changes = tricks.memory_efficient_training_arguments(out_dir, max_steps=2)
print(f"effective batch {args.per_device_train_batch_size * args.gradient_accumulation_steps}, "
      f"checkpointing={tricks.checkpointing_enabled(args)}, warmup_steps={args.warmup_steps}")

# %% tags=["nbval-ignore-output"] nbval_reason="the 16-bit format and the optimizer depend on the machine (GPU generation, CPU instructions, bitsandbytes build)."
for change in changes:
    print("-", change.split(": ")[0])
print(f"bf16={args.bf16}, fp16={args.fp16}, optim={args.optim.value}")

# %% [markdown]
# Two optimizer steps (random 64-token sequences; SmolLM2 on a GPU, the miniature on a CPU) inside the
# recipe's peak-memory lines. `torch.cuda` sees GPU memory only: a CPU reads its peak resident memory.

# %% tags=["nbval-ignore-output"] nbval_reason="losses, peak memory and the counter read depend on the machine."
from course_utils import peak as cpu_peak

demo_model = "smollm2-135m" if DEVICE.type == "cuda" else MINI
trainer = tricks.demo_trainer(demo_model, args, batch_examples=32, seq=64)  # random weights and tokens
if DEVICE.type == "cuda":
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # reset the peak counter
    trainer.train()
    torch.cuda.synchronize()
    print(f"peak: {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
else:
    cpu_peak.reset_rss_high_water_mark()  # the CPU's stand-in (Linux): the process's peak resident memory
    trainer.train()
    print(f"peak: {cpu_peak.rss_high_water_mark_bytes() / 1e9:.2f} GB (CPU: peak resident memory)")
print("losses:", tricks.trainer_losses(trainer))

# %% [markdown]
# Random weights start near a uniform guess: $\ln 8192 \approx 9.0$ ($\ln 49152 \approx 10.8$ for
# SmolLM2). `course_utils.peak.measure_peak(fn)` wraps the peak lines for any device.
#
# ## Comparing the tricks
#
# Notebooks 01-03's three tricks, then this notebook's:

# %%
from IPython.display import Markdown

Markdown(tricks.comparison_table())

# %% [markdown]
# Optimization trades memory, speed, quality and cost: no trick is best. Ask instead: **what is my
# bottleneck, and what am I willing to trade to remove it?**
#
# ## Run it yourself
#
# ### Your turn: one change for Kwame
#
# Kwame (notebook 04) has a 24 GB GPU and wants full fine-tuning of Qwen2.5-1.5B
# (`qwen2.5-1.5b-instruct`) at batch 8 × 512. Guess the step's two largest parts, ask
# `bottleneck.what_is_my_bottleneck(...)`, and pick the change that fits: `"checkpointing"`,
# `"8-bit AdamW"`, `"bf16 autocast"`, `"accumulation"` or `"checkpointing + 8-bit AdamW"`.

# %%
from course_utils import bottleneck

choice = ...  # one of the five strings above
lesson.check_kwame_choice(choice)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# diag = bottleneck.what_is_my_bottleneck("qwen2.5-1.5b-instruct", "full", batch=8, budget_gb=24.0, seq=512)
# print(diag.text())
# ```
#
# The estimate is 52.4 GB, more than twice the card's usable 23.5 GB. The biggest parts at the peak: the
# activations saved for backward (28.9 GB: 28 layers × 4,096 tokens, each layer's float32 attention scores,
# which the math kernel keeps, and a 151,936-word vocabulary's log-softmax) and the AdamW states (12.4 GB: 8
# bytes × 1.54 billion parameters), then the float32 weights (6.2 GB). So `choice = "checkpointing + 8-bit
# AdamW"`: 17.6 GB, 75 % of usable, about 1.33× the time (one extra forward). Neither
# trick alone is enough: checkpointing removes the activations but leaves 12.4 GB of states; 8-bit AdamW needs
# smaller micro-batches as well, at x1.00 or more. Switching to LoRA on a bf16 base (20.4 GB, 87 % of usable)
# would also fit, but then you train something else.
#
# </details>
#
# ## Knowledge check
#
# 1. The step's parts sum to 2.603 GB on a CPU; weights, gradients and AdamW states make 0.54 GB. Name the two
#    biggest other parts.
# 2. On the miniature, the estimate gives checkpointing far less than "~50 %". Was the claim wrong?
# 3. Why can bf16 autocast *raise* a small step's peak?
# 4. A compiled model keeps recompiling for new batch sizes. Name two cures.

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# 1. The activations saved for backward (1.172 GB, the float32 log-softmax over the vocabulary the largest
#    single tensor) and the framework's baseline (0.440 GB of Python, PyTorch and transformers); then the two
#    logits-sized buffers at the start of backward (0.403 GB).
# 2. No: it depends on the step. Checkpointing removes only the layers' saved activations; the process
#    baseline, the weights, the optimizer states and the loss's buffers stay. Where activations dominate - the
#    whole model at batch 8 × 512 tokens - the estimate more than halves the peak. Where they do not, it can
#    save nothing: find the peak moment first.
# 3. Autocast computes each matrix multiply with a bfloat16 *copy* of the weight, and keeps that copy until
#    backward (2 bytes per parameter on the gradient's path). On a small batch those copies outweigh what the
#    2-byte activations save.
# 4. `torch.compile(model, dynamic=True)`, which compiles shapes as symbols from the start (Dynamo also does it
#    by itself after the first recompile), or padding every batch to one fixed shape.
#
# </details>
#
# ## Recap
#
# - Peak = baseline + weights + optimizer states + saved activations + loss buffers:
#   `python -m course_utils memory --config smollm2-135m --method lora --batch 8 --seq 128 --measure`
#   predicts and checks it.
# - Checkpointing cuts saved activations (one more forward), 8-bit AdamW the states, accumulation the
#   batch's activations; `torch.compile` buys time on stable shapes after a costly first step.
# - GPU peak: `torch.cuda.reset_peak_memory_stats()`, then `torch.cuda.max_memory_allocated()`.
# - Speed claims are about GPUs: time tricks on your machine, after finding the bottleneck.

# %% [markdown]
# ## Going deeper (optional)
#
# The rest of this notebook is for the curious: each trick's measurement explained and in code, what 8-bit
# AdamW keeps, the CPU's 16-bit maths, what the step's activations are and where the estimator's rules come from,
# six steps measured on another CPU, and what the CPU counter reads.
#
# ### Each measurement, explained
#
# The same rows as the table above, each with the claim and why this machine agrees or not:

# %% tags=["nbval-ignore-output"] nbval_reason="verdicts on measured peaks and timings, different on every machine."
for row in tricks.results_table(results):
    print(f"{row['trick']}\n  claim: {row['claim']}\n  here:  {row['measured']}")

# %% [markdown]
# ### Each trick in code
#
# Each trick is a line or two of plain PyTorch, measured with your `step_peak`'s recipe: **reset the peak
# counter, train, read the peak**. On a GPU the counter is PyTorch's allocator; on a CPU, the process's peak
# resident memory (freed memory handed back first, so it tracks live tensors). Two steps each: the first creates
# the optimizer's states. Each cell prints the peak above the memory in use at the reset, before its model
# existed.

# %%
import ctypes
import gc
import platform

import torch
from course_utils import peak
from course_utils.quiet import import_bitsandbytes, quiet_libraries

with quiet_libraries():  # on some CPUs bitsandbytes, imported on the way, prints a notice about an optional package
    from transformers import AutoConfig, AutoModelForCausalLM

GLIBC = platform.libc_ver()[0] == "glibc"  # Linux's usual C library, whose allocator keeps freed memory
if GLIBC:
    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 65536)  # M_MMAP_THRESHOLD: blocks over 64 KiB get memory of their own, returned when freed


def reset_peak():
    """Reset the peak counter; return the memory in use now."""
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    if GLIBC:
        libc.malloc_trim(0)  # hand freed memory back: resident memory then tracks live tensors
    peak.reset_rss_high_water_mark()  # the CPU's stand-in (Linux): the process's peak resident memory
    return peak.rss_high_water_mark_bytes()


def read_peak():
    """The peak since the reset."""
    if DEVICE.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return peak.rss_high_water_mark_bytes()


def mini_model():
    """The miniature, random float32 weights (seed 0)."""
    _ = torch.manual_seed(0)
    config = AutoConfig.for_model(**{**MINI, "use_cache": False})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(DEVICE).train()


def train(model, optimizer, steps=2):
    """``steps`` training steps on random tokens, batch 4 x 256."""
    for _ in range(steps):
        ids = torch.randint(0, MINI["vocab_size"], (4, 256), device=DEVICE)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


model = mini_model()
train(model, torch.optim.AdamW(model.parameters()), steps=1)  # loads the kernels once, before any reading
del model

# %% tags=["nbval-ignore-output"] nbval_reason="a measured peak, different on every machine and run."
start = reset_peak()  # 1. reset the peak counter
model = mini_model()
train(model, torch.optim.AdamW(model.parameters(), lr=1e-4))  # 2. train
print(f"baseline:      {(read_peak() - start) / 1e9:.2f} GB peak above start")  # 3. read the peak

# %% tags=["nbval-ignore-output"] nbval_reason="a measured peak, different on every machine and run."
del model
start = reset_peak()
model = mini_model()
if hasattr(model, "activation_checkpointing_enable"):  # its name since transformers 5
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
else:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
train(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
print(f"checkpointing: {(read_peak() - start) / 1e9:.2f} GB peak above start")

# %% tags=["nbval-ignore-output"] nbval_reason="a measured peak, different on every machine and run."
bnb = import_bitsandbytes()  # None when bitsandbytes is not installed
del model
if bnb is None:
    print("8-bit AdamW skipped: bitsandbytes is not installed (pip install bitsandbytes)")
else:
    start = reset_peak()
    model = mini_model()
    train(model, bnb.optim.AdamW8bit(model.parameters(), lr=1e-4))
    print(f"8-bit AdamW:   {(read_peak() - start) / 1e9:.2f} GB peak above start")
    del model
if GLIBC:
    libc.mallopt(-3, 128 * 1024)  # glibc's default threshold back, as this kernel had it

# %% [markdown]
# ### Your turn: what does 8-bit AdamW keep?
#
# Full fine-tuning of SmolLM2-135M trains 134,515,008 numbers. 8-bit AdamW keeps 2 states of 1 byte per
# number, plus one float32 scale per state for every block of 256 numbers. How many **GB** is that?

# %%
state_gb = ...  # your answer, in GB
lesson.check_adamw8bit_state(state_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# States: 2 × 134,515,008 × 1 byte = 269,030,016 bytes. Scales: 134,515,008 / 256 = 525,450 blocks (rounded
# up), × 2 states × 4 bytes = 4,203,600 bytes. Total 273,233,616 bytes: `state_gb = 0.273`. The estimator
# says 0.2734 GB (the normalization weights, under 4,096 numbers each, stay in float32). AdamW in float32 keeps
# 8 bytes per number, 1.076 GB: 8-bit AdamW saves 0.80 GB here.
#
# </details>

# %% [markdown]
# ### 16-bit maths on this CPU
#
# PyTorch runs 16-bit matrix multiplies fast on a CPU only with bfloat16 instructions: AVX-512-BF16 or AMX on
# x86, the BF16 extension on ARM. Without them it converts and computes in float32, number by number, much
# slower than plain float32. This cell reads this CPU's flags and times one 512 × 512 matrix multiply each way:

# %% tags=["nbval-ignore-output"] nbval_reason="CPU flags and timings, different on every machine."
from torch.utils import benchmark

flags = tricks.cpu_flags() or frozenset()
print("PyTorch's CPU kernels:", torch.backends.cpu.get_cpu_capability(), "| bfloat16 instructions:",
      ", ".join(sorted(tricks.BF16_CPU_FLAGS & flags)) or "none found")
for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(512, 512, dtype=dtype)
    timer = benchmark.Timer("a @ a", globals={"a": a}).blocked_autorange(min_run_time=0.5)
    print(f"{str(dtype):<15} {format_seconds(timer.median):>8} per 512 x 512 matrix multiply")

# %% [markdown]
# - **bf16 autocast** on a CPU speeds up matrix multiplies only where such instructions exist; the rest of
#   the step (loss, norms, optimizer) stays float32. A T4 GPU has no native bfloat16: there the same trick uses
#   float16 with loss scaling, on its float16 tensor cores.
# - **bf16 with checkpointing**: in a reference measurement on a 2-core Intel Xeon cloud CPU, bf16
#   autocast *together with* activation checkpointing made one micro-batch of 2 × 64 tokens about 13× slower
#   (1.9 s instead of 0.15 s with checkpointing alone, 0.09 s with autocast alone).
# - **8-bit AdamW**: on a CPU, bitsandbytes unpacks a tensor's states to float32 for its update, so the
#   optimizer step needs scratch memory and time; a GPU's fused kernel updates in place.
# - **torch.compile** on the miniature: set `TRY_COMPILE_ON_CPU = True` (it gets `tricks.COMPILE_TIMEOUT_S`,
#   five minutes) and run the cell twice: the second run finds the compiled kernels in the on-disk cache.
# - **Memory at scale**: with the full 49,152-word vocabulary and short sequences, the peak can come at the end
#   of backward, where the tied embedding's gradient briefly exists three times.

# %% [markdown]
# ### What the step saves for backward
#
# The step's activations by kind (LoRA, batch 8 × 128):

# %%
arch = Architecture.from_config("smollm2-135m")
acts = step_memory.saved_activations(arch, 8, 128, method="lora")
for kind, nbytes in sorted(acts.by_kind.items(), key=lambda kv: -kv[1]):
    if nbytes >= 1e6:  # the tiny ones (token ids, position tables) left out
        print(f"  {kind:<36} {nbytes / 1e9:6.3f} GB")
print(f"  {'total saved for backward':<36} {acts.total / 1e9:6.3f} GB")

# %% [markdown]
# **SwiGLU** is SmolLM2's gated MLP, SiLU(x W_gate) × (x W_up). Summed over 30 layers the MLPs keep the
# most, but the biggest single tensor is the loss's log-softmax: 49,152 scores for each of 1,024 tokens, in
# float32.
#
# ### Where the activation formula comes from
#
# A 2022 paper by NVIDIA researchers, Korthikanti et al., *Reducing Activation Recomputation in Large
# Transformer Models*, counts one GPT layer's activations in 16-bit training as $sbh\,(34 + 5as/h)$ bytes ($s$
# tokens, batch $b$, hidden size $h$, $a$ heads): $11sbh + 5as^2b$ for attention, $19sbh$ for the MLP, $4sbh$
# for two LayerNorms; with full recomputation (checkpointing) only the layer input stays, $2sbh$. The
# estimator starts there, and departs where SmolLM2 and today's kernels differ:

# %% [markdown]
# | Korthikanti et al. 2022 | SmolLM2 in transformers 5 on PyTorch 2.13 | why |
# | --- | --- | --- |
# | $5as^2b$: scores, softmax, dropout mask | **none** with a fused kernel; $4as^2b$ with the math one | fused attention (SDPA) keeps Q, K, V, the output and one log-sum-exp per head and token, and recomputes the scores in backward; its math fallback keeps the float32 softmax (below) |
# | K and V $h$ wide | $h \cdot 3/9$ wide | grouped-query attention: 3 key/value heads for 9 query heads |
# | GeLU MLP, $4h$ wide, dropout | SwiGLU, $i = 1536$ wide, no dropout | keeps the gate output, its SiLU, the up output (and the down input when its weight trains) |
# | LayerNorm | RMSNorm | keeps its float32 input and one $1/\mathrm{rms}$ per token (and its output when its weight trains) |
# | 2 bytes per number | 4 bytes (float32 training) | bf16 autocast saves 2-byte copies instead - of inputs *and* weights |
# | every linear keeps its input | only linears whose weight trains | LoRA: the frozen base needs no saved inputs |
# | (not counted) | log-softmax over the vocabulary, float32 | $b \cdot s \cdot 49152 \cdot 4$ bytes, plus two more such buffers at the start of backward |
#
# What one layer keeps per token, for full fine-tuning and for LoRA, next to the paper's count for a GPT layer
# of the same width, heads and sequence length (128 tokens):

# %%
tokens = 8 * 128
for method in ("full", "lora"):
    acts = step_memory.saved_activations(arch, 8, 128, method=method)
    per_token = acts.per_layer / tokens
    print(f"{method:<5} {per_token / 4:6.0f} float32 numbers = {per_token:6.0f} bytes per token per layer; "
          f"all 30 layers + head at batch 8 x 128: {acts.total / 1e9:.3f} GB")
k = step_memory.korthikanti_layer_bytes(arch, 8, 128)["no recomputation"] / tokens
print(f"Korthikanti et al. 2022 (16-bit, dropout): {k:6.0f} bytes per token per layer")

# %% [markdown]
# Full fine-tuning keeps $8h + 2h_{kv} + 4i$ numbers per token and layer, plus $a = 9$ log-sum-exps and two
# $1/\mathrm{rms}$: 11,147 numbers. LoRA keeps $5h + 2h_{kv} + 3i + 2r$ plus the same small terms: 7,899 -
# the frozen weights' inputs are not needed. The paper's $sbh(34 + 5as/h)$ gives $(34 + 10) \cdot 576 =$
# 25,344 bytes: at 2 bytes per number our full count would be 22,294 bytes - no $s \times s$ tensors and no
# dropout masks, but a wider MLP. Training in float32 doubles it.
#
# ### When attention keeps the $s \times s$ scores
#
# PyTorch picks an attention kernel at every call. Flash attention needs 16-bit inputs and an Ampere-or-newer
# GPU; the memory-efficient kernel takes no grouped-query heads. Where neither fits (a T4; float32 attention
# on any GPU) the *math* kernel runs and keeps each layer's softmax in float32: $4 \cdot a s^2 b$ bytes. The
# estimate picks the kernel per card and names it. **Predict:** LoRA on a 16-bit base, 4 × 1,024 tokens: how
# much more does a T4 keep than an A100?

# %%
from course_utils import datasheets

for card in ("T4", "A100"):
    capability = datasheets.lookup(card).capability
    e = step_memory.estimate_step("smollm2-135m", method="lora-bf16", batch=4, seq=1024, device="cuda",
                                  capability=capability)
    print(f"{card:<5} {e.attention.backend:<6} attention: activations {e.activations.total / 1e9:5.2f} GB, "
          f"peak {e.peak_gb:5.2f} GB")

# %% [markdown]
# The T4 keeps 30 layers × 4 × 9 heads × 1,024² float32 scores more, 4.5 GB, plus float32 copies of Q, K and V.
# `python -m course_utils memory --config smollm2-135m --method lora-bf16 --batch 4 --seq 1024 --gpu T4,A100`
# prints both estimates. On a GPU, `scripts/gpu_check.py` records the kernel that really ran.
#
# ### Six steps measured on another CPU
#
# Two parts of a CPU estimate are constants, not counts: the framework **baseline** (`CPU_BASELINE_BYTES`: the
# process after its imports) and **runtime** (`CPU_RUNTIME_BYTES`: what the process holds after a first step
# besides tensors - kernels' machine code, thread pools, allocator caches). Both were measured on a reference
# machine, a 2-core Intel Xeon cloud CPU, so a comparison there is partly in-sample. The file below holds six
# steps (LoRA and full fine-tuning, batch 1, 4 and 8 × 128 tokens) measured on another machine, named in the
# file, each next to today's estimate:

# %%
from course_utils import sweeps

print(f"constants: baseline {step_memory.CPU_BASELINE_BYTES / 1e9:.3f} GB, "
      f"runtime {step_memory.CPU_RUNTIME_BYTES / 1e9:.3f} GB")
sweep = sweeps.load()
print("measured on:", sweep.machine_line())
compared = sweep.compare()
print(f"{'case':<8} {'estimate':>8} {'measured':>8} {'error':>7} {'in step: estimate / measured':>29} {'baseline':>9}")
for c in compared:
    print(f"{c.label:<8} {c.estimate_gb:8.3f} {c.measured_gb:8.3f} {c.error_pct:+6.1f} % "
          f"{c.in_step_estimate_gb:18.3f} / {c.in_step_measured_gb:.3f} {c.baseline_gb:9.3f}")
worst = sweeps.largest_error_pct(compared)
within = abs(worst) <= sweeps.TOLERANCE_PCT
print(f"largest error {worst:+.1f} %; within the stated {sweeps.TOLERANCE_PCT:g} %: {within}")

# %% [markdown]
# Figures in GB. "In step" is the peak less what the step started with: for the estimate, baseline, runtime,
# weights and optimizer states; for the measurement, the memory in use when the measured step began. Where
# those agree and the peaks do not, the constants are off, not the counting. The last column is the baseline
# measured on that machine, next to the constant above.

# %%
cases = [(c.label, c.estimate_gb, c.measured_gb) for c in compared]
lesson.plot_estimate_vs_measured(cases, "SmolLM2-135M training step: predicted vs measured peak (stored sweep)")
plt.show()

# %% [markdown]
# **Text description of the chart.** Six pairs of bars, one pair per case (LoRA and full fine-tuning at batch
# 1, 4 and 8, 128 tokens): the blue bar is today's estimate, the orange bar the stored measured peak. The two
# bars of each pair differ by at most the largest error printed above.
#
# Measuring the six steps takes several minutes of CPU, so the notebook reads them from the file.
# `scripts/memory_sweep.py` measures your machine (a fresh process per step, a warm-up step, then one measured
# step). It is in the course's repository, not in the installed package: clone it first (on Colab too, in a
# cell starting with `!`):

# %%
from course_utils import about

print(f"git clone https://github.com/{about.REPO}.git && cd {about.REPO.split('/')[1]} && "
      "python scripts/memory_sweep.py --methods lora,full --batches 1,4,8 --seqs 128 --checkpointing off "
      "--out my-sweep.json")

# %% [markdown]
# ### What the CPU counter reads
#
# On a CPU there is no allocator counter. The measurement reads the child process's peak resident memory:
# Linux's `VmHWM` line in `/proc/self/status`, reset at the start of the measured step. glibc's allocator keeps
# freed memory by default, so the child sets `MALLOC_MMAP_THRESHOLD_=65536`: then freed tensors go back to the
# system and resident memory tracks the live tensors. The measurement says so itself:

# %% tags=["nbval-ignore-output"] nbval_reason="the counter's description depends on the device and the operating system."
print(m.what)

# %% [markdown]
# ### Another budget, another bottleneck
#
# LoRA on Qwen2.5-1.5B at 1,024 tokens on a 16 GB GPU: LoRA already shrinks the optimizer states, so the saved
# activations and the loss's buffers are what is left, and only smaller micro-batches fit:

# %%
diag = bottleneck.what_is_my_bottleneck("qwen2.5-1.5b-instruct", "lora", batch=8, budget_gb=16.0, seq=1024)
print(diag.text())

# %% [markdown]
# ### transformers 4 and 5
#
# transformers 5 removed `warmup_ratio` and reads a float below 1 in `warmup_steps` as a ratio; transformers 4
# (still installed on some hosted notebooks) accepts only a whole number of steps in `warmup_steps`. A count of
# steps means the same in both, so for a run of known length the helper writes 3 % of the steps, rounded up.
# transformers 5 also renames `gradient_checkpointing` to `activation_checkpointing`. And `bf16=True` needs
# bfloat16 hardware: on a GPU without it (a T4) the helper switches to `fp16=True`, float16 with loss scaling,
# and on a CPU without bfloat16 instructions to float32.
