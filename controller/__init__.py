"""The cluster agent: admission webhook, inventory cache of ResourceSlices, claim and class checks."""
