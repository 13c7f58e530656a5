"""Domain logic. Never imports the web framework, a database driver or redis."""
