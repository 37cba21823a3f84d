"""The bridge: a loopback endpoint per agent attempt that relays the CLI's model calls upstream."""
