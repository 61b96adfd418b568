"""Example tasks: each module exposes an object implementing fedshard's Task protocol."""
