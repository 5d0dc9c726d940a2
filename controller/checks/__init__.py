"""The checks of an admission review, and the multi-card rewrite: what tessera says about a
DeviceClass or a ResourceClaim(Template), as Findings. They read the cluster through controller.cluster
and never call back up into controller.admission."""
