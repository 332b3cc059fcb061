"""`dense`: the model's weight matmuls, with CPU gradients in a CPU-independent layout.

On the GPU and TPU `dense(x, w, n_in)` is `jax.lax.dot_general`. On the CPU its
gradient materialises each dot operand with its contracting dim minor, so that XLA:CPU
runs every dot of the backward pass in YNNPACK rather than Eigen, whose summation order
follows the CPU's caches and thread count: why, what was measured and what is not
covered are in `lev_jax/portable.py` (2.). Cost: a transposed copy of x and of w per
weight matmul's gradient; the step still got faster than with Eigen (docs/results.md,
"train-step time").
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from lev_jax import target


def dense(x: jax.Array, w: jax.Array, n_in: int = 1,
          preferred_element_type=None) -> jax.Array:
  """x [..., *I] . w [*I, *O] -> [..., *O], contracting the n_in dims I.

  Used for every weight matmul of the model: attention, MLP, output head, LEV's seed
  and output projections.

  Args:
    x: activations, any float dtype; its leading dims are batch-like.
    w: the weight, in x's dtype (cast it first); its first n_in dims equal x's last.
    n_in: how many dims are contracted (2 for the [H, K] -> D projections).
    preferred_element_type: the result's dtype (float32 logits from bfloat16 inputs);
      default x's dtype. See jax.lax.dot_general.
  Returns:
    [..., *O] of preferred_element_type: the value of jax.lax.dot_general. On the CPU
    the gradients' dots run in the layout described in the module docstring.
  Raises:
    ValueError: the contracted dims of x and w differ.
  """
  in_shape = x.shape[x.ndim - n_in:]
  if tuple(w.shape[:n_in]) != tuple(in_shape):
    raise ValueError(f"dense: x's last {n_in} dims {in_shape} must equal w's first "
                     f"{n_in} dims {w.shape[:n_in]}")
  out_dtype = jnp.dtype(preferred_element_type or x.dtype)
  if target.platform() != "cpu":
    dims = ((tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))), ((), ()))
    return jax.lax.dot_general(x, w, dims, preferred_element_type=out_dtype)
  lead, out = x.shape[:x.ndim - n_in], w.shape[n_in:]
  i, o = math.prod(in_shape), math.prod(out)
  return _cpu_dot(x.reshape(-1, i), w.reshape(i, o), out_dtype).reshape(*lead, *out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cpu_dot(x_TxI: jax.Array, w_IxO: jax.Array, out_dtype) -> jax.Array:
  return jnp.dot(x_TxI, w_IxO, preferred_element_type=out_dtype)


def _cpu_dot_fwd(x_TxI, w_IxO, out_dtype):
  return _cpu_dot(x_TxI, w_IxO, out_dtype), (x_TxI, w_IxO)


def _cpu_dot_bwd(out_dtype, residuals, dy_TxO):
  del out_dtype
  x_TxI, w_IxO = residuals
  f32 = jnp.float32
  # Each operand is materialised with its contracting dim minor; the barriers keep XLA
  # from folding a transpose back into a dot's dimension numbers, before the dots and
  # after them (the tied table's gradient is dw^T).
  dy_TxO, wt_OxI, xt_IxT = jax.lax.optimization_barrier((dy_TxO, w_IxO.T, x_TxI.T))
  dx_TxI = jnp.dot(dy_TxO, wt_OxI, preferred_element_type=f32)
  dw_IxO = jnp.dot(xt_IxT, dy_TxO, preferred_element_type=f32)
  dx_TxI, dw_IxO = jax.lax.optimization_barrier((dx_TxI, dw_IxO))
  return dx_TxI.astype(x_TxI.dtype), dw_IxO.astype(w_IxO.dtype)


_cpu_dot.defvjp(_cpu_dot_fwd, _cpu_dot_bwd)
