"""CodefyUI graph format: parsing, preset expansion, validation, execution."""
