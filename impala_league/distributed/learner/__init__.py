"""The learner role and its parts: the loop (role.py), the update, the ingest (the facade the loop calls,
its reader thread and its worker processes), experience replay, board augmentation, checkpoints and
their history, the training clock, metrics, and several learners as one (data_parallel.py)."""
