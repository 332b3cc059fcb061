"""Train-step time on 1 device vs 8 devices (a simulated CPU mesh or real chips).

  python benchmarks/mesh_step_time.py [--steps 10] [--meshes 1,1,1:1,8,1:8,1,1:2,2,2]

On a CPU it forces 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8,
set before jax is imported), so the figures show the overhead of partitioning on the
same cores, not a speed-up. On accelerators it uses the real devices. The smoke shapes
of experiments/smoke.py; median of --steps timed steps after 3 warm-up steps; ratio to
the single-device step.
"""

from __future__ import annotations

import argparse
import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from step_time import smoke, time_step  # noqa: E402

from lev_jax import sharding  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--meshes", default="1,1,1:1,8,1:8,1,1:2,2,2")
  args = p.parse_args()
  print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].device_kind}; "
        "median seconds per step (data, fsdp, tensor)")
  for variant in ("tied", "leviathan"):
    base = None
    for text in args.meshes.split(":"):
      shape = tuple(int(x) for x in text.split(","))
      c = smoke.get_config(variant)
      c.model.n_heads = c.model.n_kv_heads = 8   # divisible by an 8-way tensor axis
      c.model.head_dim = 16
      c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
      mesh = sharding.make_mesh(c.mesh, jax.devices()[:int(np.prod(shape))])
      s = time_step(c, args.steps, mesh)
      base = base or s
      print(f"{variant:<10} mesh {str(shape):<10} {s:8.4f} s  {s / base:6.2f}x", flush=True)


if __name__ == "__main__":
  main()
