"""frontend_api package."""
