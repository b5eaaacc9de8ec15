"""The math of learning, below both the networks (agents/) and the roles (distributed/): V-trace
(`losses.vtrace`) and the actor-critic losses built on it (`losses.actor_critic`). Plain torch on
tensors; nothing here knows a network, a stream or a process."""
