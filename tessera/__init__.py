"""The `tessera` command line: wires driver, kubeletplugin and controller together."""
