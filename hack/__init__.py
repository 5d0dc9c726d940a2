"""Developer tooling that lives beside the project but is not shipped in the wheel."""
