"""Tools that build artefacts the runtime serves (they may import inference, tools and workers; nothing imports them)."""
