"""The repository's own test configuration (users of the plugin never load this)."""

pytest_plugins = ["pytester"]
