"""The organisation's server-rendered pages, one module per area."""
