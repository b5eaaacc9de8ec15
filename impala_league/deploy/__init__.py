"""Cluster files of a run (`run.py deploy k8s|slurm`), at the roles' layer: what a cluster deployment is
(cluster.py), the Kubernetes objects (k8s.py), the SLURM batch script (slurm.py), and the command that
checks and renders them (render.py)."""
