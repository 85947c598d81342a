"""The `avm` command line and the one-process emulator of the AgentVM cloud."""
