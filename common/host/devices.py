"""Devices and processes for the command line: start JAX's runtime, lay the runs out on a mesh.

`setup_devices` must run before any JAX computation: it chooses the number of XLA CPU devices
(one per core) and joins a multi-process run (`jax.distributed`, gloo collectives on CPU).
`Layout` spreads the vmapped runs of one command over a one-axis mesh: `--parallel seeds`
splits the runs across the devices, `--parallel data` trains every run on all of them, its
environments split (`common/distributed.py`). With several processes every process runs the
same driver on its own devices; only process 0 writes logs and checkpoints.
"""

import contextlib
import os
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

from common.distributed import DATA_AXIS, SEEDS_AXIS


def fail(message, code: int = 2):
    """Print `error: message` on one line of stderr and exit with `code`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code) from None


def setup_devices(config):
    """Start JAX's runtime for the device options of `config` (a RunOptions); call it before any JAX computation.

    - With `coordinator_address` (or `JAX_COORDINATOR_ADDRESS`) and more than one process
      (`num_processes`, or `JAX_NUM_PROCESSES`; `process_id` or `JAX_PROCESS_ID`), call
      `jax.distributed.initialize`, with gloo for CPU collectives and a heartbeat timeout of
      `distributed_timeout` seconds: if a peer dies, the others stop with an error instead of
      waiting forever.
    - On CPU, make one XLA device per core this process may run on (`os.sched_getaffinity`,
      so `taskset -c 0` means one device), or `num_devices / num_processes` of them. An
      `--xla_force_host_platform_device_count` already in `XLA_FLAGS` wins.

    Where the backend has already started (in-process callers, tests) it does nothing: the
    devices that exist are used.
    """
    address = config.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    processes = config.num_processes if config.num_processes > 1 else \
        int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    process_id = config.process_id if config.num_processes > 1 else \
        int(os.environ.get("JAX_PROCESS_ID", "0"))
    if processes > 1 and not address:
        fail("--num-processes > 1 needs --coordinator-address HOST:PORT (process 0's).")
    if processes > 1 and not 0 <= process_id < processes:
        fail(f"--process-id must be in [0, {processes}), got {process_id}.")
    try:
        from jax._src import xla_bridge
        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # private API: assume the worst
        started = True
    if started:
        if processes != jax.process_count():
            fail(f"this process is already part of a {jax.process_count()}-process JAX "
                 f"runtime; it cannot join a {processes}-process run.")
        return
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        local = cores if config.num_devices == 0 else max(1, config.num_devices // processes)
        jax.config.update("jax_num_cpu_devices", local)
    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        join(address, processes, process_id, config.distributed_timeout)


def join(address: str, processes: int, process_id: int, timeout: int):
    """`jax.distributed.initialize`, or one line and exit status 1 when not every process
    has connected within `timeout` seconds (a process that never came, two with the same
    `--process-id`, processes told different `--num-processes`).

    JAX's own failure there is a C++ abort a few seconds after the timeout, which no Python
    code can catch; a watchdog thread speaks first and leaves with `os._exit`."""
    connected = threading.Event()

    def watchdog():
        if not connected.wait(timeout):
            print(f"error: process {process_id} of {processes}: not every process connected "
                  f"to the coordinator {address} within {timeout} s (--distributed-timeout); "
                  f"start all {processes} processes with the same --num-processes and "
                  f"--coordinator-address, each with its own --process-id from 0 to "
                  f"{processes - 1}.", file=sys.stderr, flush=True)
            os._exit(1)

    threading.Thread(target=watchdog, name="join-watchdog", daemon=True).start()
    jax.distributed.initialize(address, processes, process_id, initialization_timeout=timeout,
                               heartbeat_timeout_seconds=timeout,
                               shutdown_timeout_seconds=timeout)
    connected.set()


class Layout:
    """How the runs of one command are spread over devices: a one-axis mesh and the
    `PartitionSpec` of every input and output of the compiled functions (`run`: the
    RunOptions; `num_envs`: environments per run; `template`: the vmapped TrainState's shape).

    `parallel="seeds"`: the mesh axis is `SEEDS_AXIS`; every array's leading (seeds) axis is
    split across devices, so `num_seeds` must divide by the device count (no padding; with
    `num_devices=0` the largest device count that divides it is used).
    `parallel="data"`: the mesh axis is `DATA_AXIS`; parameters, optimiser state, keys and
    metrics are replicated, the environments (`TrainState.env`, axis 1 after the seeds) split.
    """

    def __init__(self, run, num_envs: int, template):
        available = jax.device_count()
        wanted = run.num_devices
        if wanted > available:
            fail(f"--num-devices {wanted}: only {available} device(s) here "
                 f"({jax.devices()[0].platform}).")
        if run.parallel == "seeds":
            if wanted == 0:
                wanted = available if jax.process_count() > 1 else \
                    max(d for d in range(1, available + 1) if run.num_seeds % d == 0)
            if run.num_seeds % wanted:
                fail(f"--num-seeds {run.num_seeds} does not divide among {wanted} devices; "
                     "pick a multiple (or --num-devices that divides it).")
            self.axis, self.seeds, self.replicated = SEEDS_AXIS, P(SEEDS_AXIS), P(SEEDS_AXIS)
            self.state = jax.tree.map(lambda _: P(SEEDS_AXIS), template)
        else:
            wanted = wanted or available
            if num_envs % wanted:
                fail(f"--parallel data: --num-envs {num_envs} does not divide among "
                     f"{wanted} devices.")
            self.axis, self.seeds, self.replicated = DATA_AXIS, P(), P()
            self.state = jax.tree.map(lambda _: P(), template)._replace(
                env=jax.tree.map(lambda _: P(None, DATA_AXIS), template.env))
        if jax.process_count() > 1 and wanted != available:
            fail(f"with {jax.process_count()} processes every device takes part: "
                 f"--num-devices must be 0 or {available}.")
        self.num_devices = wanted
        self.mesh = jax.sharding.Mesh(np.array(jax.devices()[:wanted]), (self.axis,))

    def spread(self, fn, in_specs, out_specs):
        """`jit(shard_map(fn))` over the mesh."""
        return jax.jit(jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs,
                                     out_specs=out_specs, check_vma=False))

    def compile(self, fn, in_specs, out_specs, *shapes):
        """`spread(fn, in_specs, out_specs)` compiled for `shapes` (`shapes(...)` of each
        argument): a function of global arrays laid out by `in_specs` that returns global
        arrays laid out by `out_specs`, the same values to float rounding.

        Seeds split over several devices of this process run as one program per device, each
        called on its own part: a program that spans several devices is one execution, which
        starts only once every device's inputs are ready, so each call (a chunk of updates)
        would end with the devices waiting for the slowest, and host work that slows one
        device would hold up all. Apart, a device starts its next call as soon as its own part
        of the last one is done. The programs compute what the shard_map's body computes on
        each device (the runs of a seeds layout never communicate), each optimised by XLA on
        its own. Data-parallel runs, whose
        devices average gradients at every step, compile one program over the mesh."""
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        if self.axis != SEEDS_AXIS or len(local) < 2:
            return self.spread(fn, in_specs, out_specs).lower(*shapes).compile()
        parts = self.num_devices

        def on(device, tree, specs):  # one device's part of each argument's shape
            return jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(
                (x.shape[0] // parts,) + x.shape[1:] if spec == P(SEEDS_AXIS) else x.shape,
                x.dtype, sharding=SingleDeviceSharding(device)), tree, specs)

        def every_leaf(specs, tree):  # specs given for a prefix of `tree`, one per leaf
            return jax.tree.map(lambda spec, sub: jax.tree.map(lambda _: spec, sub), specs,
                                tree, is_leaf=lambda x: isinstance(x, P))

        in_specs = every_leaf(tuple(in_specs), shapes)
        flat_in_specs = jax.tree.leaves(in_specs, is_leaf=lambda x: isinstance(x, P))
        lowered = [jax.jit(fn).lower(*on(d, shapes, in_specs)) for d in local]
        with ThreadPoolExecutor(len(local)) as pool:  # XLA compiles outside the GIL
            programs = dict(zip(local, pool.map(lambda low: low.compile(), lowered)))
        flat_specs, out_tree = jax.tree.flatten(every_leaf(out_specs, lowered[0].out_info))

        def run(*args):
            by_device = {d: [] for d in local}
            flat_args, tree = jax.tree.flatten(args)
            for x, spec in zip(flat_args, flat_in_specs):
                for shard in x.addressable_shards:
                    if x.size == 0:  # jit lays out arrays without elements as replicated
                        shape = (x.shape[0] // parts,) + x.shape[1:] \
                            if spec == P(SEEDS_AXIS) else x.shape
                        by_device[shard.device].append(
                            jax.device_put(np.zeros(shape, x.dtype), shard.device))
                    else:
                        by_device[shard.device].append(shard.data)
            outs = [jax.tree.leaves(programs[d](*jax.tree.unflatten(tree, by_device[d])))
                    for d in local]
            return jax.tree.unflatten(out_tree, [jax.make_array_from_single_device_arrays(
                (first.shape[0] * parts,) + first.shape[1:] if spec == P(SEEDS_AXIS)
                else first.shape, NamedSharding(self.mesh, spec), [o[i] for o in outs])
                for i, (first, spec) in enumerate(zip(outs[0], flat_specs))])
        return run

    def put(self, tree, specs):
        """Host values (NumPy or single-device arrays) as global arrays laid out by `specs`;
        every process passes the whole value and keeps its own devices' part. `specs`: a
        tree like `tree`'s, or one `PartitionSpec` for every leaf."""
        if isinstance(specs, P):
            specs = jax.tree.map(lambda _: specs, tree)

        def one(x, spec):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, NamedSharding(self.mesh, spec),
                                                lambda index: x[index])
        return jax.tree.map(one, tree, specs)

    def shardings(self, specs):
        """The `NamedSharding`s of this mesh for a tree of `PartitionSpec`s (a `jit`'s
        `out_shardings`)."""
        return jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), specs,
                            is_leaf=lambda x: isinstance(x, P))

    def shapes(self, tree, specs):
        """`jax.ShapeDtypeStruct`s of `tree` with the shardings of `specs` (for `lower`)."""
        if isinstance(specs, P):
            specs = jax.tree.map(lambda _: specs, tree)
        return jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(self.mesh, spec)), tree, specs)


def fetch(tree):
    """Global arrays to NumPy on this host (gathered across processes where needed)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return jax.tree.map(lambda x: np.asarray(x) if x.is_fully_replicated else
                            multihost_utils.process_allgather(x, tiled=True), tree)
    return jax.device_get(tree)


@contextlib.contextmanager
def peers_alive():
    """With several processes, turn a failed collective (a peer died or hung up) into one
    clear line and exit status 1, at once. (A peer that stops without closing its connections is
    caught by JAX's distributed heartbeat instead, which aborts the process with its own
    message after `--distributed-timeout` seconds.)"""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if jax.process_count() == 1:
            raise
        first_line = str(error).strip().splitlines()[0][:300]
        print(f"error: process {jax.process_index()} lost contact with another process of "
              f"this {jax.process_count()}-process run ({first_line}); stopping. The last "
              "checkpoint is intact: --resume it once every process is back.",
              file=sys.stderr, flush=True)
        # Leave at once: a normal exit would wait in jax.distributed's shutdown barrier for
        # the dead peer, then abort.
        os._exit(1)


def same_everywhere(params, replicated: bool):
    """Several processes: check that every process ends with the same parameters (a CRC of
    them, gathered from every process; data-parallel: also every local device's copy), else
    fail on every process.
    """
    if replicated:  # every device holds a copy: all of this process's must agree
        copies = [[np.asarray(s.data) for s in leaf.addressable_shards]
                  for leaf in jax.tree.leaves(params)]
        if any(not np.array_equal(c, cs[0]) for cs in copies for c in cs):
            fail(f"process {jax.process_index()}: the devices' parameters differ.", code=1)
        host = [cs[0] for cs in copies]
    else:
        host = jax.tree.leaves(fetch(params))
    differ = differing_processes(b"".join(np.ascontiguousarray(x).tobytes() for x in host))
    if differ:  # every process sees the same list, so every one stops
        fail(f"process(es) {', '.join(map(str, differ))} ended with parameters that differ from "
             "process 0's.", code=1)


def differing_processes(data: bytes) -> list[int]:
    """The indices of the processes whose `data` differs from process 0's (a CRC of it,
    gathered from every process; the same list on all of them; [] with one process)."""
    if jax.process_count() == 1:
        return []
    from jax.experimental import multihost_utils

    crc = np.int32(zlib.crc32(data) & 0x7FFFFFFF)
    crcs = np.asarray(multihost_utils.process_allgather(crc)).ravel()
    return [i for i, c in enumerate(crcs) if c != crcs[0]]


def from_process_0(value: int) -> int:
    """Process 0's `value` on every process (itself with one process)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


