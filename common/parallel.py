"""Several devices from Python: `spread_seeds` and `data_parallel` wrap any algorithm's
`train` (from `make_train`) for the two layouts of `common/distributed.py`.
"""

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from common.distributed import DATA_AXIS, SEEDS_AXIS


def spread_seeds(train, devices=None):
    """`jit(vmap(train))` with its runs split across `devices` (default: all of them), no
    communication: call it with keys [S] (and hparams [S]) where S divides by the number of
    devices; every output keeps its leading runs axis, sharded over the devices.

        states, metrics = spread_seeds(make_train(config))(jax.random.split(key, 32))
    """
    mesh = Mesh(np.array(devices or jax.devices()), (SEEDS_AXIS,))
    return jax.jit(jax.shard_map(jax.vmap(train), mesh=mesh, in_specs=P(SEEDS_AXIS),
                                 out_specs=P(SEEDS_AXIS), check_vma=False))


def data_parallel(train, devices=None):
    """`jit(vmap(train))` with each run trained data-parallel on all `devices` (default: all):
    its `num_envs` environments split across them, gradients averaged over `DATA_AXIS`.
    Inputs are replicated; of the outputs, the final `state.env` is laid out [S, num_envs,
    ...] over the devices and everything else (parameters, metrics) is the devices' common
    value.

        states, metrics = data_parallel(make_train(config))(jax.random.split(key, 4))
    """
    mesh = Mesh(np.array(devices or jax.devices()), (DATA_AXIS,))

    def run(*args):
        # The state's type from `init` alone (tracing `train` twice would double the cost):
        # one spec per field, a prefix of its leaves; the metrics' P() likewise.
        state = jax.eval_shape(jax.vmap(train.init), *args)
        state_specs = type(state)(*(P() for _ in state))._replace(env=P(None, DATA_AXIS))
        return jax.shard_map(jax.vmap(train), mesh=mesh, in_specs=P(),
                             out_specs=(state_specs, P()), check_vma=False)(*args)

    return jax.jit(run)
