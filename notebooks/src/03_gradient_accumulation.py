# %% [markdown]
# # Gradient accumulation: several trips
#
# When the batch you want does not fit in GPU memory, carry it in smaller trips. Gradient accumulation runs it
# as **micro-batches** (slices that fit), adds up their gradients and updates the weights once.
#
# **You will be able to**
# - compute *effective batch = micro-batch × accumulation steps × GPUs*;
# - show that four micro-batches give one big batch's gradient, and spot the bug that makes it 4× too big;
# - say what a smaller micro-batch saves (memory) and costs (time), and avoid the padding trap;
# - write the loop in PyTorch and in the Hugging Face `Trainer`.
#
# Runs on a laptop CPU; no GPU needed.

# %% [setup]
# %% [markdown]
# ## Why accumulate gradients?
#
# A bigger batch averages the gradient over more examples: steadier training. But training keeps every layer's
# **activations** (its outputs, needed again by the backward pass) in memory, and they grow with the batch;
# weights, gradients and optimizer state do not. So the batch a recipe asks for may not fit on your GPU.

# %% [markdown]
# ## How it works
#
# 1. Split the batch into micro-batches that fit: a batch of 64 becomes 4 micro-batches of 16.
# 2. Run forward and backward on each. PyTorch **adds** each gradient into `.grad`; divide each loss by 4, so
#    the sum becomes the average.
# 3. After the 4th, step the optimizer once and reset the gradients to zero.
#
# One micro-batch's activations are alive at a time: the memory of 16 examples, the update of 64.
#
# $$\text{effective batch} = \underbrace{\text{micro-batch}}_{\text{what fits in memory}} \times
# \underbrace{\text{accumulation steps}}_{\text{micro-batches per update}} \times
# \underbrace{\text{GPUs}}_{\text{data-parallel copies}}$$
#
# Data parallelism (next module) gives each GPU a model copy and a share of the batch; with one GPU, the factor
# is 1.

# %%
print("micro-batch  steps  GPUs  effective batch")
for micro, steps, gpus in [(16, 4, 1), (4, 16, 1), (2, 8, 1), (16, 4, 2)]:
    print(f"{micro:>11}  {steps:>5}  {gpus:>4}  {micro * steps * gpus:>15}")

# %% [markdown]
# The micro-batch must divide the batch: with 24, the last trip's 16 examples would weigh more than the others.
# The course's helper refuses such sizes:

# %%
from course_utils import accumulation
from course_utils.lessons import gradient_accumulation as lesson

print("steps for 64 in micro-batches of 16:", accumulation.accumulation_steps_for(64, micro_batch_size=16))
try:
    accumulation.accumulation_steps_for(64, micro_batch_size=24)
except ValueError as err:
    print("micro-batch 24: ValueError:", err)

# %% [markdown]
# ### Check it: four trips, one gradient
#
# One batch of 64 against four micro-batches of 16, on the smallest model there is: a linear layer from 10
# numbers to 1, with the mean squared error as the loss.

# %%
import torch

torch.manual_seed(0)
model = torch.nn.Linear(10, 1)
x, y = torch.randn(64, 10), torch.randn(64, 1)
loss_fn = torch.nn.MSELoss()

# One trip: the whole batch of 64
loss_fn(model(x), y).backward()
full_batch_grad = model.weight.grad.clone()
model.zero_grad()

# Four trips of 16: each backward() adds its gradient into .grad
accumulation_steps = 4
for xb, yb in zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps)):
    loss = loss_fn(model(xb), yb) / accumulation_steps  # divide, so the sum of 4 gradients is their average
    loss.backward()

print("same gradient:", torch.allclose(full_batch_grad, model.weight.grad))

# %% tags=["nbval-ignore-output"] nbval_reason="the last digits of a rounding difference depend on the CPU and its maths library."
print(f"largest difference: {(full_batch_grad - model.weight.grad).abs().max():.1e}")

# %% [markdown]
# `torch.allclose` (equal within a small tolerance) says yes. The tiny difference is float32 rounding, which
# varies between processors ("Going deeper" shows why): compare the yes/no, not the digits.
#
# **Predict before you run:** you forget to divide each loss by 4. A little off, or off by a fixed factor?

# %%
model.zero_grad()
for xb, yb in zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps)):
    loss_fn(model(xb), yb).backward()  # the bug: no "/ accumulation_steps"

print("same gradient:", torch.allclose(full_batch_grad, model.weight.grad))
print(f"size against the full batch's gradient: {model.weight.grad.norm() / full_batch_grad.norm():.2f}x")

# %% [markdown]
# Exactly 4× too large: `.grad` holds the **sum** of four averages. With plain SGD that is a learning rate 4×
# too high; with gradient clipping (capping the gradient's size), clipping 4× too hard.

# %% [markdown]
# ### Your turn: the accumulation loop
#
# Write `accumulation_step`: one update on the batch `(x, y)`, run as `micro_batches` slices
# (`x.chunk(micro_batches)`), that moves the weights exactly as one step on the whole batch would. Return the
# batch's loss (`loss_fn`). The check runs three updates with plain SGD; the last cuts 10 examples into 3, 3, 3
# and 1, so weigh every example equally.

# %%
def accumulation_step(model, optimizer, x, y, micro_batches):
    """One optimizer update on the batch (x, y), run as micro_batches slices; returns the batch's mean loss."""
    raise NotImplementedError  # your code: zero the gradients, backward each slice's weighted loss, step once


lesson.check_accumulation_step(accumulation_step)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def accumulation_step(model, optimizer, x, y, micro_batches):
#     """One optimizer update on the batch (x, y), run as micro_batches slices; returns the batch's mean loss."""
#     optimizer.zero_grad()
#     total = 0.0
#     for xb, yb in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
#         loss = loss_fn(model(xb), yb) * len(xb) / len(x)  # each example weighs 1 / len(x)
#         loss.backward()                                   # adds into .grad
#         total += loss.item()
#     optimizer.step()                                      # one update for the whole batch
#     return total
# ```
#
# With equal slices, `len(xb) / len(x)` is 1 / `micro_batches`: the division above. Typical slips: no division
# (4× too large); zero_grad or the step inside the loop; no zero_grad at all (the next update carries this
# one's gradient); dividing by `micro_batches` on the uneven split (the lone example weighs 1/4, the others
# 1/12).
#
# </details>

# %% [markdown]
# ## Interactive demo: a batch of 64 on a GPU that fits 16
#
# A model with real activations: a multilayer perceptron (256 inputs, three hidden layers of 512, one output).
# The sweep runs one batch of 64 at micro-batch sizes 1 to 64: steps, gradient check, **activation memory** of
# one micro-batch, **time** for all 64 examples.
#
# **Predict before you run:** from micro-batches of 64 down to 1, what happens to memory? To time?

# %%
from course_utils.progress import status

status(f"Running the batch of 64 at {len(accumulation.MICRO_BATCH_SIZES)} micro-batch sizes …")
rows = accumulation.sweep_micro_batches(accumulation.MICRO_BATCH_SIZES, batch_size=64)
print("activation memory measured as:", rows[0].memory_what)
print(accumulation.sweep_table(rows, measured=False))
print(accumulation.proportion_check(rows))

# %% [markdown]
# Every size gives the batch's gradient. Now the costs, measured here. The dashed line: a pretend GPU with room
# for 16 examples' activations.

# %% tags=["nbval-ignore-output"] nbval_reason="memory and times are measured on this machine."
import matplotlib.pyplot as plt

budget = accumulation.find_row(rows, 16).activation_bytes  # the pretend GPU: room for 16 examples' activations
lesson.plot_micro_batch_sweep(rows, highlight=16, budget_bytes=budget)
plt.show()
print(accumulation.sweep_table(rows))

# %% [markdown]
# **Text description of the chart.** Two panels; horizontal axis: micro-batch size, 1 to 64, doubling. Left:
# activation memory of one micro-batch (log scale), a straight line doubling with the micro-batch; sizes 1 to
# 16 sit under the dashed line, 32 and 64 above. Right: time for all 64 examples (log scale), falling steeply as
# micro-batches grow, then flattening. The table gives the values.

# %% [markdown]
# **On a GPU the time gap is wider.** This sweep runs on one CPU core; small micro-batches mostly pay each
# trip's fixed cost (Python, one call per layer). A GPU is fast only on big matrices: an NVIDIA T4 has 2,560
# CUDA cores and 320 tensor cores (65 trillion fp16 operations a second, datasheet); one example leaves most
# of them idle.

# %% [markdown]
# Try it live: pick a micro-batch size (reuses the measurements above; needs a running notebook).

# %% tags=["nbval-ignore-output"] nbval_reason="a widget view, which nbval cannot render."
lesson.micro_batch_widget(rows, budget_bytes=budget, value=16)

# %% [markdown]
# ## Benefits and trade-offs
#
# **Benefits**
# - A big effective batch on a small GPU: the pretend GPU runs 64 as 4 trips of 16.
# - The same gradient as the big batch, up to tiny rounding differences.
# - One setting in most libraries.
#
# **Trade-offs**
# - **Slower than a real big batch**: same arithmetic, but small micro-batches keep the hardware less busy.
# - **Only activation memory shrinks.** Weights, gradients and optimizer states stay the same size.
# - **Fewer updates per epoch**: tune the learning rate for the effective batch size.
# - **Batch normalization** (normalizing with the batch's statistics) sees one micro-batch at a time;
#   transformers' layer normalization works per example.

# %% [markdown] slide="notes"
# A common claim: `per_device_train_batch_size=4` with `gradient_accumulation_steps=16` costs "16× compute per
# step". It takes about 16× a batch of 4's time, but the work equals a batch of 64's; only efficiency drops.

# %% [markdown]
# ## In practice
#
# ### The loop
#
# 256 examples of 10 numbers, loaded in micro-batches of 16; one optimizer step every 4. Each update prints the
# sum of its four divided losses: the effective batch's loss.

# %%
from torch.utils.data import DataLoader

data = accumulation.regression_dataset(256)
loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
model = accumulation.TinyRegressor().net  # 10 -> 32 -> 1, the same starting weights every time
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

accumulation_steps = 4  # 4 micro-batches of 16 = an effective batch of 64
update_loss = 0.0
for step, (x, y) in enumerate(loader):  # the loader yields micro-batches of 16
    loss = loss_fn(model(x), y) / accumulation_steps
    loss.backward()                     # gradients add up in .grad
    update_loss += loss.item()
    if (step + 1) % accumulation_steps == 0:
        optimizer.step()                # one update per 64 examples
        optimizer.zero_grad()
        print(f"update {(step + 1) // accumulation_steps}: loss {update_loss:.3f}")
        update_loss = 0.0

# %% [markdown]
# Really a batch of 64? Train a copy on real batches of 64, same order and learning rate, and compare:

# %%
model_big = accumulation.TinyRegressor().net  # the same starting weights
optimizer = torch.optim.SGD(model_big.parameters(), lr=0.05)
for x, y in DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)):
    loss_fn(model_big(x), y).backward()  # one batch of 64 per update
    optimizer.step()
    optimizer.zero_grad()

print("same weights after 4 updates:", accumulation.same_weights(model, model_big))

# %% [markdown]
# ### The same in the Hugging Face `Trainer`
#
# One setting: `per_device_train_batch_size` is the micro-batch, `gradient_accumulation_steps` the micro-batches
# per update. The `Trainer` divides the loss, steps every 4 micro-batches and logs the loss. Four updates, each
# way:

# %%
import tempfile

from course_utils.quiet import quiet_libraries

with quiet_libraries():  # no library warnings or progress bars in this block
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    def train_hf(micro_batch_size, accumulation_steps):
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=micro_batch_size,    # the micro-batch: what fits in memory
            gradient_accumulation_steps=accumulation_steps,  # effective batch: micro-batch x steps, per GPU
            logging_steps=1,                                 # log the loss after every update
            max_steps=4, learning_rate=0.05, lr_scheduler_type="constant",
            save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
        )
        model = accumulation.TinyRegressor()  # the same network; forward(x, labels) returns {"loss": ...}
        trainer = Trainer(model=model, args=args, train_dataset=accumulation.DictDataset(data))
        trainer.remove_callback(PrinterCallback)  # keep the log lines (and their run times) off the output
        trainer.train()
        return model, torch.tensor([log["loss"] for log in trainer.state.log_history if "loss" in log])

    model_hf_acc, losses_acc = train_hf(16, accumulation_steps=4)
    model_hf_big, losses_big = train_hf(64, accumulation_steps=1)

print("16 x 4 losses:", [round(v, 2) for v in losses_acc.tolist()])
print("64 x 1, same losses:", torch.allclose(losses_acc, losses_big), " same weights:",
      accumulation.same_weights(model_hf_acc, model_hf_big))

# %% [markdown]
# **Libraries**: plain PyTorch (the loop above), the Hugging Face `Trainer` (`gradient_accumulation_steps`),
# Accelerate (`accelerator.accumulate(model)`), PyTorch Lightning (`accumulate_grad_batches`) and DeepSpeed
# (`gradient_accumulation_steps`).

# %% [markdown]
# ### The padding trap: count tokens, not micro-batches
#
# Language models average the loss over **tokens** (word pieces). Sequences are padded to the longest in their
# micro-batch; padding carries the label −100 and adds no loss. So micro-batches can hold very different numbers
# of real tokens. Sequences of 30, 28, 4 and 2 tokens, in two micro-batches of two:

# %%
import torch.nn.functional as F

tokens, labels = accumulation.padded_token_batch(lengths=(30, 28, 4, 2))  # padding: token 0, label -100
token_model = accumulation.TinyTokenModel()  # an embedding and a linear head: one loss per token


def token_loss(tokens, labels, reduction):
    """Cross-entropy over the real tokens: positions labelled -100 are skipped."""
    logits = token_model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction=reduction)


def take_gradients():
    grads = [p.grad.clone() for p in token_model.parameters()]
    token_model.zero_grad()
    return grads


token_loss(tokens, labels, "mean").backward()  # the big batch: the mean over all its real tokens
big_batch = take_gradients()
print("real tokens per micro-batch:", [int((lb != -100).sum()) for lb in labels.chunk(2)])

# %% [markdown]
# **Predict before you run:** each micro-batch's mean token loss, divided by the number of micro-batches. Does
# that give the big batch's gradient here?

# %%
for tb, lb in zip(tokens.chunk(2), labels.chunk(2)):
    (token_loss(tb, lb, "mean") / 2).backward()  # mean per micro-batch, / 2 micro-batches

naive = take_gradients()
print("naive, same gradient:", all(torch.allclose(a, b) for a, b in zip(big_batch, naive)))

# %% [markdown]
# No. The big batch weighs each of its 64 tokens 1/64. The naive loop gives each micro-batch half the weight:
# its 58 tokens get 1/116 each, the other 6 get 1/12, ten times more. Short sequences dominate.
#
# **The fix**: sum each micro-batch's token losses and divide by the real tokens of the **whole** batch.

# %%
n_tokens = int((labels != -100).sum())  # all the batch's real tokens: 64
for tb, lb in zip(tokens.chunk(2), labels.chunk(2)):
    (token_loss(tb, lb, "sum") / n_tokens).backward()  # sum per micro-batch, / all real tokens

fixed = take_gradients()
print("fixed, same gradient:", all(torch.allclose(a, b) for a, b in zip(big_batch, fixed)))

# %% [markdown]
# With equal real-token counts (no padding, or sequences packed end to end) the naive loop is exact.
#
# ### Your turn: the batch's loss from its micro-batches
#
# Your loop logs each micro-batch's **mean** token loss and its real-token count. Write `batch_loss`: the big
# batch's loss, the mean over all its real tokens. Means `[2.0, 4.0]` over `[1, 3]` tokens give 3.5.

# %%
def batch_loss(mean_losses, token_counts):
    """The batch's mean loss per real token, from each micro-batch's mean token loss and real-token count."""
    raise NotImplementedError  # your code: turn each mean back into a sum, add them up, divide by all tokens


lesson.check_batch_loss(batch_loss)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def batch_loss(mean_losses, token_counts):
#     summed = sum(mean * n for mean, n in zip(mean_losses, token_counts))  # each micro-batch's summed loss
#     return summed / sum(token_counts)                                     # divided by all the real tokens
# ```
#
# `sum(mean_losses) / len(mean_losses)` is the padding trap (it gives 3.0 on the example); `sum(mean_losses)`
# forgets the division. Because the gradient follows the loss, this is also the fix for training: micro-batch
# *i* back-propagates `mean_i * n_i / total_tokens`, its summed token loss divided by the batch's token count.
#
# </details>

# %% [markdown]
# ## Knowledge check
#
# **1.** The recipe says batch 256. You have 2 GPUs, each fitting micro-batches of 16. How many accumulation
# steps per GPU?
#
# <details><summary>Show the answer</summary>
#
# 256 = 16 × steps × 2, so **8** steps: `accumulation.accumulation_steps_for(256, 16, world_size=2)`.
#
# </details>
#
# **2.** Gradient accumulation cuts the memory of a 7-billion-parameter model's training from 120 GB to 30 GB.
# True or false?
#
# <details><summary>Show the answer</summary>
#
# **False** as stated. Accumulation shrinks only the activations. The weights, gradients and Adam's two
# moments (about 16 bytes per parameter in mixed precision, so about 112 GB for 7B parameters) stay the same
# size. For those you need the other tricks: quantization, LoRA, 8-bit optimizers.
#
# </details>

# %% [markdown]
# **3.** Your loop divides each micro-batch's mean token loss by the number of micro-batches, and the batches
# are padded. Is the gradient right?
#
# <details><summary>Show the answer</summary>
#
# Only if every micro-batch holds the same number of real tokens. Otherwise tokens in short micro-batches weigh
# more. Divide each micro-batch's **sum** of token losses by the total number of real tokens in the whole
# batch.
#
# </details>
#
# **4.** Four micro-batches of 16 take longer than one batch of 64, with the same arithmetic. Why?
#
# <details><summary>Show the answer</summary>
#
# Smaller matrices use the hardware less efficiently (a GPU needs large matrices to keep its cores busy), and
# every micro-batch pays fixed costs: launching kernels, Python overhead, running through every layer. The
# trips run one after another, not in parallel.
#
# </details>

# %% [markdown]
# ## Comparing the three tricks
#
# | Technique | What changes? | Main benefit | Main trade-off |
# | --- | --- | --- | --- |
# | Quantization | How numbers are stored | Less memory, faster inference | Some quality loss |
# | Mixed precision | The precision of the maths | Faster training, less activation memory | Numerical care: loss scaling and the right GPU |
# | Gradient accumulation | When the weights are updated | Big batches on a small GPU | Slower than a real big batch |
#
# Every trick trades memory, speed, quality or cost, so none is best. Ask: what is my bottleneck, and what will
# I trade to remove it? Out of activation memory, with time to spare: accumulate.

# %% [markdown]
# ## Recap
#
# - Micro-batches, gradients added in `.grad`, each loss divided by the steps, one update.
#   *Effective batch = micro-batch × accumulation steps × GPUs.* Forget the division: a gradient 4× too large.
# - Big-batch stability with small-batch memory; the cost is time, as the micro-batches run one after another.
# - With padding, divide summed token losses by the batch's real-token count.
# - In the `Trainer`: `gradient_accumulation_steps`. A bigger effective batch: revisit the learning rate.

# %% [markdown]
# ## Going deeper (optional)
#
# For after class: why "the same" gradient differs in its last digits, the learning rate for a bigger batch,
# how the `Trainer` handles padded batches, how the sweep measured memory and time, and a preview of the next
# module: accumulation on several GPUs with PyTorch's distributed data parallel (DDP), checked here with two
# processes on the CPU.
#
# ### Why the last digits differ
#
# A float32 number keeps about 7 significant digits, so every addition rounds, and **the order of the
# additions changes the rounding**. The big batch sums 64 terms in one go (in whatever order the maths library
# chooses, which depends on the CPU and on how the work is split between threads); accumulation sums four
# partial sums of 16. The mathematics is identical; the rounding is not. An extreme case in float32:

# %%
a, b, c = torch.tensor([1e8, -1e8, 1.0])
print("(a + b) + c =", ((a + b) + c).item())
print("a + (b + c) =", (a + (b + c)).item(), " <- 1 is lost: -1e8 + 1 rounds back to -1e8")

# %% [markdown]
# ### The learning rate for a bigger batch
#
# Accumulating up to the batch a recipe was tuned for needs no change: the gradient is the same, as the runs
# above show. But if accumulation lets you *grow* the batch (say from 16 to 64), you make 4× fewer updates per
# epoch, each averaged over more examples, and the old learning rate is probably too small. Common starting
# points scale it with the batch (the "linear" rule, usual for SGD) or with its square root (often used with
# Adam); then tune it, with a warm-up, on a short run.

# %%
for rule in ("linear", "sqrt"):
    print(f"{rule:>6} rule, 2e-4 tuned at batch 16, now batch 64: start from "
          f"{accumulation.scale_learning_rate(2e-4, base_batch=16, new_batch=64, rule=rule):.0e}")

# %% [markdown]
# ### Padded batches in the `Trainer`
#
# For models whose `forward` accepts `num_items_in_batch` (its causal language models do), the `Trainer` counts
# the label tokens of all the micro-batches of an update and passes that count in, so the model divides its
# summed token loss by it: the fix above. In your own loop you do it yourself.
#
# ### How the sweep measured memory and time
#
# - **On a GPU**, the activation memory is what CUDA holds after one micro-batch's forward pass, above the
#   weights and gradients already held: the activations saved for the backward pass, read *before* backward.
#   The backward pass also allocates temporaries the size of each weight matrix, whatever the micro-batch;
#   those are not activations, and reading after backward would hide the small micro-batches' activations.
# - **On a CPU** there is no such counter, so the sweep counts the bytes autograd saves for the backward pass,
#   with `torch.autograd.graph.saved_tensors_hooks` (each storage counted once, parameters left out). For the
#   sweep's MLP, each example saves its input (256 numbers), each hidden layer's output before and after GELU
#   (its activation function, 2 × 512 × 3), the output and the target: 3,330 float32 numbers, 13,320 bytes.
# - **Time** is measured with `torch.utils.benchmark`. On a CPU the sweep uses one thread: with several, each
#   tiny operation waits until all its threads get a core, and on a busy machine that waiting, not the maths,
#   would dominate the times.

# %% [markdown]
# ### × GPUs: accumulation with data parallelism
#
# The last factor of the formula. With **distributed data parallel** (DDP), each process (one per GPU, called
# a *rank*) holds a full copy of the model and takes its own slice of the batch. After the backward pass, DDP
# **all-reduces** the gradients: it averages them across ranks, so every copy ends with the gradient of the
# whole batch and takes the same step.
#
# Accumulation combines with it: each rank runs its slice as micro-batches. During all but the last
# micro-batch, `no_sync()` tells DDP to skip the all-reduce and just add up locally; the last backward pass
# averages everything in one round of communication. Here is the body each rank runs (from
# `course_utils.ddp`):

# %%
import inspect

from course_utils import ddp

print(inspect.getsource(ddp.accumulate_on_rank))

# %% [markdown]
# `no_sync()` wraps the forward pass as well as the backward pass: DDP decides during the forward pass whether
# the coming backward will communicate. Wrapping only `loss.backward()` silently all-reduces every micro-batch,
# an easy mistake that the all-reduce count below would catch.
#
# Now the real thing: 2 processes started with `torch.multiprocessing`, talking through the `gloo` backend
# (PyTorch's CPU backend) on 127.0.0.1. Each runs 4 micro-batches of 8, so the effective batch is 8 × 4 × 2 =
# 64. Each rank sends its gradient back, and we compare it with one process computing the batch of 64 in one
# go. A time limit stops the run if it ever stalls.

# %% [markdown] slide="notes"
# Most of the time goes into starting the processes. On Linux and macOS a server process imports PyTorch once
# and forks the two ranks from it (the `forkserver` start method); on Windows each rank starts from scratch
# (`spawn`), which is slower.

# %%
status("Starting 2 processes and running the update on each …")
result = ddp.run_ddp_check(world_size=2, batch_size=64, accumulation_steps=4, backend="gloo", timeout_s=120)
print(result.report())

# %% tags=["nbval-ignore-output"] nbval_reason="wall time and rounding digits depend on the machine."
print(f"largest difference from one process's batch of 64: {result.max_difference:.1e}")
print(f"wall time, including starting the 2 processes: {result.seconds:.1f} s")

# %% [markdown]
# The formula's "× GPUs", checked rather than stated: two ranks × four micro-batches × 8 examples give the
# gradient of one batch of 64, with a single all-reduce per update. Without `no_sync()` the gradient is the
# same, but the ranks talk after every micro-batch: 4 rounds of communication instead of 1, which on real
# GPUs across a network is time you pay for nothing.
#
# **On N GPUs only the backend changes**: `run_ddp_check(world_size=N, backend="nccl")` puts rank *r* on GPU
# *r* (`nccl` is NVIDIA's library for GPU-to-GPU communication); the training code is the same. The next cell
# runs it on a machine with two GPUs or more.

# %% tags=["nbval-ignore-output"] nbval_reason="what this cell does depends on how many GPUs the machine has."
if ddp.pick_backend(world_size=2) == "nccl":  # "nccl" when there is a CUDA GPU for each of 2 processes
    gpus = torch.cuda.device_count()
    print(ddp.run_ddp_check(world_size=gpus, batch_size=64 * gpus, accumulation_steps=4, backend="nccl").report())
else:
    print("Skipped: the GPU version needs two or more NVIDIA GPUs, one per process. Colab and most laptops "
          "have at most one; the gloo run above is the same check, on the CPU.")

# %% [markdown]
# On a multi-GPU machine you would usually launch a script with `torchrun`, which starts one process per GPU
# and sets the rank for you:
#
# ```python
# # train.py, started with:  torchrun --nproc_per_node=4 train.py
# import os, torch, torch.distributed as dist
# from torch.nn.parallel import DistributedDataParallel
#
# backend = "nccl"                                   # "gloo" on CPU: the only line that changes
# dist.init_process_group(backend)                   # torchrun tells each process its rank and the world size
# local_rank = int(os.environ["LOCAL_RANK"])         # which GPU of this machine is mine
# device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
# model = DistributedDataParallel(model.to(device), device_ids=[local_rank] if backend == "nccl" else None)
# # each update: accumulate_on_rank(model, x_slice, y_slice, accumulation_steps); optimizer.step(); optimizer.zero_grad()
# ```
#
# In the Hugging Face `Trainer` there is nothing to change in the code: launched with `torchrun`, its
# effective batch is `per_device_train_batch_size × gradient_accumulation_steps × number of processes`.
