"""The acceptance suite needs nothing but the plugin (installed via its pytest11 entry point)."""
