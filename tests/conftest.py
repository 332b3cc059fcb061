"""Shared fixtures: tiny configs that build in milliseconds."""

import base64
import json
import os

if not os.environ.get("JAX_PLATFORMS"):  # unset or empty: an empty value made jax probe
  os.environ["JAX_PLATFORMS"] = "cpu"    # for accelerators (libtpu) in every process
# XLA:CPU spends seconds optimising each tiny test program; level 0 compiles ~3x faster
# and the tests' models are too small for the run time to matter. Without the fusion
# emitters (XLA's newer MLIR code generator for fusions) a tiny train step compiles
# ~2x faster again (5.4 s -> 2.7 s for the tiny Leviathan step, measured here). One
# LLVM module per program instead of XLA's parallel code-generation split: each split
# repeats LLVM's set-up, and the test workers already use every core (tests/test_loss.py
# + test_model.py: 74-78 -> 54 CPU-s on the 2-core machine). At level 0 the split
# changes last bits of some results (not at XLA's default level, which lev-train uses):
# every comparison here runs both sides under these same flags.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false "
                      "--xla_cpu_parallel_codegen_split_count=1")

import contextlib
import shutil
import signal
import tempfile

# One persistent XLA compilation cache for the whole session, inherited by the
# pytest-xdist workers and every lev-train subprocess through the environment: most
# tests build the same tiny programs, and XLA:CPU's compile (seconds each) would
# otherwise repeat in every test and every process. Removed at the end of the session.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="lev_jax_test_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest

from lev_jax.config import base_config


# Files whose tests run longest (a minute or more of worker time each: emulated CPU,
# several processes, 8 simulated devices, TPU compiles), collected first so that
# pytest-xdist hands them out at the start and the short tests fill in around them,
# rather than one of them starting last and running alone at the end.
SLOW_FILES_FIRST = ("test_portable.py", "test_multiprocess.py",
                    "test_launch_slurm_cluster.py", "test_sharding.py", "test_aot.py",
                    "test_cli_train.py", "test_cli_compile.py", "test_trainer.py")


def pytest_xdist_auto_num_workers(config):
  """Workers for `-n auto` (the README's command): one per core, plus one on a machine
  of up to 4 cores. About a seventh of two workers' core time was idle (tests that wait
  for a subprocess, a signal or a lock), and a third worker fills it; each worker is
  one process, so memory allows it (pytest-xdist's hook, xdist/newhooks.py)."""
  del config
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return cores + 1 if (cores or 1) <= 4 else cores


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable otherwise


def pytest_unconfigure(config):
  del config
  if _OWN_CACHE is not None and "PYTEST_XDIST_WORKER" not in os.environ:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def run_on_8_devices(test_file: str, *args: str) -> tuple[dict, str]:
  """Runs `python test_file *args` with 8 simulated host devices (the device count is
  fixed when jax starts, so in a subprocess) and this checkout's lev_jax first on the
  path (not an installed copy); returns (its last stdout line as JSON, its stderr,
  where XLA's C++ log lines go)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  here = os.path.dirname(os.path.abspath(test_file))
  path = os.pathsep.join(p for p in (os.path.dirname(here), os.environ.get("PYTHONPATH"))
                         if p)
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") +
             " --xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
             TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=path)
  proc = subprocess.run([sys.executable, test_file, *args], capture_output=True, text=True,
                        env=env, cwd=here, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def tiny_config(embedding="lev", n_layers=1, **lev):
  """A d_model=32 model over a 300-id vocab (padded to 384): one layer unless a test needs
  more (the tests of layer stacking, scanning, decoding and export ask for two: a tiny
  step compiles ~35 % faster with one, and most tests do not depend on depth)."""
  c = base_config()
  c.name = f"tiny_{embedding}"
  c.model.embedding = embedding
  c.model.vocab_size = 300
  c.model.d_model = 32
  c.model.n_layers = n_layers
  c.model.n_heads = 4
  c.model.n_kv_heads = 2
  c.model.head_dim = 8
  c.model.d_ff = 64
  c.lev.d_seed = 8
  c.lev.n_heads = 2
  c.lev.n_knots = 6
  c.lev.rank = 4
  for k, v in lev.items():
    c.lev[k] = v
  c.train.seq_len = 16
  c.train.global_batch_size = 4
  c.train.steps = 10
  c.optim.warmup_steps = 2
  return c


@contextlib.contextmanager
def ctrl_c_not_ignored():
  """Processes started inside get Ctrl-C (SIGINT) as from a terminal. A pytest started
  with `&` by a script ignores SIGINT and its children inherit that; Python, and
  lev-train after it, then leave Ctrl-C ignored."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def make_config():
  return tiny_config


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
  """One embedded-corpus + tokenizer cache shared by the tests that train."""
  return tmp_path_factory.mktemp("lev_jax_cache")


def byte_config(embedding="lev"):
  """tiny_config over the 259-id ByteTokenizer (no tokenizer training needed)."""
  c = tiny_config(embedding)
  c.model.vocab_size = 259
  c.data.tokenizer = "bytes"
  return c


def write_workdir(path, config, steps=(1, 2), tokenizer_fingerprint=None):
  """A lev-train workdir without training: checkpoints at `steps` (params scaled by
  1 + 0.1 * step, so steps differ; their progress items record `tokenizer_fingerprint`,
  as lev-train's do) and the ByteTokenizer in WORKDIR/tokenizer."""
  import grain
  import jax
  import jax.numpy as jnp
  from lev_jax.checkpoint import Checkpointer
  from lev_jax.data.tokenizer import ByteTokenizer
  from lev_jax.data.tokenizer_files import save_tokenizer
  from lev_jax.train import create_train_state
  _, state = create_train_state(config)
  ckpt = Checkpointer(path / "checkpoints", keep=5, async_save=False)
  it = iter(grain.MapDataset.range(4).to_iter_dataset())
  for s in steps:
    state = dict(state, step=jnp.int32(s),
                 params=jax.tree.map(lambda x: x * (1 + 0.1 * s), state["params"]))
    ckpt.save(s, state, it, config, tokenizer_fingerprint=tokenizer_fingerprint)
  ckpt.close()
  save_tokenizer(ByteTokenizer(), path / "tokenizer")
  return state


# --- A trained tiny run for the trainer, checkpoint and guard tests

def run_config(embedding, cache_dir, steps=8):
  c = tiny_config(embedding)
  c.model.vocab_size = 512
  c.data.cache_dir = str(cache_dir)
  c.train.steps = steps
  c.train.seq_len = 32
  c.train.global_batch_size = 8
  c.train.log_every = 2
  c.train.eval_every = 4
  c.train.checkpoint_every = 4
  c.optim.lr = 1e-2
  c.optim.warmup_steps = 1
  c.eval.batches = 2
  c.eval.batch_size = 4
  return c


def lev_train_config(config_flag, overrides):
  """The config lev-train builds from `--config=FILE:VARIANT` (config_flag) and its
  `--config.SECTION.FIELD=VALUE` overrides (numbers, or data.cache_dir), for a run in
  the test's process (train_and_evaluate) that a lev-train subprocess is compared with."""
  from lev_jax.experiments import load_experiment
  path, variant = config_flag.removeprefix("--config=").rsplit(":", 1)
  c = load_experiment(path).get_config(variant)
  for arg in overrides:
    section, rest = arg.removeprefix("--config.").split(".", 1)
    field, value = rest.split("=", 1)
    c[section][field] = value if field == "cache_dir" else type(c[section][field])(value)
  return c


def saved_state(workdir, step):
  """The `state` item of checkpoint `step` as saved (no target shardings)."""
  import orbax.checkpoint as ocp
  with ocp.CheckpointManager(workdir / "checkpoints", item_names=("state",)) as mgr:
    return mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]


def metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def finished_tied_run(tmp_path_factory, data_cache):
  """(config, workdir) of a finished 4-step tied run, checkpoints at steps 2 and 4,
  metrics every step; tests copy it (`copy_run`), never change it."""
  from lev_jax.trainer import train_and_evaluate
  root = tmp_path_factory.mktemp("finished_tied")
  c = run_config("tied", data_cache, steps=4)
  c.train.checkpoint_every = 2
  c.train.log_every = 1
  train_and_evaluate(c, root / "run")
  return c, root / "run"


def files_of(workdir):
  """{path: (bytes, mtime in ns)} of every file under `workdir`, and its folders (None):
  equal before and after only if nothing was written, replaced or created."""
  return {p: (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
          for p in [workdir, *workdir.rglob("*")]}


def copy_run(finished, dst):
  """A private copy of a finished run: (a copy of its config, the copied workdir)."""
  c, src = finished
  shutil.copytree(src, dst)
  return c.copy_and_resolve_references(), dst



@pytest.fixture
def ranks_file(tmp_path):
  """A tiny tiktoken ranks file (256 bytes + 5 merges), loaded by
  data.TiktokenTokenizer as o200k_base's stand-in (o200k's specials, vocab 200019)."""
  ranks = {bytes([i]): i for i in range(256)}
  for piece in (b"th", b"the", b" the", b"in", b"ing"):
    ranks[piece] = len(ranks)
  path = tmp_path / "tiny.tiktoken"
  # The .tiktoken format: one "base64(bytes) rank" line per token.
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
  return str(path)


# --- A small trained SentencePiece model for the tokenizer and tokenizer-folder tests

SPM_DOCS = [
    f"Document {i}: the quick brown fox jumps over the lazy dog.\n"
    f"    def f(x):\n        return x * {i}  # indented code\n\nNumbers 12345 and 'quotes'."
    for i in range(40)
]


@pytest.fixture(scope="module")
def trained_spm(tmp_path_factory):
  """(a 320-id SentencePieceTokenizer trained on SPM_DOCS, its cache folder)."""
  from lev_jax.data.tokenizer import train_sentencepiece
  cache = tmp_path_factory.mktemp("spm")
  return train_sentencepiece(SPM_DOCS, 320, cache), cache


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
  """A private one-node SLURM cluster (tests/slurm_cluster.py) for this module's tests,
  stopped and removed afterwards; skipped when SLURM and MUNGE are not installed or this
  is not root. Clients reach it with `env=slurm_cluster.env()` (SLURM_CONF)."""
  from slurm_cluster import LocalSlurm, unavailable
  reason = unavailable()
  if reason:
    pytest.skip(reason)
  cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
  try:
    cluster.start()
  except RuntimeError as e:  # installed but not starting: worth a failure, with the logs
    pytest.fail(str(e), pytrace=False)
  yield cluster
  cluster.stop()
  shutil.rmtree(cluster.root, ignore_errors=True)
