"""tessera's core: device model, discovery, ResourceSlices, config, CDI, CEL. Free of gRPC and webhook code."""

DRIVER_NAME = "gpu.tessera.dev"
CDI_VENDOR = "gpu.tessera.dev"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
