"""Per-environment settings of the learning benchmarks, one versioned place.

Each entry: the overrides applied to the algorithm's `Config` defaults for that environment,
and the step budget. Anything not listed is the algorithm file's default.
"""

CONFIGS = {
    # PPO: CleanRL's / PureJaxRL's classic-control defaults on CartPole (the file's defaults).
    ("ppo", "CartPole-v1"): dict(total_timesteps=500_000),
    ("ppo", "Acrobot-v1"): dict(total_timesteps=500_000),
    # Continuous control: CleanRL's `ppo_continuous_action.py` settings (2048-step rollouts,
    # 32 minibatches, 10 epochs, lr 3e-4, no entropy bonus, normalised observations),
    # with 8 envs x 256 steps so a rollout is the same 2048 transitions.
    ("ppo", "Pendulum-v1"): dict(total_timesteps=2_000_000, num_envs=8, num_steps=256,
                                 num_minibatches=32, update_epochs=10, learning_rate=3e-4,
                                 ent_coef=0.0, gae_lambda=0.95, normalize_obs=True),
    ("ppo", "MountainCarContinuous-v0"): dict(total_timesteps=2_000_000, num_envs=8,
                                              num_steps=256, num_minibatches=32,
                                              update_epochs=10, learning_rate=3e-4,
                                              ent_coef=0.0, normalize_obs=True),
    # MinAtar: PureJaxRL's MinAtar PPO settings (64 envs x 128 steps, 8 minibatches,
    # 4 epochs, lr 5e-3 annealed), with the CNN chosen automatically for image observations.
    ("ppo", "Breakout-MinAtar"): dict(total_timesteps=10_000_000, num_envs=64, num_steps=128,
                                      num_minibatches=8, update_epochs=4, learning_rate=5e-3),
    ("ppo", "SpaceInvaders-MinAtar"): dict(total_timesteps=10_000_000, num_envs=64,
                                           num_steps=128, num_minibatches=8, update_epochs=4,
                                           learning_rate=5e-3),
    # IMPALA: the file's defaults (32 envs x 20 steps, actor_lag 1, RMSprop lr 5e-3).
    ("impala", "CartPole-v1"): dict(total_timesteps=1_000_000, actor_lag=1),
    # IMPALA on MinAtar: 64 envs x 20-step unrolls, the CNN chosen automatically.
    ("impala", "Breakout-MinAtar"): dict(total_timesteps=10_000_000, num_envs=64),
}
