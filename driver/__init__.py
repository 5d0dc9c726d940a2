"""tessera's core: device model, discovery, ResourceSlices, config, CDI, CEL. Free of gRPC and webhook code."""

# The driver's name, defined here once: every package imports the package anyway, and the name is the
# identity of the whole driver (DeviceClass, ResourceSlice driver, attribute domain, CDI vendor, config group).
DRIVER_NAME = "gpu.tessera.dev"
