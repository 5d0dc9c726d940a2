"""The cluster as the checks see it: the watched objects (informer), the device snapshot (inventory),
what tessera publishes (schema, sample devices), and how selectors and capacity requests match devices.
Nothing here imports controller.checks or controller.admission."""
