"""POSIX tiers: the store, its reader, and the page-cache and writeback calls they share."""
