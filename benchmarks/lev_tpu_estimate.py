"""LEV alone on one TPU chip: XLA:TPU's cost-model ESTIMATE of its forward + backward.

  python benchmarks/lev_tpu_estimate.py                          # the v5p-128 share
  python benchmarks/lev_tpu_estimate.py --rows 4096 --generation v5p --rung leviathan_1.2b
  python benchmarks/lev_tpu_estimate.py --impl fused               # the CPU core, for contrast

Compiles, for one chip of the generation (libtpu; no TPU needed), LEV's embedding of
`--rows` ids and its gradient (lev_jax.lev.lev_embed with the rung's config: its core,
`lev.impl`, unless --impl names another, and its chunks), twice: as it runs (its loops,
whose body XLA's cost model counts once) and with its loops unrolled
(lev_jax.target.unrolled_loops; the same computation, loop-free). Prints both
estimates, FLOPs, bytes accessed and temporaries. --rows is the rows each chip
evaluates per step: train.global_batch_size x seq_len / chips in `lev.mode=tokens`
(4,096 on a v5p-128 slice for the ladder's 512 x 512 batch). Every time here is the
compiler's ESTIMATE, not a measurement. The fused core's unrolled compile takes ~11
minutes on a 2-core CPU; the vectorized core has no loop but the chunks'.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def estimate(rung: str, rows: int, generation: str, impl: str = "",
             phi_grad_dtype: str = "") -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lev_jax import lev as lev_lib, target, topology  # pylint: disable=import-outside-toplevel
  from lev_jax.config import lev_digit_base, padded_vocab_size  # pylint: disable=import-outside-toplevel
  from lev_jax.experiments import load_experiment  # pylint: disable=import-outside-toplevel
  config = load_experiment(REPO / "experiments" / "ladder.py").get_config(rung)
  if impl:
    config.lev.impl = impl
  if phi_grad_dtype:
    config.lev.phi_grad_dtype = phi_grad_dtype
  cfg = ml_collections.FrozenConfigDict(config.lev)
  vocab = padded_vocab_size(config.model.vocab_size, config.model.vocab_multiple)
  # One chip of a one-host slice (libtpu makes no 1-chip v5p topology): the program is
  # placed on that chip alone.
  device = topology.topology_devices(topology.parse_topology(f"{generation}-8"))[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  params = jax.eval_shape(lambda: lev_lib.LEV(vocab, config.model.d_model, config.lev,
                                              rngs=nnx.Rngs(0)).param_dict())
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        params)
  ids = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=sharding)
  base = lev_digit_base(cfg.base, cfg.n_coords, vocab)
  out = {"rung": rung, "rows": rows, "generation": generation, "impl": cfg.impl,
         "chunk_size": cfg.chunk_size, "jax": jax.__version__}
  for name, ctx in (("looped", contextlib.nullcontext), ("loop_free", target.unrolled_loops)):
    def forward_backward(p, i):  # a new function per compile: jit caches by function
      x, vjp = jax.vjp(lambda q: lev_lib.lev_embed(q, i, cfg, base), p)
      return vjp(x)[0]
    start = time.perf_counter()
    with target.compiling_for("tpu"), ctx():
      compiled = jax.jit(forward_backward).lower(params, ids).compile()
    cost = compiled.cost_analysis()
    out[name] = {"step_s": cost.get("optimal_seconds"), "flops": cost.get("flops"),
                 "bytes_accessed": cost.get("bytes accessed"),
                 "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                 "compile_s": time.perf_counter() - start}
    print(f"{rung} LEV ({cfg.impl}), {rows:,} rows on one {generation} chip, {name}: "
          f"{out[name]['step_s'] * 1e3:.2f} ms ESTIMATE, {out[name]['flops']:.3e} FLOPs, "
          f"{out[name]['bytes_accessed']:.3e} bytes accessed, compiled in "
          f"{out[name]['compile_s']:.0f} s", flush=True)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rung", default="leviathan_1.2b")
  p.add_argument("--rows", type=int, default=4096)
  p.add_argument("--generation", default="v5p")
  p.add_argument("--impl", default="", help="lev.impl to compile (default: the rung's)")
  p.add_argument("--phi_grad_dtype", default="",
                 help="lev.phi_grad_dtype to compile (default: the rung's)")
  p.add_argument("--json", default="", help="also write the figures here")
  args = p.parse_args(argv)
  out = estimate(args.rung, args.rows, args.generation, args.impl, args.phi_grad_dtype)
  if args.json:
    from lev_jax.workdir import write_json_atomic  # pylint: disable=import-outside-toplevel
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.json, out)  # strict JSON, never a partial file
  return 0


if __name__ == "__main__":
  sys.exit(main())
