"""KV-cache sizing (bytes per token, model and GPU catalogs, capacity) and the allocators."""
