"""The math of learning, below both the networks (agents/) and the roles (distributed/): the
actor-critic losses (`losses.actor_critic`) built on V-trace (`distributed.vtrace`, pure math that any
layer may import). Plain torch on tensors; nothing here knows a network, a stream or a process."""
