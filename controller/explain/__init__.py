"""`tessera explain` and `tessera status`: why a claim cannot be allocated, and who holds which GPU.

Both read the cluster once (slices, classes, claims, pods, nodes) and reuse the webhook's code for
selectors and capacity (controller.cluster.matching, controller.cluster.capacityfit); the allocation search follows
the scheduler's structured allocator step by step (search.py).
"""
