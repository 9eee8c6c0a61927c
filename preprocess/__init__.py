"""Image preprocessing: safe decode, redaction, resize to the patch grid, patchify, content addressing."""
