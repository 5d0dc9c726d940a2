"""The cluster agent: admission webhook, inventory cache of ResourceSlices, claim and class checks.

Entry points live here (webhook, admission, app, metrics, offline, explain/); a review flows one way
down from them into controller.checks, which reads the cluster through controller.cluster.
"""
