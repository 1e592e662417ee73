# %% [markdown]
# # Mixed precision: fast where we can, precise where we must
#
# In the backpack picture of this module, mixed precision is packing with **mixed sizes**: compact folders for
# most papers, full-size ones only for the documents that matter. Most of the maths of training runs in 16
# bits; a few steps keep 32.

# %% [markdown]
# **You will be able to**
# - explain the four rules of mixed-precision training, and why the weight update stays in float32;
# - read `torch.finfo` to say which updates and gradients a 16-bit format can hold;
# - say when loss scaling is needed (float16) and when not (bfloat16);
# - time float32 against 16-bit matrix multiplies properly with `torch.utils.benchmark`;
# - write one training loop with mixed precision as flags, and turn it on in Hugging Face, Accelerate and
#   Lightning with one setting.
#
# Everything runs on a CPU; a GPU (Colab's T4 is enough) shows tensor cores at work in the timing section.

# %% [setup]

# %% [markdown]
# ## Why?
#
# Training in float32 is slow and memory-hungry. GPUs have **tensor cores** that multiply 16-bit matrices many
# times faster than float32 ones, and a 16-bit activation takes half the bytes. But some steps of training
# really need float32's precision. Mixed precision gives each step the format it needs.
#
# First, the three formats. Every floating-point number is a sign, an exponent (the range: how large and how
# small a number can be) and a fraction (the precision: how finely numbers are spaced). `torch.finfo`
# describes each format:

# %%
import torch
import torch.nn.functional as F

from course_utils import digits, hardware, precision
from course_utils.plots import precision as precision_plots
from course_utils.widgets import precision as precision_widgets

print(precision.formats_table())

# %% [markdown]
# Read the table in two directions:
#
# - **bfloat16** keeps float32's 8 exponent bits, so it has the **same range** (up to about 3.4 × 10³⁸), but
#   only 7 fraction bits: numbers near 1.0 are 0.0078 apart.
# - **float16** spends more bits on the fraction (10), so it is **more precise** than bfloat16 near 1.0, but
#   with 5 exponent bits its **range** ends at 65,504, and below 6.1 × 10⁻⁵ it starts losing precision.

# %% [markdown]
# ## How it works
#
# 1. **Keep the weights in float32.** This is the *master copy*.
# 2. **Run the forward and backward passes in mixed precision.** Matrix multiplications run in 16 bits; steps
#    sensitive to rounding (softmax, normalization, the loss) run in float32. `torch.autocast` decides op by op.
# 3. **Gradients arrive in float32**, matching the weights, and the optimizer updates the float32 master copy,
#    so that small updates are not rounded away.
# 4. **Loss scaling, for float16 only:** multiply the loss by a large number before the backward pass so small
#    gradients do not round to zero, and divide the gradients back before the update. bfloat16 has float32's
#    range and does not need it.

# %% [markdown]
# ### Can a tiny update survive?
#
# One optimizer step changes each weight by $w \leftarrow w - \eta \cdot \nabla_w L$: $w$ is the weight (the
# float32 master copy), $\eta$ the learning rate, $\nabla_w L$ the gradient. Learning rates of $10^{-3}$ to
# $10^{-5}$ and gradients well below 1 make $\eta \cdot \nabla_w L$ tiny.
#
# **Predict before you run:** a weight $w = 1.0$ receives an update of $10^{-4}$ (say $\eta = 10^{-3}$ and a
# gradient of 0.1). What does each format store for $w - 10^{-4}$? Use the gaps after 1.0 in the table above.

# %%
print(precision.update_table([1e-2, 1e-3, 1e-4, 1e-6, 1e-8], w=1.0))

# %% [markdown]
# An update of $10^{-4}$ **vanishes** in both 16-bit formats: the weight stays exactly 1.0. In float32 it
# survives (0.99989998: float32 rounds too, in the 8th digit). bfloat16 even loses $10^{-3}$, and moves the
# weight by 0.0117 instead of $10^{-2}$: it can only land on one of its own numbers.
#
# Why? $w - u$ is rounded to the nearest number of the format, so an update smaller than **half the gap** to
# the neighbour below rounds back to $w$. Below 1.0 the gap is half of `eps` (1.0 is a power of two). Real
# torch arithmetic finds the smallest update that survives:

# %%
for name in ("float32", "bfloat16", "float16"):
    below, above = precision.spacing_around(1.0, name)
    smallest = precision.smallest_surviving_update(1.0, name)
    print(f"{name:>8}: gap below 1.0 = {below:.3g}, above = {above:.3g} (finfo eps); "
          f"smallest update that survives = {smallest:.3g}")

# %% [markdown]
# **Predict before you run:** the same update of $10^{-4}$, a thousand times. Where does the weight end up in
# each format?

# %%
for name in ("float32", "bfloat16", "float16"):
    print(f"{name:>8}: w after 1,000 updates of 1e-4 = {precision.repeated_updates(1.0, 1e-4, 1000, name):.6f}")
master = precision.repeated_updates(1.0, 1e-4, 1000, "float32")
print(f"float32 master copy read in bfloat16 for the next forward pass: {precision.cast_value(master, 'bfloat16'):.6f}")

# %% [markdown]
# A weight stored in 16 bits **never moves**: each step is lost, so a thousand steps are lost too. The float32
# master copy collects them and reaches 0.9; the 16-bit copy for the next forward pass is read from it, so it
# moves as well (0.898, the nearest bfloat16). Rule 3: compute in 16 bits, **update in float32**.
#
# **Live demo.** Pick the format of the weight and slide the update $\eta \cdot \nabla L$ (log scale): the
# neighbours of $w = 1.0$, whether the update survives, and the float32 result.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget (nbval has no widget front end).
precision_widgets.tiny_update_widget(update=1e-4)

# %% [markdown]
# ### Your turn: a small weight
#
# The gaps grow and shrink with the number: between 0.5 and 1 they are half as wide as between 1 and 2. A
# typical initial weight is 0.02. It receives an update of $10^{-5}$. In which 16-bit formats does the update
# survive? Answer `'both'`, `'bfloat16 only'`, `'float16 only'` or `'neither'`. (You can test any guess with
# `precision.survives(0.02, 1e-5, "bfloat16")`, but decide first.)

# %%
from course_utils.exercises.precision import check_small_weight_update

answer = ...  # 'both', 'bfloat16 only', 'float16 only' or 'neither'
check_small_weight_update(answer)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# for w in (0.02, 1.0, 8.0):
#     print(w, {name: f"{precision.smallest_surviving_update(w, name):.3g}"
#               for name in ("float32", "bfloat16", "float16")})
# print({name: precision.survives(0.02, 1e-5, name) for name in ("bfloat16", "float16")})
# ```
#
# The smallest surviving update scales with the weight: for $w = 0.02$ it is 9.31e-10 (float32), 6.13e-05
# (bfloat16) and 7.6e-06 (float16); for $w = 1.0$: 2.98e-08, 0.00196, 0.000244; for $w = 8.0$: 2.38e-07,
# 0.0157, 0.00195. So $10^{-5}$ on 0.02 is **lost in bfloat16** and **survives in float16**: the answer is
# `'float16 only'`. The relative precision counts: about 2⁻⁸ of the weight for bfloat16, 2⁻¹¹ for float16.
#
# </details>

# %% [markdown]
# ### Range: very large and very small numbers
#
# Precision is one limit; **range** is the other. What does each format store for a few large and small
# values? (Look for `inf`, for 0, and for digits that changed.)

# %%
print(precision.cast_table([100_000.0, 65_504.0, 1e-5, 1e-7, 1e-8, 1e-30]))

# %% [markdown]
# float16 **overflows** above 65,504 (to `inf`, which poisons every sum it enters) and **flushes** values
# below about 3 × 10⁻⁸ to zero; between 6 × 10⁻⁸ and 6.1 × 10⁻⁵ it keeps fewer and fewer significant bits
# (1e-7 comes back as 1.19e-7). bfloat16 keeps float32's range: it rounds 1e-30 a little, never to zero.
#
# Gradients are small numbers. Here is a stand-in for the gradients of a deep network: 100,000 values whose
# magnitudes spread around $10^{-6}$ (a log-normal spread, seeded). **Predict before you run:** what
# fraction becomes exactly zero in float16? And after multiplying them by a loss scale of 65,536 ($2^{16}$)?

# %%
grads = precision.synthetic_gradients(n=100_000, log10_mean=-6.0, log10_std=1.5, seed=0)
for scale in (1.0, 65_536.0):
    s = precision.fp16_cast_stats(grads, scale)
    print(f"scale {scale:>6,.0f}: {s.zero_fraction:7.3%} flushed to zero, {s.subnormal_fraction:7.3%} subnormal "
          f"(fewer bits), {s.overflow_fraction:6.3%} overflow to inf, {s.kept_fraction:7.3%} stored normally")

# %% [markdown]
# Without scaling, 15.6 % of these gradients become zero in float16 and 72.5 % lose precision as subnormals.
# Multiplying the loss by 65,536 multiplies every gradient by 65,536 too (the chain rule is linear), which moves
# almost all of them into float16's normal range: only 0.004 % still flush to zero, and 0.006 % now overflow
# at the other end. The optimizer divides by 65,536 in float32 before the update, so the scale changes nothing
# else. That is loss scaling.

# %%
fig = precision_plots.gradient_histogram(grads, scale=65_536.0)

# %% [markdown] slide="notes"
# **Text description of the chart.** A histogram of the 100,000 gradients on a log scale (x: log10 of the
# magnitude, about −14 to 6; y: count). Shaded bands mark float16's limits: below −7.5 it stores zero, from
# −7.5 to −4.2 it keeps subnormals (fewer bits), above 4.8 it overflows. The blue curve (gradients as
# computed) peaks at −6, in the subnormal band, with its left tail in the zero band. The green curve (× 65,536)
# is the same shape moved 4.8 to the right: it peaks near −1.2, almost all in the normal range; only its far
# right tail touches the overflow band.

# %% [markdown]
# ### Your turn: a loss scale that fits
#
# A float16 run has gradients as small as $10^{-8}$ and as large as $1.0$. Which loss scale brings $10^{-8}$
# into float16's **normal** range (at least 6.1 × 10⁻⁵, the smallest normal in the first table) while $1.0$
# still stays finite (at most 65,504)? Choose one of `1024`, `8192`, `65536`, `1048576`.

# %%
from course_utils.exercises.precision import check_loss_scale

scale = ...  # 1024, 8192, 65536 or 1048576
check_loss_scale(scale)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# The scale must be at least 6.1 × 10⁻⁵ / 10⁻⁸ ≈ 6,104, so that the tiny gradient is normal, and at most
# 65,504 / 1.0, so that the large one does not overflow. Of the four, only **8192** ($2^{13}$) fits:
# 10⁻⁸ × 8,192 ≈ 8.2 × 10⁻⁵. 1,024 leaves the small gradient subnormal; 65,536 turns 1.0 into `inf` (which
# `GradScaler` would notice, skip the step and halve the scale); 1,048,576 overflows even more.
#
# </details>

# %% [markdown]
# ### What autocast does to the dtypes
#
# `torch.autocast` applies rules 1 to 3 for you. A linear layer and a loss, run under autocast; the backward
# pass runs outside it. The 16-bit type is chosen by `course_utils.hardware`: bfloat16 on an Ampere or newer GPU
# and on a CPU, float16 on a T4 (where the `output` line then reads `torch.float16`).

# %%
device = hardware.pick_device()
dtype = hardware.autocast_dtype(device)
print(precision.dtype_lines(precision.autocast_example(device, dtype)))

# %% [markdown]
# The weights and the gradient stay in float32; only the matrix multiply ran in 16 bits, and the loss came
# back in float32. (Which other ops autocast moves to 16 bits depends on the device: see "Going deeper".)
#
# ## Benefits and trade-offs
#
# **Benefits**
# - **Faster maths.** An H100 does about 990 TFLOPS of dense bfloat16 maths on its tensor cores, against 67 in
#   float32. Real training runs are usually 2 to 3 times faster, not 15: memory traffic, the float32 steps
#   and the optimizer do not speed up.
# - **Activations take half the memory**, so bigger batches fit.
# - **Little or no loss in accuracy** (the training run below shows it).

# %% [markdown]
# **Trade-offs**
# - **The model state does not shrink.** Weights, gradients and Adam's two moments stay in float32: about
#   16 bytes per parameter.
# - **bfloat16 needs an Ampere or newer GPU** (A100, H100, RTX 30 series and up). On a T4, like free Colab,
#   use float16.
# - **float16 overflows above 65,504 and loses tiny values**, so it needs loss scaling.
#
# The figures, from the datasheets in `course_utils.hardware` and from bytes per element:

# %%
for key in ("H100", "A100", "T4"):
    sheet = hardware.DATASHEETS[key]
    print(f"{sheet.name:<16} 16-bit tensor cores {sheet.tensor16_tflops:>5.0f} TFLOPS, float32 {sheet.fp32_tflops:>4.1f} "
          f"TFLOPS: {sheet.tensor16_tflops / sheet.fp32_tflops:4.1f}x on paper")
batch, tokens, hidden = 8, 1024, 4096
for name in ("float32", "bfloat16"):
    nbytes = batch * tokens * hidden * torch.finfo(precision.resolve_dtype(name)).bits // 8
    print(f"one {batch}x{tokens}x{hidden} activation in {name:<8}: {nbytes / 2**20:,.0f} MiB")
state_bytes = 4 + 4 + 8  # float32 weights + float32 gradients + Adam's two float32 moments
print(f"model state with Adam, mixed precision or not: {state_bytes} bytes per parameter, "
      f"{state_bytes * 7e9 / 1e9:.0f} GB for 7 billion parameters")

# %% [markdown]
# The T4 row is why free Colab still matters here: it has no bfloat16 tensor cores, but its float16 tensor
# cores are 8 times its float32 figure. (The H100's datasheet 989 is the "about 990" above.)
#
# ## In practice
#
# ### Timing a matrix multiply, properly
#
# GPU work is asynchronous: `a @ b` returns before the GPU has finished, so a stopwatch around it measures
# almost nothing. A fair timing warms up first (the first call pays for setup), **synchronizes** before reading
# the clock, and repeats. PyTorch's `torch.utils.benchmark.Timer` does all three. Here it is on its own, timing
# one float16 multiply: `blocked_autorange` runs the statement in blocks for at least `min_run_time` seconds
# and reports the median. `num_threads` matters: `Timer` uses a single CPU thread unless told otherwise.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a timing, different on every machine and in every run.
from torch.utils import benchmark

size = precision.all_formats_size(device)  # 4096 on a GPU; 256 on a CPU, where float16 is very slow
a, b = precision.random_matrices(size, torch.float16, device)  # two random size x size matrices (own generator)
timer = benchmark.Timer(stmt="a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
measurement = timer.blocked_autorange(min_run_time=0.2)
print(f"float16, {size}x{size} on {device.type}: {measurement.median * 1e3:.2f} ms per multiply "
      f"(median of {len(measurement.times)} blocks of {measurement.number_per_run})")

# %% [markdown]
# `precision.time_matmul` wraps that same call and turns the time into TFLOP/s: a square multiply of side $n$
# costs $2n^3$ floating-point operations. **Predict before you run:** on your machine, is float16 faster or
# slower than float32? And bfloat16?

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: timings differ from machine to machine and from run to run.
timings = [precision.time_matmul(size, name, device) for name in ("float32", "bfloat16", "float16")]
print(precision.timing_report(timings, hardware.current_datasheet()))

# %%
helper, mine = timings[-1].measurement.task_spec, measurement.task_spec
print(f"timed {size}x{size} matrices on {device.type} in", ", ".join(t.dtype for t in timings))
print("the helper's float16 timing ran the same Timer call (statement, threads):",
      (helper.stmt, helper.num_threads) == (mine.stmt, mine.num_threads))

# %% [markdown]
# 16 bits pay only where the hardware has **16-bit matrix units**. On a T4 that is float16 (its tensor cores):
# several times faster than float32, while bfloat16 is emulated, with no tensor-core speed-up. An A100 or H100
# has both; the report gives the fraction of the datasheet peak, which large multiplies get close to. Most CPUs
# have no 16-bit matrix units: the numbers are converted to float32 for the maths, which only adds work. Often
# bfloat16 ends up a little slower than float32 and float16 many times slower; "Going deeper" says why, and
# how to check your CPU.

# %% [markdown]
# ### The mixed-precision training loop
#
# A small real task: recognizing handwritten digits (8 × 8 pixel images from scikit-learn, shipped with the
# package, so it works offline), notebook 01's task from the same `course_utils.digits` module, with an MLP of
# two hidden layers of 128. One loop, with the tricks as flags, the way the PyTorch AMP recipe writes it:
#
# - `torch.autocast(..., dtype=dtype)` runs the forward pass in mixed precision;
# - `torch.amp.GradScaler(..., enabled=(dtype == torch.float16))` scales the loss for float16 only. When it is
#   disabled, `scale` returns the loss unchanged, `step` just calls the optimizer and the scale reads 1.

# %%
from course_utils.progress import status, steps

print(f"device: {device.type}, autocast dtype: {dtype}, loss scaling: {hardware.needs_loss_scaling(dtype)}")
threads = torch.get_num_threads()
if device.type == "cpu":
    torch.set_num_threads(1)  # a network this small trains faster on one CPU thread than on several

status("Training the digit classifier for 200 steps …")
task = digits.load_digits_data()                                # 1,347 training and 450 test images
model = digits.make_mlp(hidden=128, depth=2, seed=0).to(device)  # float32 weights: the master copy
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))  # loss scaling: float16 only

losses = []
for x, y in task.batches(steps=200, batch_size=64, seed=0):
    x, y = x.to(device), y.to(device)
    with torch.autocast(device_type=device.type, dtype=dtype):  # forward pass in mixed precision
        loss = F.cross_entropy(model(x), y)                      # matmuls in 16 bits, the loss in float32
    scaler.scale(loss).backward()  # backward pass, outside autocast
    scaler.step(optimizer)         # unscale; skip the step if a gradient is inf/nan; update the float32 weights
    scaler.update()
    optimizer.zero_grad()
    losses.append(loss.item())
test_accuracy = digits.evaluate(model, task).accuracy
print(f"{len(losses)} steps done, loss scale at the end: {scaler.get_scale():,.0f}")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: 16-bit sums run in a different order on each processor, so the last digits change.
for step in (1, 25, 50, 75, 100, 125, 150, 175, 200):
    print(f"step {step}: loss {losses[step - 1]:.2f}")
print(f"test accuracy: {test_accuracy:.1%}")

# %% [markdown]
# The loss falls from about 2.30 (ln 10: a guess among 10 classes) and the network recognizes most test
# digits. The scale reads 1 on a CPU: the scaler is off for bfloat16. The last digits of 16-bit losses depend
# on the processor, so we compare with float32 within a stated tolerance, not digit by digit.
#
# The same loop lives in `precision.train_mixed_precision`, with `dtype` as a flag (float32 turns autocast
# off). Check that it is the same loop, then train once more in plain float32:

# %%
with steps("Training the digit classifier twice", total=2) as step:
    step(f"{precision.dtype_name(dtype)} autocast")
    mixed = precision.train_mixed_precision(dtype, device=device, steps=200)
    step("float32")
    full = precision.train_mixed_precision("float32", device=device, steps=200)
print("the helper runs the same loop:", [log.loss for log in mixed.history] == losses)
print(precision.compare_runs(full, mixed, loss_tolerance=0.05, accuracy_tolerance=0.02))

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the digits behind the check above depend on the processor.
for result in (full, mixed):
    print(f"{result.dtype:>8}: mean loss over the last 50 steps {result.mean_loss(50):.3f}, "
          f"test accuracy {result.test_accuracy:.1%}")

# %%
fig = precision_plots.loss_curves({"float32": [log.loss for log in full.history],
                                   f"{mixed.dtype} autocast": [log.loss for log in mixed.history]})

# %% [markdown] slide="notes"
# **Text description of the chart.** Training loss (y, cross-entropy, 0 to about 2.3) against the step (x, 10
# to 200), each curve a running mean over 10 steps. The solid float32 curve and the dashed mixed-precision
# curve fall together, steeply from about 2.15 at step 10 to about 0.33 at step 50, then slowly to about 0.07
# at step 200, on top of each other all the way: mixed precision did not hurt learning.

# %% [markdown]
# ### What a T4 sees: float16, a loss scale, and a skipped step
#
# With float16 the scaler is on: the scale starts at 65,536 ($2^{16}$). If a step's scaled gradients overflow
# to `inf`, `scaler.step` **skips** that update and `scaler.update` **halves** the scale; after 2,000 clean
# steps in a row it doubles it again. Overflows are rare on a task this small, so we force one: at step 60 the
# loss is multiplied by 10,000 before the backward pass, like a loss spike. The same loop, `dtype=float16`:

# %%
fp16 = precision.train_mixed_precision("float16", device=device, steps=100, spike_at=(60,))
torch.set_num_threads(threads)  # back to all CPU threads
print(fp16.log_lines(every=20, losses=False))
print(f"skipped steps: {fp16.skipped_steps}")
print(f"still learning after the skipped step, test accuracy above 85%: {fp16.test_accuracy > 0.85}")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: float16 losses and accuracy change in the last digits from one processor to another.
print(fp16.log_lines(every=20))
print(f"test accuracy: {fp16.test_accuracy:.1%}")

# %% [markdown]
# Step 60 overflowed, was skipped, and the scale dropped to 32,768; the network still learned (a broken run
# would be stuck near 10 %, a guess among 10 classes). In a real float16 run the scale drops a few times early
# on as it finds its level: normal. Worry only when it keeps falling towards 1, or the loss becomes `nan`.
#
# ### One setting in the libraries
#
# In Hugging Face `TrainingArguments` it is `bf16=True` (Ampere+) or `fp16=True` (T4 or older);
# `precision.training_arguments_kwargs` picks by compute capability, as `course_utils.hardware` does. On a CPU,
# transformers refuses `bf16=True` unless you also say `use_cpu=True`.

# %%
from course_utils.quiet import quiet_libraries

status("Importing transformers …")
with quiet_libraries():  # no library warnings or logs on stderr inside this block; restored after it
    from transformers import TrainingArguments

    kwargs = precision.training_arguments_kwargs(device)
    args = TrainingArguments(output_dir="out", report_to="none", **kwargs)
    print("TrainingArguments(output_dir='out', " + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")")
    print(f"-> bf16={args.bf16}, fp16={args.fp16}, training device: {args.device.type}")
    if device.type == "cpu":
        try:
            TrainingArguments(output_dir="out", report_to="none", bf16=True)
        except ValueError as err:
            print(f"bf16=True without use_cpu=True on a CPU: ValueError: {err}")

# %% [markdown]
# Load the model in float32 as usual; the library adds autocast and, for float16, the scaler. The same single
# setting for this device's dtype in Accelerate (your own loop) and PyTorch Lightning:

# %%
for library, setting in precision.library_settings(dtype).items():
    print(f"{library:<24} {setting}")

# %% [markdown]
# One caution: transformers checks `torch.cuda.is_bf16_supported()`, which says True on a T4 because it counts
# *emulated* bfloat16 too. transformers would accept `bf16=True` there and run slowly; choose by compute
# capability (8.0 or higher for bfloat16), as `hardware.autocast_dtype` does.
#
# ## Run it yourself
#
# **Two spikes in a row.** Run `precision.train_mixed_precision("float16", device=device, steps=80,
# spike_at=(30, 31))`. Predict the final loss scale and the skipped steps, then print `log_lines(every=20)`.
#
# <details><summary>Show the answer</summary>
#
# ```python
# two = precision.train_mixed_precision("float16", device=device, steps=80, spike_at=(30, 31))
# print(two.log_lines(every=20))
# ```
#
# Both spiked steps overflow: both are skipped and the scale halves twice, 65,536 → 32,768 → 16,384. Training
# carries on, because a skipped step changes no weight.
#
# </details>

# %% [markdown]
# ## Knowledge check
#
# 1. The matrix multiplies run in bfloat16. Why keep a float32 copy of the weights at all?
# 2. Training in float16 on a T4, the loss scale drops from 65,536 to 32,768 at step 60. Is the run broken?
# 3. Why does bfloat16 need no loss scaling, while float16 does?
# 4. You switch a 7-billion-parameter model with Adam from float32 to mixed precision. Does the model state
#    (weights, gradients, optimizer) shrink?

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# 1. Because updates are tiny. Near 1.0 bfloat16's numbers are 0.0078 apart (0.0039 just below), so an update
#    below about 0.002 rounds back to the old weight: a bfloat16 weight would stop learning. The float32 master
#    copy keeps every small update (its gap near 1.0 is about 10⁻⁷).
# 2. No. A gradient overflowed; `GradScaler` skipped that one update and halved the scale, which is how it finds
#    a scale that fits. Worry if it keeps falling towards 1 or the loss turns into `nan`.
# 3. Loss scaling fixes a **range** problem. float16's 5 exponent bits end at 65,504 and flush values below
#    about 3 × 10⁻⁸ to zero, where many gradients live. bfloat16 has float32's 8 exponent bits (down to about
#    10⁻³⁸), so small gradients survive without help.
# 4. No. Weights, gradients and Adam's two moments stay float32: 16 bytes per parameter, 112 GB for 7 billion.
#    Mixed precision speeds up the maths and halves the *activations*; to shrink the state, quantize the frozen
#    weights and train small adapters (QLoRA), or use an 8-bit optimizer.
#
# </details>

# %% [markdown]
# ## Recap
#
# - Compute in 16 bits, keep the weights and the update in float32: `torch.autocast` runs matrix multiplies in
#   bfloat16 or float16, losses (and on GPUs softmax and normalization) in float32.
# - An update below half the gap between neighbouring numbers vanishes: for a weight of 1.0 about 0.002 in
#   bfloat16, 0.00024 in float16, 3 × 10⁻⁸ in float32. Hence the float32 master copy.
# - float16 overflows above 65,504 and flushes tiny gradients to zero; a loss scale moves them into range, and
#   `GradScaler` skips a step and halves the scale on overflow. bfloat16 needs no scaling, but an Ampere or
#   newer GPU; on a T4 use float16.

# %% [markdown]
# - Time with `torch.utils.benchmark.Timer(...).blocked_autorange()`: 16 bits pay only on 16-bit matrix units.
#   Real training gains 2 to 3 times, not the datasheet's 15.
# - One flag: `autocast(dtype=...)` + `GradScaler(enabled=dtype == float16)` in your loop, `bf16=True` /
#   `fp16=True` in `TrainingArguments`, `mixed_precision="bf16"` in Accelerate, `precision="bf16-mixed"` in
#   Lightning.
# - The model state does not shrink: mixed precision buys speed and activation memory, not weight memory.

# %% [markdown]
# ## Going deeper (optional)
#
# ### Which ops autocast moves to 16 bits
#
# Autocast keeps a list per device of the ops it runs in 16 bits and the ops it keeps in float32. Here is
# what a few typical ops return under autocast on this device:

# %%
for op, op_dtype in precision.autocast_op_dtypes(device, dtype).items():
    print(f"{op:<16} {op_dtype}")

# %% [markdown]
# The matrix multiply is 16-bit and the losses are float32 everywhere. Softmax and layer norm depend on the
# device: CUDA's autocast list runs them in float32 (PyTorch's "CUDA ops that can autocast to float32" include
# `softmax`, `log_softmax` and `layer_norm`), while the CPU list leaves them in the 16-bit type of their input,
# as printed above when this runs on a CPU. Either way, you do not choose op by op: autocast does.
#
# ### Matrix sizes, live
#
# Choose the 16-bit type and the matrix side; each change times one float32 and one 16-bit multiply with
# `precision.time_matmul`. Small matrices cannot keep a GPU busy, so there the speed-up grows with the size.
# On a CPU, float16 is timed only up to 256 × 256 (larger sides print why), and if the runs of a large side
# would take more than a few seconds, a smaller side is timed and the report says so.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget that shows live timings.
precision_widgets.matmul_widget(device=device)

# %% [markdown]
# ### 16-bit maths on a CPU
#
# PyTorch hands a 16-bit matrix multiply on an x86 CPU to Intel's oneDNN library when the processor can run it
# well: bfloat16 on any CPU with AVX-512, float16 only on CPUs with float16 instructions (AVX512-FP16 or
# AMX-FP16, in recent Intel Xeons). oneDNN uses bfloat16 matrix instructions where they exist (AVX512-BF16, or
# AMX, a matrix unit in Intel Xeons since the 4th generation, "Sapphire Rapids"): there bfloat16 can beat
# float32 several times at large sizes. Where they do not exist, it converts to float32 and ends up about as
# fast as float32 or slower.

# %% [markdown] slide="notes"
# Everything else falls back to a generic loop, tens to hundreds of times slower than
# float32: float16 on most CPUs, and bfloat16 on CPUs without AVX-512 (many laptops). That is why the timing
# above uses small matrices on a CPU. Which instructions does this machine have? (The flags are read on Linux.)

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the instructions and kernels of a CPU differ from machine to machine.
import os

print("PyTorch's CPU kernels use:", torch.backends.cpu.get_cpu_capability())
flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
for flag in ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"):
    print(f"{flag:<12} {'yes' if flag in flags else 'no'}")
