"""Fixtures shared by the unit tests: simulated GPU/MPS profiles (see gpu_sim.py)."""
from gpu_sim import any_device, cuda_device  # noqa: F401 - pytest finds fixtures by name here
