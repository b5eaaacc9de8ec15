"""Process control of a run: the launcher's role table and supervisors, its children and their restart
rule, the embedded Redis, one owner per run, the live terminal view, and the allocator settings of
processes that allocate large tensors every step."""
