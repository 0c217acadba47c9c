"""The package version, in a module of its own: records and saved modules stamp it, and importing
it from the package would import the whole package (and close import circles through it)."""
VERSION = "0.1.0"
