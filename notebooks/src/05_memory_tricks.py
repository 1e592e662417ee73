# %% [markdown]
# # Three more memory tricks, measured
#
# Notebook 04 ended with a warning: the estimate fits, the run does not. Its estimate for a LoRA step on
# SmolLM2-135M was 0.54 GB; the training process peaked at 1.88 GB. This notebook closes that gap, then
# measures three more tricks that move a training step under a memory budget. No GPU needed: on a CPU the
# cells train small models for real; on a GPU they measure with the CUDA counters.

# %% [markdown]
# **What you will be able to do**
# - predict the peak memory of a whole training step from a model's `config.json`, and check it against a
#   measured step;
# - measure gradient checkpointing, 8-bit AdamW, `torch.compile`, 16-bit autocast and gradient accumulation,
#   and say which of the usual claims hold on your machine, and why;
# - read a step's peak memory with PyTorch's own counters;
# - read and run a memory-efficient `TrainingArguments`;
# - name what does not fit a budget, and which trick moves it under at what cost in time.

# %% [setup] extras=["peft", "transformers"]

# %% [markdown]
# ## Why: where did the other 1.3 GB go?
#
# A training step holds more than weights, gradients and optimizer states. Backward needs numbers that
# forward computed - the **activations saved for backward** - and they grow with the batch and the sequence
# length. Backward also makes a few large **temporary buffers**, and the program itself (Python, PyTorch,
# transformers) holds memory before the model exists.
#
# Three more tricks are often recommended for training in less memory, each with a claim. We will test every
# claim on a real step:

# %%
from course_utils import tricks

for key, trick in tricks.TRICKS.items():
    if key != "baseline":
        print(f"{trick.label:<42} claim: {trick.claim}")

# %% [markdown]
# ## How it works: everything a training step holds
#
# At its worst moment, a step holds six kinds of memory:
#
# 1. **the framework's baseline**: the process after `import torch, transformers` (on a GPU: the CUDA context,
#    which PyTorch's counter does not see);
# 2. **weights**: 4 bytes per number in float32, 2 in bfloat16, about 0.56 in 4-bit NF4;
# 3. **optimizer states**: AdamW keeps 2 float32 numbers (8 bytes) per *trained* number; 8-bit AdamW about 2;
# 4. **gradients**: 4 bytes per trained number, from backward until the optimizer step;
# 5. **activations saved for backward**: what each operation needs to compute its gradient;
# 6. **transient buffers**: short-lived tensors, the largest being the gradient of the logits.
#
# Notebook 04 counted parts 2-4.

# %% [markdown]
# `course_utils.step_memory` walks the model's forward pass and counts what autograd keeps: an operation saves
# a tensor only when its gradient formula needs it and a gradient must flow through it. (Where the rules come
# from, and how they differ from the classic formula for GPT layers, is in "Going deeper" after the recap.)
# Here is SmolLM2's architecture, read from its `config.json`, and where the saved bytes go for a LoRA step
# (rank 8 on `q_proj` and `v_proj`) at batch 8 × 128 tokens:

# %%
from course_utils import step_memory as sm
from course_utils.architecture import Architecture

arch = Architecture.from_config("smollm2-135m")
print(f"{arch.params:,} parameters; {arch.layers} layers, hidden {arch.hidden}, MLP {arch.intermediate}, "
      f"{arch.heads} heads ({arch.kv_heads} key/value heads of {arch.head_dim}), vocabulary {arch.vocab:,}")
acts = sm.saved_activations(arch, 8, 128, method="lora")
for kind, nbytes in sorted(acts.by_kind.items(), key=lambda kv: -kv[1]):
    print(f"  {kind:<40} {nbytes / 1e9:6.3f} GB")
print(f"  {'total saved for backward':<40} {acts.total / 1e9:6.3f} GB")

# %% [markdown]
# The biggest single item is not in any layer: the log-softmax of the loss, over all 49,152 vocabulary
# entries for each of the 1,024 tokens, in float32 (0.20 GB).
#
# ### Predict before you measure
#
# LoRA rank 8, batch **1** × 128 tokens, AdamW, float32. Notebook 04's estimate (weights + adapter gradients +
# AdamW) is 0.54 GB. **Write down your guess for the measured peak** before running the next two cells. The
# estimate is made for the device the measurement will use: on a CPU it includes the process's baseline, on a
# GPU it predicts PyTorch's allocator counter, which has none.

# %%
from course_utils.hardware import pick_device

DEVICE = pick_device()  # one decision for the estimate and the measurement: the GPU if there is one
est = sm.estimate_step("smollm2-135m", method="lora", batch=1, seq=128, device=DEVICE.type)
print(est.format())

# %% [markdown]
# The prediction has a **peak moment**: the start of backward, when the loss's gradient over the vocabulary
# is made. Then the step holds the baseline, the weights, the (tiny) adapter states, every saved activation
# and two logits-sized float32 buffers (the loss's gradient and the logits' gradient).
#
# Now the measurement. `measure_training_step` builds the architecture with random weights in a fresh child
# process, runs one warm-up step (so the optimizer states exist), and measures the next step's peak: on a GPU
# with PyTorch's allocator counter, on a CPU as the child's peak memory, its baseline included.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a measured peak and a timing, different on every machine and run.
from course_utils.measure import measure_training_step
from course_utils.progress import status

status("Measuring one LoRA training step of SmolLM2-135M (batch 1 x 128 tokens) in a fresh process …")
m = measure_training_step("smollm2-135m", method="lora", batch=1, seq=128, device=DEVICE, timeout_s=280)
print(f"baseline {m.baseline_bytes / 1e9:.3f} GB, weights {m.weights_bytes / 1e9:.3f} GB, "
      f"saved activations {m.saved_activations_bytes / 1e9:.3f} GB (estimate {est.activations.total / 1e9:.3f}), "
      f"step {m.step_seconds:.1f} s")
print(sm.comparison_line(est.peak_bytes, m.peak_bytes))

# %% [markdown]
# The last line is this machine's error. On a 2-core cloud CPU, a sweep of six such steps (LoRA and full
# fine-tuning, batch 1 to 8) was within 1.5 % of the estimate every time; its table is in "Going deeper".
#
# That closes notebook 04's gap. Its LoRA run measured 1.88 GB with its own data and sequence lengths. At
# batch 8 × 128 random tokens the same sweep measured 2.63 GB, and the estimate says why: on top of 0.54 GB of
# weights and 0.44 GB of baseline, 1.17 GB of saved activations and 0.40 GB of loss buffers.
#
# ## Interactive demo: what is my bottleneck?
#
# The estimate answers "will it fit?" before you start. The planner below does it on a GPU's terms (PyTorch's
# allocator counter, so no process baseline): pick a model, a method, a batch, a sequence length and a budget.
# It names the biggest parts of the predicted peak and the tricks that move the step under the budget.

# %%
from course_utils.widgets.tricks import bottleneck_view

_ = bottleneck_view("smollm2-135m", "full", batch=16, seq=512, budget_gb=8.0, show_chart=False)

# %% [markdown]
# Each option's time factor comes from a step's arithmetic: forward counts 1, backward 2 when the weights
# train (or about 1 when they are frozen), and checkpointing adds one forward: 4/3 for full fine-tuning, close
# to the claimed "~30 %". Accumulation does the same arithmetic in more, smaller steps, so the arithmetic gives
# only a floor, "x1.00 or more": each step adds fixed work, and a small micro-batch uses the hardware less well.
# How much slower is a measurement, and the next section makes it.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget (nbval has no widget front end).
from course_utils.widgets.tricks import bottleneck_planner

bottleneck_planner()

# %% [markdown]
# Try: SmolLM2 full fine-tuning at batch 16 × 512 on 8 GB, then switch on checkpointing; Qwen2.5-1.5B (a
# 1.5-billion-parameter model) with LoRA at 1024 tokens on 16 GB; the same with `qlora`. Watch which part is
# the biggest: at long sequences it is the activations, for big models with full fine-tuning the optimizer
# states.
#
# ## Benefits and trade-offs: each trick on a real step
#
# Now the claims. One training step per trick, full fine-tuning (so the optimizer's states are big enough for
# 8-bit AdamW to matter), batch 4 × 256 tokens.

# %% [markdown] slide="notes"
# To keep the measurements short on a laptop CPU, the model is a **miniature of SmolLM2-135M**: the same layers
# (widths 576 and 1536, 9 heads, 3 key/value heads, SwiGLU, RMSNorm, tied embeddings), but 4 of its 30 layers
# and a vocabulary of 8,192 instead of 49,152 - 18.9 M parameters. With the full vocabulary a small step's
# memory is all about the embedding and the loss; with the smaller one, the step looks like a big model's step
# in miniature. Afterwards the estimate scales the results back up to the real model.

# %% [markdown]
# **Predict first**: which trick will lower the peak most here, and which will speed the step up? (The
# estimates are for this machine's device, like the measurements after them.)

# %%
from course_utils.configs import read_config

MINI = read_config("smollm2-135m")
MINI.update(num_hidden_layers=4, vocab_size=8192)
BASE = {"method": "full", "batch": 4, "seq": 256}
print(f"{Architecture.from_config(MINI).params:,} parameters")
for key in ("baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"):
    kwargs = tricks.trick_kwargs(key, BASE)
    print(f"{tricks.TRICKS[key].label:<42} estimate {tricks.estimate_for(kwargs, MINI, DEVICE) / 1e9:.2f} GB")

# %% [markdown]
# The five measurements share one child process, bounded in time, and each step runs in a fresh copy of it,
# so every peak is that step's alone. The 16-bit trick autocasts to bfloat16, or to float16 with loss scaling
# on a GPU without native bfloat16 (a T4). `torch.compile` (which the estimate does not model) compiles the
# forward and backward first: on a GPU it gets 60 seconds, then its row says *skipped*, so a slow machine
# cannot stall a class; on a CPU compiling takes minutes, so it runs only with `TRY_COMPILE_ON_CPU = True`.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: measured peaks and timings, different on every machine and run.
TRY_COMPILE_ON_CPU = False
status("Measuring 5 training steps of the miniature, one per trick: baseline, checkpointing, 16-bit autocast, "
       "8-bit AdamW, accumulation …")
results = tricks.measure_tricks(MINI, BASE, ["baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"],
                                timeout_s=280, device=DEVICE)
status("Measuring torch.compile (a CPU skips it unless TRY_COMPILE_ON_CPU) …")
results += tricks.measure_tricks(MINI, BASE, ["compile"], compile_timeout_s=60, device=DEVICE,
                                 compile_on_cpu=TRY_COMPILE_ON_CPU)
for row in results:
    print(f"{row.label:<42} " + (row.skipped or f"measured {row.peak_gb:.2f} GB, {row.step_seconds:.2f} s per step"))

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the table and chart of measured peaks and timings.
import matplotlib.pyplot as plt
from course_utils.plots import tricks as tplots

for row in tricks.results_table(results):
    print(f"{row['trick']:<40} estimate {row['estimate GB']} GB | measured {row['peak GB']} GB, {row['step s']} s"
          f"\n    claim: {row['claim']}\n    here:  {row['measured']}")
tplots.tricks_chart(results)
plt.show()
print(tplots.describe_tricks_chart(results))

# %% [markdown]
# **Text description of the chart.** Two horizontal bar charts share one row per trick (baseline, gradient
# checkpointing, 16-bit autocast, 8-bit AdamW, gradient accumulation with 4 micro-batches, torch.compile).
# The left chart gives each trick's measured peak memory in GB, the right chart its step time in seconds;
# this run's numbers are printed under the chart. The peaks follow the estimates printed before the
# measurements. Step times on a shared laptop are noisy: compare them only on a quiet machine, over several
# steps.
#
# ### What the measurements say about the claims
#
# Read the peaks against the estimates. On a CPU, about 0.44 GB of every peak is the process's baseline (a
# GPU's allocator counter leaves it out), which no trick touches, and 0.23 GB more is the float32 weights
# (0.08 GB) and AdamW states (0.15 GB), held all along.

# %% [markdown]
# - **Gradient checkpointing: "~50 % memory at ~30 % speed cost".** It removes the layers' saved activations
#   (predicted 0.22 → 0.05 GB): the peak falls by about a sixth, a third without the baseline. Not 50 %: the
#   baseline, the weights, the optimizer states and the loss's buffers stay. It costs one extra forward.
# - **8-bit AdamW: "saves a lot when training big models".** The states go from 8.00 to about 2.03 bytes per
#   trained number, counted from the tensors (0.15 → 0.04 GB).
# - **bf16 autocast: "roughly 2× speed".** The 2× is for GPUs with bfloat16 tensor cores; on a CPU only some
#   processors speed up. The peak hardly moves: activations shrink to 2 bytes, but autocast keeps a 16-bit
#   copy of every weight on the gradient's path until backward.

# %% [markdown]
# - **torch.compile: "1.2-1.5× on stable shapes".** If it finished within its budget, compare its step time
#   with the baseline's, on a quiet machine. Its first step contains the compilation.
# - **Gradient accumulation**: the same 4 × 256 tokens per optimizer step, in 4 micro-batches of 1 × 256. Each
#   micro-batch saves a quarter of the activations, but the gradients now stay in memory from one micro-batch
#   to the next, and the 4 steps run one after another: the planner's "x1.00 or more" is the arithmetic, the
#   row above is what it cost here.
#
# Where do the tricks pay off? Ask the estimate about the whole 30-layer model at batch 8 × 512 tokens, on a
# GPU:

# %%
AT_SCALE = {"method": "full", "batch": 8, "seq": 512}
for key in ("baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"):
    e = tricks.estimate_step_for(tricks.trick_kwargs(key, AT_SCALE), "smollm2-135m", device="cuda")
    print(f"{tricks.TRICKS[key].label:<42} {e.peak_gb:5.2f} GB   peak at the {e.peak_moment}")

# %% [markdown]
# Here the layers' saved activations are most of the step, so checkpointing cuts the peak by more than half -
# the claim, in the setting it was made for - and so do 4 micro-batches. 8-bit AdamW saves 0.8 GB (6 bytes ×
# 134.5 M parameters), a modest share for a model this small; for a 7-billion-parameter model it would be
# 42 GB. bf16 saves less than half of the activation memory, because of the weight copies. Find the peak
# moment first: where the peak comes at the end of backward, no activation trick helps.
#
# ### Your turn: what does checkpointing keep?
#
# With checkpointing, each of SmolLM2's 30 layers keeps only its input for backward: batch × tokens × hidden
# size numbers (hidden size 576), and recomputes the rest. For full fine-tuning in float32 at batch 8 × 512
# tokens, how many **GB** (10⁹ bytes) do the 30 kept layer inputs take? Work it out by hand, then write it.

# %%
from course_utils.exercises.tricks import check_adamw8bit_state, check_checkpointed_inputs, check_kwame_choice

kept_gb = ...  # your answer, in GB
check_checkpointed_inputs(kept_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# One layer's input: 8 × 512 tokens × 576 numbers × 4 bytes = 9,437,184 bytes. Thirty of them: 283,115,520
# bytes, so `kept_gb = 0.283`. The estimator counts the same:
# `sm.saved_activations(arch, 8, 512, method="full", checkpointing=True).by_kind["checkpointed layer inputs"]`.
# Without checkpointing the same step saves 6.31 GB; with it, 1.12 GB, because the float32 log-softmax over
# the vocabulary (0.81 GB) is outside the layers and stays. That is the 9.54 → 4.34 GB above.
#
# </details>
#
# ## In practice: a memory-efficient `TrainingArguments`
#
# A common recipe switches several tricks on at once in one `TrainingArguments`, the settings object of the
# Hugging Face `Trainer`. Here it is, one line at a time:

# %%
for name, value, meaning in tricks.LESSON_TRAINING_ARGUMENTS:
    print(f"{name:<28} = {value!r:<14} {meaning}")

# %% [markdown]
# Two notes before running it. The effective batch is $2 \times 8 = 16$ examples per optimizer step on one
# GPU. `eval_steps=500` does nothing on its own: evaluation also needs `eval_strategy="steps"` and an
# evaluation dataset.
#
# Libraries move, so the helper builds the arguments for the installed transformers and this machine, and
# lists every change it made: a warm-up written as a count of steps, the new name of checkpointing, and fp16
# on a GPU without bfloat16 ("Going deeper" says why).

# %%
import tempfile

out_dir = tempfile.mkdtemp(prefix="course05-")
args, changes = tricks.memory_efficient_training_arguments(out_dir, max_steps=2)
print(f"effective batch {args.per_device_train_batch_size * args.gradient_accumulation_steps}, "
      f"checkpointing={tricks.checkpointing_enabled(args)}, warmup_steps={args.warmup_steps}")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the 16-bit format and the optimizer depend on the machine (GPU generation, bitsandbytes build).
for change in changes:
    print("-", change)
print(f"bf16={args.bf16}, fp16={args.fp16}, optim={args.optim.value}")

# %% [markdown]
# Now two real optimizer steps with these arguments: 8-bit AdamW from bitsandbytes (the library behind 8-bit
# optimizers and 4-bit weights), 16-bit autocast, activation checkpointing, 8 micro-batches of 2 examples per
# step, 64-token random sequences. On a GPU the model is SmolLM2-135M's architecture; on a CPU it is the
# miniature above.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: losses, time and peak memory of a real run vary with the machine.
demo_model = "smollm2-135m" if DEVICE.type == "cuda" else MINI
status("Training 2 optimizer steps (16 micro-batches of 2 x 64 tokens) with the Trainer …")
run = tricks.run_trainer_steps(demo_model, args, batch_examples=32, seq=64)
print(f"{run['steps']} optimizer steps in {run['seconds']:.1f} s; losses {run['losses']}")
print(f"peak {run['peak'].gb:.2f} GB - {run['peak'].what}")

# %% [markdown]
# With random weights the loss starts near the loss of a uniform guess over the vocabulary: $\ln 8192 \approx
# 9.0$ for the miniature ($\ln 49152 \approx 10.8$ for SmolLM2). Every switch in these arguments is right for
# a recent GPU; on another machine, time each one before keeping it.
#
# ### Peak memory: the three lines
#
# The peak above came from PyTorch's counters. On a GPU it takes three lines: reset the peak counter, run the
# work, read the peak (with `synchronize` so the GPU has finished). They count GPU memory only, so on a CPU the
# cell says so and runs the CPU stand-in instead: the process's peak resident memory.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: measured peaks, different on every machine; on a CPU the GPU lines are skipped.
import torch
from course_utils import peak as cpu_peak


def work(device):
    return torch.ones(25_000_000, device=device).sum()  # a 100 MB tensor, freed when the call returns


if DEVICE.type == "cuda":
    torch.cuda.synchronize()  # let earlier GPU work finish
    torch.cuda.reset_peak_memory_stats()  # 1. reset the peak counter
    start = torch.cuda.memory_allocated()
    work(DEVICE)  # 2. the work
    torch.cuda.synchronize()
    added = torch.cuda.max_memory_allocated() - start  # 3. read the peak
    print(f"torch.cuda.max_memory_allocated: the work added {added / 1e6:.0f} MB at its peak")
else:
    print("No CUDA GPU: skipped torch.cuda.reset_peak_memory_stats() and max_memory_allocated(), which count GPU "
          "memory only; running their CPU equivalent from course_utils.peak instead.")
    if not cpu_peak.reset_rss_high_water_mark():  # 1. reset the process's peak resident memory (Linux only)
        print("This system cannot reset the peak: the figure below counts from the kernel's start, not the work's.")
    start = cpu_peak.current_rss_bytes()
    work("cpu")  # 2. the work
    added = cpu_peak.rss_high_water_mark_bytes() - start  # 3. read the peak
    print(f"CPU equivalent (peak resident memory of this process): the work added {added / 1e6:.0f} MB at its peak")

# %% [markdown]
# `course_utils.peak.measure_peak` wraps exactly these lines for any device, and says which counter it read:

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a measured peak, different on every machine.
from course_utils.peak import measure_peak

_, peak = measure_peak(lambda: work(DEVICE), device=DEVICE)
print(peak.what)
print(f"the helper: the work added {peak.added_bytes / 1e6:.0f} MB at its peak (the lines above: {added / 1e6:.0f} MB)")

# %% [markdown]
# ### Your turn: what does 8-bit AdamW keep?
#
# Full fine-tuning of SmolLM2-135M trains all 134,515,008 numbers. 8-bit AdamW keeps 2 states per trained
# number at 1 byte each, and each state also keeps one float32 scale for every block of 256 numbers. How many
# **GB** of optimizer states is that? (Ignore the few tiny tensors that stay in float32.)

# %%
state_gb = ...  # your answer, in GB
check_adamw8bit_state(state_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# States: 2 × 134,515,008 × 1 byte = 269,030,016 bytes. Scales: 134,515,008 / 256 = 525,450 blocks (rounded
# up), × 2 states × 4 bytes = 4,203,600 bytes. Total 273,233,616 bytes: `state_gb = 0.273`. The estimator
# says 0.2734 GB (the normalization weights, under 4,096 numbers each, stay in float32). AdamW in float32 keeps
# 8 bytes per number, 1.076 GB: 8-bit AdamW saves 0.80 GB here.
#
# </details>
#
# ## Comparing the tricks
#
# The comparison table of notebooks 01-03 covered quantization, mixed precision and gradient accumulation;
# this notebook's three tricks follow in the same columns:

# %%
from IPython.display import Markdown

Markdown(tricks.comparison_table())

# %% [markdown]
# Optimization is a trade between memory, speed, quality and cost, so there is no single best trick. The
# useful question is: **what is my bottleneck, and what am I willing to trade to remove it?**
# `what_is_my_bottleneck` answers the first half with the estimate, and lists the trades. A new method changes
# *what* is trained, so options that keep the method come first:

# %%
from course_utils import bottleneck

diag = bottleneck.what_is_my_bottleneck("qwen2.5-1.5b-instruct", "lora", batch=8, budget_gb=16.0, seq=1024)
print(diag.text())

# %% [markdown]
# ## Run it yourself
#
# ### Your turn: one change for Kwame
#
# Kwame, from notebook 04, now has a 24 GB GPU and wants full fine-tuning of Qwen2.5-1.5B (config
# `qwen2.5-1.5b-instruct`) at batch 8 × 512 tokens. First guess which two parts of the step are the largest.
# Then ask `bottleneck.what_is_my_bottleneck(...)` and pick the one change that fits 24 GB and keeps full
# fine-tuning: `"checkpointing"`, `"8-bit AdamW"`, `"bf16 autocast"`, `"accumulation"` or
# `"checkpointing + 8-bit AdamW"`.

# %%
choice = ...  # one of the five strings above
check_kwame_choice(choice)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# diag = bottleneck.what_is_my_bottleneck("qwen2.5-1.5b-instruct", "full", batch=8, budget_gb=24.0, seq=512)
# print(diag.text())
# ```
#
# The estimate is 48.4 GB, 24.4 GB over. The biggest parts at the peak: the activations saved for backward
# (24.9 GB: 28 layers × 4,096 tokens, plus a 151,936-word vocabulary's log-softmax) and the AdamW states
# (12.4 GB: 8 bytes × 1.54 billion parameters), then the float32 weights (6.2 GB). So `choice =
# "checkpointing + 8-bit AdamW"`: 17.6 GB, about 1.33× the time (one extra forward). Neither trick alone is
# enough: checkpointing removes the activations but leaves 12.4 GB of states; 8-bit AdamW needs micro-batches
# of 2 (4 accumulation steps) as well, at x1.00 or more. Switching to LoRA on a bf16 base (20.4 GB) would also
# fit, but then you train something else.
#
# </details>
#
# ## Knowledge check
#
# 1. At batch 8 × 128 tokens, a LoRA step on SmolLM2 peaked at 2.63 GB on a 2-core CPU, but the weights,
#    gradients and AdamW states add up to 0.54 GB. Name the two biggest other parts.
# 2. For the miniature step, the CPU estimate says checkpointing lowers the peak by 17 % (1.00 → 0.83 GB),
#    about a sixth, not a half. Was the claim of "~50 %" wrong?
# 3. Why can bf16 autocast *raise* the peak memory of a small training step?

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# 1. The activations saved for backward (1.17 GB, of which 0.20 GB is the float32 log-softmax over the
#    vocabulary) and the framework's baseline (0.44 GB of Python, PyTorch and transformers); then the two
#    logits-sized buffers at the start of backward (0.40 GB).
# 2. No: it depends on the step. Checkpointing removes only the layers' saved activations; the process
#    baseline, the weights, the optimizer states and the loss's buffers stay. Where activations dominate - the
#    whole model at batch 8 × 512 tokens - the estimate gives 9.54 → 4.34 GB (−55 %). Where they do not, it
#    can save nothing: find the peak moment first.
# 3. Autocast computes each matrix multiply with a bfloat16 *copy* of the weight, and keeps that copy until
#    backward (2 bytes per parameter on the gradient's path). On a small batch those copies outweigh what the
#    2-byte activations save.
#
# </details>
#
# ## Recap
#
# - A training step's peak = baseline + weights + optimizer states + (at the worst moment) saved activations
#   and the loss's buffers, or all gradients and the optimizer's scratch. `python -m course_utils memory
#   --config smollm2-135m --method lora --batch 8 --seq 128 --measure` predicts it and checks it.
# - Counting what autograd saves predicted six measured CPU peaks within 1.5 %.
# - Each trick attacks one part: checkpointing the activations (one more forward), 8-bit AdamW the optimizer
#   states (8 → 2 bytes per trained number), accumulation the batch's activations (more, smaller steps: x1.00
#   of the time or more), bf16 the activations' bytes (but adds weight copies), `torch.compile` the time.
# - On a GPU, `reset_peak_memory_stats()` then `max_memory_allocated()` read a step's peak.
# - Before choosing a trick, find the bottleneck: which part is the biggest at the peak moment.

# %% [markdown]
# ## Going deeper (optional)
#
# The rest of this notebook is for the curious: where the estimator's rules come from, the sweep that checked
# it, what the CPU counter reads, and why some tricks behave differently on a CPU.
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
# | $5as^2b$: scores, softmax, dropout mask | **none** | fused attention (SDPA) keeps Q, K, V, the output and one log-sum-exp per head and token; it recomputes the scores in backward |
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
    acts = sm.saved_activations(arch, 8, 128, method=method)
    per_token = acts.per_layer / tokens
    print(f"{method:<5} {per_token / 4:6.0f} float32 numbers = {per_token:6.0f} bytes per token per layer; "
          f"all 30 layers + head at batch 8 x 128: {acts.total / 1e9:.3f} GB")
k = sm.korthikanti_layer_bytes(arch, 8, 128)["no recomputation"] / tokens
print(f"Korthikanti et al. 2022 (16-bit, dropout): {k:6.0f} bytes per token per layer")

# %% [markdown]
# Full fine-tuning keeps $8h + 2h_{kv} + 4i$ numbers per token and layer, plus $a = 9$ log-sum-exps and two
# $1/\mathrm{rms}$: 11,147 numbers. LoRA keeps $5h + 2h_{kv} + 3i + 2r$ plus the same small terms: 7,899 -
# the frozen weights' inputs are not needed. The paper's $sbh(34 + 5as/h)$ gives $(34 + 10) \cdot 576 =$
# 25,344 bytes: at 2 bytes per number our full count would be 22,294 bytes - no $s \times s$ tensors and no
# dropout masks, but a wider MLP. Training in float32 doubles it.
#
# ### Six cases: estimate vs measured
#
# The estimates for full fine-tuning and LoRA at batch 1, 4 and 8 (128 tokens each), for a CPU process - the
# device of the reference measurement they are compared with:

# %%
CASES = [(method, batch) for method in ("lora", "full") for batch in (1, 4, 8)]
estimates = {}
for method, batch in CASES:
    e = sm.estimate_step("smollm2-135m", method=method, batch=batch, seq=128, device="cpu")
    estimates[method, batch] = e.peak_gb
    print(f"{method:<5} batch {batch}: {e.peak_gb:.2f} GB, peak at the {e.peak_moment}")

# %% [markdown]
# Measuring all six takes several minutes of CPU (full fine-tuning at batch 8 runs about 2 GB of tensors
# through 30 layers), so the notebook does not do it; you can, with
# `python scripts/memory_sweep.py --methods lora,full --batches 1,4,8 --seqs 128 --checkpointing off` from the
# repository (same method as above: a fresh process per case, a warm-up step, then one measured step).

# %% [markdown]
# **Reference measurement**, taken once on a 2-core Intel Xeon cloud CPU with PyTorch 2.13 and transformers 5.24
# (not this machine), next to today's estimate:
#
# | method | batch | estimate GB | measured GB | error | what changes during the step: estimate / measured | runtime memory |
# | --- | ---: | ---: | ---: | ---: | ---: | ---: |
# | LoRA | 1 | 1.225 | 1.221 | +0.3 % | 0.197 / 0.200 GB | 0.033 GB |
# | LoRA | 4 | 1.816 | 1.838 | −1.2 % | 0.787 / 0.788 GB | 0.062 GB |
# | LoRA | 8 | 2.603 | 2.625 | −0.8 % | 1.575 / 1.574 GB | 0.062 GB |
# | full | 1 | 2.864 | 2.856 | +0.3 % | 0.765 / 0.767 GB | 0.030 GB |
# | full | 4 | 3.090 | 3.108 | −0.6 % | 0.991 / 0.993 GB | 0.057 GB |
# | full | 8 | 4.080 | 4.099 | −0.5 % | 1.981 / 1.982 GB | 0.058 GB |

# %% [markdown]
# Every case is within 1.5 %. The column "what changes during the step" compares the predicted peak minus what
# is held all along (baseline, runtime, weights, optimizer states) with the measured peak minus the memory in
# use when the measured step began: they agree within 0.4 %. What is left is the last column: memory the
# process holds *after* its first step besides tensors - machine code of the kernels that step loaded, thread
# pools, allocator caches - 30-60 MB here. The estimate counts it as one constant, 45 MB on a CPU (the line
# "framework runtime" above), so it is a little high when the runtime is small and a little low when it is
# large.

# %%
SWEEP_MEASURED = {("lora", 1): 1.221, ("lora", 4): 1.838, ("lora", 8): 2.625,
                  ("full", 1): 2.856, ("full", 4): 3.108, ("full", 8): 4.099}  # GB, the reference table above
cases = [(f"{m} b{b}", estimates[m, b], SWEEP_MEASURED[m, b]) for m, b in CASES]
tplots.estimate_vs_measured_chart(cases, "SmolLM2-135M training step: predicted vs measured peak (reference CPU)")
plt.show()

# %% [markdown]
# **Text description of the chart.** Six pairs of bars, one pair per case (LoRA and full fine-tuning at batch
# 1, 4 and 8, 128 tokens); the blue bar is the estimate, the orange bar the reference CPU's measured peak.
# LoRA: 1.23 vs 1.22 GB, 1.82 vs 1.84 GB, 2.60 vs 2.63 GB. Full: 2.86 vs 2.86 GB, 3.09 vs 3.11 GB, 4.08 vs
# 4.10 GB. The two bars of each pair differ by at most 0.02 GB.
#
# ### What the CPU counter reads
#
# On a CPU there is no allocator counter. The measurement reads the child process's peak resident memory:
# Linux's `VmHWM` line in `/proc/self/status`, reset at the start of the measured step. glibc's allocator keeps
# freed memory by default, so the child sets `MALLOC_MMAP_THRESHOLD_=65536`: then freed tensors go back to the
# system and resident memory tracks the live tensors. The measurement says so itself:

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the counter's description depends on the device and the operating system.
print(m.what)

# %% [markdown]
# ### Why some tricks behave differently on a CPU
#
# - **bf16 autocast** speeds up matrix multiplies only on CPUs with bfloat16 instructions (AVX-512-BF16 or
#   AMX); the rest of the step (loss, norms, optimizer) stays float32. A T4 GPU has no native bfloat16: there
#   the same trick uses float16 with loss scaling, on its float16 tensor cores.
# - **bf16 with checkpointing**: in a reference measurement on a 2-core Intel Xeon cloud CPU, bf16 autocast
#   *together with* activation checkpointing made one micro-batch of 2 × 64 tokens about 13× slower (1.9 s
#   instead of 0.15 s with checkpointing alone, 0.09 s with autocast alone).

# %% [markdown]
# - **8-bit AdamW**: on a CPU, bitsandbytes unpacks a tensor's states to float32 for its update, so the
#   optimizer step needs scratch memory and time; a GPU's fused kernel updates in place.
# - **torch.compile** on a CPU compiles the graphs into C++ that a compiler must build: minutes on a 2-core
#   laptop the first time, seconds once PyTorch has the result in its on-disk cache. Set
#   `TRY_COMPILE_ON_CPU = True`, raise `compile_timeout_s`, and run the cell twice to see it finish.
# - **Memory at scale**: with the full 49,152-word vocabulary and short sequences, the peak can come at the end
#   of backward, where the tied embedding's gradient briefly exists three times - the head's contribution, the
#   embedding's and their sum.

# %% [markdown]
# ### transformers 4 and 5
#
# transformers 5 removed `warmup_ratio` and reads a float below 1 in `warmup_steps` as a ratio; transformers 4
# (still installed on some hosted notebooks) accepts only a whole number of steps in `warmup_steps`. A count of
# steps means the same in both, so for a run of known length the helper writes 3 % of the steps, rounded up.
# transformers 5 also renames `gradient_checkpointing` to `activation_checkpointing`. And `bf16=True` needs
# native bfloat16: on a GPU without it (a T4) the helper switches to `fp16=True`, float16 with loss scaling.
