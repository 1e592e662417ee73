# %% [markdown]
# # Gradient accumulation: several trips
#
# Your GPU's memory is a backpack. When the batch you want does not fit, make several smaller trips and add
# up what each one brings back. Gradient accumulation runs a big batch as a series of micro-batches and
# updates the weights once, with the same gradient the big batch would give.
#
# **What you will be able to do**
# - compute *effective batch = micro-batch × accumulation steps × GPUs*;
# - show that four micro-batches give the gradient of one big batch, and spot the bug that makes it 4× too big;
# - measure what a smaller micro-batch saves (activation memory) and what it costs (time);
# - avoid the padding trap that silently changes the gradient of language models;
# - write the loop yourself and switch it on in the Hugging Face `Trainer`.
#
# Running every cell takes about a minute on a laptop CPU; no GPU needed.

# %% [setup]

# %% [markdown]
# ## Why accumulate gradients?
#
# Bigger batches average the gradient over more examples, so each update is less noisy and training is
# steadier. Many published recipes assume a batch of 64, 256 or more. But a training step keeps every layer's
# **activations** in memory until the backward pass has used them, and that memory grows with the number of
# examples in the batch. The weights, their gradients and the optimizer's state do not depend on the batch
# size; the activations do. So the batch you want may simply not fit on your GPU.

# %% [markdown]
# ## How it works
#
# 1. Split the batch you want into **micro-batches** that fit: a batch of 64 becomes 4 micro-batches of 16.
# 2. Run forward and backward on each micro-batch in turn. PyTorch does not overwrite `.grad`: it **adds** each
#    new gradient to it. Divide each micro-batch's loss by 4, so that the sum of four gradients becomes their
#    average.
# 3. After the 4th micro-batch, step the optimizer once and reset the gradients to zero.
#
# Only one micro-batch's activations are alive at a time: the memory of a batch of 16, the update of a batch
# of 64.

# %% [markdown]
# With several GPUs, each holding a copy of the model (data parallelism, the next module's topic), every GPU
# does this on its own share of the batch. On Colab or a laptop, GPUs = 1.
#
# $$\text{effective batch} = \underbrace{\text{micro-batch}}_{\text{what fits in memory}} \times
# \underbrace{\text{accumulation steps}}_{\text{micro-batches per update}} \times
# \underbrace{\text{GPUs}}_{\text{data-parallel copies}}$$
#
# The helpers in `course_utils.accumulation` do this arithmetic and refuse sizes that cannot work.

# %%
from course_utils import accumulation as acc

print("16 x 4 on one GPU:  ", acc.effective_batch_size(16, accumulation_steps=4))
print("4 x 16 on one GPU:  ", acc.effective_batch_size(4, accumulation_steps=16))
print("2 x 8 on one GPU:   ", acc.effective_batch_size(2, accumulation_steps=8))
print("16 x 4 on 2 GPUs:   ", acc.effective_batch_size(16, accumulation_steps=4, world_size=2))
print("steps for 64 with micro-batches of 16:", acc.accumulation_steps_for(64, micro_batch_size=16))
print("steps per GPU for 64 on 2 GPUs:       ", acc.accumulation_steps_for(64, micro_batch_size=16, world_size=2))

# %% [markdown]
# Sizes that cannot split evenly get a clear error instead of a silently wrong gradient: a micro-batch of 24
# would leave 16 examples in a smaller last trip, weighted more than the others.

# %%
for micro in (0, 24):
    try:
        acc.accumulation_steps_for(64, micro_batch_size=micro)
    except ValueError as err:
        print(f"micro_batch_size={micro}: ValueError: {err}")

# %% [markdown]
# ### Your turn: how many trips?
#
# A recipe asks for an effective batch of 48 on one GPU; your GPU fits micro-batches of 8.
#
# 1. `steps`: how many accumulation steps do you need?
# 2. A colleague's loop uses micro-batches of 10 instead. It runs five trips (10, 10, 10, 10 and 8 examples),
#    takes each trip's **mean** loss and divides it by 5. In the big batch every example weighs 1/48. What
#    weight does one example of the last trip (8 examples) get? Write `last_trip_weight` as a fraction
#    such as `1 / 7`.

# %%
from course_utils.exercises.accumulation import check_batch_loss, check_trips

steps = ...             # accumulation steps for a batch of 48 in micro-batches of 8
last_trip_weight = ...  # one example's weight in the last trip of 8, with micro-batches of 10
check_trips(steps, last_trip_weight)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# 1. 48 ÷ 8 = **6** accumulation steps: `acc.accumulation_steps_for(48, 8)`.
# 2. An example in a trip of *n* weighs 1/*n* (the trip's mean) × 1/5 (the five trips). The last trip: 1/(8 × 5)
#    = **1/40**; the full trips: 1/50. The 8 short-trip examples count 1.25× as much as the others, which is why
#    `acc.accumulation_steps_for(48, 10)` raises a `ValueError`. Pick a micro-batch that divides 48, or divide
#    each trip's *summed* loss by 48 (the padding fix below).
#
# To see 6 trips of 8 give the gradient of the batch of 48 on a bigger model (the sweep's MLP, below):
#
# ```python
# from course_utils.digits import make_mlp
#
# model = make_mlp(**acc.SWEEP_MLP)  # 256 inputs, three hidden layers of 512 with GELU, one output
# x, y = acc.regression_batch(48)
# full = acc.full_batch_gradients(model, x, y)
# accumulated = acc.accumulated_gradients(model, x, y, micro_batch_size=8)
# print(acc.compare_gradients(full, accumulated))  # same gradient: True, size ratio: 1.00
# ```
#
# </details>

# %% [markdown]
# ### The check: four trips, one gradient
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

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the last digits of a rounding difference depend on the CPU and its maths library.
print(f"largest difference: {(full_batch_grad - model.weight.grad).abs().max():.1e}")

# %% [markdown]
# The same gradient, up to a difference around $10^{-7}$ or smaller, whose digits change from one processor to
# another. float32 rounds every addition, and the two ways add the same numbers in a different order ("Going
# deeper" at the end shows why that matters). That is why the check uses `torch.allclose` (equal up to a small
# tolerance) rather than `==`.
#
# **Predict before you run:** what happens if you forget to divide each micro-batch's loss by 4? Will the
# gradient be a little off, or off by a fixed factor? Decide, then run the cell.

# %%
model, x, y = acc.linear_example()  # the same model and data as above (torch.manual_seed(0))
full = acc.full_batch_gradients(model, x, y)
forgot = acc.accumulated_gradients(model, x, y, micro_batch_size=16, divide=False)
check = acc.compare_gradients(full, forgot)
print(f"same gradient: {check.same}")
print(f"size compared with the full batch's gradient: {check.norm_ratio:.2f}x")

# %% [markdown]
# Exactly 4× too large: without the division, `.grad` holds the **sum** of four averages instead of their
# average. With plain SGD that is a learning rate 4× too high.

# %% [markdown] slide="notes"
# With Adam the damage is subtler. Adam divides each gradient by its own running size, so a constant factor
# mostly cancels; but gradient clipping then sees a norm 4× too large and clips far harder than intended, and
# the bug changes as soon as you change the number of steps.

# %% [markdown]
# ## Interactive demo: a batch of 64 on a GPU that fits 16
#
# Now a model with real activations: a small multilayer perceptron (256 inputs, three hidden layers of 512
# with GELU, one output). We run the same batch of 64 at every micro-batch size from 1 to 64, and for each:
#
# - the **accumulation steps** needed to reach 64, and whether the gradient is still the batch's;
# - the **activation memory** of one micro-batch: on a GPU, the memory CUDA holds after its forward pass; on a
#   CPU, the bytes autograd saves for the backward pass (the cell says which);
# - the **wall time** to push all 64 examples through forward and backward.

# %% [markdown]
# **Predict before you run:** going from micro-batches of 64 down to 1, what happens to the activation memory?
# To the time? By roughly how much?

# %%
from course_utils.progress import status

status(f"Running the batch of 64 at {len(acc.MICRO_BATCH_SIZES)} micro-batch sizes …")
rows = acc.sweep_micro_batches(acc.MICRO_BATCH_SIZES, batch_size=64)
print("activation memory measured as:", rows[0].memory_what)
print(acc.sweep_table(rows, measured=False))
print(acc.proportion_check(rows))

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: rounding digits, memory and times depend on the machine.
print(acc.sweep_table(rows))

# %% [markdown]
# Every micro-batch size gives the batch-of-64 gradient. Now the trade-off as a chart. Pretend the GPU has
# room for the activations of 16 examples (the dashed line).

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the chart and its numbers are measured on this machine.
from course_utils.plots import plt
from course_utils.plots.accumulation import describe_micro_batch_sweep, plot_micro_batch_sweep

budget = acc.find_row(rows, 16).activation_bytes  # the pretend GPU: room for 16 examples' activations
plot_micro_batch_sweep(rows, highlight=16, budget_bytes=budget)
plt.show()
print(describe_micro_batch_sweep(rows, budget_bytes=budget))

# %% [markdown]
# **Text description of the chart.** Two panels share a horizontal axis: the micro-batch size, 1 to 64, on a
# doubling scale. Left: the activation memory of one micro-batch, on a log scale, a straight line that doubles
# with every doubling of the micro-batch (counted on a CPU, 13.3 KB per example: the input, each hidden layer's
# output before and after GELU, the output and the target, in float32). A dashed line marks the room on the
# pretend GPU: sizes 1 to 16 sit on or under it, 32 and 64 above. Right: the time for all 64 examples, on a
# log scale, falling steeply as the micro-batches grow, then flattening. The values are printed under the chart.

# %% [markdown]
# Try it live: the slider picks a micro-batch size and shows its numbers against the full batch. It reuses
# the measurements above, so moving it is instant (it needs a running notebook with widgets).

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a widget view, which nbval cannot render.
from course_utils.widgets.accumulation import micro_batch_widget

micro_batch_widget(rows, budget_bytes=budget, value=16)

# %% [markdown]
# ## Benefits and trade-offs
#
# **Benefits**
# - A big effective batch on a small GPU: the pretend GPU above runs the batch of 64 as 4 trips of 16.
# - The same gradient as the big batch, up to rounding in the last digits (as the sweep showed at every size).
# - One setting in most libraries (`gradient_accumulation_steps` in the Hugging Face `Trainer`).
#
# **Trade-offs**
# - **Slower than a real big batch.** Small micro-batches keep the hardware less busy, and every trip pays its
#   own fixed overheads: look at the time column. On a GPU the gap is larger still, because a GPU needs big
#   matrices to fill its cores.
# - **Only activation memory shrinks.** Weights, gradients and optimizer states stay the same size.

# %% [markdown]
# - **Fewer updates per epoch**: 4× fewer with 4 accumulation steps. Tune the learning rate for the effective
#   batch size (see the note in "In practice").
# - Layers that look at the whole batch, such as **batch normalization**, see one micro-batch at a time, so
#   their statistics differ from the big batch's. Transformers use layer normalization, which is per example.

# %% [markdown] slide="notes"
# A common claim, checked: with `per_device_train_batch_size=4` and `gradient_accumulation_steps=16`, an
# optimizer step takes about 16× as long as a step on a batch of 4 (it processes 16× the examples). It does
# *not* cost 16× the compute of a batch of 64: the work is the same; only the hardware's efficiency drops.

# %% [markdown]
# ## In practice
#
# ### The padding trap: count tokens, not micro-batches
#
# Language models average the loss over **tokens**, not over sequences. Sequences have different lengths and
# are padded to the longest one in their micro-batch; padding positions carry the label −100 and add no loss.
# Then micro-batches can hold very different numbers of real tokens. Here is a batch of four sequences of 30,
# 28, 4 and 2 tokens, split into two micro-batches of two sequences:

# %%
tokens, labels = acc.padded_token_batch(lengths=(30, 28, 4, 2))
model = acc.TinyTokenModel()  # an embedding and a linear head: enough to have a loss per token
print("tokens per micro-batch:", acc.tokens_per_micro_batch(labels, micro_batch_size=2))

# %% [markdown]
# **Predict before you run:** the usual loop takes each micro-batch's mean token loss and divides it by the
# number of micro-batches. Does that give the big batch's gradient here?

# %%
full = acc.token_gradients(model, tokens, labels, micro_batch_size=4)  # one micro-batch = the big batch
naive = acc.token_gradients(model, tokens, labels, micro_batch_size=2, normalize="micro_mean")
print("mean of micro-batch means, same gradient:", acc.compare_gradients(full, naive).same)

# %% [markdown]
# No. The big batch gives each of the 64 tokens a weight of 1/64. The naive way gives each micro-batch half
# the weight, whatever it holds, so each of the 58 tokens of the first micro-batch gets 1/116 and each of the
# 6 tokens of the second gets 1/12: almost ten times more. The short sequences dominate the update.
#
# **The fix**: add up the token losses of each micro-batch and divide by the number of real tokens in the
# **whole** batch, counted before the first micro-batch runs.

# %%
fixed = acc.token_gradients(model, tokens, labels, micro_batch_size=2, normalize="total_tokens")
print("sum of token losses / all tokens, same gradient:", acc.compare_gradients(full, fixed).same)

counts = acc.tokens_per_micro_batch(labels, micro_batch_size=2)   # [58, 6]
naive_weights = [1 / (len(counts) * n) for n in counts]            # mean per trip, then / number of trips
fixed_weights = [1 / sum(counts)] * len(counts)                    # every token: 1 / all tokens
print("weight of one token in each micro-batch, naive:", [round(w, 4) for w in naive_weights])
print("weight of one token in each micro-batch, fixed:", [round(w, 4) for w in fixed_weights])

# %% [markdown]
# The Hugging Face `Trainer` knows this trap: for models whose `forward` accepts `num_items_in_batch` (its
# causal language models do), it counts the label tokens of all the micro-batches of an update and passes that
# count in, so the model divides by it. In your own loop you do it yourself. With the same number of real
# tokens in every micro-batch (no padding, or packed sequences) the naive way is exact.

# %% [markdown]
# ### Your turn: the batch's loss from its micro-batches
#
# Your loop logs each micro-batch's **mean** token loss and its number of real tokens. Write `batch_loss`, which
# returns the loss the big batch would report: the mean over all its real tokens. For example, means
# `[2.0, 4.0]` over `[1, 3]` tokens give 3.5. The check also tries it on the padded batch above.

# %%
def batch_loss(mean_losses, token_counts):
    """The batch's mean loss per real token, from each micro-batch's mean token loss and real-token count."""
    raise NotImplementedError  # your code here


check_batch_loss(batch_loss)

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
# *i* back-propagates `mean_i * n_i / total_tokens`, which is its summed token loss divided by the batch's
# token count.
#
# </details>

# %% [markdown]
# ### The loop
#
# A real training loop on a small regression problem (256 examples, 10 features). The data loader yields
# micro-batches of 16; the optimizer steps once every 4 of them, so once per 64 examples. It prints the loss
# once per update: the average over that update's four micro-batches, the loss of the effective batch.

# %%
from torch.utils.data import DataLoader

data = acc.regression_dataset(256)
loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
model = acc.TinyRegressor().net  # 10 -> 32 -> 1, fixed starting weights
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

accumulation_steps = 4  # 4 micro-batches of 16 = an effective batch of 64
update_loss = 0.0
for step, (xb, yb) in enumerate(loader):
    loss = loss_fn(model(xb), yb) / accumulation_steps
    loss.backward()                      # gradients add up in .grad
    update_loss += loss.item()           # the divided losses add up to the batch's average loss
    if (step + 1) % accumulation_steps == 0:
        optimizer.step()                 # one update per 64 examples
        optimizer.zero_grad()
        print(f"update {(step + 1) // accumulation_steps}: loss {update_loss:.3f}")
        update_loss = 0.0

# %% [markdown]
# 256 examples make 16 micro-batches and 4 updates. Is this really training with a batch of 64? Train a second
# copy of the model with a real batch of 64 (same data order, same learning rate) and compare the weights.
# `acc.train_with_accumulation` is the loop above as a function.

# %%
def train(micro_batch_size, accumulation_steps):
    loader = DataLoader(data, batch_size=micro_batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = acc.TinyRegressor().net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = acc.train_with_accumulation(model, loader, optimizer, accumulation_steps)
    return model, [round(v, 3) for v in losses]

model_acc, losses_acc = train(16, accumulation_steps=4)
model_big, losses_big = train(64, accumulation_steps=1)
print("16 x 4 losses:", losses_acc)
print("64 x 1 losses:", losses_big)
print("same weights after 4 updates:", acc.same_weights(model_acc, model_big))

# %% [markdown]
# ### The same in the Hugging Face `Trainer`
#
# One setting: `per_device_train_batch_size` is the micro-batch, what fits in memory, and
# `gradient_accumulation_steps` is the number of micro-batches per update. The `Trainer` divides the loss,
# steps the optimizer every 4 micro-batches and logs one loss per update. The model only has to take the
# inputs and `labels` and return a `loss`. Four real optimizer steps on the CPU, for each of two settings:

# %%
import tempfile

from course_utils import progress
from course_utils.quiet import quiet_libraries

with quiet_libraries():  # no progress bars, warnings or info logs on stderr inside this block; restored after
    from transformers import TrainingArguments

    def trainer_args(micro_batch_size, accumulation_steps):
        return TrainingArguments(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=micro_batch_size,     # the micro-batch: what fits in memory
            gradient_accumulation_steps=accumulation_steps,   # micro-batches per optimizer step
            max_steps=4, learning_rate=0.01, lr_scheduler_type="constant", logging_steps=1,
            save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
        )

    hf_data = acc.DictDataset(data)  # yields {"x": ..., "labels": ...}
    model_hf_acc, model_hf_big = acc.TinyRegressor(), acc.TinyRegressor()
    with progress.steps("Training with the Trainer", total=2) as run:
        run("micro-batches of 16, gradient_accumulation_steps=4")
        args_acc = trainer_args(16, 4)
        log_acc = acc.train_with_trainer(args_acc, model_hf_acc, hf_data)
        run("one batch of 64, gradient_accumulation_steps=1")
        log_big = acc.train_with_trainer(trainer_args(64, 1), model_hf_big, hf_data)
print("effective batch of the first run:", acc.effective_batch_size(
    args_acc.per_device_train_batch_size, args_acc.gradient_accumulation_steps, args_acc.world_size))
for (update, loss_a), (_, loss_b) in zip(log_acc, log_big):
    print(f"update {update}: loss {loss_a:.3f} (16 x 4)   {loss_b:.3f} (64 x 1)")
print("same weights:", acc.same_weights(model_hf_acc, model_hf_big))

# %% [markdown]
# **A note on the learning rate.** Accumulating up to the batch a recipe was tuned for needs no change: the
# gradient is the same, as the runs above show. But if accumulation lets you *grow* the batch (say from 16 to
# 64), you now make 4× fewer updates per epoch, each averaged over more examples, and the old learning rate
# is probably too small. Common starting points are to scale it with the batch (the "linear" rule, usual for
# SGD) or with its square root (often used with Adam); then tune it, with a warm-up, on a short run.

# %%
for rule in ("linear", "sqrt"):
    print(f"{rule:>6} rule, 2e-4 tuned at batch 16, now batch 64: start from "
          f"{acc.scale_learning_rate(2e-4, base_batch=16, new_batch=64, rule=rule):.0e}")

# %% [markdown]
# **Libraries**: plain PyTorch (the few lines of the loop above), the Hugging Face `Trainer`
# (`gradient_accumulation_steps`), Accelerate (`accelerator.accumulate(model)`, which also handles the
# multi-GPU details for you), PyTorch Lightning (`accumulate_grad_batches`) and DeepSpeed
# (`gradient_accumulation_steps`).

# %% [markdown]
# ## Knowledge check
#
# **1.** The recipe says batch 256. You have 2 GPUs, each fitting micro-batches of 16. How many accumulation
# steps per GPU?
#
# <details><summary>Show the answer</summary>
#
# 256 = 16 × steps × 2, so **8** steps: `acc.accumulation_steps_for(256, 16, world_size=2)`.
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
# **4.** Four micro-batches of 16 take longer than one batch of 64 although the arithmetic is the same. Why?
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

# %% [markdown]
# Each trick buys one thing by paying with another: memory, speed, quality or money. None is the best in
# general. So the useful question is not "which trick is best?" but "what is my bottleneck, and what am I
# willing to give up to remove it?" Out of memory because of activations, and time to spare: accumulate.

# %% [markdown]
# ## Recap
#
# - Gradient accumulation runs a batch as micro-batches, lets `.grad` add up their gradients, divides each loss
#   by the number of micro-batches, and steps once. *Effective batch = micro-batch × accumulation steps × GPUs.*
# - The gradient is the big batch's, up to float32 rounding (about $10^{-7}$, machine-dependent). Forgetting
#   the division makes it exactly 4× too large.
# - Only activation memory shrinks, in proportion to the micro-batch; time grows as the micro-batches shrink.
# - With padding, divide summed token losses by the batch's total token count, not micro-batch means by the
#   number of micro-batches.
# - In the Hugging Face `Trainer` it is one setting, `gradient_accumulation_steps`. Growing the effective
#   batch means fewer updates: revisit the learning rate.

# %% [markdown]
# ## Going deeper (optional)
#
# Three topics for after class: why "the same" gradient differs in its last digits, how the sweep measured
# memory and time, and a preview of the next module: accumulation on several GPUs with PyTorch's distributed
# data parallel (DDP), checked here with two processes on the CPU.
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
# So compare the yes/no answer of `allclose`, never the last digits.
#
# ### How the sweep measured memory and time
#
# - **On a GPU**, the activation memory is what CUDA holds after one micro-batch's forward pass, above the
#   weights and gradients already held: the activations saved for the backward pass, read *before* backward.
#   The backward pass also allocates temporaries the size of each weight matrix, whatever the micro-batch;
#   those are not activations, and reading after backward would hide the small micro-batches' activations.
# - **On a CPU** there is no such counter, so the sweep counts the bytes autograd saves for the backward pass,
#   with `torch.autograd.graph.saved_tensors_hooks` (each storage counted once, parameters left out).
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

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: wall time and rounding digits depend on the machine.
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

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: what this cell does depends on how many GPUs the machine has.
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
