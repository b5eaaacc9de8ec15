"""The Redis wire between the roles: connections and streams (transport), trajectory shards, the unroll
codec, the published parameters and the key names. No role logic lives here."""
