# %% [markdown]
# # Memory budgets: will it fit?
#
# Before a training run, you can work out whether it fits your computer's memory. This notebook does that sum
# for full fine-tuning, LoRA and 4-bit QLoRA, then checks it against a real training step measured here.
#
# **What you will be able to do**
# - estimate the training memory of full fine-tuning, LoRA and QLoRA from a parameter count or a `config.json`;
# - say what quantization saves and what it can change;
# - explain why a run can fail even when the estimate fits, and account for the gap in numbers;
# - choose a method for a given memory budget, with one reason from the task and one from the memory.
#
# **Run time**: one to two minutes on a 2-core CPU. No GPU needed.

# %% [markdown]
# **Before you start**: you know what LoRA does (it freezes the model and trains a small adapter), and that a
# float32 number takes 4 bytes and a bfloat16 number 2. Quantization is covered in
# [notebook 01](01_quantization.ipynb).

# %% [setup] extras=["peft"]

# %% [markdown]
# ## A desk for editing a book
#
# Picture correcting a book on a small desk. The book itself takes room. For every page you may change you
# also need a draft sheet and two sheets of notes. If you may change every page, the desk must hold the book
# plus three more books' worth of paper; if only a few pages, a handful of sheets will do. And a book printed
# in smaller type takes less of the desk.
#
# In training, the book is the model's weights, the draft sheet is each weight's gradient, and the two
# sheets of notes are the optimizer's running averages. LoRA changes only a few pages; quantization prints
# the book smaller.

# %% [markdown]
# ## The problem: will it fit?
#
# This notebook follows a small team and its project: teach a small language model, SmolLM2-135M, to read a
# customer's support ticket and answer in strict JSON with the team that should handle it. They have 900
# labelled tickets to train on, and 102 more, the *dev set*, kept aside to test the result. **Kwame** leads the
# project and holds the budget, **Tomás** trains the models, **Priya** decides how results are judged, and
# **Grace** labelled the tickets and wrote the routing rules.
#
# Tomás has a bigger idea: "SmolLM2 is tiny. Let's tune a 7-billion-parameter model; it knows much more." Kwame
# asks the question this notebook is about: will it fit?

# %% [markdown]
# Training with the AdamW optimizer in float32 keeps four numbers of 4 bytes for every weight it trains:

# %%
from course_utils import memory as mem

per_weight = {"the weight itself": 4, "its gradient": 4, "AdamW's running average of the gradient": 4,
              "AdamW's running average of its square": 4}
for what, n_bytes in per_weight.items():
    print(f"{what:<40} {n_bytes} bytes")
print(f"{'total per trained parameter':<40} {sum(per_weight.values())} bytes")

# %% [markdown]
# **Predict before you run**: SmolLM2 has 134,515,008 parameters. How many GB does training all of them
# need? And a 7B model? The team's laptop has 16 GB.

# %%
for name, params in [("SmolLM2-135M", mem.SMOLLM2_PARAMS), ("a 7B model", 7_000_000_000)]:
    full = mem.estimate(params, "full", name=name)
    print(f"{name:<13} {params:>13,} x 16 bytes = {full.gb:7.2f} GB")

# %% [markdown]
# SmolLM2 needs 2.15 GB. The 7B model needs 112 GB, seven times the laptop's 16 GB, before anything else is
# counted. GB here means 10⁹ bytes.
#
# Where does 134,515,008 come from? The model's architecture file (`config.json`) is enough to count it: build
# the model on PyTorch's `meta` device, where tensors have shapes but no memory, and add up. `peft` can wrap
# that empty model in a LoRA adapter (rank 8 on the attention's `q_proj` and `v_proj`, the team's choice)
# and count what the adapter trains.

# %%
from course_utils.architecture import count_on_meta, lora_adapter_params
from course_utils.progress import status

status("Building SmolLM2-135M on the meta device, then wrapping it in a LoRA adapter …")
total, adapter = count_on_meta("smollm2-135m", lora_rank=8, targets=("q_proj", "v_proj"))
print(f"SmolLM2-135M: {total:,} parameters")
print(f"LoRA rank 8 on q_proj, v_proj trains {adapter:,} numbers = {100 * adapter / total:.2f}% of the model")

# %% [markdown]
# ## LoRA changes the sum
#
# With LoRA, every weight of the model is still in memory, at 4 bytes in float32. But it is frozen: gradients
# and AdamW's two averages exist only for the adapter's numbers, 4 + 8 = **12 bytes** each.
#
# The adapter's size is simple arithmetic. A LoRA adapter on a layer that maps `in` numbers to `out` numbers
# adds two small matrices, rank × `in` and `out` × rank. In SmolLM2, `q_proj` maps 576 → 576 and `v_proj` maps
# 576 → 192 (three key/value heads of 64), in each of 30 layers:

# %%
print(f"30 layers x 8 x ((576 + 576) + (576 + 192)) = {30 * 8 * ((576 + 576) + (576 + 192)):,}")
print(f"from the config, by the same arithmetic:     {lora_adapter_params('smollm2-135m', 8):,}")

# %%
lora = mem.estimate(mem.SMOLLM2_PARAMS, "lora", adapter=mem.SMOLLM2_ADAPTER, name="SmolLM2-135M")
print(f"frozen weights  134,515,008 x 4 bytes  = {lora.weights_bytes / 1e9:.4f} GB")
print(f"adapter             460,800 x 12 bytes = {(lora.gradient_bytes + lora.optimizer_bytes) / 1e9:.4f} GB")
print(f"LoRA on SmolLM2-135M, base in float32  = {lora.gb:.2f} GB  (full fine-tuning: 2.15 GB)")
print(f"a 7B model's frozen weights alone: 7,000,000,000 x 4 bytes = "
      f"{mem.estimate(7e9, 'lora').weights_bytes / 1e9:.0f} GB")

# %% [markdown]
# 0.54 GB instead of 2.15 GB. Now the frozen weights take almost all of the memory: 99 % of it for SmolLM2,
# and 28 GB for a 7B model. To save more, the weights themselves must take fewer bytes. (The estimate leaves
# out the adapter's own float32 numbers, 1.8 MB here: far below its rounding.)

# %% [markdown]
# ## Quantization: fewer bits per weight
#
# Quantization stores each weight with fewer bits by rounding it, the way a price list rounded to the nearest
# 5 cents is shorter to write and still useful. [Notebook 01](01_quantization.ipynb) builds it from scratch;
# here is its 4-bit example again. Eight made-up weights; the one furthest from zero is −0.35; four bits
# give the whole steps −7 … 7, so one step is 0.35 ÷ 7 = 0.05, and each weight becomes its nearest step:

# %%
import torch
from course_utils import quant

print(quant.format_eight_numbers(quant.eight_numbers(bits=4)))
size = quant.storage(quant.quantize(torch.tensor(quant.EIGHT_WEIGHTS), bits=4))
print()
print(f"float32: 8 weights x 4 bytes = {8 * 4} bytes")
print(f"4 bits:  {size.codes} bytes of steps + {size.scales} bytes for the step size = {size.total} bytes")

# %%
from course_utils.plots.quant import plot_eight_numbers
import matplotlib.pyplot as plt

_ = plot_eight_numbers(bits=4)
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** Two rows of 8 dots on an axis from −0.4 to 0.4. The float32 row has the
# original weights: −0.35, −0.22, −0.05, 0.02, 0.07, 0.12, 0.18 and 0.31. The 4-bit row has the rounded
# values: −0.35, −0.20, −0.05, 0, 0.05, 0.10, 0.20 and 0.30. Every rounded value is a multiple of 0.05, and
# no dot is more than 0.02 from its original.

# %% [markdown]
# Real 4-bit formats share one step size among a group of 64 weights and place their 16 levels more cleverly
# (NF4, see notebook 01), but the saving is the same idea. The estimator counts the ideal: 4 bytes per weight
# in float32, 2 in bfloat16, half a byte in 4 bits. (The step sizes add about 0.13 bit per weight with QLoRA's
# double quantization, 0.5 bit without: small next to 4.)

# %%
for label, n_bytes in [("float32", 4), ("bfloat16", 2), ("4 bits", 0.5)]:
    print(f"a 7B model's weights in {label:<8}: {n_bytes:>3} bytes x 7e9 = {n_bytes * 7:5.1f} GB")

# %% [markdown]
# ## QLoRA: a 4-bit base under a LoRA adapter
#
# QLoRA combines both ideas: the frozen model is stored in 4 bits, and a LoRA adapter is trained on top at
# full precision (the 4-bit weights are unpacked to bfloat16 on the fly for each multiplication). For a 7B
# model:

# %%
qlora = mem.estimate(7e9, "qlora", name="a 7B model")
parts = qlora.parts_gb()
print(f"frozen base in 4 bits: {parts['weights']:.2f} GB")
print(f"adapter (assumed 0.34% of the model) x 12 bytes: {parts['gradients'] + parts['AdamW states']:.2f} GB")
print(f"QLoRA on a 7B model: {qlora.gb:.2f} GB")

# %% [markdown]
# 3.79 GB: a 7B model now fits the laptop's 16 GB on paper. It has two costs.
#
# 1. **Quality.** Rounding moves every weight a little, so the model's answers can change. Measure its quality
#    again after quantizing; do not assume it.
# 2. **Hardware.** You may read that bitsandbytes, QLoRA's usual library, needs a GPU. That is out of date:
#    version 0.50 (installed here) runs its 4-bit layers on x86 CPUs too. What is still true: a CPU does a 7B
#    model's arithmetic far too slowly for a first experiment, and that is why QLoRA belongs on a GPU.
#
# ("Going deeper", after the recap, times 4 bits on this machine.)

# %% [markdown]
# ## The estimator, for every model and method
#
# The course's command line puts the rules above into one table: four models, four methods, and whether each
# fits a 16 GB laptop, a 24 GB GPU or an 80 GB GPU. In a terminal it is `python -m course_utils memory`; here we
# call the same function.

# %%
from course_utils.cli import main

_ = main(["memory"])

# %% [markdown]
# "fits" means the estimate uses at most 70 % of the memory; the rest is for activations and the system
# (more on that below). The table rests on two assumptions:
#
# - the sizes other than SmolLM2's are round sizes of common model families;
# - without an architecture file, LoRA is assumed to train 0.34 % of any model, as it does in SmolLM2.
#
# Give the command a `config.json` and it counts instead of assuming ("Going deeper" shows it for
# Qwen2.5-1.5B). Models and libraries change fast: these numbers describe these models and these versions.

# %% [markdown]
# ### The 7B model, four ways

# %%
from course_utils.plots.memory import plot_methods_vs_budgets

seven_b = mem.estimate_table([mem.MODELS[2]])
_ = plot_methods_vs_budgets(seven_b, title="A 7B model, four methods (estimates, activations not included)")
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** A column chart with four columns, estimates for a 7B model: full
# fine-tuning in float32 112.0 GB; LoRA with the base in float32 28.3 GB; LoRA with the base in bfloat16
# 14.3 GB; QLoRA with the base in 4 bits 3.8 GB. Three horizontal lines mark 70 % of each budget: 11.2 GB for a
# 16 GB laptop, 16.8 GB for a 24 GB GPU, 56 GB for an 80 GB GPU. Only QLoRA is under the laptop's line; LoRA in
# bfloat16 is under the 24 GB GPU's line; full fine-tuning is above all three.

# %% [markdown]
# ## Try it: a budget planner
#
# Pick a model (a shipped config gives exact counts; the round sizes use the 0.34 % assumption), a method, a
# LoRA rank and a memory size. The planner prints the estimate, whether it fits, and draws what takes the
# memory. (Instructor demo: start from a 7B model in bfloat16 on 16 GB, then move the memory to 24 GB.)

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget; nbval has no widget front end to compare it with.
from course_utils.widgets.memory import budget_planner, plan

budget_planner(model="a 7B model", method="lora-bf16", lora_rank=8, budget_gb=16.0)

# %% [markdown]
# The widget's text for its starting position, and for the 24 GB GPU:

# %%
print(plan("a 7B model", 7.0, "lora-bf16", 8, 16.0).text)
print()
print(plan("a 7B model", 7.0, "lora-bf16", 8, 24.0).text)

# %% [markdown]
# ### Your turn: a 3B model, three ways
#
# Tomás finds a model with 3,000,000,000 parameters; it is not in the table. With the rules above, estimate in
# GB (10⁹ bytes) the memory to train it with:
#
# 1. full fine-tuning in float32 (`full_gb`);
# 2. LoRA with the base in float32 (`lora_gb`), the adapter assumed at 0.34 % of the model, as in the table;
# 3. QLoRA, base in 4 bits (`qlora_gb`), with the same adapter.
#
# Write a number or the arithmetic that gives it, e.g. `3e9 * 4 / 1e9`.

# %%
from course_utils.exercises.budget import check_three_ways

full_gb = ...   # full fine-tuning, float32
lora_gb = ...   # LoRA, base in float32
qlora_gb = ...  # QLoRA, base in 4 bits
check_three_ways(full_gb, lora_gb, qlora_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# - **Full fine-tuning**: every weight keeps 16 bytes: 3e9 × 16 = **48 GB**.
# - **LoRA**: the adapter is 0.34 % of 3e9, about 10.3 million numbers. Frozen base 3e9 × 4 bytes = 12 GB, plus
#   10.3 million × 12 bytes = 0.12 GB: **12.12 GB**.
# - **QLoRA**: base 3e9 × 0.5 bytes = 1.5 GB, plus the same 0.12 GB: **1.62 GB**.
#
# ```python
# adapter = 3e9 * 0.0034
# full_gb = 3e9 * 16 / 1e9
# lora_gb = (3e9 * 4 + adapter * 12) / 1e9
# qlora_gb = (3e9 * 0.5 + adapter * 12) / 1e9
# ```
#
# The estimator gives the same: `mem.estimate(3e9, "full").gb`, `mem.estimate(3e9, "lora").gb`,
# `mem.estimate(3e9, "qlora").gb`.
# </details>

# %% [markdown]
# ## Other methods, other data
#
# Two more methods come up in every conversation about adapting a model. Each needs a different kind of data.
#
# | Method | What it trains | The data it needs | For the ticket-routing task |
# | --- | --- | --- | --- |
# | Distillation | a small "student" model learns to copy the answers of a large "teacher" model | many unlabelled tickets, plus what the teacher charges to answer them all | possible later; the student copies the teacher's mistakes too, and the provider's terms must allow it |
# | Preference tuning (for example DPO) | the model learns which of two replies people prefer | pairs of replies, one marked as the better | no: it changes how a model writes, and this task has one right answer |

# %% [markdown]
# ## Discuss: which computer, which method?
#
# Kwame has three options for the first experiment: the laptop (16 GB, no GPU), one rented GPU with 24 GB, or
# one with 80 GB.
#
# - Tomás: "The 24 GB GPU, QLoRA on a 7B model. A bigger model knows more, French included."
# - Kwame: "Renting costs money and needs an account. The laptop costs nothing extra."
# - Priya: "What must the first run tell us?"
# - Grace: "Don't forget: 10 of the 102 dev-set tickets are in French."
#
# Before you open the answer, decide:
# 1. Which methods fit each option? Use the table above.
# 2. Which failure could a larger base model reduce, and which could it not?
# 3. What evidence would justify paying for the GPU?

# %% [markdown]
# <details><summary>Show the team's answer</summary>
#
# **The laptop, LoRA rank 8, SmolLM2-135M.** The first run must show whether training on their own tickets
# teaches the output format and the routing: a small, cheap run anyone can repeat. The laptop has room: when
# the team ran it, the peak was 1.88 GB. A larger model may read French better, but no model size can learn
# routing rules the training tickets do not show, or French it never sees in them.
#
# **What would change the answer**: the adapter learns English routing but fails on French because the base
# model reads French badly. Then QLoRA on a 7B model on a rented GPU is the next *measured* step, with French
# training tickets.
# </details>

# %% [markdown]
# ## Common mistake: the estimate fits, the run does not
#
# **Symptom.** Tomás reads the table: "LoRA on a 7B model in bfloat16 needs 14.29 GB. The laptop has 16 GB, so it
# fits." The estimator says "no", and it is right.
#
# **Cause.** The estimate counts the weights, the gradients and AdamW's numbers, nothing else. It leaves out the
# **activations** (what the forward pass keeps for the backward pass, which grows with the batch and the text
# length) and the **running program** itself (Python, PyTorch, the libraries). The team's own run shows the
# gap: for LoRA on SmolLM2 the estimate is 0.54 GB, but the training process peaked at 1.88 GB.

# %% [markdown]
# Let's reproduce that here: one real LoRA rank-8 training step on the SmolLM2-135M architecture (random
# weights: memory does not depend on their values), at **batch 8**, with sequences of **64 tokens**, which keeps
# the step to seconds on a 2-core CPU. First, the parts we can count exactly before running anything:

# %%
BATCH, SEQ = 8, 64
weights = mem.SMOLLM2_PARAMS * 4 + mem.SMOLLM2_ADAPTER * 4  # frozen base + the adapter's own numbers
print(f"batch {BATCH} x {SEQ} tokens = {BATCH * SEQ} tokens per step")
print(f"weights (base + adapter, float32): {weights / 1e9:.4f} GB")
print(f"gradients (adapter only):          {mem.SMOLLM2_ADAPTER * 4 / 1e9:.4f} GB")
print(f"AdamW states (adapter only):       {mem.SMOLLM2_ADAPTER * 8 / 1e9:.4f} GB")
print(f"the estimator's sum:               {lora.gb:.4f} GB")

# %% [markdown]
# **Predict before you run**: the estimate is 0.54 GB. What peak do you expect from the real step: about the
# same, twice as much, or more?

# %% [markdown] slide="notes"
# `measure_training_step` builds the model in a **fresh Python process**, so the peak belongs to this step alone,
# not to this notebook. It runs one warm-up step (AdamW creates its states on the first step), then measures a
# second one. On a CPU, the measured figure is that process's peak resident memory: the most RAM it held at
# once. On a GPU, it is CUDA's peak-memory counter. It also counts the bytes of the weights, gradients,
# optimizer states and the tensors autograd saved for backward. On a 2-core CPU this takes half a minute to a
# minute or two.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a measured memory peak and a timing; they differ from machine to machine.
from course_utils.measure import measure_training_step

status("Measuring one LoRA training step in a fresh Python process: a warm-up step, then the measured one …")
step = measure_training_step("smollm2-135m", method="lora", batch=BATCH, seq=SEQ, lora_rank=8,
                             targets=("q_proj", "v_proj"), timeout_s=280)
print(f"measured peak: {step.peak_bytes / 1e9:.2f} GB ({step.peak_bytes / 1e6:,.0f} MB); "
      f"one step took {step.step_seconds:.1f} s on {step.device}")

# %% [markdown]
# Where did the memory go? The measured peak, split into the parts counted from the tensors; "other" is what the
# counted parts do not explain.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the parts of a measured peak differ from machine to machine.
parts = mem.account_for_peak(step)
for name, gb in parts:
    print(f"{name:<56} {gb:6.3f} GB")
print(f"{'measured peak':<56} {step.peak_bytes / 1e9:6.3f} GB = {step.peak_bytes / lora.total_bytes:.1f} x the estimate")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the chart shows this machine's measured peak.
from course_utils.plots.memory import plot_estimate_vs_measured

_ = plot_estimate_vs_measured(lora.gb, parts, label="here")
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** Four columns. The first two are the team's numbers for LoRA on
# SmolLM2-135M in float32 at batch 8: the estimate, 0.54 GB, and the measured peak of their training process,
# 1.88 GB, about three and a half times the estimate. The last two are this machine's: the same 0.54 GB
# estimate, and the measured peak (printed above), stacked from the bottom as the framework's baseline, the
# weights, the gradients, the AdamW states (both too thin to see), the activations saved for backward, and
# the rest.

# %% [markdown]
# **Reading the numbers** (a reference run on a 2-core cloud CPU; this machine's are printed above):
#
# - **Weights, gradients, AdamW states**: about 0.54 GB, exactly what the estimate counts.
# - **Framework baseline**, about 0.45 GB: Python, PyTorch, transformers and peft, loaded before the model.
#   It does not shrink with the model.
# - **Activations saved for backward**, about 0.6 GB at 8 × 64 tokens. They grow with batch × length: at
#   8 × 128 tokens the reference run measured 1.17 GB of them and a peak of 2.63 GB.
# - **Other**, about a quarter of a GB: short-lived tensors of backward (the logits over a 49,152-word
#   vocabulary and their gradient are 0.1 GB each at 512 tokens) and memory not yet returned.

# %% [markdown]
# The reference run's peak at 64 tokens, about 1.84 GB, happens to land near the team's 1.88 GB. The pattern
# matters more: the estimate is the *smallest* amount a run can need, and the real run needed over three times it.
#
# **Fix.** Treat the estimate as a floor and keep 30 % of the memory free, as "fits" does. Then measure a short
# run before a long one; [notebook 05](05_memory_tricks.ipynb) adds activations to the estimate and measures
# the tricks that shrink them.

# %% [markdown]
# ## Guided practice: three budgets
#
# The team's worked example takes the three budgets of the table. For each: what fits, the choice, the reason.

# %%
for budget in mem.BUDGETS:
    fitting = mem.what_fits(budget.gb)
    print(f"{budget.label} (usable {budget.usable_gb:g} GB): {len(fitting)} of 16 fit")
    for model in [m.name for m in mem.MODELS]:
        methods = [e.label for e in fitting if e.model == model]
        if methods:
            print(f"    {model:<13} {'; '.join(methods)}")

# %% [markdown]
# - **Laptop, 16 GB** — **Choice: LoRA rank 8 on SmolLM2-135M.** Task: 900 labelled tickets are too few to
#   retrain every weight, and the first run must be cheap to repeat. Memory: 0.54 GB estimated, 1.88 GB
#   measured, far below 11.2 GB.
# - **GPU, 24 GB** — adds 7B LoRA in bfloat16 (14.29 GB). **Choice: only after SmolLM2's evaluation shows a
#   failure a larger model could fix** (French reading, say); then QLoRA or LoRA-bf16 on 7B, with activations
#   still to add to 3.79 or 14.29 GB.
# - **GPU, 80 GB** — adds 1.7B full fine-tuning, 7B LoRA in float32 and 70B QLoRA (37.88 GB). **Choice: the
#   same 7B experiment, with room for longer texts and larger batches.** Task: nothing in 900 tickets needs a
#   70B model; the data, not the hardware, limits what the run can learn.

# %% [markdown]
# ### Your turn: the first method that fits
#
# Try the methods in the table's order: full fine-tuning, LoRA with a float32 base, LoRA with a bfloat16 base,
# QLoRA. Each step down gives something up: first training every weight, then the precision of the frozen
# weights. Take the first whose estimate fits (at most 70 % of the memory), or `'none'`. Use the table above.
#
# 1. `method_8gb`: the 1.7B model on an office laptop with 8 GB;
# 2. `method_48gb`: the 70B model on one GPU with 48 GB.
#
# Answer each with `'full'`, `'lora'`, `'lora-bf16'`, `'qlora'` or `'none'`.

# %%
from course_utils.exercises.budget import check_best_methods

method_8gb = ...   # 'full', 'lora', 'lora-bf16', 'qlora' or 'none'
method_48gb = ...
check_best_methods(method_8gb, method_48gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# Usable memory: 70 % of 8 GB is 5.6 GB; 70 % of 48 GB is 33.6 GB.
#
# - **1.7B model, 8 GB**: full fine-tuning 27.20 GB, no. LoRA with a float32 base 6.87 GB: under 8 GB but over
#   5.6 GB, no. LoRA with a bfloat16 base 3.47 GB: fits. `method_8gb = 'lora-bf16'`.
# - **70B model, 48 GB**: even QLoRA needs 37.88 GB: under 48 GB but over 33.6 GB. `method_48gb = 'none'`.
#
# The estimator says the same: `[e.method for e in mem.what_fits(8) if e.model == "a 1.7B model"]` lists
# `'lora-bf16'` and `'qlora'`, and `mem.what_fits(48)` holds no row for the 70B model.
# </details>

# %% [markdown]
# ## Completion check: justify a method
#
# Harbour Bikes, a made-up company, wants to sort repair requests into three teams, answering as strict JSON. It
# has 400 labelled requests, all in English, and one laptop with 16 GB and no GPU. The requests must not leave its
# computers. Write five to eight sentences: the method, the model size, the memory estimate, and one result that
# would change your choice.

# %% [markdown]
# <details><summary>Show a worked solution and what reviewers check</summary>
#
# "The requests must stay on our computers, so a hosted model is out. First we compare a prompt on a small local
# model with a word-count classifier. If we adapt a model, we use LoRA rank 8 on SmolLM2-135M: the estimate is
# 0.54 GB, far below 70 % of 16 GB (11.2 GB), and a measured run needed 1.88 GB. With 400 examples, full
# fine-tuning has too many weights for too few examples. QLoRA's point is a large model, which this processor
# trains too slowly. If the loss stays high on the training requests and on held-out ones, we try a higher rank,
# then a 1.7B model with LoRA in bfloat16 (3.47 GB)."
#
# Reviewers mark it **demonstrated** when it names the method and the model, uses an estimate with headroom,
# gives a reason from the data and names evidence that would change the choice; **partially demonstrated** when
# one of these is missing.
# </details>

# %% [markdown]
# ## Knowledge check
#
# **1.** Why does full fine-tuning in float32 need about 16 bytes per parameter, and why does LoRA need much less?
#
# <details><summary>Show the answer</summary>
#
# Full fine-tuning trains every weight, and each needs 4 bytes for the weight, 4 for its gradient and 8 for
# AdamW's two running averages: 16 bytes. LoRA freezes the model: the frozen weights still take their 4 bytes each,
# but gradients and AdamW's numbers exist only for the adapter's few numbers. For SmolLM2 that is 0.54 GB
# instead of 2.15 GB.
# </details>

# %% [markdown]
# **2.** What does quantization save, and what can it change? Why does the team not use QLoRA on its laptop?
#
# <details><summary>Show the answer</summary>
#
# Quantization stores weights with fewer bits by rounding them, so the frozen model takes less memory: 4 bits are
# an eighth of float32. The rounding moves every weight a little, so the model's answers can change and quality
# must be measured again. QLoRA keeps the frozen model in 4 bits and trains a LoRA adapter on top. The team's
# model is small enough that float32 LoRA fits easily, and QLoRA's reason to exist, a large model, is too slow to
# train on a laptop processor. (Older bitsandbytes versions needed a GPU; version 0.50 also runs on x86 CPUs.)
# </details>

# %% [markdown]
# **3.** The estimate for a run is 9 GB and your computer has 12 GB. Do you start the long run? What evidence
# would change your mind?
#
# <details><summary>Show the answer</summary>
#
# Not yet. 9 GB is more than 70 % of 12 GB (8.4 GB), and the estimate leaves out activations and the program
# itself: the team's LoRA run needed 1.88 GB against an estimate of 0.54 GB. Run a few steps and measure the peak.
# If it stays well below 12 GB, start the long run; if not, use a smaller batch, shorter texts, a smaller model or
# more memory.
# </details>

# %% [markdown]
# ## Recap
#
# - Training memory starts at 16 bytes per trained parameter in float32: SmolLM2 2.15 GB, a 7B model 112 GB.
#   LoRA trains few numbers, so the frozen weights dominate: 0.54 GB for SmolLM2.
# - Quantization rounds weights to fewer bits. QLoRA freezes the model in 4 bits under a LoRA adapter: 3.79 GB for
#   a 7B model, to be paired with a quality check and, for a model that size, a GPU.
# - An estimate is the smallest amount a run can need: activations and the framework come on top (0.54 GB
#   estimated, 1.88 GB measured in the team's run). Keep 30 % free and measure.
# - Distillation needs a teacher and many tickets; preference tuning needs pairs of replies. Neither fits this task
#   now.
# - The team's choice: LoRA rank 8 on SmolLM2-135M, on the laptop, because the data, not the hardware, limits
#   what the first run can learn.

# %% [markdown]
# ## Going deeper (optional)
#
# Extras for after the core: three more budgets to reason about, how fast 4 bits runs here, which layers real
# libraries keep out of 4 bits, exact counts from a config, how the peak was read, and the whole step against
# real GPUs.

# %% [markdown]
# ### Three other budgets, with reasons from the task
#
# Memory is half of the choice; the task is the other half. For each budget, choose a method with one reason
# from the task and one from the memory: an office laptop with 8 GB and no GPU; one GPU with 48 GB; a server
# with 64 GB of memory and no GPU. The estimator takes your budgets directly:

# %%
_ = main(["memory", "--budgets", "8,48,64"])

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# Usable memory is 70 %: 5.6 GB, 33.6 GB and 44.8 GB.
#
# 1. **8 GB laptop**: LoRA on SmolLM2 (estimate 0.54 GB; 1.88 GB measured in the team's run). Full fine-tuning
#    (2.15 GB) fits too, but 900 tickets argue for an adapter. On paper a 1.7B model in bfloat16 (3.47 GB) and
#    even 7B QLoRA (3.79 GB) fit, but without a GPU a model that size trains far too slowly for a first
#    experiment.
# 2. **48 GB GPU**: LoRA or QLoRA on a 7B model fits (28.29, 14.29 and 3.79 GB). Use it only after the small
#    model's evaluation shows a failure a larger model could fix. 70B QLoRA (37.88 GB) does not fit.
# 3. **64 GB server, no GPU**: 7B LoRA in float32 (28.29 GB) fits in memory, and so does 70B QLoRA (37.88 GB),
#    on paper. But a 7B model has about 52 times SmolLM2's weights to compute with at every step
#    (7,000,000,000 ÷ 134,515,008 ≈ 52): far too slow on a processor. Choose LoRA on SmolLM2, as the team does.
# </details>

# %% [markdown]
# ### How fast is 4 bits on this machine?
#
# One frozen layer of SmolLM2's MLP (576 → 1536), forward and backward for 512 tokens, the work every frozen
# layer does in a LoRA step, stored in float32, in 16 bits and in 4 bits. The 16-bit type is the one
# `course_utils.hardware` picks for the device: bfloat16 on a CPU or an Ampere-or-newer GPU, float16 on a T4
# (which has no native bfloat16); the 4-bit layer computes in it too.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: timings differ from machine to machine.
from course_utils.measure import time_frozen_layer

for layer, ms in time_frozen_layer().items():
    print(f"{layer:<10} {ms:6.1f} ms per forward + backward")

# %% [markdown]
# Timings depend on the processor. CPUs with bfloat16 matrix units (such as Intel AMX) speed up the 16-bit and
# 4-bit paths; on other CPUs these paths can be slower than float32, because the 16-bit arithmetic is emulated.

# %% [markdown]
# ### Real libraries keep some layers out of 4 bits
#
# bitsandbytes leaves the embedding table in 16 bits, which matters for a small model whose embedding is a fifth
# of its parameters:

# %%
embedding = 49_152 * 576  # vocabulary x hidden size
rest = mem.SMOLLM2_PARAMS - embedding
print(f"SmolLM2's embedding: {embedding:,} parameters = {100 * embedding / mem.SMOLLM2_PARAMS:.0f}% of the model")
print(f"all in 4 bits:                         {mem.SMOLLM2_PARAMS * 0.5 / 1e6:.0f} MB")
print(f"embedding in 16 bits, the rest 4 bits: {(embedding * 2 + rest * 0.5) / 1e6:.0f} MB")

# %% [markdown]
# ### Exact counts from a config
#
# Give the command a `config.json` (or the name of one shipped in `data/configs/`) and it counts instead of
# assuming. For Qwen2.5-1.5B the same adapter is only 0.07 % of the model: an adapter grows with a layer's
# width, the layer's weights with the square of it, and Qwen's layers are 2.7 times wider than SmolLM2's. The
# total barely moves, because the frozen weights dominate:

# %%
_ = main(["memory", "--config", "qwen2.5-1.5b-instruct", "--method", "lora"])

# %% [markdown]
# Other options: `--params 3e9` for any size, `--lora-rank 16 --targets q_proj,k_proj,v_proj,o_proj` for
# another adapter, `--budgets 12,24` for your own memory sizes in GB.

# %% [markdown]
# ### How the peak was read
#
# The measurement says what it read, in its own words:

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the description names this machine's counter (CPU or GPU).
print(step.what)

# %% [markdown]
# On Linux, `VmHWM` is the kernel's "high-water mark" of a process's resident memory, its peak RAM; writing to
# `/proc/self/clear_refs` resets it, so the peak covers the measured step only. `MALLOC_MMAP_THRESHOLD_=65536`
# tells the C library to hand every block of 64 KiB or more straight back to the system when it is freed, so the
# resident memory follows the tensors instead of keeping freed space. On a GPU none of this applies: CUDA's
# allocator counts its peak itself.

# %% [markdown]
# ### The whole step against real GPUs
#
# Notebook 05 builds an estimate of the *whole* step: the table's weights, gradients and optimizer states plus
# the activations, the short-lived buffers of backward and the framework. The planner below uses it. Pick a
# model, a method, the batch, the tokens per example, checkpointing and the optimizer; the bar shows the
# predicted peak split five ways, against the memory of four GPUs (T4, L4, A100 40 GB, H100). **Predict
# first:** Qwen2.5-1.5B with LoRA, batch 8 × 1,024 tokens. Which of the four GPUs can hold it?
#
# The same estimate is on the command line, for any model on the Hugging Face Hub:
# `python -m course_utils memory --model Qwen/Qwen2.5-7B --batch 8 --seq 1024 --gpu T4,L4,A100-40GB,H100`.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget (nbval has no widget frontend; the text below is compared).
from course_utils.widgets.memory import step_plan, step_planner

step_planner(config="qwen2.5-1.5b-instruct", method="lora", batch=8, seq=1024)

# %%
print(step_plan("qwen2.5-1.5b-instruct", "lora", batch=8, seq=1024).text)

# %% [markdown]
# **Text description of the chart.** One bar, the predicted peak of the step on a GPU, stacked from the bottom:
# weights, gradients, optimizer states, activations and overhead (the buffers of backward). Four horizontal
# lines mark the memory of a T4 (16 GB), an L4 (24 GB), an A100 (40 GB) and an H100 (80 GB); the legend says
# which ones the step fits. For Qwen2.5-1.5B with LoRA at batch 8 × 1,024 tokens the bar reaches 53 GB: only
# the H100 holds it, and activations are most of it. Tick *gradient checkpointing* and watch that part shrink.
