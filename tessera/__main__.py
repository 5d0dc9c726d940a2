from tessera.cli import entry

entry()
