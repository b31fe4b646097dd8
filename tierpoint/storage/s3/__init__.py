"""S3 tiers: the store, its ranged reader, multipart uploads, and what S3's answers mean."""
