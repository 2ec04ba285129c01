"""One file per algorithm: `ppo.py`, `a2c.py`, `impala.py`; `evaluate.py` evaluates a saved run
of any of them (`python -m algos.evaluate PATH`)."""
