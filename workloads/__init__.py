"""Request streams: the Request record, real-trace loaders and synthetic generators."""
