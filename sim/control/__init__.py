"""The control plane: Raft, the metadata service, faults and their injection, degradation, integrity, versions."""
