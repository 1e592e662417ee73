# %% [markdown]
# # Memory budgets: will it fit?
#
# Know before you train whether a method fits your computer. **You will be able to:**
#
# - estimate the memory of full fine-tuning, LoRA and 4-bit QLoRA;
# - say what quantization saves and what it can change;
# - explain why a run can fail although its estimate fits;
# - choose a method for a memory budget, with a reason from the task and one from the memory.
#
# A CPU is enough; no GPU needed.

# %% [markdown]
# **Before you start**: LoRA freezes a model and trains a small adapter; a float32 number takes 4 bytes, a
# bfloat16 number 2.

# %% [setup] extras=["peft"]
# %% [markdown]
# ## A desk for editing a book
#
# You correct a book on a small desk. Each page you may change needs a draft sheet and two sheets of notes:
# change every page and the desk holds four books' worth of paper; change a few, and a few sheets more. A book
# printed smaller takes less room.
#
# The book is the model's weights, the draft each weight's gradient, the notes the optimizer's two running
# averages. LoRA changes a few pages; quantization prints the book smaller.

# %% [markdown]
# ## The problem: will it fit?
#
# A team teaches the small language model SmolLM2-135M to route support tickets, answering in strict JSON. It
# has 900 labelled tickets and 102 more kept aside for testing (the *dev set*): the team's data, not this
# course's small made-up set. Kwame holds the budget, Tomás
# trains, Priya judges the results, Grace labelled the tickets.
#
# Tomás: "SmolLM2 is tiny. Let's tune a 7-billion-parameter model." Kwame: "Will it fit?"
#
# Training with the AdamW optimizer in float32 keeps four 4-byte numbers per trained weight:

# %%
per_weight = {"weight": 4, "gradient": 4, "AdamW: average of gradients": 4, "AdamW: average of squares": 4}
for what, n_bytes in per_weight.items():
    print(f"{what:<28} {n_bytes} bytes")
print(f"{'per trained parameter':<28} {sum(per_weight.values())} bytes")

# %% [markdown]
# **Predict before you run**: how many GB (10⁹ bytes) does training SmolLM2's 134,515,008 parameters take? A
# 7B model's? The laptop has 16 GB.

# %%
for name, params in {"SmolLM2-135M": 134_515_008, "a 7B model": 7_000_000_000}.items():
    print(f"{name:<13} {params:>13,} x 16 bytes = {params * 16 / 1e9:7.2f} GB")

# %% [markdown]
# The 7B model needs 112 GB, seven times the laptop, before anything else is counted.

# %% [markdown]
# ## LoRA changes the sum
#
# With LoRA every weight stays in memory at 4 bytes, frozen: gradients and AdamW's averages exist only for the
# adapter, **12 bytes** per adapter number (the adapter's own float32 weights, 4 more bytes each, come on top: 0.0018
# GB here, counted below). On a layer mapping `in` numbers to `out`, a rank-8 adapter adds two
# matrices, 8 × `in` and `out` × 8. The team's sits on `q_proj` (576 → 576) and `v_proj` (576 → 192) in
# SmolLM2's 30 layers:

# %%
total, trained = 134_515_008, 30 * 8 * ((576 + 576) + (576 + 192))
smol_lora_gb = (total * 4 + trained * 12) / 1e9
print(f"frozen weights  {total:,} x  4 bytes = {total * 4 / 1e9:.4f} GB")
print(f"adapter             {trained:,} x 12 bytes = {trained * 12 / 1e9:.4f} GB")
print(f"LoRA on SmolLM2-135M                   = {smol_lora_gb:.4f} GB")
print(f"a 7B model's frozen weights: 7e9 x 4 bytes = {7e9 * 4 / 1e9:.0f} GB")

# %% [markdown]
# 0.54 GB instead of 2.15, 99 % of it frozen weights: 28 GB for a 7B model. To save more, store them smaller.

# %% [markdown]
# ## Quantization: fewer bits per weight
#
# Quantization stores each weight in fewer bits by rounding it, like prices rounded to the nearest 5 cents.
# Eight made-up weights, the largest in size −0.35. Four bits hold 16 values; with the whole steps −7 … 7, one
# step is 0.35 ÷ 7 = 0.05, and each weight becomes its nearest step:

# %%
import torch

w = torch.tensor([0.12, -0.05, 0.31, -0.22, 0.02, -0.35, 0.18, 0.07])  # float32
step = w.abs().max() / 7           # 0.05
q = torch.round(w / step)          # the stored steps, -7 ... 7
w_hat = q * step                   # read back


def show(label, values, fmt):
    print(f"{label:<24}" + "".join(f"{fmt(v):>7}" for v in values.tolist()))


show("Weight (float32)", w, lambda v: f"{v:.2f}")
show("Stored step (4-bit)", q, lambda v: f"{v:.0f}")
show("Read back (step x 0.05)", w_hat, lambda v: f"{v:.2f}")
show("Error", w_hat - w, lambda v: f"{v:+.2f}" if round(v, 2) else "0")
codes = q.numel() * 4 // 8  # 4 bits each
print(f"\nfloat32: {w.nbytes} bytes. 4 bits: {codes} + {step.element_size()} for the step size = "
      f"{codes + step.element_size()} bytes")

# %%
import matplotlib.pyplot as plt

from course_utils.lessons import quantization  # notebook 01's chart

_ = quantization.plot_eight_numbers(bits=4)
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** Two rows of 8 dots from −0.4 to 0.4: the float32 weights (−0.35, −0.22,
# −0.05, 0.02, 0.07, 0.12, 0.18, 0.31) and their 4-bit values (−0.35, −0.20, −0.05, 0, 0.05, 0.10, 0.20,
# 0.30): multiples of 0.05, each at most 0.02 away.

# %% [markdown]
# Real 4-bit formats (NF4, [notebook 01](01_quantization.ipynb)) give each block of 64 weights its own step
# size. Half a byte per weight is a **floor**: libraries keep the embedding table (a vector per vocabulary
# word), the output layer `lm_head`, norms and biases in 16 bits, and store step sizes (in 8 bits with QLoRA's
# *double quantization*). **Predict**: is a real 7B model in 4 bits a quarter of its 16-bit size? Its sizes
# come from its architecture file, `config.json`:

# %%
layers, width, mlp, kv, vocab = 28, 3584, 18_944, 512, 152_064  # Qwen2.5-7B's config.json
linears = layers * (2 * width * width    # q_proj, o_proj
                    + 2 * width * kv     # k_proj, v_proj (4 key/value heads of 128)
                    + 3 * width * mlp)   # gate_proj, up_proj, down_proj
rest = (2 * vocab * width                # embedding table and a separate lm_head
        + layers * (3 * width + 2 * kv)  # per layer: two norms, the q, k and v biases
        + width)                         # the final norm
scales = linears / 64 + linears / (64 * 256) * 4  # 1 byte per 64 weights + 4 bytes per 256 of those bytes
real = linears * 0.5 + scales + rest * 2
params = linears + rest
print(f"Qwen2.5-7B: {params:,} parameters, {params * 2 / 1e9:.2f} GB in 16 bits")
print(f"floor, 0.5 byte each:            {params * 0.5 / 1e9:.2f} GB")
print(f"linears, 4 bits + step sizes:    {(linears * 0.5 + scales) / 1e9:.2f} GB")
print(f"the rest, 16 bits:               {rest * 2 / 1e9:.2f} GB")
print(f"real 4-bit size:                 {real / 1e9:.2f} GB = {real / (params * 0.5):.2f} x the floor, "
      f"{100 * real / (params * 2):.0f}% of 16 bits")

# %% [markdown]
# About a third of 16 bits, not a quarter, as [notebook 01b](01b_real_models_qlora.ipynb) found.

# %% [markdown]
# ## QLoRA: a 4-bit base under a LoRA adapter
#
# QLoRA freezes the model in 4 bits (unpacked to 16 bits for each multiplication) and trains a LoRA adapter
# on top. A round 7B at the floor, its adapter at SmolLM2's share (0.34 %):

# %%
base = 7e9 * 0.5
adapter = 7e9 * trained / total
print(f"frozen base, 7e9 x 0.5 bytes:     {base / 1e9:.2f} GB")
print(f"adapter, {adapter:,.0f} x 12 bytes: {adapter * 12 / 1e9:.2f} GB")
print(f"QLoRA on a 7B model:              {(base + adapter * 12) / 1e9:.2f} GB")
upcast = rest * 2  # training's preparation step turns the 16-bit rest into float32: 2 more bytes each
print(f"Qwen2.5-7B's real base {real / 1e9:.2f} GB; prepared for training "
      f"(the rest in float32, +{upcast / 1e9:.2f} GB): {(real + upcast) / 1e9:.2f} GB")

# %% [markdown]
# 3.79 GB: on paper a 7B model now fits the laptop's 16 GB, and so does a real 7B's base, even after QLoRA's
# preparation step ([notebook 01b](01b_real_models_qlora.ipynb)) stores its 16-bit rest in float32. Two costs:
#
# 1. **Quality.** Rounding moves every weight, so answers can change: measure quality again.
# 2. **Hardware.** bitsandbytes, QLoRA's usual library, runs on x86 CPUs too since version 0.50, but a CPU
#    computes a 7B model far too slowly: QLoRA belongs on a GPU.

# %% [markdown]
# ## The estimator, for every model and method
#
# The course's command line applies these rules to four models and four methods, against a 16 GB laptop and
# GPUs of 24 and 80 GB. In a terminal: `python -m course_utils memory`.

# %%
from course_utils.cli import main
from course_utils.lessons import memory_budget as lesson

_ = main(["memory"])

# %% [markdown]
# "fits": at most 70 % of the memory; the rest is for the **activations** (what the forward pass keeps for
# backward) and the system. Assumed: round model sizes, and LoRA training 0.34 % of any model.

# %%
from course_utils import memory

_ = lesson.plot_methods_vs_budgets(memory.estimate_table([memory.MODELS[2]]),
                            title="A 7B model, four methods (estimates, activations not included)")
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** A 7B model: full fine-tuning 112.0 GB, LoRA on float32 28.3 GB, on
# bfloat16 14.3 GB, QLoRA 3.8 GB. The 70 % lines of the three memories: 11.2, 16.8 and 56 GB. Only QLoRA is under
# the laptop's line, LoRA in bfloat16 under the 24 GB GPU's; full fine-tuning is above all three.

# %% [markdown]
# ## Try it: a budget planner
#
# Pick a model, method, LoRA rank and memory size; the planner draws what takes the memory. Start from 7B LoRA
# in bfloat16 on 16 GB, then try 24 GB.

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget; nbval has no widget front end to compare it with."
lesson.budget_planner(model="a 7B model", method="lora-bf16", lora_rank=8, budget_gb=16.0)

# %% [markdown]
# The planner's verdicts at 16 and 24 GB:

# %%
for budget_gb in (16.0, 24.0):
    print(lesson.plan("a 7B model", 7.0, "lora-bf16", 8, budget_gb).text.splitlines()[-1])

# %% [markdown]
# ### Your turn: bytes per parameter
#
# Write the rule behind every sum above. A frozen weight keeps only itself, stored in `base_bits` bits: 32, 16
# or 4. A trained number (every weight in full fine-tuning, an adapter's in LoRA) is float32 in all four methods,
# with its gradient and AdamW's two averages.

# %%
def bytes_per_parameter(base_bits, trained):
    """Bytes one number keeps in a training step with AdamW: a frozen weight in base_bits bits, or a trained one."""
    raise NotImplementedError  # your code here


lesson.check_bytes_per_parameter(bytes_per_parameter)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def bytes_per_parameter(base_bits, trained):
#     if trained:
#         return 4 + 4 + 4 + 4   # float32: the number, its gradient, AdamW's two averages
#     return base_bits / 8       # a frozen weight: itself only, 8 bits a byte
# ```
#
# Full fine-tuning of SmolLM2: `total * bytes_per_parameter(32, True) / 1e9`, 2.15 GB. The check names the usual
# slips: a missing gradient or average (12 or 8 bytes), a trained number in 16 bits (14), a gradient or AdamW
# states for frozen weights, bits instead of bytes, and `base_bits // 8`, which makes 4 bits 0 bytes.
#
# </details>

# %% [markdown]
# ## Other methods, other data
#
# Two more methods come up often when people adapt a model; each needs different data.
#
# | Method | What it trains | Data it needs | For ticket routing |
# | --- | --- | --- | --- |
# | Distillation | a small "student" copies a large "teacher" model's answers | many unlabelled tickets, and the teacher's fee to answer them | later, perhaps; the student copies the teacher's mistakes, and the provider's terms must allow it |
# | Preference tuning (e.g. DPO) | which of two replies people prefer | pairs of replies, one marked better | no: it changes how a model writes; this task has one right answer |

# %% [markdown]
# ## Discuss: which computer, which method?
#
# Kwame's options: the laptop (16 GB, no GPU), or a rented GPU of 24 or 80 GB.
#
# - Tomás: "The 24 GB GPU, QLoRA on a 7B model. A bigger model knows more, French too."
# - Kwame: "Renting costs money and needs an account. The laptop costs nothing extra."
# - Priya: "What must the first run answer?"
# - Grace: "10 of the 102 dev-set tickets are in French."
#
# Decide first: which methods fit each option? Which failure could a larger model reduce, which not? What
# evidence would justify the GPU?

# %% [markdown]
# <details><summary>Show the team's answer</summary>
#
# **The laptop, LoRA rank 8, SmolLM2-135M.** The first run must show whether training on the team's own
# tickets teaches the format and the routing: a small, cheap run anyone can repeat. The laptop has room: the
# team's run peaked at 1.88 GB (see the common mistake below). A larger model may read French better, but no
# model size learns routing rules, or French, that the training tickets do not show.
#
# **What would change the answer**: the adapter learns English routing but fails on French because the base
# model reads French badly. Then QLoRA on a 7B model on a rented GPU is the next *measured* step, with French
# training tickets.
# </details>

# %% [markdown]
# ## Common mistake: the estimate fits, the run does not
#
# **Symptom.** Tomás: "LoRA on a 7B model in bfloat16 needs 14.29 GB; the laptop has 16 GB, so it fits." The
# estimator says no, rightly.
#
# **Cause.** The estimate counts weights, gradients and AdamW's numbers only: not the activations, which grow
# with batch and text length, nor the running program (Python, PyTorch, libraries). The team's LoRA run on
# SmolLM2: estimate 0.54 GB, measured peak 1,882 MB (1.88 GB).

# %% [markdown]
# Reproduce it: one LoRA step on SmolLM2-135M's architecture (random weights: memory does not depend on their
# values), batch 8 × 128 tokens. Before the step the tensors hold the estimate plus the adapter itself:

# %%
BATCH, SEQ = 8, 128
parts_gb = {"frozen weights (float32)": total * 4 / 1e9, "adapter's gradients": trained * 4 / 1e9,
            "adapter's AdamW states": trained * 8 / 1e9}
parts_gb = {name: round(gb, 4) for name, gb in parts_gb.items()}
estimate = round(sum(parts_gb.values()), 4)
for name, gb in parts_gb.items():
    print(f"{name:<38} {gb:.4f} GB")
print(f"{'= the estimate':<38} {estimate:.4f} GB")
print(f"{'+ the adapter itself (float32)':<38} {round(trained * 4 / 1e9, 4):.4f} GB")
print(f"{'= in tensors before the step':<38} {estimate + round(trained * 4 / 1e9, 4):.4f} GB")

# %% [markdown]
# **Predict before you run**: will the step's peak be about that, twice that, or more?

# %% [markdown] slide="notes"
# After a warm-up step (AdamW creates its states then), the cell measures one step. On a CPU it reads the peak
# **resident memory** of a fresh process: the RAM it actually holds. On a GPU it reads PyTorch's **allocator
# counter**: the bytes handed out to tensors, at their highest (`torch.cuda.max_memory_allocated()`).

# %% tags=["nbval-ignore-output"] nbval_reason="a measured memory peak and a timing; they differ from machine to machine."
from course_utils.measure import measure_training_step
from course_utils.progress import status
from course_utils.units import format_seconds

status("Measuring a LoRA step after a warm-up step …")
measured = measure_training_step("smollm2-135m", method="lora", batch=BATCH, seq=SEQ, lora_rank=8,
                             targets=("q_proj", "v_proj"), timeout_s=280)
print(f"measured peak: {measured.peak_bytes / 1e9:.2f} GB; one step took {format_seconds(measured.step_seconds)} "
      f"on {measured.device}")

# %% [markdown]
# Split into the parts counted from the tensors ("other": the rest):

# %% tags=["nbval-ignore-output"] nbval_reason="the parts of a measured peak differ from machine to machine."
peak_parts = memory.account_for_peak(measured, digits=3)
for name, gb in peak_parts:
    print(f"{name:<54} {gb:6.3f} GB")
print(f"{'measured peak':<54} {round(measured.peak_bytes / 1e9, 3):6.3f} GB "
      f"= {measured.peak_bytes / 1e9 / smol_lora_gb:.1f} x the estimate")

# %% tags=["nbval-ignore-output"] nbval_reason="the chart shows this machine's measured peak."
_ = lesson.plot_estimate_vs_measured([lesson.TEAM_RUN, ("here", smol_lora_gb, peak_parts)],
                                     "LoRA on SmolLM2-135M, batch 8 x 128: estimate vs measured peak",
                                     counts="weights, gradients, AdamW states")
plt.show()

# %% [markdown] slide="notes"
# **Text description of the chart.** Two pairs of bars, estimate beside measured peak: the team's run, 0.54 GB
# and 1.88 GB (three and a half times); here, 0.54 GB and the measured peak printed above, stacked: framework
# baseline, weights, gradients and AdamW states (thin), activations, other.

# %% [markdown]
# The **framework baseline** (Python and libraries, loaded first) does not shrink with the model. "Other" holds
# short-lived tensors of backward, such as the *logits*, a score per vocabulary word per token (1,024 × 49,152 × 4
# bytes = 0.2 GB), and freed memory not yet returned. On a GPU the baseline stays in ordinary RAM; only the
# *CUDA context* (the driver's state, 0.3–0.5 GB on Colab's T4) sits in GPU memory outside the counter.
#
# **Fix.** Treat the estimate as a floor, keep 30 % free, and measure a short run before a long one.
# [Notebook 05](05_memory_tricks.ipynb) explains this same step, part by part.

# %% [markdown]
# ## Guided practice: three budgets
#
# The team's worked example: for each budget, what fits (new ones only), the choice, the reason.

# %%
seen = set()
for budget in memory.BUDGETS:
    fitting = [(e.model, e.method) for e in memory.what_fits(budget.gb)]
    new = {}
    for model_name, method in fitting:
        if (model_name, method) not in seen:
            new.setdefault(model_name, []).append(method)
    seen.update(fitting)
    added = "; ".join(f"{m.removeprefix('a ').removesuffix(' model')}: {' '.join(ms)}" for m, ms in new.items())
    print(f"{budget.label} (70 % line {budget.line_gb:g} GB): {len(fitting):>2} of 16 fit, new: {added}")

# %% [markdown]
# - **16 GB laptop: LoRA rank 8 on SmolLM2-135M.** 900 tickets are too few to retrain every weight, and the
#   first run must be cheap. 0.54 GB estimated, 1.88 GB in the team's run: far below 11.2 GB.
# - **24 GB GPU** adds 7B LoRA in bfloat16 (14.29 GB): **only once SmolLM2 fails where a larger model could
#   help** (French, say).
# - **80 GB GPU** adds 1.7B full fine-tuning, 7B LoRA in float32 and 70B QLoRA (37.88 GB): **the same 7B
#   experiment, with longer texts and larger batches**. 900 tickets need no 70B model: the data, not the
#   hardware, limits the run.

# %% [markdown]
# ### Your turn: three other budgets
#
# Choose a method, with a reason from the task and one from the memory, for: an office laptop, 8 GB, no GPU;
# a 48 GB GPU; a 64 GB server, no GPU.
#
# Checked part: take the first method in the table's order that fits (each step down gives something up), or
# `'none'`, for the 1.7B model on 8 GB (`method_8gb`) and the 70B model on 48 GB (`method_48gb`).

# %%
method_8gb = ...   # 'full', 'lora', 'lora-bf16', 'qlora' or 'none'
method_48gb = ...
lesson.check_best_methods(method_8gb, method_48gb)

# %% [markdown]
# <details><summary>Worked solution: the checked part</summary>
#
# The 70 % line: 5.6 GB of 8 GB; 33.6 GB of 48 GB.
#
# - **1.7B, 8 GB**: full fine-tuning 27.20 GB, no; LoRA on float32 6.87 GB, over 5.6 GB, no; LoRA on
#   bfloat16 3.47 GB fits: `method_8gb = 'lora-bf16'`.
# - **70B, 48 GB**: even QLoRA needs 37.88 GB, over 33.6 GB: `method_48gb = 'none'`.
# </details>
#
# <details><summary>Worked solution: the three budgets</summary>
#
# The 70 % lines: 5.6 GB, 33.6 GB and 44.8 GB.
#
# 1. **8 GB laptop**: LoRA on SmolLM2 (estimate 0.54 GB). Full fine-tuning (2.15 GB) fits too, but 900 tickets
#    argue for an adapter. A 1.7B model in bfloat16 (3.47 GB) and 7B QLoRA (3.79 GB) fit on paper, but a
#    processor trains models that size far too slowly for a first experiment.
# 2. **48 GB GPU**: LoRA or QLoRA on a 7B model fits (28.29, 14.29 and 3.79 GB). Use it only after the small
#    model's evaluation shows a failure a larger model could fix. 70B QLoRA (37.88 GB) does not fit.
# 3. **64 GB server, no GPU**: 7B LoRA in float32 (28.29 GB) fits in memory, but a 7B model has about 52 times
#    SmolLM2's weights to compute with at every step (7,000,000,000 ÷ 134,515,008 ≈ 52): too slow on a
#    processor. Choose LoRA on SmolLM2, as the team does.
# </details>

# %% [markdown]
# ## Completion check: justify a method
#
# Harbour Bikes, a made-up company, wants repair requests sorted into three teams, as strict JSON: 400
# labelled requests in English, one 16 GB laptop, no GPU, and the requests must stay on its computers. In five
# to eight sentences: the method, the model size, the estimate, and a result that would change your choice.

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
# **1.** Why does full fine-tuning in float32 need 16 bytes per parameter, and LoRA much less?
#
# <details><summary>Show the answer</summary>
#
# Full fine-tuning trains every weight, and each needs 4 bytes for the weight, 4 for its gradient and 8 for
# AdamW's two running averages: 16 bytes. LoRA freezes the model: the frozen weights keep their 4 bytes each,
# but gradients and AdamW's numbers exist only for the adapter's few numbers. For SmolLM2, 0.54 GB instead of
# 2.15 GB.
# </details>

# %% [markdown]
# **2.** What does quantization save, and what can it change? Why no QLoRA on the team's laptop?
#
# <details><summary>Show the answer</summary>
#
# Quantization stores weights in fewer bits by rounding them, so the frozen model takes less memory: 4 bits are
# an eighth of float32 (a floor: a real model keeps some parts in 16 bits). The rounding moves every weight a
# little, so the answers can change and quality must be measured again. QLoRA keeps the frozen model in 4 bits
# under a LoRA adapter. The team's model is small enough for float32 LoRA, and a model large enough to need
# QLoRA trains far too slowly on a laptop processor. (Older bitsandbytes versions needed a GPU; 0.50 also runs
# on x86 CPUs.)
# </details>

# %% [markdown]
# **3.** A run's estimate is 9 GB; your computer has 12 GB. Start the long run? What would change your mind?
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
# - Full fine-tuning in float32: 16 bytes per parameter (SmolLM2 2.15 GB, 7B 112 GB). LoRA: frozen weights
#   dominate (SmolLM2 0.54 GB).
# - QLoRA: a 4-bit frozen model under an adapter, 3.79 GB for 7B at the half-byte floor (real: 5.55 GB base);
#   check quality, use a GPU.
# - An estimate is a floor (0.54 GB; the team's run peaked at 1.88 GB): keep 30 % free and measure.
# - Distillation needs a teacher and many tickets, preference tuning pairs of replies: not for now.
# - The choice: LoRA rank 8 on SmolLM2-135M, on the laptop; the data, not the hardware, limits the run.

# %% [markdown]
# ## Going deeper (optional)
#
# Extras: the three budgets by the estimator, 4 bits' speed here, SmolLM2 in 4 bits, counting from a config,
# how the peak was read, and the whole step against real GPUs.

# %% [markdown]
# ### The three other budgets, by the estimator
#
# The estimator takes your own budgets, to check the choices above:

# %%
_ = main(["memory", "--budgets", "8,48,64"])

# %% [markdown]
# ### How fast is 4 bits on this machine?
#
# One frozen layer of SmolLM2's MLP (576 → 1536), forward and backward for 512 tokens, the work every frozen
# layer does in a LoRA step, stored in float32, in 16 bits and in 4 bits. The 16-bit type is the one
# `course_utils.hardware` picks: bfloat16 on a CPU or an Ampere-or-newer GPU, float16 on a T4 (no native
# bfloat16); the 4-bit layer computes in it too.

# %% tags=["nbval-ignore-output"] nbval_reason="timings differ from machine to machine."
from course_utils.measure import time_frozen_layer

for layer, ms in time_frozen_layer().items():
    print(f"{layer:<10} {format_seconds(ms / 1e3):>8} per forward + backward")

# %% [markdown]
# If 16 bits and 4 bits print slower than float32 here, that is the processor, not the method. A CPU without
# bfloat16 matrix units (such as Intel's AMX) converts 16-bit numbers and computes in float32, so it does more
# work, not less. A GPU runs 16-bit multiplications on its tensor cores: NVIDIA's datasheets give a T4 65 TFLOP/s
# in float16 against 8.1 in float32, an A100 312 TFLOP/s in bfloat16 against 19.5. The 4-bit layer unpacks its
# weights to 16 bits before each multiplication, so even on a GPU it is usually slower than plain 16 bits: what
# it saves is memory, not time.

# %% [markdown]
# ### SmolLM2 in 4 bits
#
# The floor matters most for a small model, whose embedding table is a fifth of its parameters:

# %%
embedding = 49_152 * 576  # vocabulary x width
print(f"SmolLM2's embedding: {embedding:,} parameters = {100 * embedding / total:.0f}% of the model")
print(f"all in 4 bits:                         {total * 0.5 / 1e6:.0f} MB")
print(f"embedding in 16 bits, the rest 4 bits: {(embedding * 2 + (total - embedding) * 0.5) / 1e6:.0f} MB")

# %% [markdown]
# ### Counting from `config.json`
#
# Where do 134,515,008 and 460,800 come from? Build the model from its `config.json` on PyTorch's `meta` device
# (tensors with a shape but no memory), and let `peft`, the LoRA library, wrap it and count what it trains:

# %%
import peft
from transformers import AutoConfig, AutoModelForCausalLM

from course_utils.configs import read_config
from course_utils.quiet import quiet_libraries

config = AutoConfig.for_model(**read_config("smollm2-135m"))
with quiet_libraries(), torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"SmolLM2-135M: {n_params:,} parameters; LoRA trains {n_trained:,} = {100 * n_trained / n_params:.2f}%")

# %% [markdown]
# ### Exact counts from a config
#
# Give the command a `config.json` (or the name of one shipped in `data/configs/`) and it counts instead of
# assuming. For Qwen2.5-1.5B the same adapter is only 0.07 % of the model: an adapter grows with a layer's
# width, the layer's weights with its square, and Qwen's layers are 2.7 times wider than SmolLM2's. The total
# barely moves, because the frozen weights dominate:

# %%
_ = main(["memory", "--config", "qwen2.5-1.5b-instruct", "--method", "lora"])

# %% [markdown]
# Other options: `--params 3e9` for any size, `--lora-rank 16 --targets q_proj,k_proj,v_proj,o_proj` for another
# adapter, `--budgets 12,24` for your own memory sizes in GB.

# %% [markdown]
# ### When, in the step, the gap appears
#
# The same step over time, predicted moment by moment: the process's own memory at the bottom, then the tensors
# by kind; the dotted line is the peak measured above. **Predict:** in which phase does the step rise furthest
# above the 0.54 GB estimate? ([Notebook 05](05_memory_tricks.ipynb) measures such a timeline tensor by tensor.)

# %% tags=["nbval-ignore-output"] nbval_reason="the dotted line is this machine's measured peak."
from course_utils import step_memory, timeline

lora_step = step_memory.estimate_step("smollm2-135m", method="lora", batch=BATCH, seq=SEQ,
                                      device=step_memory.estimate_device_for(measured.device))
lora_timeline = timeline.predicted_timeline(lora_step)
lesson.timeline_chart(lora_timeline, title="LoRA on SmolLM2-135M, batch 8 x 128, over one step",
                      whole_process=True, measured_peak_bytes=measured.peak_bytes)
plt.show()
print(lesson.timeline_text(lora_timeline, whole_process=True))

# %% [markdown]
# **Text description of the chart.** Weights (and on a CPU the process's own memory) are there from the start; the activations grow layer by layer through the forward pass, and the peak comes as backward
# starts, when the loss's gradient over the vocabulary joins them. LoRA's gradients and AdamW states are too
# thin to see: the gap is activations and the framework, not the optimizer.

# %% [markdown]
# ### How the peak was read
#
# On a CPU the measured step runs in a fresh Python process, stopped if it takes too long, so that its peak
# belongs to the step, not to this notebook; on a GPU it runs here and subtracts what this notebook had already
# allocated. The measurement says what it read:

# %% tags=["nbval-ignore-output"] nbval_reason="the description names this machine's counter (CPU or GPU)."
print(measured.what)

# %% [markdown]
# On Linux, `VmHWM` is the kernel's "high-water mark" of a process's resident memory; writing to
# `/proc/self/clear_refs` resets it, so the peak covers the measured step only. `MALLOC_MMAP_THRESHOLD_=65536`
# tells the C library to hand every freed block of 64 KiB or more straight back to the system, so resident
# memory follows the live tensors instead of keeping freed space. On a GPU none of this applies: PyTorch's
# allocator keeps its own count.

# %% [markdown]
# ### The whole step against real GPUs
#
# Notebook 05 estimates the *whole* step: weights, gradients and optimizer states plus the activations, the
# short-lived buffers of backward and the framework. The planner below uses it: pick a model, a method, the
# batch, the tokens per example, checkpointing and the optimizer; the bar shows the predicted peak against four
# GPUs (T4, L4, A100 40 GB, H100). It reports the **peak moment**: the point of the step where the most memory
# is alive at once. **Predict first:** Qwen2.5-1.5B with LoRA, batch 8 × 1,024 tokens. Which GPUs hold it?
#
# The same estimate, for any model on the Hugging Face Hub:
# `python -m course_utils memory --model Qwen/Qwen2.5-7B --batch 8 --seq 1024 --gpu T4,L4,A100-40GB,H100`.
#
# The method menu has one entry the table leaves out: *full fine-tuning (bfloat16)*, every weight trained in
# pure bfloat16 with no float32 copy, as torchtune and many Trainer scripts do on Ampere-or-newer GPUs:
# 2 + 2 + 2 + 2 = 8 bytes per parameter, half of float32's 16 (`--method full-bf16`).

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget (nbval has no widget front end; the text below is compared)."
lesson.step_planner(config="qwen2.5-1.5b-instruct", method="lora", batch=8, seq=1024)

# %%
print(lesson.step_plan("qwen2.5-1.5b-instruct", "lora", batch=8, seq=1024).text)

# %% [markdown]
# **Text description of the chart.** One bar, the predicted peak of the step on a GPU, stacked from the bottom:
# weights, gradients, optimizer states, activations and overhead (the buffers of backward). Four lines mark each
# GPU's *usable* memory, the card's less 0.5 GB of CUDA context: a T4 15.33 GB (of the 15.83 GB Colab's T4
# exposes), an L4 23.5 GB, an A100 40 GB 39.5 GB, an H100 79.5 GB. The legend gives each verdict: *fits* up to
# 90 % of usable, *tight* up to 100 % (the allocator's reserve and fragmentation can still fail it), *does not
# fit* above. For Qwen2.5-1.5B with LoRA at batch 8 × 1,024 tokens the bar reaches the peak printed above: only
# the H100 holds it, and activations are most of it. Tick *gradient checkpointing* and watch that part shrink.
