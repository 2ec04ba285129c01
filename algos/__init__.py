"""One file per algorithm: `ppo.py`, `a2c.py`, `impala.py`."""
