# %% [markdown]
# # Real models in 4 bits, and QLoRA
#
# Notebook 01 quantized one matrix. Here you quantize a whole language model, see where its memory goes, and
# fine-tune it the QLoRA way: a frozen 4-bit model with a small trainable adapter on top.
#
# **You will be able to**
# - load a model in 16 bits and in 4-bit NF4 with one `BitsAndBytesConfig`, and read its footprint;
# - explain why a 4-bit model is about a third of its 16-bit size, not a quarter;
# - set up QLoRA with `peft` and teach a model a new answer format in a few dozen steps.
#
# **Before you start:** notebook 01 (scales, blocks of 64, NF4).

# %% [setup] extras=["peft"]
# %% [markdown]
# ## Which model runs here?
#
# **SmolLM2-135M-Instruct**, a 135-million-parameter chat model by Hugging Face, small enough for any laptop. The
# next cell picks where its weights come from, and every line it prints says which ran:
# - the **Hub original**, if the Hugging Face Hub answers;
# - offline, a **packaged copy** installed with the course: the real model, but already rounded to 4 bits
#   (llama.cpp's Q4_1 format) by whoever packaged it;
# - if neither is there, a **stand-in**: the same architecture with random weights. Its sizes are real; its text
#   is noise.

# %%
import torch

from course_utils import footprint, models, standin, tickets
from course_utils.hardware import autocast_dtype, needs_loss_scaling, pick_device
from course_utils.progress import status
from course_utils.quiet import quiet_libraries
from course_utils.lessons import real_models_qlora as lesson

choice = standin.choose_model()  # one quick look for the Hub, no retries
print(choice.label)
print("why:", choice.reason)

# %% [markdown]
# ## The course's code: one model, two sizes
#
# The same `from_pretrained` call loads it twice: in 16 bits, and in 4-bit NF4 through a `BitsAndBytesConfig`.
# bitsandbytes (the library behind 4-bit loading) unpacks the 4-bit weights for the maths, in float16 on a T4 as
# written here. A CPU computes in float32 instead: its float16 maths is very slow.
#
# **Predict before you run.** 4 bits are a quarter of 16. What share of the 16-bit size will the 4-bit model take?

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

device = pick_device()  # the first CUDA GPU, else the CPU
dtype = autocast_dtype(device)  # the 16-bit type: bfloat16, or float16 on a T4
compute = dtype if device.type == "cuda" else torch.float32  # the 4-bit layers' maths
device_map = {"": 0} if device.type == "cuda" else "cpu"  # the whole model on one device
no_4bit = models.bitsandbytes_missing()  # None where bitsandbytes works, else why not

with quiet_libraries():  # no progress bars
    tokenizer = AutoTokenizer.from_pretrained(choice.name)
    model_16 = AutoModelForCausalLM.from_pretrained(choice.name, dtype=dtype, device_map=device_map)
    course_config = BitsAndBytesConfig(
        load_in_4bit=True,               # store the weights in 4 bits
        bnb_4bit_quant_type="nf4",       # the 4-bit format QLoRA uses
        bnb_4bit_compute_dtype=compute,  # the type the 4-bit weights are unpacked to for the maths
    )
    model_4 = None if no_4bit else AutoModelForCausalLM.from_pretrained(
        choice.name, dtype=dtype, device_map=device_map, quantization_config=course_config)

print(choice.label)
print(f"16-bit: {model_16.get_memory_footprint() / 1e6:.1f} MB, weights in {model_16.dtype}")
if model_4 is None:
    print(f"4-bit: skipped ({no_4bit})")
else:
    print(f"4-bit:  {model_4.get_memory_footprint() / 1e6:.1f} MB, unpacked to {compute} for the maths")
    scales_4 = footprint.measured_scale_bytes(model_4)  # as loaded: a CPU with AVX-512-bf16 repacks them at first use

# %% [markdown]
# Now ask both. The 4-bit answer should still be right: 4 bits cost little quality on this task.

# %% tags=["nbval-ignore-output"] nbval_reason="generated text; the check in the next cell compares what matters."
prompt = tokenizer("The capital of France is", return_tensors="pt").to(device)
answers = {}
for bits, model in (("16-bit", model_16), ("4-bit", model_4)):
    if model is not None:
        with quiet_libraries():
            out = model.generate(**prompt, max_new_tokens=10, do_sample=False)
        answers[bits] = tokenizer.decode(out[0], skip_special_tokens=True)
        print(f"{bits:6}", choice.show_text(answers[bits]))

# %%
print(choice.label, "every answer names Paris:", all("Paris" in a for a in answers.values()))

# %% [markdown]
# The packaged copy was already rounded to 4 bits once, so its "16-bit" weights are Q4_1 values written in 16
# bits: here the two answers can hardly differ in quality. The memory is the point: 41 % of the 16-bit size.
# With the Hub original, the quality comparison is a real one.

# %% [markdown]
# ## How it works: which parts get 4 bits?
#
# `load_in_4bit=True` turns every `nn.Linear` layer, except the output head, into a 4-bit `Linear4bit`. The
# **embedding table** (a token's row of 576 numbers), the **norms** and any **biases** keep 16 bits. PyTorch's
# *meta* device builds the architecture with shapes but no data, so this table costs no memory:

# %%
arch = models.meta_model(standin.STANDIN_CONFIG)  # shapes only: no weights
print(footprint.breakdown_table(arch, low_bits=4))

# %% [markdown]
# The embedding table is 21 % of this small model and stays 16-bit: 56.6 MB of its 109.8 MB. The lm_head adds
# nothing: it is *tied*, reusing the table's matrix. A bigger model gets closer to a quarter, because its linear
# layers grow with width × width and the table only with vocabulary × width. The course text's
# Qwen2.5-1.5B-Instruct, computed from its config file:

# %%
print(footprint.computed_sizes(models.QWEN25_CONFIG, "Qwen/Qwen2.5-1.5B-Instruct").summary())

# %% [markdown]
# **Try it.** Move the sliders: a Llama-shaped model of your width, depth and vocabulary. The 4-bit share falls
# towards 25 % as it gets wider and deeper, and rises with a bigger vocabulary or an untied head.

# %% tags=["nbval-ignore-output"] nbval_reason="a live widget; it needs a Jupyter front end to display."
lesson.four_bit_ratio_panel()

# %% [markdown]
# ### Your turn: a 4-bit size by hand
#
# Qwen3-4B-Instruct-2507 (the Unsloth example below) has 4,022,468,096 parameters: 3,633,315,840 in linear
# layers, an embedding table of 388,956,160 (its lm_head is tied to it) and 196,096 in norms. Its size in 4 bits,
# in GB (10⁹ bytes), as `get_memory_footprint()` counts it?

# %%
answer_gb = ...  # Qwen3-4B-Instruct-2507 in 4 bits, in GB
lesson.check_four_bit_size(answer_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# Linear layers at half a byte, the rest at 2 bytes: 3,633,315,840 × 0.5 + (388,956,160 + 196,096) × 2 =
# 2,594,962,432 bytes ≈ **2.59 GB**, 32 % of its 8.04 GB in 16 bits.
# </details>

# %% [markdown]
# ## Benefits and trade-offs
#
# - **Benefit:** linear weights take 0.5 byte instead of 2, so a model whose 16-bit weights would not fit can be
#   fine-tuned (QLoRA, below).
# - **Not a quarter:** embeddings, norms and biases stay 16-bit, and each block of 64 weights stores a scale.
# - **Some quality loss**, larger for small models: measure your task again after quantizing.
# - **Not faster for training:** with many tokens at once, and in every backward pass, each 4-bit block is unpacked
#   to 16 bits before the maths; only generation, a few tokens at a time, can read the 4 bits directly.

# %% [markdown]
# ## QLoRA, step 1: the usual 4-bit config
#
# QLoRA recipes add one line to the course's config: `bnb_4bit_use_double_quant=True`. Each block's float32
# scale (32 bits per 64 weights: 0.5 bit a weight) is itself stored in 8 bits, with one float32 scale per 256
# blocks. `get_memory_footprint()` counts neither, so count the scales directly:

# %%
qlora_config = BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute,
    bnb_4bit_use_double_quant=True,  # the scales in 8 bits too
)
if no_4bit:
    base = model_16  # without bitsandbytes: plain LoRA on the 16-bit model
    print(f"double quantization skipped ({no_4bit})")
else:
    with quiet_libraries():
        base = AutoModelForCausalLM.from_pretrained(choice.name, dtype=dtype, device_map=device_map,
                                                    quantization_config=qlora_config)
    plain, double = scales_4, footprint.measured_scale_bytes(base)  # both as loaded
    print(f"scales: {plain / 1e6:.2f} MB plain, {double / 1e6:.2f} MB double-quantized "
          f"({100 * (1 - double / plain):.0f} % less)")
del model_4  # the course's config has done its job

# %% [markdown]
# 4.7 MB saved on this model; on a big one about 0.37 bit per weight, some 0.3 GB on a 7B. Then peft, Hugging Face's
# adapter library: `prepare_model_for_kbit_training` readies the 4-bit model for training. It also **upcasts**
# the parts that stayed 16-bit to float32, for stable training, and that costs memory. Count it:

# %%
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

before_mb, table_before = base.get_memory_footprint() / 1e6, lesson.embedding_text(base)
if not no_4bit:
    models.keep_4bit_trainable_on_cpu(base)  # a CPU pitfall ("Going deeper")
    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=device.type == "cuda",
                                           gradient_checkpointing_kwargs={"use_reentrant": False})
print(f"footprint {before_mb:.1f} MB -> {base.get_memory_footprint() / 1e6:.1f} MB after the float32 upcast")
print(f"embedding table {table_before} -> {lesson.embedding_text(base)}")

# %% [markdown]
# The embedding table doubled: from 16 bits to 32 a number.
#
# ## QLoRA, step 2: a small adapter
#
# LoRA keeps a weight W (d_out × d_in) frozen and learns a low-rank change beside it, B·A, with A of r × d_in
# and B of d_out × r. Rank 16 on the seven projections of every layer (attention's q, k, v, o; the MLP's
# gate, up, down), exactly as in the Unsloth example below:

# %%
projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
lora_config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=projections,
                         task_type="CAUSAL_LM")
torch.manual_seed(0)  # the A matrices start random: the same start on every run
with quiet_libraries():  # a transformers deprecation notice
    qlora = get_peft_model(base, lora_config)
qlora.print_trainable_parameters()

# %% [markdown]
# 3.50 %, not "under 1 %". Each targeted matrix (d_out × d_in) gets **r × (d_in + d_out)** adapter numbers:
# for a square 576 × 576 one, 2 × 16 / 576 = 5.6 % of its weights. The model's share adds them up over every
# targeted matrix and divides by all parameters, the embedding table included (it gets no adapter). Wider models
# get smaller shares: SmolLM2 is 576 wide, the Unsloth example's Qwen3-4B 2,560:

# %%
from course_utils import lora

for config, name in ((standin.STANDIN_CONFIG, "SmolLM2-135M"), (models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507")):
    print(lora.lora_count(config, r=16, alpha=16, targets=projections, name=name).summary())

# %% [markdown]
# ### Your turn: QLoRA's two calls as one function
#
# Write `qlora_adapter(model)`: prepare the model for training, then add the adapter above (rank 16, lora_alpha
# 16, the seven projections, a causal language model) and return the peft model. The check runs it on
# SmolLM2-135M's shapes cut to two layers, in bfloat16 (no bitsandbytes needed), and compares what trains with
# the recipe.

# %%
def qlora_adapter(model):
    """Prepare the model for training, then add the course's LoRA adapter: return the peft model."""
    raise NotImplementedError  # your code: prepare_model_for_kbit_training, then LoraConfig and get_peft_model


lesson.check_qlora_adapter(qlora_adapter)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def qlora_adapter(model):
#     model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # as on this CPU
#     config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=projections,
#                         task_type="CAUSAL_LM")
#     return get_peft_model(model, config)  # the peft model, not the model passed in
# ```
#
# In this order: `prepare_model_for_kbit_training` freezes every parameter, so after `get_peft_model` it would
# freeze the adapters too. Typical slips: rank 8, only q_proj and v_proj, `lora_alpha` left at peft's default 8,
# no `task_type`, `modules_to_save`.
# </details>

# %% [markdown]
# ## QLoRA, step 3: teach it something you can see
#
# 04's project routes support tickets to a team, answering in strict JSON: `{"team": "billing"}`. The team in
# 04's case study has 900 labelled tickets and 102 dev cases: their figures. This notebook ships its own small
# set, written for the course, over four teams; the next cell counts it. The instruction asks for the JSON, so the
# untrained model gets a fair try, and a prose answer that names one team counts for the team.
#
# What is an answer worth without training? Two baselines on the same held-out tickets: always the most common
# training team, and the model as it is, prompt only. Chance is 1 in 4.

# %%
train, heldout = tickets.load_tickets("train"), tickets.load_tickets("heldout")
majority = tickets.majority_team(train)
always = tickets.score([tickets.answer_text(majority)] * len(heldout), heldout)
print(f"this notebook's tickets: {len(train)} to train on, {len(heldout)} held out")
print(f"chance: 1 in {len(tickets.TEAMS)}, {len(heldout) / len(tickets.TEAMS):.0f} of {len(heldout)} on average")
print(lesson.count_line(f"always {majority!r}", always.right, always.total),
      "(the most common training team; on a tie, the first)")

# %% tags=["nbval-ignore-output"] nbval_reason="greedy answers of the untrained model can change with the CPU's kernels; no check depends on these digits alone."
answers = tickets.route(qlora, tokenizer, heldout)
before = tickets.score(answers, heldout)
print(choice.label, f"prompt only: valid JSON {before.valid}/{before.total}")
print(lesson.count_line("prompt only", before.right, before.total))
print("first ticket:", choice.show_text(answers[0]))

# %% [markdown]
# **Predict:** after one step per training ticket, how many answers will be valid JSON? How many will name the
# right team? The check below can fail: the adapter must beat both baselines by at least k tickets, k chosen so
# that a random guesser passes less than 1 % of the time. The loop is plain PyTorch: the loss covers the answer
# only, and the optimizer sees only the adapter. Its learning rate, 1e-3, is high for so short a run; real
# recipes use about 2e-4 over thousands of steps.

# %%
optimizer = torch.optim.AdamW([p for p in qlora.parameters() if p.requires_grad], lr=1e-3)
scaler = torch.amp.GradScaler(device.type, enabled=needs_loss_scaling(compute))  # float16 only (notebook 02)
losses = []
qlora.train()
status(f"Training the adapter: {len(train)} steps, one ticket each …")
for ticket in train:
    batch = tickets.training_example(tokenizer, ticket, device)  # prompt + answer; labels on the answer
    loss = qlora(**batch).loss
    scaler.scale(loss).backward()  # gradients reach the adapter only: the 4-bit base is frozen
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    losses.append(loss.item())

answers = tickets.route(qlora, tokenizer, heldout)
after = tickets.score(answers, heldout)
k = tickets.margin_over_chance(len(heldout))  # a guesser reaches n/4 + k with a chance of 1 % or less
print(choice.label, "valid JSON after training on at least 90 %:", after.valid >= 0.9 * after.total)
print(choice.label, f"right team beats both baselines by at least {k} tickets:",
      after.right >= max(before.right, always.right) + k)

# %% tags=["nbval-ignore-output"] nbval_reason="counts after training on 4-bit weights can change with the processor's kernels; the checks above hold a wide margin."
print(f"valid JSON {before.valid}/{before.total} -> {after.valid}/{after.total}")
for label, right in ((f"always {majority!r}", always.right), ("prompt only", before.right), ("trained", after.right)):
    print(lesson.count_line(label, right, len(heldout)))
print(lesson.verdict(after.right, max(before.right, always.right), k, len(heldout)))
print(lesson.confusion_table(answers, heldout))
for ticket, answer in zip(heldout[:4], answers):  # a sample, next to the right team
    print(f"right: {ticket.team:<9} answered: {answer!r}")
print("loss, first and last 4 steps:", " ".join(f"{x:.2f}" for x in losses[:4]), "…",
      " ".join(f"{x:.2f}" for x in losses[-4:]))

# %% [markdown]
# Two things are learnt here: the format (valid JSON) and the routing (the right team). The verdict line says
# whether the routing beats what luck gives a guesser; the interval says how precisely a few dozen tickets can
# tell. These tickets are short and tidy; real ones are harder (04's team has French among theirs), so measure
# on held-out tickets of your own. The stand-in learns the format too, but with random weights it cannot read
# the tickets.

# %% [markdown]
# ## Knowledge check
#
# 1. A 4-bit weight is a quarter of a 16-bit one. Why is the 4-bit Qwen2.5-1.5B-Instruct 36 % of its 16-bit size?
#
# <details><summary>Show the answer</summary>
#
# Only the linear layers are quantized. The embedding table (15 % of its parameters), the norms and the biases
# stay 16-bit: 0.85 × 25 % + 0.15 × 100 % ≈ 36 %.
# </details>

# %% [markdown]
# 2. `get_memory_footprint()` says 1.12 GB. Is that what the model needs to run?
#
# <details><summary>Show the answer</summary>
#
# No, it is a lower bound. It counts parameters and buffers: not the 4-bit scales, the activations, the KV cache
# during generation or the CUDA context. QLoRA adds the float32 upcast, the adapter, its gradients and optimizer
# states.
# </details>

# %% [markdown]
# ## Recap
#
# - A `BitsAndBytesConfig` (NF4) passed to `from_pretrained` quantizes every linear layer as it loads; the
#   embedding table, norms and biases stay 16-bit.
# - So 4 bits give about a third, not a quarter: 41 % for SmolLM2-135M, 36 % for Qwen2.5-1.5B. Bigger models get
#   closer to 25 %.
# - QLoRA = a frozen 4-bit base (double quantization, `prepare_model_for_kbit_training` and its float32 upcast)
#   plus a LoRA adapter: r × (d_in + d_out) numbers per targeted matrix, at rank 16 3.50 % of SmolLM2's
#   parameters and 0.81 % of Qwen3-4B's.
# - A few dozen steps teach the format; whether they also teach the routing, only held-out examples can tell,
#   measured against baselines, with an interval.
#
# Next, mixed precision: fast 16-bit maths while the master weights stay in float32.

# %% [markdown]
# ## Going deeper (optional)
#
# The part-by-part chart, Llama 3 at 8 and 70 billion parameters, a CPU pitfall, and Qwen2.5-1.5B on a GPU.
# None of it is needed for notebook 02.

# %% [markdown]
# ### Part by part, as a chart

# %%
qwen = models.meta_model(models.QWEN25_CONFIG)
fp16 = model_16.get_memory_footprint()
fig = lesson.footprint_chart([
    ("SmolLM2-135M 16-bit (loaded)", footprint.footprint_parts(model_16, 16), fp16),
    ("SmolLM2-135M 4-bit (computed)", footprint.footprint_parts(model_16, 4), fp16),
    ("Qwen2.5-1.5B 16-bit (computed)", footprint.footprint_parts(qwen, 16), footprint.footprint_bytes(qwen, 16)),
    ("Qwen2.5-1.5B 4-bit (computed)", footprint.footprint_parts(qwen, 4), footprint.footprint_bytes(qwen, 16)),
])

# %% [markdown]
# **Text description of the chart.** Four horizontal stacked bars, each a percentage of the same model's 16-bit
# footprint, with a dashed line at 25 %. Red is the embedding table, blue the linear layers, grey the norms,
# biases and buffers (too thin to see). SmolLM2-135M: 16-bit 269.0 MB, 4-bit 109.8 MB (41 %), of which the
# embedding table is 56.6 MB. Qwen2.5-1.5B: 16-bit 3.09 GB, 4-bit 1.12 GB (36 %), of which the table is 0.47 GB.
# In both 4-bit bars the blue part shrinks to a quarter and the red part does not.

# %% [markdown]
# ### Bigger models: Llama 3
#
# The same count for Meta's Llama 3 at 8 and 70 billion parameters, from their config files (untied heads;
# grouped-query attention, where 8 key/value heads serve all the query heads):

# %%
for config, name in ((footprint.LLAMA3_8B, "Llama-3-8B"), (footprint.LLAMA3_70B, "Llama-3-70B")):
    print(footprint.config_ratio_report(config, name), end="\n\n")

# %% [markdown]
# ### A CPU pitfall: 4-bit weights repacked for inference
#
# On CPUs with AVX-512-bf16 (recent Intel Xeons), bitsandbytes repacks 4-bit weights into a faster inference
# layout the first time they run without gradients (a `generate`), and repacked weights can no longer be
# trained: the next step fails with "a view of a leaf Variable that requires grad...". So the QLoRA cell calls
# `models.keep_4bit_trainable_on_cpu`, which sets `support_avx512bf16_for_cpu = False` on every `Linear4bit`.
# It costs only CPU generation speed; on a GPU it changes nothing.
#
# **Check yourself.** You `generate` with a 4-bit model from a plain `from_pretrained` on a laptop CPU, then start
# QLoRA, and the first step fails with that error. What happened?
#
# <details><summary>Show the answer</summary>
#
# The CPU has AVX-512-bf16: the no-grad `generate` repacked the 4-bit weights, and repacked weights cannot be
# trained. Load again and switch the repacking off before generating, or train first.
# </details>

# %% [markdown]
# ### The Unsloth version, in a runtime of its own
#
# Unsloth, an open-source library of faster GPU kernels for fine-tuning, does QLoRA's two steps in two calls. It
# patches torch, transformers and peft when it is imported, so it must come first in a kernel that has not loaded
# them: not this one. In a fresh runtime with a CUDA GPU (Colab: Runtime > Change runtime type > T4 GPU), run
# `!pip install unsloth` in the first cell and this in the second; it downloads Qwen3-4B-Instruct-2507 from the Hub.
#
# ```python
# from unsloth import FastLanguageModel  # first: before torch, transformers and peft
#
# model, tokenizer = FastLanguageModel.from_pretrained(
#     model_name="unsloth/Qwen3-4B-Instruct-2507", max_seq_length=2048, load_in_4bit=True)  # frozen 4-bit base
# model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, target_modules=[
#     "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # the adapter of step 2
# model.print_trainable_parameters()  # under 1 %, as counted for Qwen3-4B in step 2
# ```

# %% [markdown] slide="notes"
# ### On a GPU: what changes
#
# With a CUDA GPU (a Colab T4 is enough) every cell above runs on it: the 16-bit model in float16 on a T4 or
# bfloat16 on Ampere and newer, the 4-bit maths in the same type, QLoRA with gradient checkpointing, the same
# training steps (with loss scaling in float16). The Unsloth version above runs in a runtime of its own.
# With the Hub, the next cell also loads Qwen2.5-1.5B-Instruct itself in 4 bits and measures what the meta device
# computed: about 1.1 GB.

# %%
from course_utils.hub import LESSON_MODEL

why_not = standin.lesson_model_skip_reason(choice, no_4bit)
if why_not:
    print(f"{LESSON_MODEL} not loaded: {why_not}.")
else:
    qwen_4 = models.load_model(LESSON_MODEL, bits=4)
    print(f"[{LESSON_MODEL}] 4-bit, measured: {qwen_4.get_memory_footprint() / 1e9:.2f} GB; computed: "
          f"{footprint.footprint_bytes(qwen, 4) / 1e9:.2f} GB")
    qwen_answer = models.generate_text(qwen_4, models.load_tokenizer(LESSON_MODEL), "The capital of France is")
    print(f"[{LESSON_MODEL}] answer: {qwen_answer!r}")
    del qwen_4

# %% [markdown]
# ### Run it yourself: check your answers with the course's counters
#
# Compute Qwen3-4B-Instruct-2507's sizes (your first exercise), and count a smaller adapter than the recipe's,
# rank 8 on `q_proj` and `v_proj`, on SmolLM2-135M and on Qwen3-4B.

# %%
# Your code here. Useful: footprint.computed_sizes, lora.lora_count(..., r=8, targets=[...])

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# ```python
# print(footprint.computed_sizes(models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507").summary())
# for config in (standin.STANDIN_CONFIG, models.QWEN3_CONFIG):
#     print(lora.lora_count(config, r=8, alpha=16, targets=["q_proj", "v_proj"]).summary())
# ```
#
# Qwen3-4B-Instruct-2507: 8.04 GB in 16 bits, 2.59 GB in 4 bits, **32 %**. Rank 8 on q_proj and v_proj trains
# 460,800 numbers on SmolLM2-135M (0.34 %) and 2,949,120 on Qwen3-4B (0.07 %).
# </details>
