"""tessera's OCI image, built without Docker and without a registry (`make image`; docs/operations.md).

mmdebstrap writes a Debian base, pip installs locked wheels into /opt/tessera inside it (chroot, overlay
mounts in a private mount namespace), and oci.py packs three reproducible layers (Debian, dependencies,
tessera) into an OCI image-layout archive that containerd imports. Every stage is cached under
$TESSERA_CACHE/image by a content hash of what it is made from (keys.py).
"""
