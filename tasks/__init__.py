"""The task-validation page: the mixer family trained on S5, MQAR, a noisy pendulum and
permuted sequential digits (``python -m tasks.run``)."""
