# %% [markdown]
# # Mixed precision: fast where we can, precise where we must
#
# Back to the backpack: four big folders become two big ones, for the documents that matter, and two compact
# ones. Most of training's maths runs in 16 bits; a few steps keep 32.
#
# **You will learn** why updates stay in float32, when to scale the loss, how to time a multiply fairly, and
# the one setting that turns it all on. A CPU runs everything; a GPU shows the speed-up.

# %% [setup]
# %% [markdown]
# ## Why?
#
# Training in float32 is slow and memory-hungry. GPUs' **tensor cores** (matrix units) multiply 16-bit matrices
# many times faster, and a 16-bit **activation** (a layer's output, kept for the backward pass) takes half the
# bytes. But a few steps need float32's precision.
#
# A float is a sign, an **exponent** (the range) and a **fraction** (the precision: how finely numbers are
# spaced). `torch.finfo` describes each format:

# %%
import math

import torch
import torch.nn.functional as F

from course_utils import digits, hardware, precision
from course_utils.lessons import mixed_precision as lesson

FORMATS = (torch.float32, torch.bfloat16, torch.float16)
print(f"{'format':<14} | sign/exponent/fraction bits | gap after 1.0 | largest value | smallest normal")
for fmt in FORMATS:
    info = torch.finfo(fmt)
    fraction = round(-math.log2(info.eps))  # eps, the gap after 1.0, is 2 ** -fraction
    layout = f"1/{info.bits - 1 - fraction}/{fraction}"
    print(f"{str(fmt):<14} | {layout:>27} | {info.eps:>13.3g} | {info.max:>13.5g} | {info.smallest_normal:>15.3g}")

# %% [markdown]
# - **bfloat16** keeps float32's 8 exponent bits, so its **range** (to 3.4 × 10³⁸), but only 7 fraction bits:
#   near 1.0 its numbers are 0.0078 apart.
# - **float16** is **more precise** (10 fraction bits), but its range ends at 65,504, and below 6.1 × 10⁻⁵ (the
#   smallest normal) it keeps fewer and fewer bits.

# %% [markdown]
# ## How it works
#
# 1. **Keep the weights in float32**: the *master copy*.
# 2. **Run the forward and backward passes in mixed precision**: matrix multiplications in 16 bits; the loss,
#    and on a GPU softmax and normalization, in float32. `torch.autocast` decides op by op.
# 3. **Gradients arrive in float32**, and the optimizer updates the float32 weights, so tiny updates survive.
# 4. **float16 only: loss scaling.** Multiply the loss by a big number before the backward pass, so tiny
#    gradients do not round to zero; divide them back before the update. bfloat16 has float32's range.

# %% [markdown]
# ### Can a tiny update survive?
#
# An optimizer step: $w \leftarrow w - \eta \cdot \nabla_w L$, with $w$ the weight (the master copy), $\eta$
# the learning rate ($10^{-5}$ to $10^{-3}$), $\nabla_w L$ the gradient (from the 16-bit maths). The update is
# tiny. **Predict before you run:** what does each format store for $1.0 - 10^{-4}$?

# %%
w = 1.0
print(f"{'update':>7} | " + " | ".join(f"{str(fmt):>16}" for fmt in FORMATS))
for update in (1e-2, 1e-3, 1e-4, 1e-6, 1e-8):
    cells = []
    for fmt in FORMATS:
        new = (torch.tensor(w, dtype=fmt) - torch.tensor(update, dtype=fmt)).item()  # both stored in fmt
        cells.append(f"{new:.8f}" + (" lost" if new == w else "     "))
    print(f"{update:>7.0e} | " + " | ".join(f"{c:>16}" for c in cells))

# %% [markdown]
# $10^{-4}$ **vanishes** in both 16-bit formats; float32 keeps it (rounded in the 8th digit). bfloat16 even
# loses $10^{-3}$, and turns $10^{-2}$ into a step of 0.0117, the nearest number it has. A result is rounded to
# the nearest number, so an update below **half the gap** to the next one down is lost:

# %%
print(f"{'format':<14} | gap below 1.0 | smallest update that survives")
for fmt in FORMATS:
    gap = torch.finfo(fmt).eps / 2
    smallest = precision.smallest_surviving_update(1.0, fmt)  # found by bisection, with the subtraction above
    print(f"{str(fmt):<14} | {gap:>13.3g} | {smallest:.3g}")

# %% [markdown]
# **Predict before you run:** $10^{-4}$, a thousand times. Where does the weight end up?

# %%
final = {}
for fmt in FORMATS:
    w, update = torch.tensor(1.0, dtype=fmt), torch.tensor(1e-4, dtype=fmt)
    for _ in range(1000):
        w = w - update
    final[fmt] = w
    print(f"{str(fmt):<14} w after 1,000 updates: {w.item():.6f}")
print(f"the float32 master copy, read in bfloat16: {final[torch.float32].to(torch.bfloat16).item():.6f}")

# %% [markdown]
# A 16-bit weight **never moves**. The float32 master copy reaches 0.9, and the 16-bit copy read from it moves
# too. Rule 3: compute in 16 bits, **update in float32**.
#
# **Live demo:** pick a format, slide the update, see whether it survives.

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget (nbval has no widget front end)."
lesson.tiny_update_widget(update=1e-4)

# %% [markdown]
# ### Your turn: a small weight
#
# Gaps scale with the number. A weight of 0.02 gets an update of $10^{-5}$. In which 16-bit formats does it survive: `'both'`, `'bfloat16 only'`,
# `'float16 only'` or `'neither'`? Decide, then test with `precision.survives(0.02, 1e-5, "bfloat16")`.

# %%
answer = ...  # 'both', 'bfloat16 only', 'float16 only' or 'neither'
lesson.check_small_weight_update(answer)

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
# ### Range: huge and tiny numbers
#
# **Range** is the other limit. **Predict before you run:** where do `inf` and 0 appear?

# %%
values = torch.tensor([100_000.0, 65_504.0, 1e-5, 1e-7, 1e-8, 1e-30], dtype=torch.float64)
print(f"{'value':>8} | " + " | ".join(f"{str(fmt):>14}" for fmt in FORMATS))
for v in values:
    print(f"{v.item():>8.5g} | " + " | ".join(f"{v.to(fmt).item():>14.5g}" for fmt in FORMATS))

# %% [markdown]
# float16 **overflows** above 65,504 to `inf` and **flushes** values below about 3 × 10⁻⁸ to zero; up to
# 6.1 × 10⁻⁵ they are **subnormal**, with fewer bits (1e-7 reads 1.19e-7). bfloat16 rounds, never to zero.
#
# Gradients are small: here 100,000 stand-ins spread around $10^{-6}$ (log-normal, seeded). **Predict:** what
# fraction becomes zero in float16, and after a loss scale of 65,536 ($2^{16}$)?

# %%
grads = precision.synthetic_gradients(n=100_000, log10_mean=-6.0, log10_std=1.5, seed=0)
smallest_normal = torch.finfo(torch.float16).smallest_normal
print(f"{'loss scale':>10} | {'zero':>7} | {'subnormal':>9} | {'inf':>6} | {'normal':>7}")
for scale in (1, 65_536):
    h = (grads * scale).to(torch.float16).abs()
    zero, inf = (h == 0).sum().item() / h.numel(), h.isinf().sum().item() / h.numel()
    subnormal = ((h > 0) & (h < smallest_normal)).sum().item() / h.numel()
    print(f"{scale:>10,} | {zero:>7.3%} | {subnormal:>9.3%} | {inf:>6.3%} | {1 - zero - subnormal - inf:>7.3%}")

# %% [markdown]
# Unscaled, 15.6 % become zero and 72.5 % subnormal. Scaling the loss scales every gradient (the chain rule is
# linear): 0.004 % still flush, 0.006 % overflow. The optimizer divides back in float32: **loss scaling**.

# %%
fig = lesson.gradient_histogram(grads, scale=65_536.0)

# %% [markdown] slide="notes"
# **Text description of the chart.** Counts (y) of log10 |gradient| (x, −14 to 6) over float16's bands: zero
# below −7.5, subnormal to −4.2, overflow above 4.8. The blue curve (as computed) peaks at −6, subnormal; the
# green (× 65,536) is the same shape 4.8 to the right, almost all normal.

# %% [markdown]
# ### What autocast does to the dtypes
#
# `torch.autocast` applies rules 1 to 3: bfloat16 on a CPU or an Ampere+ GPU (compute capability, NVIDIA's
# generation number, 8.0 or more), float16 on a T4. **Predict:** which lines show a 16-bit type?

# %%
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dtype = hardware.autocast_dtype(device)  # bfloat16 on a CPU or an Ampere+ GPU, float16 on a T4
model = torch.nn.Linear(512, 512).to(device)
x = torch.randn(64, 512, device=device)
y = torch.randn(64, 512, device=device)

with torch.autocast(device_type=device.type, dtype=dtype):
    out = model(x)                               # matrix multiply: 16 bits
    loss = torch.nn.functional.mse_loss(out, y)  # loss: float32
loss.backward()                                  # backward pass, outside autocast

print("weights: ", model.weight.dtype)       # the master copy
print("output:  ", out.dtype)
print("loss:    ", loss.dtype)
print("gradient:", model.weight.grad.dtype)  # matches the weights

# %% [markdown]
# Only the matrix multiply ran in 16 bits. Rule 2's softmax and normalization depend on the device:

# %%
with torch.autocast(device_type=device.type, dtype=dtype):
    h = model(x)  # 16 bits
    print(f"{device.type} autocast, input {h.dtype}")
    print("softmax:   ", torch.softmax(h, dim=-1).dtype)
    print("layer_norm:", F.layer_norm(h, h.shape[-1:]).dtype)
    print("mse_loss:  ", F.mse_loss(h, y).dtype)

# %% [markdown]
# On a GPU all three print float32: CUDA autocast's float32 list has softmax, layer norm and the losses. The
# CPU's list is mainly losses: there softmax and layer norm keep their input's 16-bit type.

# %% [markdown]
# ## Benefits and trade-offs
#
# **Benefits**
# - **Faster maths.** An H100 does about 990 TFLOP/s (trillion operations a second) in bfloat16, against 67 in
#   float32. Real training often runs 2 to 3 times faster: memory traffic and the optimizer do not speed up.
#   bfloat16 is today's default on Ampere+.
# - **Activations take half the memory**, so bigger batches fit.
# - **Little or no loss in accuracy.**

# %% [markdown]
# **Trade-offs**
# - **The model state does not shrink**: weights, gradients and Adam's state stay float32, 16 bytes a
#   parameter.
# - **bfloat16 needs an Ampere or newer GPU** (A100, H100, RTX 30 series and up). On a T4, like free Colab,
#   use float16.
# - **float16 overflows above 65,504 and loses tiny values**, so it needs loss scaling.

# %%
for key in ("H100", "A100", "T4"):
    sheet = hardware.DATASHEETS[key]
    print(f"{sheet.name:<16} 16-bit tensor cores {sheet.tensor16_tflops:>4.0f} TFLOP/s, float32 "
          f"{sheet.fp32_tflops:>4.1f}: {sheet.tensor16_tflops / sheet.fp32_tflops:4.1f}x on paper")
batch, tokens, hidden = 8, 1024, 4096
for fmt in (torch.float32, torch.bfloat16):
    nbytes = batch * tokens * hidden * torch.finfo(fmt).bits // 8
    print(f"one {batch}x{tokens}x{hidden} activation in {str(fmt):<14}: {nbytes / 2**20:,.0f} MiB")
state_bytes = 4 + 4 + 8  # float32 weights + float32 gradients + Adam's two float32 moments
print(f"model state with Adam: {state_bytes} bytes per parameter, {state_bytes * 7e9 / 1e9:.0f} GB for 7 billion")

# %% [markdown]
# ## In practice
#
# ### Timing a matrix multiply
#
# GPU work is **asynchronous**: `a @ b` returns before the GPU has finished. So warm up, **synchronize** (wait
# for the GPU) before reading the clock, and repeat. Sides: 4096 on a GPU, 256 on a CPU. **Predict:** is
# float16 faster than float32 on your machine? bfloat16?

# %% tags=["nbval-ignore-output"] nbval_reason="a timing, different on every machine and in every run."
import time

size = 4096 if device.type == "cuda" else 256
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # a CPU has finished on return
a = torch.randn(size, size, device=device)
b = torch.randn(size, size, device=device)

for fmt in (torch.float32, torch.bfloat16, torch.float16):
    p, q = a.to(fmt), b.to(fmt)
    p @ q                     # warm up
    sync()
    start = time.perf_counter()
    for _ in range(50):
        p @ q
    sync()                    # wait for the GPU to finish
    ms = (time.perf_counter() - start) / 50 * 1000
    print(f"{fmt}: {ms:.2f} ms per matrix multiply")

# %% [markdown]
# `torch.utils.benchmark.Timer` does these chores and reports the median (on one CPU thread unless told
# otherwise). A multiply of side $n$ costs $2n^3$ operations:

# %% tags=["nbval-ignore-output"] nbval_reason="timings differ from machine to machine and from run to run."
from torch.utils import benchmark

seconds = {}
for fmt in (torch.float32, torch.bfloat16, torch.float16):
    timer = benchmark.Timer(stmt="p @ q", globals={"p": a.to(fmt), "q": b.to(fmt)},
                            num_threads=torch.get_num_threads())
    seconds[fmt] = timer.blocked_autorange(min_run_time=0.2).median
    speed = seconds[torch.float32] / seconds[fmt]
    than = "" if fmt == torch.float32 else f"{speed:.1f}x faster" if speed >= 1 else f"{1 / speed:.1f}x slower"
    print(f"{str(fmt):<14} {seconds[fmt] * 1e3:8.2f} ms {2 * size**3 / seconds[fmt] / 1e12:9.3g} TFLOP/s  {than}")

# %% [markdown]
# **A GPU is not a CPU.** Tensor cores make 16 bits win: NVIDIA's T4 datasheet gives 65 TFLOP/s in float16
# against 8.1 in float32; the A100's, 312 in bfloat16 against 19.5. Most CPUs have no 16-bit matrix units:
# float16 takes a slow generic path (often tens to hundreds of times slower), and bfloat16 is converted to
# float32 for the maths, about as fast or slower, unless the CPU has bfloat16 matrix instructions (recent
# Intel Xeons). A slow 16-bit row means "no matrix units for that type here" (a CPU; bfloat16 on a T4, which
# emulates it), not "16 bits are slow".

# %% [markdown]
# ### The mixed-precision training loop
#
# Notebook 01's task, 8 × 8 handwritten digits, with an MLP of two hidden layers of 128. One loop, the tricks
# as flags: `torch.autocast(..., dtype=dtype)` for the forward pass, and
# `torch.amp.GradScaler(..., enabled=(dtype == torch.float16))`, which, disabled, passes the loss through.

# %%
print(f"device: {device.type}, autocast dtype: {dtype}")
threads = torch.get_num_threads()
if device.type == "cpu":
    torch.set_num_threads(1)  # a network this small trains faster on one CPU thread than on several

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
print(f"{len(losses)} steps, loss scaling on: {scaler.is_enabled()}, loss scale at the end: {scaler.get_scale():,.0f}")

# %% tags=["nbval-ignore-output"] nbval_reason="16-bit sums run in a different order on each processor, so the last digits change."
for step in (0, 50, 100, 150, 199):
    print(f"step {step}: loss {losses[step]:.3f}")
print(f"test accuracy: {test_accuracy:.1%}")

# %% [markdown]
# The loss falls from about 2.30 (ln 10: a guess among 10 classes); with bfloat16 the scale stays at 1. Now
# float32 (`precision.train_mixed_precision`: this loop, `dtype` a flag), compared within a tolerance, as
# 16-bit digits vary by processor:

# %%
full = precision.train_mixed_precision("float32", device=device, steps=200)
loss_gap = abs(sum(losses[-50:]) / 50 - full.mean_loss(50))
print(f"{precision.dtype_name(dtype)} against float32: mean loss of the last 50 steps within 0.05: "
      f"{loss_gap <= 0.05}; test accuracy within 2 points: {abs(test_accuracy - full.test_accuracy) <= 0.02}")

# %% tags=["nbval-ignore-output"] nbval_reason="the digits behind the check above depend on the processor."
print(f"mean loss of the last 50 steps: float32 {full.mean_loss(50):.3f}, "
      f"{precision.dtype_name(dtype)} {sum(losses[-50:]) / 50:.3f}")
print(f"test accuracy: float32 {full.test_accuracy:.1%}, {precision.dtype_name(dtype)} {test_accuracy:.1%}")

# %%
fig = lesson.loss_curves({"float32": [log.loss for log in full.history],
                                   f"{precision.dtype_name(dtype)} autocast": losses})

# %% [markdown] slide="notes"
# **Text description of the chart.** Loss (y, 0 to 2.3) by step (x, 10 to 200), running means of 10. The
# float32 and mixed-precision curves fall together, from 2.15 to 0.33 by step 50, then to about 0.07.

# %% [markdown]
# ### What a T4 sees: float16, a loss scale, and a skipped step
#
# With float16 the scale starts at 65,536. When scaled gradients overflow, `scaler.step` **skips** the update
# and `scaler.update` **halves** the scale (2,000 clean steps double it). Step 60's loss is multiplied by
# 10,000 to force one:

# %%
fp16 = precision.train_mixed_precision("float16", device=device, steps=100, spike_at=(60,))
torch.set_num_threads(threads)  # back to all CPU threads
print(fp16.log_lines(every=20, losses=False))
print(f"skipped steps: {fp16.skipped_steps}")
print(f"still learning after the skipped step, test accuracy above 85%: {fp16.test_accuracy > 0.85}")

# %% [markdown]
# A few early drops are normal; worry when the scale keeps falling towards 1 or the loss turns `nan`.

# %% [markdown]
# ### Your turn: the float16 step
#
# Write `fp16_step`, one float16 training step on the CPU: forward pass and cross-entropy loss under
# `torch.autocast("cpu", dtype=torch.float16)`, then scale, backward, step, update, zero the gradients; return
# the loss. The check's second batch, of three, is 1,000 times larger: it overflows.

# %%
def fp16_step(model, optimizer, scaler, x, y):
    """One float16 training step with a GradScaler; returns the loss."""
    raise NotImplementedError  # your code: autocast forward and loss, scaler.scale(loss).backward(), ...


lesson.check_fp16_step(fp16_step)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def fp16_step(model, optimizer, scaler, x, y):
#     """One float16 training step with a GradScaler; returns the loss."""
#     with torch.autocast("cpu", dtype=torch.float16):  # matrix multiplies in float16
#         loss = F.cross_entropy(model(x), y)           # the loss in float32
#     scaler.scale(loss).backward()  # scaled gradients: tiny ones are not flushed to zero
#     scaler.step(optimizer)         # divides them by the scale; skips the step if one is inf or nan
#     scaler.update()                # halves the scale after an overflow
#     optimizer.zero_grad()
#     return loss
# ```
#
# Typical slips: `loss.backward()` on the unscaled loss (the update comes out 65,536 times too small);
# `optimizer.step()` instead of `scaler.step(optimizer)` (65,536 times too large, and an overflow is not
# skipped); no `scaler.update()` (the scale never falls); no `optimizer.zero_grad()` (step 2's inf gradients
# stay in `.grad` and spoil step 3).
#
# </details>

# %% [markdown]
# ### One setting in the libraries
#
# `TrainingArguments(bf16=True)` on Ampere+, `fp16=True` on a T4; a CPU also needs `use_cpu=True`.

# %%
from course_utils.progress import status
from course_utils.quiet import quiet_libraries

status("Importing transformers …")
with quiet_libraries():  # no library warnings or logs on stderr inside this block; restored after it
    from transformers import TrainingArguments

    kwargs = {"bf16": True} if dtype == torch.bfloat16 else {"fp16": True}
    if device.type == "cpu":
        kwargs["use_cpu"] = True
    args = TrainingArguments(output_dir="out", report_to="none", **kwargs)
    print(f"{kwargs} -> bf16={args.bf16}, fp16={args.fp16}, device {args.device.type}")
    if device.type == "cpu":
        try:
            TrainingArguments(output_dir="out", report_to="none", bf16=True)
        except ValueError as err:
            print(f"bf16=True without use_cpu=True: {type(err).__name__}")
for library, setting in precision.library_settings(dtype).items():
    print(f"{library:<24} {setting}")

# %% [markdown]
# Load the model in float32; the library adds autocast and the scaler. Libraries: PyTorch AMP, Hugging Face
# Trainer and Accelerate, Lightning, Keras (mixed-precision policies), NVIDIA Transformer Engine (8-bit FP8
# training, H100 and newer).
#
# ## Run it yourself
#
# **Two spikes in a row:** `precision.train_mixed_precision("float16", device=device, steps=80,
# spike_at=(30, 31))`. Predict the final scale and skipped steps, then print `log_lines(every=20)`.
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
# 1. The matrix multiplies run in bfloat16. Why keep float32 weights?
# 2. In float16, the loss scale drops from 65,536 to 32,768 at step 60. Is the run broken?
# 3. Why does bfloat16 need no loss scaling, while float16 does?
# 4. A 7-billion-parameter model with Adam goes from float32 to mixed precision. Does its model state shrink?

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
# Compute in 16 bits, keep the weights and the update in float32. Training gets faster and activations take
# half the memory.
#
# - Updates below half a gap vanish in 16 bits: hence the float32 master copy.
# - float16 needs `GradScaler`; bfloat16 needs an Ampere+ GPU.
# - Time with `Timer`: 16 bits pay only on 16-bit matrix units, such as tensor cores.
# - One flag: `autocast` + `GradScaler(enabled=...)`, or `bf16=True`. The model state does not shrink.

# %% [markdown]
# ## Going deeper (optional)
#
# ### Matrix sizes, live
#
# Choose the 16-bit type and the matrix side; each change times one float32 and one 16-bit multiply with
# `precision.time_matmul` (the `Timer` call above). Small matrices cannot keep a GPU busy, so there the
# speed-up grows with the size. On a CPU, float16 is timed only up to 256 × 256, and if a large side would take
# more than a few seconds, a smaller one is timed and the report says so.

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget that shows live timings."
lesson.matmul_widget(device=device)

# %% [markdown]
# ### 16-bit maths on a CPU
#
# PyTorch hands a 16-bit matrix multiply on an x86 CPU to Intel's oneDNN library when the processor can run it
# well: bfloat16 on any CPU with AVX-512, float16 only on CPUs with float16 instructions (AVX512-FP16 or
# AMX-FP16, in recent Intel Xeons). oneDNN uses bfloat16 matrix instructions where they exist (AVX512-BF16, or
# AMX, a matrix unit in Intel Xeons since the 4th generation, "Sapphire Rapids"): there bfloat16 can beat
# float32 several times at large sizes. Where they do not exist, it converts to float32 and ends up about as
# fast as float32 or slower. Everything else falls back to a generic loop, tens to hundreds of times slower
# than float32: float16 on most CPUs, and bfloat16 on CPUs without AVX-512 (many laptops). Which instructions
# does this machine have? (The flags are read on Linux.)

# %% tags=["nbval-ignore-output"] nbval_reason="the instructions and kernels of a CPU differ from machine to machine."
import os

print("PyTorch's CPU kernels use:", torch.backends.cpu.get_cpu_capability())
flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
for flag in ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"):
    print(f"{flag:<12} {'yes' if flag in flags else 'no'}")

# %% [markdown]
# ### Autocast's op lists
#
# Autocast keeps, per device, a list of ops it runs in 16 bits (matrix multiplies, convolutions, attention) and
# a list it runs in float32; every other op runs in the type of its input. PyTorch's "Automatic Mixed
# Precision" page prints both lists: the CUDA float32 list includes `softmax`, `log_softmax`, `layer_norm`,
# `group_norm` and the losses; the CPU float32 list is mostly losses. This is why the softmax line above
# differs between a CPU and a GPU.
#
# ### transformers and a T4
#
# transformers checks `torch.cuda.is_bf16_supported()`, which says True on a T4 because it counts *emulated*
# bfloat16 too. It would accept `bf16=True` there and run slowly; choose by compute capability (8.0 or higher
# for bfloat16), as `hardware.autocast_dtype` does.
